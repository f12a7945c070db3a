"""The whole pipeline on a GPU at real shapes, and Hugging Face Accelerate's offload as the baseline.

    python -m ondevice.eval.gpu_pipeline pipeline --target qwen2.5-32b --drafter qwen2.5-0.5b --gpu-memory 24GB --out p.json
    python -m ondevice.eval.gpu_pipeline accelerate --target qwen2.5-32b --gpu-memory 24GB --out a.json

`pipeline`: the synthetic target streamed from pinned RAM to the GPU in torch (`synthetic.offloaded`,
as the GPU check builds it), a synthetic drafter written as a GGUF and run by llama.cpp on the CPU
(`LlamaDrafter`, as `ondevice chat` runs it), and `SpecEngine` between them: the target alone and
each tree, overlap off and on, with the engine's own round split (drafting, target compute,
overhead, time both ran at once). Both models have random weights, so almost no draft is accepted:
what this measures is the cost of a round, not tokens per pass. Beside the engine's runs, each
tree's parts are timed alone and at once (a draft on the CPU while the target's pass runs), which is
what a round costs when the overlap's guess comes true. The forecast multiplies those measured
rounds by the tokens per pass the default pair's measured acceptance gives the tree (Sequoia's
expected value): a prediction, labelled so.

`accelerate`: the same target shape as a transformers model in bfloat16, placed by Accelerate
(`infer_auto_device_map` within the same GPU budget, the rest offloaded to CPU RAM and copied in
for every forward: what `from_pretrained(device_map="auto", max_memory=…)` does) and timed per
pass over 1, 16 and 64 new tokens after a 64-token prompt (each appended to the cache): what a transformers user would run.

`--tiny --device cpu` runs both at small shapes on a CPU (tests/test_gpu_pipeline.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ondevice.eval.gpu_steps import _sync, check_shapes, placement_record, quarter_budget, write_json

CONFIGS = (None, ("chain", 4), ("best-first", 16), ("best-first", 64), ("best-first", 128))
TINY_CONFIGS = (None, ("chain", 4), ("best-first", 16))
PROMPT_TOKENS = 128


def pipeline(target_name: str, drafter_name: str, device: str, gpu_memory: str, threads: int, max_tokens: int, out: Path, tiny: bool) -> dict:
    import torch  # lazy: this step only (gpu_steps' rule)

    from ondevice.draft.llama_drafter import LlamaDrafter  # lazy: llama.cpp, this step only
    from ondevice.synthetic.offloaded import offloaded_target  # lazy: torch and gguf
    from ondevice.synthetic.writer import write_synthetic_gguf  # lazy: gguf

    shapes = check_shapes(tiny)
    configs = TINY_CONFIGS if tiny else CONFIGS
    max_tree = max(c[1] for c in configs if c) + 1
    start = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="gpu-pipeline-"))
    drafter_path = write_synthetic_gguf(shapes[drafter_name], folder / f"{drafter_name}.gguf", show=False)
    written = time.monotonic()
    drafter = LlamaDrafter(drafter_path, n_ctx=1024, threads=threads, max_tree=max_tree, resident=True)
    if gpu_memory == "quarter":  # a CPU standing in for the GPU (gpu_steps.quarter_budget)
        gpu_memory = quarter_budget(shapes[target_name], device, 1024, max_tree)
    target = offloaded_target(shapes[target_name], device, gpu_memory, n_ctx=1024, max_tree=max_tree)
    _sync(device)
    record = {"target": target_name, "drafter": drafter_name, "device": device, "gpu_memory": gpu_memory, "drafter_threads": threads,
              "torch_threads": torch.get_num_threads(), "drafter_write_seconds": written - start,
              "build_seconds": time.monotonic() - written, **placement_record(target), "runs": [], "parts": []}  # fmt: skip
    write_json(out, {**record, "status": "running"})
    vocab = min(drafter.n_vocab, target.n_vocab)
    prompt = np.random.default_rng(1).integers(0, vocab, PROMPT_TOKENS).tolist()
    for config in configs:
        for overlap in (False, True) if config else (False,):
            record["runs"].append(engine_run(target, drafter, prompt, config, overlap, max_tokens))
            write_json(out, {**record, "status": "running"})
    for config in configs[1:]:
        record["parts"].append(round_parts(target, drafter, prompt, config))
        write_json(out, {**record, "status": "running"})
    alone = record["runs"][0]["token_ids"]
    record["answers_equal_target_alone"] = sum(r["token_ids"] == alone for r in record["runs"][1:])
    record["forecast"] = forecast(record["parts"], record["runs"])
    drafter.close()
    target.close()
    return {**record, "status": "ok"}


def engine_run(target, drafter, prompt: list[int], config, overlap: bool, max_tokens: int) -> dict:
    """One answer of max_tokens through SpecEngine, as `ondevice generate` decodes it."""
    from ondevice.decode.engine import SpecEngine, Stats  # lazy: as the step's other imports
    from ondevice.decode.protocols import DraftSpec, config_label

    spec = DraftSpec(config[0], budget=config[1]) if config else None
    engine = SpecEngine(target, drafter if config else None, is_end=lambda t: False, overlap=overlap)
    *steps, stats = engine.generate(prompt, max_tokens, spec=spec)
    assert isinstance(stats, Stats)
    if engine._worker is not None:  # its threads only; the models are shared by the next run
        engine._worker.close()
    passes = [s for _, s in stats.pass_seconds]
    rounds = stats.target_passes
    return {
        "config": config_label(spec), "overlap": overlap, "tokens": stats.tokens, "rounds": rounds,
        "tokens_per_second": stats.tokens_per_second, "tokens_per_pass": stats.tokens_per_pass,
        "round_seconds": stats.decode_seconds / rounds, "pass_seconds_median": statistics.median(passes),
        "pass_seconds_mean": statistics.fmean(passes),
        "split_per_round": {k: (v / rounds if v is not None else None) for k, v in stats.round_split().items()},
        "concurrent_per_round": stats.concurrent_seconds / rounds, "overlap_hits": stats.overlap_hits,
        "prefill_seconds": stats.prefill_seconds, "token_ids": [t for step in steps for t in step.tokens],
    }  # fmt: skip


def round_parts(target, drafter, prompt: list[int], config, repeats: int = 3) -> dict:
    """A tree's draft alone, its target pass alone, and both at once (the draft in a thread while the
    pass runs on this one), medians of `repeats`: a round's cost when the overlap's guess comes true."""
    from ondevice.decode.protocols import DraftSpec, config_label  # lazy: as the step's other imports

    spec = DraftSpec(config[0], budget=config[1])
    contexts = [prompt + [int(t)] for t in (7, 11)]  # alternate: every call rolls back and decodes one token
    target.truncate(0)
    target.prefill(prompt)
    base = target.n_cached

    def draft(k: int):
        t0 = time.perf_counter()
        tree = drafter.draft(contexts[k % 2], spec)
        return tree, time.perf_counter() - t0

    def verify(tree) -> float:
        t0 = time.perf_counter()
        target.forward_tree(tree)
        _sync(str(target.device))
        seconds = time.perf_counter() - t0
        target.commit([0])
        target.truncate(base)
        return seconds

    tree, _ = draft(0)
    verify(tree)  # warm: the first pass of a size allocates
    alone_draft, alone_pass, both_draft, both_pass, both_wall = [], [], [], [], []
    with ThreadPoolExecutor(max_workers=1) as pool:
        for k in range(repeats):
            tree, seconds = draft(k + 1)
            alone_draft.append(seconds)
            alone_pass.append(verify(tree))
            t0 = time.perf_counter()
            future = pool.submit(draft, k)
            both_pass.append(verify(tree))
            both_draft.append(future.result()[1])
            both_wall.append(time.perf_counter() - t0)
    med = statistics.median
    return {"config": config_label(spec), "nodes": len(tree), "draft_alone": med(alone_draft), "pass_alone": med(alone_pass),
            "draft_beside_pass": med(both_draft), "pass_beside_draft": med(both_pass), "both_wall": med(both_wall)}  # fmt: skip


def forecast(parts: list[dict], runs: list[dict]) -> dict:
    """tok/s with the default pair's acceptance on the rounds measured here (a prediction): overlap
    off = draft + pass in series; overlap on, guess right = both at once; the target alone measured."""
    from ondevice.eval.gpu_predict import DEFAULT_FAMILY, DEFAULT_PAIR  # lazy: as the step's other imports
    from ondevice.plan.acceptance import acceptance_for
    from ondevice.plan.sequoia import chain_tokens_per_pass, optimal_tree

    p_rank, source = acceptance_for(DEFAULT_PAIR, DEFAULT_FAMILY)
    alone = next(r for r in runs if r["config"] == "target")
    rows = []
    for part in parts:
        builder, budget = part["config"].split("@")
        budget = int(budget)
        tokens = chain_tokens_per_pass(float(p_rank[0]), budget) if builder == "chain" else optimal_tree(p_rank, budget, budget).tokens_per_pass
        rows.append({"config": part["config"], "tokens_per_pass": tokens, "serial_tokens_per_second": tokens / (part["draft_alone"] + part["pass_alone"]),
                     "overlapped_tokens_per_second": tokens / part["both_wall"]})  # fmt: skip
    return {"target_alone_tokens_per_second": alone["tokens_per_second"], "rows": rows, "acceptance": source,
            "statement": "a prediction, not a measurement: rounds measured here, tokens per pass from the default pair's acceptance"}  # fmt: skip


def accelerate(target_name: str, device: str, gpu_memory: str, out: Path, tiny: bool) -> dict:
    """The shape as a transformers model in bfloat16 under Accelerate's offload within gpu_memory."""
    import torch  # lazy: this step only
    from accelerate import dispatch_model, infer_auto_device_map
    from transformers import AutoModelForCausalLM

    shape = check_shapes(tiny)[target_name]
    start = time.monotonic()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(shape), torch_dtype=torch.bfloat16)
    model.to_empty(device="cpu")
    fill_random(model.parameters(), torch.bfloat16)  # every page written: untouched zero pages would copy faster than real weights
    model.model.rotary_emb.__init__(model.config)  # its buffers were left empty by to_empty
    gpu = 0 if device == "cuda" else device
    layer_class = type(model.model.layers[0]).__name__
    budgets = {gpu: gpu_memory, "cpu": "1000GB"} if device == "cuda" else {"cpu": "1000GB"}  # a CPU: nothing to offload to
    device_map = infer_auto_device_map(model, max_memory=budgets, no_split_module_classes=[layer_class])
    model = dispatch_model(model, device_map, main_device=gpu)
    layers = [placed(device_map, f"model.layers.{i}") for i in range(shape.n_layers)]
    record = {"target": target_name, "device": device, "gpu_memory": gpu_memory, "build_seconds": time.monotonic() - start,
              "layers_on_device": sum(1 for v in layers if v == gpu), "layers_offloaded": sum(1 for v in layers if v == "cpu"),
              "transformers": _version("transformers"), "accelerate": _version("accelerate"), "passes": {}}  # fmt: skip
    write_json(out, {**record, "status": "timing"})
    rng = np.random.default_rng(0)
    ids = lambda n: torch.tensor(rng.integers(0, shape.vocab, (1, n)), device=gpu)  # noqa: E731
    with torch.no_grad():
        prompt = model(ids(64), use_cache=True)
        for n in (1, 1, 16, 64) if not tiny else (1, 1, 4):
            t0 = time.perf_counter()
            model(ids(n), past_key_values=prompt.past_key_values, use_cache=True)  # the cache grows: 64 to 146 tokens, no matter
            _sync(device)
            record["passes"].setdefault(str(n), []).append(time.perf_counter() - t0)
            write_json(out, {**record, "status": "timing"})
    return {**record, "status": "ok"}


