"""Where a file made from a model goes (a trimmed-vocabulary drafter and its record, an ONNX export,
a streaming target's repacked copy, a drafter requantized for llama.cpp's repacked kernels):
beside the model, unless the model lies in another program's store, which is never written; then
under `<home>/stores/derived/<key>/`, the key a hash of the model's path.

Here rather than in vocabtrim/ so that code that only lists or deletes model files (the
downloader) imports no llama.cpp: the GPU machine has none."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ondevice import paths
from ondevice.catalog import stores


TRIMMED_SUFFIX = ".vocab-trim.gguf"
RECORD_SUFFIX = ".vocab-trim.json"
REPACKED_SUFFIX = ".repacked.gguf"  # a streaming target's copy in llama.cpp's repacked layouts
REPACKED_RECORD_SUFFIX = ".repacked.json"
REQUANTIZED_SUFFIX = ".iq4_nl.gguf"  # a drafter's weights in IQ4_NL (draft/requantized.py)
REQUANTIZED_RECORD_SUFFIX = ".iq4_nl.json"


def is_derived(name: str) -> bool:
    """Whether a file name is one of the files made from a model here (not a model of its own)."""
    return name.endswith((TRIMMED_SUFFIX, REPACKED_SUFFIX, REQUANTIZED_SUFFIX))


def trimmed_paths(drafter: Path) -> tuple[Path, Path]:
    """A drafter's trimmed GGUF (vocabtrim/build.py writes it) and its record: where they go."""
    stem = drafter.name.removesuffix(".gguf")
    return derived_path(drafter, stem + TRIMMED_SUFFIX), derived_path(drafter, stem + RECORD_SUFFIX)


def source_stamp(model: Path) -> dict:
    """What a derived file's record says of the file it was made from (name, size, modification
    time): a record that no longer matches it means the source changed and the file is made again."""
    stat = model.stat()
    return {"source": model.name, "source_bytes": stat.st_size, "source_mtime_ns": stat.st_mtime_ns}


def requantized_paths(weights: Path) -> tuple[Path, Path]:
    """A drafter file's copy requantized to IQ4_NL (draft/requantized.py) and its record."""
    stem = weights.name.removesuffix(".gguf")
    return derived_path(weights, stem + REQUANTIZED_SUFFIX), derived_path(weights, stem + REQUANTIZED_RECORD_SUFFIX)


def repacked_paths(target: Path) -> tuple[Path, Path]:
    """A target's copy in llama.cpp's repacked layouts (targets/repacked_copy.py) and its record."""
    stem = target.name.removesuffix(".gguf")
    return derived_path(target, stem + REPACKED_SUFFIX), derived_path(target, stem + REPACKED_RECORD_SUFFIX)


def derived_path(model: str | Path, name: str) -> Path:
    """The path of `name`, a file made from `model`."""
    model = Path(model).expanduser()
    if not in_store(model):
        return model.with_name(name)
    key = hashlib.sha256(str(model.absolute()).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return paths.inside(paths.home() / "stores" / "derived", f"{key}/{name}", f"a file made from {model}")


def in_store(path: Path) -> bool:
    """Whether `path` (or the file it links to) lies in a store folder of ollama, LM Studio, the
    Hugging Face cache or llama.cpp's cache."""
    candidates = {path.absolute()}
    try:
        candidates.add(path.resolve())
    except OSError:
        pass
    for root in stores.roots():
        folders = {root.absolute()}
        try:
            folders.add(root.resolve())
        except OSError:
            pass
        if any(folder == c or folder in c.parents for folder in folders for c in candidates):
            return True
    return False
