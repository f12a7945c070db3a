"""Where an ONNX export of a GGUF lives and whether it is built, without importing ONNX or torch.

An export is a folder beside the GGUF (`<file>.onnx/`) holding one variant per accuracy level and
weight format: the decoder body, the full LM head, a trimmed head per VocabTrim keep set, and a
manifest naming the GGUF (name, size, mtime) and ONNX Runtime version it was built for
(`onnx/export.py` builds it).
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from pathlib import Path

import numpy as np

from ondevice.catalog.stores.derived import derived_path
from ondevice.paths import MAX_STATE_BYTES, read_regular_file

FORMAT_VERSION = 2  # 2: q/k/v and gate/up stacked into one MatMulNBits where their layouts agree
ACCURACY_INT8 = 4  # MatMulNBits accuracy_level: int8 activations, int32 accumulation (the fast kernels)
DRAFTER_INT4_BLOCK = 32  # the ONNX drafter's matrices: 4 bits, one scale per 32 weights (README, "ONNX Runtime on the CPU")


def export_dir(gguf_path: str | Path) -> Path:
    """Beside the GGUF (under $ONDEVICE_HOME for a model in another program's store)."""
    path = Path(gguf_path).expanduser()
    return derived_path(path, path.name + ".onnx")


def _identity(gguf_path: Path, accuracy_level: int) -> dict:
    st = gguf_path.stat()
    return {"format": FORMAT_VERSION, "gguf": [gguf_path.name, st.st_size, st.st_mtime_ns], "onnxruntime": version("onnxruntime"),
            "accuracy_level": accuracy_level}  # fmt: skip


def rows_tag(rows: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(rows, dtype=np.int64).tobytes()).hexdigest()[:12]


def export_built(gguf_path: str | Path, accuracy_level: int = ACCURACY_INT8, head_rows: np.ndarray | None = None,
                 int4_block: int | None = None) -> bool:
    """Whether `ensure_export` with these arguments has nothing to build. Building reads every weight
    into memory (docs/measurements/code-notes.md), so a load short of RAM uses an export only
    once it is built."""
    gguf_path = Path(gguf_path).expanduser()
    _, ident, *files, manifest = export_files(gguf_path, accuracy_level, head_rows, int4_block)
    return not missing_files(current_manifest(manifest, ident), files)


def export_files(gguf_path: Path, accuracy_level: int, head_rows, int4_block):
    """(folder, identity, body, head, trimmed head or None, manifest) of one export variant."""
    folder = export_dir(gguf_path)
    ident = {**_identity(gguf_path, accuracy_level), "int4_block": int4_block}
    variant = f"a{accuracy_level}" + (f"-int4b{int4_block}" if int4_block else "")
    body, head = folder / f"body.{variant}.onnx", folder / f"head.{variant}.onnx"
    trimmed = None if head_rows is None else folder / f"head-{rows_tag(head_rows)}.{variant}.onnx"
    return folder, ident, body, head, trimmed, folder / f"manifest.{variant}.json"


def missing_files(saved: dict | None, files) -> list[Path]:
    """The files of an export to build: all of them when its manifest is not current."""
    return [f for f in files if f is not None and not (saved is not None and f.is_file() and Path(str(f) + ".data").is_file())]


def current_manifest(manifest: Path, ident: dict) -> dict | None:
    """The manifest if it was written for this very file and these options, else None."""
    try:
        saved = json.loads(read_regular_file(manifest, MAX_STATE_BYTES)[0])  # not a FIFO, not without bound
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and all(saved.get(k) == v for k, v in ident.items()) else None


def drafter_export_built(gguf_path: str | Path, keep_ids: np.ndarray | None = None) -> bool:
    """Whether the ONNX drafter of this GGUF (default options; keep_ids: its VocabTrim head's rows)
    opens without building anything."""
    return export_built(gguf_path, ACCURACY_INT8, keep_ids, DRAFTER_INT4_BLOCK)
