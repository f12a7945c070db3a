"""TorchTarget against independent references: llama.cpp and transformers on the same tiny weights.

Tolerance: fp32 logits of the tiny models range over ±5..±50; ours match llama.cpp (f32 weights,
f32 KV cache, flash attention off) and transformers to ~1e-5, asserted at atol 1e-4.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from ondevice.errors import OndeviceError
from ondevice.eval.numerics import (
    batch_noise_by_size,
    greedy_misses,
    logits_as_chain,
    logits_one_by_one,
    measure_batch_noise,
    OneTokenRows,
    pass_noise,
    top2_margin,
)
from ondevice.decode.reference import greedy_reference
from ondevice.targets import torch_target, weights
from ondevice.files.architecture import ModelArgs
from ondevice.targets.torch_target import TorchTarget
from ondevice.decode.tree import DraftTree
from tiny_models import write_tiny_gguf, write_tiny_hf

ARCHS = ("qwen2", "qwen3", "llama")
ATOL = 1e-4
VOCAB = 320


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{arch: (gguf path, hf folder)} for the same random weights."""
    root = tmp_path_factory.mktemp("tiny")
    return {a: (write_tiny_gguf(root / f"{a}.gguf", a), write_tiny_hf(root / f"{a}-hf", a)) for a in ARCHS}


def llama_cpp_logits(gguf_path, tokens) -> np.ndarray:
    """(len(tokens), vocab) logits of llama.cpp evaluating tokens as one plain causal sequence."""
    import llama_cpp

    from ondevice.machine.repack_layouts import weight_layout_guard

    with weight_layout_guard():  # on AMX CPUs the weights as the file stores them: torch runs in this process too
        llm = llama_cpp.Llama(
            str(gguf_path), n_ctx=256, logits_all=True, flash_attn=False, n_threads=2, verbose=False,
            type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
        )  # fmt: skip
    llm.eval(list(tokens))
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    llm.close()
    return logits


def random_tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB - 1, n).tolist()


def fp32_target(gguf_path, n_ctx: int = 128) -> TorchTarget:
    return TorchTarget.from_gguf(gguf_path, dtype=torch.float32, n_ctx=n_ctx)


def branching_tree(root: int, seed: int) -> DraftTree:
    """10 nodes, 3 levels, siblings at every level: node order is not any branch's order."""
    parents = [-1, 0, 0, 0, 1, 2, 1, 4, 5, 5]
    tokens = [root, *random_tokens(len(parents) - 1, seed)]
    return DraftTree(np.array(tokens), np.array(parents), np.zeros(len(parents)))


# --- (1) and (2): plain logits ----------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_llama_cpp(tiny, arch, monkeypatch):
    monkeypatch.setattr(torch_target, "PREFILL_CHUNK", 4)  # a 10-token prompt takes 3 chunks
    tokens = random_tokens(40, seed=1)
    target = fp32_target(tiny[arch][0])
    target.prefill(tokens[:10])
    ours = target.forward_tree(DraftTree.chain(tokens[10], tokens[11:]))
    ref = llama_cpp_logits(tiny[arch][0], tokens)[10:]
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)


def test_f16_gguf_close_to_llama_cpp(tmp_path):
    """f16 weights: llama.cpp rounds activations to f16 for the matmuls, we do not; loose tolerance."""
    path = write_tiny_gguf(tmp_path / "f16.gguf", "llama", dtype="f16")
    tokens = random_tokens(24, seed=2)
    target = fp32_target(path)
    target.prefill(tokens[:4])
    ours = target.forward_tree(DraftTree.chain(tokens[4], tokens[5:]))
    ref = llama_cpp_logits(path, tokens)[4:]
    np.testing.assert_allclose(ours, ref, atol=2e-2, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(tiny, arch):
    import transformers

    tokens = random_tokens(40, seed=3)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny[arch][1], dtype=torch.float32)
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0].numpy()
    target = TorchTarget.from_hf(tiny[arch][1], dtype=torch.float32, n_ctx=64)
    target.prefill(tokens[:7])
    ours = target.forward_tree(DraftTree.chain(tokens[7], tokens[8:]))
    np.testing.assert_allclose(ours, ref[7:], atol=ATOL, rtol=0)


