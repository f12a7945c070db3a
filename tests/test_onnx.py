"""ONNX Runtime backend on tiny models written here: the GGUF → MatMulNBits mapping, the exported
decoder against our torch model and llama.cpp, the ONNX target and drafter, VocabTrim, the
fast-kernel check and the export cache.

Tolerances (logits of the same GGUF, torch fp32 as the reference):
- accuracy level 0 (float32 activations): the weights are the GGUF's exactly (nbits.py), only the
  order of float additions differs: 1e-4 of the logits' scale.
- accuracy level 4 (what runs: int8 activations per block of 32, int32 sums, like llama.cpp's Q8
  activations): the deviation must stay within twice llama.cpp's own deviation from torch on the
  same file. That is the independent reference: both quantize activations to 8 bits.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT, quants
from onnx import TensorProto

import tiny_models
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.draft.onnx_drafter import OnnxDrafter
from ondevice.decode.engine import SpecEngine
from ondevice.decode.stats import collect
from ondevice.errors import OndeviceError
from ondevice.onnx import export as ex, export_files
from ondevice.onnx.graph import GraphBuilder, model
from ondevice.onnx.nbits import NBITS_LAYOUT, gguf_to_nbits, requantize_4bit
from ondevice.onnx.session import FALLBACK_RATIO, NBitsConfig, check_fast_kernels, kernel_ratio, nbits_configs
from ondevice.decode.protocols import DraftSpec
from ondevice.vocabtrim import build as vt
from ondevice.targets.llama_target import LlamaTarget
from ondevice.onnx.target import OnnxTarget
from ondevice.targets.torch_target import TorchTarget
from ondevice.decode.tree import DraftTree
from tiny_models import write_tiny_gguf
from tiny_quant import QUANT_DIMS, q4_k_m_mix

TREE = DraftTree(np.array([7, 8, 9, 10, 11, 12]), np.array([-1, 0, 0, 1, 2, 2]), np.zeros(6))
PROMPT = list(range(3, 60, 3))


def random_blocks(qtype: QT, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random bytes of n·k weights of `qtype`, with every f16 scale field set to a small number."""
    from gguf import GGML_QUANT_SIZES

    f16_fields = {QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208]}.get(qtype, [0])
    elems, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n * k // elems, size), dtype=np.uint8)
    for at in f16_fields:
        raw[:, at : at + 2] = (rng.uniform(0.5, 1.5, len(raw)) * 0.01).astype(np.float16).reshape(-1, 1).view(np.uint8)
    return raw.reshape(-1)


@pytest.fixture
def quant_dims(monkeypatch):
    for key, value in QUANT_DIMS.items():
        monkeypatch.setitem(tiny_models.DIMS, key, value)


def logits_of(target, prompt=PROMPT, tree=TREE) -> np.ndarray:
    target.prefill(prompt)
    return target.forward_tree(tree)


# --- the weight mapping ---------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", list(NBITS_LAYOUT))
def test_nbits_codes_and_scales_are_the_gguf_weights_exactly(qtype):
    n, k = 6, 512
    raw = random_blocks(qtype, n, k)
    reference = quants.dequantize(raw.reshape(n, -1), qtype)  # gguf-py's own dequantizer
    np.testing.assert_array_equal(gguf_to_nbits(raw, qtype, n, k).dequantize(), reference)
    rows = np.array([4, 0, 5])
    np.testing.assert_array_equal(gguf_to_nbits(raw, qtype, n, k, rows=rows).dequantize(), reference[rows])


