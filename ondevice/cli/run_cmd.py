"""`ondevice generate`: one answer, as text or as one JSON object with the decoding stats."""

from __future__ import annotations

import json
import sys

import typer

from ondevice.cli import options as opt
from ondevice.cli.decoding import Decoding, err, keeping_drafter, load_pipeline, stats_line
from ondevice.cli.literal import say
from ondevice.decode.engine import Stats
from ondevice.loading.options import Answers, LoadOptions
from ondevice.prompt.text import check_text
from ondevice.rpc.view import split_line


@opt.load_options
@opt.decoding_options()
def generate(
    prompt: str = typer.Argument(..., help="The prompt (sent through the chat template unless --raw)."),
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as is, without the chat template."),
    as_json: opt.Json = False,
    *,
    decoding: Decoding,
    load: LoadOptions,
) -> None:
    """Generate one answer for PROMPT and exit."""
    check_text(prompt, "the prompt")  # before the models load
    sampling, spec, think, max_tokens = decoding.sampling, decoding.spec(load.draft), decoding.think, decoding.max_tokens
    pipe = load_pipeline(keeping_drafter(load, [spec]), Answers((prompt,), max_tokens))  # a streaming target's context is sized to them
    if think is not None and not pipe.tokenizer.can_switch_thinking:
        say(err, f"{pipe.pair.target.name}'s chat template has no thinking switch: --{'' if think else 'no-'}think changes nothing", "dim")
    ids = pipe.encode_prompt(prompt) if raw else pipe.encode_chat([{"role": "user", "content": prompt}], think=think)
    text, token_ids, stats = [], [], None
    for rec in pipe.stream_tokens(ids, max_tokens=max_tokens, sampling=sampling, spec=spec):
        text.append(rec.text)
        token_ids += rec.token_ids
        stats = rec.stats or stats
        if not as_json:
            sys.stdout.write(rec.text)
            sys.stdout.flush()
    if as_json:
        print(json.dumps(result_json(pipe, ids, "".join(text), token_ids, stats)))
    else:
        print()
        say(err, stats_line(stats, pipe), "dim")
        if getattr(pipe.engine.target, "split", None) is not None:
            say(err, split_line(pipe.engine.target.split), "dim")
        elif getattr(pipe.engine.target, "streamer", None) is not None:
            say(err, pipe.engine.target.placement_summary(), "dim")
        elif pipe.memory is not None and pipe.memory.streams:
            read = f", {stats.bytes_read_per_pass / 1e9:.2f} GB read per pass" if stats.bytes_read_per_pass is not None else ""
            say(err, f"{pipe.memory.describe()}{read}, peak RSS {pipe.peak_rss() / 1e9:.2f} GB", "dim")


def result_json(pipe, prompt_ids, text, token_ids, stats: Stats) -> dict:
    return {"text": text, "prompt_token_ids": prompt_ids, "token_ids": token_ids, **pipe.stats_json(stats)}
