"""The transport alone: GB/s of batches delivered into numpy, beside memcpy.

    SHARDFEED_BIN=target/release/shardfeed python -m shardfeed_benchmarks.transport

``shardfeed serve --dev-synthetic-batches`` sends, for each batch of a
stream's plan, a fixed pseudo-random pattern written straight into the
batch's buffer or shared-memory slot on the decode pool: a synthetic
in-memory batch source that reads, parses and decodes nothing, so producing a
batch costs one write of its bytes (what any decoder pays at least). The
plan comes from a small dataset of tiny JPEGs in ``shardfeed dev-s3``.
Batches of ``--batch-size`` images of ``--image-size``² RGB then reach this
process through:

- ``inline tcp``: the bytes inside the gRPC messages over loopback TCP;
- ``inline unix``: the same over the Unix socket;
- ``shared memory``: a slot of the stream's memfd ring, mapped here once;

and this machine's memcpy bandwidth (``numpy.copyto`` of one batch into
another, single thread, over as many buffers as a ring has slots so that it
runs from memory, not cache) is measured in the same run. Each setting reads
``--epochs`` epochs per repeat, ``--repeats`` times interleaved; the median is
reported with CPU-seconds per GB (server + this process).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from .delivered import _free_port, _process_cpu, _s3_client, _shardfeed_env, start_dev_s3

BUCKET = "transport"
# A stream's ring at the default queue depths: decode_ahead 2 + ready 2 +
# the client's 3 slots.
RING_SLOTS = 7


def memcpy_gbps(nbytes: int, pairs: int, rounds: int = 24) -> float:
    """Single-thread memcpy bandwidth (bytes copied per second) of one batch,
    rotating over ``pairs`` source/target pairs: with a working set as large
    as the ring's, the copies run from and to memory, as the transport's
    writes do, not within the CPU's last-level cache."""
    rng = np.random.default_rng(0)
    sources = [rng.integers(0, 256, nbytes, dtype=np.uint8) for _ in range(pairs)]
    targets = [np.empty_like(source) for source in sources]
    for source, target in zip(sources, targets):
        np.copyto(target, source)  # fault the pages in before timing
    timings = []
    for round_ in range(rounds):
        pair = round_ % pairs
        started = time.perf_counter()
        np.copyto(targets[pair], sources[pair])
        timings.append(time.perf_counter() - started)
    return nbytes / statistics.median(timings) / 1e9


