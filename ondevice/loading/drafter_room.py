"""The drafter's RAM or more of the target's layers: which pays, where the target streams from disk.

Under a memory limit the drafter's weights and buffers (~330 MB for the default pair) take room the
target's layers would otherwise keep in the page cache. Without the drafter a streamed pass reads
less (its buffers sized for the free drafters' trees of a few nodes), so one token per pass can beat
several per dearer pass (docs/measurements/2026-11-27-drafter-or-layers.md).

So where the target streams with the drafter, the load compares two rates, measured where it can:

    with the drafter     the fastest arm the planner's book measured in that regime (plan/arms.py,
                         ≥ MEASURED_TOKENS tokens), else the cost model's best plan on the streaming
                         profile (a prediction: the first load of a pair)
    without it           the fastest arm measured in the drafter-less regime (a pipeline without the
                         drafter model is planned too: its planner weighs the free drafters against
                         the target alone and books every round in that regime's book), else the
                         target's 1-token pass under the drafter-less memory plan, timed once per
                         profile in the process that will load it (`AlonePass`, `time_alone`;
                         timed afresh when the drafter-less plan keeps another number of layers;
                         the passes of 2 … its trees' nodes are timed with it: `AlonePass.curve`,
                         what the drafter-less planner sizes its free rounds on)

and loads the drafter only where it is faster. Where its side is only predicted, a prediction faster
by UNSURE (the planner's distrust of a prediction, plan/arms.py) keeps it; one faster by less loads
it to be measured (`explore`): its answers fill the book of the regime with the drafter, and from
then on what they measured decides (without that, a prediction short of UNSURE is never put to the
test). A rate no session measured within STALE_SECONDS is checked again the same way where it is
within UNSURE of the other side, faster or slower (`measured_lately`): a drafter left out is never
measured again otherwise, so one slow day would leave it out for good. Free drafts stay on either
way: they need no RAM.
The timed pass is one moment of a disk whose speed drifts, so where the drafter is kept by less than
UNSURE the next load times it again and the mean decides (`AlonePass.folded`). A timing older than
STALE_SECONDS is redone (the disk ran twice as fast one day as the day before), and the books' rates
are rescaled to it (`ArmBook.rescale`): a rate measured on a slower day is weighed at today's speed.
`--tree` naming a drafter's builder, or `--drafter FILE`, keeps the drafter (the user asked for it).
Where the plan with the drafter has less room than a streamed pass needs (`MemoryPlan.over_budget`) and the one without it does not, only a rate measured in its own regime keeps the drafter: the
prediction rests on passes timed in a child holding the target alone, which paged less.

Where the target without the drafter nearly fits (its plan reads at most NEAR_FIT of the file per
pass), the load without it is timed twice: with the page cache steered layer by layer (the window
of targets/page_cache.py or direct_window.py, the kept layers) and with the file only mapped and
left to the kernel, as llama.cpp leaves it (`MemoryPlan.unsteered`). The window takes room of its
own and reads every layer it does not keep; the kernel can keep nearly all of a file that nearly
fits. The faster of the two is the load without the drafter. Where the file is much larger than the
room, the kernel evicts every page before its next pass reads it again, so it is not timed there.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

from ondevice.draft.model_drafter import stand_in_tokens
from ondevice.loading.plan import LoadPlan
from ondevice.loading.profiling import profile_backends
from ondevice.machine.ram import return_freed_memory
from ondevice.plan.acceptance import AcceptanceTracker
from ondevice.plan.arms import LOAD_WEIGHT, OPTIMISM, ArmBook, Yardstick, load_book
from ondevice.plan.auto import regime_of
from ondevice.plan.cost_model import choose_plan
from ondevice.plan.curve import LatencyCurve, pass_sizes
from ondevice.plan.fallback import MAX_LOOKUP_BUDGET
from ondevice.plan.latency import ALONE_CONTEXT, measure_target_timing
from ondevice.plan.profile import save_profile

MEASURED_TOKENS = 24.0  # an arm's (faded) tokens before its measured rate is trusted over a prediction
SAVED_TOKENS = MEASURED_TOKENS * LOAD_WEIGHT  # ... in a book as loaded (at LOAD_WEIGHT): MEASURED_TOKENS in one session
UNSURE = OPTIMISM  # a drafter kept by less than this factor over a timed target alone: time it again at the next load
MAX_TIMINGS = 8  # the timed pass is the mean of the last this many loads' timings
NEAR_FIT = 0.25  # a drafter-less plan reading at most this share of the file per pass is timed unsteered too
STALE_SECONDS = 4 * 3600.0  # a timing older than this is of another machine state: timed again at the next load


@dataclass(frozen=True)
class AlonePass:
    """The target's 1-token pass under the memory plan without the drafter, as the profile timed it."""

    seconds: float
    bytes_read_per_pass: int
    kept_layers: int
    in_ram: bool
    busy: bool = False  # other processes disturbed every sample
    timings: int = 1  # loads whose timing `seconds` averages (`folded`)
    curve: dict | None = None  # the latest timing's passes of 1 … its trees' nodes (LatencyCurve.to_dict), which the
    # drafter-less load's planner sizes free rounds on (plan/auto.py; docs/measurements/2026-11-28-drafter-less-sized.md)
    steered: bool = True  # False: the file left to the kernel's page cache timed faster (module docstring)
    timed_at: float = 0.0  # when the latest timing ran (time.time())

    def fresh(self, now: float | None = None) -> bool:
        """Timed within STALE_SECONDS of `now`: the disk's speed drifts within an hour and can double
        from one day to the next, so an older timing does not say how fast the machine is now."""
        return (time.time() if now is None else now) - self.timed_at <= STALE_SECONDS

    @property
    def yardstick(self) -> Yardstick | None:
        """The machine's streaming speed now, for the planner's books (plan/arms.ArmBook.rescale): this
        pass where it was timed lately and undisturbed, else None."""
        return Yardstick(self.seconds, self.kept_layers) if self.fresh() and not self.busy and self.seconds > 0 else None

    def lean_curve(self) -> LatencyCurve | None:
        return None if self.curve is None else LatencyCurve.from_dict(self.curve)

    def folded(self, again: "AlonePass") -> "AlonePass":
        """The mean with another timing (of the last MAX_TIMINGS): a disk's speed drifts within
        minutes (docs/measurements/code-notes.md), so one timing can decide wrongly."""
        if again.steered != self.steered or not self.fresh(again.timed_at):  # the other way of caching won this
            return again  # time, or the earlier timings are of another machine state: its own timing
        n = min(self.timings, MAX_TIMINGS - 1)
        return replace(again, seconds=(self.seconds * n + again.seconds) / (n + 1), timings=n + 1)

    def plan_for(self, lean: LoadPlan) -> LoadPlan:
        """The load without the drafter as this timing found it faster: steered, or left to the kernel."""
        return lean if self.steered else lean.unsteered()

    def times(self, kept_layers: int) -> bool:
        """Whether this timing is of a drafter-less plan keeping about `kept_layers` layers: a plan
        that keeps more or fewer than one apart (another budget, buffers sized otherwise; a layer
        either way is a process's RSS from one run to the next) is timed afresh, not averaged in."""
        return abs(self.kept_layers - kept_layers) <= 1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "AlonePass | None":
        return None if d is None else cls(float(d["seconds"]), int(d["bytes_read_per_pass"]), int(d["kept_layers"]),
                                          bool(d["in_ram"]), bool(d.get("busy", False)), int(d.get("timings", 1)), d.get("curve"),
                                          bool(d.get("steered", True)), float(d.get("timed_at", 0.0)))


