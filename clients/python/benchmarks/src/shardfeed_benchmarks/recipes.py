"""The recipes' ops delivered into Python: shardfeed against torchvision's
reference pipeline on the same cores.

    python -m shardfeed_benchmarks.recipes --binary target/release/shardfeed

The baseline is torchvision's reference training pipeline as its
``references/classification`` scripts build it: ``ImageFolder`` over the
same JPEGs on local disk (the page cache: no S3 in its way), the PIL
backend, ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip`` +
``TrivialAugmentWide(interpolation=BILINEAR)`` + ``PILToTensor`` +
``ToDtype(float32, scale=True)`` + ``Normalize`` + ``RandomErasing(0.1)`` in
``DataLoader`` workers, one per core. shardfeed reads the same photos as tar
shards from its S3 stand-in, applies the same recipe in the sidecar and
delivers ``uint8`` batches; its second figure adds the trainer's normalize
to float32 NCHW on this process's CPU (a GPU trainer does it on the GPU).
Both crop + flip alone for reference. Rounds alternate; the median of each
is printed as JSON lines and a ratio.

``--recipe deit`` runs DeiT's instead, as timm builds it and its users run
it: ``timm.data.create_transform(224, is_training=True,
auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic", re_prob=0.25,
re_mode="pixel")`` in the same ``ImageFolder`` + ``DataLoader``, against
the sidecar serving ``from_torchvision`` of that same transform (bicubic
crop + flip alone for reference).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from .delivered import _s3_client, synthetic_setup

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _image_folder(endpoint: str, root: Path) -> int:
    """The dataset's tar shards unpacked into class folders."""
    s3 = _s3_client(endpoint)
    count = 0
    listed = s3.list_objects_v2(Bucket="demo", Prefix="photos/")
    for entry in listed.get("Contents", []):
        if not entry["Key"].endswith(".tar"):
            continue
        body = s3.get_object(Bucket="demo", Key=entry["Key"])["Body"].read()
        members: dict[str, dict[str, bytes]] = {}
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                stem, _, ext = member.name.rpartition(".")
                members.setdefault(stem, {})[ext] = handle.read()
        for stem, files in members.items():
            if "jpg" not in files:
                continue
            label = files.get("cls", b"0").decode().strip()
            folder = root / f"class{int(label):04d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{Path(stem).name}.jpg").write_bytes(files["jpg"])
            count += 1
    return count


def _baseline_transform(recipe: str, augmented: bool) -> Any:
    import torch
    from torchvision.transforms import InterpolationMode, v2

    if recipe == "deit":
        from timm.data.transforms_factory import create_transform

        _posterize_zero_bits_as_black()

        extra: dict[str, Any] = (
            dict(auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, re_mode="pixel")
            if augmented
            else dict(color_jitter=None)
        )
        return create_transform(224, is_training=True, interpolation="bicubic", **extra)
    steps: list[Any] = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
    if augmented:
        steps.append(v2.TrivialAugmentWide(interpolation=InterpolationMode.BILINEAR))
    steps += [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    if augmented:
        steps.append(v2.RandomErasing(0.1))
    return v2.Compose(steps)


def _posterize_zero_bits_as_black() -> None:
    """timm's PosterizeIncreasing at magnitude 10 keeps 0 bits, which
    Pillow 13 refuses (``ValueError`` in a loader worker stops the run);
    Pillow's mask made it black before, and the sidecar serves that. The
    baseline gets the same, so that it runs at all."""
    from PIL import Image, ImageOps

    posterize = ImageOps.posterize
    if getattr(posterize, "zero_bits_as_black", False):
        return

    def patched(image: Any, bits: int) -> Any:
        if bits == 0:
            return Image.new(image.mode, image.size, 0)
        return posterize(image, bits)

    patched.zero_bits_as_black = True  # type: ignore[attr-defined]
    ImageOps.posterize = patched


def _augment(recipe: str, augmented: bool) -> Any:
    from shardfeed import Augment, RandomErasing, TrivialAugmentWide, from_torchvision

    if recipe == "deit":
        return from_torchvision(_baseline_transform(recipe, augmented))
    if augmented:
        return Augment.train(
            auto_augment=TrivialAugmentWide(interpolation="bilinear"),
            random_erasing=RandomErasing(0.1),
        )
    return Augment.train()


def _torchvision_rate(
    root: Path, recipe: str, augmented: bool, batch_size: int, workers: int
) -> float:
    import torch
    from torchvision import datasets

    dataset = datasets.ImageFolder(str(root), transform=_baseline_transform(recipe, augmented))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True
    )
    started = time.perf_counter()
    samples = 0
    for images, _labels in loader:
        samples += len(images)
    return samples / (time.perf_counter() - started)


