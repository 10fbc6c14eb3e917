"""The sidecar's own sizing against a hand-tuned grid, per recipe and layout.

    SHARDFEED_BIN=target/release/shardfeed python -m shardfeed_benchmarks.sizing

``shardfeed dev-s3 --get-delay-ms 20`` holds the demo's ~110 KB photos as
tar shards and as loose objects (every GET answers after 20 ms, as S3's
first byte does; ``--get-mib-per-second`` also caps each GET's body, as
one connection to S3 carries tens of MB/s, not loopback's GB/s). For each
recipe (``train``: RandomResizedCrop + flip; ``eval``: Resize +
CenterCrop) and layout, ``shardfeed bench`` (fetch,
parse, decode, batch; no gRPC, no Python) runs once with no flags (what a
user who passes none gets) and once per point of a grid: decode threads x
GETs in flight (ranged parts per shard reader for tar, objects per reader
for loose) x shards prefetched.

A grid's best single run is biased upwards by noise (the largest of many
draws), so the defaults and the three best grid points are then run
``--repeats`` more times, interleaved, and medians compared: the figure is
defaults / best (the target: at least 0.9).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from .delivered import _shardfeed_env, start_dev_s3
from .loose import LOOSE

TAR = "s3://demo/photos/"


def _bench(
    binary: str, endpoint: str, uri: str, recipe: str, flags: tuple[str, ...], batches: int
) -> float:
    """Samples/s of one ``shardfeed bench`` run."""
    out = subprocess.run(
        [binary, "bench", uri, "--augment", recipe, "--max-batches", str(batches), *flags],
        env=_shardfeed_env(endpoint),
        check=True,
        capture_output=True,
        text=True,
    )
    summary: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return float(summary["samples_per_second"])


def _grid(layout: str, cores: int) -> list[tuple[str, ...]]:
    threads = sorted({max(1, cores // 2), cores, cores + 1})
    gets_flag, gets = (
        ("--parts-in-flight", (1, 2, 4))
        if layout == "tar"
        else ("--object-requests-in-flight", (4, 16, 64))
    )
    return [
        (
            "--decode-threads",
            str(t),
            gets_flag,
            str(g),
            "--prefetch-shards",
            str(p),
        )
        for t, g, p in itertools.product(threads, gets, (0, 2, 4))
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--per-shard", type=int, default=192)
    parser.add_argument("--batches", type=int, default=20, help="batches a run (0: an epoch)")
    parser.add_argument("--get-delay-ms", type=int, default=20)
    parser.add_argument(
        "--get-mib-per-second", type=int, default=0, help="each GET's body rate (0: uncapped)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recipes", default="train,eval")
    parser.add_argument("--layouts", default="tar,loose")
    args = parser.parse_args(argv)
    binary = os.environ.get("SHARDFEED_BIN", "shardfeed")
    cores = len(os.sched_getaffinity(0))
    s3, endpoint = start_dev_s3(
        binary,
        args.shards,
        args.per_shard,
        "--get-delay-ms",
        str(args.get_delay_ms),
        "--get-mib-per-second",
        str(args.get_mib_per_second),
        "--synthetic-loose",
    )
    lines = []
    try:
        for recipe, layout in itertools.product(args.recipes.split(","), args.layouts.split(",")):
            uri = TAR if layout == "tar" else LOOSE

            def run(flags: tuple[str, ...], uri: str = uri, recipe: str = recipe) -> float:
                return _bench(binary, endpoint, uri, recipe, flags, args.batches)

            grid = {flags: run(flags) for flags in _grid(layout, cores)}
            for flags, rate in grid.items():
                print(
                    json.dumps(
                        {
                            "benchmark": "sizing",
                            "recipe": recipe,
                            "layout": layout,
                            "flags": " ".join(flags),
                            "samples_per_second": rate,
                        }
                    )
                )
            finalists = sorted(grid, key=grid.__getitem__, reverse=True)[:3]
            settings: list[tuple[str, ...]] = [(), *finalists]
            rates: dict[tuple[str, ...], list[float]] = {s: [] for s in settings}
            for _ in range(args.repeats):
                for flags in settings:
                    rates[flags].append(run(flags))
            medians = {flags: statistics.median(r) for flags, r in rates.items()}
            best = max(finalists, key=medians.__getitem__)
            default = medians[()]
            lines.append(
                f"  {recipe:<5} {layout:<5} defaults {default:6.0f}/s, best of "
                f"{len(grid)} {medians[best]:6.0f}/s ({' '.join(best)}): "
                f"{default / medians[best]:.2f}x"
            )
    finally:
        s3.terminate()
        s3.wait()
    print(
        f"{cores} cores, {args.get_delay_ms} ms to first byte, "
        f"{args.get_mib_per_second or 'uncapped'} MiB/s a GET, {args.batches} batches a run, "
        f"medians of {args.repeats}:",
        file=sys.stderr,
    )
    for line in lines:
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
