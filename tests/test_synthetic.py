"""Synthetic models against independent references.

- The Q4_K_M mix: the per-tensor types llama.cpp's quantizer gave the real default pair's files.
- Random blocks: decoded by gguf's own numpy dequantizer, finite, centred, of the chosen spread.
- Tiny synthetic GGUFs (every block type the mix uses): llama.cpp loads them, our torch target
  loads them, and their logits agree within the tolerance measured on the real 1.5B file
  (`REAL_FILE_TOLERANCE`, see below).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from ondevice.errors import OndeviceError
from ondevice.files.architecture import SUPPORTED_ARCHS
from ondevice.loading.options import LoadOptions
from ondevice.catalog import hub
from ondevice.synthetic.blocks import generator, pack_k_scales, random_blocks
from ondevice.synthetic.cache import load_measurement
from ondevice.synthetic.measure import measure, models_dir
from ondevice.synthetic.quant_mix import file_bytes, preset_tensors
from ondevice.synthetic.shapes import PRESETS, ModelShape
from ondevice.synthetic.sources import from_preset, matching_preset, resolve, tensors_of_gguf
from ondevice.synthetic.writer import write_synthetic_gguf
from ondevice.machine.facts import machine_facts
from ondevice.targets import weights
from ondevice.targets.torch_target import TorchTarget
from ondevice.decode.tree import DraftTree
from test_torch_target import llama_cpp_logits

# Torch fp32 vs llama.cpp on the same quantized GGUF differ because llama.cpp quantizes the
# activations (Q8_K / Q8_0) for its dot products. On the real Qwen2.5-Coder-1.5B Q4_K_M file the
# largest |Δlogit| is this fraction of the largest |logit| (test_real_file_tolerance measures it).
REAL_FILE_TOLERANCE = 0.05


def tiny_shape(arch: str, tied: bool = False) -> ModelShape:
    """2 layers, width 256 (one K-quant block per row); an FFN of 320 makes ffn_down fall back to
    Q5_0 / Q8_0, so the file holds Q4_K, Q6_K, Q5_0, Q8_0 and F32 tensors."""
    return ModelShape(f"tiny-{arch}", arch, 2, 256, 320, 4, 2, 64, 512, tied=tied, rope_factor=8.0 if arch == "llama" else None)


def random_tokens(n: int, seed: int, vocab: int = 511) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


# --- the mix -----------------------------------------------------------------------------------------


def test_q4_k_m_mix_is_the_real_files(real_pair):
    for path, preset in ((real_pair.target, "qwen2.5-coder-1.5b"), (real_pair.drafter, "qwen2.5-0.5b")):
        assert tuple(preset_tensors(PRESETS[preset])) == tensors_of_gguf(path)


def test_real_files_are_named_by_their_preset(real_pair):
    assert [m.shape.name for m in resolve("qwen2.5-coder-1.5b")] == ["qwen2.5-coder-1.5b", "qwen2.5-0.5b"]
    assert resolve("qwen2.5-coder-1.5b")[0].real_file == real_pair.target
    assert matching_preset(dataclasses.replace(PRESETS["qwen3-8b"], name="x")) == "qwen3-8b"


def test_a_file_in_another_quant_is_not_measured_as_the_preset(tmp_path, monkeypatch):
    """Same shape as a preset, other types (all Q8_0): its own name, so its curve never stands in for the preset's."""
    monkeypatch.setitem(PRESETS, "tiny-qwen2", tiny_shape("qwen2"))
    same = write_synthetic_gguf(tiny_shape("qwen2"), tmp_path / "same.gguf", show=False)
    other = write_synthetic_gguf(dataclasses.replace(tiny_shape("qwen2"), quant="Q8_0"), tmp_path / "q8.gguf", show=False)
    assert resolve(str(same))[0].shape.name == "tiny-qwen2"
    (model,) = resolve(str(other))
    assert model.shape.name == "q8" and {t.qtype for t in model.tensors} == {QT.Q8_0, QT.F32}


