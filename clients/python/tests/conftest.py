"""Fixtures that run the real shardfeed binary (and its in-memory S3 server)."""

from __future__ import annotations

import io
import os
import random
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
ACCESS_KEY = "shardfeed-demo"
SECRET_KEY = "shardfeed-demo-secret"
# DataLoader workers start this way: the test process has gRPC running, and a
# forked worker refuses to open a channel (see _channel._refuse_after_unsafe_fork).
SAFE_START = "forkserver"


def binary() -> Path:
    """The shardfeed binary: $SHARDFEED_BIN, else the newer of the builds."""
    configured = os.environ.get("SHARDFEED_BIN")
    if configured:
        return Path(configured)
    builds = [REPO / "target" / p / "shardfeed" for p in ("release", "debug")]
    existing = [b for b in builds if b.exists()]
    if not existing:
        pytest.fail("no shardfeed binary: run `cargo build` or set SHARDFEED_BIN")
    return max(existing, key=lambda b: b.stat().st_mtime)


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: a port the
    kernel handed out (bind to 0) can be taken again by any process's next
    outgoing connection before the server under test binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(100):
        port = random.randrange(10_000, max(low, 10_001))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(
    target: Callable[..., None], ranks: int, args: Callable[[int], tuple[Any, ...]], out: Path
) -> list[Any]:
    """Runs ``target(rank, *args(rank))`` in ``ranks`` spawned processes (a
    distributed job on CPU), each writing ``out/<rank>.json``; returns what
    each wrote, in rank order. A rank that fails or hangs fails the test."""
    import json
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target, args=(rank, *args(rank))) for rank in range(ranks)]
    for process in processes:
        process.start()
    for rank, process in enumerate(processes):
        process.join(timeout=180)
        if process.is_alive():
            process.kill()
        assert process.exitcode == 0, f"rank {rank} exited with {process.exitcode}"
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(ranks)]


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class S3:
    endpoint: str

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    server, process = start_s3()
    yield server
    stop(process)


def noise_jpeg(seed: int, height: int = 60, width: int = 80) -> bytes:
    """A JPEG of random pixels: every sample's bytes and pixels differ."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = (rng.random((height, width, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_tar(samples: list[tuple[str, dict[str, bytes]]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def hf_parquet(
    images: list[bytes | None],
    labels: list[int],
    row_group_size: int = 100,
    compression: str = "snappy",
    classes: int = 0,
) -> bytes:
    """A Parquet file as the Hugging Face datasets library writes an image
    dataset: an Image struct of bytes and path, an int64 label, the class
    names in the schema's ``huggingface`` metadata (``classes`` of them, at
    least one past the largest label)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images_column = pa.array(
        [{"bytes": image, "path": f"img/{label:05d}.jpg"} for image, label in zip(images, labels)],
        type=image_type,
    )
    names = [f"class-{i}" for i in range(max(classes, max(labels) + 1))]
    features = {
        "image": {"_type": "Image"},
        "label": {"names": names, "_type": "ClassLabel"},
    }
    schema = pa.schema([("image", image_type), ("label", pa.int64())]).with_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})}
    )
    table = pa.Table.from_arrays([images_column, pa.array(labels, pa.int64())], schema=schema)
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=row_group_size, compression=compression)
    return out.getvalue()


def upload(s3: S3, bucket: str, prefix: str, shards: list[bytes]) -> str:
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    for i, data in enumerate(shards):
        client.put_object(Bucket=bucket, Key=f"{prefix}shard-{i:05d}.tar", Body=data)
    return f"s3://{bucket}/{prefix}"


@dataclass
class Server:
    target: str
    metrics_url: str
    process: subprocess.Popen[bytes]