@dataclass(frozen=True)
class DrafterChoice:
    keep: bool
    with_drafter: float  # tok/s
    without: float  # tok/s
    with_source: str  # "measured" (the planner's book) or "predicted" (cost model on the profile)
    without_source: str  # "measured" (book) or "timed" (the profile's alone pass)
    layers_with: int = 0  # target layers kept cached with the drafter
    layers_without: int = 0
    explore: bool = False  # kept to be measured: predicted faster by less than UNSURE, or measured at another time within it
    steered_without: bool = True  # False: without the drafter the file is left to the kernel's page cache
    over_budget: bool = False  # with the drafter the plan has less room than a streamed pass needs (MemoryPlan.over_budget)
    with_stale: bool = False  # its measured rate is of another time (`measured_lately`)

    def describe(self) -> str:
        verdict = "drafter loaded to measure it" if self.explore else "drafter loaded" if self.keep else "drafter left out"
        paging = ", over budget" if self.over_budget else ""
        source = "measured before today's timing" if self.with_stale else self.with_source
        return (f"{verdict}: with it {self.with_drafter:.2f} tok/s ({source}, {self.layers_with} layers kept{paging}), "
                f"without it {self.without:.2f} tok/s ({self.without_source}, "
                + (f"{self.layers_without} layers kept)" if self.steered_without else "the file left to the page cache)"))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def unsure(self) -> bool:
        """Kept, against a timed (not measured) target alone, by less than UNSURE: worth timing again."""
        return self.keep and not self.explore and self.without_source == "timed" and self.with_drafter < UNSURE * self.without


