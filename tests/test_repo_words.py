"""The repository speaks of what the product is and does, never of how the work on it was done.

Every tracked text file (README, docs/, ondevice/, tests/, scripts/, models/, …) is searched for
words that number or name steps of the work instead of the product: a step or a ticket named by its
number or as "this one", a test table named after a ticket. A chat's "session" is product language
and is not searched for. Measurement documents cite commits, which is evidence.

The patterns are built from pieces so that this file's own text does not match them.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_STOP, _ISSUE = "st" + "op", "iss" + "ue"
WORK_WORDS = [
    re.compile(rf"\b{_STOP}s? #?\d+", re.IGNORECASE),  # a numbered step of the work
    re.compile(rf"\b{_ISSUE}s? #?\d+", re.IGNORECASE),  # a numbered ticket
    re.compile(rf"\b(?:this|previous) {_STOP}\b", re.IGNORECASE),
    re.compile(rf"\bthe {_STOP}'s\b", re.IGNORECASE),
    re.compile(rf"\bthe {_ISSUE}'s\b", re.IGNORECASE),
    re.compile(rf"\b{_ISSUE.upper()}_CASES\b"),
]


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file():
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # binary
            files.append(path)
    return files


def work_words(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line holding a word about how the work was done."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if any(p.search(line) for p in WORK_WORDS)]


def test_the_patterns_catch_work_words_and_spare_product_words():
    caught = [f"Sized free rounds ({_STOP} 39)", f"{_ISSUE} 10, item 6", f"until this {_STOP} the table",
              f"the {_ISSUE}'s cases", f"{_ISSUE.upper()}_CASES = [", f"{_STOP.capitalize()} 35, a fresh set"]
    spared = ["a chat session keeps its history", "stop sequences (up to 4)", "signals that stop it",
              '{"issue": 1, "release": -1}', "copies issued and not yet released", "measured at commit d6bf8b0"]
    assert all(work_words(s) for s in caught)
    assert not any(work_words(s) for s in spared)


def test_no_tracked_file_speaks_of_how_the_work_was_done():
    files = tracked_text_files()
    assert any(p.name == "README.md" for p in files) and Path(__file__).resolve() in files
    hits = [f"{p.relative_to(ROOT)}:{n}: {line[:160]}" for p in files for n, line in work_words(p.read_text(encoding="utf-8"))]
    assert not hits, f"{len(hits)} lines speak of the work, not the product:\n" + "\n".join(hits)
