"""The decode pool across processes: a sidecar and three ``shardfeed
pool-worker`` processes on 127.0.0.1-3. Batches equal a pool-less run's byte
for byte whoever decoded them, and a worker SIGKILLed, stopped (SIGSTOP: a
worker slowed without bound) or refusing the token costs time, never a
sample or a repeat."""

from __future__ import annotations

import hashlib
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardfeed import Client

from ..conftest import (
    REPO,
    S3,
    PoolWorker,
    Server,
    free_port,
    noise_jpeg,
    scrape,
    start_pool_worker,
    start_server,
    stop,
    upload,
    write_tar,
)

TOKEN = "e2e-pool-token"
STREAM: dict[str, Any] = dict(batch_size=8, image_size=32, seed=3, augment="train")
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def documented_metrics() -> list[str]:
    table = (REPO / "docs" / "METRICS.md").read_text()
    return re.findall(r"^\| `(shardfeed_[a-z0-9_]+)`", table, flags=re.M)


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    return sum(
        value
        for key, value in samples.items()
        if key.partition("{")[0] == name and all(f'{k}="{v}"' in key for k, v in labels.items())
    )


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pool") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def photos(s3: S3) -> str:
    """4 shards of 16 noise photos of a few sizes, one of them corrupt."""
    tars = []
    for shard in range(4):
        members = []
        for i in range(16):
            n = shard * 16 + i
            image = b"\xff\xd8 not a jpeg" if n == 21 else noise_jpeg(n, 40 + n % 3 * 8, 56)
            members.append((f"s{shard}/k{n:03d}", {"jpg": image, "cls": b"%d" % (n % 5)}))
        tars.append(write_tar(members))
    return upload(s3, "pooled", "", tars)


@pytest.fixture
def workers(token_file: Path) -> Iterator[list[PoolWorker]]:
    started = [start_pool_worker(host, token_file) for host in HOSTS]
    yield started
    for worker in started:
        if worker.process.poll() is None:
            os.kill(worker.process.pid, signal.SIGCONT)
        stop(worker.process)


def pooled_server(s3: S3, token_file: Path, workers: list[PoolWorker], *extra: str) -> Server:
    return start_server(
        s3,
        f"127.0.0.1:{free_port()}",
        "--pool",
        ",".join(w.address for w in workers),
        "--pool-token-file",
        str(token_file),
        "--pool-share",
        "1",
        "--pool-unit-samples",
        "2",
        "--pool-deadline-ms",
        "4000",
        "--decode-threads",
        "1",
        *extra,
    )


Delivered = list[tuple[int, int, tuple[str, ...], str]]


def epoch(target: str, uri: str, world_size: int, **options: Any) -> Delivered:
    """Every rank's batches: (rank, index, keys, digest of pixels and labels)."""
    out = []
    with Client(target) as client:
        for rank in range(world_size):
            for batch in client.batches(uri, rank=rank, world_size=world_size, **STREAM, **options):
                digest = hashlib.sha256(batch.images.tobytes() + batch.labels.tobytes())
                out.append((rank, batch.index, tuple(batch.keys), digest.hexdigest()))
    return out


def no_repeats(delivered: Delivered) -> None:
    keys = [key for _, _, batch, _ in delivered for key in batch]
    assert len(keys) == len(set(keys)), "a sample arrived twice"


def test_pooled_batches_equal_a_pool_less_run(
    s3: S3, server: Server, photos: str, token_file: Path, workers: list[PoolWorker]
) -> None:
    pooled = pooled_server(s3, token_file, workers)
    try:
        for world_size in (1, 4):
            want = epoch(server.target, photos, world_size)
            got = epoch(pooled.target, photos, world_size)
            no_repeats(got)
            assert got == want, f"world size {world_size}"
        tail = epoch(pooled.target, photos, 1, start_batch=3)
        assert tail == epoch(server.target, photos, 1)[3:]
        sidecar = scrape(pooled.metrics_url)
        assert total(sidecar, "shardfeed_pool_samples_total", decoder="remote") > 0
        assert total(sidecar, "shardfeed_pool_units_total", outcome="local") == 0
        assert total(sidecar, "shardfeed_pool_workers") == 3
        exported = set(sidecar)
        for worker in workers:
            scraped = scrape(worker.metrics)
            assert total(scraped, "shardfeed_pool_worker_samples_total") > 0
            exported |= set(scraped)
        # Every documented pool metric, from the sidecar or its workers.
        present = {
            key.partition("{")[0]
            .removesuffix("_sum")
            .removesuffix("_count")
            .removesuffix("_bucket")
            for key in exported
        }
        documented = [n for n in documented_metrics() if n.startswith("shardfeed_pool_")]
        assert len(documented) >= 10
        missing = [n for n in documented if n not in present]
        assert not missing, f"documented but not exported: {missing}"
    finally:
        stop(pooled.process)


def test_killed_stopped_and_vanished_workers_cost_time_not_samples(
    s3: S3, server: Server, photos: str, token_file: Path, workers: list[PoolWorker]
) -> None:
    want = epoch(server.target, photos, 1)
    pooled = pooled_server(s3, token_file, workers)
    try:
        got: Delivered = []
        with Client(pooled.target) as client:
            for batch in client.batches(photos, rank=0, world_size=1, **STREAM):
                digest = hashlib.sha256(batch.images.tobytes() + batch.labels.tobytes())
                got.append((0, batch.index, tuple(batch.keys), digest.hexdigest()))
                if len(got) == 2:
                    # Mid-epoch: one worker dies, another stops answering.
                    workers[0].process.send_signal(signal.SIGKILL)
                    workers[1].process.send_signal(signal.SIGSTOP)
        no_repeats(got)
        assert got == want
        # The sidecar decodes 4 batches ahead with a pool, so most of that
        # stream may have been decoded before the signals: a stream opened
        # now finds one worker dead and one stopped, and its units to them
        # are re-issued or hedged.
        degraded = epoch(pooled.target, photos, 1)
        no_repeats(degraded)
        assert degraded == want
        sidecar = scrape(pooled.metrics_url)
        assert (
            total(sidecar, "shardfeed_pool_units_total", outcome="hedged")
            + total(sidecar, "shardfeed_pool_units_total", outcome="reissued")
            > 0
        )
        # Every worker gone: the sidecar finishes epochs on its own.
        workers[2].process.send_signal(signal.SIGKILL)
        alone = epoch(pooled.target, photos, 2)
        no_repeats(alone)
        assert alone == epoch(server.target, photos, 2)
    finally:
        stop(pooled.process)


def test_a_worker_with_the_wrong_token_is_refused_clearly(
    s3: S3, server: Server, photos: str, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-pool-token")
    right = tmp_path / "token"
    right.write_text(TOKEN)
    worker = start_pool_worker("127.0.0.2", wrong)
    pooled = pooled_server(s3, right, [worker])
    try:
        assert epoch(pooled.target, photos, 1) == epoch(server.target, photos, 1)
        assert (
            total(scrape(pooled.metrics_url), "shardfeed_pool_units_total", outcome="refused") > 0
        )
        refused = scrape(worker.metrics)
        assert total(refused, "shardfeed_pool_worker_units_total", outcome="unauthenticated") > 0
        assert total(refused, "shardfeed_pool_worker_samples_total") == 0
    finally:
        stop(pooled.process)
        stop(worker.process)
