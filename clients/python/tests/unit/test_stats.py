"""The trainer-side wait meter, on a clock the test moves."""

from __future__ import annotations

import pytest

from shardfeed import _stats
from shardfeed._stats import WaitMeter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(_stats.time, "perf_counter", clock)
    return clock


def _loop(meter: WaitMeter, clock: Clock, steps: list[tuple[float, float]]) -> None:
    """One pass: each step waits, receives, then works."""
    meter.begin_pass()
    for wait, work in steps:
        clock.now += wait
        meter.received()
        clock.now += work
        meter.asking()


def test_the_fraction_is_waits_over_steps_and_the_first_batch_apart(clock: Clock) -> None:
    meter = WaitMeter()
    _loop(meter, clock, [(2.0, 0.05)] + [(0.01, 0.09)] * 9 + [(0.1, 0.0)])
    stats = meter.stats()
    assert stats.steps == 10, "the first batch of the pass starts no step"
    assert stats.first_waits == (2.0,)
    # Steps: 0.05 + 0.01, then 8 x (0.09 + 0.01), then 0.09 + 0.1.
    waits = 0.01 * 9 + 0.1
    lengths = 0.06 + 8 * 0.10 + 0.19
    assert stats.waiting_fraction == pytest.approx(waits / lengths)
    assert stats.wait_p50 == pytest.approx(0.01)
    assert stats.wait_p99 == pytest.approx(0.1)
    assert stats.step_p50 == pytest.approx(0.10)
    assert stats.verdict == "partly input-bound"
    assert "partly input-bound" in str(stats) and "10 steps" in str(stats)


def test_verdicts_and_the_last_steps(clock: Clock) -> None:
    meter = WaitMeter()
    assert meter.stats().verdict == "no steps yet"
    _loop(meter, clock, [(0.0, 0.05)] * 20)
    assert meter.stats().waiting_fraction == 0.0
    assert meter.stats().verdict == "not input-bound"
    _loop(meter, clock, [(0.05, 0.01)] * 5)
    assert meter.stats(last=4).waiting_fraction == pytest.approx(5 / 6)
    assert meter.stats(last=4).verdict == "input-bound"
    # A new pass's first batch (the stream's start) never counts as a step.
    assert meter.stats().steps == 19 + 4
    with pytest.raises(ValueError, match="last must be positive"):
        meter.stats(last=0)


def test_the_window_keeps_the_latest_steps(clock: Clock) -> None:
    meter = WaitMeter(window=3)
    _loop(meter, clock, [(1.0, 0.0)] * 3 + [(0.0, 1.0)] * 4)
    stats = meter.stats()
    assert stats.steps == 3 and stats.waiting_fraction == 0.0
    with pytest.raises(ValueError, match="window"):
        WaitMeter(window=0)


def test_the_running_totals_outlast_the_window(clock: Clock) -> None:
    # What a tuned stream's search is told: every step's wait and length
    # since the meter began, whatever its window keeps.
    meter = WaitMeter(window=2)
    assert meter.totals() == (0.0, 0.0, 0)
    _loop(meter, clock, [(9.0, 0.5)] + [(0.25, 0.75)] * 4)
    waited, stepped, steps = meter.totals()
    assert steps == 4
    assert waited == pytest.approx(4 * 0.25)
    assert stepped == pytest.approx(0.5 + 0.25 + 3 * 1.0)
