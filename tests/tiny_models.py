"""Write tiny random Qwen2 / Llama models for tests, as a GGUF file and as a Hugging Face folder.

The same (arch, vocab, seed) gives the same model in both formats, so tests can compare our loaders,
llama.cpp and transformers on one set of weights:

    write_tiny_gguf(tmp / "tiny.gguf", arch="qwen2")      # llama.cpp can load it (f32 or f16 weights)
    write_tiny_hf(tmp / "tiny-hf", arch="qwen2")          # config.json + model.safetensors

The GGUF carries a minimal byte-level BPE tokenizer that llama.cpp accepts: the 256 byte tokens in
GPT-2's byte-to-unicode spelling, merges of lowercase letter pairs, and one control token
`<|endoftext|>` (the last id) used as BOS and EOS. Tiny Llama uses Llama 3 RoPE scaling (written
as `rope_freqs.weight`, as llama.cpp's converter does) and has a separate LM head; tiny Qwen2 has
q/k/v biases and a tied LM head; tiny Qwen3 has per-head q/k norms, no biases, a head dim (32) that
is not hidden / heads (16), and a separate LM head.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ondevice.synthetic.vocab import LETTER_PAIRS, synthetic_vocab

DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
LLAMA3_ROPE = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}  # fmt: skip


# --- tokenizer -------------------------------------------------------------------------------------


def tiny_vocab(vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a byte-level BPE vocab; the last id is <|endoftext|>.
    The synthetic models' vocabulary (256 byte tokens, letter-pair merges), kept to one merge per id."""
    if not 258 <= vocab_size <= 257 + len(LETTER_PAIRS):
        raise ValueError(f"vocab_size must be in 258..{257 + len(LETTER_PAIRS)}")
    return synthetic_vocab(vocab_size)


# --- weights ---------------------------------------------------------------------------------------


def tiny_config(arch: str = "qwen2", vocab: int = 320) -> dict:
    """A Hugging Face config.json for the tiny model."""
    common = dict(
        vocab_size=vocab, max_position_embeddings=512, rms_norm_eps=1e-6, hidden_act="silu",
        bos_token_id=vocab - 1, eos_token_id=vocab - 1, torch_dtype="float32", **DIMS,
    )  # fmt: skip
    if arch == "qwen2":
        return dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=1e6,
                    tie_word_embeddings=True, use_sliding_window=False, **common)  # fmt: skip
    if arch == "qwen3":
        return dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", rope_theta=1e6, head_dim=32,
                    tie_word_embeddings=False, attention_bias=False, use_sliding_window=False, **common)  # fmt: skip
    if arch == "llama":
        return dict(architectures=["LlamaForCausalLM"], model_type="llama", rope_theta=10000.0,
                    rope_scaling=dict(LLAMA3_ROPE), tie_word_embeddings=False, attention_bias=False,
                    mlp_bias=False, **common)  # fmt: skip
    raise ValueError(f"unknown tiny arch {arch!r}")


