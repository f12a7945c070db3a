"""The decoder architectures ondevice runs itself (Qwen2, Qwen3, Llama), described once.

`ModelArgs` holds what differs between them and between sizes: dims, heads (grouped-query: fewer
key/value heads than query heads), which optional tensors exist (q/k/v biases, per-head q/k norms,
an LM head of its own or the embedding matrix), RoPE's base and per-frequency factors, and whether
the GGUF keeps q/k rows in RoPE-pair order. It is read from a GGUF's metadata (`gguf_model_args`)
or a Hugging Face config.json (`hf_model_args`). The torch model (`targets/torch_model.py`), its
weights (`targets/weights.py`, `targets/offloaded.py`) and the ONNX export (`onnx/graph.py`,
`onnx/export.py`) read this description and name tensors as `GGUF_NAMES` does.

Qwen3 differs from Qwen2 by a per-head RMSNorm of q and k before RoPE and no q/k/v biases; Llama 3
by RoPE frequencies divided by per-frequency factors. llama.cpp's converter permutes the rows of
Llama's Q and K (so that RoPE pairs are adjacent); Qwen is stored unpermuted.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
import numpy as np

from ondevice.errors import OndeviceError

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")


@dataclass
class ModelArgs:
    """One model's architecture: what the torch model is built from and the ONNX graph is drawn from."""

    arch: str = "qwen2"  # "qwen2", "qwen3" or "llama"
    vocab_size: int = 151936
    dim: int = 1536
    n_layers: int = 28
    n_heads: int = 12
    n_kv_heads: int = 2
    head_dim: int = 0  # 0: dim // n_heads
    intermediate_size: int = 8960
    norm_eps: float = 1e-6
    rope_theta: float = 1e6
    # Per-frequency divisors of RoPE's inverse frequencies (Llama 3 "llama3" scaling), hd // 2 values.
    rope_freq_factors: tuple[float, ...] | None = None
    qkv_bias: bool = True  # Qwen2 has q/k/v biases, Llama and Qwen3 do not
    qk_norm: bool = False  # Qwen3: RMSNorm of each head's q and k (weights of size hd) before RoPE
    tie_embeddings: bool = False  # LM head shares the token embedding matrix

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.dim // self.n_heads
        if self.rope_freq_factors is not None:
            self.rope_freq_factors = tuple(float(f) for f in self.rope_freq_factors)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def gguf_qk_pairs_adjacent(self) -> bool:
        """The GGUF's q/k rows are in RoPE-pair order (Llama, permuted by llama.cpp's converter)."""
        return self.arch == "llama"

    def gguf_permuted_rows(self) -> dict[str, int]:
        """Layer parameter → its heads, for the q/k tensors a GGUF stores permuted (none: {})."""
        if not self.gguf_qk_pairs_adjacent:
            return {}
        heads = {"attention.wq": self.n_heads, "attention.wk": self.n_kv_heads}
        return {f"{proj}.{kind}": n for proj, n in heads.items() for kind in ("weight", "bias")}


# GGUF tensor name -> ours (the torch model's parameter names); "{i}" is the layer index
GGUF_NAMES = {
    "token_embd.weight": "tok_embeddings.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "output.weight",
    "blk.{i}.attn_norm.weight": "layers.{i}.attention_norm.weight",
    "blk.{i}.attn_q.weight": "layers.{i}.attention.wq.weight",
    "blk.{i}.attn_q.bias": "layers.{i}.attention.wq.bias",
    "blk.{i}.attn_k.weight": "layers.{i}.attention.wk.weight",
    "blk.{i}.attn_k.bias": "layers.{i}.attention.wk.bias",
    "blk.{i}.attn_v.weight": "layers.{i}.attention.wv.weight",
    "blk.{i}.attn_v.bias": "layers.{i}.attention.wv.bias",
    "blk.{i}.attn_q_norm.weight": "layers.{i}.attention.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "layers.{i}.attention.k_norm.weight",
    "blk.{i}.attn_output.weight": "layers.{i}.attention.wo.weight",
    "blk.{i}.ffn_norm.weight": "layers.{i}.ffn_norm.weight",
    "blk.{i}.ffn_gate.weight": "layers.{i}.feed_forward.w_gate.weight",
    "blk.{i}.ffn_up.weight": "layers.{i}.feed_forward.w_up.weight",
    "blk.{i}.ffn_down.weight": "layers.{i}.feed_forward.w_down.weight",
}

