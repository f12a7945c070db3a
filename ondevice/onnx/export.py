"""Build the ONNX decoder of a GGUF once and cache it next to the file: `<model>.gguf.onnx/`.

    ensure_export(gguf_path)                 → OnnxExport (body and full head), built on first use
    ensure_export(gguf_path, head_rows=ids)  → also a head of only these rows (a VocabTrim drafter)

Weights stream from the GGUF to disk one tensor at a time (a big head in row chunks): each is
mapped to MatMulNBits inputs (`nbits.py`), appended to a `.data` file and dropped, so building
needs about one tensor's worth of memory, not a copy of the model. The cache is keyed by the GGUF
(name, size, mtime), this format's version and the onnxruntime version; a build happens under a
file lock, into temporary names renamed at the end, so concurrent users never see half a model.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from ondevice.errors import OndeviceError
from ondevice.files.embedding_rows import EmbeddingRows
from ondevice.onnx import graph as G
from ondevice.onnx.export_files import (
    ACCURACY_INT8,
    current_manifest,
    export_files,
    missing_files,
)
from ondevice.onnx.nbits import (
    NBitsWeight,
    gguf_to_nbits,
    requantize_4bit,
    stack_rows,
    supported,
)
from ondevice.onnx.session import fallback_error, kernel_ratios
from ondevice.paths import write_json
from ondevice.quant.gguf_blocks import FLOAT_TYPES
from ondevice.files.architecture import GGUF_NAMES, ModelArgs, gguf_model_args, rename
from ondevice.targets import weights as W

ACCURACY_FP32 = 0  # float32 activations: slower, for checking the weight mapping
ALIGN = 4096  # external tensors start on page boundaries (ORT can map them)
ROW_CHUNK = 8192  # rows of a big matrix converted at a time


@dataclass(frozen=True)
class OnnxExport:
    folder: Path
    args: ModelArgs
    embedding: EmbeddingRows  # the GGUF's token_embd: the body takes embeddings, looked up on the host
    body: Path
    head: Path  # full vocabulary
    trimmed_head: Path | None = None  # only the rows asked for

    @property
    def head_rows(self) -> int:
        return self.args.vocab_size


def ensure_export(
    gguf_path: str | Path, accuracy_level: int = ACCURACY_INT8, head_rows: np.ndarray | None = None, show: bool = True,
    int4_block: int | None = None,
) -> OnnxExport:
    """The cached export of this GGUF (what is missing or stale is built now), with a trimmed head if
    asked. int4_block: every matrix requantized to 4 bits with one scale per this many weights
    (`nbits.requantize_4bit`; not exact, for a drafter); None: the GGUF's own codes."""
    gguf_path = Path(gguf_path).expanduser()
    folder, ident, body, head, trimmed, manifest = export_files(gguf_path, accuracy_level, head_rows, int4_block)
    folder.mkdir(parents=True, exist_ok=True)  # under $ONDEVICE_HOME for a model in another program's store
    with _locked(folder):
        saved = current_manifest(manifest, ident)
        missing = missing_files(saved, (body, head, trimmed))
        if missing:
            reader = W.open_gguf(gguf_path)
            args = gguf_model_args(reader)
            source = GGUFWeights(reader, args, int4_block)
            if body in missing:
                _build_body(source, args, body, accuracy_level, show, gguf_path.name)
            for path, rows in ((head, None), (trimmed, head_rows)):
                if path in missing:
                    _build_head(source, args, path, accuracy_level, rows)
            embd = source.tensors["tok_embeddings.weight"]
            kernels = _kernel_check([p for p in (body, head, trimmed) if p], accuracy_level)
            saved = {**ident, "args": asdict(args), "embedding": EmbeddingRows.of_tensor(embd, embd.path).to_dict(), "kernels": kernels}
            write_json(manifest, saved)  # not saved (read-only or full disk): this run still uses the export
    if error := saved.get("kernels", {}).get("fallback"):
        raise OndeviceError(f"{gguf_path.name}: {error}")
    return OnnxExport(folder, ModelArgs.from_dict(saved["args"]), EmbeddingRows.from_dict(saved["embedding"]), body, head, trimmed)


def _kernel_check(paths: list[Path], accuracy_level: int) -> dict:
    """Once per build: every MatMulNBits configuration timed against a float MatMul (session.py).
    At the fp32 accuracy level (tests only) 8-bit nodes fall back by design: not checked."""
    if accuracy_level != ACCURACY_INT8:
        return {}
    ratios = kernel_ratios(paths)
    return {"ratios": {f"{c.bits}-bit block {c.block}": round(r, 3) for c, r in ratios.items()}, "fallback": fallback_error(ratios)}


