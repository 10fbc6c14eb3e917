"""The training recipe delivered into Python: shardfeed vs torchvision vs DALI.

    SHARDFEED_BIN=target/release/shardfeed python -m shardfeed_benchmarks.training

Every contender turns the same tar shards of the demo's ~110 KB photos into
uint8 batches of RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3))
+ RandomHorizontalFlip, batch 128, in this process:

- shardfeed: ``Client.batches(augment="train")`` from a ``shardfeed serve``
  on a Unix socket reading ``shardfeed dev-s3`` on loopback, through shared
  memory, and (``sf inline``) with the bytes inline in the gRPC messages;
- torchvision: a ``DataLoader`` with one worker per core, each streaming its
  share of the shards from the same endpoint with boto3, decoding with Pillow
  and applying torchvision's transforms (what a PyTorch user runs today);
- DALI: NVIDIA DALI's CPU pipeline with its fused region decode
  (``fn.readers.webdataset`` over the same shards copied to local files,
  ``fn.decoders.image_random_crop``, ``fn.resize``, ``fn.flip``), one thread
  per core, ``device_id=None``.

The contenders run one after another, ``--repeats`` times interleaved, and
the median of each is reported with CPU-seconds per sample (shardfeed: server
+ this process; torchvision: workers + this process; DALI: this process).
torch, torchvision and nvidia-dali-cuda120 are optional: a contender whose
package is missing is skipped with a note.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import resource
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .delivered import _process_cpu, _s3_client, run_entitlement, synthetic_setup

SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _worker_cpu() -> float:
    """CPU of this process's live children (persistent DataLoader workers)."""
    total = 0.0
    for child in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        for pid in child.read_text().split():
            total += _process_cpu(int(pid))
    return total


def _shard_keys(endpoint: str, dataset: str) -> tuple[str, list[str]]:
    bucket, _, prefix = dataset.removeprefix("s3://").partition("/")
    listed = _s3_client(endpoint).list_objects_v2(Bucket=bucket, Prefix=prefix)
    keys = sorted(
        o["Key"]
        for o in listed.get("Contents", [])
        if o["Key"].endswith(".tar") and "_shardfeed/" not in o["Key"]
    )
    return bucket, keys


def measure(run: Callable[[], int], extra_cpu: Callable[[], float]) -> dict[str, float]:
    """Runs one contender; ``extra_cpu`` reads CPU spent outside this process."""
    cpu_before, extra_before = _cpu_self(), extra_cpu()
    started = time.perf_counter()
    samples = run()
    wall = time.perf_counter() - started
    cpu = _cpu_self() - cpu_before + extra_cpu() - extra_before
    return {
        "samples": samples,
        "samples_per_second": samples / wall,
        "cpu_seconds_per_sample": cpu / max(samples, 1),
    }


def shardfeed_run(
    target: str,
    dataset: str,
    batch_size: int,
    size: int,
    transport: str,
    augment: Literal["train", "eval"] | None = "train",
) -> int:
    from shardfeed import Client

    samples = checksum = 0
    for batch in Client(target).batches(
        dataset,
        batch_size=batch_size,
        image_size=size,
        rank=0,
        world_size=1,
        augment=augment,
        transport=transport,
    ):
        if batch.shared != (transport == "shared_memory"):
            raise RuntimeError(f"asked for {transport}, got shared={batch.shared}")
        checksum += int(batch.images[0, 0, 0, 0])  # touch it, as a trainer would
        samples += len(batch.labels)
    return samples


if TYPE_CHECKING:
    from torch.utils.data import IterableDataset

    _IterableBase = IterableDataset[tuple[Any, int]]
else:
    try:
        from torch.utils.data import IterableDataset as _IterableBase
    except ImportError:  # torch is optional: the contender is skipped
        _IterableBase = object


