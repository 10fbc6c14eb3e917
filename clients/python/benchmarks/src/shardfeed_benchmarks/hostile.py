"""What hostile or careless local clients cost the sidecar, measured.

``python -m shardfeed_benchmarks.hostile`` starts ``shardfeed dev-s3`` with
the demo's photo dataset and, for each case, a fresh ``shardfeed serve``:

- ``hpack``: one write to the Unix socket of a client connection whose
  header blocks name a 4 KB table entry 60,000 times (4.8 GB if expanded):
  the server's peak RSS against its ``--memory-limit``, and whether it
  still serves.
- ``epoch``: a mixed stream at epoch 10^15 (its plan would walk 10^16
  global steps): seconds to its refusal, and a normal stream's first batch
  right after.
- ``break``: two streams fill the memory budget; the trainer breaks out of
  one and opens the next at once: seconds until the new stream's first
  batch (it used to be refused for about 5 s).
- ``tier``: the decoded-source tier with ``decoded_source=4096``, 48 decode
  threads and ``--memory-limit 1G`` over 5000x3500 photos: peak RSS
  against the limit.

Each case prints one JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

from shardfeed import Client, ShardfeedError

from . import _h2
from .delivered import _free_port, _shardfeed_env, start_dev_s3
from .memory import _status_kib

DATASET = "s3://demo/photos/"


@contextmanager
def _server(binary: str, endpoint: str, *flags: str) -> Iterator[tuple[str, int]]:
    """A ``shardfeed serve`` on a Unix socket: (target, pid)."""
    folder = tempfile.TemporaryDirectory(prefix="sf-")
    process = subprocess.Popen(
        [
            binary,
            "serve",
            "--listen",
            f"unix:{folder.name}/sf.sock",
            "--metrics-listen",
            f"127.0.0.1:{_free_port()}",
            *flags,
        ],
        env=dict(_shardfeed_env(endpoint), SHARDFEED_LOG="warn"),
    )
    target = f"unix://{folder.name}/sf.sock"
    try:
        Client(target).wait_until_serving(60)
        yield target, process.pid
    finally:
        process.terminate()
        process.wait(timeout=60)
        folder.cleanup()


def hpack(binary: str, endpoint: str) -> dict[str, Any]:
    with _server(binary, endpoint, "--memory-limit", "1G") as (target, pid):
        before = _status_kib(pid, "VmRSS") * 1024
        attack = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2.frame(0x4, 0, 0, b"")
        # A 4 KB entry (the table's whole size), then 60,000 references.
        attack += _h2.frame(0x1, 0x4, 1, _h2.literal(b"x-big", b"v" * 4000, 0x40))
        references = bytes([0x80 | 62]) * 60_000
        stream = 3
        for start in range(0, len(references), 16_000):
            attack += _h2.frame(0x1, 0x4, stream, references[start : start + 16_000])
            stream += 2
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(target[len("unix://") :])
            started = time.monotonic()
            client.sendall(attack)
            client.settimeout(30)
            try:
                while client.recv(65536):
                    pass
            except OSError:
                pass
            closed_after = time.monotonic() - started
        time.sleep(0.5)
        peak = _status_kib(pid, "VmHWM") * 1024
        batches = sum(1 for _ in Client(target).batches(DATASET, batch_size=64, image_size=64))
    return {
        "case": "hpack",
        "attack_bytes": len(attack),
        "rss_before_bytes": before,
        "peak_rss_bytes": peak,
        "memory_limit_bytes": 1 << 30,
        "connection_closed_after_s": round(closed_after, 3),
        "batches_served_after": batches,
    }


def epoch(binary: str, endpoint: str) -> dict[str, Any]:
    with _server(binary, endpoint) as (target, _):
        client = Client(target)
        started = time.monotonic()
        try:
            next(
                iter(
                    client.batches(
                        sources=[(DATASET, 1), ("s3://demo/photos", 1)],
                        epoch=10**15,
                        batch_size=64,
                        image_size=64,
                    )
                )
            )
            outcome = "streamed"
        except ShardfeedError as error:
            outcome = f"{error.code}: {error.message}"
        refused_after = time.monotonic() - started
        started = time.monotonic()
        next(iter(client.batches(DATASET, batch_size=64, image_size=64)))
        normal_first_batch = time.monotonic() - started
    return {
        "case": "epoch",
        "epoch": 10**15,
        "outcome": outcome,
        "seconds_to_answer": round(refused_after, 3),
        "next_stream_first_batch_s": round(normal_first_batch, 3),
    }


def broken(binary: str, endpoint: str) -> dict[str, Any]:
    # A budget for two 128 x 448^2 streams (946 MiB each with their
    # buffers), not three.
    with _server(binary, endpoint, "--memory-limit", "3500M") as (target, _):
        client = Client(target)

        def stream() -> Generator[Any, None, None]:
            return client.batches(DATASET, batch_size=128, image_size=448)  # type: ignore[return-value]

        held = stream()
        next(held)
        broken_one = stream()
        next(broken_one)
        refused = ""
        try:
            third = stream()
            next(third)
        except ShardfeedError as error:
            refused = error.code
        broken_one.close()  # the trainer's `break`
        started = time.monotonic()
        next(stream())
        waited = time.monotonic() - started
    return {
        "case": "break",
        "third_stream_while_two_open": refused or "admitted",
        "next_stream_first_batch_s_after_break": round(waited, 3),
    }


def tier(binary: str, endpoint: str) -> dict[str, Any]:
    import boto3
    import numpy as np
    from PIL import Image

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "shardfeed-demo"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "shardfeed-demo-secret"),
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket="large")
    y, x = np.mgrid[0:3500, 0:5000]
    for i in range(48):
        pixels = np.stack([(x + 7 * i) % 256, (y + 3 * i) % 256, (x + y) % 256], -1)
        out = io.BytesIO()
        Image.fromarray(pixels.astype(np.uint8)).save(out, format="JPEG", quality=80)
        s3.put_object(Bucket="large", Key=f"photos/{i:03d}.jpg", Body=out.getvalue())
    with tempfile.TemporaryDirectory(prefix="sf-tier-") as decoded:
        flags = ("--memory-limit", "1G", "--decode-threads", "48", "--decoded-cache-dir", decoded)
        # A small shuffle buffer: these objects are 1-2 MB each.
        options: dict[str, Any] = dict(
            batch_size=16, image_size=224, decoded_source=4096, shuffle_buffer=16, interleave=1
        )
        with _server(binary, endpoint, *flags) as (target, pid):
            for _ in Client(target).batches("s3://large/photos/", **options):
                pass
            cold = _status_kib(pid, "VmHWM") * 1024
            substituted = 0
            for batch in Client(target).batches("s3://large/photos/", epoch=1, **options):
                substituted += len(batch.substituted)
            warm = _status_kib(pid, "VmHWM") * 1024
    return {
        "case": "tier",
        "images": "48 of 5000x3500",
        "memory_limit_bytes": 1 << 30,
        "peak_rss_cold_bytes": cold,
        "peak_rss_warm_bytes": warm,
        "substituted_warm_epoch": substituted,
    }


CASES = {"hpack": hpack, "epoch": epoch, "break": broken, "tier": tier}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    args = parser.parse_args(argv)
    s3, endpoint = start_dev_s3(args.binary, 4, 256)
    try:
        for name in args.only or list(CASES):
            print(json.dumps(CASES[name](args.binary, endpoint)), flush=True)
    finally:
        s3.terminate()
        s3.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
