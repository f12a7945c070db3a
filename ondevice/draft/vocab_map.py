"""The tokens two vocabularies share: TLI's intersection (Timor et al., ICML 2025, arXiv 2502.05202).

A drafter of another tokenizer (Gemma 3 for a Qwen2.5 target) can still propose tokens the target
verifies when it proposes only tokens whose text the target's vocabulary also holds. `VocabMap`
pairs every such drafter id with the target id of the same bytes: the text llama.cpp renders for
each ordinary token (`Tokenizer.piece`: SentencePiece's "▁" is a space there, byte-level BPE's "Ġ"
too, and byte tokens are their byte). Control, unused and unknown tokens take no part. Where one
vocabulary spells the same bytes twice (Gemma's "<0x41>" and "A"), the ordinary token is kept over
the byte token, so the map is one-to-one: a drafter's siblings stay distinct target tokens, and its
distribution restricted to the shared tokens carries over to target ids unchanged (what Sequoia's
rule needs of q).

Building it reads every token of both vocabularies (~3 s for 262k + 152k ids on 2 cores), so the
map is saved once per pair of files, as JSON beside the drafter (or under the home when the drafter
lies in another program's store: catalog/stores/derived.py), keyed by both files' identity.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from ondevice import paths
from ondevice.catalog.stores.derived import derived_path
from ondevice.errors import OndeviceError
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.decode.tree import DraftTree

MAP_VERSION = 1
# a drafter listing more ids than this is refused: every draft row and its map entry grow with it
MAX_FOREIGN_VOCAB = 1 << 20
# fewer shared tokens than this share of the target's ordinary ones: too few drafts could be accepted
MIN_SHARED_FRACTION = 0.05
_SKIPPED = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNUSED | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN


def token_texts(tok: Tokenizer) -> dict[bytes, int]:
    """The ordinary tokens of a vocabulary by their bytes: one id per text, an ordinary token before a byte token."""
    by_text: dict[bytes, int] = {}
    byte_token: set[int] = set()
    for t in range(tok.n_vocab):
        attr = tok.attr(t)
        if attr & _SKIPPED:
            continue
        text = tok.piece(t)
        if not text:
            continue
        earlier = by_text.get(text)
        if earlier is None or (earlier in byte_token and not attr & llama_cpp.LLAMA_TOKEN_ATTR_BYTE):
            by_text[text] = t
        if attr & llama_cpp.LLAMA_TOKEN_ATTR_BYTE:
            byte_token.add(t)
    return by_text


@dataclass(frozen=True)
class VocabMap:
    """Drafter id drafter_ids[i] has the text of target id target_ids[i]; both one-to-one."""

    drafter_ids: np.ndarray  # (n,) int64, ascending
    target_ids: np.ndarray  # (n,) int64
    n_drafter: int
    n_target: int

    @property
    def to_target(self) -> np.ndarray:
        """(n_drafter,) int64: the target id of each drafter id, -1 where the target has no such token."""
        out = np.full(self.n_drafter, -1, dtype=np.int64)
        out[self.drafter_ids] = self.target_ids
        return out

    @property
    def blocked(self) -> np.ndarray:
        """(n_drafter - n,) the drafter ids outside the intersection: never drafted."""
        allowed = np.zeros(self.n_drafter, dtype=bool)
        allowed[self.drafter_ids] = True
        return np.flatnonzero(~allowed)

    @classmethod
    def build(cls, target: Tokenizer, drafter: Tokenizer) -> "VocabMap":
        check_size(drafter)
        ours, theirs = token_texts(target), token_texts(drafter)
        pairs = sorted((d, ours[text]) for text, d in theirs.items() if text in ours)
        found = cls(np.array([d for d, _ in pairs], dtype=np.int64), np.array([t for _, t in pairs], dtype=np.int64),
                    drafter.n_vocab, target.n_vocab)
        found.check(drafter.path.name, target.path.name, len(ours))
        return found

    def check(self, drafter: str, target: str, target_ordinary: int) -> None:
        """One-line errors for a drafter that could never or hardly ever be right."""
        shared = len(self.drafter_ids)
        if shared == 0:
            raise OndeviceError(f"the drafter {drafter} and the target {target} share no token text: nothing it drafts could be "
                                "verified; pick a drafter whose tokenizer shares tokens with the target's.")
        if shared < MIN_SHARED_FRACTION * target_ordinary:
            raise OndeviceError(f"the drafter {drafter} shares only {shared:,} of the target {target}'s {target_ordinary:,} tokens "
                                f"(under {MIN_SHARED_FRACTION:.0%}): few of its drafts could be accepted; pick a drafter closer to the target's tokenizer.")

    def tree_to_target(self, tree: DraftTree, root_token: int, to_target: np.ndarray) -> DraftTree:
        """The drafter's tree in target ids, rooted at the target's `root_token`; a node whose token the
        target lacks goes with its subtree (none does when drafting was restricted to the intersection).
        q rows (drafter vocabulary) become target-vocabulary rows: the same probabilities, moved."""
        mapped = to_target[tree.tokens]
        keep = mapped >= 0
        keep[0] = True
        for i in range(1, len(tree)):
            keep[i] &= keep[tree.parents[i]]
        nodes = np.flatnonzero(keep)
        new_id = np.full(len(tree), -1, dtype=np.int64)
        new_id[nodes] = np.arange(len(nodes))
        parents = np.where(tree.parents[nodes] >= 0, new_id[tree.parents[nodes]], -1)
        tokens = mapped[nodes]
        tokens[0] = root_token
        out = DraftTree(tokens, parents, tree.logprobs[nodes])
        for node, row in tree.q.items():
            if keep[node]:
                q = np.zeros(self.n_target, dtype=row.dtype)
                q[self.target_ids] = row[self.drafter_ids]
                out.q[int(new_id[node])] = q
        return out

    # --- saved once per pair of files ---------------------------------------------------------
    @classmethod
    def load(cls, target: Tokenizer, drafter: Tokenizer, status=None) -> "VocabMap":
        """The saved map of these two files, else built now (and saved)."""
        check_size(drafter)
        path, key = map_path(target.path, drafter.path)
        saved = paths.read_state(path, lambda data: cls.from_dict(data, key), "vocabulary map")
        if saved is not None:  # checked when it was built
            return saved
        if status is not None:
            status(f"mapping the vocabulary of {drafter.path.name} onto {target.path.name}'s (once)")
        built = cls.build(target, drafter)
        paths.write_json(path, built.to_dict(key))
        return built

    def to_dict(self, key: str) -> dict:
        return {"version": MAP_VERSION, "key": key, "n_drafter": self.n_drafter, "n_target": self.n_target,
                "drafter_ids": self.drafter_ids.tolist(), "target_ids": self.target_ids.tolist()}

    @classmethod
    def from_dict(cls, data: dict, key: str) -> "VocabMap | None":
        """None: a map of other files (or another version), to be built again."""
        if data.get("version") != MAP_VERSION or data.get("key") != key:
            return None
        d, t = np.asarray(data["drafter_ids"], dtype=np.int64), np.asarray(data["target_ids"], dtype=np.int64)
        n_d, n_t = int(data["n_drafter"]), int(data["n_target"])
        if d.shape != t.shape or d.ndim != 1 or (len(d) and (d.min() < 0 or d.max() >= n_d or t.min() < 0 or t.max() >= n_t)):
            raise ValueError("ids out of range")
        if len(np.unique(d)) != len(d) or len(np.unique(t)) != len(t):
            raise ValueError("not one-to-one")
        return cls(d, t, n_d, n_t)


def check_size(drafter: Tokenizer) -> None:
    if drafter.n_vocab > MAX_FOREIGN_VOCAB:
        raise OndeviceError(f"the drafter {drafter.path.name} lists {drafter.n_vocab:,} token ids; drafting across vocabularies "
                            f"takes at most {MAX_FOREIGN_VOCAB:,} (every draft row grows with them); pick a drafter with a smaller vocabulary.")


def map_path(target: Path, drafter: Path) -> tuple[Path, str]:
    """Where the map of these two files is saved, and the key naming their current contents."""
    identity = []
    for path in (target, drafter):
        real = os.path.realpath(path)
        info = os.stat(real)
        identity.append(f"{real}\0{info.st_size}\0{info.st_mtime_ns}")
    key = hashlib.sha256("\0\0".join(identity).encode("utf-8", "surrogateescape")).hexdigest()
    target_key = hashlib.sha256(identity[0].encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return derived_path(drafter, f"{Path(drafter).name.removesuffix('.gguf')}.vocab-map-{target_key}.json"), key
