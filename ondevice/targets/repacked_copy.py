"""A streaming target's weights in llama.cpp's repacked layouts, read from a copy of its file.

In RAM llama.cpp copies the weights of its matrix products into interleaved layouts its CPU kernels
compute faster with (the CPU_REPACK buffer type: on x86 with AVX2 or AVX-512, Q4_0, Q4_K and IQ4_NL
in blocks of 8 rows). A target that streams keeps its file mapped, so its layers were computed in
the file's layout. This module gives them the repacked one:

- `write_repacked_copy`: a copy of the GGUF file, byte for byte the same except each block weight
  llama.cpp would repack here, which holds its repacked bytes (the same size; llama.cpp's own
  repacking, done tensor by tensor in a small CPU_REPACK buffer: no model-sized memory). The copy
  is made once per model, llama.cpp build and CPU (its record says for which);
- `mark_weights`: once the target is loaded from the copy (mapped, not repacked again), each of
  those weights is marked as llama.cpp marks the weights it repacks itself — its buffer a
  CPU_REPACK buffer, its `extra` the kernels for its layout — in one pass of a small context of its
  own, whose eval callback is asked about every node before it computes. Its data stays where the
  mapping (and a streaming window) puts it.

The marks use four fields of ggml's tensor struct (buffer, src[0], name, extra) at offsets checked
against ggml's own functions when the library is first used (`_layout`); a build whose struct
differs gets no repacked copy (the streamed layers keep the file's layout, as before).
"""

from __future__ import annotations

import ctypes as C
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import NamedTuple

import llama_cpp

from ondevice.catalog.stores.derived import source_stamp
from ondevice.errors import OndeviceError
from ondevice.files.gguf_header import read_header
from ondevice.llama_backend import LlamaContext, LlamaModel
from ondevice.machine.repack_layouts import OFF_BUFFER, OFF_DATA, OFF_NAME, OFF_SRC0, InitParams, P, ggml_libs, pointer_at, repack_buffer_type, repacked_names

DISK_MARGIN = 2 << 30  # free space left after a copy is written


class Repacker:
    """llama.cpp's repacking of one weight at a time, in a CPU_REPACK buffer sized for the largest."""

    def __init__(self, largest: int):
        self.base, _ = ggml_libs()
        self.ctx = self.base.ggml_init(InitParams(1 << 20, None, True))
        self.buffer = self.base.ggml_backend_buft_alloc_buffer(repack_buffer_type(), largest)

    def __call__(self, qtype: int, shape: tuple[int, int], raw: bytes) -> bytes:
        """The repacked bytes of a (shape) weight of type qtype stored as `raw` in the file."""
        base = self.base
        base.ggml_free(self.ctx)  # one tensor at a time: a fresh context for its header
        self.ctx = base.ggml_init(InitParams(1 << 20, None, True))
        tensor = base.ggml_new_tensor_2d(self.ctx, qtype, *shape)
        base.ggml_backend_tensor_alloc(self.buffer, tensor, base.ggml_backend_buffer_get_base(self.buffer))
        base.ggml_backend_tensor_set(tensor, raw, 0, len(raw))  # llama.cpp repacks as it sets
        return C.string_at(pointer_at(tensor + OFF_DATA), len(raw))

    def close(self) -> None:
        self.base.ggml_backend_buffer_free(self.buffer)
        self.base.ggml_free(self.ctx)


def write_repacked_copy(path: str | Path, out: str | Path, names=None) -> list[str]:
    """Write `out`: `path` with each weight of `names` (default: `repacked_names`) in llama.cpp's
    repacked layout, at its own offset. Returns those names."""
    path, out = Path(path), Path(out)
    names = repacked_names(path) if names is None else list(names)
    tensors = read_header(path).tensors
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")  # two processes may write it at once
    repack = Repacker(max((tensors[n].nbytes for n in names), default=1))
    try:
        shutil.copyfile(path, partial)
        with open(path, "rb") as src, open(partial, "r+b") as dst:
            for name in names:
                t = tensors[name]
                src.seek(t.offset)
                dst.seek(t.offset)
                dst.write(repack(t.qtype, t.shape, src.read(t.nbytes)))
            dst.flush()
            os.fsync(dst.fileno())
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        repack.close()
    os.replace(partial, out)
    return names


