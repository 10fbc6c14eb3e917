"""The decoded-source tier into Python over shared memory: today's decode
path against the tier's epochs, for the training and the evaluation recipe.

    SHARDFEED_BIN=target/release/shardfeed python -m shardfeed_benchmarks.tier

The demo's ~110 KB photos (``shardfeed dev-s3``) are streamed by a server on
a Unix socket (shared memory) into ``ShardfeedDataset`` tensors, batch
``--batch-size``, ``--image-size``². Each round and recipe starts a server
with an empty tier directory, then runs, in order: an epoch of today's path
(no ``decoded_source``); the tier's first epoch (defined from the original,
the tier filled on idle cores); its second (defined from the stored source:
what the first filled is read, the rest derived and stored); and a warm one.
Here the trainer takes batches as fast as they come, so the decode has no
slack and the first epoch fills little. Then, with a fresh tier, the first
epoch with a trainer whose steps take ``--paced`` of today's batch time (a
GPU-bound job: the host's cores idle while it waits), which fills the tier
in the slack, and the second at full speed. The shard cache is on,
so no epoch waits on the S3 stand-in. Medians over ``--rounds``, with the
server's CPU-ms per sample.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Literal

from .delivered import _free_port, _shardfeed_env, start_dev_s3, timed_pass

PHASES = ("today", "first", "second", "warm")
PACED = ("first, paced", "second, after paced")


def _serve(
    binary: str, endpoint: str, socket: str, work: str, metrics_port: int
) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [
            binary,
            "serve",
            "--listen",
            f"unix:{socket}",
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            "--cache-dir",
            f"{work}/cache",
            "--decoded-cache-dir",
            f"{work}/decoded",
        ],
        env=dict(_shardfeed_env(endpoint), SHARDFEED_LOG="warn"),
    )
    import grpc

    channel = grpc.insecure_channel(
        f"unix://{socket}", options=[("grpc.default_authority", "localhost")]
    )
    grpc.channel_ready_future(channel).result(timeout=30)
    channel.close()
    return server


def _tier_events(metrics_port: int) -> dict[str, float]:
    """The server's decoded-tier events so far (offers, drops, records stored)."""
    import urllib.request

    prefix = 'shardfeed_decoded_tier_total{event="'
    events: dict[str, float] = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(prefix):
                name, _, value = line[len(prefix) :].partition('"} ')
                events[name] = float(value)
    return events


TIER_OFF: dict[str, Any] = {"decoded_source": 0}


def _epoch(
    target: str,
    server_pid: int,
    args: argparse.Namespace,
    augment: Literal["train", "eval"],
    epoch: int,
    step_seconds: float = 0.0,
    **options: Any,
) -> dict[str, float]:
    from shardfeed.torch import ShardfeedDataset

    ds = ShardfeedDataset(
        "s3://demo/photos/",
        target=target,
        batch_size=args.batch_size,
        image_size=args.image_size,
        augment=augment,
        rank=0,
        world_size=1,
        **options,
    )
    ds.set_epoch(epoch)
    run = timed_pass(ds, server_pid, step_seconds)
    return {
        "samples": run["samples"],
        "samples_per_second": run["samples_per_second"],
        "server_cpu_ms": 1e3 * run["server_cpu"] / run["samples"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=192)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--shorter-side", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--paced",
        type=float,
        default=1.5,
        help="the paced trainer's step time, as a multiple of today's batch time",
    )
    args = parser.parse_args(argv)
    binary = os.environ.get("SHARDFEED_BIN", "shardfeed")
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    s3, endpoint = start_dev_s3(binary, args.shards, args.per_shard, "--get-delay-ms", "0")
    try:
        for round_ in range(args.rounds):
            for augment in ("train", "eval"):
                tier = {"decoded_source": args.shorter_side}
                step = 0.0
                for phases in (PHASES, PACED):
                    with tempfile.TemporaryDirectory() as work:
                        socket = f"{work}/sf.sock"
                        metrics_port = _free_port()
                        server = _serve(binary, endpoint, socket, work, metrics_port)
                        try:
                            target = f"unix://{socket}"
                            # Fills the shard cache: every phase reads local disk.
                            # Today's path opts out of the tier, which is on by
                            # default where the server keeps one.
                            _epoch(target, server.pid, args, augment, 100, **TIER_OFF)
                            # Epoch 0 is today's path; 0, 1, 2 with the tier.
                            for n, phase in enumerate(phases):
                                epoch = max(n - 1, 0) if phases is PHASES else n
                                paced = step if phase == "first, paced" else 0.0
                                options = TIER_OFF if phase == "today" else tier
                                run = _epoch(
                                    target, server.pid, args, augment, epoch, paced, **options
                                )
                                if phase == "today":
                                    step = args.paced * args.batch_size / run["samples_per_second"]
                                # Records stored so far (background fill or misses).
                                events = _tier_events(metrics_port)
                                run["stored"] = events.get("fill", 0.0)
                                run["fill_offered"] = events.get("fill_offered", 0.0)
                                run["fill_dropped"] = events.get("fill_dropped", 0.0)
                                run["fill_spilled"] = events.get("fill_spilled", 0.0)
                                runs.setdefault((augment, phase), []).append(run)
                                line = {"round": round_, "recipe": augment, "phase": phase, **run}
                                print(json.dumps({"benchmark": "tier", **line}))
                        finally:
                            server.terminate()
                            server.wait()
    finally:
        s3.terminate()
        s3.wait()
    print(
        f"{os.cpu_count()} cores, raw@{args.shorter_side}, batch {args.batch_size}, "
        f"{args.image_size}², shared memory into torch, medians of {args.rounds}; "
        f"paced: a step of {args.paced}x today's batch time:",
        file=sys.stderr,
    )
    for augment in ("train", "eval"):
        today = statistics.median(r["samples_per_second"] for r in runs[(augment, "today")])
        for phase in PHASES + PACED:
            rs = runs[(augment, phase)]
            rate = statistics.median(r["samples_per_second"] for r in rs)
            cpu = statistics.median(r["server_cpu_ms"] for r in rs)
            stored = statistics.median(r["stored"] for r in rs)
            spilled = statistics.median(r["fill_spilled"] for r in rs)
            dropped = statistics.median(r["fill_dropped"] for r in rs)
            print(
                f"  {augment:<5} {phase:<20} {rate:7.0f} samples/s ({rate / today:.2f}x today)"
                f"  server {cpu:.2f} CPU-ms/sample, {stored:.0f} records stored by its end"
                f" (fill offers so far: {spilled:.0f} kept on disk, {dropped:.0f} dropped)",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
