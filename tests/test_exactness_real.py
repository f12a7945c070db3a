"""Greedy speculative decoding == the target alone, token for token, on the real model pair.

For each target backend (llama.cpp GGUF, the same file streamed as a target larger than RAM, our
PyTorch model, ONNX Runtime with the ONNX drafter): up to 6 held-out prompts × 64 tokens, the target alone
(`--no-draft`: same engine, root-only trees) against chain and tree drafts.
Verifying n tokens in one pass runs other kernels than one token at a time, so logits move by a
small "batch noise" that depends on the CPU (docs/design/exactness.md): it is measured here, on this
machine, for the pass sizes the drafts use (numerics.pass_noise). Where an answer differs from the
target alone's, every token of it from the first difference on must be the target's own argmax
after its own prefix, unless the target's top-1/top-2 margin there is below that noise (a near-tie,
numerics.greedy_misses); anything else fails. How often near-ties happened is printed, and how many
verified rounds accepted several drafted tokens or none.

Nothing is computed twice (CI time): the noise's one-token passes are the target alone's own, kept
while it decodes; answers that leave the target alone's at the same near-tie share their
teacher-forced check up to where they part; the mutant checks reuse the llama.cpp run's target,
answers and noise.

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
from ondevice.eval.numerics import OneTokenRows, greedy_misses, pass_noise
from ondevice.decode.protocols import DraftSpec
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Verdict

pytestmark = pytest.mark.real

N_TOKENS = 64
CODE, CHAT = prompts.CODE_EVAL[:3], prompts.CHAT_EVAL[:3]  # 3 + 3 (was 4 + 4: CI took 45 min on an AVX2 VM)
PROMPTS = CODE + CHAT
CONFIGS = {
    "llama": [DraftSpec("chain", 4), DraftSpec("best-first", 16), DraftSpec("multi-seq", 8)],
    # the memory plan's configuration for a target larger than RAM: the weights streamed from the
    # file's repacked copy where this CPU has llama.cpp's repacked layouts (else from the file as it
    # is), buffers for trees up to 64 nodes, the page cache steered layer by layer
    "llama-stream": [DraftSpec("best-first", 16)],
    "torch": [DraftSpec("chain", 4)],  # fp32 torch on 2 CPU cores is slow; trees are covered by llama above
    "onnx": [DraftSpec("chain", 4), DraftSpec("best-first", 16)],  # ONNX target and ONNX drafter
}
# fewer for the slow ones (CI time): the streamed target re-reads the file from disk on every pass
# (~1 s each): a code and a chat prompt; fp32 torch likewise (its trees are the same code as
# llama.cpp's; its logits are held to the ONNX target's in test_onnx_real); ONNX two of each;
# llama.cpp all six (its 18 answers still verify hundreds of rounds, printed)
PROMPTS_FOR = {"llama-stream": [CODE[0], CHAT[0]], "torch": [CODE[0], CHAT[0]], "onnx": CODE[:2] + CHAT[:2]}
NOISE_TOKENS = {"llama-stream": 32, "torch": 32}  # the target alone's first tokens the noise is measured on (else 63)


@pytest.fixture(scope="module")
def tokenizer(real_pair):
    return Tokenizer(real_pair.target)


@pytest.fixture(scope="module")
def drafter(real_pair):
    from ondevice.draft.llama_drafter import LlamaDrafter

    return LlamaDrafter(real_pair.drafter, n_ctx=1024, threads=2)


def make_target(backend: str, path, scratch=None):
    if backend.startswith("llama"):
        from ondevice.targets.llama_target import LlamaTarget

        if backend == "llama-stream":  # as the memory plan streams it: the LM head and the first layers kept, read with
            # O_DIRECT, its logits lent (llama.cpp's rows, not a copy)
            return LlamaTarget(path, n_ctx=1024, threads=2, max_tree_nodes=64, n_ubatch=256, streams=True, window=2,
                               kept_layers=("output", 0, 1, 2), repacked=repacked_copy(path, scratch), lend_logits=True)
        return LlamaTarget(path, n_ctx=1024, threads=2)
    if backend == "onnx":
        from ondevice.onnx.target import OnnxTarget

        return OnnxTarget.from_gguf(path, n_ctx=1024, threads=2)
    from ondevice.targets.torch_target import TorchTarget

    return TorchTarget.from_gguf(path, device="cpu", n_ctx=1024, threads=2)


def repacked_copy(path, scratch):
    """The target's copy in llama.cpp's repacked layouts, written into `scratch` as a streaming load
    writes it beside the model; None where this CPU runs none (the file then streams as it is)."""
    from ondevice.machine.repack_layouts import layouts_repacked
    from ondevice.targets.repacked_copy import ensure_copy

    if not layouts_repacked():
        return None
    return ensure_copy(path, scratch / "target.repacked.gguf", scratch / "target.repacked.json", say=print)


def chat_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode_user(text)


def decode(engine: SpecEngine, ids: list[int], spec: DraftSpec | None, n: int = N_TOKENS) -> list[int]:
    return decode_with_stats(engine, ids, spec, n)[0]


def decode_with_stats(engine: SpecEngine, ids: list[int], spec: DraftSpec | None, n: int = N_TOKENS):
    engine.cached = []
    return collect(engine.generate(ids, n, spec=spec))


class Checked:
    """The near-tie check of one prompt's answers against the target alone's `reference`: (near-ties,
    misses) of each answer from its first difference with the reference on, teacher-forced
    (numerics.greedy_misses). An answer's tokens up to where it leaves the closest answer already
    checked follow the same context, so they keep that answer's verdicts (the reference's tokens are
    the target's own); only the rest costs one-token passes. Several drafts of a prompt often take
    the same near-tie the same way, and then agree for many tokens. The engine does not emit the end
    token it stops on, so an answer that stopped is also checked where it ended (an answer that
    stops before the reference does would otherwise pass as its prefix)."""

    def __init__(self, target, ids: list[int], reference: list[int], noise: float, end_ids: list[int] | None = None):
        self.target, self.ids, self.noise, self.end_ids = target, ids, noise, end_ids
        self.known = [(reference, [""] * len(reference))]  # (answer, verdict per token: "", "tie", "miss")

    def __call__(self, out: list[int], stopped: bool = False) -> tuple[list[int], list[int]]:
        """(near-ties, misses) of `out`, positions from its start; stopped: the run ended on an end
        token after `out` (not emitted), checked as position len(out)."""
        def shared(a: list[int]) -> int:
            return next((k for k, (x, y) in enumerate(zip(out, a)) if x != y), min(len(out), len(a)))

        answer, verdicts = max(self.known, key=lambda known: shared(known[0]))
        i = shared(answer)
        verdicts = verdicts[:i] + [""] * (len(out) + stopped - i)
        if i < len(out) or stopped:
            ends = self.end_ids if stopped else None
            near_ties, misses = greedy_misses(self.target, self.ids + out[:i], out[i:], self.noise, ends)
            for j in near_ties:
                verdicts[i + j] = "tie"
            for j in misses:
                verdicts[i + j] = "miss"
        self.known.append((out, verdicts[: len(out)]))
        return [j for j, v in enumerate(verdicts) if v == "tie"], [j for j, v in enumerate(verdicts) if v == "miss"]


def pass_sizes(specs: list[DraftSpec]) -> list[int]:
    """The number of tree nodes in each spec's full passes (root + budget)."""
    return sorted({spec.budget + 1 for spec in specs})


