"""Decoding: the draft tree (tree.py), the interfaces the engine knows (protocols.py), verification
(verify.py), the loop that drafts, verifies and commits (engine.py), drafting beside the target's
pass (overlap.py), the KV cache's kept prefix (kvcache.py) and the target alone's greedy answer that
exactness is held to (reference.py)."""