class RepackMarks:
    """Marks a loaded copy's repacked weights as llama.cpp's own repacked weights, each before the
    first graph node that uses it computes (`see`, from an eval callback's question about a node)."""

    def __init__(self, names):
        base, _ = ggml_libs()
        self._base = base
        self.buffer = base.ggml_backend_buft_alloc_buffer(repack_buffer_type(), 64)
        base.ggml_backend_buffer_set_usage(self.buffer, 1)  # GGML_BACKEND_BUFFER_USAGE_WEIGHTS
        self.pending = {n.encode() for n in names}
        self.marked: set[int] = set()

    def see(self, node: int) -> None:
        """A graph node is about to be computed: mark its first source if it is a pending weight."""
        weight = pointer_at(node + OFF_SRC0)
        if not weight or weight in self.marked:
            return
        name = C.string_at(weight + OFF_NAME)
        if name in self.pending:
            P.from_address(weight + OFF_BUFFER).value = self.buffer
            self._base.ggml_backend_buffer_init_tensor(self.buffer, weight)  # its extra: the repacked kernels
            self.pending.discard(name)
            self.marked.add(weight)

    def close(self) -> None:
        if self.buffer:
            self._base.ggml_backend_buffer_free(self.buffer)
            self.buffer = None


def mark_weights(model: LlamaModel, names, threads: int | None = None) -> RepackMarks:
    """Mark a model loaded from its repacked copy: one token decoded in a small context of its own,
    whose callback marks each weight before the node using it computes (the whole file is read once).
    Contexts made afterwards find them marked, as llama.cpp's own repacked weights are."""
    marks = RepackMarks(names)

    @llama_cpp.ggml_backend_sched_eval_callback
    def callback(tensor, ask, user_data):
        if ask:
            marks.see(tensor)
        return not ask

    ctx = LlamaContext(model, n_ctx=8, n_batch=8, n_ubatch=8, n_seq_max=1, threads=threads, eval_callback=callback)
    try:
        ctx.decode([0], [0], [0], [True])
    finally:
        ctx.close()
    if marks.pending:
        marks.close()
        raise OndeviceError(f"{model.path.name}: {len(marks.pending)} repacked weights were never used by a pass; "
                            "stream the file itself (--stream-file).")  # fmt: skip
    return marks


class RepackedCopy(NamedTuple):
    path: Path  # the copy to load and stream instead of the model file
    names: tuple[str, ...]  # its weights in the repacked layouts (RepackMarks marks them)


def layout_fingerprint(qtypes) -> str:
    """What the repacked bytes depend on besides the model: the library's layouts on this CPU, as the
    sha256 of one small weight of each of these types repacked here (the same bytes in, the same out)."""
    digest = hashlib.sha256()
    repack = Repacker(1 << 20)
    try:
        for qtype in sorted(set(qtypes)):
            size = _nbytes(qtype, (256, 8))
            digest.update(repack(qtype, (256, 8), bytes((i * 37 + 11) % 251 for i in range(size))))
    finally:
        repack.close()
    return digest.hexdigest()


def _nbytes(qtype: int, shape: tuple[int, int]) -> int:
    base, _ = ggml_libs()
    ctx = base.ggml_init(InitParams(1 << 16, None, True))
    try:
        return base.ggml_nbytes(base.ggml_new_tensor_2d(ctx, qtype, *shape))
    finally:
        base.ggml_free(ctx)


def ensure_copy(model: Path, copy: Path, record: Path, say=print) -> RepackedCopy | None:
    """The model's repacked copy at `copy`, written if missing or made for another file or library
    layout; None where nothing would be repacked here or the disk lacks room for it (said)."""
    tensors = read_header(model).tensors
    names = repacked_names(model, tensors)
    if not names:
        return None
    stat = model.stat()
    want = {**source_stamp(model), "layout": layout_fingerprint(tensors[n].qtype for n in names), "names": names}
    try:
        if copy.exists() and json.loads(record.read_text()) == want:
            return RepackedCopy(copy, tuple(names))
    except (OSError, ValueError):
        pass
    copy.parent.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(copy.parent).free < stat.st_size + DISK_MARGIN:
        say(f"ondevice: no room for a repacked copy of {model.name} ({stat.st_size / 1e9:.1f} GB) beside it; "
            "its streamed layers keep the file's layout.")  # fmt: skip
        return None
    say(f"ondevice: writing {model.name} in llama.cpp's repacked layouts for streaming (once, {stat.st_size / 1e9:.1f} GB) ...")
    try:
        record.unlink(missing_ok=True)
        write_repacked_copy(model, copy, names)
        record.write_text(json.dumps(want))
    except OSError as e:
        say(f"ondevice: could not write the repacked copy of {model.name} ({e.strerror or e}); its streamed layers keep the file's layout.")
        return None
    return RepackedCopy(copy, tuple(names))
