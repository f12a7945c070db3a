"""Models other programs already keep on this disk, read in place: ollama, LM Studio, the Hugging
Face cache and llama.cpp's cache, one module each (where the store lives, its layout, its names).

Nothing in a store is written, moved or copied: `ondevice models` lists what they hold, `-m NAME`
runs a model from where it lies (resolve.py), a blob whose name is its sha256 is checked once and
the check recorded under $ONDEVICE_HOME (digests.py), and anything made from such a model (a
trimmed drafter, an ONNX export) goes under $ONDEVICE_HOME too (derived.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ondevice.catalog.stores import hf_cache, llama_cache, lmstudio, ollama
from ondevice.catalog.stores.model import StoreModel
from ondevice.catalog.stores.reading import StoreUnreadable


class Store(Protocol):
    """What each store module is: its name, the folders it may live in, and what one of them holds."""

    STORE: str

    def roots(self) -> list[Path]: ...

    def scan(self, root: Path) -> list[StoreModel]: ...  # StoreUnreadable if a folder cannot be listed


STORES: tuple[Store, ...] = (ollama, lmstudio, hf_cache, llama_cache)  # scanned and listed in this order


@dataclass
class Scan:
    models: list[StoreModel] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # one line per store folder that could not be read


def scan_all() -> Scan:
    """Every model in every store on this machine, and a line for each store folder that cannot be read."""
    result, seen = Scan(), set()
    for store in STORES:
        for root in store.roots():
            key = _key(root)
            if key in seen:
                continue
            seen.add(key)
            try:
                result.models += store.scan(root)
            except StoreUnreadable as err:
                result.unreadable.append(str(err))
    return result


def roots() -> list[Path]:
    """Every store folder this machine's settings name (whether it exists or not)."""
    return [root for store in STORES for root in store.roots()]


def _key(path: Path) -> str:
    try:
        return str(path.resolve())
    except OSError:
        return str(path)
