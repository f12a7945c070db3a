"""ONNX Runtime on the CPU: our decoder exported with GGUF weights in `MatMulNBits` (4/8-bit integer
GEMMs that reuse each weight block across the tokens of a pass), for the ONNX target and drafter.

nbits.py: GGUF blocks → MatMulNBits inputs; graph.py: the decoder graph; export.py: build and cache
it next to the GGUF; session.py: session options, threads and the fast-kernel check; decoder.py:
runs it over a KV cache that stays in place (GroupQueryAttention, shared past/present buffers).
"""
