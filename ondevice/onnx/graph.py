"""The decoder as ONNX graphs: a body (input embeddings → final-normed hidden states, KV cache in
place) and a head (hidden states → logits), the same computation as `targets/torch_model.py`, built
from the same description (`files/architecture.ModelArgs`, tensors named as `GGUF_NAMES` names them).

Body inputs (T new tokens, S = slots attended = cache slots before them + T):
  embeds (1, T, C) float32            the tokens' input embeddings (looked up on the host)
  cos, sin (T, hd/2) float32          RoPE angles of the tokens' positions (host: rope_angles)
  rope_ids (1, T) int64               0..T-1: row t of cos/sin belongs to token t
  seqlens_k (1,) int32, total_len ()  S − 1 and S (GroupQueryAttention's bookkeeping)
  attention_bias (1, 1, T, S) float32 0 where a token may attend, −inf elsewhere (the tree mask)
  past_key_i, past_value_i            (1, nkv, slots, hd): layer i's cache, bound to the same buffer
                                      as present_key_i / present_value_i (GroupQueryAttention writes
                                      the T new entries at slots S − T .. S − 1, nothing is copied)
Outputs: hidden (1, T, C); present_key_i, present_value_i.

GroupQueryAttention adds its own causal mask over the new tokens, which a tree mask always lies
within (parents come before their children). Where the GGUF stores q/k rows permuted so that RoPE
pairs are adjacent (`ModelArgs.gguf_qk_pairs_adjacent`: Llama), we keep that layout and rotate
interleaved pairs (q·k is unchanged); otherwise halves. Linear layers: `nbits.py` (MatMulNBits plus the K-quant block-sum correction).
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ondevice.onnx.nbits import CORRECTION_GROUP, NBitsWeight, stack_rows
from ondevice.files.architecture import ModelArgs

OPSETS = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
MS = "com.microsoft"
INLINE_BYTES = 4096  # initializers smaller than this stay in the model file (shape inference reads them)


class WeightSource(Protocol):
    """Our tensor names ("layers.3.attention.wq.weight") → arrays, read from the GGUF one at a time."""

    def matrix(self, name: str) -> NBitsWeight | np.ndarray: ...  # NBits, or a float (n, k) matrix

    def vector(self, name: str) -> np.ndarray: ...  # norms and biases, float32


class GraphBuilder:
    """Nodes, and initializers handed to `add_initializer` (which may write them to disk at once)."""

    def __init__(self, add_initializer: Callable[[str, np.ndarray], TensorProto], accuracy_level: int):
        self.add_initializer = add_initializer
        self.accuracy_level = accuracy_level
        self.nodes: list = []
        self.initializers: list[TensorProto] = []
        self._count = 0
        self._block_sums: dict[str, str] = {}  # input name -> its K-quant block sums

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def op(self, op_type: str, inputs: list[str], hint: str, outputs: list[str] | None = None, domain: str = "", **attrs):
        outputs = outputs or [self.fresh(hint)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=self.fresh(op_type), domain=domain, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def const(self, name: str, array: np.ndarray) -> str:
        """An initializer: small ones (shapes, axes) inline, the rest through add_initializer."""
        array = np.ascontiguousarray(array)
        small = array.nbytes < INLINE_BYTES
        self.initializers.append(numpy_helper.from_array(array, name) if small else self.add_initializer(name, array))
        return name

    def ints(self, values) -> str:
        return self.const(self.fresh("ints"), np.asarray(values, dtype=np.int64))

    # --- layers -------------------------------------------------------------------------------
    def rms_norm(self, x: str, weight: np.ndarray, eps: float, name: str) -> str:
        """x·rsqrt(mean(x²) + eps)·weight over the last axis, in float32."""
        return self.op("SimplifiedLayerNormalization", [x, self.const(name, weight.astype(np.float32))], "norm", axis=-1, epsilon=eps)

    def linear(self, x: str, w: NBitsWeight | np.ndarray, name: str, bias: np.ndarray | None = None) -> str:
        """x (1, T, k) → (1, T, n): x·Wᵀ + bias (+ the K-quant correction)."""
        if isinstance(w, np.ndarray):  # a float matrix (F32/F16/BF16 in the GGUF): a plain MatMul
            y = self.op("MatMul", [x, self.const(name, np.ascontiguousarray(w.T, dtype=np.float32))], "mm")
            return y if bias is None else self.op("Add", [y, self.const(name + ".bias", bias)], "bias")
        inputs = [x, self.const(name + ".codes", w.codes), self.const(name + ".scales", w.scales)]
        if bias is not None:
            inputs += ["", "", self.const(name + ".bias", bias.astype(np.float32))]
        y = self.op("MatMulNBits", inputs, "mnb", domain=MS, K=w.k, N=w.n, bits=w.bits, block_size=w.block,
                    accuracy_level=self.accuracy_level)  # fmt: skip
        if w.correction is None:
            return y
        correction = self.const(name + ".correction", np.ascontiguousarray(w.correction.T))  # (k/32, n)
        return self.op("Add", [y, self.op("MatMul", [self.block_sums(x, w.k), correction], "corr")], "corrected")

    def linears(self, x: str, ws: list, names: list[str], biases: list | None = None) -> list[str]:
        """Several linears of one input. Where their layouts agree they run as one MatMulNBits over
        the stacked rows (fewer, larger kernel calls: q/k/v, gate/up), split after."""
        biases = biases or [None] * len(ws)
        stacked = stack_rows(ws) if all(isinstance(w, NBitsWeight) for w in ws) else None
        if stacked is None or len(ws) == 1:
            return [self.linear(x, w, name, b) for w, name, b in zip(ws, names, biases)]
        bias = None
        if any(b is not None for b in biases):
            bias = np.concatenate([b if b is not None else np.zeros(w.n, np.float32) for w, b in zip(ws, biases)])
        y = self.linear(x, stacked, "+".join(names), bias)
        return self.op("Split", [y, self.ints([w.n for w in ws])], "part", outputs=[self.fresh("part") for _ in ws], axis=-1)

    def block_sums(self, x: str, k: int) -> str:
        """(1, T, k) → (1, T, k/32): the sums the K-quant correction multiplies (once per input)."""
        if x not in self._block_sums:
            grouped = self.op("Reshape", [x, self.ints([1, -1, k // CORRECTION_GROUP, CORRECTION_GROUP])], "groups")
            self._block_sums[x] = self.op("ReduceSum", [grouped, self.ints([-1])], "bsum", keepdims=0)
        return self._block_sums[x]


def _io(name: str, dtype, shape) -> "onnx.ValueInfoProto":  # noqa: F821
    return helper.make_tensor_value_info(name, dtype, shape)


def body_graph(g: GraphBuilder, args: ModelArgs, weights: WeightSource, on_layer: Callable[[int], None] = lambda i: None):
    """The decoder body's graph (see the module docstring); initializers go through g."""
    C, hd, nkv = args.dim, args.head_dim, args.n_kv_heads
    inputs = [
        _io("embeds", TensorProto.FLOAT, [1, "T", C]),
        _io("cos", TensorProto.FLOAT, ["T", hd // 2]),
        _io("sin", TensorProto.FLOAT, ["T", hd // 2]),
        _io("rope_ids", TensorProto.INT64, [1, "T"]),
        _io("seqlens_k", TensorProto.INT32, [1]),
        _io("total_len", TensorProto.INT32, []),
        _io("attention_bias", TensorProto.FLOAT, [1, 1, "T", "S"]),
    ]
    outputs = [_io("hidden", TensorProto.FLOAT, [1, "T", C])]
    x = "embeds"
    for i in range(args.n_layers):
        for kind in ("key", "value"):
            inputs.append(_io(f"past_{kind}_{i}", TensorProto.FLOAT, [1, nkv, "slots", hd]))
            outputs.append(_io(f"present_{kind}_{i}", TensorProto.FLOAT, [1, nkv, "slots", hd]))
        x = decoder_layer(g, args, weights, x, i)
        on_layer(i)
    g.rms_norm(x, weights.vector("norm.weight"), args.norm_eps, "norm.weight")
    g.nodes[-1].output[0] = "hidden"
    return helper.make_graph(g.nodes, "body", inputs, outputs, g.initializers)


def decoder_layer(g: GraphBuilder, args: ModelArgs, weights: WeightSource, x: str, i: int) -> str:
    """Layer i on x (1, T, C): attention over its cache (past/present_*_i), then the SwiGLU MLP."""
    hd, nh, nkv, eps, p = args.head_dim, args.n_heads, args.n_kv_heads, args.norm_eps, f"layers.{i}."
    interleaved = int(args.gguf_qk_pairs_adjacent)
    h = g.rms_norm(x, weights.vector(p + "attention_norm.weight"), eps, p + "attention_norm.weight")
    projections = ("wq", "wk", "wv")
    biases = [weights.vector(p + f"attention.{w}.bias") for w in projections] if args.qkv_bias else None
    q, k, v = g.linears(h, [weights.matrix(p + f"attention.{w}.weight") for w in projections], [p + f"attention.{w}" for w in projections], biases)
    if args.qk_norm:  # Qwen3: RMSNorm of every head's q and k
        q = _per_head_norm(g, q, weights.vector(p + "attention.q_norm.weight"), nh, hd, eps, p + "attention.q_norm")
        k = _per_head_norm(g, k, weights.vector(p + "attention.k_norm.weight"), nkv, hd, eps, p + "attention.k_norm")
    q = g.op("RotaryEmbedding", [q, "rope_ids", "cos", "sin"], "rope_q", domain=MS, interleaved=interleaved, num_heads=nh)
    k = g.op("RotaryEmbedding", [k, "rope_ids", "cos", "sin"], "rope_k", domain=MS, interleaved=interleaved, num_heads=nkv)
    attn = g.op(
        "GroupQueryAttention",
        [q, k, v, f"past_key_{i}", f"past_value_{i}", "seqlens_k", "total_len", "", "", "", "attention_bias"],
        "attn", outputs=[g.fresh("attn"), f"present_key_{i}", f"present_value_{i}"], domain=MS, num_heads=nh, kv_num_heads=nkv,
    )[0]  # fmt: skip
    x = g.op("Add", [x, g.linear(attn, weights.matrix(p + "attention.wo.weight"), p + "attention.wo")], "resid")
    h = g.rms_norm(x, weights.vector(p + "ffn_norm.weight"), eps, p + "ffn_norm.weight")
    mlp = [p + f"feed_forward.{w}" for w in ("w_gate", "w_up")]
    gate, up = g.linears(h, [weights.matrix(name + ".weight") for name in mlp], mlp)
    act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate], "sig")], "silu"), up], "glu")  # SiLU(gate)·up
    return g.op("Add", [x, g.linear(act, weights.matrix(p + "feed_forward.w_down.weight"), p + "feed_forward.w_down")], "resid")


def _per_head_norm(g: GraphBuilder, x: str, weight: np.ndarray, heads: int, hd: int, eps: float, name: str) -> str:
    per_head = g.op("Reshape", [x, g.ints([1, -1, heads, hd])], "heads")
    normed = g.rms_norm(per_head, weight, eps, name + ".weight")
    return g.op("Reshape", [normed, g.ints([1, -1, heads * hd])], "flat")


def head_graph(g: GraphBuilder, args: ModelArgs, head: NBitsWeight | np.ndarray, name: str = "output"):
    """hidden (1, T, C) → logits (1, T, rows of the head)."""
    n_rows = head.n if isinstance(head, NBitsWeight) else head.shape[0]
    g.linear("hidden", head, name)
    g.nodes[-1].output[0] = "logits"
    return helper.make_graph(
        g.nodes, "head", [_io("hidden", TensorProto.FLOAT, [1, "T", args.dim])], [_io("logits", TensorProto.FLOAT, [1, "T", n_rows])],
        g.initializers,
    )


def model(graph) -> "onnx.ModelProto":  # noqa: F821
    return helper.make_model(graph, opset_imports=OPSETS, producer_name="ondevice")
