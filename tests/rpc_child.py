"""A process that uses a target split over RPC, for tests/test_rpc.py (a lost worker ends the
process that talks to it, so the test's own process never does).

    python rpc_child.py logits MODEL ENDPOINTS  # one JSON line: the split's tree logits against the local target's
    python rpc_child.py kill MODEL ENDPOINTS    # one pass, prints "ready", waits for a line on stdin, passes on
"""

from __future__ import annotations

import json
import sys

import numpy as np

from ondevice.eval.numerics import batch_noise_by_size, noise_stats
from ondevice.loading.footprint import ModelSize
from ondevice.loading.rpc_split import connect_workers, plan_split, worker_reserve
from ondevice.rpc import library
from ondevice.targets.llama_target import LlamaTarget
from ondevice.decode.tree import DraftTree

PREFIX = [5, 17, 42, 8, 99, 23, 61, 7]
N_CTX = 256


def tree(n: int, vocab: int, seed: int = 3) -> DraftTree:
    rng = np.random.default_rng(seed)
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    return DraftTree(rng.integers(0, vocab, n), np.array(parents), np.zeros(n))


def split_target(model: str, endpoints: str) -> LlamaTarget:
    """The target split over this machine and the workers, this machine offering what the first worker does."""
    size, workers = ModelSize.from_gguf(model), connect_workers(library.parse_workers(endpoints))
    local_room = workers[0][2] - worker_reserve(size, N_CTX, 256, 64)
    split = plan_split(size, local_room, workers, N_CTX, 256, 64)
    print(json.dumps({"split": split.to_dict()}), file=sys.stderr, flush=True)
    return LlamaTarget(model, n_ctx=N_CTX, threads=1, max_tree_nodes=64, split=split)


def tree_logits(target: LlamaTarget, t: DraftTree) -> np.ndarray:
    target.truncate(0)
    target.prefill(PREFIX)
    return target.forward_tree(t)


def logits(model: str, endpoints: str) -> None:
    local = LlamaTarget(model, n_ctx=N_CTX, threads=1, max_tree_nodes=64)
    t = tree(24, local.n_vocab)
    expected = tree_logits(local, t)
    local.truncate(0)
    local.prefill(PREFIX[:-1])
    chain = [PREFIX[-1]] + np.random.default_rng(1).integers(0, local.n_vocab, 23).tolist()
    noise = batch_noise_by_size(local, chain, [24])[24]  # this machine's batch noise: a 24-token pass against one at a time
    remote = split_target(model, endpoints)
    got = tree_logits(remote, t)
    print(json.dumps({"noise": noise, "split_vs_local": noise_stats(expected, got), "split": remote.split.to_dict(),
                      "traffic": remote.split.traffic()}))


def kill(model: str, endpoints: str) -> None:
    target = split_target(model, endpoints)
    t = tree(8, target.n_vocab)
    tree_logits(target, t)
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(50):
        tree_logits(target, t)
    print("survived", flush=True)


if __name__ == "__main__":
    mode, model, endpoints = sys.argv[1:4]
    {"logits": logits, "kill": kill}[mode](model, endpoints)
