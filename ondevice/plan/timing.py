"""Timing calls on a machine that other processes share: one busy minute must not decide every later run.

A profile is a set of latency curves (seconds per call at each size n). On a desktop something
else is always running now and then — a browser, an indexer, a build — and a curve measured
during such a minute is wrong for as long as it is kept. So the calls are timed like this:

- **Samples, not calls.** A sample is one call, repeated back to back until it has lasted at least
  MIN_SAMPLE_SECONDS (the per-call time is the sample's mean): short enough to interleave, long
  enough for the CPU meter below to judge it.
- **Judged by what the rest of the machine did meanwhile** (`CpuMeter`): CPU time used by all
  processes but this one (user + nice + system + irq + steal), per second of wall time: "others'
  cores". Niced processes count too: llama.cpp's threads spin at every barrier, so one thread
  preempted for a few ms by even a nice-19 process stalls the other (docs/measurements/code-notes.md,
  "Timing on a shared machine"). A sample during which others used more than OTHERS_MAX cores is
  *disturbed*.
- **Interleaved sweeps.** Each size is sampled once per sweep, the sweeps in different orders, so a
  busy stretch hits different sizes in different sweeps; a size's time is the minimum over its
  quiet samples (other processes only ever add time). Sizes with fewer than MIN_QUIET quiet samples
  are sampled again, after a pause, in further sweeps (at most MAX_SWEEPS).
- **The curve's shape is checked**: a pass over more tokens never costs less than one over fewer,
  so a size that measured more than SHAPE_SLACK slower than a larger one was disturbed in a way the
  meter missed (a burst shorter than its 10 ms ticks) and is sampled again.
- **Warmed up until settled**: calls before the first sample until two in a row agree within
  SETTLED (at most WARM_UP_CALLS): a target streamed from disk fills the page cache with its kept
  layers over its first passes after loading, so a timing after one warm-up call is still far too
  slow (docs/measurements/code-notes.md, "Timing on a shared machine").
- **Useless sizes are skipped**: the first sweep goes up in n and stops growing once `enough`
  says so twice for the same size, sampled again in between (the profile stops where no draft tree
  could pay for a pass that slow; one stall of a call is not such a pass).

If the machine stays busy, `Timing.busy` says so with others' cores, and the caller keeps the curve
as provisional and measures again later. `timing_steps` is a generator that yields after every
sample, so a chat can measure between the user's keystrokes; `time_sizes` runs it to the end.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Sequence

import psutil

from ondevice.plan.curve import LatencyCurve

MIN_SAMPLE_SECONDS = 0.1  # a sample lasts at least this long (the meter's ticks are 10 ms)
OTHERS_MAX = 0.25  # others' cores above which a sample is disturbed
TICK_SLACK = 0.02  # seconds of others' CPU a sample may show from tick rounding alone
MIN_QUIET = 2  # quiet samples each size needs
SWEEPS = 2  # sweeps planned; more only for sizes that lack quiet samples
MAX_SWEEPS = 6
PAUSE_SECONDS = 0.5  # between sweeps that found the machine busy
SHAPE_SLACK = 1.10  # t(n) may exceed t(n') for n < n' by this much (noise) before n is sampled again
MAX_CALLS_PER_SAMPLE = 64
SETTLED = 1.15  # warm-up ends when two calls in a row are within this factor of each other ...
WARM_UP_CALLS = 8  # ... or after this many calls


class CpuMeter:
    """Others' CPU use: what every process but this one ran, per second of wall time."""

    def __init__(self) -> None:
        self.me = psutil.Process()

    def read(self) -> tuple[float, float, float]:
        """(wall seconds, CPU seconds of all processes, CPU seconds of this one)."""
        t = psutil.cpu_times()
        busy = sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))
        own = self.me.cpu_times()
        return time.perf_counter(), busy, own.user + own.system

    @staticmethod
    def others_seconds(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
        return max(0.0, (after[1] - before[1]) - (after[2] - before[2]))


@dataclass
class Sample:
    seconds: float  # per call
    wall: float  # the whole sample
    others: float  # others' CPU seconds during it

    @property
    def quiet(self) -> bool:
        return self.others <= OTHERS_MAX * self.wall + TICK_SLACK

    @property
    def others_cores(self) -> float:
        return self.others / self.wall if self.wall > 0 else 0.0


@dataclass
class Timing:
    """What `timing_steps` measured: the samples of every size, and the curve they give."""

    samples: dict[int, list[Sample]] = field(default_factory=dict)
    sweeps: int = 0

    def seconds(self, n: int) -> float:
        """The fastest quiet sample of n (the fastest of any if none was quiet)."""
        quiet = [s.seconds for s in self.samples[n] if s.quiet]
        return min(quiet or [s.seconds for s in self.samples[n]])

    def quiet_count(self, n: int) -> int:
        return sum(s.quiet for s in self.samples[n])

    @property
    def curve(self) -> LatencyCurve:
        ns = tuple(sorted(self.samples))
        return LatencyCurve(ns, tuple(self.seconds(n) for n in ns)).padded()

    @property
    def busy(self) -> bool:
        """Some size has no quiet sample: its time may be another process's."""
        return any(self.quiet_count(n) == 0 for n in self.samples)

    @property
    def disturbed_share(self) -> float:
        every = [s for samples in self.samples.values() for s in samples]
        return sum(not s.quiet for s in every) / len(every) if every else 0.0

    @property
    def others_cores(self) -> float:
        """Others' cores over the disturbed samples (0 if none was)."""
        bad = [s for samples in self.samples.values() for s in samples if not s.quiet]
        return sum(s.others for s in bad) / sum(s.wall for s in bad) if bad else 0.0

    def out_of_shape(self) -> list[int]:
        """Sizes that measured slower than a larger size by more than SHAPE_SLACK."""
        ns = sorted(self.samples)
        times = [self.seconds(n) for n in ns]
        return [n for i, n in enumerate(ns) if any(times[i] > SHAPE_SLACK * t for t in times[i + 1 :])]


def _sample(call: Callable[[int], None], n: int, calls: int, meter: CpuMeter) -> Sample:
    before = meter.read()
    for _ in range(calls):
        call(n)
    after = meter.read()
    wall = after[0] - before[0]
    return Sample(wall / calls, wall, meter.others_seconds(before, after))


def warm_up(call: Callable[[int], None], n: int) -> int:
    """Call call(n) until two calls in a row take within SETTLED of each other (at most
    WARM_UP_CALLS); returns the calls made."""
    last = None
    for made in range(1, WARM_UP_CALLS + 1):
        start = time.perf_counter()
        call(n)
        seconds = time.perf_counter() - start
        if last is not None and max(seconds, last) <= SETTLED * min(seconds, last):
            return made
        last = seconds
    return WARM_UP_CALLS


def _calls_for(seconds: float) -> int:
    return max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(MIN_SAMPLE_SECONDS / max(seconds, 1e-6))))


