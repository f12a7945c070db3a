"""TorchTarget: the `ondevice.decode.protocols.Target` backed by our own PyTorch model (`torch_model.py`).

The KV cache is preallocated (n_ctx slots) on the model's device. Slots 0..n_cached hold committed
tokens; `forward_tree` writes the tree's nodes provisionally at slots n_cached + node index, at
RoPE positions n_cached + depth, each attending to the whole cache and to its own ancestors.
`commit(path)` copies the path's entries down to n_cached, n_cached+1, ... in every layer (no
recompute); whatever sits beyond the new n_cached is garbage and gets overwritten.

Default dtype: see `default_dtype` (fp32 on CPU, where exactness wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from ondevice.decode.kvcache import TreeSlots
from ondevice.decode.protocols import Target
from ondevice.targets import weights
from ondevice.files.architecture import ModelArgs
from ondevice.targets.torch_model import Transformer
from ondevice.decode.tree import DraftTree

if TYPE_CHECKING:
    from ondevice.offload.placement import Placement
    from ondevice.offload.streamer import LayerStreamer

PREFILL_CHUNK = 256  # tokens per prefill pass: bounds the activations' memory, costs nothing in speed


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on CPU, bf16 (with the fp32 LM head `from_gguf` keeps by default) on a GPU.

    fp32 is practically batch-invariant: a tree's pass gives the logits of one-token passes, so
    verification reproduces the target alone except at exact ties. bf16 moves them by far more
    (bf16-rounded logits even make exact ties, hence the fp32 head) but halves the bytes read per
    pass, which is what an offloaded GPU target pays for; on a CPU it gains little, and nothing
    without AMX / AVX512-BF16, so there exactness wins. Pass dtype=torch.bfloat16 to trade it for
    speed. What each choice measured, and the command: docs/bench/torch-dtype.md.
    """
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


class TorchTarget(Target):
    """Target protocol over `Transformer`: a preallocated KV cache, one pass per draft tree."""

    # Set by `ondevice.targets.offloaded.load_offloaded_target`; None: every layer is resident.
    placement: Placement | None = None
    streamer: LayerStreamer | None = None

    def __init__(self, model: Transformer, n_ctx: int = 4096):
        self.model = model.eval()
        self.args: ModelArgs = model.args
        self.n_vocab = self.args.vocab_size
        self.n_ctx = n_ctx
        self.device = model.tok_embeddings.weight.device
        self.slots = TreeSlots(n_ctx)
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
        return self.slots.n_cached

    def truncate(self, n_tokens: int) -> None:
        self.slots.truncate(n_tokens)

    @torch.inference_mode()
    def prefill(self, tokens: Sequence[int]) -> None:
        self.slots.check_room(len(tokens))
        for i in range(0, len(tokens), PREFILL_CHUNK):
            chunk = torch.as_tensor(tokens[i : i + PREFILL_CHUNK], dtype=torch.int64, device=self.device)
            start = self.slots.n_cached
            T = len(chunk)
            causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
            mask = torch.cat([torch.ones(T, start, dtype=torch.bool, device=self.device), causal], dim=1)  # (T, S)
            positions = torch.arange(start, start + T, device=self.device)[None]  # (1, T)
            self.model.hidden_states(chunk[None], positions, mask, start)  # fills the KV cache; no LM head
            self.slots.appended(T)

    @torch.inference_mode()
    def forward_tree(self, tree: DraftTree) -> np.ndarray:
        n, start = len(tree), self.slots.n_cached
        self.slots.check_room(n)
        tokens = torch.as_tensor(tree.tokens, device=self.device)[None]  # (1, n)
        positions = torch.as_tensor(start + tree.depths, device=self.device)[None]  # (1, n)
        tree_mask = torch.as_tensor(tree.ancestor_mask(), device=self.device)  # (n, n)
        mask = torch.cat([torch.ones(n, start, dtype=torch.bool, device=self.device), tree_mask], dim=1)  # (n, S)
        logits = self.model(tokens, positions, mask, start)  # (1, n, vocab) fp32
        self.slots.tree_written(tree.parents)
        return logits[0].cpu().numpy()

    @torch.inference_mode()
    def commit(self, path: Sequence[int]) -> None:
        self.slots.commit(path, lambda src, dst: self.model.move_kv(torch.as_tensor(src, device=self.device), dst))

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