class Alone:
    """One backend's target, the prompts' ids, the target alone's answers (`--no-draft`: the same
    engine, root-only trees) and this machine's batch noise for the backend's pass sizes.

    The noise is measured on the answers of the first two prompts (NOISE_TOKENS of each): their
    one-token passes are the answers' own, kept while decoding (`OneTokenRows`), so only the chains
    cost passes."""

    def __init__(self, backend: str, target, tokenizer: Tokenizer):
        self.backend, self.target = backend, target
        self.ids = [chat_ids(tokenizer, p) for p in PROMPTS_FOR.get(backend, PROMPTS)]
        self.reference, noises = [], []
        for k, x in enumerate(self.ids):
            rows = OneTokenRows(target, keep=NOISE_TOKENS.get(backend, 63) + 1 if k < 2 else 0)
            self.reference.append(decode(SpecEngine(rows, None, tokenizer.is_end), x, None))
            if k < 2:  # the rows are those of prompt[-1] + the answer's first len(rows) - 1 tokens
                cont = self.reference[-1][: len(rows.rows) - 1]
                noises.append(pass_noise(target, x, cont, pass_sizes(CONFIGS[backend]), np.stack(rows.rows)))
        self.noise = max(noises)


class Kept:
    """The llama.cpp target alone, made on first use and kept until `release`: the mutant checks and
    the exactness check's llama run share it (they run in that order), the other backends free it."""

    def __init__(self, make):
        self.make, self.alone = make, None

    def get(self) -> Alone:
        if self.alone is None:
            self.alone = self.make()
        return self.alone

    def release(self) -> None:
        self.alone = None


