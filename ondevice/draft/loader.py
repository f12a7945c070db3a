"""Opening a drafter: the drafter model on its backend, and the router that puts the free prompt-lookup
drafter beside it.

`loading/choices.plan_load` chooses the backend and plans the memory; this file only opens what it chose.
"""

from __future__ import annotations

from pathlib import Path

from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.draft.lookup import PromptLookupDrafter
from ondevice.draft.router import DraftRouter


def load_drafter(backend: str, path: Path, n_ctx: int, threads: int, vocab_trim: bool, target_vocab: int | None = None,
                 sized: dict | None = None):
    """The drafter model on `backend` ("llama" or "onnx"); a llama.cpp one sized as `sized` says (the
    memory plan's `llama_drafter_sizes`: buffers, and weights resident when the target streams)."""
    if backend == "onnx":
        from ondevice.draft.onnx_drafter import OnnxDrafter  # lazy: imports torch and ONNX Runtime

        return OnnxDrafter(path, n_ctx=n_ctx, threads=threads, vocab_trim=vocab_trim, target_vocab=target_vocab)
    return LlamaDrafter(path, n_ctx=n_ctx, threads=threads, vocab_trim=vocab_trim, target_vocab=target_vocab, **(sized or {}))


def with_lookup(drafter, n_vocab: int):
    """The drafter model (None if there is none) and the free prompt-lookup drafter behind one
    router, which drafts with the one `spec.builder` names."""
    return DraftRouter(drafter, PromptLookupDrafter(n_vocab))