def _sweep_order(sizes: Sequence[int], sweep: int) -> list[int]:
    """Sweep 1 goes up, sweep 2 down, later ones from the middle out: a busy stretch lands on
    different sizes each time."""
    ordered = sorted(sizes)
    if sweep % 3 == 1:
        return ordered[::-1]
    if sweep % 3 == 2:
        mid = len(ordered) // 2
        return ordered[mid:] + ordered[:mid][::-1]
    return ordered


def timing_steps(
    sizes: Sequence[int], call: Callable[[int], None], enough: Callable[[Timing, int], bool] | None = None,
    meter: CpuMeter | None = None, sweeps: int = SWEEPS, pause: float = PAUSE_SECONDS,
) -> Generator[int, None, Timing]:
    """Time call(n) for each n in `sizes` (see the module notes); yields the size just sampled after
    every sample, returns the Timing. enough(timing, n): sweep 1 stops growing n after this size."""
    meter = meter or CpuMeter()
    timing = Timing()
    warm_up(call, sizes[0])  # first-call allocations and a cold page cache are not the machine
    per_call: dict[int, float] = {}
    for n in sorted(sizes):  # sweep 1: upwards, stopping where larger sizes cannot be worth timing
        first = _sample(call, n, 1, meter)
        per_call[n] = first.seconds
        timing.samples[n] = [first] if first.wall >= MIN_SAMPLE_SECONDS else []
        if not timing.samples[n]:
            timing.samples[n].append(_sample(call, n, _calls_for(first.seconds), meter))
        yield n
        if enough is not None and enough(timing, n):  # once more before stopping: one stall must not end the sweep
            timing.samples[n].append(_sample(call, n, _calls_for(per_call[n]), meter))
            yield n
            if enough(timing, n):
                break
    timing.sweeps = 1
    while timing.sweeps < max(sweeps, MAX_SWEEPS):
        wanted = [n for n in timing.samples if timing.sweeps < sweeps or timing.quiet_count(n) < min(MIN_QUIET, sweeps)]
        wanted += [n for n in timing.out_of_shape() if n not in wanted and timing.sweeps >= sweeps]
        if not wanted:
            break
        if timing.sweeps >= sweeps and pause > 0:
            time.sleep(pause)  # the machine was busy: give it a moment
        for n in _sweep_order(wanted, timing.sweeps):
            timing.samples[n].append(_sample(call, n, _calls_for(per_call[n]), meter))
            per_call[n] = min(per_call[n], timing.samples[n][-1].seconds)  # a slow first call sized samples too short
            yield n
        timing.sweeps += 1
    return timing


def run_steps(steps: Generator[int, None, Timing], on_step: Callable[[int], None] | None = None) -> Timing:
    """Run a `timing_steps` generator to its end."""
    while True:
        try:
            n = next(steps)
        except StopIteration as done:
            return done.value
        if on_step is not None:
            on_step(n)


def time_sizes(sizes: Sequence[int], call: Callable[[int], None], enough=None, meter: CpuMeter | None = None,
               on_step: Callable[[int], None] | None = None, **kwargs) -> Timing:
    return run_steps(timing_steps(sizes, call, enough, meter, **kwargs), on_step)
