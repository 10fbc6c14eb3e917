"""Delivered-into-Python benchmark: shardfeed vs a DataLoader-style baseline.

    python -m shardfeed_benchmarks --synthetic            # self-contained
    python -m shardfeed_benchmarks --target HOST:PORT --dataset s3://b/p/ \\
        --s3-endpoint http://...                     # an existing setup

Both read the same tar shards from the same S3 endpoint and deliver uint8
batches of the same size into this process. The baseline is what a PyTorch
user has today: one worker process per core, each streaming whole shards with
boto3, decoding with Pillow (shorter side to the target, center crop) and
handing batches to the main process through a queue, like a DataLoader with
``num_workers=cores``. Prints samples/s for each, the ratio, and CPU-seconds
per sample (shardfeed's server plus this process; the baseline's workers plus
this process). In the same run, ``shardfeed bench`` on the same data gives the
single-thread decode+resize kernel rate, so the figures read as a fraction of
kernel x cores and a share of CPU spent beyond the kernel. ``--synthetic``
serves the demo's ~110 KB photos from ``shardfeed dev-s3``. Needs the
shardfeed-benchmarks package's dependencies (boto3, Pillow).
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ACCESS_KEY = "shardfeed-demo"
SECRET_KEY = "shardfeed-demo-secret"


def _s3_client(endpoint: str | None) -> Any:
    import boto3

    if endpoint:
        return boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            region_name=os.environ.get("AWS_REGION", "us-east-1"),
        )
    return boto3.client("s3")


def _decode(data: bytes, size: int, draft: bool) -> np.ndarray:
    from PIL import Image

    image: Image.Image = Image.open(io.BytesIO(data))
    if draft:
        # Pillow's DCT-domain downscaling; torchvision's default path skips it.
        image.draft("RGB", (size, size))
    image = image.convert("RGB")
    width, height = image.size
    scale = size / min(width, height)
    image = image.resize(
        (max(size, round(width * scale)), max(size, round(height * scale))),
        Image.Resampling.BILINEAR,
    )
    width, height = image.size
    left, top = (width - size) // 2, (height - size) // 2
    return np.asarray(image.crop((left, top, left + size, top + size)), dtype=np.uint8)


def _baseline_worker(
    endpoint: str | None,
    bucket: str,
    keys: list[str],
    batch_size: int,
    size: int,
    draft: bool,
    queue: Any,
) -> None:
    client = _s3_client(endpoint)
    images: list[np.ndarray] = []
    labels: list[int] = []
    for key in keys:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        with tarfile.open(fileobj=body, mode="r|") as tar:
            for member in tar:
                name = member.name.lower()
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                data = handle.read()
                if name.endswith((".jpg", ".jpeg", ".png", ".webp")):
                    images.append(_decode(data, size, draft))
                elif name.endswith(".cls"):
                    labels.append(int(data))
                if len(images) == batch_size:
                    queue.put((np.stack(images), np.asarray(labels[:batch_size], dtype=np.int64)))
                    images, labels = [], []
    queue.put(None)


def run_baseline(
    endpoint: str | None,
    dataset: str,
    workers: int,
    batch_size: int,
    size: int,
    max_batches: int,
    draft: bool = False,
) -> dict[str, float]:
    bucket, _, prefix = dataset.removeprefix("s3://").partition("/")
    client = _s3_client(endpoint)
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    keys = sorted(
        o["Key"]
        for o in listed.get("Contents", [])
        if o["Key"].endswith(".tar") and "_shardfeed/" not in o["Key"]
    )
    # Not fork: this process already holds gRPC channels, and forking grpcio's
    # threads is unsafe (DataLoader users pick spawn for the same reason).
    context = mp.get_context("spawn")
    queue = context.Queue(maxsize=2 * workers)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    self_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    processes = [
        context.Process(
            target=_baseline_worker,
            args=(endpoint, bucket, keys[w::workers], batch_size, size, draft, queue),
        )
        for w in range(workers)
    ]
    for process in processes:
        process.start()
    samples = batches = finished = 0
    first = None
    while finished < workers:
        item = queue.get()
        if item is None:
            finished += 1
            continue
        first = first or time.perf_counter() - started
        samples += len(item[0])
        batches += 1
        if max_batches and batches >= max_batches:
            break
    wall = time.perf_counter() - started
    for process in processes:
        process.terminate() if process.is_alive() and max_batches else None
        process.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    self_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) + (
        self_after.ru_utime + self_after.ru_stime - self_before.ru_utime - self_before.ru_stime
    )
    return {
        "samples": samples,
        "seconds": wall,
        "samples_per_second": samples / wall,
        "cpu_seconds_per_sample": cpu / max(samples, 1),
        "first_batch_seconds": first or 0.0,
    }


def _stat_cpu(path: Path) -> float:
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_pass(ds: Any, server_pid: int, step_seconds: float = 0.0) -> dict[str, float]:
    """One pass over a ``ShardfeedDataset`` of ``(images, labels)``,
    touching every batch as a trainer would: samples, wall seconds, and the
    CPU-seconds this process and the server (``server_pid``) spent.
    ``step_seconds``: a training step's time per batch, slept (a GPU-bound
    trainer leaves the host's cores idle while it waits)."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    server_before = _process_cpu(server_pid)
    started = time.perf_counter()
    samples = checksum = 0
    for images, labels in ds:
        checksum += int(images[0, 0, 0, 0])
        samples += len(labels)
        if step_seconds:
            time.sleep(step_seconds)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "samples": samples,
        "seconds": seconds,
        "samples_per_second": samples / seconds,
        "python_cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "server_cpu": _process_cpu(server_pid) - server_before,
    }


