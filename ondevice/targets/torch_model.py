"""A compact PyTorch decoder for the Qwen2, Qwen3 and Llama architectures, built to verify draft trees.

The architectures and their differences are described once, by `files/architecture.ModelArgs`; the
modules here are built from it, and their parameters are named as `architecture.GGUF_NAMES` names them.

One forward takes a batch of new tokens with *explicit* positions and an *arbitrary* boolean
attention mask over (cache slots + new tokens), so a whole draft tree is one pass. New tokens are
written to the KV cache at consecutive slots `start, start+1, ...`; the slot of a token is where it
sits in the cache, its position is what RoPE sees (for a tree: n_cached + depth). `move_kv` then
compacts the accepted slots into place.

Each decoder block owns its own KV cache, and its forward is a pure function of
(x, rope angles, mask, start) plus that cache: a layer streamer can move one block's weights to a
GPU with a forward pre-hook without touching any other layer.

Shapes: B batch, T new tokens, S = start + T attended slots, C model width, nh / nkv query / key-value
heads, hd head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ondevice.errors import OndeviceError
from ondevice.files.architecture import ModelArgs
from ondevice.decode.kvcache import move_entries


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32 whatever the weight dtype, like llama.cpp and transformers
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """(hd/2,) fp32 inverse frequencies theta^(-2i/hd), divided by the llama3 factors if any."""
    hd = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if args.rope_freq_factors is not None:
        inv_freq = inv_freq / torch.tensor(args.rope_freq_factors, dtype=torch.float64)
    return inv_freq.float()


def rope_angles(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (B, 1, T, hd) for integer positions (B, T), "rotate-half" layout."""
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (B, T, hd/2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, hd)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, h, T, hd) rotated by the angles, computed in fp32 (HF / NeoX "rotate-half" pairing)."""
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class KVCache(nn.Module):
    """One layer's keys and values, (B, nkv, n_ctx, hd), indexed by cache slot."""

    def __init__(self, batch: int, n_kv_heads: int, n_ctx: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, n_kv_heads, n_ctx, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, nkv, T, hd) at slots start..start+T; return slots 0..start+T."""
        end = start + k.shape[2]
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]

    def move(self, src_slots: torch.Tensor, dst_start: int) -> None:
        """Copy the entries at src_slots to dst_start, dst_start+1, ... (the gather copies first)."""
        move_entries((self.k, self.v), src_slots, dst_start)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=args.qkv_bias)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        if args.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.norm_eps)
            self.k_norm = RMSNorm(args.head_dim, args.norm_eps)
        self.qk_norm = args.qk_norm
        self.kv_cache: KVCache | None = None

    def forward(self, x, rope, mask, start):
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)  # (B, T, nh, hd)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, nkv, hd)
        if self.qk_norm:  # Qwen3: normalise each head's q and k
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, nh, T, hd), (B, nkv, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        k, v = self.kv_cache.write(start, k, v)  # (B, nkv, S, hd)
        # grouped-query attention: each key/value head serves nh / nkv query heads
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (B, nh, T, hd)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, nh*hd) -> (B, T, C)


class FeedForward(nn.Module):
    """SwiGLU: w_down(silu(w_gate x) * w_up x)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w_gate = nn.Linear(args.dim, args.intermediate_size, bias=False)
        self.w_up = nn.Linear(args.dim, args.intermediate_size, bias=False)
        self.w_down = nn.Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x, rope, mask, start):
        """x (B, T, C); rope = (cos, sin) (B, 1, T, hd); mask (B or 1, 1, T, S) bool; start: first slot."""
        h = x + self.attention(self.attention_norm(x), rope, mask, start)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)

    @classmethod
    def from_state_dict(cls, args: ModelArgs, state_dict: dict, device="cpu") -> "Transformer":
        """Build the model around the given tensors (no copy on CPU), then move it to device."""
        with torch.device("meta"):
            model = cls(args)
        expected = set(model.state_dict())
        missing, unexpected = expected - set(state_dict), set(state_dict) - expected
        if missing or unexpected:
            raise OndeviceError(
                f"The checkpoint does not match a {args.arch} model "
                f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}): the file may be damaged."
            )
        model.load_state_dict(state_dict, assign=True)
        model.inv_freq = rope_inv_freq(args)
        return model.to(device)

    def setup_kv_cache(self, n_ctx: int, batch: int = 1) -> None:
        """Allocate every layer's cache of n_ctx slots on the device and dtype of the embeddings."""
        w = self.tok_embeddings.weight
        for block in self.layers:
            a = self.args
            block.attention.kv_cache = KVCache(batch, a.n_kv_heads, n_ctx, a.head_dim, w.dtype, w.device)

    def hidden_states(self, tokens, positions, mask, start):
        """tokens, positions (B, T) int64; mask (T, S) or (B, T, S) bool -> final-normed (B, T, C)."""
        x = self.tok_embeddings(tokens)  # (B, T, C)
        rope = rope_angles(self.inv_freq.to(x.device), positions.to(x.device))
        mask = mask.to(x.device)
        mask = mask[None, None] if mask.dim() == 2 else mask[:, None]  # (B or 1, 1, T, S)
        for block in self.layers:
            x = block(x, rope, mask, start)
        return self.norm(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, T, vocab) fp32 logits."""
        head = self.tok_embeddings.weight if self.output is None else self.output.weight
        return F.linear(h.to(head.dtype), head).float()

    def forward(self, tokens, positions, mask, start):
        return self.logits(self.hidden_states(tokens, positions, mask, start))

    def move_kv(self, src_slots: torch.Tensor, dst_start: int) -> None:
        """In every layer, copy the cache entries at src_slots to consecutive slots from dst_start."""
        for block in self.layers:
            block.attention.kv_cache.move(src_slots, dst_start)
