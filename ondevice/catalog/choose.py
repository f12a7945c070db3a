"""Which two files to run: a catalog pair, or `--target` / `--drafter` (local GGUF or hf: reference).

Without `--drafter`, a drafter for a target of your own is found automatically, and we say which:
1. the drafter of the catalog pair whose target this file is;
2. a model already downloaded (catalog drafters first, then any smaller GGUF in the models folder)
   whose vocabulary works for the target (tokenizer.vocab_mismatch), the smallest first;
3. the drafter of a catalog pair of the same architecture, downloaded now, if its vocabulary works.
If there is none, the target runs alone with prompt lookup (a drafter that needs no model).
"""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console

from ondevice import paths
from ondevice.catalog import hub, refs
from ondevice.catalog.hub import PairFiles
from ondevice.catalog.pairs import list_pairs, load_pair
from ondevice.errors import OndeviceError
from ondevice.files.gguf_split import SPLIT_NAME, model_bytes, part_paths
from ondevice.prompt.tokenizer import Tokenizer, vocab_mismatch


def choose(pair: str | None, target: str | None, drafter: str | None, draft: bool, console: Console | None = None) -> PairFiles:
    """The files to run for these load options, downloaded and verified as needed."""
    console = console or Console(stderr=True)
    if target is None:
        spec = load_pair(pair)
        target_path = hub.ensure_file(spec.target, console, announce_cached=False)
        if drafter is None:
            drafter_path = hub.ensure_file(spec.drafter, console, announce_cached=False) if draft else None
            return PairFiles(spec.name, spec.description, target_path, drafter_path, hub.digest_of(spec.target),
                          hub.digest_of(spec.drafter) if draft else None)
        drafter_path = refs.local_model(drafter, console)
        return PairFiles(_name(target_path, drafter_path), f"{spec.target.label}, drafted by {drafter_path.name}",
                      target_path, drafter_path, hub.digest_of(spec.target))
    target_path = refs.local_model(target, console)
    if not draft:
        drafter_path = None
    elif drafter is not None:
        drafter_path = refs.local_model(drafter, console)
    else:
        drafter_path = auto_drafter(target_path, console)
    for known in list_pairs():  # a catalog pair's own two files, given by path: the same pair (profiles, acceptance)
        if drafter_path and _same(hub.local_path(known.target), target_path) and _same(hub.local_path(known.drafter), drafter_path):
            return PairFiles(known.name, known.description, target_path, drafter_path, hub.digest_of(known.target), hub.digest_of(known.drafter))
    text = f"{target_path.name}, drafted by {drafter_path.name}" if drafter_path else f"{target_path.name} (no drafter model)"
    return PairFiles(_name(target_path, drafter_path), text, target_path, drafter_path)


def _same(a: Path, b: Path) -> bool:
    return a.exists() and b.exists() and a.resolve() == b.resolve()


def auto_drafter(target: Path, console: Console) -> Path | None:
    """A drafter for `target` (see the module docstring), said on the console; None if there is none."""
    target_tok = Tokenizer(target)
    for pair in list_pairs():  # 1. this file is a catalog target
        if _same(hub.local_path(pair.target), target):
            path = hub.ensure_file(pair.drafter, console, announce_cached=False)
            return _say(console, path, f"the drafter of the catalog pair {pair.name}")
    for path in downloaded_drafters(target):  # 2. something already here with a working vocabulary
        if vocab_mismatch(target_tok, Tokenizer(path)) is None:
            return _say(console, path, "already downloaded, same tokenizer")
    tried = set()
    for pair in list_pairs():  # 3. the drafter of a catalog pair of the same architecture
        if pair.architecture != target_tok.architecture or hub.is_downloaded(pair.drafter) or pair.drafter.file in tried:
            continue
        tried.add(pair.drafter.file)
        try:
            path = hub.ensure_file(pair.drafter, console, announce_cached=False)
        except OndeviceError as err:
            console.print(f"drafter {pair.drafter.label} of the catalog pair {pair.name}: {err}", markup=False, highlight=False)
            continue
        if vocab_mismatch(target_tok, Tokenizer(path)) is None:
            return _say(console, path, f"the drafter of the catalog pair {pair.name}, same architecture and tokenizer")
    console.print("no compatible drafter found: the target runs alone, with prompt lookup (pass --drafter FILE to choose one)", markup=False)
    return None


def downloaded_drafters(target: Path) -> list[Path]:
    """Downloaded GGUF models smaller than the target, catalog drafters first, then by size."""
    target_parts = {p.resolve() for p in part_paths(target)}
    catalog = [hub.local_path(p.drafter) for p in list_pairs() if hub.is_downloaded(p.drafter)]
    others = [p for p in sorted(paths.models_dir().rglob("*.gguf")) if _is_model_file(p)]
    seen, found = set(), []
    for path in catalog + sorted(others, key=model_bytes):
        key = path.resolve()
        if key not in seen and key not in target_parts and model_bytes(path) < model_bytes(target):
            seen.add(key)
            found.append(path)
    return found


def _is_model_file(path: Path) -> bool:
    """A whole model (or the first part of one): not a VocabTrim head, not a later part of a split set."""
    if path.name.endswith(".vocab-trim.gguf") or path.name.startswith("."):
        return False
    split = SPLIT_NAME.match(path.name)
    return split is None or int(split["no"]) == 1


def _say(console: Console, path: Path, why: str) -> Path:
    console.print(f"drafter: {path.name} ({why})", markup=False, highlight=False)
    return path


def _stem(path: Path) -> str:
    return re.sub(r"(-\d{5}-of-\d{5})?\.gguf$", "", path.name)


def _name(target: Path, drafter: Path | None) -> str:
    """A name for profiles and acceptance records: the file names, made safe for a file name."""
    text = _stem(target) + (f"+{_stem(drafter)}" if drafter else "")
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)[:120]

