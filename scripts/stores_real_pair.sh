#!/usr/bin/env bash
# The default pair run from other programs' stores, as a user would (docs/measurements/2026-11-28-model-stores.md):
# its two GGUFs, copied once into a reference ONDEVICE_HOME, are hard-linked as ollama blobs with
# manifests and as Hugging Face cache snapshots in a temporary HOME; `ondevice generate` then runs
#   the catalog pair from the reference home (the reference tokens),
#   -m qwen2.5-coder:1.5b (ollama), -m hf:Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF (HF cache),
#   the catalog pair with an empty ONDEVICE_HOME (its files found in the stores), twice,
# each greedy, --max-tokens 24; then `du` and `ondevice models` (in RAM and in a 0.9 GB cgroup).
#
#   scripts/stores_real_pair.sh [WORKDIR]     # default: a new temporary folder; needs ~1.6 GB free
#
# The source files ($SOURCE, default ~/.cache/ondevice/models) are only read: a hard link to them
# would change their ctime, and with it invalidate their .verified markers.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="${1:-$(mktemp -d)}"
source_dir="${SOURCE:-$HOME/.cache/ondevice/models}"
target=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf drafter=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
prompt="Write a Python function that checks whether a number is prime."
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" COLUMNS=220
mkdir -p "$work/ref/models" "$work/home" "$work/empty"
cp "$source_dir/$target" "$source_dir/$drafter" "$work/ref/models/"
echo "du before the stores: $(du -sk "$work" | cut -f1) kB"
"$python" - "$work" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from store_layouts import hf_cache_model, ollama_model
work = Path(sys.argv[1]); home, ref = work / "home", work / "ref" / "models"
t, d = ref / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", ref / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
ollama_model(home, "qwen2.5-coder", "1.5b", t, template="<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n")
ollama_model(home, "qwen2.5-coder", "0.5b", d)
hf_cache_model(home, "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", t.name, t)
hf_cache_model(home, "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", d.name, d)
EOF
echo "du after the stores: $(du -sk "$work" | cut -f1) kB (home alone: $(du -sk "$work/home" | cut -f1) kB, counted after ref: $(du -sck "$work/ref" "$work/home" | tail -1 | cut -f1) kB total)"
run() {  # NAME HOME ONDEVICE_HOME [ARGS...]
  local name=$1 home=$2 odhome=$3; shift 3
  HOME="$home" ONDEVICE_HOME="$odhome" "$python" -m ondevice generate "$prompt" -n 24 --json "$@" >"$work/$name.json" 2>"$work/$name.err"
  "$python" -c "import json,sys; r=json.load(open(sys.argv[1]))['token_ids']; d=json.load(open(sys.argv[2]))
print(f\"{sys.argv[3]:<10} same tokens as the catalog pair: {d['token_ids'] == r}, pair {d['model']}, {d['tokens_per_second']:.1f} tok/s\")" \
    "$work/ref.json" "$work/$name.json" "$name"
  grep -v '^\s*$' "$work/$name.err" | sed 's/^/    /' || true
}
run ref "$work/empty" "$work/ref"
run ollama "$work/home" "$work/od-ollama" -m qwen2.5-coder:1.5b
run hf "$work/home" "$work/od-hf" -m hf:Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF
run catalog "$work/home" "$work/od-catalog"
run catalog2 "$work/home" "$work/od-catalog"
echo "du after the runs: $(du -sk "$work" | cut -f1) kB; the ondevice homes: $(du -sck "$work"/od-* | tail -1 | cut -f1) kB"
HOME="$work/home" ONDEVICE_HOME="$work/od-catalog" "$python" -m ondevice models | grep -E "on this machine:|qwen2.5-coder-1.5b \*|qwen2.5-coder:|hf:Qwen"
HOME="$work/home" ONDEVICE_HOME="$work/od-catalog" "$python" -m ondevice.eval.lowmem --cgroup 0.9GB --no-drop --report "$work/lowmem.json" -- \
  "$python" -m ondevice models | grep -E "on this machine:|qwen2.5-coder-1.5b \*|qwen2.5-coder:|hf:Qwen" || true
