"""String-level exact match (SLEM; Timor et al., ICML 2025): a drafter's tree as the target's own tokens.

Restricted to the tokens both vocabularies hold (TLI, draft/vocab_map.py), a drafter still spells
its text its own way, and a target token is accepted only when it is the very id the target would
choose: Gemma 3 drafting "_prime(num" as "_", "prime", "(", "num" for a Qwen target that writes
"_prime", "(num" gets none of them accepted. Here every root→leaf path of the drafter's tree (drafted
over its whole vocabulary) becomes text, the target's tokenizer tokenizes that text, and the paths'
target tokens are merged by token path into one tree (draft/free_tree.py's trie) cut to the budget.

Each target token is scored with the drafter's cumulative log-prob at the first drafter token whose
text reaches the target token's end, so steps stay ≤ 0 and the best `budget` nodes form a tree. A path
stops at a control token (empty text) and before bytes that end inside a character.

Exact under greedy and SpecExec's rule (any tree of target ids is); the proposal is a deterministic
function of the context, so for Sequoia's rule it is a point mass (free_tree.point_mass_chain) — the
cross-vocabulary drafter uses TLI instead when children are sampled.
"""

from __future__ import annotations

import codecs

import numpy as np

from ondevice.draft.free_tree import merge_trees
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.decode.tree import DraftTree


class TextMatch:
    def __init__(self, target: Tokenizer, drafter: Tokenizer):
        self.target, self.drafter = target, drafter
        self._pieces: dict[int, bytes] = {}  # drafter id -> its bytes (a tree's tokens repeat)

    def piece(self, token: int) -> bytes:
        text = self._pieces.get(token)
        if text is None:
            text = self._pieces[token] = self.drafter.piece(token)
        return text

    def tree(self, drafted: DraftTree, root_token: int, budget: int, max_depth: int | None = None) -> DraftTree:
        """The drafter's tree (its ids) as a tree of target ids rooted at `root_token`."""
        chains = [self.chain(drafted, leaf, root_token) for leaf in drafted.leaves() if leaf != 0]
        chains = [c for c in chains if len(c) > 1]
        if not chains:
            return DraftTree.root_only(root_token)
        return merge_trees(chains, budget, max_depth)

    def chain(self, drafted: DraftTree, leaf: int, root_token: int) -> DraftTree:
        """One root→leaf path, its text tokenized by the target."""
        path = drafted.path_to(leaf)[1:]
        ends, scores, data = [], [], b""
        for node in path:
            text = self.piece(int(drafted.tokens[node]))
            if not text:  # a control token: the text ends here
                break
            data += text
            ends.append(len(data))
            scores.append(float(drafted.logprobs[node]))
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(data, final=False)
        if not text:
            return DraftTree.root_only(root_token)
        ids = self.target.encode(text, add_special=False, parse_special=False)
        reach = np.cumsum([len(self.target.piece(t)) for t in ids])  # byte end of each target token
        at = np.minimum(np.searchsorted(ends, reach), len(ends) - 1)  # the drafter token whose text covers it
        cum = np.asarray(scores)[at]
        steps = np.diff(np.concatenate([[0.0], cum]))
        return DraftTree.chain(root_token, [int(t) for t in ids], np.minimum(steps, 0.0).tolist())