def tiny_hf_tensors(config: dict, seed: int = 0, head_scale: float = 1.0, noise: float = 0.0) -> dict[str, np.ndarray]:
    """Random fp32 weights under Hugging Face names, scaled so activations and logits are O(1..10).

    head_scale multiplies a separate LM head (Llama): sharper next-token distributions. noise adds
    Gaussian noise of noise·std(w) to every matrix: another model that mostly agrees with this one.
    """
    rng = np.random.default_rng(seed)
    C, F, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = config.get("head_dim") or C // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd

    def linear(out_f, in_f):
        return (rng.standard_normal((out_f, in_f)) / math.sqrt(in_f)).astype(np.float32)

    def norm():
        return (1.0 + 0.2 * rng.standard_normal(C)).astype(np.float32)

    t = {"model.embed_tokens.weight": rng.standard_normal((V, C)).astype(np.float32)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        for name, out_f in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            t[p + f"self_attn.{name}.weight"] = linear(out_f, C)
            if config["model_type"] == "qwen2":
                t[p + f"self_attn.{name}.bias"] = (0.5 * rng.standard_normal(out_f)).astype(np.float32)
        if config["model_type"] == "qwen3":
            t[p + "self_attn.q_norm.weight"] = (1.0 + 0.2 * rng.standard_normal(hd)).astype(np.float32)
            t[p + "self_attn.k_norm.weight"] = (1.0 + 0.2 * rng.standard_normal(hd)).astype(np.float32)
        t[p + "self_attn.o_proj.weight"] = linear(C, q)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = linear(F, C)
        t[p + "mlp.up_proj.weight"] = linear(F, C)
        t[p + "mlp.down_proj.weight"] = linear(C, F)
    t["model.norm.weight"] = norm()
    if not config["tie_word_embeddings"]:
        t["lm_head.weight"] = linear(V, C) * np.float32(head_scale)
    if noise:
        jitter = np.random.default_rng([seed, 1])
        for name, w in t.items():
            if w.ndim == 2:
                t[name] = (w + noise * w.std() * jitter.standard_normal(w.shape)).astype(np.float32)
    return t


def write_tiny_hf(folder: str | Path, arch: str = "qwen2", vocab: int = 320, seed: int = 0) -> Path:
    """Write config.json + model.safetensors; returns the folder."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(arch, vocab)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tiny_hf_tensors(config, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


# --- GGUF ------------------------------------------------------------------------------------------


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Llama Q/K rows (rotate-half -> adjacent pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_factors(config: dict) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter computes it from Llama 3's rope_scaling."""
    rope, theta = config["rope_scaling"], config["rope_theta"]
    hd = config["hidden_size"] // config["num_attention_heads"]
    old, factor = rope["original_max_position_embeddings"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    out = []
    for freq in 1.0 / theta ** (np.arange(0, hd, 2) / hd):
        wavelen = 2 * math.pi / freq
        smooth = (old / wavelen - low) / (high - low)
        out.append(1.0 if wavelen < old / high else factor if wavelen > old / low else 1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}  # fmt: skip
_GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}  # fmt: skip


def gguf_tensors(config: dict, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF-named tensors -> GGUF-named ones, Llama Q/K permuted the way llama.cpp's converter does."""
    out = {}
    for name, w in hf.items():
        if name in _GGUF_TOP:
            out[_GGUF_TOP[name]] = w
            continue
        _, _, i, rest = name.split(".", 3)
        if config["model_type"] == "llama" and rest.startswith("self_attn.q_proj"):
            w = llama_cpp_permute(w, config["num_attention_heads"])
        elif config["model_type"] == "llama" and rest.startswith("self_attn.k_proj"):
            w = llama_cpp_permute(w, config["num_key_value_heads"])
        out[f"blk.{i}.{_GGUF_LAYER[rest]}"] = w
    if config.get("rope_scaling"):
        out["rope_freqs.weight"] = llama3_factors(config)
    return out


def write_tiny_gguf(
    path: str | Path, arch: str = "qwen2", vocab: int = 320, seed: int = 0, dtype: str = "f32", head_scale: float = 1.0,
    noise: float = 0.0, pad_to: int | None = None, split_max_tensors: int = 0, chat_template: str | None = None,
    specials: tuple[str, ...] = (), quantize=None, endless: bool = False, alignment: int | None = None,
    vocab_edit=None,
) -> Path:
    """Write a tiny GGUF (2-D weights in `dtype`, "f32" or "f16"; norms and biases f32); returns path.
    head_scale, noise: see `tiny_hf_tensors`. pad_to: the model has this many token ids, the ones past
    `vocab` being padding (`[PAD<i>]`, type UNUSED, as llama.cpp's converter writes Qwen2.5 7B+).
    split_max_tensors: write a split set of parts with at most this many tensors each (gguf-py's
    writer, llama.cpp's naming: path's stem + -00001-of-0000N.gguf); returns the first part.
    chat_template: stored as tokenizer.chat_template. specials: control tokens appended after
    <|endoftext|> (ids vocab, vocab+1, …); the first is then BOS and the last EOS.
    quantize(gguf name, w) -> (blocks uint8, GGML type)
    or None: a 2-D weight stored quantized instead (see tests/tiny_quant.py). endless (Llama): the
    LM head rows of <|endoftext|> and the specials are zero, so their logits are 0, below the top logit:
    greedy answers never end before max_tokens. alignment: written as general.alignment (else implicit, 32).
    vocab_edit(tokens, types, merges) -> dict or None: another tokenizer for the same weights
    (tests/tiny_foreign.py): keys tokens, types, model (tokenizer.ggml.model: "gpt2" with merges, "llama"
    with scores), rows (new id i takes the embedding row of old id rows[i]; -1: a random row). BOS and
    EOS are then <|endoftext|> if kept, else "<s>" and "</s>" (no specials, no padding, Qwen2 only)."""
    import gguf

    config = tiny_config(arch, pad_to or vocab + len(specials))
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    writer.add_name(f"tiny-{arch}")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    if config.get("head_dim"):
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    tokens, types, merges = tiny_vocab(vocab)
    tokens, types = tokens + list(specials), types + [int(gguf.TokenType.CONTROL)] * len(specials)
    if pad_to:
        tokens += [f"[PAD{i}]" for i in range(len(tokens), pad_to)]
        types += [int(gguf.TokenType.UNUSED)] * (pad_to - len(types))
    tensors = gguf_tensors(config, tiny_hf_tensors(config, seed, head_scale, noise))
    model, scores, bos, eos = "gpt2", None, (vocab if specials else vocab - 1), vocab + len(specials) - 1
    if vocab_edit is not None:
        edit = vocab_edit(tokens, types, merges)
        tokens, types, merges, model, scores = edit["tokens"], edit["types"], edit.get("merges"), edit["model"], edit.get("scores")
        _take_rows(tensors, edit["rows"], seed)
        bos, eos = (tokens.index("<|endoftext|>"),) * 2 if "<|endoftext|>" in tokens else (tokens.index("<s>"), tokens.index("</s>"))
    writer.add_tokenizer_model(model)
    if model == "gpt2":
        writer.add_tokenizer_pre("llama-bpe" if arch == "llama" else "qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if model == "gpt2":
        writer.add_token_merges(merges)
    else:  # SentencePiece: merges by score, no space added before the text (Gemma 3's setting)
        writer.add_token_scores(scores)
        writer.add_add_space_prefix(False)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    if endless:
        tensors["output.weight"][vocab - 1 : vocab + len(specials)] = 0  # KeyError for qwen2: its head is tied to the embeddings
    for name, w in tensors.items():
        quantized = quantize(name, w) if quantize is not None and w.ndim == 2 else None
        if quantized is not None:
            writer.add_tensor(name, quantized[0], raw_dtype=quantized[1])
            continue
        writer.add_tensor(name, w.astype(np.float16) if dtype == "f16" and w.ndim == 2 else w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(Path(path))[0]


def _take_rows(tensors: dict[str, np.ndarray], rows, seed: int) -> None:
    """The token rows of the embeddings (and of a separate LM head) in a new vocabulary's order."""
    rows = np.asarray(rows)
    fresh = np.random.default_rng([seed, 2])
    for name in ("token_embd.weight", "output.weight"):
        if name in tensors:
            w = tensors[name]
            out = w[np.maximum(rows, 0)].copy()
            out[rows < 0] = fresh.standard_normal((int((rows < 0).sum()), w.shape[1])).astype(w.dtype) * w.std()
            tensors[name] = out


# --- a tiny pair in the catalog ---------------------------------------------------------------------

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)  # the tiny vocab has no such special tokens: the markers are plain bytes


def write_tiny_pair(home: str | Path, name: str = "tiny", **model) -> str:
    """A catalog pair `name` under ONDEVICE_HOME=home: a tiny target and its f16 twin as the drafter
    (accepts most drafts; ChatML template) in home/models, and an entry in home/catalog with their
    sizes and sha256. `model`: write_tiny_gguf's arch, head_scale, …"""
    import hashlib

    home = Path(home)
    (home / "models").mkdir(parents=True, exist_ok=True)
    (home / "catalog").mkdir(parents=True, exist_ok=True)
    entry = [f'name = "{name}"\ndescription = "tiny test pair"\n']
    for role, dtype in (("target", "f32"), ("drafter", "f16")):
        path = write_tiny_gguf(home / "models" / f"{name}-{role}.gguf", dtype=dtype, chat_template=CHATML, **model)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        entry.append(f'[{role}]\nlabel = "tiny {role}"\nfile = "{path.name}"\nsize = {path.stat().st_size}\nsha256 = "{digest}"\n')
    (home / "catalog" / f"{name}.toml").write_text("\n".join(entry))
    return name


def write_layered_gguf(path: str | Path, n_layers: int = 6) -> Path:
    """A tiny Llama GGUF with big layers (6 MB each, intermediate size 8192) for the streaming
    windows: the kernel caches file pages in folios of up to 2 MB, and one that straddles two layers
    goes out (or stays) with both, which must stay small against a layer; each layer is also more
    than one 4 MB read. Flushed to disk (dirty pages are not paged out)."""
    import os

    dims = dict(DIMS)
    DIMS.update(num_hidden_layers=n_layers, intermediate_size=8192)
    try:
        path = write_tiny_gguf(path, "llama")
    finally:
        DIMS.clear()
        DIMS.update(dims)
    with path.open("rb+") as f:
        os.fsync(f.fileno())
    return path
