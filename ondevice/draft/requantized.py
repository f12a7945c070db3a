"""A drafter's weights requantized to IQ4_NL, a type llama.cpp's repacked CPU kernels compute.

A draft tree is grown by many small llama.cpp calls in series, each of a few rows, so the drafter's
matrix products set the pace of drafting. On x86 with AVX2 or AVX-512 llama.cpp computes Q4_0, Q4_K
and IQ4_NL weights in interleaved blocks of 8 rows (its repacked layouts, targets/repacked_copy.py),
other types in the file's own layout. A model whose width is not a multiple of 256 gets no K-quants:
the default drafter (Qwen2.5-Coder 0.5B "Q4_K_M", 896 wide) holds its layers in Q5_0 and Q6_K and so
drafts without those kernels. Requantized to IQ4_NL (4.5 bits a weight in blocks of 32, a non-linear grid)
its calls are shorter and its file smaller, room the target's layers take where the target streams;
how much, and how often its top token is the target's, in
docs/measurements/2026-12-06-drafter-iq4nl.md.

- `write_requantized(weights, say)` writes the copy beside the drafter file llama.cpp loads (its
  trimmed vocabulary where one is built): `X.iq4_nl.gguf` and a record of the file it was made from,
  once, with llama.cpp's own quantizer. Only where llama.cpp repacks IQ4_NL here and most of the
  file's block-weight bytes are of the nearby types it does not repack (Q5_0, Q5_1, Q6_K): a drafter
  in Q8_0 or 16 bits was chosen for its precision and stays as it is. A head of its own (the trimmed
  vocabulary's) is requantized too: every call reads it whole
  (docs/measurements/2026-12-07-drafter-head.md). The input embeddings keep their type, and so does
  a head tied to them.
- `drafter_weights(weights)`: the file to load, the copy where one was written for this very file
  and llama.cpp's repacked layouts are used here, else the file itself.

Whatever drafts, greedy and sampled answers stay the target's: only the trees change.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import llama_cpp

from ondevice.catalog.stores.derived import requantized_paths, source_stamp
from ondevice.files.gguf_header import read_header
from ondevice.paths import warn
from ondevice.machine.repack_layouts import BLOCK_WEIGHT, layouts_repacked, repacked_names, repacks_here

IQ4_NL = 20  # ggml_type
NOT_REPACKED = {6, 7, 14}  # Q5_0, Q5_1, Q6_K: near IQ4_NL's precision, and no repacked layout of their own


def worth_requantizing(weights: Path) -> bool:
    """Whether llama.cpp repacks IQ4_NL here and most of this file's block-weight bytes are of a type
    it does not repack (NOT_REPACKED)."""
    tensors = read_header(weights).tensors
    blocks = {name: t for name, t in tensors.items() if BLOCK_WEIGHT.fullmatch(name) and len(t.shape) == 2}
    if not blocks:
        return False
    fast = set(repacked_names(weights, tensors))
    slow = [t for name, t in blocks.items() if name not in fast and t.qtype in NOT_REPACKED]
    if 2 * sum(t.nbytes for t in slow) <= sum(t.nbytes for t in blocks.values()):
        return False
    return repacks_here([(IQ4_NL, tuple(slow[0].shape))])[0]


def source_record(weights: Path) -> dict:
    """What the copy's record says of the file it was made from, and of itself (a copy recorded
    otherwise, such as one that kept its head's type, is written again)."""
    return {**source_stamp(weights), "type": "IQ4_NL", "head": "IQ4_NL"}


def written_copy(weights: Path) -> Path | None:
    """The requantized copy of this very file, where it was written whole; else None."""
    copy, record = requantized_paths(weights)
    try:
        saved = json.loads(record.read_text())
        whole = copy.stat().st_size == saved.get("bytes")
    except (OSError, ValueError, AttributeError):
        return None
    return copy if whole and {k: v for k, v in saved.items() if k != "bytes"} == source_record(weights) else None


def drafter_weights(weights: Path) -> Path:
    """The GGUF to load for this drafter file: its requantized copy where one was written for it and
    llama.cpp's repacked layouts are used here (layouts_repacked), else the file itself."""
    weights = Path(weights)
    copy = written_copy(weights)
    return copy if copy is not None and layouts_repacked() else weights


def write_requantized(weights: Path, say=None) -> Path | None:
    """Write the drafter file's IQ4_NL copy where it is worth it (`worth_requantizing`) and none is
    written yet; the copy, or None where there is none (not worth it, or the folder refused the write:
    a warning, and the file itself drafts). say(message): a status line while it writes (half a
    minute for a 0.5B drafter on two cores)."""
    weights = Path(weights)
    written = written_copy(weights)
    if written is not None:
        return written
    if not worth_requantizing(weights):
        return None
    copy, record = requantized_paths(weights)
    partial = copy.with_name(copy.name + ".partial")
    if say is not None:
        say(f"writing {copy.name}, the drafter in IQ4_NL for llama.cpp's repacked kernels (once)")
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        record.unlink(missing_ok=True)
        quantize(weights, partial)
        partial.replace(copy)
        record.write_text(json.dumps({**source_record(weights), "bytes": copy.stat().st_size}))
    except OSError as err:
        partial.unlink(missing_ok=True)
        warn(f"cannot write {copy} ({err.strerror or err}); the drafter drafts from {weights.name}")
        return None
    return copy


def quantize(weights: Path, out: Path) -> None:
    """llama.cpp's quantizer: every weight to IQ4_NL (where a tensor's rows allow it; llama.cpp
    chooses a fallback type where not), a head of its own too; the input embeddings (and a head tied
    to them) as they are."""
    tensors = read_header(weights).tensors
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL
    params.allow_requantize = True
    params.nthread = 0  # llama.cpp's: the cores
    params.token_embedding_type = tensors["token_embd.weight"].qtype
    head = tensors.get("output.weight")
    params.output_tensor_type = IQ4_NL if head is not None else tensors["token_embd.weight"].qtype
    if llama_cpp.llama_model_quantize(str(weights).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise OSError(f"llama.cpp could not requantize {weights.name}")
