"""The suffix automaton and SuffixDrafter against brute-force scans of the text: occurrence counts of
every substring, undo, the longest earlier match and its weighted continuations, the session's
history across documents, and memory bounded over a long session."""

from __future__ import annotations

import heapq
import math
import tracemalloc

import numpy as np
import pytest

from ondevice.draft.suffix_automaton import SuffixAutomaton
from ondevice.draft.suffix_drafter import SEPARATOR, SuffixDrafter, SuffixIndex
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree


def occurrences(text: list[int], w: list[int]) -> int:
    """How many times w occurs in text (overlaps counted): the O(n·|w|) scan."""
    n = len(w)
    return sum(text[i : i + n] == w for i in range(len(text) - n + 1))


def built(text: list[int]) -> SuffixAutomaton:
    sam = SuffixAutomaton()
    for t in text:
        sam.extend(t)
    return sam


def structure(sam: SuffixAutomaton) -> tuple:
    return sam.length, sam.link, sam.next, sam.count, sam.last, sam.n_tokens


@pytest.mark.parametrize("seed", range(6))
def test_counts_of_every_substring_equal_a_scan(seed):
    rng = np.random.default_rng(seed)
    text = rng.integers(0, 2 + seed % 3, int(rng.integers(1, 60))).tolist()  # few symbols: many repeats
    sam = built(text)
    for i in range(len(text)):
        for j in range(i + 1, len(text) + 1):
            state = sam.walk(text[i:j])
            assert state > 0 and sam.count[state] == occurrences(text, text[i:j])
    assert sam.walk([99]) == -1
    assert sam.n_states <= max(2 * len(text) - 1, 2)


@pytest.mark.parametrize("seed", range(6))
def test_rollback_restores_exactly_the_automaton_without_those_tokens(seed):
    rng = np.random.default_rng(seed)
    kept = rng.integers(0, 3, 30).tolist()
    sam = built(kept[:12])
    sam.mark()
    for t in kept[12:] + rng.integers(0, 3, 15).tolist():
        sam.extend(t)
    sam.rollback(15)
    assert structure(sam) == structure(built(kept))
    with pytest.raises(ValueError):
        sam.rollback(19)  # only what came after mark()
    limited = built(kept[:12])
    limited.undo_limit = 4
    limited.mark()
    for t in kept[12:]:
        limited.extend(t)
    assert limited.can_rollback() == 4  # only the last undo_limit steps are kept
    limited.rollback(4)
    assert structure(limited) == structure(built(kept[:-4]))


# --- proposals against a brute-force reference -------------------------------------------------


def longest_earlier_match(text: list[int]) -> int:
    """The longest suffix of text that also ends earlier: O(n²) scan."""
    best = 0
    for length in range(1, len(text)):
        w = text[len(text) - length :]
        if any(text[e - length + 1 : e + 1] == w for e in range(length - 1, len(text) - 1)):
            best = length
    return best


def reference_tree(text: list[int], budget: int, max_depth: int, min_match: int = 2) -> dict[tuple, float]:
    """path → score of the best `budget` nodes, from counts scanned in the text (the drafter's scoring rule)."""
    ell = longest_earlier_match(text)
    if ell < min_match:
        return {}
    w = text[len(text) - ell :]
    heap, out, tie = [(0.0, 0, ())], {}, 1
    while heap and len(out) < budget + 1:
        neg, _, path = heapq.heappop(heap)
        out[path] = -neg
        if len(path) == max_depth:
            continue
        after = [text[i + ell + len(path)] for i in range(len(text) - ell - len(path))
                 if text[i : i + ell + len(path)] == w + list(path)]  # fmt: skip
        counts = {t: after.count(t) for t in set(after) if t != SEPARATOR}
        held_back = sum(counts.values()) + 1.0 / (ell + len(path))
        for t, c in counts.items():
            heapq.heappush(heap, (neg - math.log(c / held_back), tie, path + (t,)))
            tie += 1
    del out[()]
    return out


def tree_scores(tree: DraftTree) -> dict[tuple, float]:
    return {tuple(int(tree.tokens[n]) for n in tree.path_to(i)[1:]): float(tree.logprobs[i]) for i in range(1, len(tree))}


@pytest.mark.parametrize("seed", range(8))
def test_proposals_are_the_scanned_continuations_of_the_longest_match(seed):
    rng = np.random.default_rng(seed)
    block = rng.integers(0, 6, 12).tolist()
    text = (block + rng.integers(0, 6, 5).tolist()) * 3 + block[: 3 + seed % 5]  # repeats that continue differently
    drafter = SuffixDrafter(n_vocab=10)
    tree = drafter.draft(text, DraftSpec("suffix", 500, max_depth=3))  # every node to depth 3: no ties at a cut
    want = reference_tree(text, 500, 3)
    got = tree_scores(tree)
    assert set(got) == set(want) and want
    assert all(abs(got[p] - want[p]) < 1e-9 for p in want)
    DraftTree(tree.tokens, tree.parents, tree.logprobs)


