"""One job on the pipeline, in the worker thread: records → text pieces, stop sequences, cancellation.

The engine is asked before every target pass whether to go on (`should_stop`): a client that went
away or a stop sequence in the text ends the answer there. The engine's cache stays what it always
is (the tokens whose KV the target holds), so the next request reuses the longest common prefix —
a conversation that goes on from this answer recomputes only its new turn.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ondevice.errors import OndeviceError
from ondevice.pipeline import Pipeline
from ondevice.serve.errors import ApiError
from ondevice.serve.queue import Delta, Failed, Finished, Job
from ondevice.serve.stops import StopMatcher


@dataclass
class Completion:
    text: str
    finish_reason: str  # "stop" (end of answer or a stop sequence) or "length"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV was already in the cache
    ondevice: dict  # how the answer was made: tokens per pass, tok/s, plan, queue wait …


def run_job(pipe: Pipeline, job: Job) -> str:
    """Generate the job's answer, posting its pieces and then the Completion (or, if it was cancelled,
    a 503); returns the finish reason, "cancelled" for an answer stopped before its end."""
    started = time.perf_counter()
    matcher = StopMatcher(job.stops)
    parts, stats = [], None
    records = pipe.stream_tokens(job.prompt_ids, max_tokens=job.max_tokens, sampling=job.sampling, spec=job.spec,
                                 should_stop=lambda: job.cancelled or matcher.stopped)
    try:
        for record in records:
            job.tokens += len(record.token_ids)
            text = matcher.push(record.text)
            if record.stats is not None:
                stats = record.stats
                text += matcher.flush()
            if text:
                parts.append(text)
                job.post(Delta(text))
    except OndeviceError as err:  # a request the engine refuses (checked before, but never a traceback)
        raise ApiError(400, str(err)) from None
    if job.cancelled:  # the client left (nobody reads this) or the server is shutting down
        job.post(Failed(ApiError(503, "the answer was stopped before its end: the server is shutting down.")))
        return "cancelled"
    reason = "stop" if matcher.stopped or stats.finish_reason != "length" else "length"
    job.post(Finished(Completion(
        text="".join(parts), finish_reason=reason,
        prompt_tokens=stats.prompt_tokens, completion_tokens=stats.tokens,
        cached_tokens=stats.prompt_tokens - 1 - stats.prefilled_tokens,
        ondevice={**pipe.stats_json(stats), "queue_seconds": started - job.submitted},
    )))  # fmt: skip
    return reason
