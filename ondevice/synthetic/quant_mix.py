"""The tensors of a model shape and the GGUF type llama.cpp's quantizer gives each one.

Q8_0 (LLAMA_FTYPE_MOSTLY_Q8_0): every 2-D weight is Q8_0, norms and biases F32.

llama.cpp (src/llama-quant.cpp, `llama_tensor_get_type_impl`), for LLAMA_FTYPE_MOSTLY_Q4_K_M:
  - every 2-D weight is Q4_K, norms and biases stay F32;
  - output.weight (or token_embd when the head is tied to it) is Q6_K, or Q8_0 when its rows are
    not a multiple of 256;
  - attn_v and ffn_down are Q6_K in the layers where `use_more_bits(i, n)` holds:
        i < n/8  or  i >= 7n/8  or  (i − n/8) % 3 == 2
    where i counts those tensors in the order the source file lists them — the converter writes
    layers in name order (blk.0, blk.1, blk.10, …, blk.19, blk.2, …), so this counter is the
    layer's rank among the names sorted as strings, not its number;
  - in a "70B" model (80 layers, grouped-query attention) the other attn_v go from Q4_K to Q5_K;
  - a tensor whose rows are not a multiple of the type's block falls back: Q4_K → Q5_0, Q5_K → Q5_1,
    Q6_K → Q8_0 (then F16 if even that does not divide).
This reproduces the per-tensor types of the Qwen2.5-Coder 1.5B and 0.5B Q4_K_M files exactly
(tests/test_synthetic.py checks it against the real files).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from ondevice.loading.footprint import ModelSize, tensor_bytes
from ondevice.synthetic.shapes import ModelShape

FALLBACK = {QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0}


@dataclass(frozen=True)
class TensorSpec:
    name: str  # GGUF name, e.g. "blk.3.attn_v.weight"
    shape: tuple[int, ...]  # (rows, columns) as numpy sees it; a GGUF lists it reversed
    qtype: QT

    @property
    def columns(self) -> int:
        return self.shape[-1]

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        n = 1
        for d in self.shape:
            n *= d
        return n // block * size


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def is_70b(shape: ModelShape) -> bool:
    """llama.cpp's LLM_TYPE_70B for these architectures: 80 layers (Qwen2 72B, Llama 70B)."""
    return shape.arch in ("qwen2", "llama") and shape.n_layers == 80 and shape.n_kv_heads < shape.n_heads


def layer_tensors(shape: ModelShape, i: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of layer i's tensors, in the order llama.cpp's converter writes them."""
    C, F, q, kv = shape.dim, shape.ffn, shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim
    p = f"blk.{i}."
    out = [(p + "attn_norm.weight", (C,)), (p + "ffn_down.weight", (C, F)), (p + "ffn_gate.weight", (F, C)),
           (p + "ffn_up.weight", (F, C)), (p + "ffn_norm.weight", (C,))]  # fmt: skip
    for proj, rows in (("k", kv), ("output", C), ("q", q), ("v", kv)):
        if shape.arch == "qwen2" and proj != "output":
            out.append((p + f"attn_{proj}.bias", (rows,)))
        out.append((p + f"attn_{proj}.weight", (rows, q) if proj == "output" else (rows, C)))
        if shape.arch == "qwen3" and proj in ("k", "q"):
            out.append((p + f"attn_{proj}_norm.weight", (shape.head_dim,)))
    return out


def preset_tensors(shape: ModelShape) -> list[TensorSpec]:
    """Every tensor with its type in the shape's quant, in the order of llama.cpp's files: head,
    embeddings, layers in name order (blk.0, blk.1, blk.10, …), final norm."""
    if shape.quant not in QUANTS:
        raise ValueError(f"unknown quant {shape.quant!r}")
    q8 = shape.quant == "Q8_0"
    head_type = QT.Q8_0 if q8 else _head_type(shape.dim)
    head = [] if shape.tied else [TensorSpec("output.weight", (shape.vocab, shape.dim), head_type)]
    embd = TensorSpec("token_embd.weight", (shape.vocab, shape.dim), head_type if shape.tied or q8 else _fit(QT.Q4_K, shape.dim))
    out = head + [embd]
    if shape.rope_factor is not None:
        out.append(TensorSpec("rope_freqs.weight", (shape.head_dim // 2,), QT.F32))
    for rank, i in enumerate(sorted(range(shape.n_layers), key=str)):  # layers in name order, as converted
        for name, dims in layer_tensors(shape, i):
            qtype = QT.F32 if len(dims) == 1 else QT.Q8_0 if q8 else _q4_k_m_type(shape, name, dims, rank)
            out.append(TensorSpec(name, dims, qtype))
    out.append(TensorSpec("output_norm.weight", (shape.dim,), QT.F32))
    return out


QUANTS = {"Q4_K_M": 15, "Q8_0": 7}  # name → llama.cpp's general.file_type


def _q4_k_m_type(shape: ModelShape, name: str, dims: tuple[int, ...], rank: int) -> QT:
    qtype = QT.Q4_K
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(rank, shape.n_layers):
        qtype = QT.Q6_K
    elif name.endswith("attn_v.weight") and is_70b(shape):
        qtype = QT.Q5_K
    return _fit(qtype, dims[-1])


def _head_type(columns: int) -> QT:
    return QT.Q6_K if columns % 256 == 0 else QT.Q8_0


def _fit(qtype: QT, columns: int) -> QT:
    """llama.cpp's fallback for rows that do not split into whole blocks."""
    if columns % GGML_QUANT_SIZES[qtype][0] == 0:
        return qtype
    fallback = FALLBACK[qtype]
    return fallback if columns % GGML_QUANT_SIZES[fallback][0] == 0 else QT.F16


def file_bytes(tensors: list[TensorSpec], alignment: int = 32) -> int:
    """Bytes of tensor data in the file (each tensor padded to the GGUF alignment)."""
    return sum(-(-t.nbytes // alignment) * alignment for t in tensors)


def preset_size(shape: ModelShape, size: int | None = None, tensors: list[TensorSpec] | None = None) -> ModelSize:
    """What the memory plan needs of a model not downloaded, as `ModelSize.from_gguf` reads it from a
    header: every tensor's bytes in the shape's quant mix (the types llama.cpp's quantizer gives each),
    so the plan sees the layers, LM head and embeddings its file will hold. size: the file's size when
    known (the catalog's, header included), else the tensor data, padded as a GGUF pads it. tensors:
    the shape's tensor list if made already (default: `preset_tensors(shape)`)."""
    tensors = list(preset_tensors(shape) if tensors is None else tensors)
    return ModelSize(
        file_bytes(tensors) if size is None else size, shape.n_layers, shape.dim, shape.n_heads,
        shape.n_kv_heads, shape.head_dim, shape.vocab, **tensor_bytes({t.name: t.nbytes for t in tensors}),
    )
