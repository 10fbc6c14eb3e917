"""Several views of one sample: the sidecar's decode-once views against the
recipes' own Python pipelines, CPU per sample on one core, in one run.

    cargo build --release --features turbojpeg --example views_cost
    python -m shardfeed_benchmarks.views --example target/release/examples/views_cost

The baselines are the pipelines as their repositories write them, on PIL
(what their DataLoader workers run): DINOv2's ``DataAugmentationDINO``
(each photo opened and decoded once, then 2 global crops at 224² and 8
local crops at 96², each with its flip, ColorJitter, grayscale, blur,
solarize, ``ToTensor`` and ``Normalize``) and SimCLR's two views of one
pipeline. The sidecar's side is ``examples/views_cost`` on the same JPEG
files (it writes them), its rows ``dinov2 2 global + 8 local`` and
``simclr 2 views``: decode, crops, resizes and ops, uint8 out (a trainer
normalizes on its GPU). Both on one thread; rounds alternate, medians are
printed as JSON lines with the ratio (Python's ms per sample over the
sidecar's: the samples/s one core gives more).

This is the library's decode against the Python pipelines on one core;
``shardfeed_benchmarks.views_delivered`` measures the delivered stream.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
ROWS = {"dinov2": "dinov2 2 global + 8 local", "simclr": "simclr 2 views"}


def dinov2_transforms() -> dict[str, Any]:
    """DINOv2's ``DataAugmentationDINO`` with its published defaults
    (dinov2/data/augmentations.py: global crops 224, scale 0.32-1; 8 local
    crops 96, scale 0.05-0.32), written out as ``views_from_torchvision``
    takes them; its ``GaussianBlur(p)`` is a ``RandomApply`` of
    torchvision's blur, kernel 9, sigma 0.1-2."""
    from torchvision import transforms as T

    def blur(p: float) -> Any:
        return T.RandomApply([T.GaussianBlur(kernel_size=9, sigma=(0.1, 2.0))], p=p)

    def geometric(size: int, scale: tuple[float, float]) -> Any:
        bicubic = T.InterpolationMode.BICUBIC
        return T.Compose(
            [
                T.RandomResizedCrop(size, scale=scale, interpolation=bicubic),
                T.RandomHorizontalFlip(),
            ]
        )

    jitter = T.Compose(
        [
            T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
            T.RandomGrayscale(p=0.2),
        ]
    )
    normalize = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    first = T.Compose([geometric(224, (0.32, 1.0)), jitter, blur(1.0), normalize])
    second = T.Compose(
        [
            geometric(224, (0.32, 1.0)),
            jitter,
            T.Compose([blur(0.1), T.RandomSolarize(threshold=128, p=0.2)]),
            normalize,
        ]
    )
    local = T.Compose([geometric(96, (0.05, 0.32)), jitter, blur(0.5), normalize])
    return {"global": [first, second], "local": (local, 8)}


def dinov2_views() -> Any:
    """Every view of one decoded image, as ``DataAugmentationDINO`` makes them."""
    groups = dinov2_transforms()
    (first, second), (local, count) = groups["global"], groups["local"]

    def views(image: Any) -> list[Any]:
        return [first(image), second(image)] + [local(image) for _ in range(count)]

    return views


def simclr_transform() -> Any:
    """SimCLR's one pipeline (blur kernel ~10% of 224)."""
    from torchvision import transforms as T

    return T.Compose(
        [
            T.RandomResizedCrop(224),
            T.RandomHorizontalFlip(),
            T.RandomApply([T.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8),
            T.RandomGrayscale(p=0.2),
            T.RandomApply([T.GaussianBlur(kernel_size=23, sigma=(0.1, 2.0))], p=0.5),
            T.ToTensor(),
        ]
    )


def simclr_views() -> Any:
    """SimCLR's two views of one pipeline."""
    pipeline = simclr_transform()

    def views(image: Any) -> list[Any]:
        return [pipeline(image), pipeline(image)]

    return views


def python_ms_per_sample(photos: list[Path], views: Any) -> float:
    """One pass: each photo opened and decoded once, its views made."""
    from PIL import Image

    started = time.perf_counter()
    for path in photos:
        with Image.open(path) as opened:
            image = opened.convert("RGB")
        views(image)
    return (time.perf_counter() - started) * 1e3 / len(photos)


def sidecar_ms_per_sample(example: str, folder: Path) -> dict[str, float]:
    """One round of ``views_cost`` on the folder's photos: its rows' ms."""
    output = subprocess.run(
        [example, "1", str(folder)], check=True, capture_output=True, text=True
    ).stdout
    found: dict[str, float] = {}
    for name, row in ROWS.items():
        match = re.search(rf"^{re.escape(row)}\s+([0-9.]+) ms/sample", output, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"views_cost printed no {row!r} row:\n{output}")
        found[name] = float(match.group(1))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--example", default="target/release/examples/views_cost")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    pipelines = {"dinov2": dinov2_views(), "simclr": simclr_views()}
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "photos"
        # The first call writes the photos both sides then read.
        sidecar_ms_per_sample(args.example, folder)
        photos = sorted(folder.glob("*.jpg"))
        for round_index in range(args.rounds):
            sidecar = sidecar_ms_per_sample(args.example, folder)
            for name, pipeline in pipelines.items():
                python = python_ms_per_sample(photos, pipeline)
                results.setdefault(f"python/{name}", []).append(python)
                results.setdefault(f"sidecar/{name}", []).append(sidecar[name])
                print(
                    json.dumps(
                        {
                            "round": round_index,
                            "recipe": name,
                            "python_ms_per_sample": python,
                            "sidecar_ms_per_sample": sidecar[name],
                        }
                    ),
                    flush=True,
                )
    for name in pipelines:
        python_ms = statistics.median(results[f"python/{name}"])
        sidecar_ms = statistics.median(results[f"sidecar/{name}"])
        print(
            json.dumps(
                {
                    "recipe": name,
                    "photos": len(photos),
                    "python_ms_per_sample": python_ms,
                    "sidecar_ms_per_sample": sidecar_ms,
                    "ratio": python_ms / sidecar_ms,
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
