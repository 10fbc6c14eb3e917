"""The recipes' ops where the trainer decodes: the client's batched ops
(``shardfeed.torch.ops``, what ``BatchDecoder`` runs after its resize) on
a batch of 128 224² samples, against torchvision's own kernels replaying
the same decisions one sample at a time (``shardfeed._ops.replay``, the
loop a trainer would otherwise write), on CPU and, where one is at hand,
CUDA. Both start from the decoder's ``(N, H, W, 3)`` batch and leave
their results in it.

    python -m shardfeed_benchmarks.client_ops --binary target/release/shardfeed

The decisions are the server's, from a real stream of each recipe; the
pixels are that stream's images. Rounds alternate; medians are printed as
JSON lines, with the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from .delivered import synthetic_setup


def _recipes() -> dict[str, Any]:
    from shardfeed import (
        Augment,
        ColorJitter,
        RandAugment,
        RandomErasing,
        TrivialAugmentWide,
    )

    return {
        "trivial_augment+erasing": Augment.train(
            auto_augment=TrivialAugmentWide(interpolation="bilinear"),
            random_erasing=RandomErasing(0.1),
        ),
        "rand_augment(2,9)": Augment.train(auto_augment=RandAugment(2, 9)),
        "color_jitter(0.4)+grayscale(0.2)": Augment.train(
            color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1), grayscale=0.2
        ),
    }


def _timed(run: Callable[[], None], sync: Callable[[], None]) -> float:
    run()  # warm: kernels chosen, caches filled
    sync()
    started = time.perf_counter()
    run()
    sync()
    return time.perf_counter() - started


def _per_sample(pixels: Any, ops: list[Any]) -> None:
    """torchvision's kernels one sample at a time; like the batched run,
    from the decoder's ``(N, H, W, 3)`` batch back into it."""
    from shardfeed._ops import replay

    out = pixels.clone()
    for slot, sample_ops in enumerate(ops):
        out[slot] = replay(out[slot].permute(2, 0, 1), sample_ops).permute(1, 2, 0)


def _batched(pixels: Any, crops: Any, augmentation: Any) -> None:
    from shardfeed.torch.ops import apply_decisions

    apply_decisions(pixels.clone(), range(len(pixels)), crops, augmentation)


def main(argv: list[str] | None = None) -> int:
    import torch

    from shardfeed import Client

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    setup = synthetic_setup(args.binary, 1, args.batch_size, 0)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results: dict[str, list[float]] = {}
    try:
        client = Client(setup["target"])
        for name, augment in _recipes().items():
            batch = next(
                iter(
                    client.batches(
                        setup["dataset"],
                        batch_size=args.batch_size,
                        image_size=224,
                        augment=augment,
                    )
                )
            )
            crops, augmentation = batch.decisions  # type: ignore[misc]
            pixels = torch.from_numpy(batch.images.copy())
            runs: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
                f"{name}/torchvision per sample/cpu": (
                    partial(_per_sample, pixels, batch.ops),
                    _nothing,
                )
            }
            for device in devices:
                sync = torch.cuda.synchronize if device == "cuda" else _nothing
                runs[f"{name}/shardfeed batched/{device}"] = (
                    partial(_batched, pixels.to(device), crops, augmentation),
                    sync,
                )
            for _ in range(args.rounds):
                for label, (run, sync) in runs.items():
                    results.setdefault(label, []).append(_timed(run, sync))
    finally:
        for process in setup["processes"]:
            process.terminate()
            process.wait(timeout=30)
    median = {label: statistics.median(times) * 1000 for label, times in results.items()}
    for label, ms in median.items():
        print(json.dumps({"run": label, "ms_per_batch": round(ms, 2)}), flush=True)
    for name in _recipes():
        base = median[f"{name}/torchvision per sample/cpu"]
        for device in devices:
            ours = median[f"{name}/shardfeed batched/{device}"]
            print(
                json.dumps(
                    {
                        "recipe": name,
                        "device": device,
                        "batch": args.batch_size,
                        "batched_ms": round(ours, 2),
                        "per_sample_torchvision_cpu_ms": round(base, 2),
                        "speedup": round(base / ours, 2),
                    }
                ),
                flush=True,
            )
    return 0


def _nothing() -> None:
    pass


if __name__ == "__main__":
    sys.exit(main())
