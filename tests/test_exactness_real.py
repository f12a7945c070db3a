"""Greedy speculative decoding == the target alone, token for token, on the real model pair.

For each target backend (llama.cpp GGUF, our PyTorch model, ONNX Runtime with the ONNX drafter):
8 held-out prompts × 128 tokens,
the target alone (`--no-draft`: same engine, root-only trees) against chain and best-first trees.
Verifying many tokens in one pass runs other kernels than one token at a time, so logits move by a
small, measured "batch noise" (numerics.measure_batch_noise). Where outputs diverge, the target's
own top-1/top-2 margin at the first divergence must be below that noise (a near-tie); any other
divergence fails. How often near-ties happened is printed.
"""

from __future__ import annotations

import pytest

from ondevice.eval import prompts
from ondevice.engine import SpecEngine, Step
from ondevice.eval.numerics import measure_batch_noise, top2_margin
from ondevice.protocols import DraftSpec
from ondevice.tokenizer import Tokenizer
from ondevice.tree import DraftTree

pytestmark = pytest.mark.real

N_TOKENS = 128
PROMPTS = prompts.CODE_EVAL[:4] + prompts.CHAT_EVAL[:4]
CONFIGS = {
    "llama": [DraftSpec("chain", 4), DraftSpec("best-first", 16), DraftSpec("multi-seq", 8)],
    # the memory plan's configuration for a target larger than RAM: weights left in the mapped file
    # (no repacking), buffers for trees up to 64 nodes, the page cache steered layer by layer
    "llama-stream": [DraftSpec("best-first", 16), DraftSpec("best-first", 32)],
    "torch": [DraftSpec("chain", 4)],  # fp32 torch on 2 CPU cores is slow; trees are covered by llama above
    "onnx": [DraftSpec("chain", 4), DraftSpec("best-first", 16)],  # ONNX target and ONNX drafter
}


@pytest.fixture(scope="module")
def tokenizer(real_pair):
    return Tokenizer(real_pair.target)


@pytest.fixture(scope="module")
def drafter(real_pair):
    from ondevice.draft.llama_drafter import LlamaDrafter

    return LlamaDrafter(real_pair.drafter, n_ctx=1024, threads=2)


def make_target(backend: str, path):
    if backend.startswith("llama"):
        from ondevice.target.llama_target import LlamaTarget

        if backend == "llama-stream":
            return LlamaTarget(path, n_ctx=1024, threads=2, max_tree_nodes=64, n_ubatch=256, streams=True, window=2)
        return LlamaTarget(path, n_ctx=1024, threads=2)
    if backend == "onnx":
        from ondevice.target.onnx_target import OnnxTarget

        return OnnxTarget.from_gguf(path, n_ctx=1024, threads=2)
    from ondevice.target.torch_target import TorchTarget

    return TorchTarget.from_gguf(path, device="cpu", n_ctx=1024, threads=2)


def decode(engine: SpecEngine, ids: list[int], spec: DraftSpec | None) -> list[int]:
    engine.cached = []
    out = []
    for item in engine.generate(ids, N_TOKENS, spec=spec):
        if isinstance(item, Step):
            out += item.tokens
    return out


def margin_at(target, context: list[int]) -> float:
    """The target alone's top-2 margin for the token after `context` (one-token pass)."""
    target.truncate(0)
    target.prefill(context[:-1])
    logits = target.forward_tree(DraftTree.root_only(context[-1]))[0]
    target.commit([0])
    return top2_margin(logits)


@pytest.mark.parametrize("backend", ["llama", "llama-stream", "torch", "onnx"])
def test_greedy_speculation_equals_target_alone(backend, real_pair, tokenizer, drafter, capsys):
    target = make_target(backend, real_pair.target)
    if backend == "onnx":
        from ondevice.draft.onnx_drafter import OnnxDrafter

        drafter = OnnxDrafter(real_pair.drafter, n_ctx=1024, threads=2)
    engine = SpecEngine(target, drafter, tokenizer.is_end)
    ids = [tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": p}])) for p in PROMPTS]
    reference = [decode(engine, x, None) for x in ids]

    # the backend's batch noise, on the reference continuations of two prompts (64 tokens each)
    noise = 0.0
    for x, ref in zip(ids[:2], reference[:2]):
        target.truncate(0)
        target.prefill(x[:-1])
        stats = measure_batch_noise(target, [x[-1]] + ref[:63])
        noise = max(noise, stats["max_gap_delta"])

    near_ties, report = 0, []
    for spec in CONFIGS[backend]:
        for x, ref in zip(ids, reference):
            out = decode(engine, x, spec)
            if out == ref:
                continue
            i = next((k for k, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
            margin = margin_at(target, x + ref[:i])
            assert margin < noise, (
                f"{backend} {spec.builder}@{spec.budget}: diverged at token {i} where the target's margin is "
                f"{margin:.3f} > batch noise {noise:.3f} (not a near-tie): {tokenizer.decode(ref[:i])!r}"
            )
            near_ties += 1
            report.append(f"{spec.builder}@{spec.budget} prompt {ids.index(x)} token {i} margin {margin:.3f}")
    runs = len(CONFIGS[backend]) * len(ids)
    with capsys.disabled():
        print(f"\n[{backend}] batch noise {noise:.4f}; {runs - near_ties}/{runs} runs identical, "
              f"{near_ties} diverged at near-ties {report}")
