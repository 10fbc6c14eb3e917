"""Batches through the server's shared-memory ring, against the real binary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardfeed import Client

from ..conftest import S3, Server, noise_jpeg, upload, write_tar


@pytest.fixture(scope="module")
def dataset(s3: S3) -> str:
    shards = [
        write_tar(
            [(f"s{s}k{i:03d}", {"jpg": noise_jpeg(s * 40 + i), "cls": b"1"}) for i in range(40)]
        )
        for s in range(2)
    ]
    return upload(s3, "shm", "", shards)


def _memfds(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith("/memfd:shardfeed-batches"):
                count += 1
        except OSError:
            pass
    return count


def _stream(server: Server, dataset: str, transport: str) -> Iterator[object]:
    return Client(server.target).batches(
        dataset, batch_size=8, image_size=32, seed=5, transport=transport, rank=0, world_size=1
    )


def test_shared_memory_and_inline_deliver_the_same_bytes(unix_server: Server, dataset: str) -> None:
    inline = []
    for batch in _stream(unix_server, dataset, "inline"):
        assert not batch.shared
        inline.append((batch.keys, batch.labels.copy(), batch.images.copy()))
    shared = []
    for batch in _stream(unix_server, dataset, "shared_memory"):
        assert batch.shared
        assert not batch.images.flags.writeable, "a view of the server's slot, read-only"
        shared.append((batch.keys, batch.labels.copy(), batch.images.copy()))
    assert len(inline) == len(shared) == 10
    for (keys, labels, images), (skeys, slabels, simages) in zip(inline, shared):
        assert keys == skeys
        assert (labels == slabels).all()
        assert (images == simages).all()


def test_a_held_batch_stays_unchanged_and_holding_all_does_not_stall(
    unix_server: Server, dataset: str
) -> None:
    stream = iter(_stream(unix_server, dataset, "shared_memory"))
    first = next(stream)
    saved = first.images.copy()
    rest = list(stream)  # holds every batch: later ones must arrive as copies
    assert len(rest) == 9
    assert (first.images == saved).all(), "a held slot was decoded into again"
    inline = list(_stream(unix_server, dataset, "inline"))
    for got, expected in zip([first, *rest], inline):
        assert (got.images == expected.images).all()


def test_auto_picks_shared_memory_on_unix_and_tcp_falls_back(
    unix_server: Server, server: Server, dataset: str
) -> None:
    batch = next(iter(_stream(unix_server, dataset, "auto")))
    assert batch.shared and not batch.images.flags.writeable
    del batch
    over_tcp = list(_stream(server, dataset, "shared_memory"))
    assert len(over_tcp) == 10, "TCP: the server sends inline bytes instead"
    assert not any(b.shared for b in over_tcp)


_CLIENT = """
import sys, time
from shardfeed import Client
batches = Client(sys.argv[1]).batches(sys.argv[2], batch_size=8, image_size=32,
                                      transport="shared_memory", rank=0, world_size=1)
