"""Several views delivered into Python: the sidecar serving DINOv2's (or
SimCLR's) views against the recipe's own augmentation in DataLoader
workers, on the same cores, in one run.

    SHARDFEED_BIN=target/release/shardfeed python -m shardfeed_benchmarks.views_delivered \
        [--recipe dinov2|simclr] [--trainer-decode] \
        [--shards 4 --samples-per-shard 128 --batch-size 64]

Both read the same tar shards of the demo's ~110 KB photos from one
``shardfeed dev-s3`` on loopback:

- shardfeed: ``Client.batches(views=views_from_torchvision(...))`` from a
  ``shardfeed serve`` on a Unix socket, through shared memory (each group
  one ``uint8`` array; a trainer normalizes on its GPU);
- the recipe: a ``DataLoader`` with one worker per core, each streaming its
  share of the shards with boto3, decoding each photo once with Pillow and
  making every view with the recipe's torchvision transforms
  (``DataAugmentationDINO``'s: ``ToTensor`` and ``Normalize`` included),
  collated per view as DINOv2's loader stacks them.

With ``--trainer-decode``, a third contender: the same views delivered
encoded (``delivery="encoded"``, share 0), every sample decoded once in
this process with ``BatchDecoder("cpu")`` and its views made there; its
CPU counts both processes, and the sidecar's own CPU per sample is printed
beside the decoded delivery's (what a GPU decode in the trainer leaves on
the sidecar's cores).

Rounds alternate (``--repeats``); the medians of samples/s and of CPU-ms
per sample (the server's CPU, or the workers', with this process's) are
printed with their ratio, then as one JSON line.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Iterator
from typing import Any

from .delivered import _process_cpu, synthetic_setup
from .memory import _scrape_metric, _status_kib
from .training import (
    LoaderContender,
    _IterableBase,
    _shard_keys,
    _worker_cpu,
    medians,
    recipe_arguments,
    run_interleaved,
    worker_shard_samples,
)
from .views import dinov2_transforms, dinov2_views, simclr_transform, simclr_views

RESERVED = "shardfeed_stream_memory_reserved_bytes"


def recipe_views(name: str) -> tuple[Any, dict[str, Any]]:
    """The recipe's per-image views function (the Python side) and its
    groups as ``views_from_torchvision`` takes them (the sidecar's)."""
    if name == "dinov2":
        return dinov2_views(), dinov2_transforms()
    return simclr_views(), {"views": (simclr_transform(), 2)}


class _RecipeShards(_IterableBase):
    """The shards from S3, split among workers: each photo decoded once
    and made into every view of the recipe."""

    def __init__(self, endpoint: str, bucket: str, keys: list[str], recipe: str) -> None:
        self.endpoint, self.bucket, self.keys, self.recipe = endpoint, bucket, keys, recipe

    def __iter__(self) -> Iterator[tuple[list[Any], int]]:
        views, _ = recipe_views(self.recipe)
        return worker_shard_samples(self.endpoint, self.bucket, self.keys, views)


def sidecar_run(
    target: str,
    dataset: str,
    batch_size: int,
    views: Any,
    during: Any = None,
    decoder: Any = None,
) -> int:
    """One epoch of views; ``during()`` is called once a batch has come.
    With ``decoder`` (a BatchDecoder), delivered encoded and decoded by it."""
    from shardfeed import Client

    encoded: dict[str, Any] = {}
    if decoder is not None:
        encoded = dict(delivery="encoded", server_decode_fraction=0.0)
    samples = checksum = 0
    for batch in Client(target).batches(
        dataset, batch_size=batch_size, rank=0, world_size=1, views=views, **encoded
    ):
        if not batch.shared:
            raise RuntimeError("asked for shared memory, got inline")
        if decoder is not None:
            checksum += sum(int(group[0, 0, 0, 0]) for group in decoder.decode(batch).images)
        else:
            checksum += sum(int(group.images[0, 0, 0, 0]) for group in batch.views)
        samples += len(batch.labels)
        if during is not None:
            during()
            during = None
    return samples


def main(argv: list[str] | None = None) -> int:
    import argparse

    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument("--recipe", choices=("dinov2", "simclr"), default="dinov2")
    chooser.add_argument("--trainer-decode", action="store_true")
    chosen, rest = chooser.parse_known_args(argv)
    recipe = chosen.recipe
    args = recipe_arguments(__doc__, rest)
    from shardfeed import views_from_torchvision

    views = views_from_torchvision(recipe_views(recipe)[1])
    socket_dir = tempfile.TemporaryDirectory(prefix="sf-")
    setup = synthetic_setup(
        args.binary, args.shards, args.samples_per_shard, 0, f"{socket_dir.name}/sf.sock"
    )
    try:
        endpoint, dataset = setup["endpoint"], setup["dataset"]
        bucket, keys = _shard_keys(endpoint, dataset)
        loader = LoaderContender(
            _RecipeShards(endpoint, bucket, keys, recipe), args.batch_size, args.workers
        )

        def server_cpu() -> float:
            return float(_process_cpu(setup["server_pid"]))

        contenders = {
            "shardfeed": (
                lambda: sidecar_run(setup["target"], dataset, args.batch_size, views),
                server_cpu,
            ),
            f"{recipe} loader": (loader.run, _worker_cpu),
        }
        # The sidecar's own CPU per sample while the trainer decodes.
        sidecar_alone: list[float] = []
        if chosen.trainer_decode:
            from shardfeed.decode import BatchDecoder

            def trainer_decodes() -> int:
                before = server_cpu()
                decoder = BatchDecoder("cpu")
                samples = sidecar_run(
                    setup["target"], dataset, args.batch_size, views, None, decoder
                )
                sidecar_alone.append(1e3 * (server_cpu() - before) / max(samples, 1))
                return samples

            contenders["trainer decodes"] = (trainer_decodes, server_cpu)
        # One untimed pass of the sidecar too (its first batches start the
        # stream's readers).
        reserved: list[float] = []
        sidecar_run(
            setup["target"],
            dataset,
            args.batch_size,
            views,
            lambda: reserved.append(_scrape_metric(setup["metrics_url"], RESERVED)),
        )
        results = run_interleaved(contenders, args.repeats)
        # The sidecar's peak resident memory, against the formula's batch
        # term: (decode_ahead 2 + ready_batches 2 + 3) batches of every view.
        peak = _status_kib(setup["server_pid"], "VmHWM") * 1024
        batch_bytes = args.batch_size * views.bytes_per_sample()
    finally:
        for process in setup["processes"]:
            process.terminate()
            process.wait()
    summary = medians(results)
    ours, theirs = summary["shardfeed"], summary[f"{recipe} loader"]
    print(
        f"\n{recipe} views, batch {args.batch_size}, {args.workers} cores, "
        f"median of {args.repeats}:"
    )
    for name, figures in summary.items():
        print(
            f"  {name:<16} {figures['samples_per_second']:>7.1f} samples/s  "
            f"{figures['cpu_ms_per_sample']:>7.2f} CPU-ms/sample"
        )
    ratio = ours["samples_per_second"] / theirs["samples_per_second"]
    cpu_ratio = theirs["cpu_ms_per_sample"] / ours["cpu_ms_per_sample"]
    print(f"  shardfeed / the recipe: {ratio:.2f}x samples/s, {cpu_ratio:.2f}x less CPU per sample")
    print(
        f"  sidecar peak RSS {peak / 2**20:.0f} MiB; a batch of views {batch_bytes / 2**20:.1f} "
        f"MiB, the formula's batch term 7 x that = {7 * batch_bytes / 2**20:.0f} MiB"
    )
    print(f"  the stream's reservation (its whole formula) {reserved[0] / 2**20:.0f} MiB")
    memory = {"peak_rss_bytes": peak, "batch_bytes": batch_bytes, "reserved_bytes": reserved[0]}
    if sidecar_alone:
        alone = statistics.median(sidecar_alone)
        print(
            f"  trainer decodes: the sidecar's own CPU {alone:.3f} ms/sample, against "
            f"{ours['cpu_ms_per_sample']:.2f} decoding the views itself "
            f"({ours['cpu_ms_per_sample'] / alone:.0f}x less)"
        )
        memory["sidecar_cpu_ms_per_sample_trainer_decodes"] = alone
    print(
        json.dumps({"recipe": recipe, **summary, "ratio": ratio, "cpu_ratio": cpu_ratio, **memory})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
