"""The target's pass-time curve, rescaled online from the passes actually measured.

A profile is measured once; what a pass costs later is another matter: the model may no longer be
in the page cache (the target streams from disk: ~1 s per pass whatever its size), or the VM runs
slower than when it was profiled (docs/measurements/code-notes.md). So every pass the engine times
goes into `PassTimes`, and the planner plans with `PassTimes.curve()` instead of the profile's.

Model: a pass of n tokens over c tokens of context costs  (ρ·t(n) + δ)·g(c)/g(c₀),  t = the
profile's curve (timed over c₀ tokens of context). ρ scales the compute (a slower or busier CPU);
δ is a fixed cost per pass that computing does not pay for — the disk read of a streamed target —
and exists only where the target streams while its profile did not: in RAM a slower pass is ρ,
never δ (a δ there makes the target alone look slower and trees look cheaper). g(c) = 1 + γ·c is
the growth of a pass with its context: attention reads every cached token, and a profile timed
over 64 tokens never sees a chat's 2,000; γ = attention FLOPs per cached token over the weights'
FLOPs per token, from the GGUF's shapes (`context_growth`). Passes are grouped in
buckets (the profile's sizes: a pass of n nodes goes to the smallest measured size ≥ n), each an
exponential average of (t(n), measured) with weight ALPHA on the newest pass (noise on a CPU is
averaged out), restarted by a pass JUMP times off its average (a regime change shows at once). ρ and δ are fitted over the buckets, each weighted by its passes and faded by
FADE per pass since it was last seen (a bucket the plan stopped using must not hold the fit in the
past); a bucket's own deviation from the fit is added back at its size, fading the same way:

    no bucket       ρ = 1, δ = 0 (the profile, measured in the regime the target runs in)
    one bucket      in RAM, or faster than t: ρ = the ratio, δ = 0; a streamed target slower than t:
                    the excess is δ
    two or more     weighted least squares, ρ ≥ 0 and δ ≥ 0 (δ = 0 in RAM: a fit through the origin)

Where the target streams, attributing a big slowdown to δ makes bigger trees look cheaper, so the
planner tries one, and its bucket then says what it really costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ondevice.errors import OndeviceError
from ondevice.files.gguf_header import read_header

from ondevice.plan.curve import LatencyCurve

ALPHA = 0.3  # weight of the newest pass in its bucket
FADE = 0.5  # a bucket's weight per pass since it was last observed
MAX_WEIGHT = 8  # a bucket counts as at most this many passes in the fit
JUMP = 2.0  # a pass this many times slower or faster than its bucket's average restarts the bucket


@dataclass
class Bucket:
    predicted: float  # average of t(n) over its passes
    measured: float  # average measured seconds
    passes: int
    last: int  # the pass count when it was last observed

    def add(self, predicted: float, measured: float, alpha: float, now: int) -> None:
        if not 1 / JUMP < measured / self.measured < JUMP:  # a new regime (the target started or
            self.predicted, self.measured, self.passes = predicted, measured, 0  # stopped streaming)
        self.predicted += alpha * (predicted - self.predicted)
        self.measured += alpha * (measured - self.measured)
        self.passes += 1
        self.last = now


def context_growth(model_file) -> float:
    """γ: a pass's relative growth per token of context, attention's FLOPs per cached token
    (QKᵀ and AV: 4·layers·heads·head_dim) over the weights' FLOPs per token (2 per parameter; the
    input embedding is a row lookup). 0 where the header cannot tell."""
    try:
        header = read_header(model_file)
        n_layers, n_head = int(header.arch_value("block_count", 0)), int(header.arch_value("attention.head_count", 0))
        head_dim = int(header.arch_value("attention.key_length", int(header.arch_value("embedding_length", 0)) // max(n_head, 1)))
        tied = "output.weight" not in header.tensors
        params = sum(math.prod(t.shape) for name, t in header.tensors.items() if tied or name != "token_embd.weight")
    except (OndeviceError, OSError, ValueError, TypeError):
        return 0.0
    return 4.0 * n_layers * n_head * head_dim / (2.0 * params) if params else 0.0


class PassTimes:
    def __init__(self, base: LatencyCurve, streams: bool = False, alpha: float = ALPHA, growth: float = 0.0, base_context: int = 64):
        """base: the profile's curve, timed over `base_context` tokens of context; streams: the target
        streams from disk but `base` was measured with it in RAM, so the disk is missing from it (an
        unexplained slowdown is then δ); growth: γ of `context_growth`."""
        self.base = base
        self.streams = streams
        self.alpha = alpha
        self.growth, self.base_context = growth, base_context
        self.buckets: dict[int, Bucket] = {}
        self.passes = 0

    def context_factor(self, context: int | None) -> float:
        """g(c)/g(c₀): how much more a pass costs over `context` tokens than over the profile's."""
        if context is None:
            return 1.0
        return (1.0 + self.growth * context) / (1.0 + self.growth * self.base_context)

    def bucket_of(self, n: int) -> int:
        return next((m for m in self.base.ns if m >= n), self.base.ns[-1])

    def observe(self, n: int, seconds: float, context: int | None = None) -> None:
        """One target pass over n tree nodes (after `context` cached tokens) took `seconds`."""
        self.passes += 1
        seconds /= self.context_factor(context)  # as if over the profile's context
        key, predicted = self.bucket_of(n), self.base(n)
        if key in self.buckets:
            self.buckets[key].add(predicted, seconds, self.alpha, self.passes)
        else:
            self.buckets[key] = Bucket(predicted, seconds, 1, self.passes)

    def measured(self, within: int | None = None) -> dict[int, float]:
        """{bucket size: its average measured seconds} (as over the profile's context), of the
        buckets observed within the last `within` passes (all if None)."""
        return {n: b.measured for n, b in self.buckets.items() if within is None or self.passes - b.last < within}

    def _fade(self, bucket: Bucket) -> float:
        return FADE ** (self.passes - bucket.last)

    def fit(self) -> tuple[float, float]:
        """(ρ, δ): pass ≈ ρ·t(n) + δ, from the buckets that have passes (see the module notes)."""
        if not self.buckets:
            return 1.0, 0.0
        x = np.array([b.predicted for b in self.buckets.values()])
        y = np.array([b.measured for b in self.buckets.values()])
        w = np.array([min(b.passes, MAX_WEIGHT) * self._fade(b) for b in self.buckets.values()])
        xm, ym = np.average(x, weights=w), np.average(y, weights=w)
        spread = np.sum(w * (x - xm) ** 2)
        if spread > 1e-3 * np.sum(w) * xm * xm:  # buckets of different sizes
            rho = np.sum(w * (x - xm) * (y - ym)) / spread
            delta = ym - rho * xm
            if delta < 0 or not self.streams:  # in RAM no fixed cost: ρ through the origin
                rho, delta = np.sum(w * x * y) / np.sum(w * x * x), 0.0
            if rho >= 0:
                return float(rho), float(delta)
            xm, ym = x[np.argmax(w)], y[np.argmax(w)]  # contradictory buckets: trust the freshest
        return self._one_bucket(xm, ym)

    def _one_bucket(self, predicted: float, measured: float) -> tuple[float, float]:
        if measured <= predicted or not self.streams:
            return float(measured / predicted), 0.0
        return 1.0, float(measured - predicted)

    def curve(self, context: int | None = None) -> LatencyCurve:
        """The target's pass time vs tree size as this machine runs it now (over `context` tokens)."""
        rho, delta = self.fit()
        scale = self.context_factor(context)
        seconds = []
        for n in self.base.ns:
            t = rho * self.base(n) + delta
            bucket = self.buckets.get(n)
            if bucket is not None:  # its own deviation from the fit, fading with age
                t += (bucket.measured - (rho * bucket.predicted + delta)) * self._fade(bucket)
            seconds.append(max(t * scale, 1e-6))
        return LatencyCurve(self.base.ns, tuple(seconds)).padded()
