"""TorchTarget: the `ondevice.protocols.Target` backed by our own PyTorch model (`torch_model.py`).

The KV cache is preallocated (n_ctx slots) on the model's device. Slots 0..n_cached hold committed
tokens; `forward_tree` writes the tree's nodes provisionally at slots n_cached + node index, at
RoPE positions n_cached + depth, each attending to the whole cache and to its own ancestors.
`commit(path)` copies the path's entries down to n_cached, n_cached+1, ... in every layer (no
recompute); whatever sits beyond the new n_cached is garbage and gets overwritten.

Default dtype: see `default_dtype` (fp32 on CPU, measured).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from ondevice.target import weights
from ondevice.target.torch_model import ModelArgs, Transformer
from ondevice.target.slots import check_room, is_root_path
from ondevice.tree import DraftTree

if TYPE_CHECKING:
    from ondevice.offload.placement import Placement
    from ondevice.offload.streamer import LayerStreamer

PREFILL_CHUNK = 256  # tokens per prefill pass: bounds the activations' memory, costs nothing in speed


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on CPU, bf16 (with the fp32 LM head `from_gguf` keeps by default) on a GPU.

    Measured on the real Qwen2.5-Coder-1.5B Q4_K_M target (dequantized), 64 greedy tokens fed one
    at a time vs as one 64-node chain (`numerics.measure_batch_noise`), 2 threads:
    - fp32: the top-2 gap moves by at most 2e-5 (p95 1e-5): practically batch-invariant, so tree
      verification reproduces the target alone except at exact ties.
    - bf16 everywhere: 0.19 (p95 0.125); bf16-rounded logits make exact ties, 2 argmax flips in 64,
      and greedy output leaves fp32's at the first token (a 0.0096 fp32 margin).
    - bf16 body + fp32 head: 0.12 (p95 0.08), no flips, the same 64 greedy tokens as fp32.
    (llama.cpp on the same GGUF: 0.32, p95 0.18.) bf16 halves the bytes read per pass, which is what
    an offloaded GPU target pays for; on a shared 2-core CPU it was only ~10-30% faster here
    (DESIGN.md measured bf16 flat to n=16 on this AMX CPU; CPUs without AMX / AVX512-BF16 are slow
    in bf16), so on CPU exactness wins. Pass dtype=torch.bfloat16 to trade it for speed.
    """
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