def test_transformers_5_config_format(tiny, tmp_path):
    """A folder saved by transformers 5 (RoPE settings under "rope_parameters") loads the same."""
    import transformers

    tokens = random_tokens(20, seed=21)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny["llama"][1], dtype=torch.float32)
    hf.save_pretrained(tmp_path)
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0].numpy()
    target = TorchTarget.from_hf(tmp_path, dtype=torch.float32, n_ctx=32)
    target.prefill(tokens[:3])
    ours = target.forward_tree(DraftTree.chain(tokens[3], tokens[4:]))
    np.testing.assert_allclose(ours, ref[3:], atol=ATOL, rtol=0)


def test_model_args_from_dict_ignores_unknown_keys():
    args = ModelArgs.from_dict({"arch": "llama", "dim": 64, "n_heads": 4, "torch_dtype": "bfloat16"})
    assert (args.arch, args.dim, args.head_dim) == ("llama", 64, 16)


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_and_hf_give_the_same_weights(tiny, arch):
    """Checks the Llama Q/K un-permutation directly: both files hold the same random weights."""
    _, from_gguf = weights.load_gguf(tiny[arch][0])
    _, from_hf = weights.load_hf(tiny[arch][1])
    assert from_gguf.keys() == from_hf.keys()
    for name in from_gguf:
        assert torch.equal(from_gguf[name], from_hf[name]), name


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_body_keeps_an_exact_fp32_head(tiny, arch):
    """Tied (qwen2) or not (llama), the fp32 head holds the file's fp32 values, not bf16-rounded ones."""
    _, fp32 = weights.load_gguf(tiny[arch][0])
    exact_head = fp32.get("output.weight", fp32["tok_embeddings.weight"])
    for load, source in ((weights.load_gguf, tiny[arch][0]), (weights.load_hf, tiny[arch][1])):
        args, mixed = load(source, torch.bfloat16, head_dtype=torch.float32)
        assert not args.tie_embeddings and mixed["tok_embeddings.weight"].dtype == torch.bfloat16
        assert torch.equal(mixed["output.weight"], exact_head)


def test_bf16_close_to_llama_cpp(tiny):
    tokens = random_tokens(30, seed=4)
    target = TorchTarget.from_gguf(tiny["qwen2"][0], dtype=torch.bfloat16, n_ctx=64)
    target.prefill(tokens[:5])
    ours = target.forward_tree(DraftTree.chain(tokens[5], tokens[6:]))
    ref = llama_cpp_logits(tiny["qwen2"][0], tokens)[5:]
    assert np.abs(ours - ref).max() < 0.05 * np.abs(ref).max()


# --- (3) tree mask, (4) commit, (5) truncate ---------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_equals_each_branch(tiny, arch):
    prompt = random_tokens(12, seed=5)
    tree = branching_tree(prompt[-1], seed=6)
    target = fp32_target(tiny[arch][0])
    target.prefill(prompt[:-1])
    logits = target.forward_tree(tree)
    for leaf in tree.leaves():
        path = tree.path_to(leaf)
        ref = llama_cpp_logits(tiny[arch][0], prompt[:-1] + tree.tokens[path].tolist())[len(prompt) - 1 :]
        np.testing.assert_allclose(logits[path], ref, atol=ATOL, rtol=0, err_msg=f"branch {path}")


