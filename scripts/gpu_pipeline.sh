#!/usr/bin/env bash
# The whole pipeline on a GPU at real shapes (docs/measurements/2026-11-28-gpu-h200.md), then Hugging Face Accelerate's offload of
# the same target shape as the baseline: one JSON each in OUTDIR (default gpu-pipeline/).
#
#   scripts/gpu_pipeline.sh [OUTDIR]
#
# Needs python3 with a CUDA build of torch, transformers, numpy and psutil; llama-cpp-python, gguf and
# accelerate where they are missing are taken from .whl/site of this checkout (pure Python, and
# llama-cpp-python's own shared libraries copied from a CPU machine's venv; see scripts/gpu_check.sh).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-gpu-pipeline}"
mkdir -p "$out"
python="${PYTHON:-python3}"
if [ -d "$root/.whl/site" ]; then export PYTHONPATH="$root/.whl/site${PYTHONPATH:+:$PYTHONPATH}"; fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$root"
timeout 210 "$python" -m ondevice.eval.gpu_pipeline pipeline --target qwen2.5-32b --drafter qwen2.5-0.5b --gpu-memory 24GB \
  --threads 8 --max-tokens 12 --out "$out/pipeline-qwen2.5-32b.json" >"$out/pipeline.log" 2>&1
echo "pipeline: exit $?"
timeout 200 "$python" -m ondevice.eval.gpu_pipeline accelerate --target qwen2.5-32b --gpu-memory 24GB \
  --out "$out/accelerate-qwen2.5-32b.json" >"$out/accelerate.log" 2>&1
echo "accelerate: exit $?"
