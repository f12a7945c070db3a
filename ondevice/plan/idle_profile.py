"""Measuring the planner's profile while a chat waits for its user.

A first chat has no profile: the planner starts on the target alone and a provisional curve, and
the profile (the target's and the drafter's pass curves, plan/profile.py) is measured one sample at
a time between answers, when the caller has nothing else to do (`ondevice chat` while you type). A
profile measured on a busy machine is measured again, once a session. A streaming target's profile
is measured apart, before loading (loading/profiling.streaming_profile), never here.
"""

from __future__ import annotations

from ondevice.plan.profile import new_profile, profile_steps, save_profile


class IdleProfiler:
    def __init__(self, planner):
        self.planner = planner  # plan/auto.AutoPlanner: what it measures for, and who installs the result
        self.job = None  # the profile being measured, a generator of its steps
        self.remeasured = False  # a busy profile is measured again once per session

    def wanted(self) -> bool:
        """A profile is missing, or was measured on a busy machine (once a session), and can be measured here."""
        planner = self.planner
        if planner.streams or getattr(planner.backends, "make_target", None) is None:
            return False  # a streaming target's profile is measured apart, before loading
        return planner.profile is None or (planner.profile.busy and not self.remeasured)

    def step(self) -> bool:
        """Measure one sample of the profile; False when there is nothing (left) to measure. The
        target's cache is left for the next answer to trim."""
        if self.job is None:
            if not self.wanted():
                return False
            self.remeasured = self.planner.profile is not None
            self.job = self._measure()
        try:
            next(self.job)
            return True
        except StopIteration:
            self.job = None
            return False

    def _measure(self):
        backends = self.planner.backends
        profile = new_profile(backends, measure_disk=False)  # the target is mapped: its pages can't be dropped
        yield "bandwidths"
        yield from profile_steps(profile, backends)
        if profile.curves is not None:
            save_profile(profile)
            self.planner.install(profile)
