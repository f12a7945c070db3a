"""`ondevice chat`: an interactive terminal chat that streams tokens and keeps the conversation.

Slash commands (ollama-style): /help, /set KEY VALUE, /show, /clear, /bye; wrap multi-line input
in triple quotes (\"\"\"). Keys as in ollama: Ctrl-C during an answer stops it after the current
target pass and returns to the prompt; the stopped answer is left out of the conversation (ollama
keeps the question and drops the partial reply; a second Ctrl-C quits). Ctrl-C or Ctrl-D at the
prompt ends the chat. When the conversation no longer fits the context, its oldest turns are
dropped, with a one-line notice.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, replace

import typer

from ondevice.cli import options as opt
from ondevice.cli.decoding import Decoding, console, err, keeping_drafter, load_pipeline, make_spec, run_outliving_lost_workers, stats_line
from ondevice.cli.literal import error_line, say
from ondevice.cli.terminal import LineReader, ctrl_c_stops_the_answer
from ondevice.cli.think import ThinkSplitter
from ondevice.errors import OndeviceError
from ondevice.loading.options import STREAMING_CHAT_CTX, LoadOptions
from ondevice.prompt.text import check_text
from ondevice.decode.verify import Sampling

HELP = """commands:
  /set temperature X | top_p X | top_k N | seed N | max_tokens N | tree NAME | budget N | system TEXT | think on|off
  /show      model, backend and settings
  /clear     forget the conversation
  /bye       exit (or Ctrl-D, or Ctrl-C at the prompt)
  \"\"\"       start/end multi-line input
  Ctrl-C     while answering: stop the answer (it is left out of the conversation)"""


def read_message(keyboard: LineReader, idle=None) -> str | None:
    """One user message from stdin; None at end of input (Ctrl-D) or on Ctrl-C: the chat ends.
    Ctrl-C inside a multi-line message drops that message (""). idle(): see LineReader.read."""
    try:
        line = keyboard.read(">>> ", idle)
    except (EOFError, KeyboardInterrupt):
        print()  # the shell's prompt starts on a new line
        return None
    if not line.strip().startswith('"""'):
        return line
    lines = [line.strip()[3:]]
    while not lines[-1].rstrip().endswith('"""'):
        try:
            lines.append(keyboard.read("... "))
        except EOFError:
            break
        except KeyboardInterrupt:
            print()
            return ""
    lines[-1] = lines[-1].rstrip().removesuffix('"""')
    return "\n".join(lines).strip()


def apply_set(settings: dict, args: list[str]) -> None:
    if len(args) < 2:
        raise OndeviceError("usage: /set KEY VALUE (see /help).")
    key, value = args[0].replace("-", "_"), " ".join(args[1:])
    kinds = {"temperature": float, "top_p": float, "top_k": int, "seed": int, "max_tokens": int, "tree": str, "budget": int, "system": str,
             "think": _on_off}
    if key not in kinds:
        raise OndeviceError(f"unknown setting {key!r}; settable: {', '.join(kinds)}.")
    try:
        settings[key] = kinds[key](value)
    except ValueError:
        raise OndeviceError(f"{key} needs a {kinds[key].__name__.strip('_').replace('_', '/')}, got {value!r}.") from None


def _on_off(value: str) -> bool:
    if value.lower() in ("on", "true", "yes", "1"):
        return True
    if value.lower() in ("off", "false", "no", "0"):
        return False
    raise ValueError(value)


@opt.load_options
@opt.decoding_options(max_tokens=1024)
def chat(
    system: str = typer.Option("", "--system", help="System prompt."),
    *,
    decoding: Decoding,
    load: LoadOptions,
) -> None:
    """Chat with the model in the terminal (downloads the default pair on first use)."""
    settings = {**asdict(decoding), "system": check_text(system, "--system")}
    no_draft = not load.draft
    spec = decoding.spec(load.draft)  # bad options fail before loading
    if load.rpc is not None:
        run_outliving_lost_workers(load.rpc, "chat")
    load = replace(keeping_drafter(load, [spec]), streaming_ctx=STREAMING_CHAT_CTX)  # a streaming target: RAM for layers
    with load_pipeline(load) as pipe:
        say(err, f"{pipe.pair.description} · {pipe.placement_line()} · /help for commands, /bye to exit", "dim")
        converse(pipe, settings, no_draft)


