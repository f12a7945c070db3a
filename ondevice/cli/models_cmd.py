"""`ondevice models` and `ondevice rm`: what the catalog offers, what is on this machine, deleting it.

Command functions only; ondevice/cli/app.py registers them on the one Typer app.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from ondevice import paths
from ondevice.catalog import hub, refs
from ondevice.catalog.pairs import ModelFile, ModelPair, list_pairs, load_pair
from ondevice.cli import options as opt
from ondevice.errors import OndeviceError
from ondevice.files.gguf_split import SPLIT_NAME, model_bytes
from ondevice.plan.memory import ModelSize, plan_memory
from ondevice.machine.ram import RamBudget, ram_budget
from ondevice.target.page_cache import WINDOW_AHEAD
from ondevice.sizes import format_bytes
from ondevice.synthetic.shapes import find_shape



PredictOption = Annotated[
    bool,
    typer.Option("--predict", help="Predicted tok/s of each pair on this machine, alone and with speculation, from synthetic "
                 "curves (`ondevice bench --synthetic PAIR`); beside what `ondevice bench` measured on pairs used here."),
]


def models(predict: PredictOption = False, as_json: opt.Json = False) -> None:
    """List the catalog's model pairs (family, sizes, whether downloaded) and other downloaded GGUF files
    (--predict: how fast each would run here)."""
    if predict:
        from ondevice.cli.forecast_view import show_forecasts

        show_forecasts(list_pairs(), as_json=as_json)
        return
    if as_json:
        raise OndeviceError("--json goes with --predict (the plain listing is a table).")
    console = Console()
    budget = ram_budget()
    title = (f"model pairs (* = default) · `ondevice download NAME` · `ondevice chat -m NAME`\n"
             f"on this machine: the target's place by the memory plan the loader uses, for {format_bytes(budget.bytes)} of RAM ({budget.source})")
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    for column, justify in (("name", "left"), ("family", "left"), ("target", "left"), ("size", "right"),
                            ("drafter", "left"), ("size ", "right"), ("downloaded", "left"), ("on this machine", "left")):
        table.add_column(column, justify=justify, no_wrap=column not in ("target", "on this machine"), overflow="fold")
    gpu = _has_gpu()
    for pair in sorted(list_pairs(), key=lambda p: (not p.default, p.family, _bytes(p.target) or 0, p.name)):
        place = target_place(pair, budget) + (f"; GPU: {gpu_place(pair.target)}" if gpu else "")
        table.add_row(
            pair.name + (" *" if pair.default else ""), pair.family, pair.target.label, _size_text(pair.target),
            pair.drafter.label, _size_text(pair.drafter), _download_state(pair), place,
        )
    console.print(table)
    others = other_models()
    if others:
        extra = Table(title="other downloaded models (use with --target FILE / --drafter FILE)", box=box.SIMPLE, title_justify="left")
        extra.add_column("file", overflow="fold")
        extra.add_column("size", justify="right", no_wrap=True)
        for path in others:
            extra.add_row(str(path), format_bytes(model_bytes(path)))
        console.print(extra)


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
        doomed, kept = hub.local_files(refs.model_file(ref)), []
    else:
        doomed, kept = files_to_remove(load_pair(name))
    for path, users in kept:
        console.print(f"keeping {path.name}: also used by {', '.join(users)}", markup=False, highlight=False)
    if not doomed:
        console.print(f"nothing of {name} is downloaded", markup=False)
        return
    size = sum(p.stat().st_size for p in doomed if p.is_file())
    if not yes:
        if not sys.stdin.isatty():
            raise OndeviceError(f"`ondevice rm {name}` would delete {len(doomed)} files ({format_bytes(size)}); pass --yes to delete without asking.")
        typer.confirm(f"delete {len(doomed)} files of {name} ({format_bytes(size)})?", abort=True)
    for path in doomed:
        hub.remove_path(path)
    console.print(f"deleted {len(doomed)} files ({format_bytes(size)}) of {name}", markup=False, highlight=False)


def target_place(pair: ModelPair, budget: RamBudget | None = None, n_ctx: int = 4096) -> str:
    """Where the pair's target would live here, by plan/memory.py: in RAM, or streamed from disk.
    Sizes from the downloaded files' headers, else from the catalog's shape preset and size."""
    try:
        target, drafter = model_size(pair.target), model_size(pair.drafter)
    except OndeviceError:  # a downloaded file whose header cannot be read: the listing goes on
        return "? (unreadable GGUF header)"
    if target is None:
        return "?"
    plan = plan_memory(target, drafter, n_ctx=n_ctx, budget=budget, ahead=WINDOW_AHEAD)  # as the loader plans it
    if plan.target_in_ram:
        return "fits in RAM"
    over = " (over budget: heavy paging)" if plan.cache_room < plan.target.streamed_window else ""
    return f"streams from disk, {format_bytes(plan.bytes_read_per_pass)} per pass{over}"


def gpu_place(model: ModelFile, device: str = "cuda", gpu_memory: str | None = None, ram_memory: str | None = None,
              n_ctx: int = 4096) -> str:
    """How the torch target would place a downloaded target's layers on the GPU: the loader's own
    plan (offload.target.plan_offload, default budgets: free GPU memory and available RAM)."""
    if not hub.is_downloaded(model):
        return "planned once downloaded"
    import torch

    from ondevice.offload.target import plan_offload
    from ondevice.protocols import MAX_BUDGET
    from ondevice.target.torch_target import default_dtype

    try:
        plan = plan_offload(hub.local_path(model), device, default_dtype(torch.device(device)), n_ctx, gpu_memory, ram_memory, max_tree=MAX_BUDGET)
    except OndeviceError as err:  # an architecture the torch target does not run, a budget too small
        return str(err)
    return plan.placement.describe()


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def model_size(model: ModelFile) -> ModelSize | None:
    """What the memory plan needs of a model: its GGUF header if downloaded, else its shape preset
    (every tensor's bytes in the quant mix, as the header will say) and the catalog's file size."""
    if hub.is_downloaded(model):
        return ModelSize.from_gguf(hub.local_path(model))
    if model.shape is None:
        return None
    return ModelSize.from_shape(find_shape(model.shape), model.size or model.approx_size)


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
        if path.resolve() in known or path.name.startswith(".") or path.name.endswith(".vocab-trim.gguf") or (split and int(split["no"]) != 1):
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