def start_server(s3: S3, listen: str, *extra: str) -> Server:
    metrics_port = free_port()
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_REGION="us-east-1",
        SHARDFEED_S3_ENDPOINT=s3.endpoint,
        SHARDFEED_S3_FORCE_PATH_STYLE="true",
    )
    process = subprocess.Popen(
        [
            str(binary()),
            "serve",
            "--listen",
            listen,
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            *extra,
        ],
        env=env,
    )
    target = listen if listen.startswith("unix:") else listen
    if target.startswith("unix:") and not target.startswith("unix://"):
        target = "unix://" + target[len("unix:") :]
    wait_ready(target, process)
    return Server(target, f"http://127.0.0.1:{metrics_port}/metrics", process)


@dataclass
class PoolWorker:
    address: str
    metrics: str
    process: subprocess.Popen[bytes]


@dataclass
class PoolTls:
    """A throwaway pool CA and one certificate it signed (server and client
    use, naming `name`), as the chart issues them."""

    directory: Path
    name: str

    @property
    def worker_flags(self) -> tuple[str, ...]:
        d = self.directory
        return (
            *("--tls-ca", f"{d}/ca.crt", "--tls-cert", f"{d}/tls.crt"),
            *("--tls-key", f"{d}/tls.key"),
        )

    @property
    def sidecar_flags(self) -> tuple[str, ...]:
        d = self.directory
        return (
            *("--pool-tls-ca", f"{d}/ca.crt", "--pool-tls-cert", f"{d}/tls.crt"),
            *("--pool-tls-key", f"{d}/tls.key", "--pool-tls-server-name", self.name),
        )


def make_pool_tls(directory: Path, name: str = "shardfeed-pool") -> PoolTls:
    """Issues the files with the openssl command line (tests/run_all.sh
    installs it where missing), as the TLS benchmark does."""
    from shardfeed_benchmarks.pool_tls import issue_certificates

    directory.mkdir(parents=True, exist_ok=True)
    issue_certificates(directory, name)
    return PoolTls(directory, name)


def start_pool_worker(host: str, token_file: Path, *extra: str) -> PoolWorker:
    """`shardfeed pool-worker` on `host` (a loopback address), one decode
    thread; returns once it accepts connections."""
    port, metrics_port = free_port(), free_port()
    process = subprocess.Popen(
        [
            str(binary()),
            "pool-worker",
            "--listen",
            f"{host}:{port}",
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            "--token-file",
            str(token_file),
            "--decode-threads",
            "1",
            *extra,
        ]
    )
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"pool-worker exited with {process.returncode}")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    return PoolWorker(f"{host}:{port}", f"http://127.0.0.1:{metrics_port}/metrics", process)


def wait_ready(target: str, process: subprocess.Popen[bytes]) -> None:
    """Until the server reports SERVING (it listens before its cache is open)."""
    from shardfeed import Client, ShardfeedError

    deadline = time.monotonic() + 30
    with Client(target) as client:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"shardfeed exited with {process.returncode}")
            try:
                client.wait_until_serving(timeout=0.5)
                return
            except ShardfeedError:
                if time.monotonic() > deadline:
                    raise


@pytest.fixture(scope="session")
def server(s3: S3) -> Iterator[Server]:
    srv = start_server(s3, f"127.0.0.1:{free_port()}")
    yield srv
    stop(srv.process)


@pytest.fixture(scope="session")
def unix_server(s3: S3) -> Iterator[Server]:
    """A server on a Unix socket: shared-memory delivery needs one."""
    # A short path: Unix socket paths are limited to 108 bytes.
    directory = tempfile.mkdtemp(prefix="sf-")
    srv = start_server(s3, f"unix:{directory}/sf.sock")
    yield srv
    stop(srv.process)


def start_s3(*extra: str) -> tuple[S3, subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [str(binary()), "dev-s3", "--listen", "127.0.0.1:0", *extra], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    assert line.startswith("listening on "), line
    return S3(line.split()[-1]), process


def scrape(url: str) -> dict[str, float]:
    """Prometheus text as {'name{labels}': value}."""
    import urllib.request

    samples = {}
    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples
