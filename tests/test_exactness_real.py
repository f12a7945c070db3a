"""Greedy speculative decoding == the target alone, token for token, on the real model pair.

For each target backend (llama.cpp GGUF, the same file streamed as a target larger than RAM, our
PyTorch model, ONNX Runtime with the ONNX drafter): 6 held-out prompts × 128 tokens, the target alone
(`--no-draft`: same engine, root-only trees) against chain and tree drafts.
Verifying n tokens in one pass runs other kernels than one token at a time, so logits move by a
small "batch noise" that depends on the CPU (docs/design/exactness.md): it is measured here, on this
machine, for the pass sizes the drafts use (numerics.pass_noise). Where an answer differs from the
target alone's, every token of it from the first difference on must be the target's own argmax
after its own prefix, unless the target's top-1/top-2 margin there is below that noise (a near-tie,
numerics.greedy_misses); anything else fails. How often near-ties happened is printed.

The check is not loose: two mutants must fail it — a verifier that accepts drafts the target
rejects, and a target whose batched logits move by more than the measured noise.
"""

from __future__ import annotations

import numpy as np
import pytest

import ondevice.decode.engine
from ondevice.decode.engine import SpecEngine
from ondevice.decode.stats import collect
from ondevice.bench import prompt_sets as prompts
from ondevice.eval.numerics import greedy_misses, pass_noise
from ondevice.decode.protocols import DraftSpec
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Verdict

pytestmark = pytest.mark.real

N_TOKENS = 128
CODE, CHAT = prompts.CODE_EVAL[:3], prompts.CHAT_EVAL[:3]  # 3 + 3 (was 4 + 4: CI took 45 min on an AVX2 VM)
PROMPTS = CODE + CHAT
CONFIGS = {
    "llama": [DraftSpec("chain", 4), DraftSpec("best-first", 16), DraftSpec("multi-seq", 8)],
    # the memory plan's configuration for a target larger than RAM: weights left in the mapped file
    # (no repacking), buffers for trees up to 64 nodes, the page cache steered layer by layer
    "llama-stream": [DraftSpec("best-first", 16)],
    "torch": [DraftSpec("chain", 4)],  # fp32 torch on 2 CPU cores is slow; trees are covered by llama above
    "onnx": [DraftSpec("chain", 4), DraftSpec("best-first", 16)],  # ONNX target and ONNX drafter
}
# fewer for the slow ones (CI time): the streamed target re-reads the file from disk on every pass
# (~1 s each): a code and a chat prompt × 64 tokens; fp32 torch: two of each × 64 tokens
PROMPTS_FOR = {"llama-stream": [CODE[0], CHAT[0]], "torch": CODE[:2] + CHAT[:2]}
TOKEN_COUNT = {"llama-stream": 64, "torch": 64}


@pytest.fixture(scope="module")
def tokenizer(real_pair):
    return Tokenizer(real_pair.target)


@pytest.fixture(scope="module")
def drafter(real_pair):
    from ondevice.draft.llama_drafter import LlamaDrafter

    return LlamaDrafter(real_pair.drafter, n_ctx=1024, threads=2)


def make_target(backend: str, path):
    if backend.startswith("llama"):
        from ondevice.targets.llama_target import LlamaTarget

        if backend == "llama-stream":  # as the memory plan streams it: the LM head and the first layers kept, read with O_DIRECT
            return LlamaTarget(path, n_ctx=1024, threads=2, max_tree_nodes=64, n_ubatch=256, streams=True, window=2,
                               kept_layers=("output", 0, 1, 2))
        return LlamaTarget(path, n_ctx=1024, threads=2)
    if backend == "onnx":
        from ondevice.onnx.target import OnnxTarget

        return OnnxTarget.from_gguf(path, n_ctx=1024, threads=2)
    from ondevice.targets.torch_target import TorchTarget

    return TorchTarget.from_gguf(path, device="cpu", n_ctx=1024, threads=2)


def chat_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode_user(text)


def decode(engine: SpecEngine, ids: list[int], spec: DraftSpec | None, n: int = N_TOKENS) -> list[int]:
    engine.cached = []
    return collect(engine.generate(ids, n, spec=spec))[0]


def unexplained(target, ids: list[int], out: list[int], reference: list[int], noise: float) -> tuple[list[int], list[int]]:
    """(near-ties, misses) of `out` from its first difference with the target alone's `reference` on;
    the tokens before it are the reference's, decoded by the target alone."""
    i = next((k for k, (a, b) in enumerate(zip(out, reference)) if a != b), min(len(out), len(reference)))
    near_ties, misses = greedy_misses(target, ids + out[:i], out[i:], noise)
    return [i + j for j in near_ties], [i + j for j in misses]