@pytest.mark.parametrize("qtype", list(NBITS_LAYOUT))
def test_matmul_nbits_node_computes_x_times_the_gguf_matrix(qtype, tmp_path):
    """ONNX Runtime's kernel (float32 activations) on our codes, correction included, = x·Wᵀ."""
    import onnxruntime as ort
    from onnx import helper

    n, k = 48, 512
    raw = random_blocks(qtype, n, k, seed=1)
    w = quants.dequantize(raw.reshape(n, -1), qtype)
    g = GraphBuilder(lambda name, a: __import__("onnx").numpy_helper.from_array(a, name), accuracy_level=0)
    g.linear("x", gguf_to_nbits(raw, qtype, n, k), "w")
    g.nodes[-1].output[0] = "y"
    io = lambda name, dim: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, "T", dim])  # noqa: E731
    graph = helper.make_graph(g.nodes, "one", [io("x", k)], [io("y", n)], g.initializers)
    session = ort.InferenceSession(model(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((1, 3, k), dtype=np.float32)
    y = session.run(None, {"x": x})[0]
    want = x[0].astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(y[0], want, atol=1e-4 * np.abs(want).max())


def test_4bit_requantization_is_llama_cpp_q4_0():
    """The drafter's optional 4-bit copy: the codes gguf-py's Q4_0 quantizer writes for the same weights."""
    n, k = 8, 256
    w8 = gguf_to_nbits(random_blocks(QT.Q8_0, n, k, seed=3), QT.Q8_0, n, k)
    w4 = requantize_4bit(w8)
    x = w8.dequantize()
    want = gguf_to_nbits(quants.quantize(x, QT.Q4_0).reshape(-1), QT.Q4_0, n, k)
    np.testing.assert_array_equal(w4.codes, want.codes)
    np.testing.assert_allclose(w4.scales, want.scales, rtol=1e-3)  # Q4_0 stores d as f16
    error = np.abs(w4.dequantize() - x).reshape(n, -1, 32).max(-1)
    assert np.all(error <= np.abs(w4.scales) * 1.0001)  # half a step, or one where +8 clips to +7


# --- the decoder against torch and llama.cpp --------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_float_model_logits_match_torch_on_a_tree(arch, tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf", arch=arch)
    want = logits_of(TorchTarget.from_gguf(path, n_ctx=128))
    got = logits_of(OnnxTarget.from_gguf(path, n_ctx=128, threads=1, accuracy_level=ex.ACCURACY_FP32, show=False))
    np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_quantized_model_logits_match_torch(arch, tmp_path, quant_dims):
    """Q4_K (with the min correction), Q6_K, Q8_0 and Q5_0 tensors; see the module docstring."""
    path = write_tiny_gguf(tmp_path / "q.gguf", arch=arch, quantize=q4_k_m_mix, head_scale=4.0)
    want = logits_of(TorchTarget.from_gguf(path, n_ctx=128))
    exact = logits_of(OnnxTarget.from_gguf(path, n_ctx=128, threads=1, accuracy_level=ex.ACCURACY_FP32, show=False))
    np.testing.assert_allclose(exact, want, atol=1e-4 * np.abs(want).max())
    int8 = logits_of(OnnxTarget.from_gguf(path, n_ctx=128, threads=1, show=False))
    llama = logits_of(LlamaTarget(path, n_ctx=128, threads=1))
    assert np.abs(int8 - want).max() <= 2 * np.abs(llama - want).max()


# --- the target and drafter protocols ----------------------------------------------------------------


def test_onnx_target_decodes_greedily_like_the_torch_target(tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf", arch="llama", head_scale=4.0)
    torch_target = TorchTarget.from_gguf(path, n_ctx=256)
    onnx_target = OnnxTarget.from_gguf(path, n_ctx=256, threads=1, accuracy_level=ex.ACCURACY_FP32, show=False)
    outputs = []
    for target in (torch_target, onnx_target):
        engine = SpecEngine(target, None, lambda t: False)
        outputs.append(collect(engine.generate(PROMPT, 40))[0])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 40


def test_onnx_drafter_grows_the_trees_of_the_llama_drafter(tmp_path):
    """Same float model, same builders: the same trees, round after round (accepted nodes reused)."""
    path = write_tiny_gguf(tmp_path / "t.gguf", arch="llama", head_scale=4.0)
    onnx_drafter = OnnxDrafter(path, n_ctx=256, threads=1, accuracy_level=ex.ACCURACY_FP32, show=False)
    llama_drafter = LlamaDrafter(path, n_ctx=256, threads=1)
    context = PROMPT[:6]
    for spec in [DraftSpec("chain", 6), DraftSpec("best-first", 12), DraftSpec("multi-seq", 8), DraftSpec("best-first", 40)] * 2:
        a, b = onnx_drafter.draft(context, spec), llama_drafter.draft(context, spec)
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
        context = context + a.tokens[a.path_to(len(a) - 1)[1:3]].tolist() + [5]  # accept a little, then diverge
    onnx_drafter.probe_batch(32)  # the profile's probe leaves the cache usable
    assert onnx_drafter.draft(context, DraftSpec("chain", 4)).tokens.tolist() == llama_drafter.draft(context, DraftSpec("chain", 4)).tokens.tolist()


def test_vocab_trim_onnx_drafter_drafts_only_kept_ids_like_llama(tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf", arch="llama", head_scale=4.0)
    keep = np.unique(np.concatenate([np.arange(0, 320, 3), np.arange(97, 123), [319]]))  # letters: some merges survive
    vt.build_trimmed(path, keep, "test: every third id")
    onnx_drafter = OnnxDrafter(path, n_ctx=256, threads=1, vocab_trim=True, accuracy_level=ex.ACCURACY_FP32, show=False)
    llama_drafter = LlamaDrafter(path, n_ctx=256, threads=1, vocab_trim=True)
    assert onnx_drafter.vocab_trimmed and llama_drafter.vocab_trimmed
    for spec in [DraftSpec("best-first", 16), DraftSpec("chain", 5)]:
        a, b = onnx_drafter.draft(PROMPT, spec), llama_drafter.draft(PROMPT, spec)
        assert a.tokens.tolist() == b.tokens.tolist() and set(a.tokens[1:].tolist()) <= set(keep.tolist())


def test_greedy_speculation_with_onnx_target_and_drafter_equals_the_target_alone(tmp_path, quant_dims):
    path = write_tiny_gguf(tmp_path / "q.gguf", arch="qwen2", quantize=q4_k_m_mix, head_scale=4.0)
    target = OnnxTarget.from_gguf(path, n_ctx=512, threads=1, show=False)
    drafter = OnnxDrafter(path, n_ctx=512, threads=1, show=False)
    alone = SpecEngine(target, None, lambda t: False)
    reference = collect(alone.generate(PROMPT, 48))[0]
    for spec in (DraftSpec("chain", 4), DraftSpec("best-first", 16)):
        engine = SpecEngine(target, drafter, lambda t: False)
        got = collect(engine.generate(PROMPT, 48, spec=spec))[0]
        assert got == reference  # a tiny model has no near-ties at these margins; the real pair's test allows them


# --- fast kernels and the cache --------------------------------------------------------------------


def test_exported_graph_runs_only_fast_kernels(tmp_path, quant_dims):
    path = write_tiny_gguf(tmp_path / "q.gguf", arch="qwen2", quantize=q4_k_m_mix)
    export = ex.ensure_export(path, show=False)
    configs = nbits_configs(export.body) | nbits_configs(export.head)
    assert {(c.bits, c.block) for c in configs} == {(4, 32), (8, 32), (8, 16)}
    assert all(c.accuracy_level == ex.ACCURACY_INT8 and c.zero_point_type is None for c in configs)
    ratios = check_fast_kernels([export.body, export.head], threads=1)
    assert set(ratios) == configs
    drafter = ex.ensure_export(path, show=False, int4_block=32)  # the ONNX drafter's: 4-bit everywhere
    assert {(c.bits, c.block) for c in nbits_configs(drafter.body) | nbits_configs(drafter.head)} == {(4, 32)}


def test_the_check_catches_the_dequantize_everything_fallback():
    """Float zero points send MatMulNBits to its fallback: measured here, not assumed."""
    assert kernel_ratio(NBitsConfig(4, 32, 4, TensorProto.FLOAT), size=2048, repeats=3, threads=1) > FALLBACK_RATIO
    assert kernel_ratio(NBitsConfig(4, 32, 4), size=2048, repeats=3, threads=1) < FALLBACK_RATIO


def test_an_export_whose_kernels_fall_back_is_refused(tmp_path, monkeypatch, quant_dims):
    """The build times its kernels once (manifest); a CPU where one falls back gets a clear error, every load."""
    path = write_tiny_gguf(tmp_path / "q.gguf", arch="qwen2", quantize=q4_k_m_mix)
    monkeypatch.setattr(ex, "kernel_ratios", lambda paths: {NBitsConfig(8, 16, 4): 30.0, NBitsConfig(4, 32, 4): 0.2})
    for _ in range(2):
        with pytest.raises(OndeviceError, match="8-bit block 16.*falls back|falls back.*8-bit block 16"):
            ex.ensure_export(path, show=False)


def test_export_is_built_once_and_rebuilt_when_stale(tmp_path, monkeypatch):
    path = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2")
    first = ex.ensure_export(path, show=False)
    stamp = first.body.stat().st_mtime_ns
    assert ex.ensure_export(path, show=False).body.stat().st_mtime_ns == stamp  # cached
    assert export_files.export_built(path)
    monkeypatch.setattr(export_files, "FORMAT_VERSION", export_files.FORMAT_VERSION + 1)
    assert not export_files.export_built(path)  # what a load short of RAM asks before opening it
    assert ex.ensure_export(path, show=False).body.stat().st_mtime_ns != stamp  # another format: rebuilt
    assert export_files.export_built(path) and not export_files.export_built(path, head_rows=np.arange(8))
    assert first.folder == path.with_name(path.name + ".onnx")


def test_unsupported_weight_type_is_one_clear_error(tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2",
                           quantize=lambda name, w: (quants.quantize(w, QT.Q4_1), QT.Q4_1) if "ffn_up" in name else None)  # fmt: skip
    with pytest.raises(OndeviceError, match="Q4_1"):
        ex.ensure_export(path, show=False)
