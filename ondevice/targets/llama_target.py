"""LlamaTarget: a GGUF target in llama.cpp (CPU, or partly on a GPU with n_gpu_layers).

Sequence 0 holds the committed tokens. `forward_tree` verifies a whole draft tree in ONE
llama_decode: leaf i of the tree owns sequence i + 1, which first gets the committed cells
(`seq_cp(0, i + 1)`, no data copied), and every node is tagged with the sequences of the leaves
below it. A node's first sequence then holds exactly the committed tokens plus its root→node path
at positions up to its own, which is the tree attention mask. `commit(path)` adds sequence 0 to the
path's cells and drops the leaf sequences, which frees every other tree cell.

A tree can have at most `max_tree_leaves` leaves (llama.cpp's sequence limit, minus sequence 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ondevice.errors import OndeviceError
from ondevice.llama_backend import LLAMA_MAX_SEQUENCES, LlamaContext, LlamaModel
from ondevice.targets.layer_callback import layer_callback
from ondevice.machine.disk_io import read_counters, stat_file
from ondevice.decode.protocols import StreamCounters, Target
from ondevice.targets.direct_window import open_window
from ondevice.targets.repacked_copy import RepackedCopy, mark_weights
from ondevice.decode.tree import DraftTree

MAIN_SEQ = 0


def leaf_sequences(tree: DraftTree) -> list[list[int]]:
    """For each node, the sequence ids (1 + leaf index) of the leaves below it; a leaf's own id first."""
    seqs: list[list[int]] = [[] for _ in range(len(tree))]
    for i, leaf in enumerate(tree.leaves()):
        node = leaf
        while node != -1:
            seqs[node].append(i + 1)
            node = int(tree.parents[node])
    return seqs


