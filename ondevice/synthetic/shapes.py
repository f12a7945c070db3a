"""Architecture shapes: the numbers that set a model's tensor shapes, as a table of known models.

    shape = find_shape("qwen2.5-7b")         # a preset
    shape = shape_of_gguf("model.gguf")      # read from a GGUF's header (no tensor data is read)

Presets are the published configs (Hugging Face config.json) of the models in the catalog and
their drafters. `tied`: the file has no output.weight and the LM head is the embedding matrix (as
Llama-3.2-1B and Qwen3-0.6B GGUFs are written); Qwen's own GGUFs of Qwen2.5 carry an output.weight
even for the small models, so those presets are untied. `quant`: the file type the catalog's file
has (Q4_K_M, or Q8_0 for Qwen3-0.6B, which Qwen publishes only in Q8_0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ondevice.errors import OndeviceError
from ondevice.files.architecture import gguf_model_args
from ondevice.files.gguf_reader import SplitReader

ARCHS = ("qwen2", "qwen3", "llama")
LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class ModelShape:
    name: str
    arch: str  # "qwen2" (q/k/v biases), "qwen3" (per-head q/k RMSNorm), "llama" (Llama 3 RoPE scaling)
    n_layers: int
    dim: int
    ffn: int  # intermediate size of the SwiGLU MLP
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False  # no output.weight: the LM head is token_embd
    rope_theta: float = 1e6
    norm_eps: float = 1e-6
    rope_factor: float | None = None  # Llama 3 RoPE scaling factor (writes rope_freqs.weight)
    role: str = "target"  # "drafter": small models measured as a drafter (draft call vs batch)
    quant: str = "Q4_K_M"  # the llama.cpp file type people run it in (quant_mix.QUANTS)

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown architecture {self.arch!r}")

    @property
    def family(self) -> str:
        """What shares a tokenizer and an acceptance prior: qwen2.5, qwen3, llama3."""
        return {"qwen2": "qwen2.5", "qwen3": "qwen3", "llama": "llama3"}[self.arch]

    def parameters(self) -> int:
        """Weights in the matrices (norms and biases left out: < 0.1%)."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        layer = self.dim * (q + 2 * kv) + q * self.dim + 3 * self.dim * self.ffn
        return self.n_layers * layer + self.vocab * self.dim * (1 if self.tied else 2)


def _qwen25(name, n_layers, dim, ffn, n_heads, n_kv, vocab=152064, eps=1e-5, **kw) -> ModelShape:
    return ModelShape(name, "qwen2", n_layers, dim, ffn, n_heads, n_kv, dim // n_heads, vocab, norm_eps=eps, **kw)


def _qwen3(name, n_layers, dim, ffn, n_heads, tied=False, **kw) -> ModelShape:
    return ModelShape(name, "qwen3", n_layers, dim, ffn, n_heads, 8, 128, 151936, tied=tied, **kw)


def _llama3(name, n_layers, dim, ffn, n_heads, head_dim=128, tied=False, factor=8.0, **kw) -> ModelShape:
    return ModelShape(name, "llama", n_layers, dim, ffn, n_heads, 8, head_dim, 128256, tied=tied, rope_theta=500000.0,
                      norm_eps=1e-5, rope_factor=factor, **kw)  # fmt: skip


PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        # the default pair (Qwen2.5-Coder; vocab 151,936 in both files)
        _qwen25("qwen2.5-coder-1.5b", 28, 1536, 8960, 12, 2, vocab=151936, eps=1e-6),
        _qwen25("qwen2.5-0.5b", 24, 896, 4864, 14, 2, vocab=151936, eps=1e-6, role="drafter"),
        # Qwen2.5 (and Qwen2.5-Coder of the same size: same shapes)
        _qwen25("qwen2.5-7b", 28, 3584, 18944, 28, 4, eps=1e-6),
        _qwen25("qwen2.5-14b", 48, 5120, 13824, 40, 8),
        _qwen25("qwen2.5-32b", 64, 5120, 27648, 40, 8),
        _qwen25("qwen2.5-72b", 80, 8192, 29568, 64, 8),
        # Qwen3
        _qwen3("qwen3-0.6b", 28, 1024, 3072, 16, tied=True, role="drafter", quant="Q8_0"),  # Qwen publishes Q8_0 only
        _qwen3("qwen3-8b", 36, 4096, 12288, 32),
        _qwen3("qwen3-14b", 40, 5120, 17408, 40),
        _qwen3("qwen3-32b", 64, 5120, 25600, 64),
        # Llama 3
        _llama3("llama-3.2-1b", 16, 2048, 8192, 32, head_dim=64, tied=True, factor=32.0, role="drafter"),
        _llama3("llama-3.1-8b", 32, 4096, 14336, 32),
        _llama3("llama-3.3-70b", 80, 8192, 28672, 64),
    )
}


def find_shape(name: str) -> ModelShape:
    """The preset called `name`, or a one-line OndeviceError listing them."""
    if name not in PRESETS:
        raise OndeviceError(f"unknown model shape {name!r}; presets: {', '.join(PRESETS)} (or a catalog pair, or a GGUF path).")
    return PRESETS[name]


def shape_of_gguf(path: str | Path, name: str | None = None) -> ModelShape:
    """A real GGUF's shape, from its header as the torch target reads it (files/architecture.py: no
    vocabulary parsed, no weights read but the few RoPE factors)."""
    reader = SplitReader(path)  # a missing or broken file: its own one-line error
    try:
        args = gguf_model_args(reader)
    except OndeviceError as err:
        raise OndeviceError(f"{path}: no synthetic twin: {err}") from None
    factors = args.rope_freq_factors
    return ModelShape(
        name=name or Path(path).stem, arch=args.arch, n_layers=args.n_layers, dim=args.dim, ffn=args.intermediate_size,
        n_heads=args.n_heads, n_kv_heads=args.n_kv_heads, head_dim=args.head_dim, vocab=args.vocab_size, tied=args.tie_embeddings,
        rope_theta=args.rope_theta, norm_eps=args.norm_eps, rope_factor=None if factors is None else max(factors),
    )
