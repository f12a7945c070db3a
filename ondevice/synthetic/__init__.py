"""Synthetic models: random weights at the real shapes and GGUF block formats of models not downloaded.

A pass's cost depends on shapes, quantization and where the weights live, not on trained values,
so a random model measures it: `shapes` (architecture presets), `quant_mix` (llama.cpp's per-tensor
types for Q4_K_M), `blocks` (valid random quantized blocks), `writer` (a streamed GGUF file),
`measure` (a pass-time curve on this machine, cached per shape).
"""
