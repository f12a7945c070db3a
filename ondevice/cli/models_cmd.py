"""`ondevice models` and `ondevice rm`: what the catalog offers, what is on this machine, deleting it.

Command functions only; ondevice/cli/app.py registers them on the one Typer app.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ondevice import paths
from ondevice.catalog import hub, refs
from ondevice.catalog.pairs import ModelFile, ModelPair, list_pairs, load_pair
from ondevice.catalog.stores.derived import is_derived
from ondevice.cli import options as opt
from ondevice.cli.literal import literal, say
from ondevice.cli.placement_view import gpu_place, target_place
from ondevice.errors import OndeviceError
from ondevice.files.gguf_split import SPLIT_NAME, model_bytes, set_problem
from ondevice.machine.facts import cuda_available
from ondevice.machine.ram import ram_budget
from ondevice.sizes import format_bytes


PredictOption = Annotated[
    bool,
    typer.Option("--predict", help="Predicted tok/s of each pair on this machine, alone and with speculation, from synthetic "
                 "curves (`ondevice bench --synthetic PAIR`); beside what `ondevice bench` measured on pairs used here."),
]


def models(predict: PredictOption = False, as_json: opt.Json = False) -> None:
    """List the catalog's model pairs (family, sizes, whether downloaded), other downloaded GGUF files, and
    the GGUF models of ollama, LM Studio, the Hugging Face cache and llama.cpp (--predict: how fast each pair would run here)."""
    if predict:
        from ondevice.cli.forecast_view import show_forecasts  # lazy: the synthetic measurements import torch (~1 s)

        show_forecasts(list_pairs(), as_json=as_json)
        return
    if as_json:
        raise OndeviceError("--json goes with --predict (the plain listing is a table).")
    console = Console()
    budget = ram_budget()
    title = (f"model pairs (* = default) · `ondevice download NAME` · `ondevice chat -m NAME`\n"
             f"on this machine: the target's place by the memory plan the loader uses, for {format_bytes(budget.bytes)} of RAM ({budget.source})")
    pairs = sorted(list_pairs(), key=lambda p: (not p.default, p.family, _bytes(p.target) or 0, p.name))
    gpu = cuda_available()
    places = {pair.name: target_place(pair, budget) + (f"; GPU: {gpu_place(pair.target)}" if gpu else "") for pair in pairs}
    wide = console.width >= WIDE_COLUMNS
    table = pairs_table(title, pairs, places) if wide else narrow_pairs_table(title, pairs, places, console.width)
    console.print(table)
    others = other_models()
    if others:
        extra = Table(title="other downloaded models (use with --target FILE / --drafter FILE)", box=box.SIMPLE, title_justify="left")
        extra.add_column("file", overflow="fold")
        extra.add_column("size", justify="right", no_wrap=True)
        problems = {path: set_problem(path) for path in others}  # a stray part, a set with parts missing: listed, not summed
        if any(problems.values()):
            extra.add_column("cannot be used", overflow="fold")
        for path in others:
            problem = problems[path]
            extra.add_row(literal(path), "?" if problem else format_bytes(model_bytes(path)), *([literal(problem or "")] if any(problems.values()) else []))
        console.print(extra)
    from ondevice.cli.stores_view import show_store_models  # lazy: reads the stores' GGUF headers; imports llama.cpp

    show_store_models(console, budget)


def rm(
    name: Annotated[str, typer.Argument(help="A pair from `ondevice models`, or a downloaded file: hf:owner/repo/file.gguf.", show_default=False)],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
) -> None:
    """Delete a model pair's downloaded files (files another downloaded pair still uses are kept)."""
    console = Console()
    if refs.is_hf(name):
        ref = refs.parse_hf(name)
        if ref.file is None:
            raise OndeviceError(f"name the file to delete: hf:{ref.repo}/FILE.gguf (see `ondevice models`).")
        models = [refs.model_file(ref)]
        doomed, kept = hub.local_files(models[0]), []
    else:
        pair = load_pair(name)
        models = [pair.target, pair.drafter]
        doomed, kept = files_to_remove(pair)
    for path, users in kept:
        say(console, f"keeping {path.name}: also used by {', '.join(users)}")
    for path in sorted({path for model in models for path in hub.unrecorded_files(model)}):
        say(console, f"keeping {path}: ondevice has no record of downloading it (delete it yourself if you want it gone)")
    if not doomed:
        say(console, f"nothing of {name} is downloaded")
        return
    size = sum(p.stat().st_size for p in doomed if p.is_file())
    if not yes:
        if not sys.stdin.isatty():
            raise OndeviceError(f"`ondevice rm {name}` would delete {len(doomed)} files ({format_bytes(size)}); pass --yes to delete without asking.")
        typer.confirm(f"delete {len(doomed)} files of {name} ({format_bytes(size)})?", abort=True)
    for path in doomed:
        hub.remove_path(path)
    say(console, f"deleted {len(doomed)} files ({format_bytes(size)}) of {name}")


