"""The CUDA tests as one step of the GPU check: `pytest -m cuda` in its own process, summed up.

On the GPU machine some test modules cannot be imported (they need llama.cpp, which is not there);
pytest goes on past them (`--continue-on-collection-errors`) and they are listed apart from the
tests that ran and failed.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"


def run_cuda_tests(work: Path, seconds: float, tests: Path = TESTS) -> dict:
    if not tests.is_dir():
        return {"status": "skipped", "why": f"no tests folder at {tests} (an installed package, not the repository)"}
    xml = work / "cuda-tests.xml"
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
               f"--junitxml={xml}", str(tests)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds, cwd=tests.parent)
    except subprocess.TimeoutExpired:
        return {"status": "timed out", "why": f"pytest still running after {seconds:.0f} s", **_summary(xml)}
    summary = _summary(xml)
    if not summary:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return {"status": "failed", "why": " | ".join(tail) or f"pytest exit status {done.returncode}"}
    ok = summary["failed"] == 0 and summary["errors"] == 0
    return {"status": "ok" if ok else "failed", "pytest_exit_status": done.returncode, **summary}


def _summary(xml: Path) -> dict:
    """Counts and the names of failed tests from pytest's JUnit XML; collection errors apart."""
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return {}
    passed, skipped, failed, errors, unimportable = 0, 0, [], [], []
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            passed += 1
        elif outcome.tag == "skipped":
            skipped += 1
        elif not case.get("classname") or case.get("name") == case.get("classname"):  # a module that did not import
            unimportable.append(f"{case.get('name')}: {_import_error(outcome)}")
        else:
            (failed if outcome.tag == "failure" else errors).append(f"{name}: {(outcome.get('message') or '').splitlines()[0][:160]}")
    return {"passed": passed, "skipped": skipped, "failed": len(failed), "errors": len(errors), "failures": failed + errors,
            "modules_not_imported": unimportable}  # fmt: skip


def _import_error(outcome: ET.Element) -> str:
    """The line of a collection error that names what failed to import (ModuleNotFoundError: …)."""
    lines = [line.lstrip("E ").strip() for line in (outcome.text or "").splitlines() if "Error" in line]
    return (lines[-1] if lines else outcome.get("message") or "collection failure")[:160]