held = next(iter(batches))
print("mapped", flush=True)
time.sleep(60)
"""


def test_a_killed_client_leaves_nothing_behind(unix_server: Server, dataset: str) -> None:
    pid = unix_server.process.pid
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert _memfds(pid) == 0
    client = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, unix_server.target, dataset], stdout=subprocess.PIPE
    )
    assert client.stdout is not None
    assert client.stdout.readline().decode().strip() == "mapped"
    assert _memfds(pid) == 1, "the stream's ring"
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.monotonic() + 1.0
    while _memfds(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _memfds(pid) == 0, "the server still holds the ring a second after the kill"
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert after == shm_before, "nothing is named in /dev/shm"


def test_a_batch_kept_after_break_stays_unchanged(unix_server: Server, dataset: str) -> None:
    # 40 batches of 2: the producer is ahead, waiting for credits, when the
    # client breaks out and closes its credit connection.
    stream = iter(
        Client(unix_server.target).batches(
            dataset,
            batch_size=2,
            image_size=32,
            seed=5,
            transport="shared_memory",
            rank=0,
            world_size=1,
        )
    )
    next(stream)
    kept = next(stream)
    saved = kept.images.copy()
    time.sleep(0.3)  # let the producer fill every slot it may
    stream.close()  # type: ignore[attr-defined]
    later = list(_stream(unix_server, dataset, "shared_memory"))
    assert len(later) == 10
    time.sleep(0.3)
    assert (kept.images == saved).all(), "a slot the caller still holds was written"


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_streams_cancelled_before_collecting_their_rings_free_their_memory(
    s3: S3, dataset: str
) -> None:
    """200 shared-memory streams opened and cancelled before their rings are
    collected (48 MB of slots decoded into each), under --memory-limit 2G."""
    import grpc

    from shardfeed._proto import shardfeed_pb2 as pb
    from shardfeed._proto import shardfeed_pb2_grpc as pb_grpc

    from ..conftest import scrape, start_server, stop

    limit = 2 << 30
    directory = tempfile.mkdtemp(prefix="sf-")
    server = start_server(s3, f"unix:{directory}/sf.sock", "--memory-limit", "2G")

    def reserved() -> float:
        return scrape(server.metrics_url).get("shardfeed_stream_memory_reserved_bytes", 0.0)

    def wait_until_released() -> None:
        deadline = time.monotonic() + 10
        while reserved() > 0:
            assert time.monotonic() < deadline, "a cancelled stream kept its memory"
            time.sleep(0.005)

    try:
        channel = grpc.insecure_channel(
            server.target, options=[("grpc.default_authority", "localhost")]
        )
        stub = pb_grpc.ShardfeedStub(channel)  # type: ignore[no-untyped-call]
        request = pb.StreamBatchesRequest(
            dataset=dataset,
            batch_size=40,
            height=448,
            width=448,
            world_size=1,
            transport=pb.TRANSPORT_SHARED_MEMORY,
        )
        peak = 0
        for _ in range(200):
            call = stub.StreamBatches(request)
            next(call)  # decoded into the ring, which is never collected
            call.cancel()
            # What the next open finds: the budget whole again once the
            # stream's memory, its ring included, is really free.
            wait_until_released()
            peak = max(peak, _rss(server.process.pid))
        assert peak < limit, f"server RSS reached {peak / 2**30:.2f} GiB with a 2 GiB limit"
        later = list(Client(server.target).batches(dataset, batch_size=8, image_size=32))
        assert len(later) == 10, "a later stream is admitted"
        wait_until_released()
        channel.close()
    finally:
        stop(server.process)


class _RecordingPinning:
    """A host-pinning runtime that records what it is asked to do, and
    checks the registered memory is the mapping the batches are views of."""

    def __init__(self) -> None:
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []

    def register(self, address: int, size: int) -> bool:
        self.registered.append((address, size))
        return True

    def unregister(self, address: int) -> None:
        self.unregistered.append(address)


def test_a_ring_is_pinned_once_and_released_after_its_last_view(
    unix_server: Server, dataset: str
) -> None:
    pinning = _RecordingPinning()
    stream = Client(unix_server.target).batches(
        dataset, batch_size=8, image_size=32, seed=5, rank=0, world_size=1, host_pinning=pinning
    )
    kept = []
    for batch in stream:
        assert batch.shared
        ((address, size),) = pinning.registered  # once, for every batch of the stream
        if not kept:
            # The first batch is a view of the registered mapping (later
            # ones may be private copies while it is held).
            start = batch.images.ctypes.data
            assert address <= start and start + batch.images.nbytes <= address + size
            kept.append(batch.images)
    # The stream is over, but a view is still held: the memory stays pinned.
    assert pinning.unregistered == []
    del batch, kept
    import gc

    gc.collect()
    assert pinning.unregistered == [pinning.registered[0][0]]


def test_a_refused_pinning_leaves_the_stream_as_it_was(unix_server: Server, dataset: str) -> None:
    class Refusing(_RecordingPinning):
        def register(self, address: int, size: int) -> bool:
            super().register(address, size)
            return False

    pinning = Refusing()
    batches = list(
        Client(unix_server.target).batches(
            dataset,
            batch_size=8,
            image_size=32,
            seed=5,
            rank=0,
            world_size=1,
            host_pinning=pinning,
        )
    )
    assert len(batches) == 10 and len(pinning.registered) == 1
    del batches
    assert pinning.unregistered == []
