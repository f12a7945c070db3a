"""Whether a GGUF model file may be handed to llama.cpp (or to our own readers) at all.

People download GGUF files from strangers. `gguf_header.read_header` refuses a header that breaks the
format (a length or count past the end of the file, a tensor outside it, a bad alignment, an unknown
type). That is not enough for llama.cpp: its model loader *asserts* some facts about the metadata, and
an assert aborts the whole process (SIGABRT and a backtrace, no error to catch) — `block_count` =
2^31-1 against LLAMA_MAX_LAYERS, an expert count past LLAMA_MAX_EXPERTS, an unknown RoPE scaling
name, a norm epsilon below 0 or NaN (`eps >= 0.0f` at the first decode), a tensor whose bytes are not
aligned as ggml's CPU buffers need (`general.alignment = 1` is valid GGUF: "buffer pointer must be
aligned"), and what the vocabulary check knows (gguf_vocab.py: the tokenizer model, token types and
texts). So before any llama.cpp load (`llama_backend.load_model`, every
model and vocabulary goes through it) and before gguf-py parses a file (`gguf_reader.SplitReader`),
`check_model_file(path)` reads the header and checks those facts, plus the hyperparameters our own
code reads as integers. The verdict is kept per file version (path, size, mtime, ctime, inode) for
the life of the process, so a file loaded four times (two vocabularies, two models) is read once.

Limits are llama.cpp's (vendor/llama.cpp, src/llama-hparams.h, src/llama-model.cpp load_hparams).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

from gguf.constants import GGMLQuantizationType

from ondevice.errors import OndeviceError
from ondevice.files.gguf_header import GGUF_MAGIC, GGUFHeader, read_header
from ondevice.files.gguf_split import part_paths
from ondevice.files.gguf_vocab import vocab_problem

LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
MAX_HPARAM = (1 << 31) - 1  # llama.cpp keeps them in 32-bit integers
TENSOR_ALIGNMENT = 32  # ggml's CPU buffers (ggml-backend.c TENSOR_ALIGNMENT): a mapped file's tensors must start at it
EPSILONS = ("attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon", "attention.group_norm_epsilon")  # ggml asserts eps >= 0
# `{arch}.` hyperparameters that must be whole numbers when present (llama.cpp reads them as integers;
# loading/memory.py does arithmetic with them).
INT_HPARAMS = ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
               "attention.head_count_kv", "attention.key_length", "attention.value_length", "rope.dimension_count",
               "expert_count", "expert_used_count", "expert_group_count", "expert_group_used_count",
               "nextn_predict_layers", "vocab_size")  # fmt: skip
# Weight types llama.cpp's CPU kernels multiply (an integer or F64 weight, or Q8_K, which is only an
# activation format, has no kernel: llama.cpp asserts or calls a null function).
WEIGHT_TYPES = frozenset(GGMLQuantizationType[name] for name in (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS",
    "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4"))  # fmt: skip


def check_gguf_file(path: str | Path) -> Path:
    """The path as a Path if it is a GGUF file llama.cpp may load (missing, unreadable, not a GGUF, or
    a header or metadata llama.cpp would abort on: `check_model_file`); else OndeviceError naming the fix."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise OndeviceError(f"model file {path} does not exist; run `ondevice download` or check the path.")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise OndeviceError(f"model file {path} cannot be read ({err.strerror}); check its permissions.") from None
    if magic != GGUF_MAGIC:
        raise OndeviceError(f"{path} is not a GGUF model file (it may be corrupt); download it again.")
    check_model_file(path)
    return path


def check_model_file(path: str | Path) -> GGUFHeader:
    """The file's header if llama.cpp may load it; else an OndeviceError naming the file and what is wrong."""
    path = Path(path).expanduser()
    try:
        stats = tuple((s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino) for s in (p.stat() for p in part_paths(path)))
    except OSError:
        stats = ()  # missing or unreadable: read_header says which, in one line
    return _checked(path, stats)


