"""Which two files to run: a catalog pair, or `--target` / `--drafter` (local GGUF or hf: reference),
or a model that ollama, LM Studio, the Hugging Face cache or llama.cpp keeps (`-m qwen2.5:7b`, see
stores/resolve.py), run where it lies. A catalog file a store already holds is used in place too.

Without `--drafter`, a drafter for a target of your own is found automatically, and we say which:
1. the drafter of the catalog pair whose target this file is;
2. a model already on this disk whose vocabulary works for the target (tokenizer.vocab_mismatch):
   downloaded ones (catalog drafters first, then any smaller GGUF in the models folder, the smallest
   first), then the smaller models of the other programs' stores, the smallest first;
3. the drafter of a catalog pair of the same architecture, proposed with its size, then downloaded
   (on a terminal, if you agree), if its vocabulary works.
If there is none, the target runs alone with prompt lookup (a drafter that needs no model).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rich.console import Console
from rich.prompt import Confirm

from ondevice import paths
from ondevice.catalog import hub
from ondevice.catalog.hub import PairFiles
from ondevice.catalog.pairs import ModelFile, list_pairs, load_pair
from ondevice.catalog.stores.derived import is_derived
from ondevice.catalog.stores.model import possessive
from ondevice.catalog.stores.resolve import LocalModel, catalog_file, drafter_candidates, local_model, use
from ondevice.errors import OndeviceError
from ondevice.files.gguf_split import SPLIT_NAME, model_bytes, part_paths, set_problem
from ondevice.prompt.tokenizer import Tokenizer, vocab_mismatch
from ondevice.sizes import format_bytes


def choose(pair: str | None, target: str | None, drafter: str | None, draft: bool, console: Console | None = None) -> PairFiles:
    """The files to run for these load options, downloaded and verified as needed."""
    console = console or Console(stderr=True)
    if target is None and not is_catalog_name(pair):
        target = pair  # not a catalog pair: a model another program keeps (or a one-line error naming both)
    if target is None:
        spec = load_pair(pair)
        target_model = ensure(spec.target, console)
        if drafter is None:
            drafter_model = ensure(spec.drafter, console) if draft else None
            return PairFiles(spec.name, spec.description, target_model.path, drafter_model and drafter_model.path, target_model.sha256,
                             drafter_model and drafter_model.sha256)
        drafter_model = local_model(drafter, console)
        return PairFiles(_name(target_model.label, drafter_model.label), f"{spec.target.label}, drafted by {drafter_model.label}",
                         target_model.path, drafter_model.path, target_model.sha256)
    target_model = local_model(target, console)
    target_path = target_model.path
    if not draft:
        drafter_model = None
    elif drafter is not None:
        drafter_model = local_model(drafter, console)
    else:
        drafter_model = auto_drafter(target_model, console)
    drafter_path = drafter_model and drafter_model.path
    for known in list_pairs():  # a catalog pair's own two files, given by path or digest: the same pair (profiles, acceptance)
        if drafter_model and _is(known.target, target_model) and _is(known.drafter, drafter_model):
            return PairFiles(known.name, known.description, target_path, drafter_path, hub.digest_of(known.target) or target_model.sha256,
                             hub.digest_of(known.drafter) or drafter_model.sha256)
    text = f"{target_model.label}, drafted by {drafter_model.label}" if drafter_model else f"{target_model.label} (no drafter model)"
    return PairFiles(_name(target_model.label, drafter_model and drafter_model.label), text, target_path, drafter_path,
                     target_model.sha256, drafter_model and drafter_model.sha256)


def is_catalog_name(name: str | None) -> bool:
    """None (the default pair) or the name of a catalog pair."""
    return name is None or any(pair.name == name for pair in list_pairs())


def ensure(model_file: ModelFile, console: Console) -> LocalModel:
    """A catalog model's file: ours if downloaded, else another program's copy used in place, else downloaded now."""
    found = catalog_file(model_file, console)
    if found is not None:
        return found
    path = hub.ensure_file(model_file, console, announce_cached=False)
    return LocalModel(path, path.name, hub.digest_of(model_file))


def _same(a: Path, b: Path) -> bool:
    return a.exists() and b.exists() and a.resolve() == b.resolve()


def _is(model_file: ModelFile, model: LocalModel) -> bool:
    """`model` is this catalog file: our download of it, or a copy with its pinned sha256."""
    return _same(hub.local_path(model_file), model.path) or (model_file.sha256 is not None and model.sha256 == model_file.sha256)


def auto_drafter(target_model: LocalModel, console: Console) -> LocalModel | None:
    """A drafter for the target (see the module docstring; of one size, a model of the target's store
    first), said on the console; None if there is none."""
    for pair in list_pairs():  # 1. this file is a catalog target
        if _is(pair.target, target_model):
            found = ensure(pair.drafter, console)
            return _say(console, found, f"the drafter of the catalog pair {pair.name}")
    target = target_model.path
    target_tok = Tokenizer(target)
    for path in downloaded_drafters(target):  # 2. something already here with a working vocabulary
        if vocab_mismatch(target_tok, Tokenizer(path)) is None:
            return _say(console, LocalModel(path, path.name), "already downloaded, same tokenizer")
    for model in drafter_candidates(target, target_model.store):  # ... or in another program's store
        if vocab_mismatch(target_tok, Tokenizer(model.path)) is None:
            return _say(console, use(model, console), f"{possessive(model.store)}, {format_bytes(model.size)}, same tokenizer")
    tried = set()
    for pair in list_pairs():  # 3. the drafter of a catalog pair of the same architecture
        if pair.architecture != target_tok.architecture or hub.is_downloaded(pair.drafter) or pair.drafter.file in tried:
            continue
        tried.add(pair.drafter.file)
        if not _agreed(console, pair):
            continue
        try:
            found = ensure(pair.drafter, console)
        except OndeviceError as err:
            console.print(f"drafter {pair.drafter.label} of the catalog pair {pair.name}: {err}", markup=False, highlight=False)
            continue
        if vocab_mismatch(target_tok, Tokenizer(found.path)) is None:
            return _say(console, found, f"the drafter of the catalog pair {pair.name}, same architecture and tokenizer")
    console.print("no compatible drafter found: the target runs alone, with prompt lookup (pass --drafter FILE to choose one)", markup=False)
    return None


def _agreed(console: Console, pair) -> bool:
    """Propose the catalog drafter with its size before anything is downloaded; on a terminal, ask."""
    size = pair.drafter.size or pair.drafter.approx_size
    console.print(f"no model on this disk drafts for this target; proposed drafter: {pair.drafter.label} "
                  f"({format_bytes(size) if size else 'size unknown'}), the catalog pair {pair.name}'s (same architecture)",
                  markup=False, highlight=False, soft_wrap=True)
    if not (sys.stdin.isatty() and console.is_terminal):
        return True
    return Confirm.ask("download it?", default=True, console=console)


def downloaded_drafters(target: Path) -> list[Path]:
    """Downloaded GGUF models smaller than the target, catalog drafters first, then by size."""
    catalog = [hub.local_path(p.drafter) for p in list_pairs() if hub.is_downloaded(p.drafter)]
    others = [p for p in sorted(paths.models_dir().rglob("*.gguf")) if _is_model_file(p)]
    target_parts, target_size = {p.resolve() for p in part_paths(target)}, model_bytes(target)
    seen, found = set(), []
    for path in catalog + sorted(others, key=model_bytes):
        key = path.resolve()
        if key not in seen and key not in target_parts and model_bytes(path) < target_size:
            seen.add(key)
            found.append(path)
    return found


def _is_model_file(path: Path) -> bool:
    """A whole model (or the first part of one, every part there): not a file made from a model (a
    VocabTrim head, a repacked copy), not a later part of a split set, not a stray first part whose
    other parts are missing."""
    if is_derived(path.name) or path.name.startswith("."):
        return False
    split = SPLIT_NAME.match(path.name)
    return (split is None or int(split["no"]) == 1) and set_problem(path) is None


def _say(console: Console, model: LocalModel, why: str) -> LocalModel:
    console.print(f"drafter: {model.label} ({why})", markup=False, highlight=False)
    return model


def _without_suffix(name: str) -> str:
    return re.sub(r"(-\d{5}-of-\d{5})?\.gguf$", "", name)


def _name(target: str, drafter: str | None) -> str:
    """A name for profiles and acceptance records: the models' names (a file's without .gguf), made
    safe for a file name."""
    text = _without_suffix(target) + (f"+{_without_suffix(drafter)}" if drafter else "")
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)[:120]