def files_to_remove(pair: ModelPair) -> tuple[list[Path], list[tuple[Path, list[str]]]]:
    """(files to delete, [(file kept, the other pairs using it)]): a model file that another pair with
    something downloaded also names stays."""
    doomed, kept = [], []
    for model in (pair.target, pair.drafter):
        users = [other.name for other in list_pairs() if other.name != pair.name and _names(other, model) and _has_files(other)]
        if users and hub.local_path(model).exists():
            kept.append((hub.local_path(model), users))
        elif not users:
            doomed += hub.local_files(model)
    return doomed, kept


def other_models() -> list[Path]:
    """GGUF models under the models folder that no catalog entry names (hf: downloads, files put there)."""
    known = {hub.part_path(part).resolve() for pair in list_pairs() for m in (pair.target, pair.drafter) for part in m.parts()}
    found = []
    for path in sorted(paths.models_dir().rglob("*.gguf")) if paths.models_dir().exists() else []:
        split = SPLIT_NAME.match(path.name)
        if path.resolve() in known or path.name.startswith(".") or is_derived(path.name) or (split and int(split["no"]) != 1):
            continue
        found.append(path)
    return found


def _names(pair: ModelPair, model: ModelFile) -> bool:
    return model.file in (pair.target.file, pair.drafter.file)


def _has_files(pair: ModelPair) -> bool:
    return any(hub.local_path(m).exists() for m in (pair.target, pair.drafter))


def _bytes(model_file: ModelFile) -> int | None:
    """The model's size: on disk, pinned, or approximate (None if unknown)."""
    return hub.downloaded_bytes(model_file) if hub.is_downloaded(model_file) else model_file.size or model_file.approx_size


WIDE_COLUMNS = 150  # the full table's width: below it, the files go on a second line under each pair's name


def pairs_table(title: str, pairs: list[ModelPair], places: dict[str, str]) -> Table:
    """One line per pair: name, family, target and drafter files with their sizes, downloaded, place."""
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    for column, justify in (("name", "left"), ("family", "left"), ("target", "left"), ("size", "right"),
                            ("drafter", "left"), ("size ", "right"), ("downloaded", "left"), ("on this machine", "left")):
        table.add_column(column, justify=justify, no_wrap=column not in ("target", "on this machine"), overflow="fold")
    for pair in pairs:
        table.add_row(*map(literal, (  # names and labels come from catalog files: printed as they are
            _pair_name(pair), pair.family, pair.target.label, _size_text(pair.target),
            pair.drafter.label, _size_text(pair.drafter), _download_state(pair), places[pair.name],
        )))
    return table


def narrow_pairs_table(title: str, pairs: list[ModelPair], places: dict[str, str], width: int) -> Group:
    """A terminal narrower than WIDE_COLUMNS: fewer columns (name, downloaded, on this machine), each
    pair's files and sizes on a second line under its name; a name is never cut."""
    name_width = max(len(_pair_name(p)) for p in pairs)
    place_width = max(len("on this machine"), width - name_width - len("downloaded") - 6)

    def row(*cells, style: str = "") -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(width=name_width, no_wrap=True)
        grid.add_column(width=len("downloaded"), no_wrap=True)
        grid.add_column(width=place_width, overflow="fold")
        grid.add_row(*(Text(cell, style=style) for cell in cells))  # catalog text: printed as it is, never as markup
        return grid

    lines: list = [Text(title), Text(""), row("name", "downloaded", "on this machine", style="bold")]
    for pair in pairs:
        files = f"{pair.target.label} {_size_text(pair.target)} + {pair.drafter.label} {_size_text(pair.drafter)}"
        lines += [row(_pair_name(pair), _download_state(pair), places[pair.name]),
                  Padding(Text(files, style="dim", overflow="fold"), (0, 0, 0, 2))]
    return Group(*lines, Text(""))


def _pair_name(pair: ModelPair) -> str:
    return pair.name + (" *" if pair.default else "")


def _size_text(model_file: ModelFile) -> str:
    """Exact size if downloaded or pinned, else the catalog's approximate one (with a ~), else ?."""
    if hub.is_downloaded(model_file):
        return format_bytes(hub.downloaded_bytes(model_file))
    if model_file.size:
        return format_bytes(model_file.size)
    return f"~{format_bytes(model_file.approx_size)}" if model_file.approx_size else "?"


def _download_state(pair: ModelPair) -> str:
    """yes (both verified), partly (one, or an unverified file), or no."""
    states = [hub.is_downloaded(m) for m in (pair.target, pair.drafter)]
    if all(states):
        return "yes"
    return "partly" if any(states) or _has_files(pair) else "no"
