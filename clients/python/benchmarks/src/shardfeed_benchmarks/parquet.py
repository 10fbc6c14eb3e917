"""Parquet as the Hugging Face Hub stores images: shardfeed vs the
``datasets`` library, the training recipe delivered into Python.

    SHARDFEED_BIN=target/release/shardfeed python -m shardfeed_benchmarks.parquet

The demo's ~110 KB photos are written as Parquet files in the Hub's layout
(an ``Image`` struct of bytes and path, an int64 label, the class names in
the ``huggingface`` metadata; Snappy, row groups of 100 rows as the Hub
writes images), into ``shardfeed dev-s3`` on loopback with 20 ms to every
GET's first byte, and into a local folder.

- shardfeed: ``Client.batches(augment="train")`` over the files on S3,
  through shared memory;
- datasets: ``load_dataset("parquet", data_files=..., streaming=True)`` over
  the *local* copies (no network at all: the baseline's best case), its
  ``Image`` feature decoding with Pillow, torchvision's RandomResizedCrop +
  flip in ``.map``, into a ``DataLoader`` with one worker per core.

Both turn every sample into a uint8 224x224 crop in a batch of 128; the
contenders run ``--repeats`` times interleaved and the medians are reported
with CPU-seconds per sample (server + this process; workers + this process).
"""

from __future__ import annotations

import importlib
import io
import json
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from .delivered import _process_cpu, _s3_client, synthetic_setup
from .training import (
    Contenders,
    LoaderContender,
    _shard_keys,
    _worker_cpu,
    medians,
    recipe_arguments,
    run_interleaved,
    shardfeed_run,
)

ROWS_PER_GROUP = 100


def hub_files(
    endpoint: str,
    bucket: str,
    keys: list[str],
    files: int,
    directory: Path,
    rows_per_group: int = ROWS_PER_GROUP,
) -> list[Path]:
    """The tar shards' samples as ``files`` Hub-layout Parquet files."""
    # Through importlib: neither ships type information.
    pa: Any = importlib.import_module("pyarrow")
    pq: Any = importlib.import_module("pyarrow.parquet")

    client = _s3_client(endpoint)
    images: list[bytes] = []
    labels: list[int] = []
    for key in keys:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            members = {m.name: m for m in tar.getmembers()}
            for name in sorted(members):
                if name.endswith(".jpg"):
                    stem = name[: -len(".jpg")]
                    image = tar.extractfile(members[name])
                    label = tar.extractfile(members[f"{stem}.cls"])
                    assert image is not None and label is not None
                    images.append(image.read())
                    labels.append(int(label.read()))
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    classes = max(labels) + 1
    features = {
        "image": {"_type": "Image"},
        "label": {"names": [f"c{i}" for i in range(classes)], "_type": "ClassLabel"},
    }
    schema = pa.schema([("image", image_type), ("label", pa.int64())]).with_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})}
    )
    paths = []
    per_file = -(-len(images) // files)
    for f in range(files):
        rows = range(f * per_file, min((f + 1) * per_file, len(images)))
        table = pa.Table.from_arrays(
            [
                pa.array(
                    [{"bytes": images[i], "path": f"{i:07d}.jpg"} for i in rows], type=image_type
                ),
                pa.array([labels[i] for i in rows], pa.int64()),
            ],
            schema=schema,
        )
        path = directory / f"train-{f:05d}-of-{files:05d}.parquet"
        pq.write_table(table, path, row_group_size=rows_per_group, compression="snappy")
        paths.append(path)
    return paths


class _Crop:
    """torchvision's training recipe on one ``datasets`` example (a class,
    not a closure: the DataLoader's workers are spawned)."""

    def __init__(self, size: int) -> None:
        from torchvision.transforms import v2

        self.transform = v2.Compose(
            [
                v2.RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), antialias=True),
                v2.RandomHorizontalFlip(),
                v2.PILToTensor(),
            ]
        )

    def __call__(self, example: dict[str, Any]) -> dict[str, Any]:
        image = example["image"].convert("RGB")
        return {"pixels": self.transform(image), "label": example["label"]}