def measured_slower(measured: float, choice: DrafterChoice) -> bool:
    """Whether speculation measured at `measured` tok/s in this session is slower than the target alone
    without the drafter, as `choice` knows it: against a rate the drafter-less regime measured, plainly;
    against a timed pass, by the planner's distrust of a prediction (UNSURE): one pass timed in a fresh
    process is not an answer (no rounds, no free drafts, no page cache shared with a drafter loaded
    before), and it can promise far more than the answers after the reload deliver
    (docs/measurements/2026-11-29-planner-at-0.9gb.md). The next load still compares the two as
    `choose_drafter` does, and from then on what each regime measured decides."""
    bar = choice.without if choice.without_source == "measured" else choice.without / UNSURE
    return measured < bar


def best_measured(book: ArmBook, min_tokens: float = MEASURED_TOKENS) -> float | None:
    """Tokens per second of the fastest arm the book measured enough of, or None."""
    rates = [t.tokens / t.seconds for t in book.arms.values() if t.tokens >= min_tokens and t.seconds > 0]
    return max(rates, default=None)


def choose_drafter(profile, p_rank, book_with: ArmBook, book_without: ArmBook, layers_with: int = 0,
                   paging: bool = False) -> DrafterChoice | None:
    """Keep the drafter, or leave it out for the layers its RAM would keep (module docstring). None:
    nothing to compare (no drafter-less pass timed). The books as loaded (`load_book`, at LOAD_WEIGHT):
    an arm one session measured MEASURED_TOKENS of counts as measured (else the drafter a session
    measured slower is predicted again at the next load, and loaded again to be measured). `paging`:
    the plan with the drafter is over budget and the one without is not; then only a measured rate keeps
    the drafter: its profile's passes were timed in a child holding the target alone, which paged less."""
    alone = AlonePass.from_dict(getattr(profile, "alone", None))
    if alone is None or alone.seconds <= 0:
        return None
    measured_with = best_measured(book_with, SAVED_TOKENS)
    if measured_with is not None:
        with_drafter, with_source = measured_with, "measured"
    else:
        with_drafter, with_source = choose_plan(profile.curves, p_rank, overlap_possible=False).predicted_tokens_per_second, "predicted"
    measured_without = best_measured(book_without, SAVED_TOKENS)
    without, without_source = (measured_without, "measured") if measured_without is not None else (1.0 / alone.seconds, "timed")
    needed = without * (UNSURE if with_source == "predicted" else 1.0)  # a prediction must beat a measurement by the planner's distrust
    stale = with_source == "measured" and not measured_lately(book_with)
    explore = not paging and ((with_source == "predicted" and without < with_drafter <= needed)  # ... or be put to the test,
                              or (stale and without / UNSURE < with_drafter <= needed))  # as a measurement of another time is
    keep = (with_drafter > needed and not (paging and with_source == "predicted")) or explore
    return DrafterChoice(keep, with_drafter, without, with_source, without_source, layers_with, alone.kept_layers, explore,
                         alone.steered, paging, stale)


def measured_lately(book: ArmBook) -> bool:
    """Whether a session saved the book within STALE_SECONDS. A drafter left out is not measured again,
    so a rate of another day that ruled it out would rule it out for good; rescaled (ArmBook.rescale)
    where the book knows the machine's speed then, it is still checked again when close."""
    return time.time() - book.saved_at <= STALE_SECONDS


def drafter_or_layers(plan: LoadPlan, profile, status=None) -> tuple[LoadPlan, DrafterChoice | None]:
    """A target that streams with the drafter: keep the drafter, or load without it (`plan.lean`) and
    give its RAM to the target's layers, whichever measured (or, the first time, is predicted)
    faster (module docstring). Unless asked for the drafter (a --tree that needs it, --drafter)."""
    lean, opts = plan.lean, plan.options
    if lean is None or profile is None:
        return plan, None
    saved = AlonePass.from_dict(profile.alone)
    untried = nearly_fits(lean) and "steered" not in (profile.alone or {})  # timed before the page cache was left to the kernel
    if saved is None or saved.curve is None or not saved.times(lean.memory.kept_layer_count) or untried or not saved.fresh():
        time_alone_into(profile, lean, None, status)  # once per profile, drafter-less plan and STALE_SECONDS
    lean = AlonePass.from_dict(profile.alone).plan_for(lean)  # steered, or left to the kernel: the faster
    if opts.keep_drafter is False:  # --drop-drafter (its planner sizes free rounds on the timed passes)
        return lean, None
    name = plan.files.name
    speed = yardstick(profile)  # the books' seconds at the machine's speed as just timed (ArmBook.rescale)
    books = load_book(name, regime_of(profile_backends(plan)), speed), load_book(name, regime_of(profile_backends(lean)), speed)
    layers, p_rank = plan.memory.kept_layer_count, AcceptanceTracker.load(name).p_rank
    paging = plan.memory.over_budget and not plan.lean.memory.over_budget
    choice = choose_drafter(profile, p_rank, *books, layers_with=layers, paging=paging)
    if choice is not None and choice.unsure:  # close enough for the disk's drift to decide: time it again
        time_alone_into(profile, plan.lean, AlonePass.from_dict(profile.alone), status)
        for book in books:
            book.rescale(yardstick(profile))  # the mean with the new timing
        choice = choose_drafter(profile, p_rank, *books, layers_with=layers, paging=paging)
        lean = AlonePass.from_dict(profile.alone).plan_for(plan.lean)
    return (plan if choice is None or choice.keep else lean), choice


