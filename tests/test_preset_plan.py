"""The memory plan of a model not downloaded is the loader's plan of its file.

`ondevice models` and `--predict` plan a catalog pair that is not downloaded from its shape preset
(`quant_mix.preset_size`); the loader plans the same model from its GGUF header
(`ModelSize.from_gguf`). The reference here is a real GGUF of the preset's shape written by
`synthetic.writer` and read back through the header reader: the two plans must agree on where the
target lives, which layers stay cached and how many bytes a pass reads, at every RAM budget from
"fits in RAM" down to "over budget". The shapes keep each preset's architecture, layer count
(which the Q4_K_M mix depends on: `use_more_bits`, the 70B rule), tied head and quant, with small
widths so the files take megabytes.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from ondevice.loading.footprint import ModelSize
from ondevice.loading.memory import MARGIN, plan_memory
from ondevice.machine.ram import RamBudget
from ondevice.sizes import format_bytes
from ondevice.synthetic.quant_mix import preset_size
from ondevice.synthetic.shapes import PRESETS, ModelShape
from ondevice.synthetic.writer import write_synthetic_gguf
from ondevice.targets.page_cache import WINDOW_AHEAD

MiB = 1 << 20


def narrow(name: str, dim: int = 256, ffn: int = 512) -> ModelShape:
    """The preset with its layers, architecture, head tying and quant, at a small width."""
    preset = PRESETS[name]
    return dataclasses.replace(preset, name=f"narrow-{name}", dim=dim, ffn=ffn, n_heads=4, n_kv_heads=2, head_dim=64, vocab=1024)


SHAPES = [
    narrow("llama-3.3-70b"),  # 80 layers: the 70B rule (Q5_K attn_v), untied
    narrow("qwen2.5-7b", dim=384, ffn=640),  # rows not whole 256-blocks: Q5_0 / Q8_0 fallbacks; biases
    narrow("qwen3-0.6b"),  # Q8_0, tied head (no output.weight)
    narrow("llama-3.2-1b"),  # tied, Llama RoPE factors tensor
]


def plans(target: ModelSize, drafter: ModelSize, budgets: list[int]) -> list[dict]:
    return [
        plan_memory(target, drafter, n_ctx=512, budget=RamBudget(b, "test"), process_bytes=40 * MiB, ahead=WINDOW_AHEAD).to_dict()
        for b in budgets
    ]


def budgets_for(target: ModelSize, drafter: ModelSize) -> list[int]:
    """From far too little, through streaming with none, some and most layers kept, to all in RAM."""
    streaming = plan_memory(target, drafter, n_ctx=512, budget=RamBudget(1 << 20, "test"), process_bytes=40 * MiB, ahead=WINDOW_AHEAD)
    floor = streaming.resident_bytes + MARGIN
    return [floor // 2, floor + target.streamed_window] + [floor + int(f * target.working_bytes) for f in (0.2, 0.45, 0.7, 0.95, 1.5)] + [1 << 40]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_a_preset_is_planned_as_its_written_file(tmp_path, shape):
    drafter_shape = narrow("qwen2.5-0.5b", dim=384, ffn=640)
    target_file = write_synthetic_gguf(shape, tmp_path / "target.gguf", show=False)
    drafter_file = write_synthetic_gguf(drafter_shape, tmp_path / "drafter.gguf", show=False)
    from_header = ModelSize.from_gguf(target_file), ModelSize.from_gguf(drafter_file)
    from_preset = preset_size(shape, target_file.stat().st_size), preset_size(drafter_shape, drafter_file.stat().st_size)
    assert from_preset[0].layer_bytes == from_header[0].layer_bytes and len(from_preset[0].layer_bytes) == shape.n_layers
    assert (from_preset[0].head_bytes, from_preset[0].embd_bytes) == (from_header[0].head_bytes, from_header[0].embd_bytes)
    budgets = budgets_for(*from_header)
    expected, got = plans(*from_header, budgets), plans(*from_preset, budgets)
    assert got == expected
    placements = [(p["placement"], p["kept_layers"], p["head_kept"]) for p in expected]
    assert ("ram", 0, False) in placements and placements[0][0] == "disk"  # the budgets span both placements
    kept = {p["kept_layers"] for p in expected if p["placement"] == "disk"}
    assert 0 in kept and len(kept) >= 3  # ... and streaming with none, some and most layers cached


def test_a_pair_not_downloaded_keeps_layers_cached(tmp_path, monkeypatch):
    """The case: llama3.3-70b (42 GB) with ~22 GB of RAM; planned without per-layer sizes it
    read the whole file every pass, the loader keeps about half of it cached."""
    from ondevice.catalog.pairs import load_pair
    from ondevice.cli.placement_view import model_size, target_place

    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))  # nothing downloaded
    pair = load_pair("llama3.3-70b")
    target, drafter = model_size(pair.target), model_size(pair.drafter)
    budget = RamBudget(23 << 30, "test")
    plan = plan_memory(target, drafter, budget=budget, process_bytes=100 * MiB, ahead=WINDOW_AHEAD)
    cached = target.working_bytes - plan.bytes_read_per_pass
    assert plan.streams and len(plan.kept_layers(WINDOW_AHEAD)) > 30
    room = plan.cache_room - plan.decode_slack
    assert room - (WINDOW_AHEAD + 1) * max(target.layer_bytes) - max(target.layer_bytes) <= cached <= room
    place = re.fullmatch(r"streams from disk, ([\d.]+) GB per pass", target_place(pair, budget))
    assert place and float(place[1]) * 1e9 < 0.75 * target.file_bytes  # ~20 GB per pass, not 42


def test_a_target_whose_every_layer_is_kept_is_not_said_to_stream(tmp_path, monkeypatch):
    """Just too big for RAM beside its drafter and buffers, the plan streams it but keeps every layer
    and the LM head cached: nothing is read per pass, and the listing must not say it streams."""
    from ondevice.catalog.pairs import load_pair
    from ondevice.cli.placement_view import model_size, target_place

    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))  # nothing downloaded
    pair = load_pair("qwen3-32b")
    target, drafter = model_size(pair.target), model_size(pair.drafter)
    in_ram = plan_memory(target, drafter, budget=RamBudget(64 << 30, "test"), ahead=WINDOW_AHEAD)
    for extra in range(0, 4 << 30, 64 << 20):  # the largest budget below what the target needs in RAM
        budget = RamBudget(target.file_bytes + in_ram.resident_bytes - extra, "test")
        plan = plan_memory(target, drafter, budget=budget, ahead=WINDOW_AHEAD)
        if plan.streams:
            break
    assert plan.streams and plan.bytes_read_per_pass == 0
    assert target_place(pair, budget) == "fits in RAM, mapped (nothing read per pass)"
    while plan.bytes_read_per_pass == 0:  # less room: the first layers that no longer fit stream
        budget = RamBudget(budget.bytes - (64 << 20), "test")
        plan = plan_memory(target, drafter, budget=budget, ahead=WINDOW_AHEAD)
    assert target_place(pair, budget) == f"streams from disk, {format_bytes(plan.bytes_read_per_pass)} per pass"