@contextmanager
def _locked(folder: Path):
    with open(folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- reading weights from the GGUF ------------------------------------------------------------------


class GGUFWeights:
    """`graph.WeightSource` over a GGUF reader: quantized matrices as MatMulNBits, the rest float32."""

    def __init__(self, reader, args: ModelArgs, int4_block: int | None = None):
        self.args, self.int4_block = args, int4_block
        self.tensors = {}
        for tensor in reader.tensors:
            name = rename(tensor.name, GGUF_NAMES)
            if name is not None:
                self.tensors[name] = tensor
        if "output.weight" not in self.tensors:  # tied head: the embedding matrix
            self.tensors["output.weight"] = self.tensors["tok_embeddings.weight"]
        self.n_tensors = len(reader.tensors)

    def _tensor(self, name: str):
        if name not in self.tensors:
            raise OndeviceError(f"the GGUF has no tensor for {name}: the file may be damaged.")
        return self.tensors[name]

    def vector(self, name: str) -> np.ndarray:
        return np.ascontiguousarray(W._dequantize(self._tensor(name)), dtype=np.float32).reshape(-1)

    def matrix(self, name: str, rows: np.ndarray | None = None) -> NBitsWeight | np.ndarray:
        tensor = self._tensor(name)
        k, n = (int(d) for d in tensor.shape[:2])  # GGUF lists the inner dimension first
        if supported(tensor.tensor_type):
            chunks = [gguf_to_nbits(tensor.data, tensor.tensor_type, n, k, rows=part) for part in _row_chunks(n, rows)]
            if self.int4_block:
                chunks = [requantize_4bit(c, _block_for(k, self.int4_block)) for c in chunks]
            return stack_rows(chunks) if len(chunks) > 1 else chunks[0]
        if tensor.tensor_type not in FLOAT_TYPES:
            raise OndeviceError(f"{tensor.name} is stored as {tensor.tensor_type.name}, which the ONNX backend cannot read: use a K-quant, Q8_0 or float GGUF.")
        w = W._dequantize(tensor)
        return np.ascontiguousarray(w if rows is None else w[rows], dtype=np.float32)


def _block_for(k: int, block: int) -> int:
    """The largest power of two ≤ block that divides k (MatMulNBits blocks are powers of two ≥ 16)."""
    while k % block and block > 16:
        block //= 2
    return block


def _row_chunks(n: int, rows: np.ndarray | None) -> list[np.ndarray]:
    rows = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64)
    return [rows[i : i + ROW_CHUNK] for i in range(0, len(rows), ROW_CHUNK)]


# --- writing ---------------------------------------------------------------------------------------


class ExternalData:
    """Appends initializers to one `.data` file and returns TensorProtos that point into it."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "wb")

    def __call__(self, name: str, array: np.ndarray) -> TensorProto:
        pad = -self.file.tell() % ALIGN
        self.file.write(b"\0" * pad)
        offset = self.file.tell()
        self.file.write(np.ascontiguousarray(array).data)  # no copy: the buffer itself
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", offset), ("length", array.nbytes)):
            tensor.external_data.add(key=key, value=str(value))
        return tensor

    def close(self) -> None:
        self.file.close()


def _write(graph_fn, path: Path, accuracy_level: int) -> None:
    """Build a graph with its initializers streamed to `<path>.data`, then save both (renamed at the end)."""
    tmp = path.with_name(path.name + ".tmp")
    data = ExternalData(Path(str(tmp) + ".data"))
    try:
        graph = graph_fn(G.GraphBuilder(data, accuracy_level))
    finally:
        data.close()
    for init in graph.initializer:  # point at the final data file name
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = path.name + ".data"
    onnx.save(G.model(graph), str(tmp))
    os.replace(Path(str(tmp) + ".data"), Path(str(path) + ".data"))
    os.replace(tmp, path)


def _build_body(source: GGUFWeights, args: ModelArgs, path: Path, accuracy_level: int, show: bool, label: str) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("layers"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), disable=not show, transient=True) as progress:
        task = progress.add_task(f"exporting {label} to ONNX (once)", total=args.n_layers)
        _write(lambda g: G.body_graph(g, args, source, lambda i: progress.advance(task)), path, accuracy_level)


def _build_head(source: GGUFWeights, args: ModelArgs, path: Path, accuracy_level: int, rows: np.ndarray | None) -> None:
    _write(lambda g: G.head_graph(g, args, source.matrix("output.weight", rows)), path, accuracy_level)
