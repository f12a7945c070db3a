"""Streamed passes of the synthetic Qwen2.5-32B (24 GB budget) with the Triton dequantizer and the
torch one, side by side in one process, and one layer's copy / dequantize time (README, "GPU").

    PYTHONPATH=. python3 scripts/gpu_dequant_ab.py     # on a CUDA machine with torch, Triton and gguf
"""

import os
import time

import torch
from ondevice.synthetic.shapes import PRESETS
from ondevice.synthetic.offloaded import offloaded_target
from ondevice.plan.latency import TargetPasses
from ondevice.offload.layout import unpack
from ondevice.quant import gguf_triton

t0 = time.time()
target = offloaded_target(PRESETS["qwen2.5-32b"], "cuda", "24GB", n_ctx=4096, max_tree=2048)
print("build", round(time.time() - t0, 1), target.placement.describe(), flush=True)
p = TargetPasses(target, 64, 256)
def timed(n, reps=3):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter(); p(n); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    return ts
for mode in ("triton", "torch"):
    os.environ["ONDEVICE_DEQUANT"] = mode
    timed(1, 2)
for rep in range(2):
    for mode in ("triton", "torch"):
        os.environ["ONDEVICE_DEQUANT"] = mode
        print(rep, mode, gguf_triton.describe(torch.device("cuda")), {n: [round(x, 4) for x in timed(n)] for n in (1, 64, 256)}, flush=True)
s = target.streamer
print("streamer", s.collect_stats().summary())
layer = s.order[0]
buf = layer.host.to("cuda")
slot = torch.empty_like(buf)
def bench(fn, reps=10):
    fn(); torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps):
        fn()
    cpu = (time.perf_counter() - t) / reps
    torch.cuda.synchronize()
    return round((time.perf_counter() - t) / reps * 1e3, 3), round(cpu * 1e3, 3)
print("copy ms/layer (gpu, cpu-enqueue)", bench(lambda: slot.copy_(layer.host, non_blocking=True)), "bytes", layer.layout.nbytes)
for mode in ("triton", "torch"):
    os.environ["ONDEVICE_DEQUANT"] = mode
    print("decode", mode, bench(lambda: unpack(buf, layer.layout)))
os.environ["ONDEVICE_DEQUANT"] = "triton"
a = unpack(buf, layer.layout); os.environ["ONDEVICE_DEQUANT"] = "torch"; b = unpack(buf, layer.layout)
print("layer bit-identical both ways:", all(torch.equal(a[k].view(torch.int16) if a[k].dtype != torch.float32 else a[k], b[k].view(torch.int16) if b[k].dtype != torch.float32 else b[k]) for k in a))