def largest_row_group_cost(path: Path) -> int:
    """What a reader holds for the file's largest row group, by the
    server's formula: compressed + 2 x uncompressed bytes of its columns."""
    metadata = importlib.import_module("pyarrow.parquet").ParquetFile(path).metadata
    costs = []
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        columns = [group.column(c) for c in range(group.num_columns)]
        compressed = sum(c.total_compressed_size for c in columns)
        uncompressed = sum(c.total_uncompressed_size for c in columns)
        costs.append(int(compressed + 2 * uncompressed))
    return max(costs)


def datasets_loader(files: list[Path], size: int, batch_size: int, workers: int) -> Any:
    """``datasets`` streaming the files with torchvision's training recipe."""
    load_dataset = importlib.import_module("datasets").load_dataset
    data = load_dataset(
        "parquet", data_files=[str(f) for f in files], split="train", streaming=True
    )
    data = data.map(_Crop(size), remove_columns=["image"]).with_format("torch")
    return _DictLoader(data, batch_size, workers)


class _DictLoader(LoaderContender):
    """A LoaderContender whose batches are ``datasets``' dicts."""

    def run(self) -> int:
        samples = checksum = 0
        for batch in self.loader:
            checksum += int(batch["pixels"][0, 0, 0, 0])
            samples += len(batch["label"])
        return samples


def main(argv: list[str] | None = None) -> int:
    args = recipe_arguments(__doc__, argv, get_delay_ms=20)
    socket_dir = tempfile.TemporaryDirectory(prefix="sf-")
    setup = synthetic_setup(
        args.binary,
        args.shards,
        args.samples_per_shard,
        args.get_delay_ms,
        f"{socket_dir.name}/sf.sock",
    )
    try:
        endpoint = setup["endpoint"]
        bucket, keys = _shard_keys(endpoint, setup["dataset"])
        local = tempfile.TemporaryDirectory()
        # One file per DataLoader worker at least: datasets splits by file.
        count = max(args.workers, 4)
        files = hub_files(endpoint, bucket, keys, count, Path(local.name))
        client = _s3_client(endpoint)
        for path in files:
            client.put_object(Bucket=bucket, Key=f"hub/data/{path.name}", Body=path.read_bytes())
        hub = f"s3://{bucket}/hub/data/"
        server_cpu = lambda: _process_cpu(setup["server_pid"])  # noqa: E731
        contenders: Contenders = {
            "shardfeed": (
                lambda: shardfeed_run(
                    setup["target"], hub, args.batch_size, args.image_size, "shared_memory"
                ),
                server_cpu,
            ),
        }
        baseline = datasets_loader(files, args.image_size, args.batch_size, args.workers)
        contenders["datasets"] = (baseline.run, _worker_cpu)
        results = run_interleaved(contenders, args.repeats)
        local.cleanup()
    finally:
        for process in setup["processes"]:
            process.terminate()
            process.wait()
    summary = medians(results)
    ours = summary["shardfeed"]["samples_per_second"]
    theirs = summary["datasets"]["samples_per_second"]
    print(
        f"\nHub-layout Parquet, RandomResizedCrop({args.image_size}) + flip, batch "
        f"{args.batch_size}, {args.workers} cores, median of {args.repeats}:\n"
        f"  shardfeed (S3, {args.get_delay_ms} ms to first byte) {ours:.0f} samples/s, "
        f"{summary['shardfeed']['cpu_ms_per_sample']:.2f} CPU-ms/sample\n"
        f"  datasets streaming (local files) + torchvision {theirs:.0f} samples/s, "
        f"{summary['datasets']['cpu_ms_per_sample']:.2f} CPU-ms/sample\n"
        f"  shardfeed / datasets: {ours / theirs:.2f}x"
    )
    print(json.dumps({"benchmark": "parquet_vs_datasets", **summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
