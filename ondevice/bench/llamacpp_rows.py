"""Bench rows for what a llama.cpp user would run instead: llama-cpp-python's `Llama` decoding the
target alone, and llama-cpp-python's own speculative decoding (`Llama(draft_model=...)`).

llama-cpp-python ships only a prompt-lookup draft model; `GreedyChain` is the `LlamaDraftModel`
that drafts a greedy chain of k tokens from the drafter model (ondevice's llama.cpp drafter, as
llama.cpp loads a model: mapped, an f16 KV cache), so the comparison is with its verification loop: one target batch over the
chain, accepted up to the first mismatch. Both rows decode the same chat prompts greedily, time the
tokens after the first (its own prefill is excluded, as in ondevice's rows) and keep the token ids,
so the bench can say whether each answer equals ondevice's target alone.

The `Llama` target is loaded as llama-cpp-python loads it by default (memory-mapped, llama.cpp's
weight repacking on), except that on CPUs with AMX it gets the layout ondevice's loads use there
(repack_layouts.weight_layout_guard: the AMX kernels only with ONDEVICE_AMX=1 and a build where they
run, else the CPU_REPACK layouts weight by weight) where a repacked copy fits beside the file's pages (llama_repack.fits_twice: under a memory limit the default load is
OOM-killed); the drafter is memory-mapped too. With a draft model it keeps logits for every token of a batch, so its batch is
capped at 64 tokens (a 512-token batch's logits alone take 600 MB).

Under a memory limit, run the rows in a process of their own, as a llama.cpp user would:

    python -m ondevice.eval.lowmem --cgroup 1.2GB -- python -m ondevice.eval.llamacpp_rows --prompts chat --limit 2 --max-tokens 48

`ondevice bench --baselines` runs them in the bench's process after freeing its models, where what
that process still holds (more than a process of its own, and what freed models leave behind)
shares the limit, and can make a target that fits alone stream
(docs/measurements/2026-11-23-streaming-1.3gb.md, "Why 1.2 GB").
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import llama_cpp
import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel

from ondevice.bench.runner import BenchResult
from ondevice.decode.engine import Stats
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.errors import OndeviceError
from ondevice.files.gguf_check import check_gguf_file
from ondevice.llama_backend import set_llama_logging
from ondevice.machine import llama_repack, repack_layouts
from ondevice.decode.protocols import DraftSpec

SPEC_BATCH = 64


class GreedyChain(LlamaDraftModel):
    """llama-cpp-python's draft-model interface over a Drafter: `k` greedy tokens after the context."""

    def __init__(self, drafter, k: int):
        self.drafter, self.k = drafter, k

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        tree = self.drafter.draft([int(t) for t in input_ids], DraftSpec("chain", self.k))
        return np.asarray(tree.tokens[1:], dtype=np.intc)


def load_llama(target_path, n_ctx: int, threads: int, draft_model: LlamaDraftModel | None = None, **placement) -> llama_cpp.Llama:
    """placement: Llama()'s n_gpu_layers and tensor_split, for a split over RPC workers (eval/llamacpp_split.py)."""
    batch = SPEC_BATCH if draft_model is not None else 512
    check_gguf_file(target_path)  # a header llama.cpp would abort on is one line first, as in every other load
    with repack_layouts.weight_layout_guard(target_path if llama_repack.fits_twice(target_path) else None):
        llm = llama_cpp.Llama(
            model_path=str(target_path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=batch, n_ubatch=batch,
            draft_model=draft_model, verbose=False, **placement,
        )
    set_llama_logging(False)  # Llama(verbose=False) installs its own log callback; keep ours quiet too
    return llm


def decode(llm: llama_cpp.Llama, prompt: Sequence[int], max_tokens: int, is_end: Callable[[int], bool]) -> tuple[list[int], float]:
    """(token ids, seconds from the first token to the last) of one greedy answer."""
    llm.reset()
    tokens: list[int] = []
    first = None
    for token in llm.generate(list(prompt), temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
        if first is None:
            first = time.perf_counter()
        if is_end(int(token)):
            break
        tokens.append(int(token))
        if len(tokens) >= max_tokens:
            break
    return tokens, (time.perf_counter() - first) if first is not None else 0.0


def llamacpp_name(name: str) -> str:
    """A --baselines entry checked: "llama-cpp" or "llama-cpp-spec@K" (K draft tokens, default 4)."""
    kind, _, k = name.partition("@")
    if kind not in ("llama-cpp", "llama-cpp-spec") or (k and (not k.isdigit() or kind == "llama-cpp" or int(k) < 1)):
        raise OndeviceError(f"unknown baseline {name!r}; choose llama-cpp or llama-cpp-spec@K (K ≥ 1 draft tokens).")
    return name if kind == "llama-cpp" or k else f"{name}@4"


def label(name: str) -> str:
    if name == "llama-cpp":
        return "llama-cpp-python, target alone"
    return f"llama-cpp-python speculative, chain @{name.partition('@')[2]}"


def run_named(name: str, models, n_ctx: int, threads: int, prompts, max_tokens: int, is_end,
              on_prompt: Callable[[], None] | None = None) -> tuple[BenchResult, list[list[int]]]:
    """Load, run and free one baseline row (`llamacpp_name`); the drafter's file is mapped, as a
    llama.cpp user's would be."""
    drafter = None
    if name != "llama-cpp":
        drafter = LlamaDrafter(models.drafter, n_ctx=n_ctx, threads=threads, max_tree=SPEC_BATCH, n_batch=SPEC_BATCH, kv_type="f16")
    llm = load_llama(models.target, n_ctx, threads, GreedyChain(drafter, int(name.partition("@")[2])) if drafter else None)
    try:
        return run_row(label(name), llm, prompts, max_tokens, is_end, on_prompt)
    finally:
        llm.close()
        if drafter is not None:
            drafter.close()


def run_row(config: str, llm: llama_cpp.Llama, prompts: Sequence[Sequence[int]], max_tokens: int, is_end,
            on_prompt: Callable[[], None] | None = None) -> tuple[BenchResult, list[list[int]]]:
    """One bench row: tokens after the first over their decode time, summed over the prompts."""
    result = BenchResult(config, "llama-cpp-python", 0)
    outputs = []
    for ids in prompts:
        tokens, seconds = decode(llm, ids, max_tokens, is_end)
        outputs.append(tokens)
        result.add(Stats(tokens=max(0, len(tokens) - 1), total_seconds=seconds))  # the first token came with the prefill
        if on_prompt:
            on_prompt()
    return result, outputs
