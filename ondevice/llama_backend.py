"""llama.cpp, the one place: load GGUF models and contexts, decode batches, manage the KV cache.

Everything else in ondevice talks to llama.cpp through this file (the low-level ctypes API of
llama-cpp-python), but for the eval callback a streaming target steers by
(targets/layer_callback.py). What it takes care of:

- **Repacked weights where they run.** llama.cpp's faster CPU layouts (extra buffer types) for weights
  held in RAM; on a CPU with AMX its AMX kernels only with ONDEVICE_AMX=1 and a build where they run
  (machine/llama_repack.py), else its CPU_REPACK layouts asked for weight by weight
  (machine/repack_layouts.py). A context whose model computes with the AMX kernels decodes on a thread
  of its own (`LlamaContext._on_own_thread`).
- **Clear errors.** A missing file, one that is not a GGUF, or one whose header or metadata would
  make llama.cpp abort (files/gguf_check.py) is an `OndeviceError` before llama.cpp sees it; a model
  or context llama.cpp refuses is one too.
- **Tree-ready contexts.** A unified KV cache (one cell may belong to many sequences), flash
  attention off (exact logits), up to `llama_max_parallel_sequences()` sequences.
- **Quiet by default.** llama.cpp's log lines are dropped unless `set_llama_logging(True)` or the
  environment variable ONDEVICE_LLAMA_LOG=1.

`LlamaContext.decode` fills a batch held in numpy arrays and returns the logits of the requested
rows as a numpy *view* of llama.cpp's buffer (no copy; valid until the next decode).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from pathlib import Path
from typing import Sequence

import llama_cpp
import numpy as np

from ondevice.errors import OndeviceError
from ondevice.files.gguf_check import check_gguf_file
from ondevice.files.gguf_header import read_header
from ondevice.machine.facts import default_threads
from ondevice.machine.llama_repack import cpu_has_amx, repack_runs
from ondevice.machine.repack_layouts import repack_overrides

KV_TYPES = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16}
LLAMA_MAX_SEQUENCES = int(llama_cpp.llama_max_parallel_sequences())  # LLAMA_MAX_SEQ (256)

# --- logging ----------------------------------------------------------------------------------

_log_enabled = os.environ.get("ONDEVICE_LLAMA_LOG", "") not in ("", "0")
_captures: list[list[str]] = []  # capture_llama_log() blocks in progress


@llama_cpp.llama_log_callback
def _log_to_stderr(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if not text:
        return
    line = text.decode("utf-8", errors="replace")
    for lines in _captures:
        lines.append(line)
    if _log_enabled:
        sys.stderr.write(line)
        sys.stderr.flush()


def set_llama_logging(enabled: bool) -> None:
    """Show (True) or drop (False, the default) llama.cpp's and ggml's log lines."""
    global _log_enabled
    _log_enabled = enabled


@contextlib.contextmanager
def capture_llama_log():
    """Collect llama.cpp's log lines (e.g. its buffer sizes) while the block runs: `with ... as lines`."""
    lines: list[str] = []
    _captures.append(lines)
    try:
        yield lines
    finally:
        _captures.remove(lines)


llama_cpp.llama_log_set(_log_to_stderr, ctypes.c_void_p(0))  # replaces llama-cpp-python's printer


@functools.cache
def _backend_ready() -> bool:
    llama_cpp.llama_backend_init()
    return True


# --- models -----------------------------------------------------------------------------------


def load_model(path: str | Path, *, n_gpu_layers: int = 0, resident: bool = False, repack: bool = True, vocab: bool = True,
               configure=None):
    """Load a GGUF with the crash guard; returns llama.cpp's model handle (free it with llama_model_free).

    resident: read the weights into anonymous memory instead of mapping the file, so the page cache
    cannot evict them (a drafter beside a target that streams). repack: let llama.cpp copy weights
    into its faster CPU layouts (anonymous memory too; off for a target that must stay mapped): all
    its extra buffer types where `repack_runs`, else (a CPU with AMX) CPU_REPACK weight by weight.
    vocab: False loads it without its tokenizer (`no_vocabulary`; ~40 MB of RAM for 152k tokens), which a
    model fed ids or embeddings and read for logits never uses (docs/measurements/2026-12-07-vocabulary-once.md).
    configure(params): sets more of llama_model_params last (a split across workers: loading/rpc_split.py).
    """
    path = check_gguf_file(path)
    _backend_ready()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE if resident else llama_cpp.LLAMA_LOAD_MODE_MMAP
    params.use_extra_bufts = repack and repack_runs(path)
    # a CPU with AMX: the CPU_REPACK layouts without the AMX buffer type (held here: llama.cpp reads them while it loads)
    overrides = repack_overrides(path) if repack and not params.use_extra_bufts and n_gpu_layers == 0 and configure is None else None
    if overrides is not None:
        params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
    kv = None if vocab else no_vocabulary(path)  # held here: llama.cpp reads it while it loads
    if kv is not None:
        params.kv_overrides = ctypes.cast(kv, ctypes.POINTER(llama_cpp.llama_model_kv_override))
    if configure is not None:
        configure(params)
    return _load(path, params)