def test_the_mix_has_every_type_of_the_rule():
    types = {t.name: t.qtype for t in preset_tensors(PRESETS["llama-3.3-70b"])}
    assert types["output.weight"] == QT.Q6_K and types["token_embd.weight"] == QT.Q4_K
    v = [t.qtype for t in preset_tensors(PRESETS["llama-3.3-70b"]) if t.name.endswith("attn_v.weight")]
    assert set(v) == {QT.Q5_K, QT.Q6_K}  # a 70B: the attn_v that get no Q6_K get Q5_K
    down = {t.qtype for t in preset_tensors(PRESETS["qwen2.5-72b"]) if t.name.endswith("ffn_down.weight")}
    assert down == {QT.Q5_0, QT.Q8_0}  # 29,568 columns: not a multiple of 256
    tied = preset_tensors(PRESETS["llama-3.2-1b"])
    assert "output.weight" not in {t.name for t in tied} and tied[0].qtype == QT.Q6_K  # the embedding is the head
    assert {t.qtype for t in preset_tensors(PRESETS["qwen3-0.6b"])} == {QT.Q8_0, QT.F32}  # a Q8_0 file


def test_every_catalog_model_has_a_preset_of_its_published_size():
    """The mix's tensor bytes + the header (vocabulary, template: a few MB) = the size the hub lists."""
    from ondevice.catalog.pairs import list_pairs

    for pair in list_pairs():
        for model in (pair.target, pair.drafter):
            size = model.size or model.approx_size
            tensors = file_bytes(preset_tensors(PRESETS[model.shape]))
            assert 0 <= size - tensors < 16e6, (pair.name, model.label, size, tensors)


# --- blocks ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0, QT.Q5_0, QT.Q5_1, QT.F16, QT.F32])
def test_random_blocks_decode_to_finite_centred_weights_of_the_chosen_spread(qtype):
    raw = random_blocks(qtype, 256 * 2048, generator(0, int(qtype)), 0.02)
    if qtype in (QT.F16, QT.F32):
        w = raw.view(np.float16 if qtype == QT.F16 else np.float32).astype(np.float64)
    else:
        w = dequantize(raw, qtype).astype(np.float64).reshape(-1)
    assert np.isfinite(w).all() and w.size == 256 * 2048
    assert w.std() == pytest.approx(0.02, rel=0.03)
    assert abs(w.mean()) < 0.05 * w.std()


def test_k_scales_pack_as_gguf_reads_them():
    """A Q4_K block with known scales and mins decodes to d·sc·q − dmin·m in each sub-block."""
    rng = np.random.default_rng(1)
    sc, m = rng.integers(0, 64, (1, 8)).astype(np.uint8), rng.integers(0, 64, (1, 8)).astype(np.uint8)
    q = np.full(256, 5, dtype=np.uint8)  # every 4-bit code is 5
    block = np.concatenate([np.array([0.5, 0.25], dtype="<f2").view(np.uint8), pack_k_scales(sc, m)[0], (q[:128] | (q[128:] << 4))])
    w = dequantize(block, QT.Q4_K).reshape(8, 32)
    np.testing.assert_array_equal(w[:, 0], 0.5 * sc[0] * 5 - 0.25 * m[0])


def test_same_seed_same_file_other_seed_other_weights(tmp_path):
    shape = tiny_shape("qwen2")
    digest = [hashlib.sha256(write_synthetic_gguf(shape, tmp_path / f"{i}.gguf", seed=s, show=False).read_bytes()).hexdigest()
              for i, s in enumerate((3, 3, 4))]  # fmt: skip
    assert digest[0] == digest[1] != digest[2]


def test_not_enough_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda _: type("Usage", (), {"free": 10 << 20})())
    with pytest.raises(OndeviceError, match="not enough disk space") as info:
        write_synthetic_gguf(PRESETS["qwen2.5-72b"], tmp_path / "big.gguf", show=False)
    assert "\n" not in str(info.value) and list(tmp_path.iterdir()) == []


# --- tiny synthetic models in both backends ------------------------------------------------------------


@pytest.mark.parametrize("arch,tied", [("qwen2", False), ("llama", False), ("llama", True), ("qwen3", True)])
def test_tiny_synthetic_gguf_runs_in_llama_cpp_and_torch_alike(tmp_path, arch, tied):
    shape = tiny_shape(arch, tied)
    path = write_synthetic_gguf(shape, tmp_path / "tiny.gguf", seed=5, show=False)
    assert {t.qtype for t in tensors_of_gguf(path)} == {QT.F32, QT.Q4_K, QT.Q6_K, QT.Q5_0, QT.Q8_0}
    tokens = random_tokens(40, seed=6)
    ref = llama_cpp_logits(path, tokens)[10:]
    assert np.isfinite(ref).all() and ref.std() > 1.0  # random, not degenerate
    if arch not in SUPPORTED_ARCHS:
        pytest.skip(f"the torch target does not read {arch} yet")
    target = TorchTarget.from_gguf(path, dtype=torch.float32, n_ctx=64)
    target.prefill(tokens[:10])
    ours = target.forward_tree(DraftTree.chain(tokens[10], tokens[11:]))
    assert np.abs(ours - ref).max() < REAL_FILE_TOLERANCE * np.abs(ref).max()