class LlamaTarget(Target):
    """Target protocol over llama.cpp: a KV cache of committed tokens, tree verification in one pass."""

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = 4096,
        threads: int | None = None,
        n_gpu_layers: int = 0,
        max_tree_nodes: int = 2048,
        n_ubatch: int = 512,
        kv_type: str = "f32",
        streams: bool = False,
        window: int = 0,
        kept_layers: Sequence[int] = (),
        split=None,
        repacked: RepackedCopy | None = None,
        lend_logits: bool = False,
    ):
        """max_tree_nodes: the biggest tree verified in one pass; the context's logits rows and
        sequences are sized for it (`ondevice.loading.memory`), prompts are still prefilled n_ubatch
        tokens per pass. streams: the file is larger than the RAM left for it: keep every weight in
        the mapped file (no repacking into anonymous memory) so the page cache can stream it.
        window > 0 (with streams): steer the page cache layer by layer, prefetching `window` layers
        ahead and dropping the finished ones except `kept_layers` (direct_window.py, or page_cache.py).
        split: the layers placed across this machine and RPC workers (loading/rpc_split.py's RpcSplit).
        repacked: (with streams) the model's copy in llama.cpp's repacked layouts
        (targets/repacked_copy.py), mapped instead of model_path: its layers compute with the
        kernels llama.cpp uses in RAM.
        lend_logits: `forward_tree` returns a view of llama.cpp's logits buffer, valid until this
        target's next pass, not a copy: the engine reads it before then, and a streaming target's
        kept layers keep the RAM a copy of every node's logits would take."""
        self.split = split
        repacked = repacked if streams else None
        source, model_path = Path(model_path), repacked.path if repacked is not None else model_path
        self.model = LlamaModel(model_path, n_gpu_layers=n_gpu_layers, repack=not streams, vocab=not streams,  # streaming: the
                                configure=split.configure if split else None)  # tokenizer holds the vocabulary, apart (prompt/tokenizer.py)
        self.model.source = source
        self.marks = mark_weights(self.model, repacked.names, threads) if repacked is not None else None
        self.window = open_window(model_path, ahead=window, kept=kept_layers) if streams and window > 0 else None
        self.disk_stat = stat_file(model_path) if streams else None
        self.page_wait_seconds = 0.0  # the passes' waits for pages (measured with a window)
        max_tree_nodes = min(max_tree_nodes, n_ctx)
        n_seq = min(LLAMA_MAX_SEQUENCES, max_tree_nodes)  # the main sequence and one per leaf
        self.ctx = LlamaContext(
            self.model, n_ctx=n_ctx, n_batch=max(max_tree_nodes, min(n_ubatch, n_ctx)), n_ubatch=n_ubatch, n_seq_max=n_seq,
            threads=threads, kv_type=kv_type, n_outputs_max=max_tree_nodes,
            eval_callback=layer_callback(self.window.layer_done) if self.window else None,
        )
        if split is not None:
            split.attach()  # a lost worker: one line, not an abort; its traffic counted per pass
        self.n_ctx = n_ctx
        self.n_vocab = self.model.n_vocab
        self.max_tree_nodes = max_tree_nodes
        self.max_tree_leaves = n_seq - 1
        self.lend_logits = lend_logits
        self._n_cached = 0
        self._pending: tuple[DraftTree, list[list[int]]] | None = None  # the last verified tree, uncommitted

    @property
    def n_cached(self) -> int:
        return self._n_cached

    def truncate(self, n_tokens: int) -> None:
        self._drop_tree()
        n_tokens = max(0, min(n_tokens, self._n_cached))
        self.ctx.seq_rm(MAIN_SEQ, n_tokens, -1)
        self._n_cached = n_tokens

    def prefill(self, tokens: Sequence[int]) -> None:
        self._drop_tree()
        tokens = np.asarray(tokens, dtype=np.int32)
        self._check_room(len(tokens), "prompt")
        step = self.ctx.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start : start + step]
            pos = self._n_cached + np.arange(len(chunk))
            if self.window is not None:
                self.window.before_decode()
            self.ctx.decode(chunk, pos, np.zeros(len(chunk), np.int32), np.zeros(len(chunk), bool))
            self._n_cached += len(chunk)

    def forward_tree(self, tree: DraftTree) -> np.ndarray:
        self._drop_tree()
        if len(tree) > self.max_tree_nodes:
            raise OndeviceError(
                f"a draft tree of {len(tree)} nodes is more than this target verifies in one pass "
                f"({self.max_tree_nodes}); lower the draft budget."
            )
        self._check_room(len(tree), "draft tree")
        seqs = leaf_sequences(tree)
        n_leaves = len(seqs[0])
        if n_leaves > self.max_tree_leaves:
            raise OndeviceError(
                f"a draft tree with {n_leaves} leaves is more than llama.cpp verifies in one pass "
                f"({self.max_tree_leaves}); lower the draft budget."
            )
        for seq in range(1, n_leaves + 1):
            self.ctx.seq_cp(MAIN_SEQ, seq, -1, -1)
        self._pending = (tree, seqs)
        positions = self._n_cached + tree.depths
        if self.window is not None:
            self.window.pass_starts()
            self.window.before_decode()
        if self.split is not None:
            self.split.pass_starts()
        logits = self.ctx.decode(tree.tokens, positions, seqs, np.ones(len(tree), bool))
        logits = logits if self.lend_logits else np.array(logits)  # llama.cpp reuses its buffer at the next pass
        if self.split is not None:
            self.split.pass_ends(len(tree))
        if self.window is not None and (split := self.window.pass_ends()) is not None:
            self.page_wait_seconds += split.wait_seconds
        return logits

    def stream_counters(self) -> StreamCounters | None:
        """Its passes' waits for pages and the disk's busy time so far (None: it does not stream)."""
        if self.disk_stat is None and self.window is None:
            return None
        disk = read_counters(self.disk_stat)
        waits = self.window is not None and getattr(self.window, "measures", True) and self.window.failed is None
        return StreamCounters(self.page_wait_seconds if waits else None, disk.busy_seconds if disk else None)

    @property
    def rss_counted_twice(self) -> int:
        """Bytes of this process's resident memory the kernel counts more than once (the window's slots)."""
        return getattr(self.window, "counted_twice_bytes", 0)  # 0 without a window, or with the page-cache one

    def commit(self, path: Sequence[int]) -> None:
        if self._pending is None:
            raise RuntimeError("commit() needs a forward_tree() first")
        tree, seqs = self._pending
        path = [int(n) for n in path]
        if not path or path[0] != 0 or any(tree.parents[b] != a for a, b in zip(path, path[1:])):
            raise ValueError(f"{path} is not a root-first path of the verified tree")
        start = self._n_cached
        self.ctx.seq_cp(seqs[path[-1]][0], MAIN_SEQ, start, start + len(path))
        self._drop_tree()
        self._n_cached += len(path)

    def _drop_tree(self) -> None:
        if self._pending is not None:
            for seq in range(1, len(self._pending[1][0]) + 1):
                self.ctx.seq_rm(seq, -1, -1)
            self._pending = None

    def _check_room(self, n_new: int, what: str) -> None:
        if self._n_cached + n_new > self.n_ctx:
            raise OndeviceError(
                f"the {what} does not fit the target's context ({self._n_cached} + {n_new} > {self.n_ctx} tokens); "
                "start a new chat or raise the context size."
            )

    def __del__(self) -> None:
        window = getattr(self, "window", None)
        if window is not None:  # dropped unclosed (a target profiled, then freed): end its advising thread
            window.close()

    def close(self) -> None:
        """Free the context and model (again: nothing)."""
        if self.window is not None:
            self.window.close()
            self.window = None
        self.ctx.close()
        self.model.close()
        if self.marks is not None:
            self.marks.close()  # after the model: its weights point at the marks' buffer
            self.marks = None