def tiny_jpeg_shards(shards: int, per_shard: int) -> list[bytes]:
    """Tar shards of 8x8 JPEGs: fetching and parsing them costs next to nothing."""
    import tarfile

    from PIL import Image

    encoded = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 60, 30)).save(encoded, "JPEG")
    jpeg = encoded.getvalue()
    out = []
    for shard in range(shards):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for sample in range(per_shard):
                index = shard * per_shard + sample
                # Sizes differ (trailing bytes after EOI) so the images differ.
                for name, data in (
                    (f"{index:08d}.jpg", jpeg + b"\0" * (index % 61)),
                    (f"{index:08d}.cls", str(index % 1000).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        out.append(buffer.getvalue())
    return out


def start_server(binary: str, endpoint: str, listen: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            binary,
            "serve",
            "--dev-synthetic-batches",
            "--listen",
            listen,
            "--metrics-listen",
            f"127.0.0.1:{_free_port()}",
        ],
        env=dict(_shardfeed_env(endpoint), SHARDFEED_LOG="error"),
    )


def read_epochs(
    target: str,
    dataset: str,
    batch_size: int,
    size: int,
    epochs: int,
    transport: str,
    server_pid: int,
) -> dict[str, float]:
    from shardfeed import Client

    client = Client(target)
    cpu_before = _process_cpu(server_pid) + _self_cpu()
    started = time.perf_counter()
    delivered = 0
    checksum = 0
    for epoch in range(epochs):
        for batch in client.batches(
            dataset,
            batch_size=batch_size,
            image_size=size,
            rank=0,
            world_size=1,
            epoch=epoch,
            transport=transport,
        ):
            # As a trainer would, look at the batch; copying it is not delivery.
            checksum += int(batch.images[-1, -1, -1, -1])
            delivered += batch.images.nbytes
            if batch.shared != (transport == "shared_memory"):
                raise RuntimeError(f"{transport} requested, but batch.shared is {batch.shared}")
    wall = time.perf_counter() - started
    cpu = _process_cpu(server_pid) + _self_cpu() - cpu_before
    client.close()
    return {"gbps": delivered / wall / 1e9, "cpu_seconds_per_gb": cpu / (delivered / 1e9)}


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--samples-per-shard", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    batch_bytes = args.batch_size * args.image_size * args.image_size * 3
    s3, endpoint = start_dev_s3(args.binary, 0, 0)
    client = _s3_client(endpoint)
    client.create_bucket(Bucket=BUCKET)
    for i, shard in enumerate(tiny_jpeg_shards(args.shards, args.samples_per_shard)):
        client.put_object(Bucket=BUCKET, Key=f"tiny/shard-{i:05d}.tar", Body=shard)
    dataset = f"s3://{BUCKET}/tiny/"
    socket_dir = tempfile.TemporaryDirectory(prefix="sf-")
    socket_path = f"{socket_dir.name}/sf.sock"
    tcp_listen = f"127.0.0.1:{_free_port()}"
    unix_server = start_server(args.binary, endpoint, f"unix:{socket_path}")
    tcp_server = start_server(args.binary, endpoint, tcp_listen)
    settings = {
        "inline tcp": (tcp_listen, "inline", tcp_server.pid),
        "inline unix": (f"unix://{socket_path}", "inline", unix_server.pid),
        "shared memory": (f"unix://{socket_path}", "shared_memory", unix_server.pid),
    }
    results: dict[str, list[dict[str, float]]] = {}
    memcpy: list[float] = []
    cached: list[float] = []
    try:
        import grpc

        for target, _, _ in settings.values():
            options = [("grpc.default_authority", "localhost")] if target.startswith("unix") else []
            channel = grpc.insecure_channel(target, options=options)
            grpc.channel_ready_future(channel).result(timeout=30)
            channel.close()
        for repeat in range(args.repeats):
            memcpy.append(memcpy_gbps(batch_bytes, pairs=RING_SLOTS))
            cached.append(memcpy_gbps(batch_bytes, pairs=1))
            print(
                f"repeat {repeat + 1} memcpy: {memcpy[-1]:.2f} GB/s "
                f"(one pair, partly in cache: {cached[-1]:.2f} GB/s)",
                file=sys.stderr,
            )
            for name, (target, transport, pid) in settings.items():
                result = read_epochs(
                    target,
                    dataset,
                    args.batch_size,
                    args.image_size,
                    args.epochs,
                    transport,
                    pid,
                )
                results.setdefault(name, []).append(result)
                print(
                    f"repeat {repeat + 1} {name}: {result['gbps']:.2f} GB/s, "
                    f"{result['cpu_seconds_per_gb']:.2f} CPU-s/GB",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for process in (unix_server, tcp_server, s3):
            process.terminate()
            process.wait()
        socket_dir.cleanup()

    memcpy_median = statistics.median(memcpy)
    summary: dict[str, Any] = {
        "memcpy_gbps": memcpy_median,
        "memcpy_one_pair_gbps": statistics.median(cached),
    }
    print(
        f"\n{args.batch_size} x {args.image_size}x{args.image_size}x3 batches "
        f"({batch_bytes / 1e6:.1f} MB), {os.cpu_count()} cores, median of {args.repeats}:"
    )
    print(
        f"  {'memcpy (numpy.copyto)':<22} {memcpy_median:>6.2f} GB/s  over {RING_SLOTS} batch "
        f"pairs (one pair, partly cached: {summary['memcpy_one_pair_gbps']:.2f} GB/s)"
    )
    for name, runs in results.items():
        gbps = statistics.median(r["gbps"] for r in runs)
        cpu = statistics.median(r["cpu_seconds_per_gb"] for r in runs)
        summary[name] = {"gbps": gbps, "cpu_seconds_per_gb": cpu}
        print(
            f"  {name:<22} {gbps:>6.2f} GB/s  {cpu:>5.2f} CPU-s/GB  "
            f"{gbps / memcpy_median:>5.0%} of memcpy"
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