# Hugging Face tensor name -> ours
HF_NAMES = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "layers.{i}.attention_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "layers.{i}.attention.wq.weight",
    "model.layers.{i}.self_attn.q_proj.bias": "layers.{i}.attention.wq.bias",
    "model.layers.{i}.self_attn.k_proj.weight": "layers.{i}.attention.wk.weight",
    "model.layers.{i}.self_attn.k_proj.bias": "layers.{i}.attention.wk.bias",
    "model.layers.{i}.self_attn.v_proj.weight": "layers.{i}.attention.wv.weight",
    "model.layers.{i}.self_attn.v_proj.bias": "layers.{i}.attention.wv.bias",
    "model.layers.{i}.self_attn.q_norm.weight": "layers.{i}.attention.q_norm.weight",
    "model.layers.{i}.self_attn.k_norm.weight": "layers.{i}.attention.k_norm.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "layers.{i}.attention.wo.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "layers.{i}.ffn_norm.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "layers.{i}.feed_forward.w_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "layers.{i}.feed_forward.w_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "layers.{i}.feed_forward.w_down.weight",
}


def rename(name: str, table: dict[str, str] = GGUF_NAMES) -> str | None:
    """Map a checkpoint tensor name to ours (None: not a tensor we use)."""
    parts = name.split(".")
    for prefix_len in (2, 3):  # "blk.7." / "model.layers.7."
        if len(parts) > prefix_len and parts[prefix_len - 1].isdigit():
            i = parts[prefix_len - 1]
            pattern = ".".join(parts[: prefix_len - 1] + ["{i}"] + parts[prefix_len:])
            return table[pattern].format(i=i) if pattern in table else None
    return table.get(name)


# --- from a GGUF's metadata ------------------------------------------------------------------------


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _required(reader, key: str):
    """A metadata field every model of this architecture must carry: its value, or a one-line error."""
    field = reader.fields.get(key)
    if field is None:
        raise OndeviceError(f"this GGUF lacks the metadata field {key!r}, which its architecture needs; it is incomplete or not a model file.")
    return field.contents()


def gguf_model_args(reader) -> ModelArgs:
    """Read the architecture hyper-parameters from a GGUF's metadata (a gguf_reader.SplitReader)."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise OndeviceError(
            f"GGUF architecture {arch!r} is not supported by the PyTorch target (supported: {', '.join(SUPPORTED_ARCHS)}); "
            "run it with --target-backend llama, which runs whatever llama.cpp supports."
        )
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise OndeviceError("this GGUF has no token embedding (token_embd.weight); it is incomplete or not a model file.")
    dim, n_heads = int(_required(reader, f"{arch}.embedding_length")), int(_required(reader, f"{arch}.attention.head_count"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", dim // n_heads))
    if int(_field(reader, f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise OndeviceError("This GGUF uses partial rotary embeddings, which the PyTorch target does not support.")
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise OndeviceError(f"This GGUF uses RoPE scaling {scaling!r}, which the PyTorch target does not support; run it with --target-backend llama.")
    factors = tensors.get("rope_freqs.weight")
    return ModelArgs(
        arch=arch,
        vocab_size=int(tensors["token_embd.weight"].shape[1]),
        dim=dim,
        n_layers=int(_required(reader, f"{arch}.block_count")),
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        intermediate_size=int(_required(reader, f"{arch}.feed_forward_length")),
        norm_eps=float(_required(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_freq_factors=None if factors is None else tuple(np.asarray(factors.data, dtype=np.float64)),
        qkv_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        tie_embeddings="output.weight" not in tensors,
    )


# --- from a Hugging Face config.json ---------------------------------------------------------------


def llama3_rope_factors(head_dim: int, theta: float, rope: dict) -> tuple[float, ...]:
    """Per-frequency divisors of Llama 3's RoPE scaling (long wavelengths slowed by `factor`)."""
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_ctx = rope.get("original_max_position_embeddings", 8192)
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old_ctx / high:
            factors.append(1.0)
        elif wavelen > old_ctx / low:
            factors.append(factor)
        else:  # interpolate between the two regimes
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(factors)


def hf_model_args(config: dict) -> ModelArgs:
    """Map a Hugging Face config.json (transformers 4.x or 5.x) to ModelArgs."""
    arch = config.get("model_type")
    if arch not in SUPPORTED_ARCHS:
        raise OndeviceError(
            f"Model type {arch!r} is not supported by the PyTorch target (supported: {', '.join(SUPPORTED_ARCHS)}); "
            "convert it to GGUF and run it with --target-backend llama."
        )
    if config.get("mlp_bias"):
        raise OndeviceError("This Llama checkpoint has MLP biases, which the PyTorch target does not support.")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = float(config.get("rope_theta", rope.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise OndeviceError(f"RoPE scaling {rope_type!r} is not supported by the PyTorch target.")
    dim, n_heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or dim // n_heads
    return ModelArgs(
        arch=arch,
        vocab_size=config["vocab_size"],
        dim=dim,
        n_layers=config["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads") or n_heads,
        head_dim=head_dim,
        intermediate_size=config["intermediate_size"],
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_freq_factors=llama3_rope_factors(head_dim, theta, rope) if rope_type == "llama3" else None,
        qkv_bias=True if arch == "qwen2" else bool(config.get("attention_bias", False)),
        qk_norm=arch == "qwen3",
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
    )