@pytest.mark.real
def test_real_file_tolerance(real_pair):
    """The tolerance above, measured: torch fp32 vs llama.cpp on the real 1.5B target."""
    tokens = random_tokens(24, seed=7, vocab=32000)
    ref = llama_cpp_logits(real_pair.target, tokens)[8:]
    target = TorchTarget.from_gguf(real_pair.target, dtype=torch.float32, n_ctx=64)
    target.prefill(tokens[:8])
    ours = target.forward_tree(DraftTree.chain(tokens[8], tokens[9:]))
    ratio = np.abs(ours - ref).max() / np.abs(ref).max()
    print(f"real file: max |Δlogit| = {np.abs(ours - ref).max():.3f}, max |logit| = {np.abs(ref).max():.1f}, ratio {ratio:.4f}")
    assert ratio < REAL_FILE_TOLERANCE


# --- measuring ----------------------------------------------------------------------------------------


def test_measure_caches_the_curve_and_removes_the_file(tmp_path, monkeypatch):
    from test_synthetic_busy import QuietMeter

    from ondevice.plan import timing

    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    monkeypatch.setattr(timing, "CpuMeter", QuietMeter)  # a busy machine caches nothing (tests/test_synthetic_busy.py)
    model = from_preset(tiny_shape("qwen2"))
    m = measure(model, LoadOptions(target_backend="llama", ctx=128), ns=(1, 2, 4), show=False)
    assert m.curve.ns == (1, 2, 4) and all(t > 0 for t in m.curve.seconds)
    assert m.traffic.bytes_per_pass == sum(t.nbytes for t in model.tensors if t.name != "token_embd.weight")
    assert list(models_dir().iterdir()) == []  # not kept
    cached = load_measurement(machine_facts().fingerprint(), "tiny-qwen2", "target", m.backend)
    assert cached is not None and cached.curve == m.curve and cached.traffic == m.traffic
    drafter = measure(from_preset(tiny_shape("qwen2"), "drafter"), LoadOptions(ctx=128, ram_memory="1GB"), show=False, keep=True)
    assert drafter.curve.ns == (1, 2, 4, 8, 16, 32, 64, 128)
    assert load_measurement(machine_facts().fingerprint(), "tiny-qwen2", "drafter", drafter.backend) is not None  # as forecasts look it up
    assert [p.name for p in models_dir().iterdir()] == ["tiny-qwen2-seed0.gguf"]  # kept, reused next time


def test_disk_tier_reports_the_bytes_read_from_disk_per_pass(tmp_path, monkeypatch):
    """torch target under a CPU budget for 2 of 8 layers and a RAM budget for 2 more: 4 layers are
    read from the file on every pass, and the bandwidth compared is the disk's."""
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    model = from_preset(ModelShape("tiny8", "qwen2", 8, 256, 512, 4, 2, 64, 512))
    layer = [sum(t.nbytes for t in model.tensors if t.name.startswith(f"blk.{i}.")) for i in range(8)]
    opts = LoadOptions(target_backend="torch", gpu_memory="18MB", ram_memory="1500KB", ctx=256)
    m = measure(model, opts, ns=(1, 4), show=False)
    assert m.placement.startswith("8 layers: 2 on CPU, 2 streamed from RAM, 4 from disk")
    assert m.traffic.source == "disk" and m.traffic.reference == "disk read" and m.traffic.reference_gbps > 0
    assert 4 * min(layer) <= m.traffic.bytes_per_pass <= 4 * max(layer) and m.budgets == "gpu 18MB, ram 1500KB"


