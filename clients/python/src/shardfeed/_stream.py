"""A stream's life on the client: the call and its batches (inline or from
shared memory), the idle watchdog, and the reconnect that resumes after the
last batch delivered when the server goes away for a while."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from . import _shm
from ._channel import Channel
from ._wire import Batch, ShardfeedError, _batch_with_images, _error

_log = logging.getLogger("shardfeed")

_RECONNECT_FIRST_DELAY = 0.1
_RECONNECT_MAX_DELAY = 5.0


class _IdleWatchdog:
    """Cancels a stream when the consumer has waited too long for one batch.

    Only time spent waiting for the next batch counts: a training step that
    takes long between two batches never trips it. An epoch may take hours;
    a whole-call deadline would cut it, so streams get this instead.
    """

    def __init__(self, call: Any, limit: float) -> None:
        self._call = call
        self._limit = limit
        self._waiting_since: float | None = None
        self._stopped = threading.Event()
        self.expired = False
        self._thread = threading.Thread(target=self._watch, name="shardfeed-watchdog", daemon=True)
        self._thread.start()

    def waiting(self) -> None:
        self._waiting_since = time.monotonic()

    def received(self) -> None:
        self._waiting_since = None

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        check = min(1.0, self._limit / 4)
        while not self._stopped.wait(check):
            since = self._waiting_since
            if since is not None and time.monotonic() - since > self._limit:
                self.expired = True
                self._call.cancel()
                return


class Reconnect:
    """Waits out an ``UNAVAILABLE`` server (a sidecar restarting) with
    exponential backoff, within ``budget`` seconds from the outage's start
    (0: none); other errors, and an outage past the budget, raise."""

    def __init__(self, channel: Channel, budget: float, what: str) -> None:
        self._channel = channel
        self._budget = budget
        self._what = what
        self.reset()

    def reset(self) -> None:
        self._started: float | None = None
        self._delay = _RECONNECT_FIRST_DELAY

    def wait(self, error: ShardfeedError, then: str = "retrying") -> None:
        target = self._channel.target
        if error.code != "UNAVAILABLE" or not self._budget:
            raise self._channel.unreachable(error) from None
        now = time.monotonic()
        self._started = now if self._started is None else self._started
        left = self._started + self._budget - now
        if left <= 0:
            raise error.with_message(
                f"{error.message}; gave up reconnecting to {target} after "
                f"{self._budget:g}s (reconnect_timeout)",
            ) from None
        # The server's advice (RetryInfo) when it says to wait longer.
        wait = min(max(self._delay, error.retry_delay or 0.0), left)
        _log.warning(
            "%s from %s ended with UNAVAILABLE (%s); reconnecting in %.1fs and %s",
            self._what,
            target,
            error.message,
            wait,
            then,
        )
        time.sleep(wait)
        self._delay = min(self._delay * 2, _RECONNECT_MAX_DELAY)


def stream(
    channel: Channel,
    request: Any,
    *,
    batch_timeout: float | None,
    reconnect_timeout: float,
    host_pinning: _shm.HostPinning | None = None,
) -> Iterator[Batch]:
    """The stream of ``request``, reopened after ``UNAVAILABLE`` right after
    the last batch delivered (each batch carries its position)."""
    reconnect = Reconnect(channel, reconnect_timeout, "stream")
    delivered = False
    while True:
        try:
            for batch in _stream_once(channel, request, batch_timeout, host_pinning):
                reconnect.reset()
                channel.reached = delivered = True
                if request.sources and not request.HasField("weights_from_step"):
                    # The weights began at this first batch: a reconnect
                    # resumes past it and must say so (the plan rounds each
                    # weight span from its own start).
                    done = sum(batches for _, batches in batch.position.segments)
                    request.weights_from_step = batch.epoch * batch.epoch_steps + done - 1
                yield batch
                batch.position.to_message(request.resume_from)
                request.start_batch = 0
            return
        except ShardfeedError as error:
            channel.check_reachable(error)
            then = "resuming after the last batch received" if delivered else "retrying"
            reconnect.wait(error, then)


def _stream_once(
    channel: Channel,
    request: Any,
    limit: float | None,
    host_pinning: _shm.HostPinning | None,
) -> Iterator[Batch]:
    call = channel.stream_batches(request)
    watchdog = _IdleWatchdog(call, limit) if limit is not None else None
    rings: dict[bytes, _shm.SharedRing] = {}
    try:
        while True:
            if watchdog is not None:
                watchdog.waiting()
            try:
                message, flat = next(call)
            except StopIteration:
                return
            if watchdog is not None:
                watchdog.received()
            if message.HasField("shared"):
                flat = _shared_images(channel.target, rings, message.shared, host_pinning)
            yield _batch_with_images(message, flat)
    except grpc.RpcError as exc:
        if watchdog is not None and watchdog.expired:
            raise ShardfeedError(
                "DEADLINE_EXCEEDED", f"no batch arrived within batch_timeout={limit}s"
            ) from None
        raise _error(exc) from None
    finally:
        if watchdog is not None:
            watchdog.stop()
        # Leaving the loop early cancels the stream, freeing the server's work.
        call.cancel()
        for ring in rings.values():
            ring.close()


def _shared_images(
    target: str,
    rings: dict[bytes, _shm.SharedRing],
    shared: Any,
    host_pinning: _shm.HostPinning | None,
) -> Any:
    path = _shm.socket_path(target)
    if path is None:
        raise ShardfeedError(
            "FAILED_PRECONDITION", "the server sent shared memory over a non-Unix target"
        )
    try:
        ring = _shm.attach(rings, path, shared, host_pinning)
    except OSError as exc:
        raise ShardfeedError(
            "UNAVAILABLE",
            f"cannot map the server's shared memory through {path}.fds: {exc}; "
            "use transport='inline'",
        ) from None
    # Holding more batches than the ring allows would stall the stream: later
    # ones are copied out and their slots returned at once.
    return ring.view(shared.slot, shared.offset, shared.length, copy=ring.held >= shared.holdable)