def _process_cpu(pid: int | None) -> float:
    return _stat_cpu(Path(f"/proc/{pid}/stat")) if pid else 0.0


def _server_thread_cpu(pid: int | None) -> dict[str, float]:
    """The server's CPU by thread role: decode pool vs async I/O (S3 reads,
    tar parsing, gRPC encode and send). Threads that exited are not counted."""
    totals = {"decode": 0.0, "io": 0.0, "other": 0.0}
    if not pid:
        return totals
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            cpu = _stat_cpu(task / "stat")
        except (FileNotFoundError, ProcessLookupError):
            continue
        role = (
            "decode"
            if name.startswith("shardfeed-decod")
            else "io"
            if name.startswith("shardfeed-io")
            else "other"
        )
        totals[role] += cpu
    return totals


def run_shardfeed(
    target: str,
    dataset: str,
    batch_size: int,
    size: int,
    max_batches: int,
    server_pid: int | None,
    s3_pid: int | None = None,
) -> dict[str, Any]:
    from shardfeed import Client

    client = Client(target)
    server_before = _process_cpu(server_pid)
    threads_before = _server_thread_cpu(server_pid)
    s3_before = _process_cpu(s3_pid)
    self_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    samples = batches = 0
    first = None
    checksum = 0
    for batch in client.batches(
        dataset, batch_size=batch_size, image_size=size, rank=0, world_size=1
    ):
        first = first or time.perf_counter() - started
        checksum += int(batch.images[0, 0, 0, 0])  # touch the array, as a trainer would
        samples += len(batch.labels)
        batches += 1
        if max_batches and batches >= max_batches:
            break
    wall = time.perf_counter() - started
    self_after = resource.getrusage(resource.RUSAGE_SELF)
    python_cpu = (
        self_after.ru_utime + self_after.ru_stime - self_before.ru_utime - self_before.ru_stime
    )
    server_cpu = _process_cpu(server_pid) - server_before
    threads_after = _server_thread_cpu(server_pid)
    return {
        "samples": samples,
        "seconds": wall,
        "samples_per_second": samples / wall,
        "cpu_seconds_per_sample": (python_cpu + server_cpu) / max(samples, 1),
        "first_batch_seconds": first or 0.0,
        # Where the CPU went; the S3 stand-in runs on this machine only here.
        "cpu_seconds": {
            "server_decode_threads": threads_after["decode"] - threads_before["decode"],
            "server_io_threads": threads_after["io"] - threads_before["io"],
            "server": server_cpu,
            "python": python_cpu,
            "s3_stand_in": _process_cpu(s3_pid) - s3_before,
        },
    }


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _shardfeed_env(endpoint: str) -> dict[str, str]:
    return dict(
        os.environ,
        AWS_ACCESS_KEY_ID=os.environ.get("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        AWS_SECRET_ACCESS_KEY=os.environ.get("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        AWS_REGION=os.environ.get("AWS_REGION", "us-east-1"),
        SHARDFEED_S3_ENDPOINT=endpoint,
        SHARDFEED_S3_FORCE_PATH_STYLE="true",
    )


def start_dev_s3(
    binary: str, shards: int, per_shard: int, *extra: str
) -> tuple[subprocess.Popen[bytes], str]:
    """Starts ``shardfeed dev-s3`` publishing the demo's photo dataset (the
    same JPEGs as ``shardfeed bench --synthetic``: ~110 KB, ImageNet-like);
    returns the process and its endpoint."""
    s3 = subprocess.Popen(
        [
            binary,
            "dev-s3",
            "--synthetic-shards",
            str(shards),
            "--samples-per-shard",
            str(per_shard),
            *extra,
        ],
        stdout=subprocess.PIPE,
        # Injected failures would each be logged by the S3 stand-in.
        env=dict(os.environ, SHARDFEED_LOG="warn,s3s=off"),
    )
    assert s3.stdout is not None
    return s3, s3.stdout.readline().decode().split()[-1]


def synthetic_setup(
    binary: str,
    shards: int,
    per_shard: int,
    get_delay_ms: int,
    unix_socket: str | None = None,
    dev_s3_extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Starts dev-s3 holding the demo's photo dataset (given ``dev_s3_extra``
    flags) and a server (on ``unix_socket`` when given, else a loopback TCP
    port)."""
    s3, endpoint = start_dev_s3(
        binary, shards, per_shard, "--get-delay-ms", str(get_delay_ms), *dev_s3_extra
    )
    env = _shardfeed_env(endpoint)
    listen = f"unix:{unix_socket}" if unix_socket else f"127.0.0.1:{_free_port()}"
    target = f"unix://{unix_socket}" if unix_socket else listen
    metrics = f"127.0.0.1:{_free_port()}"
    server = subprocess.Popen(
        [
            binary,
            "serve",
            "--listen",
            listen,
            "--metrics-listen",
            metrics,
        ],
        env=dict(env, SHARDFEED_LOG=os.environ.get("SHARDFEED_BENCH_SERVER_LOG", "warn")),
    )
    import grpc

    options = [("grpc.default_authority", "localhost")] if unix_socket else []
    grpc.channel_ready_future(grpc.insecure_channel(target, options=options)).result(timeout=30)
    return {
        "endpoint": endpoint,
        "dataset": "s3://demo/photos/",
        "target": target,
        "metrics_url": f"http://{metrics}/metrics",
        "processes": [server, s3],
        "server_pid": server.pid,
        "s3_pid": s3.pid,
    }


def run_entitlement(
    binary: str,
    endpoint: str,
    dataset: str,
    batch_size: int,
    size: int,
    max_batches: int,
    *extra: str,
) -> dict[str, Any]:
    """``shardfeed bench``: the same pipeline without gRPC or Python, and the
    single-thread decode+resize kernel rate, on the same data."""
    out = subprocess.run(
        [
            binary,
            "bench",
            dataset,
            "--batch-size",
            str(batch_size),
            "--image-size",
            str(size),
            "--max-batches",
            str(max_batches),
            *extra,
        ],
        env=_shardfeed_env(endpoint),
        check=True,
        capture_output=True,
        text=True,
    )
    summary: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--synthetic", action="store_true", help="set up dev-s3 + shardfeed + data")
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--samples-per-shard", type=int, default=256)
    parser.add_argument("--get-delay-ms", type=int, default=0)
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--dataset")
    parser.add_argument("--s3-endpoint")
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-batches", type=int, default=0)
    parser.add_argument(
        "--pillow-draft", action="store_true", help="let the baseline use Pillow's DCT scaling"
    )
    parser.add_argument(
        "--no-entitlement",
        action="store_true",
        help="skip `shardfeed bench` (kernel rate, pipeline without gRPC) on the same data",
    )
    args = parser.parse_args(argv)

    setup: dict[str, Any] = {}
    if args.synthetic:
        print("setting up a synthetic dataset ...", file=sys.stderr)
        setup = synthetic_setup(args.binary, args.shards, args.samples_per_shard, args.get_delay_ms)
        args.dataset, args.target = setup["dataset"], setup["target"]
        args.s3_endpoint, args.server_pid = setup["endpoint"], setup["server_pid"]
    if not args.dataset:
        parser.error("--dataset is required without --synthetic")
    entitlement: dict[str, Any] | None = None
    try:
        from shardfeed import Client

        info = Client(args.target).describe(args.dataset, world_size=1, batch_size=args.batch_size)
        ours = run_shardfeed(
            args.target,
            args.dataset,
            args.batch_size,
            args.image_size,
            args.max_batches,
            args.server_pid,
            setup.get("s3_pid"),
        )
        baseline = run_baseline(
            args.s3_endpoint,
            args.dataset,
            args.workers,
            args.batch_size,
            args.image_size,
            args.max_batches,
            args.pillow_draft,
        )
        if not args.no_entitlement and args.s3_endpoint:
            entitlement = run_entitlement(
                args.binary,
                args.s3_endpoint,
                args.dataset,
                args.batch_size,
                args.image_size,
                args.max_batches,
            )
    finally:
        for process in setup.get("processes", []):
            process.terminate()
            process.wait()
    result: dict[str, Any] = {
        "benchmark": "delivered_into_python",
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "baseline_workers": args.workers,
        "baseline_pillow_draft": args.pillow_draft,
        "mean_sample_kb": info.total_bytes / max(info.samples, 1) / 1e3,
        "shardfeed": ours,
        "pillow_dataloader": baseline,
        "speedup": ours["samples_per_second"] / baseline["samples_per_second"],
    }
    print(
        f"{info.samples} samples of {result['mean_sample_kb']:.0f} KB; "
        f"shardfeed: {ours['samples_per_second']:.0f} samples/s, "
        f"{ours['cpu_seconds_per_sample'] * 1e3:.2f} CPU-ms/sample, "
        f"first batch {ours['first_batch_seconds'] * 1e3:.0f} ms; "
        f"Pillow DataLoader-style ({args.workers} workers): "
        f"{baseline['samples_per_second']:.0f} samples/s, "
        f"{baseline['cpu_seconds_per_sample'] * 1e3:.2f} CPU-ms/sample; "
        f"ratio {result['speedup']:.2f}x"
    )
    if entitlement is not None:
        kernel = float(entitlement["kernel_samples_per_second_per_thread"])
        cores = int(entitlement["decode_threads"])
        # Kernel-equivalent CPU: what decode+resize alone costs for these samples.
        kernel_cpu = 1.0 / kernel
        result["entitlement"] = entitlement
        result["kernel_samples_per_second_per_thread"] = kernel
        result["fraction_of_kernel_times_cores"] = ours["samples_per_second"] / (kernel * cores)
        result["cpu_share_beyond_kernel"] = max(
            0.0, 1.0 - kernel_cpu / ours["cpu_seconds_per_sample"]
        )
        print(
            f"decode+resize kernel {kernel:.0f} samples/s per thread x {cores}: "
            f"delivered into Python = {100 * result['fraction_of_kernel_times_cores']:.0f}% "
            f"of it, {100 * result['cpu_share_beyond_kernel']:.0f}% of CPU beyond the kernel "
            f"(server + this process); without gRPC (`shardfeed bench`): "
            f"{entitlement['samples_per_second']:.0f} samples/s = "
            f"{100 * entitlement['fraction_of_kernel_times_threads']:.0f}%"
        )
    spent = ours["cpu_seconds"]
    print(
        "shardfeed CPU-seconds: server decode threads {:.2f}, server I/O threads {:.2f} "
        "(S3 reads, parsing, gRPC encode+send), this Python process {:.2f} (gRPC receive), "
        "and the local S3 stand-in {:.2f} (remote on a real deployment)".format(
            spent["server_decode_threads"],
            spent["server_io_threads"],
            spent["python"],
            spent["s3_stand_in"],
        )
    )
    print(json.dumps(result))
    return 0
