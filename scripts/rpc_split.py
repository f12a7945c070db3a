"""The default pair split over two workers on this machine, each in a memory cgroup too small for the
target, the client in one of its own (docs/measurements/2026-11-28-rpc.md):

    python scripts/rpc_split.py OUT_DIR [--limit 3] [--max-tokens 32] [--mem 0.7GB] [--prompts heldout16-code]

Rows, each prompt greedy:
  reference      the target alone in RAM, no cgroup, no drafts (`ondevice generate --no-draft`)
  ondevice-rpc   `ondevice generate --rpc A,B` in the client's cgroup (its planner: trees or not)
  ondevice-rpc-alone  the same split, `--no-draft`
  llamacpp-rpc   llama-cpp-python's Llama over the same split (eval/llamacpp_split.py), no drafts
  ondevice-disk  `ondevice generate` on one machine in the same cgroup, no workers (streams from disk)
and with --tap: the two ondevice-rpc rows again through counting relays (rpc/wiretap.py), with
--delay-ms each way, for round trips and bytes per pass. Writes OUT_DIR/rows.jsonl and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def lowmem(limit: str, *cmd: str, drop: bool = False) -> list[str]:
    """cmd in a memory cgroup of its own; drop: the model files' cached pages dropped first (a streamed
    target must read from disk; elsewhere they stay, for the other users of this machine)."""
    return [PY, "-m", "ondevice.eval.lowmem", "--cgroup", limit, *([] if drop else ["--no-drop"]), "--", *cmd]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def start(cmd: list[str], log: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not listening(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{cmd} did not listen on {port}: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def generate(prompt: str, args, *flags: str, limit: str | None = None) -> dict:
    cmd = [PY, "-m", "ondevice", "generate", prompt, "-n", str(args.max_tokens), "--json", *flags]
    cmd = lowmem(limit, *cmd, drop="--rpc" not in flags) if limit else cmd
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = time.monotonic() - t0
    return result


def summary(row: str, prompt_no: int, r: dict, reference: list[int] | None) -> dict:
    if "error" in r:
        return {"row": row, "prompt": prompt_no, "error": r["error"]}
    place = r.get("placement", {})
    rpc = place.get("rpc", {})
    return {"row": row, "prompt": prompt_no, "tokens_per_second": r["tokens_per_second"], "tokens_per_pass": r.get("tokens_per_pass"),
            "tree": r.get("tree"), "rounds_by_config": r.get("rounds_by_config"), "same_as_reference": reference == r["token_ids"] if reference else None,
            "token_ids": r["token_ids"], "layers": [len(p["layers"]) for p in rpc.get("parts", [])] or None,
            "traffic": rpc.get("traffic"), "placement": place.get("summary") or rpc.get("summary"), "peak_rss_bytes": r.get("peak_rss_bytes")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--mem", default="0.7GB", help="each worker's and the client's cgroup limit")
    ap.add_argument("--prompts", default="heldout16-code")
    ap.add_argument("--tap", action="store_true", help="also run through counting relays")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="with --tap: one-way delay per chunk")
    ap.add_argument("--rows", default="reference,ondevice-rpc,ondevice-rpc-alone,llamacpp-rpc,ondevice-disk")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    from ondevice.bench import prompt_sets as sets

    prompts = sets.SETS[args.prompts][: args.limit]
    rows = args.rows.split(",")
    workers = [start(lowmem(args.mem, PY, "-m", "ondevice", "worker", "--port", str(p)), args.out / f"worker{p}.log", p) for p in (50052, 50053)]
    taps = []
    results = []
    try:
        rpc = "127.0.0.1:50052,127.0.0.1:50053"
        if args.tap:
            taps = [start([PY, "-m", "ondevice.rpc.wiretap", "--listen", f"127.0.0.1:{p + 10}", "--to", f"127.0.0.1:{p}",
                           "--delay-ms", str(args.delay_ms), "--out", str(args.out / f"tap{p}.json")], args.out / f"tap{p}.log", p + 10)
                    for p in (50052, 50053)]
            rpc = "127.0.0.1:50062,127.0.0.1:50063"
        refs: list[list[int] | None] = [None] * len(prompts)
        layers = None
        for i, prompt in enumerate(prompts):
            if "reference" in rows:
                r = generate(prompt, args, "--no-draft")
                refs[i] = r.get("token_ids")
                results.append(summary("reference", i, r, None))
            for row, flags, limit in (("ondevice-rpc", ["--rpc", rpc], args.mem), ("ondevice-rpc-alone", ["--rpc", rpc, "--no-draft"], args.mem),
                                      ("ondevice-disk", [], args.mem)):
                if row in rows:
                    results.append(summary(row + ("-tap" if args.tap else ""), i, generate(prompt, args, *flags, limit=limit), refs[i]))
                    layers = layers or results[-1].get("layers")
                    print(json.dumps({k: v for k, v in results[-1].items() if k != "token_ids"}), flush=True)
        if "llamacpp-rpc" in rows and layers:
            cmd = lowmem(args.mem, PY, "-m", "ondevice.eval.llamacpp_split", "--rpc", rpc, "--layers", ",".join(map(str, layers)),
                         "--prompts", args.prompts, "--limit", str(args.limit), "--max-tokens", str(args.max_tokens))
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode == 0:
                r = json.loads(out.stdout.strip().splitlines()[-1])
                same = [ids == ref for ids, ref in zip(r["token_ids"], refs)] if all(refs) else None
                results.append({"row": "llamacpp-rpc" + ("-tap" if args.tap else ""), "tokens_per_second": r["tokens_per_second"],
                                "tokens_per_pass": 1.0, "same_as_reference": same, "layers": layers})
            else:
                results.append({"row": "llamacpp-rpc", "error": out.stderr.strip()[-500:]})
            print(json.dumps(results[-1]), flush=True)
    finally:
        for proc in taps + workers:
            stop(proc)
    with (args.out / "rows.jsonl").open("a") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