def converse(pipe, settings: dict, no_draft: bool) -> None:
    """The read → answer loop, until /bye, Ctrl-D or Ctrl-C at the prompt."""
    from ondevice.rpc.supervise import load_state, save_state  # a chat started again after a lost worker

    history: list[dict[str, str]] = []
    if (state := load_state()) is not None:
        history, settings = state["history"], {**settings, **state["settings"]}
        say(err, f"the conversation so far is kept ({len(history)} messages)", "dim")
    keyboard = LineReader()
    while True:
        idle = pipe.idle_step if settings["tree"] == "auto" and not no_draft else None  # the planner measures while you type
        message = read_message(keyboard, idle)
        if message is None or message.strip() in ("/bye", "/exit", "/quit"):
            break
        if not message.strip():
            continue
        try:
            if message.startswith("/"):
                handle_command(message, settings, history, pipe)
                save_state(history, settings)
                continue
            history.append({"role": "user", "content": message})
            answer = answer_once(pipe, history, settings, no_draft)
            if answer is not None:  # None: stopped with Ctrl-C, the question stays (as in ollama)
                history.append({"role": "assistant", "content": answer})
            save_state(history, settings)
        except OndeviceError as e:
            err.print(error_line(e), soft_wrap=True)
            if history and history[-1]["role"] == "user":
                history.pop()


def handle_command(message: str, settings: dict, history: list, pipe) -> None:
    cmd, *args = message.split()
    if cmd == "/help":
        console.print(HELP)
    elif cmd == "/set":
        apply_set(settings, args)
    elif cmd == "/show":
        say(console, f"model {pipe.pair.name} · {pipe.placement_line()}")
        say(console, ", ".join(f"{k}={v!r}" for k, v in settings.items()))
    elif cmd == "/clear":
        history.clear()
        console.print("conversation cleared")
    else:
        raise OndeviceError(f"unknown command {cmd}; /help lists them.")


def answer_once(pipe, history: list[dict[str, str]], settings: dict, no_draft: bool) -> str | None:
    """Stream the answer to the conversation; its text, or None if Ctrl-C stopped it."""
    sampling = Sampling(settings["temperature"], settings["top_p"], settings["top_k"], settings["seed"])
    spec = make_spec(settings["tree"], settings["budget"], no_draft, sampling)
    system = [{"role": "system", "content": settings["system"]}] if settings["system"] else []
    n_ctx = pipe.engine.target.n_ctx
    reserve = min(settings["max_tokens"], n_ctx // 2)
    ids, dropped = fit_history(pipe, system, history, reserve, think=settings["think"])
    if dropped:
        say(err, f"the conversation no longer fits the context ({n_ctx} tokens): dropped its oldest {dropped} messages", "dim")
    parts, stats, splitter = [], None, ThinkSplitter()
    with ctrl_c_stops_the_answer() as stop:  # the engine stops before its next target pass
        for rec in pipe.stream_tokens(ids, max_tokens=settings["max_tokens"], sampling=sampling, spec=spec, should_stop=stop.is_set):
            show(splitter.push(rec.text))
            parts.append(rec.text)
            stats = rec.stats or stats
    show(splitter.flush())
    print()
    if stats.finish_reason == "interrupted":
        say(err, f"stopped; this answer is left out of the conversation · {stats_line(stats, pipe)}", "dim")
        return None
    say(err, stats_line(stats, pipe), "dim")
    return "".join(parts)


def show(runs: list[tuple[str, bool]]) -> None:
    """Stream text to the terminal: the model's thinking dimmed, its answer plain."""
    for text, thinking in runs:
        if thinking:
            console.print(text, style="dim", end="", markup=False, highlight=False, soft_wrap=True)
        else:
            sys.stdout.write(text)
        sys.stdout.flush()


def fit_history(pipe, system: list[dict], history: list[dict], reserve: int, think: bool | None = None) -> tuple[list[int], int]:
    """The prompt for system + history, leaving `reserve` tokens of the context for the answer: the
    oldest turns (a user message and the replies after it) are removed from `history` until it fits.
    Returns (prompt ids, messages removed). The latest message always stays; if it alone is too
    long, the engine says so."""
    n_ctx, removed = pipe.engine.target.n_ctx, 0
    while True:
        ids = pipe.encode_chat(system + history, think=think)
        later_turns = [i for i, m in enumerate(history) if m["role"] == "user" and i > 0]
        if len(ids) + reserve <= n_ctx or not later_turns:
            return ids, removed
        del history[: later_turns[0]]
        removed += later_turns[0]