class _TorchvisionShards(_IterableBase):
    """An IterableDataset streaming tar shards from S3, split among workers."""

    def __init__(self, endpoint: str, bucket: str, keys: list[str], size: int) -> None:
        self.endpoint, self.bucket, self.keys, self.size = endpoint, bucket, keys, size

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        from torchvision.transforms import v2

        # The usual recipe: crop, resize and flip the PIL image, then a tensor.
        transform = v2.Compose(
            [
                v2.RandomResizedCrop(self.size, scale=SCALE, ratio=RATIO, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.PILToTensor(),
            ]
        )
        return worker_shard_samples(self.endpoint, self.bucket, self.keys, transform)


def worker_shard_samples(
    endpoint: str, bucket: str, keys: list[str], transform: Callable[[Any], Any]
) -> Iterator[tuple[Any, int]]:
    """This DataLoader worker's share of the shards, streamed from S3 with
    boto3: each photo decoded with Pillow and given to ``transform``."""
    import torch.utils.data
    from PIL import Image

    info = torch.utils.data.get_worker_info()
    worker, workers = (info.id, info.num_workers) if info else (0, 1)
    client = _s3_client(endpoint)
    for key in keys[worker::workers]:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        with tarfile.open(fileobj=body, mode="r|") as tar:
            label = -1
            image = None
            for member in tar:
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                data = handle.read()
                if member.name.endswith(".jpg"):
                    image = transform(Image.open(io.BytesIO(data)).convert("RGB"))
                elif member.name.endswith(".cls"):
                    label = int(data)
                if image is not None and label >= 0:
                    yield image, label
                    image, label = None, -1


class LoaderContender:
    """A DataLoader over ``dataset``; its workers are started and warmed up
    untimed (persistent workers, as a multi-epoch job runs them), so that
    importing torch in each worker is not charged to the recipe."""

    def __init__(self, dataset: Any, batch_size: int, workers: int, shuffle: bool = False) -> None:
        import torch.utils.data

        self.loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=workers,
            multiprocessing_context="spawn",
            persistent_workers=True,
            drop_last=True,
        )
        self.run()

    def run(self) -> int:
        samples = checksum = 0
        for images, labels in self.loader:
            # Touch it, as a trainer would (a recipe of views: its first view).
            first = images[0] if isinstance(images, list) else images
            checksum += int(first[0, 0, 0, 0])
            samples += len(labels)
        return samples


class DaliContender:
    """A DALI CPU pipeline over local shard files, ``images(fn, types,
    jpegs)`` turning the encoded images into the output; built (and its
    shards indexed) untimed."""

    def __init__(
        self,
        files: list[str],
        batch_size: int,
        threads: int,
        images: Callable[[Any, Any, Any], Any],
    ) -> None:
        # Through importlib: DALI's own annotations do not type its graph API.
        dali: Any = importlib.import_module("nvidia.dali")

        @dali.pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None)  # type: ignore[untyped-decorator]
        def pipeline() -> Any:
            jpegs, labels = dali.fn.readers.webdataset(
                paths=files, ext=["jpg", "cls"], missing_component_behavior="error"
            )
            return images(dali.fn, dali.types, jpegs), labels

        self.batch_size = batch_size
        self.pipe = pipeline()
        self.pipe.build()

    def run(self, samples: int) -> int:
        delivered = checksum = 0
        while delivered + self.batch_size <= samples:
            images, _ = self.pipe.run()
            checksum += int(np.asarray(images.as_tensor())[0, 0, 0, 0])
            delivered += self.batch_size
        return delivered


def dali_train_images(size: int) -> Callable[[Any, Any, Any], Any]:
    """DALI's fused region decode + resize + flip: the training recipe."""

    def images(fn: Any, types: Any, jpegs: Any) -> Any:
        out = fn.decoders.image_random_crop(
            jpegs,
            device="cpu",
            output_type=types.RGB,
            random_area=SCALE,
            random_aspect_ratio=RATIO,
        )
        out = fn.resize(out, size=[size, size], antialias=True)
        return fn.flip(out, horizontal=fn.random.coin_flip(probability=0.5))

    return images


Contenders = dict[str, tuple[Callable[[], int], Callable[[], float]]]


def run_interleaved(contenders: Contenders, repeats: int) -> dict[str, list[dict[str, float]]]:
    """Runs every contender once per repeat, in turn, printing each result."""
    results: dict[str, list[dict[str, float]]] = {}
    for repeat in range(repeats):
        for name, (run, extra) in contenders.items():
            result = measure(run, extra)
            results.setdefault(name, []).append(result)
            print(
                f"repeat {repeat + 1} {name}: {result['samples_per_second']:.0f} samples/s, "
                f"{1e3 * result['cpu_seconds_per_sample']:.2f} CPU-ms/sample",
                flush=True,
            )
    return results


