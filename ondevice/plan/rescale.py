"""The target's pass-time curve, rescaled online from the passes actually measured.

A profile is measured once; what a pass costs later is another matter: the model may no longer be
in the page cache (the target streams from disk: ~1 s per pass whatever its size), or the VM runs
slower than when it was profiled (this one drifts ±40% over a day). So every pass the engine times
goes into `PassTimes`, and the planner plans with `PassTimes.curve()` instead of the profile's.

Model: a pass of n tokens costs  ρ·t(n) + δ,  t = the profile's curve. ρ scales the compute (a
slower or busier CPU), δ is a fixed cost per pass that computing does not pay for: the disk read of
a streamed target. Passes are grouped in
buckets (the profile's sizes: a pass of n nodes goes to the smallest measured size ≥ n), each an
exponential average of (t(n), measured) with weight ALPHA on the newest pass (noise on a CPU is
averaged out), restarted by a pass JUMP times off its average (a regime change shows at once). ρ and δ are fitted over the buckets, each weighted by its passes and faded by
FADE per pass since it was last seen (a bucket the plan stopped using must not hold the fit in the
past); a bucket's own deviation from the fit is added back at its size, fading the same way:

    no bucket       ρ = 1, δ = 0 (the profile, measured in the regime the target runs in)
    one bucket      faster than t: ρ = the ratio, δ = 0; slower: the excess is δ when the target
                    streams, else ρ takes up to MAX_DRIFT (this VM drifts ±40% in a day) and δ the rest
    two or more     weighted least squares, ρ ≥ 0 and δ ≥ 0

Attributing a big slowdown to δ makes bigger trees look cheaper, so the planner tries one, and its
bucket then says what it really costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ondevice.plan.hardware import LatencyCurve

ALPHA = 0.3  # weight of the newest pass in its bucket
FADE = 0.5  # a bucket's weight per pass since it was last observed
MAX_WEIGHT = 8  # a bucket counts as at most this many passes in the fit
MAX_DRIFT = 1.5  # how much slower than profiled the CPU itself may plausibly be
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


class PassTimes:
    def __init__(self, base: LatencyCurve, streams: bool = False, alpha: float = ALPHA):
        """base: the profile's curve; streams: the target streams from disk but `base` was measured
        with it in RAM, so the disk is missing from it (an unexplained slowdown is then δ)."""
        self.base = base
        self.streams = streams
        self.alpha = alpha
        self.buckets: dict[int, Bucket] = {}
        self.passes = 0

    def bucket_of(self, n: int) -> int:
        return next((m for m in self.base.ns if m >= n), self.base.ns[-1])

    def observe(self, n: int, seconds: float) -> None:
        """One target pass over n tree nodes took `seconds`."""
        self.passes += 1
        key, predicted = self.bucket_of(n), self.base(n)
        if key in self.buckets:
            self.buckets[key].add(predicted, seconds, self.alpha, self.passes)
        else:
            self.buckets[key] = Bucket(predicted, seconds, 1, self.passes)

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
            if delta < 0:
                rho, delta = np.sum(w * x * y) / np.sum(w * x * x), 0.0
            if rho >= 0:
                return float(rho), float(delta)
            xm, ym = x[np.argmax(w)], y[np.argmax(w)]  # contradictory buckets: trust the freshest
        return self._one_bucket(xm, ym)

    def _one_bucket(self, predicted: float, measured: float) -> tuple[float, float]:
        if measured <= predicted:
            return float(measured / predicted), 0.0
        rho = 1.0 if self.streams else min(measured / predicted, MAX_DRIFT)
        return rho, float(measured - rho * predicted)

    def curve(self) -> LatencyCurve:
        """The target's pass time vs tree size as this machine runs it now."""
        rho, delta = self.fit()
        seconds = []
        for n in self.base.ns:
            t = rho * self.base(n) + delta
            bucket = self.buckets.get(n)
            if bucket is not None:  # its own deviation from the fit, fading with age
                t += (bucket.measured - (rho * bucket.predicted + delta)) * self._fade(bucket)
            seconds.append(max(t, 1e-6))
        return LatencyCurve(self.base.ns, tuple(seconds)).padded()
