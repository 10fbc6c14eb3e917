"""A sidecar restart mid-epoch: the client reconnects and resumes exactly."""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from shardfeed import Batch, Client, ShardfeedError

from ..conftest import S3, Server, noise_jpeg, start_server, stop, upload, write_tar


@pytest.fixture(scope="module")
def dataset(s3: S3) -> str:
    shards = [
        write_tar(
            [
                (f"r{s:02d}{i:03d}", {"jpg": noise_jpeg(s * 100 + i, 40, 56), "cls": b"%d" % i})
                for i in range(40)
            ]
        )
        for s in range(3)
    ]
    return upload(s3, "restart", "", shards)


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # Unix socket paths are limited to 108 bytes: a short directory.
    directory = tempfile.mkdtemp(prefix="sf-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def _batches(client: Client, uri: str, **options: Any) -> Iterator[Batch]:
    return client.batches(
        uri,
        seed=5,
        epoch=2,
        rank=0,
        world_size=1,
        batch_size=8,
        image_size=32,
        augment="train",
        **options,
    )


def _epoch(
    client: Client, uri: str, on_batch: object = None, **options: Any
) -> list[tuple[list[str], bytes]]:
    out = []
    for batch in _batches(client, uri, **options):
        out.append((list(batch.keys), np.ascontiguousarray(batch.images).tobytes()))
        if callable(on_batch):
            on_batch(len(out))
    return out


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_sidecar_restart_mid_epoch_costs_no_sample(
    s3: S3, dataset: str, socket_dir: str, how: str
) -> None:
    listen = f"unix:{socket_dir}/sf.sock"
    first = start_server(s3, listen)
    servers: list[Server] = [first]
    try:
        client = Client(first.target)
        expected = _epoch(client, dataset)
        assert len(expected) == 15

        arrivals: list[float] = []

        def restart_after(batches: int) -> None:
            arrivals.append(time.monotonic())
            if batches != 4:
                return
            if how == "sigterm":
                # Drains: the batch in flight, then UNAVAILABLE; exits by itself,
                # also once every ring slot is lent to this trainer, which holds
                # them until the sidecar has gone (nothing is in flight then).
                time.sleep(1)
                first.process.send_signal(signal.SIGTERM)
                first.process.wait(timeout=30)
            else:
                first.process.send_signal(signal.SIGKILL)
                first.process.wait(timeout=30)

            def replace() -> None:
                time.sleep(2)
                servers.append(start_server(s3, listen))

            threading.Thread(target=replace, daemon=True).start()

        got = _epoch(client, dataset, on_batch=restart_after)
        assert [keys for keys, _ in got] == [keys for keys, _ in expected]
        assert all(a == b for (_, a), (_, b) in zip(got, expected)), "byte-identical batches"
        keys = [k for batch_keys, _ in got for k in batch_keys]
        assert len(keys) == len(set(keys)) == 120, "every sample exactly once"
        gap = max(b - a for a, b in zip(arrivals, arrivals[1:]))
        print(f"\n{how}: reconnect gap {gap:.2f}s, 0 samples lost, 0 repeated")
    finally:
        for server in servers:
            stop(server.process)


def test_a_drained_stream_says_where_to_resume_in_its_status_details(
    s3: S3, dataset: str, socket_dir: str
) -> None:
    listen = f"unix:{socket_dir}/sf.sock"
    first = start_server(s3, listen)
    servers: list[Server] = [first]
    try:
        expected = _epoch(Client(first.target), dataset)
        got: list[Batch] = []
        with pytest.raises(ShardfeedError) as raised:
            for batch in _batches(Client(first.target, reconnect_timeout=0), dataset):
                got.append(batch)
                if len(got) == 3:
                    first.process.send_signal(signal.SIGTERM)
        error = raised.value
        assert (error.code, error.reason) == ("UNAVAILABLE", "SERVER_DRAINING"), error
        assert error.retry_delay is not None and error.retry_delay > 0
        assert int(error.metadata["start_batch"]) == got[-1].index + 1
        assert int(error.metadata["epoch"]) == 2
        assert error.resume_position() == got[-1].position

        # The replacement takes the socket once the drained server is gone:
        # while it still listens (it exits just after its last stream ends),
        # a second server refuses the path rather than steal it.
        first.process.wait(timeout=30)
        servers.append(start_server(s3, listen))
        rest = _epoch(Client(first.target), dataset, resume_from=error.resume_position())
        assert [keys for keys, _ in rest] == [keys for keys, _ in expected[len(got) :]]
        assert [pixels for _, pixels in rest] == [pixels for _, pixels in expected[len(got) :]]
    finally:
        for server in servers:
            stop(server.process)


def test_other_codes_fail_at_once_and_a_budget_ends_the_wait(
    s3: S3, server: Server, dataset: str, socket_dir: str
) -> None:
    started = time.monotonic()
    with pytest.raises(ShardfeedError) as raised:
        list(Client(server.target).batches("s3://restart/missing/", batch_size=8))
    assert raised.value.code == "NOT_FOUND"
    assert time.monotonic() - started < 10

    # A sidecar that answered once and is gone: waited for, within budget.
    gone = start_server(s3, f"unix:{socket_dir}/gone.sock")
    reached = Client(gone.target, reconnect_timeout=1.0)
    reached.describe(dataset, world_size=1, batch_size=8)
    stop(gone.process)
    started = time.monotonic()
    with pytest.raises(ShardfeedError) as raised:
        list(reached.batches(dataset, batch_size=8))
    assert raised.value.code == "UNAVAILABLE"
    assert "gave up reconnecting" in raised.value.message, raised.value.message
    assert gone.target in raised.value.message
    assert time.monotonic() - started < 10


def test_a_target_that_never_answered_fails_in_seconds_naming_it(
    dataset: str, socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    absent = f"unix://{socket_dir}/absent.sock"
    monkeypatch.setenv("SHARDFEED_TARGET", absent)
    for make in (lambda: Client(), lambda: Client(absent)):
        client = make()
        started = time.monotonic()
        with pytest.raises(ShardfeedError) as raised:
            # The default reconnect budget (120 s) is for a server that answered.
            next(iter(client.batches(dataset, batch_size=8)))
        took = time.monotonic() - started
        message = raised.value.message
        assert raised.value.code == "UNAVAILABLE"
        assert absent in message and "$SHARDFEED_TARGET" in message, message
        assert took < 15, f"{took:.1f}s to give up on a target that never answered"
    with pytest.raises(ShardfeedError, match="SHARDFEED_TARGET"):
        Client(absent, connect_timeout=0.5).describe(dataset)