@pytest.mark.parametrize("arch", ARCHS)
def test_commit_then_continue_equals_never_drafting_the_rest(tiny, arch):
    prompt = random_tokens(12, seed=7)
    tree = branching_tree(prompt[-1], seed=8)
    path = [0, 2, 5, 8]  # nodes 1, 3, 4, 6, 7, 9 rejected; slots 2, 5, 8 must move to 1, 2, 3
    target = fp32_target(tiny[arch][0])
    target.prefill(prompt[:-1])
    target.forward_tree(tree)
    target.commit(path)
    assert target.n_cached == len(prompt) - 1 + len(path)
    after = random_tokens(6, seed=9)
    ours = target.forward_tree(DraftTree.chain(after[0], after[1:]))
    accepted = tree.tokens[path].tolist()
    ref = llama_cpp_logits(tiny[arch][0], prompt[:-1] + accepted + after)[-len(after) :]
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)


def test_commit_rejects_a_non_path(tiny):
    target = fp32_target(tiny["qwen2"][0])
    target.prefill([1, 2, 3])
    target.forward_tree(branching_tree(4, seed=10))
    with pytest.raises(ValueError):
        target.commit([0, 2, 4])  # node 4's parent is 1, not 2


def test_truncate_then_continue(tiny):
    a, b, c = random_tokens(9, 11), random_tokens(7, 12), random_tokens(8, 13)
    target = fp32_target(tiny["llama"][0])
    target.prefill(a + b)
    target.truncate(len(a))
    assert target.n_cached == len(a)
    ours = target.forward_tree(DraftTree.chain(c[0], c[1:]))
    ref = llama_cpp_logits(tiny["llama"][0], a + c)[len(a) :]
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)


# --- errors a user can cause ------------------------------------------------------------------------


