"""`python -m ondevice.eval.ship_keep_set PAIR`: print the catalog entry of the VocabTrim keep set
built here by `ondevice quant vocab-trim` for PAIR's drafter (a maintainer's step: the catalog then
ships it, see `ondevice.vocabtrim.shipped`)."""

from __future__ import annotations

import sys

from ondevice.catalog.choose import choose
from ondevice.vocabtrim.build import TrimmedVocab, trimmed_paths
from ondevice.vocabtrim.shipped import export


def main(argv: list[str]) -> None:
    (pair,) = argv
    models = choose(pair, None, None, True)
    record = TrimmedVocab.load(trimmed_paths(models.drafter)[1])
    print(export(record, models.name))


if __name__ == "__main__":
    main(sys.argv[1:])