def yardstick(profile) -> Yardstick | None:
    """The drafter-less pass's seconds as timed lately (AlonePass.yardstick), what the planner's books
    of this load are rescaled to; None where nothing was timed lately."""
    alone = AlonePass.from_dict(getattr(profile, "alone", None))
    return None if alone is None else alone.yardstick


def drafterless_curve(profile, plan: LoadPlan) -> LatencyCurve | None:
    """A load without the drafter model that streams: its passes as timed for this plan (AlonePass),
    what its planner sizes free rounds on; None where the drafter is loaded or nothing timed it."""
    if profile is None or plan.files.drafter is not None or plan.memory is None:
        return None
    alone = AlonePass.from_dict(profile.alone)
    return alone.lean_curve() if alone is not None and alone.times(plan.memory.kept_layer_count) else None


def time_alone_into(profile, lean: LoadPlan, earlier: AlonePass | None, status=None) -> None:
    """Time the drafter-less pass (`time_alone`) and save it in the profile: alone, or folded into
    the `earlier` timings (the mean of the last few decides)."""
    if status is not None:
        status("timing the target without the drafter" + (" again" if earlier is not None else ""))
    timed = time_alone(lean)
    profile.alone = (earlier.folded(timed) if earlier is not None else timed).to_dict()
    save_profile(profile)


def nearly_fits(lean: LoadPlan) -> bool:
    """Whether a streaming plan reads at most NEAR_FIT of its file per pass (module docstring)."""
    memory = lean.memory
    return memory is not None and memory.streams and memory.bytes_read_per_pass <= NEAR_FIT * memory.target.file_bytes


def time_alone(lean: LoadPlan) -> AlonePass:
    """The target's 1-token pass as `lean` (the load without the drafter) plans it, and where it nearly
    fits (NEAR_FIT), also with its file left to the kernel's page cache: the faster of the two (module
    docstring). What the drafter's RAM is weighed against."""
    steered = time_plan(lean)
    if not nearly_fits(lean):
        return steered
    kernel = time_plan(lean.unsteered())
    return kernel if kernel.seconds < steered.seconds else steered


def use_buffers(target, n_tokens: int) -> None:
    """One prompt's pass of n_tokens stand-in tokens, then dropped: llama.cpp's compute buffers and the
    first KV cells become pages of the process, as in a conversation after its first prompt. Passes
    timed over a short context alone leave them untouched: room the page cache has while timed and
    not later, so a file left to the kernel timed as if it fit (docs/measurements/2026-12-06-one-vocabulary.md)."""
    n_tokens = min(n_tokens, target.n_ctx // 2)
    target.prefill(stand_in_tokens(n_tokens, target.n_vocab).tolist())
    target.truncate(0)


def time_plan(lean: LoadPlan) -> AlonePass:
    """The target's passes of 1 … a free round's nodes, loaded as `lean` plans. Timed here, before
    anything else is loaded, as the profile times passes: the plan the load would run, where a child
    process (the streaming profile's) would have less room, its own interpreter beside this one's
    (docs/measurements/code-notes.md, "The drafter-less pass timed at load")."""
    memory = lean.memory
    largest = MAX_LOOKUP_BUDGET + 1 if memory is None else min(memory.sizes.max_tree, MAX_LOOKUP_BUDGET + 1)
    target = lean.open_target()
    try:  # every size a sized free round can pass (the planner's curve without the drafter), 1-3 s here
        if memory is not None and memory.streams:
            use_buffers(target, memory.sizes.target_ubatch)
        timing, _ = measure_target_timing(target, ns=pass_sizes(largest), context_tokens=ALONE_CONTEXT, show=False, prune=False)
    finally:
        target.close()
        return_freed_memory()
    in_ram = memory is None or memory.target_in_ram
    return AlonePass(timing.seconds(1), 0 if memory is None else memory.bytes_read_per_pass,
                     0 if memory is None else memory.kept_layer_count, in_ram, timing.busy, curve=timing.curve.to_dict(),
                     steered=memory is None or memory.steered, timed_at=time.time())
