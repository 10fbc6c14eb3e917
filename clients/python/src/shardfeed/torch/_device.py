"""Device delivery: a batch's tensors where training wants them.

Views of the received pixels (shared memory or inline), decoded here for
encoded deliveries; on CUDA made ahead of the training loop on a thread of
its own and a side stream, copied out of the shared-memory ring, which is
registered once as pinned memory.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Iterator
from typing import Any, NamedTuple, Union

import numpy as np
import torch

from .._ahead import run_ahead
from .._client import Client
from .._wire import Batch

_log = logging.getLogger("shardfeed")


# A batch's images: one tensor, or with views one per group.
Images = Union[torch.Tensor, list[torch.Tensor]]


def images_to(images: Images, device: torch.device, non_blocking: bool = False) -> Images:
    """``images`` (one tensor, or a group's each) on ``device``."""
    if isinstance(images, list):
        return [group.to(device, non_blocking=non_blocking) for group in images]
    return images.to(device, non_blocking=non_blocking)


class Delivered(NamedTuple):
    """A batch as the dataset yields it: images and labels where training
    wants them, and what substitution decided (on either side)."""

    batch: Batch
    images: Images
    labels: torch.Tensor
    crop_boxes: Any
    flipped: Any
    substituted: list[int]


def materialize(batch: Batch, decoder: Any) -> Delivered:
    """A batch's tensors: views of the received pixels, or decoded by
    ``decoder`` (a BatchDecoder)."""
    if decoder is None:
        with warnings.catch_warnings():
            # Received batches are read-only; torch warns about writes that
            # would be undefined. Training reads them (e.g. copies to the GPU).
            warnings.simplefilter("ignore", UserWarning)
            images: Images = torch.from_numpy(batch.images)
            if batch.views:
                images = [torch.from_numpy(group.images) for group in batch.views]
        return Delivered(
            batch,
            images,
            torch.from_numpy(batch.labels),
            batch.crop_boxes,
            batch.flipped,
            batch.substituted,
        )
    decoded = decoder.decode(batch)
    return Delivered(
        batch,
        decoded.images,
        decoded.labels,
        decoded.crop_boxes,
        decoded.flipped,
        decoded.substituted,
    )


def ready_on(device: torch.device, delivered: Delivered, done: Any) -> Delivered:
    """A batch made on a side stream, handed to the training stream: its
    work is ordered before the training stream's next, and the caching
    allocator must not reuse its memory before that stream is done."""
    current = torch.cuda.current_stream(device)
    current.wait_event(done)
    for images in delivered.images if isinstance(delivered.images, list) else [delivered.images]:
        images.record_stream(current)
    delivered.labels.record_stream(current)
    return delivered


def without_host_views(batch: Batch) -> Batch:
    """``batch`` without its views of the received bytes: a shared-memory
    slot goes back to the server when its last view is dropped, and the
    device holds the pixels now."""
    images = np.empty((0, *batch.images.shape[1:]), dtype=np.uint8)
    encoded = batch.encoded
    if encoded is not None:
        encoded = dataclasses.replace(encoded, data=np.empty(0, dtype=np.uint8))
    views = [
        dataclasses.replace(group, images=np.empty((0, *group.images.shape[1:]), dtype=np.uint8))
        for group in batch.views
    ]
    return dataclasses.replace(batch, images=images, encoded=encoded, views=views)


class CudaHostPinning:
    """Page-locks a stream's shared-memory ring for CUDA once, when it is
    mapped (``cudaHostRegister``, read-only: the mapping is), so each
    batch's host-to-device copy is a DMA on a side stream rather than a
    staged, synchronous copy; a registration the driver refuses leaves the
    copies staged, as without it."""

    _READ_ONLY = 0x08  # cudaHostRegisterReadOnly

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def register(self, address: int, size: int) -> bool:
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        with torch.cuda.device(self.device):
            error = int(cudart.cudaHostRegister(address, size, self._READ_ONLY))
        if error != 0:
            global _pin_refused_logged
            if not _pin_refused_logged:
                _pin_refused_logged = True
                _log.info(
                    "CUDA refused to register the shared-memory ring (error %d): "
                    "host-to-device copies are staged",
                    error,
                )
            return False
        return True

    def unregister(self, address: int) -> None:
        torch.cuda.cudart().cudaHostUnregister(address)  # type: ignore[no-untyped-call]


_pin_refused_logged = False


def mask(size: int, slots: list[int]) -> torch.Tensor:
    mask = torch.zeros(size, dtype=torch.bool)
    mask[slots] = True
    return mask


# Batches made ahead of the training loop on CUDA: the one it trains on
# while the next is made and this many wait (device memory: that many
# batches of pixels and labels more than the loop's own).
CUDA_BATCHES_AHEAD = 2


def on_device(
    batches: Iterator[Batch],
    *,
    decode: str,
    device: torch.device | None,
    client: Client,
    rank: int,
) -> Iterator[Delivered]:
    """Each batch with its images and labels on ``device``, decoded here
    for ``decode="client"``/``"gpu"``. On CUDA, a thread of its own makes
    the batches ahead of the training loop (receive, decode, copy) on a
    side stream, out of the shared-memory ring registered once as pinned
    memory."""
    if device is not None and device.type == "cuda" and device.index is None:
        # The producer's thread starts on CUDA's default device, not the one
        # this thread chose (torch.cuda.set_device is per thread).
        device = torch.device("cuda", torch.cuda.current_device())
    decoder = None
    if decode != "server":
        from ._decode import BatchDecoder

        decoder = BatchDecoder(device or "cpu", client=client, rank=rank)
    if device is not None and device.type == "cuda":
        made = made_on_cuda(batches, decoder, device)
        ahead = run_ahead(made, CUDA_BATCHES_AHEAD, name=f"shardfeed-cuda-rank{rank}")
        try:
            for delivered, done in ahead:
                yield ready_on(device, delivered, done)
        finally:
            ahead.close()
        return
    try:
        for batch in batches:
            delivered = materialize(batch, decoder)
            if device is not None:
                delivered = delivered._replace(
                    images=images_to(delivered.images, device), labels=delivered.labels.to(device)
                )
            yield delivered
    finally:
        if decoder is not None:
            decoder.flush()


def made_on_cuda(
    batches: Iterator[Batch], decoder: Any, device: torch.device
) -> Iterator[tuple[Delivered, Any]]:
    """Each batch decoded (``decoder``) and copied on a side stream, with
    the event its work ends at. Runs on the producer's thread: it waits for
    that work itself, since the copies read the server's ring and the slot
    goes back when the host views are dropped, here."""
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    try:
        for batch in batches:
            with torch.cuda.device(device), torch.cuda.stream(side):
                delivered = materialize(batch, decoder)
                delivered = delivered._replace(
                    images=images_to(delivered.images, device, non_blocking=True),
                    labels=delivered.labels.to(device, non_blocking=True),
                )
                done = torch.cuda.Event()  # type: ignore[no-untyped-call]
                done.record(side)
            done.synchronize()
            yield delivered._replace(batch=without_host_views(batch)), done
    finally:
        if decoder is not None:
            decoder.flush()
