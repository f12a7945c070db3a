"""Latency curves: seconds per call at measured sizes n (tokens per target pass, or draft batch),
and the pass sizes a profile times. Plain data; measured by `ondevice.plan.latency`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LatencyCurve:
    """Seconds per call at measured sizes n (tokens per target pass, or draft batch size)."""

    ns: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.ns) == 0 or len(self.ns) != len(self.seconds) or list(self.ns) != sorted(set(self.ns)):
            raise ValueError("a latency curve needs increasing sizes, one time each")

    @property
    def max_n(self) -> int:
        return self.ns[-1]

    def __call__(self, n: float) -> float:
        """t(n): linear between measured points, flat below the first, last slope (≥ 0) beyond the last."""
        ns, ts = np.asarray(self.ns, dtype=np.float64), np.asarray(self.seconds, dtype=np.float64)
        if n <= ns[-1] or len(ns) == 1:
            return float(np.interp(n, ns, ts))
        slope = max(0.0, (ts[-1] - ts[-2]) / (ns[-1] - ns[-2]))
        return float(ts[-1] + slope * (n - ns[-1]))

    def padded(self) -> "LatencyCurve":
        """t(n) = min over measured n' ≥ n of t(n'): a call can always pad n tokens up to n', so a
        slower time at a smaller n is noise (another process took the CPU), not the machine."""
        envelope = np.minimum.accumulate(np.asarray(self.seconds)[::-1])[::-1]
        return LatencyCurve(self.ns, tuple(float(t) for t in envelope))

    def to_dict(self) -> dict:
        return {"ns": list(self.ns), "seconds": list(self.seconds)}

    @classmethod
    def from_dict(cls, d: dict) -> "LatencyCurve":
        return cls(tuple(int(n) for n in d["ns"]), tuple(float(t) for t in d["seconds"]))


@dataclass(frozen=True)
class Curves:
    """What the optimizer needs: a target pass vs tokens, and one draft call vs batch size."""

    target: LatencyCurve
    drafter: LatencyCurve

    def to_dict(self) -> dict:
        return {"target": self.target.to_dict(), "drafter": self.drafter.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "Curves":
        return cls(LatencyCurve.from_dict(d["target"]), LatencyCurve.from_dict(d["drafter"]))


def powers_of_two(limit: int) -> tuple[int, ...]:
    return tuple(1 << i for i in range(limit.bit_length()) if 1 << i <= limit)


def pass_sizes(limit: int) -> tuple[int, ...]:
    """The target pass sizes a profile times: each power of two and the size just above it. llama.cpp's
    batched kernels work in tiles, so a pass costs a step function of its size (README, "Larger than
    memory", the AVX2 VM); a tree of 2^k nodes and one of 2^k + 1 can differ by half, and a curve
    that only saw 2^k would call the second cheap."""
    return tuple(sorted({n for p in powers_of_two(limit) for n in (p, p + 1) if n <= limit}))


def upto(curve: LatencyCurve, max_tree: int) -> LatencyCurve:
    """The curve's points up to max_tree nodes (the biggest tree the buffers are sized for)."""
    keep = [i for i, n in enumerate(curve.ns) if n <= max_tree] or [0]
    return LatencyCurve(tuple(curve.ns[i] for i in keep), tuple(curve.seconds[i] for i in keep))


def provisional_curve(max_tree: int) -> LatencyCurve:
    """No profile: a pass of n tokens costs n single passes (a CPU in RAM), in units of one pass;
    PassTimes scales it by the passes it sees."""
    ns = pass_sizes(max(2, min(max_tree, 64)))
    return LatencyCurve(ns, tuple(float(n) for n in ns))
