"""VocabTrim (Goel et al. 2025): a drafter whose LM head scores only the K tokens the target uses.

`build`: calibrate on the target, choose the K ids, write the trimmed GGUF and its record.
`shipped`: the keep sets the catalog ships, so a streaming target gets a trimmed drafter at once.
`names`: where a trimmed drafter and its record live.
`head`: run a trimmed drafter as if it were the full one (target ids in, full-width logits out).
"""