def _shardfeed_rate(
    target: str,
    dataset: str,
    recipe: str,
    augmented: bool,
    batch_size: int,
    normalize: bool,
    epoch: int,
) -> float:
    from shardfeed import Client

    augment = _augment(recipe, augmented)
    if normalize:
        import torch

        mean = torch.tensor(MEAN).view(1, 3, 1, 1) * 255
        std = torch.tensor(STD).view(1, 3, 1, 1) * 255
    client = Client(target)
    started = time.perf_counter()
    samples = 0
    for batch in client.batches(
        dataset, batch_size=batch_size, image_size=224, augment=augment, epoch=epoch
    ):
        if normalize:
            images = torch.from_numpy(batch.images).permute(0, 3, 1, 2).float()
            images.sub_(mean).div_(std)
        samples += len(batch.labels)
    return samples / (time.perf_counter() - started)


_NAMES = {"trivial": "trivial_augment+erasing", "deit": "timm_rand_m9_mstd0.5_inc1+erasing"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--per-shard", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--recipe", choices=sorted(_NAMES), default="trivial")
    args = parser.parse_args(argv)
    names = {True: _NAMES[args.recipe], False: "crop+flip"}
    setup = synthetic_setup(args.binary, args.shards, args.per_shard, 0)
    results: dict[str, list[float]] = {}
    try:
        with tempfile.TemporaryDirectory() as folder:
            images = _image_folder(setup["endpoint"], Path(folder))
            print(json.dumps({"images": images, "cores": os.cpu_count()}), flush=True)
            for round_index in range(args.rounds):
                for augmented in (True, False):
                    name = names[augmented]
                    feed = (
                        setup["target"],
                        setup["dataset"],
                        args.recipe,
                        augmented,
                        args.batch_size,
                    )
                    runs = {
                        f"torchvision/{name}": partial(
                            _torchvision_rate,
                            Path(folder),
                            args.recipe,
                            augmented,
                            args.batch_size,
                            args.workers,
                        ),
                        f"shardfeed/{name}": partial(_shardfeed_rate, *feed, False, round_index),
                        f"shardfeed+normalize/{name}": partial(
                            _shardfeed_rate, *feed, True, round_index
                        ),
                    }
                    for label, run in runs.items():
                        rate = run()
                        results.setdefault(label, []).append(rate)
                        print(
                            json.dumps({"round": round_index, "run": label, "samples_per_s": rate}),
                            flush=True,
                        )
    finally:
        for process in setup["processes"]:
            process.terminate()
            process.wait(timeout=30)
    median = {label: statistics.median(rates) for label, rates in results.items()}
    for name in names.values():
        base = median[f"torchvision/{name}"]
        print(
            json.dumps(
                {
                    "recipe": name,
                    "torchvision_samples_per_s": base,
                    "shardfeed_samples_per_s": median[f"shardfeed/{name}"],
                    "shardfeed_normalized_samples_per_s": median[f"shardfeed+normalize/{name}"],
                    "ratio": median[f"shardfeed/{name}"] / base,
                    "ratio_normalized": median[f"shardfeed+normalize/{name}"] / base,
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