def test_what_would_not_fit_is_refused_before_it_is_written(tmp_path, monkeypatch):
    from ondevice.loading import plan as load_plan
    from ondevice.machine.ram import RamBudget
    from ondevice.synthetic import measure as measure_module

    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    monkeypatch.setattr(measure_module.psutil, "virtual_memory", lambda: type("Memory", (), {"available": 3 << 30, "total": 24 << 30})())
    with pytest.raises(OndeviceError, match="qwen2.5-7b needs 30 GB of RAM as the torch target runs it") as info:
        measure(from_preset(PRESETS["qwen2.5-7b"]), LoadOptions(target_backend="torch"), show=False)  # fp32 on a CPU
    assert "--ram-memory" in str(info.value)
    monkeypatch.setattr(load_plan, "ram_budget", lambda: RamBudget(300 << 20, "test"))  # not even room to stream
    with pytest.raises(OndeviceError, match="qwen2.5-7b would page heavily here"):
        measure(from_preset(PRESETS["qwen2.5-7b"]), LoadOptions(target_backend="llama"), show=False)
    assert not models_dir().exists()


def test_a_llama_target_that_does_not_fit_streams_as_the_memory_plan_says(tmp_path, monkeypatch):
    """Under a --ram-memory budget below what the model needs in RAM, the memory plan streams the
    target from disk: the bench measures it so and reports the plan's bytes read per pass."""
    from ondevice.loading.memory import MARGIN
    from ondevice.synthetic.measure import memory_plan

    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    model = from_preset(ModelShape("mid8", "qwen2", 8, 1024, 4096, 8, 2, 128, 512))  # 74 MB: weights outweigh buffers
    in_ram = memory_plan(model, LoadOptions(target_backend="llama", ctx=256))
    budget = in_ram.resident_bytes + in_ram.target.working_bytes // 2 + MARGIN  # room for half the weights: they stream
    opts = LoadOptions(target_backend="llama", ctx=256, ram_memory=str(budget))
    plan = memory_plan(model, opts)
    assert plan.streams and plan.cache_room >= plan.target.streamed_window
    m = measure(model, opts, ns=(1, 4), show=False)
    assert m.traffic.source == "disk" and m.traffic.bytes_per_pass == plan.bytes_read_per_pass > 0
    assert m.placement.startswith("target streams from disk")
    kept = [k for k in plan.kept_layers(plan.ahead) if isinstance(k, int)]
    assert m.memory["kept_layers"] == len(kept) < 8 and m.memory["predicted_bytes_read_per_pass"] == plan.bytes_read_per_pass
    assert m.per_pass["ns"] == [1, 4] and len(m.per_pass["read_bytes"]) == 2  # what each pass read, measured beside the plan
    if m.read_bytes_per_pass is not None:  # /proc/self/io (Linux): the streamed layers come from the disk again each pass
        assert 0.5 * plan.bytes_read_per_pass <= m.read_bytes_per_pass <= 2 * plan.bytes_read_per_pass


def test_pass_meter_counts_each_pass_alone_per_size():
    """A fake target whose forward_tree reads 100 bytes a token and keeps the disk busy 0.5 s of
    each 1 s pass; its prefill (not a pass) reads 10,000 bytes that no pass may be charged."""
    from ondevice.synthetic.pass_meter import PassMeter

    clock = {"seconds": 0.0, "read": 0, "busy": 0.0}

    class Target:
        n_cached = 7

        def prefill(self, tokens):
            clock["read"] += 10_000

        def forward_tree(self, tree):
            clock["seconds"] += 1.0
            clock["read"] += 100 * len(tree)
            clock["busy"] += 0.5
            return len(tree)

    counters = {"seconds": lambda: clock["seconds"], "read_bytes": lambda: clock["read"], "disk_busy_seconds": lambda: clock["busy"]}
    meter = PassMeter(Target(), counters)
    meter.prefill([1, 2])
    for n in (4, 1, 4, 1):
        assert meter.forward_tree(DraftTree.chain(0, list(range(1, n)))) == n
    assert meter.n_cached == 7  # everything else is the target's
    assert meter.summary() == {"ns": [1, 4], "seconds": [1.0, 1.0], "read_bytes": [100, 400],
                               "disk_busy_seconds": [0.5, 0.5], "disk_utilization": [0.5, 0.5]}  # fmt: skip
    unknown = PassMeter(Target(), {"read_bytes": lambda: None})  # where the kernel does not say
    unknown.forward_tree(DraftTree.chain(0, []))
    assert unknown.summary() == {"ns": [1], "read_bytes": [None]}


