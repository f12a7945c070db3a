"""Every relative link in the repository's Markdown resolves, and docs/bench/INDEX.md lists exactly the
records in docs/bench.

A link is `[text](target)` or `![alt](target)` outside code; a target with a scheme (https:, mailto:)
is not followed. A relative target must name a file or folder of the checkout, and a `#fragment`
must name a heading of the Markdown file it points into (GitHub's heading ids).
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)


def tracked(suffix: str = "") -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    return [ROOT / n for n in out.decode().split("\0") if n.endswith(suffix) and (ROOT / n).is_file()]


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans (links there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    return LINK.findall(prose(text))


def slug(heading: str) -> str:
    """GitHub's id for a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The ids of a Markdown file's headings; a repeated heading gets -1, -2, … as on GitHub."""
    ids, counts = set(), {}
    for line in FENCE.sub("", markdown).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = counts.get(base, 0)
            counts[base] = n + 1
            ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def broken(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    bad = []
    for target in links(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # https:, mailto:, …
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    return bad


def test_the_link_reader_finds_links_and_skips_code():
    text = "See [a](docs/a.md#x) and ![p](p.svg).\n`[not](a.md)`\n```\n[no](b.md)\n```\n[web](https://x.org)"
    assert links(text) == ["docs/a.md#x", "p.svg", "https://x.org"]
    assert slug("The drafter-less regime planned (heldout13, heldout14)") == "the-drafter-less-regime-planned-heldout13-heldout14"
    assert slug("GPU: a target larger than the `GPU`'s memory") == "gpu-a-target-larger-than-the-gpus-memory"
    assert anchors("# A\n## A\n```\n# B\n```\n") == {"a", "a-1"}


def test_every_relative_link_in_the_markdown_resolves():
    pages = tracked(".md")
    assert any(p.name == "README.md" and p.parent == ROOT for p in pages)
    bad = [f"{p.relative_to(ROOT)}: {b}" for p in pages for b in broken(p)]
    assert not bad, f"{len(bad)} broken links:\n" + "\n".join(bad)


def test_the_bench_index_lists_exactly_the_records_in_docs_bench():
    folder = ROOT / "docs" / "bench"
    index = (folder / "INDEX.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([^`]+)` \|", index, re.MULTILINE))
    records = {p.name for p in tracked() if p.parent == folder and p.name != "INDEX.md"}
    assert records, "docs/bench holds no records"
    assert listed == records, f"not listed: {sorted(records - listed)}; listed but absent: {sorted(listed - records)}"
