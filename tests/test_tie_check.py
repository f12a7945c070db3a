"""eval/tie_check: a differing answer is held to the target alone, token by token, under the batch noise."""

from __future__ import annotations

import numpy as np

from ondevice.eval.tie_check import check_report
from ondevice.decode.reference import greedy_reference
from ondevice.targets.llama_target import LlamaTarget
from ondevice.decode.tree import DraftTree
from tiny_models import write_tiny_gguf


def test_a_forced_wrong_token_is_a_miss_and_the_target_alone_passes(tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf", arch="llama", endless=True)
    target = LlamaTarget(path, n_ctx=256, threads=2, max_tree_nodes=16)
    prompt = [5, 17, 42, 9, 100]
    reference = greedy_reference(target, prompt, 24)
    # position 6: the target's worst token there (its margin to the top is large: no noise flips it)
    target.truncate(0)
    target.prefill(prompt[:-1])
    context = [prompt[-1], *reference[:6]]
    target.prefill(context[:-1])
    logits = target.forward_tree(DraftTree.root_only(context[-1]))[0]
    wrong = int(np.argmin(logits))
    assert wrong != reference[6]
    answer = reference[:6] + [wrong] + greedy_reference(target, prompt + reference[:6] + [wrong], 17)
    report = {"max_tokens": 24, "results": [
        {"config": "same", "prompts": 1, "same_as_target": 1, "differing": []},
        {"config": "wrong", "prompts": 1, "same_as_target": 0, "differing": [{"prompt": 0, "answer": answer, "reference": reference}]},
    ]}
    check = check_report(report, target, [prompt], [2, 8], end_ids=[])
    target.close()
    (row,) = check["rows"]
    assert row["config"] == "wrong" and row["answers"][0]["first_difference"] == 6
    assert row["answers"][0]["misses"] == [6]  # the rest follows its own prefix greedily: no other miss
    assert check["misses"] == 1
    assert check["target_alone"] == [{"prompt": 0, "near_ties": [], "misses": []}]


def test_an_answer_that_stops_where_the_target_would_not_is_a_miss(tmp_path):
    """A decode does not emit the end token it stops on: an answer that stopped early is a prefix of
    the target alone's, and its end is what must be checked."""
    path = write_tiny_gguf(tmp_path / "t.gguf", arch="llama", endless=True)
    target = LlamaTarget(path, n_ctx=256, threads=2, max_tree_nodes=16)
    prompt = [5, 17, 42, 9, 100]
    reference = greedy_reference(target, prompt, 24)
    target.truncate(0)
    target.prefill(prompt + reference[:9])
    logits = target.forward_tree(DraftTree.root_only(reference[9]))[0]
    unlikely, likely = int(np.argmin(logits)), int(np.argmax(logits))  # an "end token" the target would not pick there, and one it would
    assert likely == reference[10]

    def check(end_ids: list[int]) -> dict:
        report = {"max_tokens": 24, "results": [
            {"config": "stopped", "prompts": 1, "same_as_target": 0, "differing": [{"prompt": 0, "answer": reference[:10], "reference": reference}]},
        ]}
        return check_report(report, target, [prompt], [2, 8], end_ids=end_ids)

    early = check([unlikely])
    assert early["rows"][0]["answers"][0]["misses"] == [10] and early["misses"] == 1
    assert check([likely])["misses"] == 0  # where the target's own choice ends the answer, stopping there is right
    assert check([])["misses"] == 1  # a vocabulary without end tokens: nothing could have stopped it
    target.close()
