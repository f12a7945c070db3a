"""The bench's prompt sets: the agent-like conversations are well formed, and `ondevice bench --prompts
agent` runs the free and hybrid builders on them with the target alone's answers (tiny catalog pair)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ondevice.bench import prompt_sets as prompts
from tiny_models import write_tiny_pair


def test_agent_sessions_revise_the_same_code_turn_after_turn():
    sessions, current = [], []
    for conversation in prompts.AGENT_EVAL:
        assert conversation[-1]["role"] == "user" and [m["role"] for m in conversation] == ["user", "assistant"] * (len(conversation) // 2) + ["user"]
        if len(conversation) == 1:
            current = []
            sessions.append(current)
        else:
            assert conversation[:-2] == current[-1]  # the last prompt, its answer, the next turn
        current.append(conversation)
    assert len(sessions) >= 2 and all(len(s) >= 4 for s in sessions)
    last = sessions[0][-1]
    answers = [m["content"] for m in last if m["role"] == "assistant"]
    assert all("def parse_log_line" in a for a in answers)  # every answer re-emits the function being revised


def test_every_set_reads_as_chat_messages():
    for name, items in prompts.SETS.items():
        for item in items:
            messages = prompts.messages(item)
            assert messages[-1]["role"] == "user" and all(m["content"] for m in messages), name
    assert len(prompts.EDIT_EVAL) >= 5


def test_bench_runs_the_agent_set_and_every_answer_is_the_target_alones(tmp_path):
    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    env = {**os.environ, "ONDEVICE_HOME": str(tmp_path)}
    args = ["bench", "-m", "tiny", "--threads", "1", "--ctx", "4096", "--prompts", "agent", "--limit", "2",
            "--trees", "suffix,recycle,hybrid", "--budgets", "4", "-n", "12", "--json"]  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "ondevice", *args], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["prompt_set"] == "agent"
    assert [r["config"] for r in report["results"]] == ["target only", "suffix @4", "recycle @4", "hybrid @4"]
    assert all(r["tokens"] == 24 and r["same_as_target"] == 2 for r in report["results"])
