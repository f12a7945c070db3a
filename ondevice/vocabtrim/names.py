"""Where a trimmed drafter and its record live: beside the drafter, named after it (under
$ONDEVICE_HOME when the drafter lies in another program's store, which is never written).

Apart from `build` so that code that only lists or deletes model files (the downloader) imports no
llama.cpp: the GPU machine has none.
"""

from __future__ import annotations

from pathlib import Path

from ondevice.catalog.stores.derived import derived_path

TRIMMED_SUFFIX = ".vocab-trim.gguf"
RECORD_SUFFIX = ".vocab-trim.json"


def trimmed_paths(drafter: Path) -> tuple[Path, Path]:
    """The trimmed GGUF's path and its record's."""
    stem = drafter.name.removesuffix(".gguf")
    return derived_path(drafter, stem + TRIMMED_SUFFIX), derived_path(drafter, stem + RECORD_SUFFIX)
