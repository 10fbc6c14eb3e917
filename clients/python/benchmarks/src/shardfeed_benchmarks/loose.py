"""Loose image objects vs the same images in tar shards, at S3-like latency.

    SHARDFEED_BIN=target/release/shardfeed python -m shardfeed_benchmarks.loose

``shardfeed dev-s3 --get-delay-ms 20`` holds the demo's ~110 KB photos twice:
as tar shards (``s3://demo/photos/``) and as one object per image in class
folders (``s3://demo/loose/``). Each contender turns them into uint8 batches
of 224x224 (shorter side to 224, center crop), batch 128, in this process:

- ``shardfeed``: ``Client.batches()`` over the loose objects, shared memory,
  from a ``shardfeed serve`` on a Unix socket (one GET per image,
  ``--object-requests-in-flight`` of them per reader);
- ``sf tar``: the same server and client over the tar shards;
- ``s3 connector``: the S3 Connector for PyTorch's map-style
  ``S3MapDataset`` over the same loose objects on the same endpoint, decoded
  with Pillow, in a ``DataLoader`` with its usual settings (shuffled, one
  worker per core).

Every GET waits ``--get-delay-ms`` before its first byte, as S3's does. The
target is loose objects limited by decode, not latency: at least 90% of the
tar rate. Contenders run ``--repeats`` times interleaved; medians are
reported with CPU-seconds per sample, and apart, the CPU the S3 stand-in
spent per sample: on this machine it shares the cores that decode, which a
real S3 does not, and loose objects ask it for one response per image.
torch and s3torchconnector are optional: without them that contender is
skipped with a note.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable
from typing import Any

from .delivered import (
    ACCESS_KEY,
    SECRET_KEY,
    _decode,
    _process_cpu,
    _s3_client,
    run_entitlement,
    synthetic_setup,
)
from .training import (
    Contenders,
    LoaderContender,
    _worker_cpu,
    recipe_arguments,
    report,
    run_interleaved,
    shardfeed_run,
)

LOOSE = "s3://demo/loose/"


class _PillowEval:
    """The S3 Connector's transform: an object's bytes to a center-cropped
    image and the label its class folder names (picklable for spawn)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, reader: Any) -> tuple[Any, int]:
        import torch

        image = torch.from_numpy(_decode(reader.read(), self.size, draft=False))
        return image, int(reader.key.split("/")[-2])


def _loose_uris(endpoint: str) -> list[str]:
    """Every image object under the loose prefix (paginated listing)."""
    pages = _s3_client(endpoint).get_paginator("list_objects_v2")
    return [
        f"s3://demo/{o['Key']}"
        for page in pages.paginate(Bucket="demo", Prefix="loose/")
        for o in page.get("Contents", [])
        if o["Key"].endswith(".jpg")
    ]


def _charging(contenders: Contenders, pid: int, spent: dict[str, list[float]]) -> Contenders:
    """The contenders, each run also recording the CPU-seconds per sample
    that process ``pid`` (the S3 stand-in) spent meanwhile."""

    def wrapped(name: str, run: Callable[[], int]) -> Callable[[], int]:
        def timed() -> int:
            before = _process_cpu(pid)
            samples = run()
            spent.setdefault(name, []).append((_process_cpu(pid) - before) / max(samples, 1))
            return samples

        return timed

    return {name: (wrapped(name, run), extra) for name, (run, extra) in contenders.items()}


def main(argv: list[str] | None = None) -> int:
    args = recipe_arguments(__doc__, argv, get_delay_ms=20)
    socket_dir = tempfile.TemporaryDirectory(prefix="sf-")
    setup = synthetic_setup(
        args.binary,
        args.shards,
        args.samples_per_shard,
        args.get_delay_ms,
        f"{socket_dir.name}/sf.sock",
        ("--synthetic-loose",),
    )
    notes: list[str] = [f"every GET answers after {args.get_delay_ms} ms"]
    size = args.image_size
    server_cpu = lambda: _process_cpu(setup["server_pid"])  # noqa: E731
    try:
        endpoint, target = setup["endpoint"], setup["target"]
        contenders: Contenders = {
            name: (
                lambda dataset=dataset: shardfeed_run(  # type: ignore[misc]
                    target, dataset, args.batch_size, size, "shared_memory", "eval"
                ),
                server_cpu,
            )
            for name, dataset in (("shardfeed", LOOSE), ("sf tar", setup["dataset"]))
        }
        try:
            import s3torchconnector
            import torch  # noqa: F401

            os.environ.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            objects = s3torchconnector.S3MapDataset.from_objects(
                _loose_uris(endpoint),
                region="us-east-1",
                endpoint=endpoint,
                transform=_PillowEval(size),
                s3client_config=s3torchconnector.S3ClientConfig(force_path_style=True),
            )
            connector = LoaderContender(objects, args.batch_size, args.workers, shuffle=True)
            contenders["s3 connector"] = (connector.run, _worker_cpu)
        except ImportError:
            notes.append("S3 Connector skipped: pip install torch s3torchconnector")
        stand_in: dict[str, list[float]] = {}
        results = run_interleaved(_charging(contenders, setup["s3_pid"], stand_in), args.repeats)
        for name, spent in stand_in.items():
            notes.append(
                f"{name}: the S3 stand-in spent {1e3 * statistics.median(spent):.2f} "
                "CPU-ms/sample on these cores"
            )
        entitlement = run_entitlement(
            args.binary, endpoint, setup["dataset"], args.batch_size, size, 0
        )
    finally:
        for process in setup["processes"]:
            process.terminate()
            process.wait()

    report(
        f"loose objects vs tar shards, center crop {size}, batch {args.batch_size}, "
        f"{args.get_delay_ms} ms to first byte",
        results,
        entitlement,
        "shardfeed bench, tar",
        args.workers,
        notes,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
