"""Device delivery: a batch's tensors where training wants them.

Views of the received pixels (shared memory or inline), decoded here for
encoded deliveries, and on CUDA copied on a side stream one batch ahead of
the training loop out of the shared-memory ring, which is registered once
as pinned memory.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from .._client import Client
from .._wire import Batch

_log = logging.getLogger("shardfeed")


class Delivered(NamedTuple):
    """A batch as the dataset yields it: images and labels where training
    wants them, and what substitution decided (on either side)."""

    batch: Batch
    images: torch.Tensor
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
            images = torch.from_numpy(batch.images)
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
    """A batch made on the side stream, handed to the training stream."""
    # Its copies read the server's ring asynchronously (pinned): the slot
    # goes back to the server when the host views are dropped, which may be
    # as soon as the trainer moves on, so they must be done by then. They
    # were queued a batch ago, so this rarely waits.
    done.synchronize()
    current = torch.cuda.current_stream(device)
    current.wait_event(done)
    # The caching allocator must not reuse their memory before the
    # training stream is done with them.
    delivered.images.record_stream(current)
    delivered.labels.record_stream(current)
    return delivered


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


def on_device(
    batches: Iterator[Batch],
    *,
    decode: str,
    device: torch.device | None,
    client: Client,
    rank: int,
) -> Iterator[Delivered]:
    """Each batch with its images and labels on ``device``, decoded here
    for ``decode="client"``/``"gpu"``. On CUDA, copies (and GPU decodes)
    run on a side stream one batch ahead of the training loop, out of
    the shared-memory ring registered once as pinned memory."""
    decoder = None
    if decode != "server":
        from ..decode import BatchDecoder

        decoder = BatchDecoder(device or "cpu", client=client, rank=rank)
    try:
        if device is None or device.type != "cuda":
            for batch in batches:
                delivered = materialize(batch, decoder)
                if device is not None:
                    delivered = delivered._replace(
                        images=delivered.images.to(device), labels=delivered.labels.to(device)
                    )
                yield delivered
            return
        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        pending: tuple[Delivered, Any] | None = None
        for batch in batches:
            with torch.cuda.stream(side):
                delivered = materialize(batch, decoder)
                delivered = delivered._replace(
                    images=delivered.images.to(device, non_blocking=True),
                    labels=delivered.labels.to(device, non_blocking=True),
                )
                done = torch.cuda.Event()  # type: ignore[no-untyped-call]
                done.record(side)
            if pending is not None:
                yield ready_on(device, *pending)
            pending = (delivered, done)
        if pending is not None:
            yield ready_on(device, *pending)
    finally:
        if decoder is not None:
            decoder.flush()
