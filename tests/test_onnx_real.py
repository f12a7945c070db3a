"""The ONNX backend on the real pair (Qwen2.5-Coder 1.5B / 0.5B, Q4_K_M): logits against our torch
target on the same GGUF, and every export running fast kernels only. Greedy speculation against
the ONNX target alone is in test_exactness_real.py (backend "onnx").

Tolerance of the logits (torch fp32 on the dequantized GGUF is the reference):
- ONNX at accuracy level 0 (float32 activations, same weights): 1e-3 of the logits' range —
  only the order of float sums differs (the K-quant minimums go through a separate block-sum
  product, exact in real arithmetic).
- ONNX as it runs (int8 activations per block of 32, like llama.cpp's Q8_K activations): its
  largest deviation must stay within 1.5× llama.cpp's own on the same file and tree, and the two
  must agree with torch's argmax wherever torch's top-2 margin exceeds that deviation.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from ondevice.bench import prompt_sets as prompts
from ondevice.eval.numerics import top2_margin
from ondevice.onnx import export as ex
from ondevice.onnx.session import check_fast_kernels, nbits_configs
from ondevice.targets.llama_target import LlamaTarget
from ondevice.onnx.target import OnnxTarget
from ondevice.targets.torch_target import TorchTarget
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.decode.tree import DraftTree

pytestmark = pytest.mark.real


def prompt_and_tree(path) -> tuple[list[int], DraftTree]:
    tokenizer = Tokenizer(path)
    ids = tokenizer.encode_user(prompts.CODE_EVAL[0])
    # a tree of 12: a chain of plausible code tokens and some siblings, under the prompt's last token
    words = tokenizer.encode("def add(a, b):\n    return a + b", add_special=False)
    parents = [-1] + list(range(len(words[:8]))) + [0, 1, 2]
    tokens = [ids[-1]] + words[:8] + [words[3], words[5], words[0]]
    return ids[:-1], DraftTree(np.array(tokens), np.array(parents[: len(tokens)]), np.zeros(len(tokens)))


def logits(target, context, tree) -> np.ndarray:
    target.prefill(context)
    return target.forward_tree(tree).astype(np.float64)


def test_onnx_logits_match_the_torch_target_on_the_real_model(real_pair, capsys):
    context, tree = prompt_and_tree(real_pair.target)
    reference = logits(TorchTarget.from_gguf(real_pair.target, n_ctx=512, threads=2), context, tree)
    gc.collect()
    fp32 = logits(OnnxTarget.from_gguf(real_pair.target, n_ctx=512, threads=2, accuracy_level=ex.ACCURACY_FP32), context, tree)
    int8 = logits(OnnxTarget.from_gguf(real_pair.target, n_ctx=512, threads=2), context, tree)
    llama = logits(LlamaTarget(real_pair.target, n_ctx=512, threads=2), context, tree)
    span = reference.max() - reference.min()
    err = {name: float(np.abs(x - reference).max()) for name, x in (("onnx fp32", fp32), ("onnx int8", int8), ("llama.cpp", llama))}
    with capsys.disabled():
        print(f"\nmax |logit - torch| over {len(tree)} tree nodes (logit range {span:.1f}): " + ", ".join(f"{k} {v:.4f}" for k, v in err.items()))
    assert err["onnx fp32"] <= 1e-3 * span
    assert err["onnx int8"] <= 1.5 * err["llama.cpp"]
    margins = np.array([top2_margin(row) for row in reference])
    clear = margins > 2 * max(err["onnx int8"], err["llama.cpp"])
    assert clear.sum() >= len(tree) // 2
    assert np.array_equal(int8.argmax(1)[clear], reference.argmax(1)[clear])
    assert np.array_equal(llama.argmax(1)[clear], reference.argmax(1)[clear])


def test_real_exports_run_only_fast_kernels(real_pair, capsys):
    for path in (real_pair.target, real_pair.drafter):
        export = ex.ensure_export(path)
        ratios = check_fast_kernels([export.body, export.head], threads=2)
        configs = nbits_configs(export.body) | nbits_configs(export.head)
        assert set(ratios) == configs and all(c.zero_point_type is None for c in configs)
        with capsys.disabled():
            print(f"\n{path.name}: " + ", ".join(f"{c.bits}-bit/{c.block}: {r:.2f}× a float MatMul" for c, r in sorted(ratios.items(), key=str)))