def no_vocabulary(path: Path):
    """llama.cpp's metadata overrides that load a GGUF without its tokenizer: the tokenizer model "none"
    with `{arch}.vocab_size` ids (one empty entry per id: its logits and token checks keep their size)."""
    header = read_header(path)
    arch = str(header.metadata.get("general.architecture", "")).encode()
    kv = (llama_cpp.llama_model_kv_override * 3)()
    kv[0].tag, kv[0].key, kv[0].value.val_str = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, b"tokenizer.ggml.model", b"none"
    kv[1].tag, kv[1].key, kv[1].value.val_i64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, arch + b".vocab_size", header.n_vocab
    kv[2].key = b""  # the end of the list
    return kv


def load_vocab(path: str | Path):
    """A GGUF's vocabulary alone (llama.cpp's vocab_only load: no weights read, nothing repacked), with
    the crash guard; returns the model handle (free it with llama_model_free)."""
    path = check_gguf_file(path)
    _backend_ready()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    return _load(path, params)


def _load(path: Path, params):
    handle = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not handle:
        raise OndeviceError(f"llama.cpp could not load {path} (corrupt or unsupported GGUF); download it again.")
    return handle


class LlamaModel:
    """A loaded GGUF model: weights plus vocabulary facts."""

    def __init__(self, path: str | Path, n_gpu_layers: int = 0, resident: bool = False, repack: bool = True, vocab: bool = True,
                 configure=None):
        self.path = Path(path)
        self.source = self.path  # the model file it was made from (a repacked copy's: the original's)
        self.resident, self.repack, self.has_vocab = resident, repack, vocab
        self.handle = load_model(path, n_gpu_layers=n_gpu_layers, resident=resident, repack=repack, vocab=vocab, configure=configure)
        self.tile_kernels = repack and cpu_has_amx() and repack_runs(path)  # llama.cpp's AMX kernels compute with it
        vocab = llama_cpp.llama_model_get_vocab(self.handle)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        self.n_embd = int(llama_cpp.llama_model_n_embd(self.handle))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self.handle))
        self._readers: set[int] = set()  # ids of the objects reading its vocabulary (a Tokenizer: `lend_vocab`)
        self._closed = False

    def lend_vocab(self, reader: object) -> int:
        """The vocabulary's handle, for `reader` to use until it calls `vocab_returned(reader)`: until
        then close() leaves the model loaded (it is freed when the last of them is done)."""
        if self._closed:
            raise ValueError(f"the model {self.path.name} is closed")
        if not self.has_vocab:
            raise ValueError(f"the model {self.path.name} was loaded without its vocabulary")
        self._readers.add(id(reader))
        return llama_cpp.llama_model_get_vocab(self.handle)

    def vocab_returned(self, reader: object) -> None:
        self._readers.discard(id(reader))
        if self._closed:
            self.close()

    def close(self) -> None:
        """Free the model now, or once every reader of its vocabulary is done (again: nothing)."""
        self._closed = True
        if getattr(self, "handle", None) and not self._readers:
            llama_cpp.llama_model_free(self.handle)
            self.handle = None

    def __del__(self) -> None:
        self._readers = set()  # unreachable: nothing reads it any more
        self.close()


# --- batches ----------------------------------------------------------------------------------

_SeqIdRow = ctypes.POINTER(llama_cpp.llama_seq_id)


