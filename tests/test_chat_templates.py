"""Chat templates read from the GGUF, rendered as transformers renders them (the reference:
transformers' own `render_jinja_template`, what `apply_chat_template` calls), Qwen3's thinking
switch, one-line errors for templates that fail, and the thinking shown apart from the answer.

The Llama 3.3 and Qwen3 templates are the model makers' own (tests/data/templates/), put into tiny
GGUFs that carry the special tokens they use.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import write_tiny_gguf
from transformers.utils.chat_template_utils import render_jinja_template

from ondevice.prompt.chat_template import THINK_CLOSE, THINK_OPEN
from ondevice.cli.chat_cmd import apply_set
from ondevice.cli.think import ThinkSplitter
from ondevice.errors import OndeviceError
from ondevice.prompt.tokenizer import Tokenizer

TEMPLATES = Path(__file__).parent / "data" / "templates"
LLAMA3 = (TEMPLATES / "meta-llama-Llama-3.3-70B-Instruct.jinja").read_text()
QWEN3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
QWEN3_SPECIALS = ("<|im_start|>", "<|im_end|>")

CHAT = [
    {"role": "system", "content": "You answer in one line. "},
    {"role": "user", "content": "Name a prime. ünïcode ✓"},
    {"role": "assistant", "content": "<think>\n2 is even, 3 is not.\n</think>\n\nThree."},
    {"role": "user", "content": "Another?"},
]


def tokenizer_with(tmp_path, template: str, specials: tuple[str, ...]) -> Tokenizer:
    return Tokenizer(write_tiny_gguf(tmp_path / "chat.gguf", "llama", chat_template=template, specials=specials))


def transformers_render(template: str, messages, **kwargs) -> str:
    rendered, _ = render_jinja_template([messages], chat_template=template, add_generation_prompt=True, **kwargs)
    return rendered[0]


def test_llama3_chat_renders_as_transformers_does(tmp_path):
    tok = tokenizer_with(tmp_path, LLAMA3, LLAMA3_SPECIALS)
    ours = tok.render_chat(CHAT)
    assert ours == transformers_render(LLAMA3, CHAT, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    assert ours.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date")
    ids = tok.encode(ours, add_special=False, parse_special=True)
    assert ids[0] == tok.bos_id and ids.count(tok.eos_id) == 4  # special tokens parsed as tokens, not text


@pytest.mark.parametrize("think", [None, True, False])
def test_qwen3_thinking_switch_renders_as_transformers_does(tmp_path, think):
    tok = tokenizer_with(tmp_path, QWEN3, QWEN3_SPECIALS)
    assert tok.can_switch_thinking
    extra = {} if think is None else {"enable_thinking": think}
    ours = tok.render_chat(CHAT, think=think)
    assert ours == transformers_render(QWEN3, CHAT, bos_token="<|im_start|>", eos_token="<|im_end|>", **extra)
    assert ours.endswith("<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if think is False else ""))
    assert "2 is even" not in ours  # the earlier turn's thinking is dropped by the template itself


def test_template_without_a_thinking_switch_says_so(tmp_path):
    assert not tokenizer_with(tmp_path, LLAMA3, LLAMA3_SPECIALS).can_switch_thinking


@pytest.mark.parametrize(
    "template, message",
    [
        ("{{ raise_exception('no system messages here') }}", r"the chat template of chat.gguf refused the conversation: no system messages here"),
        ("{% for m in messages %}{{ m.content + 1 }}{% endfor %}", r"failed to render: TypeError: can only concatenate.*ondevice generate --raw"),
        ("{% for m in messages %}", r"failed to render \(line 1\): TemplateSyntaxError"),
    ],
)
def test_a_template_that_fails_is_one_line(tmp_path, template, message):
    tok = tokenizer_with(tmp_path, template, LLAMA3_SPECIALS)
    with pytest.raises(OndeviceError, match=message) as caught:
        tok.render_chat(CHAT)
    assert "\n" not in str(caught.value)


def test_thinking_is_told_apart_from_the_answer_as_it_streams():
    text = f"{THINK_OPEN}\nCount: 1, 2.{THINK_CLOSE}\n\nTwo <b>bold</b>."
    for cut in range(1, len(text)):  # every way of cutting the stream in two chunks
        splitter = ThinkSplitter()
        runs = splitter.push(text[:cut]) + splitter.push(text[cut:]) + splitter.flush()
        thinking = "".join(run for run, is_thinking in runs if is_thinking)
        answer = "".join(run for run, is_thinking in runs if not is_thinking)
        assert thinking == f"{THINK_OPEN}\nCount: 1, 2.{THINK_CLOSE}" and answer == "\n\nTwo <b>bold</b>.", cut


def test_chat_set_think():
    settings = {"think": None}
    apply_set(settings, ["think", "off"])
    assert settings["think"] is False
    apply_set(settings, ["think", "on"])
    assert settings["think"] is True
    with pytest.raises(OndeviceError, match="think needs a on/off"):
        apply_set(settings, ["think", "maybe"])
