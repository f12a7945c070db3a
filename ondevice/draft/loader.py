"""Opening a drafter: the drafter model on its backend, and the router that puts the free prompt-lookup
drafter beside it.

`loading.plan_load` chooses the backend and plans the memory; this file only opens what it chose.
"""

from __future__ import annotations

from pathlib import Path

from ondevice.plan.memory import MemoryPlan


def load_drafter(backend: str, path: Path, n_ctx: int, threads: int, vocab_trim: bool, target_vocab: int | None = None,
                 memory: MemoryPlan | None = None):
    """The drafter model on `backend` ("llama" or "onnx"); a llama.cpp one has its buffers sized by
    the memory plan, and its weights resident (read, not mapped) when the target streams."""
    if backend == "onnx":
        from ondevice.draft.onnx_drafter import OnnxDrafter

        return OnnxDrafter(path, n_ctx=n_ctx, threads=threads, vocab_trim=vocab_trim, target_vocab=target_vocab)
    from ondevice.draft.llama_drafter import LlamaDrafter

    sized = {} if memory is None else {"max_tree": memory.sizes.max_tree, "resident": memory.streams, "kv_type": memory.kv_type,
                                       "n_batch": memory.sizes.drafter_ubatch}
    return LlamaDrafter(path, n_ctx=n_ctx, threads=threads, vocab_trim=vocab_trim, target_vocab=target_vocab, **sized)


def with_lookup(drafter, n_vocab: int):
    """The drafter model (None if there is none) and the free prompt-lookup drafter behind one
    router, which drafts with the one `spec.builder` names."""
    from ondevice.draft.lookup import PromptLookupDrafter
    from ondevice.draft.router import DraftRouter

    return DraftRouter(drafter, PromptLookupDrafter(n_vocab))
