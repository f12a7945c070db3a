"""Rates measured at another time, weighed at the machine's speed now: a saved book's target passes are
rescaled by the drafter-less pass timed then and now (plan/arms.ArmBook.rescale), a timing older than
STALE_SECONDS is timed again at the next load and not averaged in (loading/drafter_room.AlonePass),
and the drafter a slower day measured below a pass timed today is kept where it is faster today."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

import ondevice
from ondevice.loading.drafter_room import STALE_SECONDS, AlonePass, choose_drafter
from ondevice.plan.acceptance import default_p_rank
from ondevice.plan.arms import ArmBook, Yardstick, load_book, save_book
from ondevice.plan.profile import Profile

from test_drafter_room import ALONE, Saved, regimes
from test_streaming_pipeline import stream_tiny_target, tiny_home  # noqa: F401 - a fixture

TREE = "best-first@15"


def measured(draft: float, pass_: float, tokens: int, rounds: int = 12, target_pass: float | None = None) -> ArmBook:
    """A book of `rounds` tree rounds (drafting `draft` s, a pass of `pass_` s, `tokens` emitted each),
    and as many rounds of the target alone (one `target_pass` s pass, one token each)."""
    book = ArmBook()
    for _ in range(rounds):
        book.observe(TREE, tokens, draft + pass_, 0.1, audit=False, spt_incumbent=None, pass_seconds=pass_)
        book.observe("target", 1, target_pass or pass_, 0.4, audit=False, spt_incumbent=None, pass_seconds=target_pass or pass_)
    return book


def test_a_saved_book_is_rescaled_to_the_machine_speed_now(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    book = measured(draft=0.2, pass_=0.5, tokens=4)
    book.yardstick = Yardstick(0.30, 14)  # the drafter-less pass timed before these rounds
    save_book(book, "pair", "stream")
    as_saved = load_book("pair", "stream")  # nothing timed now: as it was
    assert as_saved.yardstick == Yardstick(0.30, 14) and as_saved.spt(TREE, None) == pytest.approx((0.2 + 0.5) / 4)
    today = load_book("pair", "stream", yardstick=Yardstick(0.15, 14))  # the disk twice as fast: passes take half as long
    assert today.yardstick == Yardstick(0.15, 14)
    assert today.spt(TREE, None) == pytest.approx((0.2 + 0.25) / 4) and today.spt("target", None) == pytest.approx(0.25)
    assert today.kappa("model") == pytest.approx(as_saved.kappa("model"))  # measured against predicted: the same rounds
    assert today.arms[TREE].tokens == pytest.approx(as_saved.arms[TREE].tokens)
    save_book(today, "pair", "stream")
    again = load_book("pair", "stream", yardstick=Yardstick(0.30, 15))  # and back: the same book
    assert again.spt(TREE, None) == pytest.approx(as_saved.spt(TREE, None))
    save_book(again, "pair", "stream")
    other_plan = load_book("pair", "stream", yardstick=Yardstick(0.15, 20))  # a larger limit keeps more layers: not the machine
    assert other_plan.spt(TREE, None) == pytest.approx(as_saved.spt(TREE, None)) and other_plan.yardstick == Yardstick(0.15, 20)


def test_a_book_saved_without_a_yardstick_is_taken_as_measured_now(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    save_book(measured(draft=0.2, pass_=0.5, tokens=4), "pair", "stream")
    data = json.loads((tmp_path / "arms" / "pair-stream.json").read_text())
    data.pop("yardstick")  # as books were saved before they kept one
    for tally in (*data["arms"].values(), *data["families"].values()):
        tally.pop("pass_seconds")
    (tmp_path / "arms" / "pair-stream.json").write_text(json.dumps(data))
    loaded = load_book("pair", "stream", yardstick=Yardstick(0.15, 14))
    assert loaded.spt(TREE, None) == pytest.approx(0.7 / 4) and loaded.yardstick == Yardstick(0.15, 14)  # unscaled, labelled from now on


def test_a_drafter_a_slower_day_measured_is_weighed_at_todays_speed(tmp_path, monkeypatch):
    """A load weighed the book's fastest tree, measured at 4.3 tok/s on a day the drafter-less pass took
    0.30 s, against that pass timed at 0.20 s today (5 tok/s), and left the drafter out: rescaled, the
    tree runs 5.6 tok/s today and the drafter is kept."""
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    slow_day = measured(draft=0.25, pass_=0.56, tokens=3.5, target_pass=0.75)
    slow_day.yardstick = Yardstick(0.30, ALONE.kept_layers)
    save_book(slow_day, "pair", "with")
    today = Saved(replace(ALONE, seconds=0.20, timed_at=time.time()))
    unscaled = choose_drafter(today, default_p_rank(), load_book("pair", "with"), ArmBook())
    assert unscaled.with_drafter == pytest.approx(3.5 / 0.81) and not unscaled.keep
    choice = choose_drafter(today, default_p_rank(), load_book("pair", "with", yardstick=Yardstick(0.20, ALONE.kept_layers)), ArmBook())
    assert choice.with_source == "measured" and choice.with_drafter == pytest.approx(3.5 / (0.25 + 0.56 * 2 / 3))
    assert choice.keep and choice.unsure  # by less than the planner's distrust: timed again at the next load


def test_a_timing_of_another_day_is_timed_again_not_averaged_in():
    now = time.time()
    old = replace(ALONE, seconds=0.40, timed_at=now - STALE_SECONDS - 60)
    fresh = replace(ALONE, seconds=0.20, timed_at=now)
    assert not old.fresh() and old.yardstick is None  # says nothing of the machine now
    assert fresh.fresh() and fresh.yardstick == Yardstick(0.20, ALONE.kept_layers)
    assert old.folded(fresh) == fresh  # a new mean starts
    assert replace(old, timed_at=now - 60).folded(fresh).seconds == pytest.approx(0.30)  # within the hours: the mean
    assert replace(fresh, busy=True).yardstick is None  # disturbed: not a measure of the machine
    assert AlonePass.from_dict({k: v for k, v in ALONE.to_dict().items() if k != "timed_at"}).timed_at == 0.0  # saved before: stale


def test_a_load_after_hours_times_the_pass_again_and_the_planner_rescales_its_book(tiny_home, monkeypatch):  # noqa: F811
    stream_tiny_target(tiny_home, monkeypatch)
    load = dict(target_backend="llama", drafter_backend="llama", threads=1, ctx=256)
    with_drafter, _ = regimes(tiny_home)
    save_book(measured(draft=0.0, pass_=1e-6, tokens=1, rounds=40), "tiny", with_drafter)  # unlabelled; fast enough to keep the drafter
    with ondevice.load("tiny", **load):
        pass  # the streaming profile and the drafter-less pass, timed
    (path,) = (tiny_home / "profiles").glob("*-tiny-cpu-t1-stream*.json")
    profile = Profile.from_dict(json.loads(path.read_text()))
    first = AlonePass.from_dict(profile.alone)
    assert first.fresh()
    profile.alone = replace(first, timed_at=first.timed_at - STALE_SECONDS - 60, timings=5).to_dict()  # hours ago
    path.write_text(json.dumps(profile.to_dict()))
    book = measured(draft=0.0, pass_=1e-6, tokens=1, rounds=40)
    book.yardstick = Yardstick(2.0 * first.seconds, first.kept_layers)  # its rounds ran when the pass took twice as long
    save_book(book, "tiny", with_drafter)
    with ondevice.load("tiny", **load) as pipe:
        timed = AlonePass.from_dict(json.loads(path.read_text())["alone"])
        assert timed.fresh() and timed.timings == 1  # timed again, the old mean dropped
        planner = pipe.auto_planner()
        assert pipe.drafter_choice.keep and planner.regime == with_drafter
        if timed.busy:  # every sample disturbed by other processes: no yardstick, the book as saved
            assert timed.yardstick is None and planner.book.yardstick == book.yardstick
            assert planner.book.spt("target", None) == pytest.approx(book.spt("target", None))
            return
        assert planner.book.yardstick == timed.yardstick
        spt = book.spt("target", None) * timed.seconds / book.yardstick.seconds  # every round a pass, rescaled
        assert planner.book.spt("target", None) == pytest.approx(spt)
        assert pipe.drafter_choice.with_drafter == pytest.approx(book.yardstick.seconds / timed.seconds / book.spt(TREE, None))


def test_a_drafter_left_out_on_a_rate_of_another_time_is_measured_again_when_close(tmp_path, monkeypatch):
    """Left out, the drafter is never measured again: a rate no session measured lately that is within
    the planner's distrust of the other side loads it to be measured; a far slower one, or a rate
    measured lately, does not."""
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    today = Saved(replace(ALONE, seconds=0.20, timed_at=time.time()))  # 5 tok/s without the drafter
    close = measured(draft=0.25, pass_=0.56, tokens=3.5)  # 4.3 tok/s
    far = measured(draft=0.25, pass_=0.56, tokens=1.5)  # 1.9 tok/s: below 5 / UNSURE
    for book, lately, explore in ((close, False, True), (close, True, False), (far, False, False)):
        book.saved_at = time.time() - (60 if lately else STALE_SECONDS + 60)
        choice = choose_drafter(today, default_p_rank(), book, ArmBook())
        assert (choice.keep, choice.explore, choice.with_stale) == (explore, explore, not lately)
        assert ("drafter loaded to measure it" in choice.describe()) == explore
        assert not choose_drafter(today, default_p_rank(), book, ArmBook(), paging=True).keep  # paging: what it measured decides
    saved = save_book(close, "pair", "with")
    assert ArmBook.from_dict(json.loads(saved.read_text())).saved_at == pytest.approx(time.time(), abs=60)