class _Batch:
    """A llama_batch whose arrays are numpy arrays we own (filled with vectorised writes)."""

    def __init__(self, capacity: int, n_seq_max: int, n_embd: int = 0):
        self.capacity, self.n_seq_max, self.n_embd = capacity, n_seq_max, n_embd
        self.token = np.zeros(capacity, np.int32)
        self.embd = np.zeros((capacity, n_embd), np.float32) if n_embd else None
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.zeros(capacity, np.int32)
        self.seq_id = np.zeros((capacity, n_seq_max), np.int32)
        self.logits = np.zeros(capacity, np.int8)
        stride = self.seq_id.strides[0]
        base = self.seq_id.ctypes.data
        self._rows = (_SeqIdRow * capacity)(*[ctypes.cast(base + i * stride, _SeqIdRow) for i in range(capacity)])

    def as_llama_batch(self, n_tokens: int, use_embd: bool) -> llama_cpp.llama_batch:
        def ptr(a, ctype):
            return a.ctypes.data_as(ctypes.POINTER(ctype))

        b = llama_cpp.llama_batch()
        b.n_tokens = n_tokens
        b.token = ptr(self.token, llama_cpp.llama_token) if not use_embd else None
        b.embd = ptr(self.embd, ctypes.c_float) if use_embd else None
        b.pos = ptr(self.pos, llama_cpp.llama_pos)
        b.n_seq_id = ptr(self.n_seq_id, ctypes.c_int32)
        b.seq_id = self._rows
        b.logits = ptr(self.logits, ctypes.c_int8)
        return b


# --- contexts ---------------------------------------------------------------------------------


