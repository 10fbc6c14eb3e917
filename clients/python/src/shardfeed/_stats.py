""" "Is the training loop waiting for data?", measured where the loop runs.

A loop's step ``k`` is the time between receiving batch ``k - 1`` and batch
``k``: the loop's own work (forward, backward, optimizer, logging) and then
the wait for the next batch. The meter records both for the last ``window``
steps; the waiting fraction is their ratio. Pure: no torch, no gRPC.

The first batch of each pass is left out (it has no step before it, and its
wait is the stream's start: opening the dataset, the first shard's first
bytes), and counted apart in ``InputStats.first_waits``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

__all__ = ["InputStats", "WaitMeter"]

# Steps kept: ~15 minutes at 1 step/s, 24 bytes a step.
DEFAULT_WINDOW = 1000
# Below this waiting fraction the loop is compute-bound; above the upper
# one, input-bound (the sidecar's own stall histograms say why).
_BOUND_BELOW = 0.05
_BOUND_ABOVE = 0.25


@dataclass(frozen=True)
class InputStats:
    """The training loop's waits for batches over its last ``steps`` steps.

    ``waiting_fraction``: the share of the loop's time spent waiting for the
    next batch (0: never waited; 1: did nothing else). ``wait_p50`` /
    ``wait_p99``: seconds waited per step; ``step_p50``: seconds per step
    (work plus wait). ``first_waits``: the first batch of each pass, seconds
    (the stream's start, not counted above).
    """

    steps: int
    waiting_fraction: float
    wait_p50: float
    wait_p99: float
    step_p50: float
    first_waits: tuple[float, ...] = ()

    @property
    def verdict(self) -> str:
        """``"input-bound"``, ``"partly input-bound"``, ``"not input-bound"``
        or ``"no steps yet"``."""
        if self.steps == 0:
            return "no steps yet"
        if self.waiting_fraction >= _BOUND_ABOVE:
            return "input-bound"
        if self.waiting_fraction >= _BOUND_BELOW:
            return "partly input-bound"
        return "not input-bound"

    def __str__(self) -> str:
        if self.steps == 0:
            return "InputStats: no steps yet"
        return (
            f"InputStats: {self.verdict}: waited {100 * self.waiting_fraction:.1f}% of the "
            f"last {self.steps} steps (wait p50 {1e3 * self.wait_p50:.2f} ms, p99 "
            f"{1e3 * self.wait_p99:.2f} ms; step p50 {1e3 * self.step_p50:.2f} ms)"
        )


class WaitMeter:
    """Records, for one training loop, each wait for a batch and the step
    it ends. Calls come from the loop's thread; :meth:`stats` from any."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, not {window}")
        self._lock = threading.Lock()
        self._steps: deque[tuple[float, float]] = deque(maxlen=window)
        self._first_waits: deque[float] = deque(maxlen=16)
        self._asked: float | None = None
        self._last_received: float | None = None
        # Running totals over every step, for the server's share search.
        self._waited_total = 0.0
        self._stepped_total = 0.0
        self._steps_total = 0

    def begin_pass(self) -> None:
        """A new pass over the data: its first batch starts no step."""
        self._last_received = None
        self._asked = time.perf_counter()

    def asking(self) -> None:
        """The loop asks for its next batch."""
        self._asked = time.perf_counter()

    def received(self) -> None:
        """The batch asked for is in the loop's hands."""
        now = time.perf_counter()
        asked, self._asked = self._asked, None
        if asked is None:
            return
        wait = now - asked
        with self._lock:
            if self._last_received is None:
                self._first_waits.append(wait)
            else:
                step = now - self._last_received
                self._steps.append((wait, step))
                self._waited_total += wait
                self._stepped_total += step
                self._steps_total += 1
        self._last_received = now

    def totals(self) -> tuple[float, float, int]:
        """Seconds waited and stepped over every step so far (each wait is
        part of its step), and the steps: what a tuned stream's search is
        told."""
        with self._lock:
            return self._waited_total, self._stepped_total, self._steps_total

    def stats(self, last: int | None = None) -> InputStats:
        """Over the last ``last`` steps kept (default: all of the window)."""
        with self._lock:
            steps = list(self._steps)
            first = tuple(self._first_waits)
        if last is not None:
            if last <= 0:
                raise ValueError(f"last must be positive, not {last}")
            steps = steps[-last:]
        if not steps:
            return InputStats(0, 0.0, 0.0, 0.0, 0.0, first)
        waits = sorted(wait for wait, _ in steps)
        lengths = sorted(length for _, length in steps)
        total = sum(lengths)
        return InputStats(
            steps=len(steps),
            waiting_fraction=min(1.0, sum(waits) / total) if total > 0 else 0.0,
            wait_p50=_quantile(waits, 0.50),
            wait_p99=_quantile(waits, 0.99),
            step_p50=_quantile(lengths, 0.50),
            first_waits=first,
        )


def _quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted values."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