class TorchTarget:
    """Target protocol over `Transformer`: a preallocated KV cache, one pass per draft tree."""

    # Set by `ondevice.target.offloaded.load_offloaded_target`; None: every layer is resident.
    placement: Placement | None = None
    streamer: LayerStreamer | None = None

    def __init__(self, model: Transformer, n_ctx: int = 4096):
        self.model = model.eval()
        self.args: ModelArgs = model.args
        self.n_vocab = self.args.vocab_size
        self.n_ctx = n_ctx
        self.device = model.tok_embeddings.weight.device
        self._n_cached = 0
        self._tree_parents = np.zeros(0, dtype=np.int64)  # the last tree, whose nodes sit after n_cached
        model.setup_kv_cache(n_ctx)

    # --- loading ------------------------------------------------------------------------------
    @classmethod
    def from_gguf(
        cls, path, device="cpu", dtype=None, head_dtype=torch.float32, n_ctx: int = 4096, threads: int | None = None
    ) -> "TorchTarget":
        """Dequantize a GGUF (qwen2 or llama) into a PyTorch model on device.

        dtype: of the weights and activations (None: `default_dtype`); head_dtype: of the LM head
        (fp32 by default: fp32 logits, no bf16 ties); threads: torch.set_num_threads (process-wide).
        """
        dtype = dtype or default_dtype(device)
        set_threads(threads)
        args, state_dict = weights.load_gguf(path, dtype, head_dtype)
        return cls(Transformer.from_state_dict(args, state_dict, device), n_ctx)

    @classmethod
    def from_hf(
        cls, folder, device="cpu", dtype=None, head_dtype=torch.float32, n_ctx: int = 4096, threads: int | None = None
    ) -> "TorchTarget":
        """Load a Hugging Face checkpoint folder (config.json + *.safetensors); arguments as from_gguf."""
        dtype = dtype or default_dtype(device)
        set_threads(threads)
        args, state_dict = weights.load_hf(folder, dtype, head_dtype)
        return cls(Transformer.from_state_dict(args, state_dict, device), n_ctx)

    # --- the Target protocol ------------------------------------------------------------------
    @property
    def n_cached(self) -> int:
        return self._n_cached

    def truncate(self, n_tokens: int) -> None:
        if not 0 <= n_tokens <= self._n_cached:
            raise ValueError(f"cannot truncate a cache of {self._n_cached} tokens to {n_tokens}")
        self._n_cached, self._tree_parents = n_tokens, np.zeros(0, dtype=np.int64)

    @torch.inference_mode()
    def prefill(self, tokens: Sequence[int]) -> None:
        check_room(self._n_cached, len(tokens), self.n_ctx)
        for i in range(0, len(tokens), PREFILL_CHUNK):
            chunk = torch.as_tensor(tokens[i : i + PREFILL_CHUNK], dtype=torch.int64, device=self.device)
            start = self._n_cached
            T = len(chunk)
            causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
            mask = torch.cat([torch.ones(T, start, dtype=torch.bool, device=self.device), causal], dim=1)  # (T, S)
            positions = torch.arange(start, start + T, device=self.device)[None]  # (1, T)
            self.model.hidden_states(chunk[None], positions, mask, start)  # fills the KV cache; no LM head
            self._n_cached += T
        self._tree_parents = np.zeros(0, dtype=np.int64)

    @torch.inference_mode()
    def forward_tree(self, tree: DraftTree) -> np.ndarray:
        n, start = len(tree), self._n_cached
        check_room(self._n_cached, n, self.n_ctx)
        tokens = torch.as_tensor(tree.tokens, device=self.device)[None]  # (1, n)
        positions = torch.as_tensor(start + tree.depths, device=self.device)[None]  # (1, n)
        tree_mask = torch.as_tensor(tree.ancestor_mask(), device=self.device)  # (n, n)
        mask = torch.cat([torch.ones(n, start, dtype=torch.bool, device=self.device), tree_mask], dim=1)  # (n, S)
        logits = self.model(tokens, positions, mask, start)  # (1, n, vocab) fp32
        self._tree_parents = tree.parents
        return logits[0].cpu().numpy()

    @torch.inference_mode()
    def commit(self, path: Sequence[int]) -> None:
        path = np.asarray(path, dtype=np.int64)
        if not is_root_path(self._tree_parents, path):
            raise ValueError(f"commit needs a root-first path of the last tree's nodes, got {path.tolist()}")
        src = torch.as_tensor(self._n_cached + path, device=self.device)
        self.model.move_kv(src, self._n_cached)
        self._n_cached += len(path)
        self._tree_parents = np.zeros(0, dtype=np.int64)

    # --- where the layers live ---------------------------------------------------------------
    def placement_summary(self) -> str:
        """'28 layers: 7 on GPU, 21 streamed from RAM, 0 from disk; 700 MB moved per pass', then
        what the streamer measured: bytes per pass, copy bandwidth, compute stalls."""
        kind = "GPU" if self.device.type == "cuda" else "CPU"
        if self.placement is None:
            return f"{self.args.n_layers} layers: all on {kind}"
        text = self.placement.describe()
        if self.streamer is not None and self.streamer.stats.passes:
            text += f"; measured {self.streamer.collect_stats().summary()}"
        return text

    def close(self) -> None:
        """Stop the streamer's threads; an offloaded target cannot run afterwards."""
        if self.streamer is not None:
            self.streamer.close()
            self.streamer = None


def set_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)