def fill_random(params, dtype, tile: int = 1 << 24) -> None:
    """Fill every parameter with a tile of random values, repeated (tens of GB: drawing each value would take minutes)."""
    import torch  # lazy: this step only

    source = torch.empty(tile, dtype=dtype).uniform_(-0.02, 0.02)
    with torch.no_grad():
        for p in params:
            flat = p.view(-1)
            for at in range(0, flat.numel(), tile):
                n = min(tile, flat.numel() - at)
                flat[at : at + n].copy_(source[:n])


def placed(device_map: dict, module: str):
    """Where Accelerate's device map puts a module: the entry of its longest prefix."""
    keys = [k for k in device_map if k == "" or module == k or module.startswith(k + ".")]
    return device_map[max(keys, key=len)]


def hf_config(shape):
    """The transformers config of a synthetic shape (Qwen2 or Llama)."""
    from transformers import LlamaConfig, Qwen2Config  # lazy: this step only

    common = dict(vocab_size=shape.vocab, hidden_size=shape.dim, intermediate_size=shape.ffn, num_hidden_layers=shape.n_layers,
                  num_attention_heads=shape.n_heads, num_key_value_heads=shape.n_kv_heads, head_dim=shape.head_dim,
                  rms_norm_eps=shape.norm_eps, rope_theta=shape.rope_theta, tie_word_embeddings=shape.tied)  # fmt: skip
    return Qwen2Config(**common) if shape.arch == "qwen2" else LlamaConfig(**common)


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("pipeline", "accelerate"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target", default="qwen2.5-32b")
    parser.add_argument("--drafter", default="qwen2.5-0.5b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--gpu-memory", default="24GB")
    parser.add_argument("--threads", type=int, default=8, help="pipeline: the drafter's CPU threads (a desktop's cores)")
    parser.add_argument("--max-tokens", type=int, default=12, help="pipeline: tokens per engine run")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    if args.step == "pipeline":
        record = pipeline(args.target, args.drafter, args.device, args.gpu_memory, args.threads, args.max_tokens, args.out, args.tiny)
    else:
        record = accelerate(args.target, args.device, args.gpu_memory, args.out, args.tiny)
    write_json(args.out, record)


if __name__ == "__main__":
    main(sys.argv[1:])
