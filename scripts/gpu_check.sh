#!/usr/bin/env bash
# The GPU check in one command (docs/design/gpu-offload.md): the CUDA tests, pinned host<->device bandwidth, the
# synthetic 32B- and 70B-class torch targets streamed from pinned RAM to the GPU under --gpu-memory,
# and the predicted tok/s of each pair; one JSON (--out, default gpu.json), within 8 minutes.
#
#   scripts/gpu_check.sh --out gpu.json [--gpu-memory 24GB] [--skip-tests]
#
# Runs ondevice from this checkout (nothing to install) with python3 (or $PYTHON): torch with CUDA,
# numpy, psutil, rich and the gguf package. gguf is pure Python (~100 KB): where it is missing and no
# registry can be reached, download its wheel beforehand into .whl/ of this checkout
#   pip download gguf==0.19.0 --no-deps -d .whl
# and it is installed from there into a temporary folder. Without it, the steps that build the
# synthetic models are skipped, and the JSON says so. llama.cpp is never needed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
if ! "$python" -c "import gguf" 2>/dev/null; then
  if compgen -G "$root/.whl/gguf-*.whl" >/dev/null; then
    site="$(mktemp -d)"
    "$python" -m pip install -q --no-index --no-deps --target "$site" "$root"/.whl/gguf-*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "the gguf package is missing: pip install gguf, or put its wheel in $root/.whl/ (see the top of $0)" >&2
  fi
fi
# Packages copied in beside the wheels (e.g. llama-cpp-python from a CPU machine's venv: pure Python
# over its own shared libraries), so the CUDA tests that compare with llama.cpp import there too.
if [ -d "$root/.whl/site" ]; then export PYTHONPATH="$root/.whl/site${PYTHONPATH:+:$PYTHONPATH}"; fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$root"
exec "$python" -m ondevice.eval.gpu_check "$@"