def pass_sizes(specs: list[DraftSpec]) -> list[int]:
    """The number of tree nodes in each spec's full passes (root + budget)."""
    return sorted({spec.budget + 1 for spec in specs})


@pytest.mark.parametrize("backend", ["llama", "llama-stream", "torch", "onnx"])
def test_greedy_speculation_equals_target_alone(backend, real_pair, tokenizer, drafter, capsys):
    target = make_target(backend, real_pair.target)
    if backend == "onnx":
        from ondevice.draft.onnx_drafter import OnnxDrafter

        drafter = OnnxDrafter(real_pair.drafter, n_ctx=1024, threads=2)
    engine = SpecEngine(target, drafter, tokenizer.is_end)
    n_tokens = TOKEN_COUNT.get(backend, N_TOKENS)
    ids = [chat_ids(tokenizer, p) for p in PROMPTS_FOR.get(backend, PROMPTS)]
    reference = [decode(engine, x, None, n_tokens) for x in ids]

    # this machine's batch noise for the pass sizes used, on the reference continuations of two prompts
    noise = max(pass_noise(target, x, ref[: min(63, n_tokens // 2)], pass_sizes(CONFIGS[backend])) for x, ref in zip(ids[:2], reference[:2]))

    diverged, report = 0, []
    for spec in CONFIGS[backend]:
        for k, (x, ref) in enumerate(zip(ids, reference)):
            out = decode(engine, x, spec, n_tokens)
            if out == ref:
                continue
            near_ties, misses = unexplained(target, x, out, ref, noise)
            assert not misses, (
                f"{backend} {spec.builder}@{spec.budget} prompt {k}: tokens {misses} are not the target's choice "
                f"and the target's margin there is above the batch noise {noise:.3f} (not near-ties)"
            )
            diverged += 1
            report.append(f"{spec.builder}@{spec.budget} prompt {k} near-ties at {near_ties}")
    runs = len(CONFIGS[backend]) * len(ids)
    with capsys.disabled():
        print(f"\n[{backend}] batch noise {noise:.4f} (passes of {pass_sizes(CONFIGS[backend])}); "
              f"{runs - diverged}/{runs} runs identical, {diverged} diverged at near-ties only {report}")


# --- mutants: the check above must fail them ----------------------------------------------------


def accept_the_first_chain(tree: DraftTree, logits: np.ndarray, *args, **kwargs) -> Verdict:
    """Mutant verifier: accepts the tree's first root→leaf chain whatever the target says."""
    path = [0]
    while tree.children(path[-1]):
        path.append(int(tree.children(path[-1])[0]))
    return Verdict(path, [int(t) for t in tree.tokens[path[1:]]] + [int(logits[path[-1]].argmax())])


class RunnerUpBoost:
    """Mutant target: in passes of more than one token, every row's runner-up logit gains `boost`."""

    def __init__(self, inner, boost: float):
        self.inner, self.boost = inner, boost

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward_tree(self, tree: DraftTree) -> np.ndarray:
        logits = self.inner.forward_tree(tree)
        if len(tree) > 1:
            runner_up = np.argsort(logits, axis=1)[:, -2]
            logits[np.arange(len(tree)), runner_up] += self.boost
        return logits


@pytest.fixture(scope="module")
def llama_case(real_pair, tokenizer):
    """The llama.cpp target, a prompt, the target alone's 48 tokens and the noise of 5-token passes."""
    target = make_target("llama", real_pair.target)
    ids = chat_ids(tokenizer, CHAT[0])
    alone = decode(SpecEngine(target, None, tokenizer.is_end), ids, None, 48)
    return target, ids, alone, pass_noise(target, ids, alone, [5])


def test_the_check_catches_a_verifier_that_accepts_wrong_drafts(llama_case, tokenizer, drafter, monkeypatch):
    target, ids, alone, noise = llama_case
    monkeypatch.setattr(ondevice.decode.engine, "verify", accept_the_first_chain)
    out = decode(SpecEngine(target, drafter, tokenizer.is_end), ids, DraftSpec("chain", 4), 48)
    assert out != alone
    assert unexplained(target, ids, out, alone, noise)[1], "a verifier accepting wrong drafts passed the check"


def test_the_check_catches_batched_logits_moved_beyond_the_noise(llama_case, tokenizer, drafter):
    target, ids, alone, noise = llama_case
    boosted = RunnerUpBoost(target, boost=noise + 2.0)  # flips every batched argmax with a margin below noise + 2
    out = decode(SpecEngine(boosted, drafter, tokenizer.is_end), ids, DraftSpec("chain", 4), 48)
    assert out != alone
    assert unexplained(target, ids, out, alone, noise)[1], "logits moved beyond the noise passed the check"
