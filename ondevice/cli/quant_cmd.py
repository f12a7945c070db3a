"""`ondevice quant ...`: build smaller or faster versions of a pair's models.

`ondevice quant vocab-trim` builds the VocabTrim drafter (see ondevice/vocabtrim/build.py): the
target answers the calibration prompts, the K most used tokens are kept, and a trimmed copy of the
drafter is written beside it, where `ondevice chat/generate` pick it up (--no-vocab-trim to not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Sequence

import gguf
import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ondevice.catalog import hub
from ondevice.catalog.pairs import load_pair
from ondevice.cli import options as opt
from ondevice.vocabtrim.head import TrimmedContext, TrimmedHead
from ondevice.plan.latency import measure_drafter_curve
from ondevice.llama_backend import LlamaContext, LlamaModel
from ondevice.bench.prompt_sets import CALIBRATION, EVAL
from ondevice.vocabtrim.build import TOKENS_KEY, always_kept_ids, build_trimmed, calibration_token_counts, coverage, top_k_tokens, trimmed_paths

app = typer.Typer(no_args_is_help=True)
status_console = Console(stderr=True)  # progress and notices; results go to stdout

K = Annotated[int, typer.Option("--k", min=1, help="Tokens the trimmed drafter scores (its vocabulary size).")]
CalibrationTokens = Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Most tokens the target generates per calibration prompt.")]
Prompts = Annotated[int, typer.Option("--prompts", min=1, max=len(CALIBRATION), help="How many calibration prompts to use.")]
EvalPrompts = Annotated[int, typer.Option("--eval", min=0, max=len(EVAL), help="Held-out prompts the target also answers, to measure coverage (0: skip).")]

DRAFT_BATCHES = (1, 8)  # tokens per drafter call timed: one chain step, one batch of tree nodes


@app.callback()
def quant() -> None:
    """Build smaller or faster versions of a pair's models."""


@app.command("vocab-trim")
def vocab_trim_command(
    model: opt.Model = None,
    k: K = 65536,
    max_tokens: CalibrationTokens = 256,
    prompts: Prompts = len(CALIBRATION),
    eval_prompts: EvalPrompts = 0,
    threads: opt.Threads = None,
) -> None:
    """Trim the drafter's vocabulary to the K tokens the target uses most (VocabTrim).

    The target answers the calibration prompts greedily; the K most frequent tokens are kept (plus all special and byte tokens).

    A drafter scoring only those is written beside the original and used from then on. Verification keeps the full vocabulary.
    """
    pair = load_pair(opt.default_model(model))
    files = hub.ensure_pair(pair, status_console)
    with status_console.status("reading the drafter's vocabulary"):
        reader = gguf.GGUFReader(files.drafter)
        always_kept = always_kept_ids(reader)
    top_k_tokens(np.zeros(len(reader.fields[TOKENS_KEY].data)), k, always_kept)  # check k first
    calibration = CALIBRATION[:prompts]
    counts, answers = _target_answers(files.target, calibration, max_tokens, threads, "calibrating on the target")
    keep_ids = top_k_tokens(counts, k, always_kept)
    with status_console.status("writing the trimmed drafter"):
        description = (
            f"{len(calibration)} calibration prompts (ondevice.bench.prompt_sets.CALIBRATION), answered greedily by "
            f"{pair.target.label}, at most {max_tokens} tokens each; {int(counts.sum()):,} tokens counted"
        )
        record = build_trimmed(files.drafter, keep_ids, description, reader=reader)
    trimmed, _ = trimmed_paths(files.drafter)
    typer.echo(f"kept      {record.k:,} of {record.n_vocab:,} tokens ({int(np.count_nonzero(counts)):,} distinct ids seen)")
    typer.echo(f"coverage  {coverage(np.concatenate(answers), keep_ids):.2%} of the target's calibration tokens")
    if eval_prompts:
        _, held_out = _target_answers(files.target, EVAL[:eval_prompts], max_tokens, threads, "answering held-out prompts")
        _print_held_out_coverage(counts, keep_ids, np.concatenate(held_out), always_kept)
    typer.echo(f"drafter   {files.drafter}  {files.drafter.stat().st_size / 1e6:,.0f} MB")
    typer.echo(f"trimmed   {trimmed}  {record.trimmed_size / 1e6:,.0f} MB")
    with status_console.status("timing draft steps"):
        full, trimmed_seconds = (_draft_call_seconds(files.drafter, head, threads) for head in (None, TrimmedHead(files.drafter)))
    for n in DRAFT_BATCHES:  # best of 10: other processes only ever add time
        typer.echo(f"draft     {n} token{'s' if n > 1 else ''} per call: {full[n] * 1e3:.1f} ms full, {trimmed_seconds[n] * 1e3:.1f} ms trimmed")


def _target_answers(target: Path, prompts: Sequence[str], max_tokens: int, threads: int | None, label: str):
    """Token counts and the target's greedy answers (one id array per prompt), with a progress bar."""
    answers: list[np.ndarray] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("prompts"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=status_console) as progress:
        task = progress.add_task(label, total=len(prompts))

        def done(index: int, answer: list[int]) -> None:
            answers.append(np.asarray(answer, dtype=np.int64))
            progress.advance(task)

        counts = calibration_token_counts(target, prompts, max_tokens, threads=threads, on_prompt=done)
    return counts, answers


def _print_held_out_coverage(counts: np.ndarray, keep_ids: np.ndarray, held_out: np.ndarray, always: np.ndarray) -> None:
    """Coverage of held-out target tokens by the kept set, and by the sets K/4 and K/2 would keep."""
    for k in sorted({max(len(always), len(keep_ids) // 4), max(len(always), len(keep_ids) // 2), len(keep_ids)}):
        kept = keep_ids if k == len(keep_ids) else top_k_tokens(counts, k, always)
        typer.echo(f"held-out  K={k:<6,} covers {coverage(held_out, kept):.2%} of {len(held_out):,} target tokens")


def _draft_call_seconds(drafter: Path, head: TrimmedHead | None, threads: int | None, repeats: int = 10) -> dict[int, float]:
    """Best-of-`repeats` seconds of one drafter decode call of n tokens (all with logits) after a
    64-token context, for each n in DRAFT_BATCHES: the full drafter, or the trimmed one as a drafter
    runs it (TrimmedContext: embeddings in, full-width logits out)."""
    model = LlamaModel(head.gguf_path if head else drafter)
    ctx = LlamaContext(model, n_ctx=512, n_seq_max=1, n_batch=128, threads=threads, embeddings_input=head is not None)
    ctx = TrimmedContext(ctx, head) if head else ctx
    tokens = np.random.default_rng(0).integers(0, 32000, size=64 + max(DRAFT_BATCHES))
    ctx.decode(tokens[:64], np.arange(64), np.zeros(64, np.int32), np.zeros(64, bool))

    def one_call(n: int) -> None:
        ctx.decode(tokens[64 : 64 + n], 64 + np.arange(n), np.zeros(n, np.int32), np.ones(n, bool))
        ctx.seq_rm(0, 64, -1)

    curve = measure_drafter_curve(one_call, DRAFT_BATCHES, sweeps=repeats, show=False)
    ctx.close()
    model.close()
    return dict(zip(curve.ns, curve.seconds))
