"""Checkpoint files -> (ModelArgs, state_dict) for `torch_model.Transformer`.

Two sources, same result:
- a GGUF file (llama.cpp's format), every tensor dequantized with the `gguf` package. llama.cpp's
  converter permutes the rows of Llama's Q and K weights (to pair RoPE dimensions as (0,1),(2,3),…);
  we undo that to get back the Hugging Face "rotate-half" layout. Qwen2 is stored unpermuted.
- a Hugging Face checkpoint folder: config.json + *.safetensors.

Tensors are converted to the requested dtype one at a time, so the peak memory is the model in that
dtype plus one fp32 tensor. `iter_gguf_weights` yields them one by one for callers that place them
elsewhere (pinned memory, disk). The LM head may get its own dtype (`head_dtype`): a bf16 body with
an fp32 head keeps logits free of bf16 rounding, which otherwise creates exact ties and doubles
the batch noise (see torch_target.default_dtype). A tied head then gets its own copy.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from gguf.quants import dequantize
from safetensors import safe_open

from ondevice.errors import OndeviceError
from ondevice.files.gguf_reader import SplitReader
from ondevice.targets.torch_model import ModelArgs

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")

# GGUF tensor name -> ours; "{i}" is the layer index
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
_HF_NAMES = {
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


def _rename(name: str, table: dict[str, str]) -> str | None:
    """Map a checkpoint tensor name to ours (None: not a tensor we use)."""
    parts = name.split(".")
    for prefix_len in (2, 3):  # "blk.7." / "model.layers.7."
        if len(parts) > prefix_len and parts[prefix_len - 1].isdigit():
            i = parts[prefix_len - 1]
            pattern = ".".join(parts[: prefix_len - 1] + ["{i}"] + parts[prefix_len:])
            return table[pattern].format(i=i) if pattern in table else None
    return table.get(name)


# --- GGUF ------------------------------------------------------------------------------------------


def open_gguf(path: str | Path) -> SplitReader:
    """A reader of the model (every part of a split one), or a one-line OndeviceError (missing, not a GGUF)."""
    return SplitReader(path)


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_model_args(reader) -> ModelArgs:
    """Read the architecture hyper-parameters from a GGUF's metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise OndeviceError(
            f"GGUF architecture {arch!r} is not supported by the PyTorch target (supported: {', '.join(SUPPORTED_ARCHS)}); "
            "run it with --target-backend llama, which runs whatever llama.cpp supports."
        )
    tensors = {t.name: t for t in reader.tensors}
    dim, n_heads = int(_field(reader, f"{arch}.embedding_length")), int(_field(reader, f"{arch}.attention.head_count"))
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
        n_layers=int(_field(reader, f"{arch}.block_count")),
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_freq_factors=None if factors is None else tuple(np.asarray(factors.data, dtype=np.float64)),
        qkv_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        tie_embeddings="output.weight" not in tensors,
    )


def _unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's convert permutation (rows of each head interleaved as pairs) for Llama Q/K."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize(tensor) -> np.ndarray:
    try:
        w = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as err:
        raise OndeviceError(
            f"Tensor {tensor.name} is stored as {tensor.tensor_type.name}, which the gguf package cannot dequantize: use a K-quant or Q8_0 file."
        ) from err
    return w.reshape(tuple(int(d) for d in reversed(tensor.shape)))  # GGUF lists dims innermost first


def untie_for_head_dtype(args: ModelArgs, dtype, head_dtype) -> tuple[ModelArgs, bool]:
    """(args, copy_head): a head in another dtype than the embeddings cannot share their matrix."""
    if args.tie_embeddings and head_dtype not in (None, dtype):
        return dataclasses.replace(args, tie_embeddings=False), True
    return args, False


def _converted(name: str, w: torch.Tensor, dtype, head_dtype, copy_head: bool):
    """Yield (name, w in its dtype), plus the head's own copy of a tied embedding matrix."""
    yield name, w.to((head_dtype or dtype) if name == "output.weight" else dtype)
    if copy_head and name == "tok_embeddings.weight":
        yield "output.weight", w.to(head_dtype or dtype)


def iter_gguf_weights(
    reader, args: ModelArgs, dtype=torch.float32, head_dtype=torch.float32, keep: Callable[[str], bool] | None = None
):
    """Yield (our name, tensor) for every tensor of the model, dequantized one at a time.

    `args` as returned by `load_gguf` (after `untie_for_head_dtype`): if it says untied while the
    file has no output.weight, the embedding matrix is yielded a second time as the head.
    keep(our name) False: the tensor is skipped, never dequantized (e.g. layers that will stream).
    """
    copy_head = not args.tie_embeddings and not any(t.name == "output.weight" for t in reader.tensors)
    for tensor in reader.tensors:
        name = _rename(tensor.name, GGUF_NAMES)
        if name is None or (keep is not None and not keep(name)):
            continue  # e.g. rope_freqs.weight, already read into args
        w = _dequantize(tensor)
        if args.arch == "llama" and name.endswith(("wq.weight", "wq.bias")):
            w = _unpermute_qk(w, args.n_heads)
        elif args.arch == "llama" and name.endswith(("wk.weight", "wk.bias")):
            w = _unpermute_qk(w, args.n_kv_heads)
        yield from _converted(name, torch.from_numpy(np.require(w, np.float32, ["C", "W"])), dtype, head_dtype, copy_head)


def load_gguf(path: str | Path, dtype=torch.float32, head_dtype=torch.float32) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """A GGUF file -> (ModelArgs, state_dict); head_dtype None: the LM head in dtype like the rest."""
    reader = open_gguf(path)
    args, _ = untie_for_head_dtype(gguf_model_args(reader), dtype, head_dtype)
    return args, dict(iter_gguf_weights(reader, args, dtype, head_dtype))


# --- Hugging Face safetensors ------------------------------------------------------------------------


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


def load_hf(folder: str | Path, dtype=torch.float32, head_dtype=torch.float32) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """A Hugging Face checkpoint folder (config.json + *.safetensors) -> (ModelArgs, state_dict)."""
    folder = Path(folder).expanduser()
    files = sorted(folder.glob("*.safetensors"))
    if not (folder / "config.json").is_file() or not files:
        raise OndeviceError(f"{folder} is not a Hugging Face checkpoint (needs config.json and *.safetensors).")
    args, copy_head = untie_for_head_dtype(hf_model_args(json.loads((folder / "config.json").read_text())), dtype, head_dtype)
    state_dict = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                name = _rename(key, _HF_NAMES)
                if name is None or (name == "output.weight" and (args.tie_embeddings or copy_head)):
                    continue  # a checkpoint may store a tied head too
                state_dict.update(_converted(name, f.get_tensor(key), dtype, head_dtype, copy_head))
    return args, state_dict
