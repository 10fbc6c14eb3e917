"""PyTorch adapter: a shardfeed stream as a resumable ``IterableDataset``.

shardfeed already shuffles, decodes, augments and batches in the sidecar, so
the dataset yields whole batches: use ``DataLoader(ds, batch_size=None)``
with ``num_workers=0`` (the default). See :class:`ShardfeedDataset`.
"""

from __future__ import annotations

import mmap
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ._client import (
    AugmentSpec,
    Client,
    EpochPosition,
    ImageSize,
    distributed_rank_and_world,
)

__all__ = ["ShardfeedDataset"]

_LAYOUTS = ("NHWC", "NCHW")
_STATE_VERSION = 1
# The chart sets this in the trainer container (the sidecar's Unix socket).
TARGET_ENV = "SHARDFEED_TARGET"
_DEFAULT_TARGET = "127.0.0.1:50051"


class ShardfeedDataset(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """This rank's batches of one epoch as ``(images, labels)`` tensors.

    ``images`` is uint8 ``(N, H, W, 3)`` for ``layout="NHWC"``, or the same
    memory seen as ``(N, 3, H, W)`` for ``layout="NCHW"`` (a
    ``torch.channels_last`` tensor: no copy is made either way; call
    ``.contiguous()`` if a model needs NCHW-contiguous input). ``labels`` is
    int64 ``(N,)``. Both are views of the received batch: with shared memory
    (the default over a ``unix:`` target) of the server's slot, which is
    reused only once every view of it is gone.

    ``target`` defaults to ``$SHARDFEED_TARGET`` (the chart sets it), else
    ``127.0.0.1:50051``. ``rank`` / ``world_size`` default to
    ``torch.distributed`` when initialized, else ``RANK`` / ``WORLD_SIZE``,
    read when iterating, not when constructed. Other keyword arguments
    (``shuffle``, ``partition``, ``shuffle_buffer``, ``interleave``,
    ``transport`` ...) go to :meth:`shardfeed.Client.batches`.

    ``set_epoch(e)`` selects the epoch (a fresh order and fresh augmentation
    each epoch). ``len()`` is the epoch's batches per rank, asked of the
    server once per (world size, batch size). ``state_dict()`` records the
    epoch and the position of the last batch handed out;
    ``load_state_dict()`` makes the next iteration of that epoch resume right
    after it, also at another world size with the same global batch
    (``world_size * batch_size``).

    Workers: the sidecar does the work DataLoader workers would, so
    ``num_workers=0`` is the intended use. ``num_workers=1`` works (the
    stream is received in the worker process) but its progress is invisible
    to this process, so ``state_dict()`` refuses then; more workers are
    refused, since each would receive the same batches.
    """

    def __init__(
        self,
        dataset: str,
        *,
        target: str | None = None,
        client: Client | None = None,
        batch_size: int = 128,
        image_size: ImageSize = 224,
        seed: int = 0,
        augment: AugmentSpec = None,
        layout: str = "NHWC",
        rank: int | None = None,
        world_size: int | None = None,
        partition: str = "drop_last",
        **options: Any,
    ) -> None:
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, not {layout!r}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, not {batch_size}")
        if client is not None and target is not None:
            raise ValueError("pass target or client, not both")
        if client is None:
            client = Client(target or os.environ.get(TARGET_ENV) or _DEFAULT_TARGET)
        # The client opens its channel lazily, once per process: a dataset
        # made before DataLoader forks its workers is usable in each of them.
        self.client = client
        self.dataset = dataset
        self.batch_size = batch_size
        self.image_size = image_size
        self.seed = seed
        self.augment = augment
        self.layout = layout
        self.rank = rank
        self.world_size = world_size
        self.partition = partition
        self.options = options
        self._epoch = 0
        # Where the current epoch stands in this process: the position of the
        # last batch handed out (or the one loaded, before any).
        self._position = EpochPosition()
        # Set by load_state_dict, used by the next iteration of its epoch.
        self._resume: EpochPosition | None = None
        self._lengths: dict[tuple[int, int, str], int] = {}
        self._worker_flag = _SharedFlag()

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration streams. Setting the epoch a
        loaded state is in keeps its resume position."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        if epoch != self._epoch:
            self._epoch = epoch
            self._position = EpochPosition()
            self._resume = None

    def _rank_and_world(self) -> tuple[int, int]:
        default_rank, default_world = distributed_rank_and_world()
        rank = default_rank if self.rank is None else self.rank
        world = default_world if self.world_size is None else self.world_size
        return rank, world

    def __len__(self) -> int:
        _, world = self._rank_and_world()
        key = (world, self.batch_size, self.partition)
        if key not in self._lengths:
            info = self.client.describe(
                self.dataset,
                world_size=world,
                batch_size=self.batch_size,
                partition=self.partition,
            )
            self._lengths[key] = info.batches_per_rank
        return self._lengths[key]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        worker = get_worker_info()
        if worker is not None:
            if worker.num_workers > 1:
                raise ValueError(
                    f"ShardfeedDataset in DataLoader(num_workers={worker.num_workers}): every "
                    "worker would receive the same batches. The sidecar already decodes and "
                    "batches in parallel; use num_workers=0 (or 1 to receive in a background "
                    "process)."
                )
            self._worker_flag.set()
        rank, world = self._rank_and_world()
        # A loaded position stays loaded until the resumed stream delivers:
        # an attempt that fails before its first batch, retried, must not
        # restart the epoch at batch 0.
        resume = self._resume
        self._position = resume or EpochPosition()
        batches = self.client.batches(
            self.dataset,
            seed=self.seed,
            epoch=self._epoch,
            rank=rank,
            world_size=world,
            batch_size=self.batch_size,
            image_size=self.image_size,
            augment=self.augment,
            partition=self.partition,
            resume_from=resume,
            **self.options,
        )
        for batch in batches:
            self._resume = None
            with warnings.catch_warnings():
                # Received batches are read-only; torch warns about writes that
                # would be undefined. Training reads them (e.g. copies to the GPU).
                warnings.simplefilter("ignore", UserWarning)
                images = torch.from_numpy(batch.images)
            if self.layout == "NCHW":
                images = images.permute(0, 3, 1, 2)
            self._position = batch.position
            yield images, torch.from_numpy(batch.labels)
        # Resumed at the epoch's end: nothing was left, the position is spent.
        self._resume = None

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the position of the last batch handed out, as plain
        values for a checkpoint."""
        if self._worker_flag.is_set():
            raise RuntimeError(
                "ShardfeedDataset was iterated in a DataLoader worker, whose progress this "
                "process cannot see: use num_workers=0 to checkpoint mid-epoch"
            )
        position = self._resume if self._resume is not None else self._position
        return {
            "version": _STATE_VERSION,
            "dataset": self.dataset,
            "seed": self.seed,
            "epoch": self._epoch,
            "global_batch": self._global_batch(),
            "position": position.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict`: the next iteration of its epoch
        continues after the last batch it recorded, at this job's world size
        (which may differ, if ``world_size * batch_size`` does not)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported ShardfeedDataset state version {state.get('version')!r}")
        for name in ("dataset", "seed"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"the state is of {name}={state[name]!r}, this dataset has "
                    f"{name}={getattr(self, name)!r}: its position means nothing here"
                )
        position = EpochPosition.from_dict(state["position"])
        global_batch = self._global_batch()
        if position.segments and state["global_batch"] != global_batch:
            raise ValueError(
                f"the state was saved mid-epoch with a global batch (world_size x batch_size) "
                f"of {state['global_batch']}; this job's is {global_batch}. Resume mid-epoch "
                "with the same global batch, or start the next epoch."
            )
        self._epoch = int(state["epoch"])
        self._position = position
        self._resume = position if position.segments else None

    def _global_batch(self) -> int:
        return self._rank_and_world()[1] * self.batch_size

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # An anonymous mapping does not pickle; a spawned worker gets its own.
        state["_worker_flag"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._worker_flag is None:
            self._worker_flag = _SharedFlag()


class _SharedFlag:
    """One byte in anonymous shared memory: set in a forked DataLoader worker,
    seen by the process that made the dataset."""

    def __init__(self) -> None:
        self._page = mmap.mmap(-1, mmap.PAGESIZE)

    def set(self) -> None:
        self._page[0] = 1

    def is_set(self) -> bool:
        return self._page[0] == 1
