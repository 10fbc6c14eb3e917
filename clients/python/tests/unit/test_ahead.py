"""run_ahead: the producer thread that makes CUDA batches ahead of the loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from shardfeed._ahead import run_ahead


class Source:
    """Counts what was produced and whether the source was closed."""

    def __init__(self, count: int, fail_at: int | None = None) -> None:
        self.count = count
        self.fail_at = fail_at
        self.produced = 0
        self.closed = threading.Event()
        self.threads: set[str] = set()

    def items(self) -> Iterator[int]:
        try:
            for n in range(self.count):
                self.threads.add(threading.current_thread().name)
                if n == self.fail_at:
                    raise ValueError(f"item {n} is bad")
                self.produced += 1
                yield n
        finally:
            self.closed.set()


def test_every_item_in_order_made_on_the_named_thread() -> None:
    source = Source(50)
    assert list(run_ahead(source.items(), 3, name="maker")) == list(range(50))
    assert source.threads == {"maker"}
    assert source.closed.is_set()


def test_the_producer_runs_at_most_depth_plus_one_ahead() -> None:
    source = Source(100)
    ahead = run_ahead(source.items(), 2, name="maker")
    assert next(ahead) == 0
    time.sleep(0.3)  # ample time to run ahead, were it unbounded
    # Held by the caller: item 0; queued: 2; in the producer's hand: 1.
    assert source.produced == 4
    ahead.close()


def test_the_producers_error_comes_after_the_items_before_it() -> None:
    source = Source(10, fail_at=5)
    got = []
    with pytest.raises(ValueError, match="item 5 is bad"):
        for item in run_ahead(source.items(), 2, name="maker"):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]
    assert source.closed.is_set()


def test_leaving_early_stops_the_producer_and_closes_its_source() -> None:
    source = Source(1_000_000)
    ahead = run_ahead(source.items(), 2, name="maker")
    assert [next(ahead) for _ in range(3)] == [0, 1, 2]
    started = time.monotonic()
    ahead.close()
    # The producer was blocked on a full queue: it sees the stop within a
    # poll, not after its million items.
    assert time.monotonic() - started < 5
    assert source.closed.wait(5)
    assert source.produced < 10
    assert not any(t.name == "maker" for t in threading.enumerate())


def test_an_empty_source_ends_at_once() -> None:
    assert list(run_ahead(iter([]), 1, name="maker")) == []


def test_depth_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        list(run_ahead(iter([1]), 0, name="maker"))
