"""Streamed passes of the synthetic Qwen2.5-32B under a 24 GB budget on a CUDA GPU (docs/measurements/2026-11-27-gpu-h100.md):

1. device layers decoded at load, streamed layers dequantized by the Triton kernels and by the torch
   path, side by side in one process (ONDEVICE_DEQUANT=torch forces the torch path), and one
   layer's copy and dequantization times;
2. device layers kept encoded (offload/encoded.py) against 1., on the same machine.

    PYTHONPATH=. python3 scripts/gpu_dequant_ab.py     # torch with CUDA, Triton and gguf installed
"""

import os
import time

import torch

from ondevice.offload.layout import unpack
from ondevice.plan.latency import TargetPasses
from ondevice.quant import gguf_triton
from ondevice.synthetic.offloaded import offloaded_target
from ondevice.synthetic.shapes import PRESETS

SIZES = (1, 64, 256)


def build(keep_encoded: bool):
    start = time.time()
    target = offloaded_target(PRESETS["qwen2.5-32b"], "cuda", "24GB", n_ctx=4096, max_tree=2048, keep_encoded=keep_encoded)
    print(f"built in {time.time() - start:.1f} s:", target.placement.describe(), flush=True)
    return target, TargetPasses(target, 64, max(SIZES))


def timed(passes, n: int, reps: int = 3) -> list[float]:
    seconds = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        passes(n)
        torch.cuda.synchronize()
        seconds.append(round(time.perf_counter() - start, 4))
    return seconds


def per_layer_ms(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return round((time.perf_counter() - start) / reps * 1e3, 3)


def dequantizers(target, passes) -> None:
    for mode in ("triton", "torch"):
        os.environ["ONDEVICE_DEQUANT"] = mode
        timed(passes, 1, 2)  # warm-up (the kernels compile)
    for rep in range(2):
        for mode in ("triton", "torch"):
            os.environ["ONDEVICE_DEQUANT"] = mode
            print(rep, gguf_triton.describe(torch.device("cuda")), {n: timed(passes, n) for n in SIZES}, flush=True)
    os.environ["ONDEVICE_DEQUANT"] = "triton"
    print("streamer:", target.streamer.collect_stats().summary())
    layer = target.streamer.order[0]
    buffer, slot = layer.host.to("cuda"), torch.empty(layer.layout.nbytes, dtype=torch.uint8, device="cuda")
    print(f"one layer ({layer.layout.nbytes} bytes): copy {per_layer_ms(lambda: slot.copy_(layer.host, non_blocking=True))} ms")
    decoded = {}
    for mode in ("triton", "torch"):
        os.environ["ONDEVICE_DEQUANT"] = mode
        print(f"  dequantize, {mode}: {per_layer_ms(lambda: unpack(buffer, layer.layout))} ms")
        decoded[mode] = unpack(buffer, layer.layout)
    same = all(torch.equal(decoded["triton"][k].view(torch.uint8), decoded["torch"][k].view(torch.uint8)) for k in decoded["torch"])
    print("  the same bits both ways:", same)
    os.environ["ONDEVICE_DEQUANT"] = "triton"


def main() -> None:
    target, passes = build(keep_encoded=False)
    dequantizers(target, passes)
    timed(passes, 1, 2)
    decoded_times = {n: timed(passes, n) for n in SIZES}
    target.close()
    del target, passes
    torch.cuda.empty_cache()
    target, passes = build(keep_encoded=True)
    timed(passes, 1, 2)
    print("device layers decoded:", decoded_times)
    print("device layers encoded:", {n: timed(passes, n) for n in SIZES})
    target.close()


if __name__ == "__main__":
    main()