def test_prompt_longer_than_context(tiny):
    target = fp32_target(tiny["qwen2"][0], n_ctx=16)
    with pytest.raises(OndeviceError, match="context"):
        target.prefill(random_tokens(17, 14))
    target.prefill(random_tokens(14, 14))
    with pytest.raises(OndeviceError, match="context"):
        target.forward_tree(branching_tree(3, seed=15))


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(OndeviceError, match="No GGUF file"):
        TorchTarget.from_gguf(tmp_path / "nope.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(OndeviceError, match="not a readable GGUF"):
        TorchTarget.from_gguf(tmp_path / "junk.gguf")
    with pytest.raises(OndeviceError, match="Hugging Face checkpoint"):
        TorchTarget.from_hf(tmp_path)


def header_only_gguf(path, arch: str, **fields):
    """A GGUF of one architecture with these metadata fields (GGUFWriter.add_NAME(value)) and a tiny
    token embedding: enough for the torch target to read its header."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    for name, value in fields.items():
        getattr(writer, f"add_{name}")(value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_architecture(tmp_path):
    path = header_only_gguf(tmp_path / "gemma.gguf", "gemma")
    with pytest.raises(OndeviceError, match="'gemma' is not supported .*--target-backend llama"):
        TorchTarget.from_gguf(path)


def test_a_gguf_missing_a_required_field_is_one_line(tmp_path):
    path = header_only_gguf(tmp_path / "partial.gguf", "qwen2", embedding_length=4, head_count=1,
                            feed_forward_length=8)  # no layer_norm_rms_epsilon
    with pytest.raises(OndeviceError, match="lacks the metadata field 'qwen2.attention.layer_norm_rms_epsilon'"):
        TorchTarget.from_gguf(path)


# --- numerics ---------------------------------------------------------------------------------------


def test_top2_margin():
    row = np.random.default_rng(16).standard_normal(1000)
    ordered = np.sort(row)
    assert top2_margin(row) == pytest.approx(ordered[-1] - ordered[-2])


def test_measure_batch_noise_fp32_is_tiny_and_keeps_the_cache(tiny):
    target = fp32_target(tiny["qwen2"][0])
    target.prefill(random_tokens(10, 17))
    noise = measure_batch_noise(target, random_tokens(20, 18))
    assert target.n_cached == 10
    assert noise["n_tokens"] == 20 and noise["argmax_flips"] == 0
    assert 0 <= noise["max_gap_delta"] < 1e-3 and noise["max_logit_delta"] < 1e-3


def test_batch_noise_by_size_against_one_token_passes(tiny):
    target = fp32_target(tiny["qwen2"][0])
    target.prefill(random_tokens(10, 17))
    by_size = batch_noise_by_size(target, random_tokens(20, 18), [1, 3, 20])
    assert target.n_cached == 10
    assert by_size[1]["max_logit_delta"] == 0  # the very same passes again: deterministic
    assert all(by_size[n]["n_tokens"] == 20 and by_size[n]["max_logit_delta"] < 1e-3 for n in (3, 20))


def test_the_target_alones_one_token_rows_are_the_noise_measurements_own(tiny):
    """Decoding through OneTokenRows yields the greedy reference, and pass_noise given its rows
    measures what it measures when it feeds the tokens one at a time itself."""
    target = fp32_target(tiny["qwen2"][0])
    prompt = random_tokens(8, 20)
    alone = greedy_reference(target, prompt, 16)
    rows = OneTokenRows(target, keep=9)
    assert greedy_reference(rows, prompt, 16) == alone and len(rows.rows) == 9
    target.truncate(0)
    target.prefill(prompt[:-1])
    assert np.array_equal(np.stack(rows.rows), logits_one_by_one(target, [prompt[-1]] + alone[:8]))
    sizes = [2, 5]
    assert pass_noise(target, prompt, alone[:8], sizes, np.stack(rows.rows)) == pass_noise(target, prompt, alone[:8], sizes)
    with pytest.raises(ValueError, match="9 one-token rows for 8 tokens"):
        pass_noise(target, prompt, alone[:7], sizes, np.stack(rows.rows))


def test_greedy_misses_tells_near_ties_from_misses(tiny):
    """The target's own greedy answer passes; a planted runner-up token is a miss above the noise and
    a near-tie below it."""
    target = fp32_target(tiny["qwen2"][0])
    prompt = random_tokens(8, 19)
    out = greedy_reference(target, prompt, 12)
    assert greedy_misses(target, prompt, out, noise=0.0) == ([], [])
    target.truncate(0)
    target.prefill(prompt[:-1])
    logits = logits_one_by_one(target, [prompt[-1]] + out[:-1])
    j = int(np.argmax([top2_margin(row) for row in logits]))
    margin = top2_margin(logits[j])
    planted = out[:j] + [int(np.argsort(logits[j])[-2])] + out[j + 1 :]
    assert greedy_misses(target, prompt, planted, noise=margin / 2)[1][0] == j
    assert j in greedy_misses(target, prompt, planted, noise=margin * 2)[0]


# --- the same code on a GPU -------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tree_matches_llama_cpp(tiny):
    prompt = random_tokens(12, seed=19)
    tree = branching_tree(prompt[-1], seed=20)
    target = TorchTarget.from_gguf(tiny["llama"][0], device="cuda", dtype=torch.float32, n_ctx=64)
    target.prefill(prompt[:-1])
    logits = target.forward_tree(tree)
    target.commit(tree.path_to(8))
    reference = llama_cpp_logits if importlib.util.find_spec("llama_cpp") else cpu_fp32_logits
    for leaf in tree.leaves():
        path = tree.path_to(leaf)
        ref = reference(tiny["llama"][0], prompt[:-1] + tree.tokens[path].tolist())[len(prompt) - 1 :]
        np.testing.assert_allclose(logits[path], ref, atol=1e-3, rtol=0)  # TF32 / GPU reductions


def cpu_fp32_logits(gguf_path, tokens) -> np.ndarray:
    """The reference where llama.cpp is not installed (the GPU machine): the same code on the CPU in
    fp32, one chain pass, which the CPU tests above hold to llama.cpp within ATOL."""
    return logits_as_chain(fp32_target(gguf_path), tokens)
