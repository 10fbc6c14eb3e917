"""What a ``ShardfeedDataset`` yields: ``(images, labels)``, or with
``output="dict"`` everything a batch carries."""

from __future__ import annotations

from typing import Any, TypedDict, Union

import torch

from ._device import mask


class BatchDict(TypedDict):
    """One batch with ``output="dict"`` (see :class:`ShardfeedDataset`)."""

    images: torch.Tensor
    labels: torch.Tensor
    keys: list[str]
    shards: list[str]
    crop_boxes: torch.Tensor
    flipped: torch.Tensor
    substituted: torch.Tensor
    padded: torch.Tensor
    fields: dict[str, list[bytes | None]]
    sources: torch.Tensor
    source_epochs: torch.Tensor
    copies: torch.Tensor
    epoch: int
    index: int


Sample = Union[tuple[torch.Tensor, torch.Tensor], BatchDict]


def as_dict(
    batch: Any,
    images: torch.Tensor,
    labels: torch.Tensor,
    crop_boxes: Any,
    flipped: Any,
    substituted: Any,
) -> BatchDict:
    return {
        "images": images,
        "labels": labels,
        "keys": batch.keys,
        "shards": batch.shards,
        "crop_boxes": torch.from_numpy(crop_boxes),
        "flipped": torch.from_numpy(flipped),
        "substituted": mask(len(batch.keys), substituted),
        "padded": mask(len(batch.keys), batch.padded),
        "fields": batch.fields,
        "sources": torch.tensor(batch.sources, dtype=torch.int64),
        "source_epochs": torch.tensor(batch.source_epochs, dtype=torch.int64),
        "copies": torch.tensor(batch.copies or [0] * len(batch.keys), dtype=torch.int64),
        "epoch": batch.epoch,
        "index": batch.index,
    }
