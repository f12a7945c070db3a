"""`ondevice models`' table of the GGUF models other programs keep on this disk (ollama, LM Studio,
the Hugging Face cache, llama.cpp's cache): the name `-m` takes, size, architecture, quantization,
where the target would live here (the memory plan the loader makes, as for the catalog's pairs),
and the file, read in place. A model that cannot run says why in one line instead."""

from __future__ import annotations

from pathlib import Path

from gguf import LlamaFileType
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ondevice.catalog.choose import downloaded_drafters
from ondevice.catalog.pairs import list_pairs
from ondevice.catalog.stores import STORES, StoreModel, roots, scan_all
from ondevice.catalog.stores.resolve import tokenizer_kind
from ondevice.cli.placement_view import place
from ondevice.errors import OndeviceError
from ondevice.files.gguf_check import check_model_file
from ondevice.files.gguf_header import GGUFHeader
from ondevice.machine.ram import RamBudget
from ondevice.loading.footprint import ModelSize
from ondevice.decode.protocols import FREE_TREE_NODES
from ondevice.sizes import format_bytes


def show_store_models(console: Console, budget: RamBudget) -> None:
    scan = scan_all()
    for line in scan.unreadable:
        console.print(f"warning: {line}", markup=False, highlight=False, soft_wrap=True)
    if not scan.models:
        looked = ", ".join(str(root) for root in roots())
        console.print(f"no GGUF models of ollama, LM Studio, the Hugging Face cache or llama.cpp found (looked in {looked})",
                      style="dim", markup=False, highlight=False, soft_wrap=True)
        return
    title = ("models other programs keep on this disk, read where they lie · `ondevice chat -m NAME` "
             "(on this machine: with the smallest model of the same tokenizer on disk as its drafter)")
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    for column in ("name", "store", "size", "arch", "quant", "on this machine", "file"):
        table.add_column(column, justify="right" if column == "size" else "left", overflow="fold",
                         no_wrap=column in ("size", "arch", "quant", "store"))
    pins = catalog_pins()
    runnable = [m for m in scan.models if m.problem is None]
    order = [store.STORE for store in STORES]
    for model in sorted(scan.models, key=lambda m: (order.index(m.store), m.name.lower())):
        name = model.name + (f" (= {pins[model.digest]})" if model.digest in pins else "")
        arch, quant, where = row_facts(model, runnable, budget)
        cells = (name, model.store, format_bytes(model.size) if model.size else "?", arch, quant, where, str(model.path))
        table.add_row(*map(Text, cells))  # names and paths come from other programs' files: never read as markup
    console.print(table)


def row_facts(model: StoreModel, runnable: list[StoreModel], budget: RamBudget) -> tuple[str, str, str]:
    """(architecture, quantization, on this machine) of one row; for a model that cannot run, the
    third says why."""
    if model.problem is not None:
        return "", model.quant or "", f"cannot run: {model.problem}"
    try:
        header = check_model_file(model.path)
        size = ModelSize.from_gguf(model.path)
    except OndeviceError as err:
        return "", model.quant or "", f"cannot run: {err}"
    drafter = likely_drafter(model, runnable)
    try:
        drafter_size = ModelSize.from_gguf(drafter) if drafter else None
    except OndeviceError:
        drafter_size = None
    where = place(size, drafter_size, budget, tree_nodes=FREE_TREE_NODES if drafter_size is None else None)
    return header.arch or "?", quant_name(header) or model.quant or "?", where


def likely_drafter(target: StoreModel, runnable: list[StoreModel]) -> Path | None:
    """The smallest smaller model on disk whose header names the same kind of tokenizer: the one a
    run would try first (choose.auto_drafter compares the vocabularies themselves)."""
    kind = tokenizer_kind(target.path)
    others = downloaded_drafters(target.path) + [m.path for m in sorted(runnable, key=lambda m: m.size) if 0 < m.size < target.size]
    return next((path for path in others if path != target.path and tokenizer_kind(path) == kind), None)


def quant_name(header: GGUFHeader) -> str | None:
    """The file type the header records (general.file_type), as llama.cpp names it: Q4_K_M, F16, …"""
    try:
        name = LlamaFileType(int(header.metadata.get("general.file_type"))).name
    except (TypeError, ValueError):
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def catalog_pins() -> dict[str, str]:
    """sha256 → "catalog PAIR target|drafter", for the catalog files with a pinned digest."""
    pins = {}
    for pair in list_pairs():
        for role, model in (("target", pair.target), ("drafter", pair.drafter)):
            if model.sha256:
                pins.setdefault(model.sha256, f"the catalog's {pair.name} {role}")
    return pins
