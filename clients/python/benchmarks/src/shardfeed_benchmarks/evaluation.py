"""The evaluation recipe delivered into Python: shardfeed vs the S3 Connector
for PyTorch and DALI.

    SHARDFEED_BIN=target/release/shardfeed python -m shardfeed_benchmarks.evaluation

Every contender turns the same tar shards of the demo's ~110 KB photos into
uint8 batches of 224x224 (shorter side scaled to 224, center crop), batch
128, in this process:

- ``shardfeed``: ``Client.batches()`` from a ``shardfeed serve`` on a Unix
  socket reading ``shardfeed dev-s3`` on loopback, through shared memory;
  ``sf inline``: the same with the bytes inline in the gRPC messages;
- ``s3 connector``: the S3 Connector for PyTorch's ``S3IterableDataset``
  over the same shards on the same endpoint (``enable_sharding``: each
  DataLoader worker streams its share), each shard read as a tar stream and
  decoded with Pillow, in a ``DataLoader`` with one worker per core;
- ``dali``: NVIDIA DALI's CPU evaluation pipeline over the same shards from
  local files (``fn.readers.webdataset`` -> ``fn.decoders.image`` ->
  ``fn.resize(resize_shorter=224, antialias=True)`` -> ``fn.crop``), one
  thread per core, ``device_id=None``.

Contenders run one after another, ``--repeats`` times interleaved; the median
of each is reported with CPU-seconds per sample (shardfeed: server + this
process; S3 Connector: workers + this process; DALI: this process), and the
single-thread decode kernel rate of ``shardfeed bench`` on the same data, so
shardfeed's figure reads as a fraction of kernel x cores. torch,
s3torchconnector and nvidia-dali-cuda120 are optional: a contender whose
package is missing is skipped with a note.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from .delivered import (
    ACCESS_KEY,
    SECRET_KEY,
    _decode,
    run_entitlement,
    synthetic_setup,
)
from .training import (
    DaliContender,
    LoaderContender,
    _IterableBase,
    _shard_keys,
    _worker_cpu,
    download_shards,
    recipe_arguments,
    report,
    run_interleaved,
    shardfeed_contenders,
)


class _ConnectorTarSamples(_IterableBase):
    """Samples of the tar shards the S3 Connector hands this worker."""

    def __init__(self, endpoint: str, dataset: str, size: int) -> None:
        self.endpoint, self.dataset, self.size = endpoint, dataset, size

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        import torch
        from s3torchconnector import S3ClientConfig, S3IterableDataset

        shards = S3IterableDataset.from_prefix(
            self.dataset,
            region="us-east-1",
            endpoint=self.endpoint,
            s3client_config=S3ClientConfig(force_path_style=True),
            enable_sharding=True,
        )
        for reader in shards:
            if not reader.key.endswith(".tar") or "_shardfeed/" in reader.key:
                continue
            image: Any = None
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for member in tar:
                    handle = tar.extractfile(member)
                    if handle is None:
                        continue
                    if member.name.endswith(".jpg"):
                        image = torch.from_numpy(_decode(handle.read(), self.size, draft=False))
                    elif member.name.endswith(".cls") and image is not None:
                        yield image, int(handle.read())
                        image = None


def dali_eval_images(size: int) -> Callable[[Any, Any, Any], Any]:
    """DALI's evaluation steps: decode, shorter side to ``size``, center crop."""

    def images(fn: Any, types: Any, jpegs: Any) -> Any:
        out = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        out = fn.resize(out, resize_shorter=size, antialias=True)
        return fn.crop(out, crop=[size, size])

    return images


def main(argv: list[str] | None = None) -> int:
    args = recipe_arguments(__doc__, argv)

    socket_dir = tempfile.TemporaryDirectory(prefix="sf-")
    setup = synthetic_setup(
        args.binary, args.shards, args.samples_per_shard, 0, f"{socket_dir.name}/sf.sock"
    )
    notes: list[str] = []
    size = args.image_size
    try:
        endpoint, dataset = setup["endpoint"], setup["dataset"]
        bucket, keys = _shard_keys(endpoint, dataset)
        total = len(keys) * args.samples_per_shard
        contenders = shardfeed_contenders(setup, args.batch_size, size, None)
        try:
            import s3torchconnector  # noqa: F401
            import torch  # noqa: F401

            os.environ.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            connector = LoaderContender(
                _ConnectorTarSamples(endpoint, dataset, size), args.batch_size, args.workers
            )
            contenders["s3 connector"] = (connector.run, _worker_cpu)
        except ImportError:
            notes.append("S3 Connector skipped: pip install torch s3torchconnector")
        local = tempfile.TemporaryDirectory()
        try:
            import nvidia.dali  # noqa: F401

            files = download_shards(endpoint, bucket, keys, local.name)
            dali = DaliContender(files, args.batch_size, args.workers, dali_eval_images(size))
            contenders["dali"] = (lambda: dali.run(total), lambda: 0.0)
        except ImportError:
            notes.append("DALI skipped: pip install nvidia-dali-cuda120")
        results = run_interleaved(contenders, args.repeats)
        local.cleanup()
        entitlement = run_entitlement(args.binary, endpoint, dataset, args.batch_size, size, 0)
    finally:
        for process in setup["processes"]:
            process.terminate()
            process.wait()

    report(
        f"center crop {size} (shorter side to {size}), batch {args.batch_size}",
        results,
        entitlement,
        "shardfeed bench",
        args.workers,
        notes,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
