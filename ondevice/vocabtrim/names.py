"""Where a trimmed drafter and its record live: beside the drafter, named after it.

Apart from `build` so that code that only lists or deletes model files (the downloader) imports no
llama.cpp: the GPU machine has none.
"""

from __future__ import annotations

from pathlib import Path

TRIMMED_SUFFIX = ".vocab-trim.gguf"
RECORD_SUFFIX = ".vocab-trim.json"


def trimmed_paths(drafter: Path) -> tuple[Path, Path]:
    """The trimmed GGUF's path and its record's."""
    stem = drafter.name.removesuffix(".gguf")
    return drafter.with_name(stem + TRIMMED_SUFFIX), drafter.with_name(stem + RECORD_SUFFIX)
