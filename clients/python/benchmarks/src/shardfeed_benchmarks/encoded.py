"""Encoded delivery into torch tensors on this host's cores, against decoded
delivery, with the server's share swept and tuned.

    SHARDFEED_BIN=target/release/shardfeed python -m shardfeed_benchmarks.encoded

The demo's ~110 KB photos (``shardfeed dev-s3``) are streamed by a server on
a Unix socket (shared memory) as training batches (RandomResizedCrop + flip,
``--image-size``², ``--batch-size``) into ``ShardfeedDataset`` tensors:

- ``decoded``: today's path, every image decoded by the server;
- ``encoded f=X``: baseline JPEGs decoded here with torchvision on CPU
  (``decode="client"``), the server decoding a share X of each batch;
- ``encoded auto``: the server tuning its share from where the stream waits.

``--cores shared`` (the default): server and client share this machine's
cores, so the figures say how the decode work splits between the two
processes. ``--cores split``: the server (and dev-s3) run on the first core,
this process and its one torch thread on the second, as a trainer with
cores of its own. ``--recipe trivial``: TrivialAugment + erasing after the
crop, applied by whichever side decodes the sample. On a GPU host the client's share runs on the GPU
(``decode="gpu"``) and the same sweep applies there.

Settings are interleaved ``--repeats`` times, each ``--epochs`` epochs of
one dataset (a tuned share carries across them); medians of the epochs
after the first are printed with CPU-ms per sample for the server and this
process, and the share auto ended at. Auto's first epoch, where its search
starts from nothing, is printed on its own: an epoch of the default dataset
is 48 batches, a real one thousands, so that search weighs more here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Any

from .delivered import synthetic_setup, timed_pass


def _epochs(
    target: str, dataset: str, server_pid: int, args: argparse.Namespace, **options: Any
) -> list[dict[str, Any]]:
    """``--epochs`` epochs of one dataset, as a training run iterates it
    (a tuned share carries from one epoch's stream to the next)."""
    from shardfeed.torch import ShardfeedDataset

    ds = ShardfeedDataset(
        dataset,
        target=target,
        batch_size=args.batch_size,
        image_size=args.image_size,
        augment=_augment(args.recipe),
        rank=0,
        world_size=1,
        **options,
    )
    runs = []
    for _ in range(args.epochs):
        run: dict[str, Any] = timed_pass(ds, server_pid)
        run["server_share"] = ds._share.share
        runs.append(run)
    return runs


def _augment(recipe: str) -> Any:
    """The training recipe: RandomResizedCrop + flip, or with TrivialAugment
    and erasing after it (each side then pays for the ops of the samples it
    decodes, and the search sees that in the rate)."""
    if recipe == "plain":
        return "train"
    from shardfeed import Augment, RandomErasing, TrivialAugmentWide

    return Augment.train(
        auto_augment=TrivialAugmentWide(interpolation="bilinear"),
        random_erasing=RandomErasing(0.25),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--per-shard", type=int, default=384)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--fractions", default="0,0.25,0.5,0.75,1")
    parser.add_argument("--cores", choices=("shared", "split"), default="shared")
    parser.add_argument("--recipe", choices=("plain", "trivial"), default="plain")
    args = parser.parse_args(argv)
    binary = os.environ.get("SHARDFEED_BIN", "shardfeed")
    import torch

    if args.cores == "split":
        torch.set_num_threads(1)

    settings: list[tuple[str, dict[str, Any]]] = [("decoded", {})]
    for fraction in (float(f) for f in args.fractions.split(",")):
        settings.append(
            (f"encoded f={fraction:g}", {"decode": "client", "server_decode_fraction": fraction})
        )
    settings.append(("encoded auto", {"decode": "client", "server_decode_fraction": "auto"}))
    with tempfile.TemporaryDirectory() as tmp:
        setup = synthetic_setup(binary, args.shards, args.per_shard, 0, f"{tmp}/sf.sock")
        if args.cores == "split":
            for process in setup["processes"]:
                _pin(process.pid, {0})
            _pin(os.getpid(), {1})
        try:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in settings}
            firsts: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in settings}
            for repeat in range(args.repeats):
                for name, options in settings:
                    epochs = _epochs(
                        setup["target"], setup["dataset"], setup["server_pid"], args, **options
                    )
                    # The first epoch is where a tuned share starts from
                    # nothing: the steady state is the rest.
                    for epoch, run in enumerate(epochs):
                        line = {"setting": name, "repeat": repeat, "epoch": epoch, **run}
                        print(json.dumps({"benchmark": "encoded", **line}))
                    runs[name].extend(epochs[1:] if len(epochs) > 1 else epochs)
                    firsts[name].append(epochs[0])
        finally:
            for process in setup["processes"]:
                process.terminate()
                process.wait()
    medians = {
        name: {
            "samples_per_second": statistics.median(r["samples_per_second"] for r in rs),
            "server_cpu_ms": statistics.median(1e3 * r["server_cpu"] / r["samples"] for r in rs),
            "python_cpu_ms": statistics.median(1e3 * r["python_cpu"] / r["samples"] for r in rs),
        }
        for name, rs in runs.items()
    }
    decoded = medians["decoded"]["samples_per_second"]
    fixed = {n: m for n, m in medians.items() if n.startswith("encoded f=")}
    best = max(fixed, key=lambda n: fixed[n]["samples_per_second"])
    auto = medians["encoded auto"]["samples_per_second"]
    print(
        f"{os.cpu_count()} cores ({args.cores}), recipe {args.recipe}, "
        f"torch {torch.__version__} with "
        f"{torch.get_num_threads()} threads, {args.shards * args.per_shard} samples an epoch, "
        f"medians of {args.repeats} x {max(args.epochs - 1, 1)} epochs:",
        file=sys.stderr,
    )
    for name, m in medians.items():
        rate = m["samples_per_second"]
        print(
            f"  {name:<18} {rate:7.0f} samples/s ({rate / decoded:.2f}x decoded)"
            f"  server {m['server_cpu_ms']:.2f} + client {m['python_cpu_ms']:.2f} CPU-ms/sample",
            file=sys.stderr,
        )
    best_rate = fixed[best]["samples_per_second"]
    shares = [r["server_share"] for r in runs["encoded auto"] if r["server_share"] is not None]
    ended = f", its share ending at {statistics.median(shares):.2f}" if shares else ""
    print(
        f"  best fixed share: {best}; auto reaches {auto / best_rate:.2f}x of it{ended}",
        file=sys.stderr,
    )
    first = statistics.median(r["samples_per_second"] for r in firsts["encoded auto"])
    best_first = statistics.median(r["samples_per_second"] for r in firsts[best])
    print(
        f"  first epochs: auto {first:.0f} samples/s, {first / best_first:.2f}x of {best}'s",
        file=sys.stderr,
    )
    return 0


def _pin(pid: int, cores: set[int]) -> None:
    """Pins every thread of ``pid`` (a process's threads keep the mask
    they were started with, so each is set)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), cores)


if __name__ == "__main__":
    sys.exit(main())