class LlamaContext:
    """A llama.cpp context (KV cache + compute) for tree work; sequence 0 is the main sequence."""

    def __init__(
        self,
        model: LlamaModel,
        n_ctx: int = 4096,
        n_seq_max: int = LLAMA_MAX_SEQUENCES,
        n_batch: int = 512,
        n_ubatch: int | None = None,
        threads: int | None = None,
        kv_type: str = "f32",
        embeddings_input: bool = False,
        n_outputs_max: int | None = None,
        eval_callback=None,
    ):
        if kv_type not in KV_TYPES:
            raise OndeviceError(f"unknown KV cache type {kv_type!r}; choose one of {', '.join(KV_TYPES)}.")
        if not 1 <= n_seq_max <= LLAMA_MAX_SEQUENCES:
            raise OndeviceError(f"llama.cpp supports 1 to {LLAMA_MAX_SEQUENCES} sequences per context, not {n_seq_max}.")
        self.model = model
        self.threads = threads or default_threads()
        params = llama_cpp.llama_context_default_params()
        n_batch = max(n_batch, n_seq_max)  # llama.cpp reserves one output row per sequence up front
        params.n_ctx = max(n_ctx, n_batch)  # and caps n_batch at n_ctx
        params.n_batch = n_batch
        params.n_ubatch = min(n_batch, n_ubatch or n_batch)
        params.n_seq_max = n_seq_max
        if n_outputs_max is not None:  # logits rows per call: sizes the output and compute buffers
            params.n_outputs_max = min(n_batch, max(n_outputs_max, n_seq_max))
        params.n_threads = params.n_threads_batch = self.threads
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.kv_unified = True
        params.type_k = params.type_v = KV_TYPES[kv_type]
        params.no_perf = True
        if eval_callback is not None:  # e.g. layer_callback(...): kept alive with the context
            params.cb_eval, params.cb_eval_user_data = eval_callback, None
        self._eval_callback = eval_callback
        # llama.cpp's AMX kernels load a thread's tile configuration once and trust it from then on, while
        # other AMX users (torch's bfloat16 matmuls) release it when they are done: the next AMX pass on
        # that thread dies of an illegal instruction. So such a context decodes on a thread of its own.
        self._tile_thread = ThreadPoolExecutor(1, thread_name_prefix="llama-amx") if model.tile_kernels else None
        self.handle = llama_cpp.llama_init_from_model(model.handle, params)
        if not self.handle:
            raise OndeviceError(
                f"llama.cpp could not create a context of {n_ctx} tokens for {model.path.name} "
                "(probably out of memory); lower the context size."
            )
        self.memory = llama_cpp.llama_get_memory(self.handle)
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.handle))
        self.n_batch = int(llama_cpp.llama_n_batch(self.handle))
        self.n_seq_max = n_seq_max
        self.n_vocab = model.n_vocab
        self._batch = _Batch(self.n_batch, n_seq_max, model.n_embd if embeddings_input else 0)

    def set_threads(self, n: int) -> None:
        """Decode with n threads from now on (`threads` keeps the number the context was made with)."""
        llama_cpp.llama_set_n_threads(self.handle, n, n)

    # --- decoding -----------------------------------------------------------------------------
    def decode(
        self,
        tokens: Sequence[int] | np.ndarray | None,
        positions: Sequence[int] | np.ndarray,
        seq_ids: Sequence[int] | Sequence[Sequence[int]] | np.ndarray,
        outputs: Sequence[bool] | np.ndarray,
        embeddings: np.ndarray | None = None,
    ) -> np.ndarray:
        """Decode one batch (at most n_batch tokens) in a single llama_decode call.

        seq_ids: one sequence id per token, or a list of ids per token (a cell shared by sequences;
        the first id decides what the token attends to). outputs: which rows get logits.
        embeddings: (n, n_embd) float32 inputs instead of token ids (context made with embeddings_input).
        Returns the (n_outputs, n_vocab) float32 logits as a view, valid until the next decode.
        """
        b = self._batch
        n = len(positions)
        if not 0 < n <= b.capacity:
            raise ValueError(f"a batch holds 1 to {b.capacity} tokens, got {n}")
        if embeddings is not None:
            b.embd[:n] = embeddings
        else:
            b.token[:n] = tokens
        b.pos[:n] = positions
        b.logits[:n] = outputs
        self._fill_seq_ids(seq_ids, n)
        rc = self._on_own_thread(llama_cpp.llama_decode, self.handle, b.as_llama_batch(n, embeddings is not None))
        if rc == 1:
            raise OndeviceError(
                f"the llama.cpp context of {self.model.path.name} is full ({self.n_ctx} cells); "
                "start a new chat or raise the context size."
            )
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} (set ONDEVICE_LLAMA_LOG=1 for details)")
        return self.logits(int(np.count_nonzero(b.logits[:n])))

    def _fill_seq_ids(self, seq_ids, n: int) -> None:
        b = self._batch
        flat = seq_ids if isinstance(seq_ids, np.ndarray) else None
        if flat is None and n > 0 and isinstance(seq_ids[0], (int, np.integer)):
            flat = np.asarray(seq_ids)
        if flat is not None:
            if flat.min() < 0 or flat.max() >= self.n_seq_max:
                raise ValueError(f"sequence ids must be in [0, {self.n_seq_max})")
            b.seq_id[:n, 0] = flat
            b.n_seq_id[:n] = 1
            return
        for i, ids in enumerate(seq_ids):
            if not 0 < len(ids) <= self.n_seq_max or min(ids) < 0 or max(ids) >= self.n_seq_max:
                raise ValueError(f"token {i}: sequence ids must be 1 to {self.n_seq_max} ids in [0, {self.n_seq_max})")
            b.seq_id[i, : len(ids)] = ids
            b.n_seq_id[i] = len(ids)

    def logits(self, n_outputs: int) -> np.ndarray:
        """The last decode's output rows, (n_outputs, n_vocab) float32, as a view of llama.cpp's buffer."""
        if n_outputs == 0:
            return np.zeros((0, self.n_vocab), np.float32)
        ptr = llama_cpp.llama_get_logits(self.handle)
        return np.ctypeslib.as_array(ptr, shape=(n_outputs, self.n_vocab))

    # --- KV cache -----------------------------------------------------------------------------
    def _check_seq(self, *seqs: int) -> None:
        for s in seqs:  # llama.cpp asserts (aborts the process) on out-of-range ids
            if not 0 <= s < self.n_seq_max:
                raise ValueError(f"sequence id {s} outside [0, {self.n_seq_max})")

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        """Drop the cells of `seq` at positions [p0, p1) (-1: open end); seq -1 means every sequence."""
        if seq >= 0:
            self._check_seq(seq)
        if not llama_cpp.llama_memory_seq_rm(self.memory, seq, p0, p1):
            raise RuntimeError(f"llama.cpp refused to remove positions [{p0}, {p1}) of sequence {seq}")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Add `dst` to the cells of `src` at positions [p0, p1) (no data is copied)."""
        self._check_seq(src, dst)
        llama_cpp.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        """Drop every cell that does not belong to `seq`."""
        self._check_seq(seq)
        llama_cpp.llama_memory_seq_keep(self.memory, seq)

    def seq_pos_max(self, seq: int) -> int:
        """Largest position held by `seq`, -1 if it is empty."""
        self._check_seq(seq)
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.memory, True)

    def _on_own_thread(self, call, *args):
        """call(*args) on this context's own thread where it has one (AMX kernels), else on this one. That
        thread keeps the priority it started with (overlap.idle_priority does not reach it)."""
        if self._tile_thread is None:
            return call(*args)
        future = self._tile_thread.submit(call, *args)
        try:
            return future.result()
        except BaseException:  # Ctrl-C while waiting: the call must end before the context is touched again
            while not future.done():
                with contextlib.suppress(KeyboardInterrupt):
                    futures_wait([future])
            raise

    def close(self) -> None:
        if getattr(self, "_tile_thread", None) is not None:
            self._tile_thread.shutdown()
        if getattr(self, "handle", None):
            llama_cpp.llama_free(self.handle)
            self.handle = None

    def __del__(self) -> None:
        self.close()
