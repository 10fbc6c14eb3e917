"""PyTorch adapter: a shardfeed stream as an ``IterableDataset`` of batches.

Use it with ``DataLoader(dataset, batch_size=None)``: shardfeed already batches,
decodes and shuffles, so the DataLoader needs no workers.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

from ._client import AugmentSpec, Client, ImageSize


class ShardfeedIterable(IterableDataset):  # type: ignore[misc]
    """Yields ``(images, labels)``: uint8 NHWC and int64 tensors of one batch.

    ``set_epoch(n)`` selects the epoch, like ``DistributedSampler``.
    """

    def __init__(
        self,
        client: Client,
        dataset: str,
        *,
        seed: int = 0,
        batch_size: int = 128,
        image_size: ImageSize = 224,
        rank: int | None = None,
        world_size: int | None = None,
        augment: AugmentSpec = None,
        **options: Any,
    ) -> None:
        self.client = client
        self.dataset = dataset
        self.seed = seed
        self.batch_size = batch_size
        self.image_size = image_size
        self.rank = rank
        self.world_size = world_size
        self.augment = augment
        self.options = options
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.client.describe(
            self.dataset, world_size=self.world_size, batch_size=self.batch_size
        ).batches_per_rank

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in self.client.batches(
            self.dataset,
            seed=self.seed,
            epoch=self.epoch,
            rank=self.rank,
            world_size=self.world_size,
            batch_size=self.batch_size,
            image_size=self.image_size,
            augment=self.augment,
            **self.options,
        ):
            with warnings.catch_warnings():
                # The array views the received message, which is read-only;
                # the tensor is only read (e.g. copied to the GPU).
                warnings.simplefilter("ignore", UserWarning)
                images = torch.from_numpy(batch.images)
            yield images, torch.from_numpy(batch.labels)
