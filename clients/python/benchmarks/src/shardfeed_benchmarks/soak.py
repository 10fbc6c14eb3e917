"""Soak: many streams over several epochs, random disconnects, faulty S3.

``python -m shardfeed_benchmarks.soak`` starts ``shardfeed dev-s3`` with the
demo's photo dataset and a fraction of all S3 requests failing (500 or 503
SlowDown, ``--fail-percent``), and one ``shardfeed serve``. Then ``--streams``
ranks of one job each read ``--epochs`` epochs at once; after any batch a rank
may drop its stream (seeded, ``--disconnect-percent``) and reconnect with
``start_batch`` set to the next batch. Per epoch it prints the server's RSS
and peak RSS, reconnects, and checks that the job got every sample of the
epoch exactly once: each reconnect resumed at the batch asked for, no stream
was lost, nothing was repeated or skipped. Exits non-zero on a violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import threading
import time
from typing import Any

from shardfeed import Client, ShardfeedError

from .delivered import _free_port, _shardfeed_env, start_dev_s3
from .memory import _status_kib


def _rank_epoch(
    target: str,
    dataset: str,
    epoch: int,
    rank: int,
    world: int,
    args: argparse.Namespace,
    expected_batches: int,
    out: dict[str, Any],
) -> None:
    rng = random.Random(args.seed * 1_000_003 + epoch * 1_009 + rank)
    client = Client(target)
    keys: list[str] = []
    next_batch = 0
    reconnects = 0
    errors = 0
    try:
        while next_batch < expected_batches:
            try:
                for batch in client.batches(
                    dataset,
                    seed=args.seed,
                    epoch=epoch,
                    rank=rank,
                    world_size=world,
                    batch_size=args.batch_size,
                    image_size=args.image_size,
                    start_batch=next_batch,
                ):
                    if batch.index != next_batch:
                        raise AssertionError(
                            f"rank {rank} epoch {epoch}: asked for batch {next_batch}, "
                            f"got {batch.index}"
                        )
                    keys.extend(batch.keys)
                    next_batch += 1
                    if rng.random() * 100 < args.disconnect_percent:
                        reconnects += 1
                        break
            except ShardfeedError as error:
                # A stream that failed (e.g. retries exhausted) resumes too.
                errors += 1
                if errors > 20:
                    message = f"rank {rank}: too many failed streams: {error}"
                    raise AssertionError(message) from error
                time.sleep(0.2)
    finally:
        client.close()
    out.update(keys=keys, reconnects=reconnects, errors=errors, batches=next_batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--samples-per-shard", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--fail-percent", type=int, default=5)
    parser.add_argument("--disconnect-percent", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    s3, endpoint = start_dev_s3(
        args.binary,
        args.shards,
        args.samples_per_shard,
        "--fail-percent",
        str(args.fail_percent),
    )
    target = f"127.0.0.1:{_free_port()}"
    server = subprocess.Popen(
        [args.binary, "serve", "--listen", target]
        + ["--metrics-listen", f"127.0.0.1:{_free_port()}"],
        env=dict(_shardfeed_env(endpoint), SHARDFEED_LOG="error"),
    )
    dataset = "s3://demo/photos/"
    violations = 0
    try:
        import grpc

        grpc.channel_ready_future(grpc.insecure_channel(target)).result(timeout=30)
        info = Client(target).describe(dataset, world_size=args.streams, batch_size=args.batch_size)
        per_rank = info.batches_per_rank
        print(
            f"{args.streams} streams x {args.epochs} epochs, {per_rank} batches of "
            f"{args.batch_size} per rank; {args.fail_percent}% of S3 requests fail; "
            f"{args.disconnect_percent}% chance of a disconnect after each batch",
            flush=True,
        )
        for epoch in range(args.epochs):
            started = time.monotonic()
            results: list[dict[str, Any]] = [{} for _ in range(args.streams)]
            threads = [
                threading.Thread(
                    target=_rank_epoch,
                    args=(target, dataset, epoch, r, args.streams, args, per_rank, results[r]),
                )
                for r in range(args.streams)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            keys = [k for r in results for k in r.get("keys", [])]
            expected = per_rank * args.batch_size * args.streams
            lost = sum(1 for r in results if r.get("batches") != per_rank)
            ok = len(keys) == expected and len(set(keys)) == expected and lost == 0
            violations += 0 if ok else 1
            row = {
                "epoch": epoch,
                "seconds": round(time.monotonic() - started, 2),
                "samples": len(keys),
                "distinct": len(set(keys)),
                "expected": expected,
                "streams_incomplete": lost,
                "reconnects": sum(r.get("reconnects", 0) for r in results),
                "failed_streams_resumed": sum(r.get("errors", 0) for r in results),
                "server_rss_mib": round(_status_kib(server.pid, "VmRSS") / 1024),
                "server_peak_rss_mib": round(_status_kib(server.pid, "VmHWM") / 1024),
                "exact": ok,
            }
            print(json.dumps(row), flush=True)
    finally:
        server.terminate()
        s3.terminate()
        server.wait(timeout=30)
        s3.wait(timeout=30)
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