@pytest.fixture(scope="module")
def llama_alone(real_pair, tokenizer):
    return Kept(lambda: Alone("llama", make_target("llama", real_pair.target), tokenizer))


# --- mutants: the check below must fail them (run first: they share its llama.cpp target alone) ---


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
def llama_case(llama_alone):
    """The llama.cpp target, a prompt, the target alone's first 48 tokens and the batch noise, all
    from the exactness check below (greedy: the first 48 of 64 tokens are the 48-token answer)."""
    alone = llama_alone.get()
    k = PROMPTS.index(CHAT[0])
    return alone.target, alone.ids[k], alone.reference[k][:48], alone.noise


def test_the_check_catches_a_verifier_that_accepts_wrong_drafts(llama_case, tokenizer, drafter, monkeypatch):
    target, ids, alone, noise = llama_case
    monkeypatch.setattr(ondevice.decode.engine, "verify", accept_the_first_chain)
    out = decode(SpecEngine(target, drafter, tokenizer.is_end), ids, DraftSpec("chain", 4), 48)
    assert out != alone
    assert Checked(target, ids, alone, noise)(out)[1], "a verifier accepting wrong drafts passed the check"


def test_the_check_catches_batched_logits_moved_beyond_the_noise(llama_case, tokenizer, drafter):
    target, ids, alone, noise = llama_case
    boosted = RunnerUpBoost(target, boost=noise + 2.0)  # flips every batched argmax with a margin below noise + 2
    out = decode(SpecEngine(boosted, drafter, tokenizer.is_end), ids, DraftSpec("chain", 4), 48)
    assert out != alone
    assert Checked(target, ids, alone, noise)(out)[1], "logits moved beyond the noise passed the check"


# --- the check ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["llama", "llama-stream", "torch", "onnx"])
def test_greedy_speculation_equals_target_alone(backend, real_pair, tokenizer, drafter, llama_alone, capsys, tmp_path):
    if backend != "llama":
        llama_alone.release()  # one 1.5B target in memory at a time, as each backend's alone
    alone = llama_alone.get() if backend == "llama" else Alone(backend, make_target(backend, real_pair.target, tmp_path), tokenizer)
    target, noise = alone.target, alone.noise
    if backend == "onnx":
        from ondevice.draft.onnx_drafter import OnnxDrafter

        drafter = OnnxDrafter(real_pair.drafter, n_ctx=1024, threads=2)
    engine = SpecEngine(target, drafter, tokenizer.is_end)

    end_ids = tokenizer.end_ids()  # a pass over the whole vocabulary: once, not once per prompt
    checks = [Checked(target, x, ref, noise, end_ids) for x, ref in zip(alone.ids, alone.reference)]
    diverged, report, accepted = 0, [], []
    for spec in CONFIGS[backend]:
        for k, (x, ref) in enumerate(zip(alone.ids, alone.reference)):
            out, stats = decode_with_stats(engine, x, spec)
            accepted += stats.accepted_per_pass
            if out == ref:
                continue
            near_ties, misses = checks[k](out, stats.finish_reason == "stop")
            assert not misses, (
                f"{backend} {spec.builder}@{spec.budget} prompt {k}: tokens {misses} are not the target's choice "
                f"and the target's margin there is above the batch noise {noise:.3f} (not near-ties)"
            )
            diverged += 1
            report.append(f"{spec.builder}@{spec.budget} prompt {k} near-ties at {near_ties}")
    runs = len(CONFIGS[backend]) * len(alone.ids)
    with capsys.disabled():
        layout = " (its repacked copy)" if getattr(target, "marks", None) is not None else ""
        print(f"\n[{backend}{layout}] batch noise {noise:.4f} (passes of {pass_sizes(CONFIGS[backend])}); "
              f"{len(accepted)} verified rounds: {sum(a >= 2 for a in accepted)} accepted 2+ drafts, "
              f"{sum(a == 0 for a in accepted)} none; "
              f"{runs - diverged}/{runs} runs identical, {diverged} diverged at near-ties only {report}")
