"""Measuring ondevice: scripts run as `python -m ondevice.eval.*` (batch-noise numerics, low-RAM
emulation, llama-cpp-python's rows alone, the GPU harness). Product code never imports them; what
`ondevice bench` runs lives in `ondevice.bench`, the prompt sets in `ondevice.bench.prompt_sets`."""