@pytest.mark.parametrize("budget", [1, 3, 8])
def test_a_small_budget_keeps_the_best_nodes(budget):
    rng = np.random.default_rng(budget)
    text = rng.integers(0, 4, 80).tolist()
    tree = SuffixDrafter(n_vocab=4).draft(text, DraftSpec("suffix", budget, max_depth=4))
    every = reference_tree(text, 10_000, 4)
    got = tree_scores(tree)
    assert len(got) == min(budget, len(every)) and set(got) <= set(every)
    left_out = [s for p, s in every.items() if p not in got]
    assert not left_out or max(left_out) <= min(got.values()) + 1e-12


def test_nothing_to_propose_without_an_earlier_match():
    drafter = SuffixDrafter(n_vocab=50)
    assert len(drafter.draft([1, 2, 3, 4, 5], DraftSpec("suffix", 6))) == 1
    assert len(drafter.draft([1, 2, 3, 4, 5, 4], DraftSpec("suffix", 6))) == 1  # a single token recurring is not enough
    assert len(drafter.draft([1, 2, 3, 4, 5, 4, 5], DraftSpec("suffix", 0))) == 1


# --- the session's history ---------------------------------------------------------------------


def test_an_earlier_answer_is_proposed_in_another_conversation():
    drafter = SuffixDrafter(n_vocab=100)
    answer = [40, 41, 42, 43, 44, 45]
    prompt = [1, 2, 3, 7, 8]
    drafter.draft(prompt, DraftSpec("suffix", 4))  # conversation 1: its prompt, then a round with its answer
    drafter.draft(prompt + answer, DraftSpec("suffix", 4))
    tree = drafter.draft([1, 2, 9, 9, 9, 7, 8], DraftSpec("suffix", 6))  # conversation 2 (parts from 1 at token 2)
    assert [int(t) for t in tree.tokens[tree.path_to(len(tree) - 1)]] == [8] + answer
    assert SEPARATOR not in tree.tokens.tolist()
    assert len(drafter.draft([1, 2, 9, 44, 45], DraftSpec("suffix", 6))) == 1  # conversation 1 ended there: no token followed


def test_a_guess_is_rolled_back_and_a_new_conversation_kept_apart():
    index = SuffixIndex()
    context = [5, 6, 7, 8, 5, 6]
    index.sync(context)
    index.sync(context + [7, 1, 2])  # the overlap worker's guess ...
    index.sync(context + [7, 8, 9])  # ... did not come true: only what really followed stays
    assert structure(index.older) == structure(built(context + [7, 8, 9]))
    index.sync([5, 6, 3])  # parts before what the last call appended: a new document
    assert structure(index.older) == structure(built(context + [7, 8, 9, SEPARATOR, 5, 6, 3]))
    assert index.doc == [5, 6, 3]


def test_memory_stays_bounded_over_a_long_session():
    """100k tokens in rounds of a few tokens, conversations of ~2k: never more than 1.5 × history indexed,
    the structure ≤ 2 states per token, and its bytes within the stated ~440 per token."""
    history = 4096
    rng = np.random.default_rng(0)
    drafter = SuffixDrafter(n_vocab=5000, history=history)
    phrases = [rng.integers(0, 5000, 30).tolist() for _ in range(40)]  # text that repeats, as code does
    tracemalloc.start()
    fed, peak_tokens = 0, 0
    try:
        while fed < 100_000:
            context = rng.integers(0, 5000, 20).tolist()  # a new conversation
            while len(context) < 2000:
                context += phrases[int(rng.integers(40))][: int(rng.integers(1, 30))] if rng.random() < 0.5 else rng.integers(0, 5000, 3).tolist()
                drafter.draft(context, DraftSpec("suffix", 8))
            fed += len(context)
            index = drafter.index
            peak_tokens = max(peak_tokens, index.indexed_tokens)
            assert index.indexed_tokens <= 1.5 * history + 1
            assert index.older.n_states <= 2 * len(index.older) + 1
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_tokens > history  # the bound was reached, and held
    assert held < 600 * 1.5 * history + 2_000_000, held  # the index, the drafter's last context and small change


def test_old_text_is_evicted_and_recent_text_kept():
    drafter = SuffixDrafter(n_vocab=10_000, history=1000)
    old = list(range(5000, 5010))
    drafter.draft(old + list(range(100, 1700)), DraftSpec("suffix", 4))  # 1,610 tokens: the old phrase is evicted
    recent = list(range(1600, 1610))
    fresh = [9000, 9001]
    assert len(drafter.draft(fresh + old[:5], DraftSpec("suffix", 4))) == 1
    tree = drafter.draft(fresh + old[:5] + [9002] + recent[:5], DraftSpec("suffix", 4))
    assert tree.tokens.tolist() == [recent[4]] + recent[5:9]
