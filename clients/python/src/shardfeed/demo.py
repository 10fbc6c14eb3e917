"""``python -m shardfeed.demo``: the whole path from Python, no S3 account.

Starts the binary's S3-compatible test server on loopback with a synthetic
photo dataset in tar shards, a local sidecar (:func:`shardfeed.serve`)
reading it through aws-sdk-s3, and streams it into numpy here: the shapes,
the first labels and the rate, epoch by epoch. Needs the ``shardfeed``
binary (the ``shardfeed-server`` wheel, ``$SHARDFEED_BIN`` or PATH); numpy
only, no torch.
"""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO

from ._client import Client
from ._server import find_binary, serve

# The test server's fixed credentials (src/dev/s3mem.rs): it listens on
# loopback only and holds nothing but the synthetic data.
_ACCESS_KEY = "shardfeed-demo"
_SECRET_KEY = "shardfeed-demo-secret"
_STARTUP_SECONDS = 120.0


@contextmanager
def _test_s3(binary: str, shards: int, samples_per_shard: int) -> Iterator[tuple[str, str]]:
    """The binary's ``dev-s3`` with the synthetic dataset published:
    ``(endpoint, dataset URI)``; stopped on leaving."""
    process = subprocess.Popen(
        [
            binary,
            "dev-s3",
            "--synthetic-shards",
            str(shards),
            "--samples-per-shard",
            str(samples_per_shard),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        said: list[str] = []
        reader = threading.Thread(target=_collect, args=(process.stderr, said), daemon=True)
        reader.start()
        # It publishes first, then says where it listens (one line).
        line = _line_within(process.stdout, _STARTUP_SECONDS)
        found = re.match(r"listening on (\S+)", line or "")
        if found is None:
            process.kill()
            reader.join(timeout=5)
            raise RuntimeError(f"shardfeed dev-s3 did not start: {line!r} {''.join(said)}")
        # Said on stderr before that line: read by the thread, soon if not yet.
        published = _published(said)
        deadline = time.monotonic() + 5
        while not published and time.monotonic() < deadline:
            time.sleep(0.01)
            published = _published(said)
        if not published:
            raise RuntimeError(f"shardfeed dev-s3 published no dataset: {''.join(said)}")
        yield found.group(1), published[0]
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _collect(stream: IO[str], lines: list[str]) -> None:
    # The publishing lines come before `listening on`; the rest is drained
    # so that the server never blocks on a full pipe.
    for line in stream:
        if len(lines) < 50:
            lines.append(line)


def _published(lines: list[str]) -> list[str]:
    return [m.group(1) for m in map(re.compile(r"published (\S+)").search, list(lines)) if m]


def _line_within(stream: IO[str], seconds: float) -> str | None:
    """The next line of ``stream``, or None after ``seconds``."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(seconds)
    return got[0] if got else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shardfeed.demo",
        description="Stream a synthetic dataset from a loopback S3 server into numpy.",
    )
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--samples-per-shard", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--binary", help="the shardfeed executable (default: as serve() finds it)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    binary = str(find_binary(args.binary))
    print(f"shardfeed binary: {binary}", flush=True)
    print(
        f"synthesizing {args.shards * args.samples_per_shard} photo-like JPEGs in "
        f"{args.shards} shards on a loopback S3 server (a few seconds)...",
        flush=True,
    )
    with _test_s3(binary, args.shards, args.samples_per_shard) as (endpoint, dataset):
        print(
            f"synthetic dataset {dataset} at {endpoint}, made in {time.monotonic() - started:.1f}s",
            flush=True,
        )
        env = {
            "AWS_ACCESS_KEY_ID": _ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": _SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "SHARDFEED_S3_ENDPOINT": endpoint,
            "SHARDFEED_S3_FORCE_PATH_STYLE": "true",
        }
        sidecar_started = time.monotonic()
        with serve(binary=binary, env=env) as target:
            client = Client(target)
            info = client.describe(dataset, world_size=1, batch_size=args.batch_size)
            print(
                f"sidecar at {target}: {info.samples} samples in {info.shards} shards, "
                f"{info.batches_per_rank} batches an epoch, decoder {info.decoder}",
                flush=True,
            )
            for epoch in range(args.epochs):
                epoch_started = time.monotonic()
                samples = 0
                for index, batch in enumerate(
                    client.batches(
                        dataset,
                        epoch=epoch,
                        rank=0,
                        world_size=1,
                        batch_size=args.batch_size,
                        image_size=args.image_size,
                        augment="train",
                    )
                ):
                    samples += len(batch.labels)
                    if epoch == 0 and index == 0:
                        print(
                            f"first batch {time.monotonic() - sidecar_started:.1f}s after the "
                            f"sidecar started: images "
                            f"{batch.images.dtype} {tuple(batch.images.shape)}, labels "
                            f"{batch.labels[:8].tolist()}, keys {batch.keys[:2]}",
                            flush=True,
                        )
                seconds = time.monotonic() - epoch_started
                print(
                    f"epoch {epoch}: {samples} samples in {seconds:.2f}s, "
                    f"{samples / max(seconds, 1e-9):,.0f} samples/s",
                    flush=True,
                )
            client.close()
    print(
        "done. Next: shardfeed.pack() your own image folder, then ShardfeedDataset "
        "(README, From Python).",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    sys.exit(main())
