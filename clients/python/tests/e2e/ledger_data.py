"""The delivery ledger's data: the datasets its rows stream (tar shards,
with corrupt scans, loose objects, Parquet files, behind a listing without
ETags, from a slow S3) and a sidecar that comes back after a SIGKILL.
test_ledger.py's fixtures make them once per module."""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from shardfeed_benchmarks.gpu_host import scan_corrupted

from ..conftest import (
    S3,
    PoolWorker,
    Server,
    hf_parquet,
    make_pool_tls,
    noise_jpeg,
    start_pool_worker,
    start_server,
    stop,
    upload,
    write_tar,
)
from .ledger import SOURCE_LABELS

# Source 0: 4 shards of 12 (6 batches per rank and epoch at world 2); source
# 1: 3 shards of 8.
SHAPES = ((4, 12), (3, 8))


@dataclass(frozen=True)
class Data:
    uris: tuple[str, str]
    labels: tuple[tuple[int, ...], tuple[int, ...]]


# Source 0's samples whose scans are corrupt in the "*corrupt" features.
CORRUPT = frozenset({5, 17, 30})


def publish_corrupt(s3: S3) -> Data:
    """Source 0 with the samples in CORRUPT's scans overwritten by random
    bytes, headers intact: a decoder that does not check would train on
    garbage from them."""
    return publish(s3, bucket="ledgercorrupt", corrupt=CORRUPT)


def publish_loose(s3: S3) -> Data:
    """Source 0's samples as loose objects, one per class folder (so that
    each label, the folder's index, is the sample's own)."""
    client = s3.client()
    client.create_bucket(Bucket="ledgerloose")
    shards, per_shard = SHAPES[0]
    labels = tuple(range(shards * per_shard))
    for label in labels:
        client.put_object(
            Bucket="ledgerloose",
            Key=f"c{label:05d}/k{label:05d}.jpg",
            Body=noise_jpeg(label, 30, 36),
        )
    return Data(("s3://ledgerloose/", "s3://ledgerloose/"), (labels, labels))


def publish_parquet(s3: S3) -> Data:
    """Source 0 as Parquet files laid out as the Hugging Face Hub stores
    images (an Image struct of bytes and path, an int64 label, the class
    names in the schema's metadata), row groups of 5 rows, so that a row
    group straddles batches and ranks; source 1 stays tar (for the mix)."""
    tars = publish(s3, bucket="ledgerpq")
    client = s3.client()
    client.create_bucket(Bucket="ledgerparquet")
    shards, per_shard = SHAPES[0]
    labels = list(range(shards * per_shard))
    for file in range(2):
        rows = labels[file::2]
        client.put_object(
            Bucket="ledgerparquet",
            Key=f"data/train-{file:05d}-of-00002.parquet",
            Body=hf_parquet(
                [noise_jpeg(label, 30, 36) for label in rows],
                rows,
                row_group_size=5,
                classes=len(labels),
            ),
        )
    return Data(("s3://ledgerparquet/data/", tars.uris[1]), (tuple(labels), tars.labels[1]))


def publish(
    s3: S3,
    side: tuple[int, int] = (30, 36),
    bucket: str = "ledger",
    corrupt: frozenset[int] = frozenset(),
) -> Data:
    uris, labels = [], []
    for source, (shards, per_shard) in enumerate(SHAPES):
        tars = []
        for s in range(shards):
            members = []
            for i in range(per_shard):
                label = source * SOURCE_LABELS + s * per_shard + i
                image = noise_jpeg(label, *side)
                if label in corrupt:
                    image = scan_corrupted(image, seed=label)
                members.append((f"k{label:05d}", {"jpg": image, "cls": b"%d" % label}))
            tars.append(write_tar(members))
        uris.append(upload(s3, f"{bucket}{source}", "", tars))
        labels.append(tuple(source * SOURCE_LABELS + i for i in range(shards * per_shard)))
    return Data((uris[0], uris[1]), (labels[0], labels[1]))


class Sidecar:
    """A sidecar on a Unix socket that comes back after a SIGKILL, as a
    pod's container restart would."""

    def __init__(self, s3: S3, pool: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.directory = tempfile.mkdtemp(prefix="sf-")
        self.listen = f"unix:{self.directory}/sf.sock"
        self.s3 = s3
        # A decoded-source tier that outlives a restart, as a pod's volume does.
        self.extra: tuple[str, ...] = ("--decoded-cache-dir", f"{self.directory}/tier", *extra)
        # A decode pool of three worker processes, sent every decode, over
        # TLS as the chart deploys it.
        self.workers: list[PoolWorker] = []
        if pool:
            token = Path(self.directory, "pool-token")
            token.write_text("ledger-pool-token")
            tls = make_pool_tls(Path(self.directory, "pool-tls"))
            hosts = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
            self.workers = [start_pool_worker(h, token, *tls.worker_flags) for h in hosts]
            addresses = ",".join(w.address for w in self.workers)
            self.extra += ("--pool", addresses, "--pool-token-file", str(token))
            self.extra += tls.sidecar_flags
            self.extra += ("--pool-share", "1", "--pool-unit-samples", "2")
        self.servers: list[Server] = [start_server(s3, self.listen, *self.extra)]
        self.restarts = 0
        self._closing = False
        self._watcher = threading.Thread(target=self._restart_when_killed, daemon=True)
        self._watcher.start()

    @property
    def target(self) -> str:
        return self.servers[0].target

    @property
    def pid(self) -> int:
        return self.servers[-1].process.pid

    def _restart_when_killed(self) -> None:
        while not self._closing:
            self.servers[-1].process.wait()
            if self._closing:
                return
            self.restarts += 1
            self.servers.append(start_server(self.s3, self.listen, *self.extra))

    def close(self) -> None:
        self._closing = True
        for server in list(self.servers):
            stop(server.process)
        # A restart under way when the test ended is stopped once it is up.
        self._watcher.join(timeout=60)
        for server in self.servers:
            stop(server.process)
        for worker in self.workers:
            stop(worker.process)
        shutil.rmtree(self.directory, ignore_errors=True)
