"""Hostile chat templates: each ends in one line that says truthfully what happened, of bounded length,
within the time budget, without this process's memory growing — the template runs in a child process
(ondevice/prompt/template_process.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from ondevice.errors import OndeviceError
from ondevice.prompt import template_process
from ondevice.prompt.template_process import TEMPLATE_SECONDS, render
from tiny_models import CHATML, write_tiny_gguf

USER = [{"role": "user", "content": "hi"}]
NESTED_LOOPS = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
SLACK = 10  # seconds past the budget for a kill and a fresh worker on a CPU shared with other work (these tests run at nice 19)


def refused(template: str) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(OndeviceError) as caught:
        render(template, USER, model="hostile.gguf", add_generation_prompt=True)
    message = str(caught.value)
    assert "\n" not in message and "hostile.gguf" in message, message
    return message, time.monotonic() - started


def test_a_real_template_renders_as_before():
    assert render(CHATML, USER, model="m.gguf", add_generation_prompt=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_template_range_1e9_is_one_line():
    assert "Range too big" in refused("{% for i in range(10**9) %}{% endfor %}")[0]


def test_template_recursive_macro_is_one_line():
    assert "RecursionError" in refused("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")[0]


def test_template_nested_loops_stop_at_the_time_budget():
    message, seconds = refused(NESTED_LOOPS)
    assert "did not render within" in message and seconds < TEMPLATE_SECONDS + SLACK
    assert render(CHATML, USER, model="m.gguf").startswith("<|im_start|>")  # a fresh worker took over


@pytest.mark.parametrize("template", ["{{ 'x' * 10**8 }}", "{{ 'x' * 10**10 }}", "{{ 'x'.zfill(10**10) }}", "{{ 'x' | center(10**10) }}"])
def test_template_huge_string_is_refused_and_this_process_does_not_grow(template):
    before = psutil.Process().memory_info().rss
    message, seconds = refused(template)
    assert "characters" in message or "MiB" in message, message
    assert psutil.Process().memory_info().rss - before < 50 << 20 and seconds < TEMPLATE_SECONDS + SLACK


def test_worker_of_a_killed_parent_stops(tmp_path):
    """A parent killed mid-render (kill -9) leaves no worker spinning: the worker's own alarm ends the
    render, then it finds its input closed and exits."""
    script = textwrap.dedent(f"""
        import threading, time
        from ondevice.prompt import template_process as tp
        threading.Thread(target=lambda: tp.render({NESTED_LOOPS!r}, [], model="m"), daemon=True).start()
        while tp._shared._proc is None:
            time.sleep(0.01)
        print(tp._shared._proc.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    worker = psutil.Process(int(parent.stdout.readline()))
    time.sleep(0.5)
    assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE  # rendering the loops
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    try:
        worker.wait(TEMPLATE_SECONDS + SLACK)
    except psutil.TimeoutExpired:
        worker.kill()
        pytest.fail("the template worker outlived its parent")


def test_hostile_template_in_the_cli_is_one_line(tmp_path):
    model = write_tiny_gguf(tmp_path / "hostile.gguf", arch="llama", chat_template=NESTED_LOOPS)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "ondevice", "generate", "hi", "--target", str(model), "--no-draft", "--threads", "1"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "ONDEVICE_HOME": str(tmp_path / "home")})
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1 and "did not render within" in lines[0], result.stderr
    assert time.monotonic() - started < TEMPLATE_SECONDS + 30


def generate_with(tmp_path, template: str, *args: str) -> subprocess.CompletedProcess:
    model = write_tiny_gguf(tmp_path / "t.gguf", arch="llama", chat_template=template)
    return subprocess.run([sys.executable, "-m", "ondevice", "generate", "hi", "--target", str(model), "--no-draft", "--threads", "1", *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "ONDEVICE_HOME": str(tmp_path / "home")})


def error_of(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_template_calling_an_unknown_codec_says_so_at_once():
    """It was reported as "did not render within 5 s" after 1.1 s: the worker died of a LookupError."""
    message, seconds = refused("{{ 'x'.encode('no-such-codec') }}")
    assert "LookupError" in message and "no-such-codec" in message and "within" not in message, message
    assert seconds < TEMPLATE_SECONDS
    assert render(CHATML, USER, model="m.gguf").startswith("<|im_start|>")  # the same worker renders on


def test_template_error_of_ten_megabytes_is_cut(tmp_path):
    line = error_of(generate_with(tmp_path, "{{ raise_exception('E' * 10**7) }}"))
    assert "refused the conversation: EEEE" in line and "more characters" in line and len(line) < 1000, line[:300]


def test_template_error_holding_markup_is_printed_as_it_is(tmp_path):
    line = error_of(generate_with(tmp_path, "{{ raise_exception('[/oops] and [bold]bold[/bold]') }}"))
    assert line.endswith("refused the conversation: [/oops] and [bold]bold[/bold]"), line


def test_template_writing_a_lone_surrogate_is_one_line(tmp_path):
    line = error_of(generate_with(tmp_path, "{{ '\\ud800' }}" + CHATML))
    assert "lone surrogate (U+D800)" in line and "chat template of t.gguf" in line, line


def test_bench_with_a_prompt_longer_than_the_context_is_one_line(tmp_path):
    """A 4 MB template's prompt does not fit the context: the target alone cannot run it, so no
    configuration can; bench says so (it crashed on the missing draft spec of the target-alone row)."""
    model = write_tiny_gguf(tmp_path / "big.gguf", arch="llama", chat_template=CHATML + "y" * (4 << 20))
    result = subprocess.run([sys.executable, "-m", "ondevice", "bench", "--target", str(model), "--no-draft", "--threads", "1",
                             "--limit", "1", "--max-tokens", "4", "--trees", "chain"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "ONDEVICE_HOME": str(tmp_path / "home")})
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[-1].startswith("error: the prompt is") and "context" in lines[-1], lines[-1]


@pytest.fixture(autouse=True)
def _fresh_worker():
    yield
    template_process._shared.close()