def test_a_measurement_in_a_memory_cgroup_is_kept_apart_from_one_in_ram(monkeypatch):
    """Streamed under a 3.5 GB cgroup limit, a 7B's curve is not its curve in RAM: the cgroup's limit
    is part of its budgets (and so of its cache file); --ram-memory, when given, names the budget."""
    from ondevice.machine.ram import CgroupMemory
    from ondevice.synthetic import measure as measure_module
    from ondevice.synthetic.measure import budgets_label

    memory = type("Memory", (), {"total": 24 << 30, "available": 20 << 30})()
    monkeypatch.setattr(measure_module.psutil, "virtual_memory", lambda: memory)
    monkeypatch.setattr(measure_module, "own_cgroup_memory", lambda: CgroupMemory(None, 1, 3_500_000_000, 0, 0))
    assert budgets_label(LoadOptions()) == "cgroup 3.5 GB"
    assert budgets_label(LoadOptions(ram_memory="2GB", gpu_memory="6GB")) == "gpu 6GB, ram 2GB"
    monkeypatch.setattr(measure_module, "own_cgroup_memory", lambda: CgroupMemory(None, 1, 64 << 30, 0, 0))  # above the RAM: no limit
    assert budgets_label(LoadOptions()) == ""


def test_cli_synthetic_twin_of_a_file_as_json(tmp_path):
    source = write_synthetic_gguf(tiny_shape("llama"), tmp_path / "mine.gguf", seed=9, show=False)
    env_home = tmp_path / "home"
    result = subprocess.run(
        [sys.executable, "-m", "ondevice", "bench", "--synthetic", str(source), "--budgets", "1,2", "--json",
         "--target-backend", "llama", "--ctx", "128"],
        capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "ONDEVICE_HOME": str(env_home)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)["measurements"][0]
    assert record["shape"] == "mine" and record["curve"]["ns"] == [1, 2] and record["role"] == "target"
    curves = env_home / "synthetic" / "curves"
    assert len(list(curves.iterdir()) if curves.exists() else []) == (1 if record["cached"] else 0)  # not if the machine was busy


def test_cli_unknown_shape_is_one_line_error():
    result = subprocess.run([sys.executable, "-m", "ondevice", "bench", "--synthetic", "gpt-5"], capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "gpt-5" in result.stderr and "qwen2.5-72b" in result.stderr


# --- the GPU path (skipped without CUDA) -----------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_synthetic_target_streams_from_pinned_ram_to_the_gpu(tmp_path, monkeypatch):
    """Under a --gpu-memory budget that holds 2 of 8 layers, the other 6 stream each pass: the bytes
    per pass are theirs, and both bandwidths (pinned peak, streamer's copy rate) are measured.
    Where Triton decodes every tensor, kept layers stay encoded: the budget counts them as moved."""
    from ondevice.offload.encoded import decodes_fast
    from ondevice.decode.protocols import MAX_BUDGET
    from ondevice.targets.offloaded import plan_offload

    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    shape = ModelShape("small-qwen2", "qwen2", 8, 512, 1024, 8, 2, 64, 4096)
    path = write_synthetic_gguf(shape, tmp_path / "small.gguf", show=False)
    plan = plan_offload(path, torch.device("cuda"), torch.bfloat16, 256, "100GB", None, max_tree=MAX_BUDGET)
    decoded = [plan.layouts[i].decoded_bytes for i in range(8)]
    moved = [plan.layouts[i].nbytes for i in range(8)]
    encoded = decodes_fast(plan.layouts, "cuda")
    kept = moved if encoded else decoded
    budget = plan.resident_bytes + 2 * max(moved) + max(decoded) + 2 * max(kept) + min(kept) // 2  # floor + 2 layers
    (model,) = resolve(str(path))
    m = measure(model, LoadOptions(target_backend="torch", gpu_memory=str(budget), ctx=256), ns=(1, 16, 256), show=False)
    on_gpu = "2 kept encoded on GPU" if encoded else "2 on GPU"
    assert m.traffic.source == "pinned RAM → GPU" and f"{on_gpu}, 6 streamed from RAM" in m.placement, m.placement
    assert 6 * min(moved) <= m.traffic.bytes_per_pass <= 6 * max(moved)
    assert m.traffic.reference_gbps > 0 and m.traffic.copy_gbps > 0