@functools.lru_cache(maxsize=32)
def _checked(path: Path, stats: tuple) -> GGUFHeader:
    header = read_header(path)
    problem = model_problem(header)
    if problem:
        raise OndeviceError(f"{path} cannot be loaded: {problem}; it is damaged or not a model llama.cpp runs (download it again).")
    return header


def model_problem(header: GGUFHeader) -> str | None:
    """What in the metadata would make llama.cpp abort or our own code fail, in words; None if nothing."""
    return _hparam_problem(header) or _expert_problem(header) or _tensor_problem(header) or vocab_problem(header)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _hparam_problem(header: GGUFHeader) -> str | None:
    arch = header.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch or len(arch) > 64 or not arch.isprintable():
        return "general.architecture is missing or not a name"
    for key in INT_HPARAMS:
        value = header.arch_value(key)
        if value is not None and (not _int(value) or not 0 <= value <= MAX_HPARAM):
            return f"{arch}.{key} is {value!r}, not a whole number in 0..{MAX_HPARAM}"
    layers = header.arch_value("block_count")
    if layers is not None and not 1 <= layers <= LLAMA_MAX_LAYERS:
        return f"{arch}.block_count is {layers:,}; llama.cpp takes 1..{LLAMA_MAX_LAYERS} layers"
    if header.arch_value("nextn_predict_layers", 0) > (layers or 0):
        return f"{arch}.nextn_predict_layers is more than {arch}.block_count"
    scaling = header.arch_value("rope.scaling.type")
    if scaling is not None and scaling not in ROPE_SCALING_TYPES:
        return f"{arch}.rope.scaling.type is {scaling!r}, not one of {', '.join(ROPE_SCALING_TYPES)}"
    for key in EPSILONS:
        eps = header.arch_value(key)
        if eps is not None and (not isinstance(eps, (int, float)) or isinstance(eps, bool) or not (math.isfinite(eps) and eps >= 0)):
            return f"{arch}.{key} is {eps!r}, not a finite number >= 0"
    return None


def _expert_problem(header: GGUFHeader) -> str | None:
    """llama.cpp's asserts on mixture-of-experts counts (load_hparams)."""
    experts, used = header.arch_value("expert_count", 0), header.arch_value("expert_used_count", 0)
    groups, groups_used = header.arch_value("expert_group_count", 0), header.arch_value("expert_group_used_count", 0)
    if experts > LLAMA_MAX_EXPERTS:
        return f"expert_count is {experts:,}; llama.cpp takes at most {LLAMA_MAX_EXPERTS}"
    if experts == 0:
        return "expert_used_count or expert_group_count is set without experts" if used or groups else None
    if not 0 < used <= experts or groups >= experts:
        return f"expert_used_count {used} or expert_group_count {groups} does not fit expert_count {experts}"
    if groups > 1 and (experts % groups or not 0 < groups_used < groups):
        return f"expert groups {groups} (used {groups_used}) do not divide {experts} experts"
    return None


def _tensor_problem(header: GGUFHeader) -> str | None:
    """Where ggml's buffers need tensors to start, and types llama.cpp's graph cannot compute with: it
    asserts (e.g. RoPE factors must be F32) at the first decode. Converters keep every vector (norms,
    biases, RoPE factors) in F32, and every tensor at a multiple of 32 bytes."""
    for t in header.tensors.values():
        if t.offset % TENSOR_ALIGNMENT:
            return f"tensor {t.name!r} starts at byte {t.offset:,}, not a multiple of {TENSOR_ALIGNMENT} as llama.cpp's buffers need"
        if t.qtype not in WEIGHT_TYPES:
            return f"tensor {t.name!r} has the type {t.type_name}, which is not a weight type"
        if len(t.shape) <= 1 and t.qtype != GGMLQuantizationType.F32:
            return f"the vector {t.name!r} is {t.type_name}, not F32"
    return None