def medians(results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each contender's median rate and CPU cost per sample over its repeats."""
    return {
        name: {
            "samples_per_second": statistics.median(r["samples_per_second"] for r in runs),
            "cpu_ms_per_sample": 1e3 * statistics.median(r["cpu_seconds_per_sample"] for r in runs),
        }
        for name, runs in results.items()
    }


def report(
    title: str,
    results: dict[str, list[dict[str, float]]],
    entitlement: dict[str, Any],
    bench_command: str,
    cores: int,
    notes: list[str],
) -> None:
    """Prints the medians, shardfeed's ratio to each contender and to its
    kernel x cores, then everything as one JSON line."""
    summary = medians(results)
    repeats = min(len(runs) for runs in results.values())
    print(f"\n{title}, {cores} cores, median of {repeats}:")
    ours = summary["shardfeed"]["samples_per_second"]
    for name, figures in summary.items():
        ratio = ours / figures["samples_per_second"]
        print(
            f"  {name:<12} {figures['samples_per_second']:>7.0f} samples/s  "
            f"{figures['cpu_ms_per_sample']:>6.2f} CPU-ms/sample  shardfeed / this: {ratio:.2f}x"
        )
    kernel = entitlement["kernel_samples_per_second_per_thread"]
    print(
        f"  shardfeed without gRPC ({bench_command}): {entitlement['samples_per_second']:.0f} "
        f"samples/s; decode kernel {kernel:.0f}/s per thread; delivered = "
        f"{ours / (kernel * cores):.0%} of kernel x cores ({entitlement['decoder']})"
    )
    for note in notes:
        print(f"  ({note})")
    print(json.dumps({**summary, "entitlement": entitlement}))


def recipe_arguments(
    description: str | None, argv: list[str] | None, get_delay_ms: int = 0
) -> argparse.Namespace:
    """The options every recipe benchmark takes (``get_delay_ms``: the
    default delay of every GET's first byte)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--samples-per-shard", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--get-delay-ms", type=int, default=get_delay_ms)
    return parser.parse_args(argv)


def download_shards(endpoint: str, bucket: str, keys: list[str], directory: str) -> list[str]:
    """Local copies of the shards, for the contenders that read files."""
    client = _s3_client(endpoint)
    files = []
    for key in keys:
        path = Path(directory) / Path(key).name
        path.write_bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        files.append(str(path))
    return files


def shardfeed_contenders(
    setup: dict[str, Any], batch_size: int, size: int, augment: Literal["train", "eval"] | None
) -> Contenders:
    """shardfeed through shared memory and inline, timed with its server's CPU."""
    server_cpu = lambda: _process_cpu(setup["server_pid"])  # noqa: E731
    return {
        name: (
            lambda transport=transport: shardfeed_run(  # type: ignore[misc]
                setup["target"], setup["dataset"], batch_size, size, transport, augment
            ),
            server_cpu,
        )
        for name, transport in (("shardfeed", "shared_memory"), ("sf inline", "inline"))
    }


def main(argv: list[str] | None = None) -> int:
    args = recipe_arguments(__doc__, argv)

    socket_dir = tempfile.TemporaryDirectory(prefix="sf-")
    setup = synthetic_setup(
        args.binary, args.shards, args.samples_per_shard, 0, f"{socket_dir.name}/sf.sock"
    )
    notes: list[str] = []
    try:
        endpoint, dataset = setup["endpoint"], setup["dataset"]
        bucket, keys = _shard_keys(endpoint, dataset)
        total = len(keys) * args.samples_per_shard
        local = tempfile.TemporaryDirectory()
        files = download_shards(endpoint, bucket, keys, local.name)
        contenders = shardfeed_contenders(setup, args.batch_size, args.image_size, "train")
        try:
            import torchvision  # noqa: F401

            torchvision_loader = LoaderContender(
                _TorchvisionShards(endpoint, bucket, keys, args.image_size),
                args.batch_size,
                args.workers,
            )
            contenders["torchvision"] = (torchvision_loader.run, _worker_cpu)
        except ImportError:
            notes.append("torchvision skipped: pip install torch torchvision")
        try:
            import nvidia.dali  # noqa: F401

            dali = DaliContender(
                files, args.batch_size, args.workers, dali_train_images(args.image_size)
            )
            contenders["dali"] = (lambda: dali.run(total), lambda: 0.0)
        except ImportError:
            notes.append("DALI skipped: pip install nvidia-dali-cuda120")
        results = run_interleaved(contenders, args.repeats)
        local.cleanup()
        # The same pipeline without gRPC or Python, and its kernel rate.
        size = args.image_size
        entitlement = run_entitlement(
            args.binary, endpoint, dataset, args.batch_size, size, 0, "--augment", "train"
        )
    finally:
        for process in setup["processes"]:
            process.terminate()
            process.wait()

    report(
        f"RandomResizedCrop({args.image_size}) + flip, batch {args.batch_size}",
        results,
        entitlement,
        "shardfeed bench --augment train",
        args.workers,
        notes,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
