"""VocabTrim keep sets shipped with the catalog: a streaming target gets the trimmed drafter at once.

`ondevice quant vocab-trim` chooses the kept tokens by running the target on calibration prompts —
minutes where the target fits in RAM, far longer where it streams from disk, which is exactly where
the trimmed drafter matters: it holds 139 MB less of the default pair's drafter in RAM, room that
keeps target layers cached (fewer bytes read per pass). So a catalog pair ships the keep set its
calibration chose (`catalog/models/<pair>.vocab-trim.json`, written by `export`), and
`trim_for_streaming` writes the trimmed GGUF from it — a slice of the drafter's own rows, no model
run — when the target streams and the drafter file is the one the set was built for (sha256), and
again where the catalog now ships another set than the one a drafter was trimmed to.

    python -m ondevice.eval.ship_keep_set qwen2.5-coder-1.5b   # ship the set `quant vocab-trim` built here
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import numpy as np

from ondevice.paths import inside, warn, write_json
from ondevice.vocabtrim.build import TrimmedVocab, build_trimmed, trimmed_paths, trimmed_record

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "catalog" / "models"
SHIPPED_NOTE = "(shipped with ondevice's catalog)"  # ends the calibration words of a drafter trimmed from a shipped set


def shipped_path(pair: str) -> Path:
    return inside(SHIPPED_DIR, f"{pair}.vocab-trim.json", f"the shipped keep set of {pair}")


def export(record: TrimmedVocab, pair: str) -> Path:
    """Save a built record's keep set for the catalog pair: a zlib-compressed bitmap over the ids."""
    kept = np.zeros(record.n_vocab, dtype=bool)
    kept[list(record.keep_ids)] = True
    bitmap = base64.b64encode(zlib.compress(np.packbits(kept).tobytes(), 9)).decode()
    path = shipped_path(pair)
    write_json(path, {"drafter_sha256": record.source_sha256, "drafter_file": record.source_file, "n_vocab": record.n_vocab,
                      "k": record.k, "calibration": record.calibration, "keep_bitmap": bitmap})
    return path


def shipped_keep_ids(pair: str, drafter_sha256: str) -> tuple[np.ndarray, str] | None:
    """(keep_ids, how they were chosen) shipped for this pair's drafter file, or None."""
    path = shipped_path(pair)
    if not path.exists():
        return None
    return read_keep_set(path, drafter_sha256)


def read_keep_set(path: Path, drafter_sha256: str) -> tuple[np.ndarray, str] | None:
    """(keep_ids, how they were chosen) of a keep set written by `export`, or None if it was made for
    another drafter file."""
    shipped = json.loads(path.read_text())
    if shipped["drafter_sha256"] != drafter_sha256:
        return None
    bits = np.unpackbits(np.frombuffer(zlib.decompress(base64.b64decode(shipped["keep_bitmap"])), dtype=np.uint8))
    keep_ids = np.flatnonzero(bits[: shipped["n_vocab"]])
    assert len(keep_ids) == shipped["k"], f"{path} is damaged: {len(keep_ids)} ids, not {shipped['k']}"
    return keep_ids, shipped["calibration"]


def trim_for_streaming(pair: str, drafter: Path, drafter_sha256: str | None, show=None) -> bool:
    """Write the trimmed drafter from the shipped keep set where none is built yet, or where the one
    built was cut from a keep set the catalog shipped before (a drafter trimmed by `ondevice quant
    vocab-trim` stays); True if it wrote one. show(message): a status line while it writes (parsing
    and slicing the drafter, seconds)."""
    if drafter_sha256 is None:
        return False
    shipped = shipped_keep_ids(pair, drafter_sha256)
    if shipped is None or not _needs_writing(drafter, shipped[0]):
        return False
    keep_ids, calibration = shipped
    if show is not None:
        show(f"writing the trimmed-vocabulary drafter {trimmed_paths(drafter)[0].name} (once: it leaves RAM to the target)")
    try:
        build_trimmed(drafter, keep_ids, f"{calibration} {SHIPPED_NOTE}")
    except OSError as err:  # a read-only or full models folder: the full drafter drafts, as in RAM
        trimmed = trimmed_paths(drafter)[0]
        trimmed.with_name(trimmed.name + ".partial").unlink(missing_ok=True)
        warn(f"cannot write the trimmed drafter {trimmed} ({err.strerror}); the full drafter drafts instead")
        return False
    return True


def _needs_writing(drafter: Path, keep_ids: np.ndarray) -> bool:
    """No trimmed drafter is built, or the one built came from another keep set of the catalog's."""
    built = trimmed_record(drafter)
    return built is None or (built.calibration.endswith(SHIPPED_NOTE) and built.keep_ids != tuple(int(i) for i in keep_ids))
