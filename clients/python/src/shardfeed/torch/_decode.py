"""The implementation of :mod:`shardfeed.decode` (its public face): the
encoded deliveries decoded in the trainer's process. See that module's
docstring for what it does and the tolerance it holds to.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import numpy.typing as npt
import torch

from .._modes import FORM_DECODERS, decode_forms
from .._proto import shardfeed_pb2 as pb
from .._resize import Interpolation, crop_resize, crop_resize_batch
from .._wire import Batch, EncodedImages
from ._substitute import fill_substitutes, fill_view_substitutes, substitute_source
from .ops import apply_decisions

__all__ = ["BatchDecoder", "ClientDecoded", "crop_resize", "substitute_source"]

_log = logging.getLogger("shardfeed")

# A decoded batch's images: one tensor, or with views one per group.
Images = Union[torch.Tensor, list[torch.Tensor]]

_INTERPOLATIONS: dict[int, Interpolation] = {
    pb.INTERPOLATION_BILINEAR: "bilinear",
    pb.INTERPOLATION_BICUBIC: "bicubic",
}


def resize_interpolation(augmentation: Any) -> Interpolation:
    """The filter a stream's samples are resized with (bilinear unless its
    reported augmentation names another)."""
    if augmentation is None or not augmentation.HasField("resize_interpolation"):
        return "bilinear"
    value = augmentation.resize_interpolation
    if value not in _INTERPOLATIONS:
        raise ValueError(
            f"the stream resizes with interpolation {value}, which this client's decoder "
            "does not make: upgrade the client"
        )
    return _INTERPOLATIONS[value]


@dataclass
class ClientDecoded:
    """A batch decoded here: ``images`` uint8 ``(N, H, W, 3)`` on the
    decoder's device (with views: one tensor per group, ``[views × N, H,
    W, 3]`` view-major as ``Batch.views``); ``labels`` int64 ``(N,)``,
    ``crop_boxes`` and ``flipped`` as in :class:`shardfeed.Batch` (a
    substituted slot carries its source's; empty with views, whose rows'
    boxes and flips are ``view_boxes``, one pair per group); the slots
    substituted on either side (``substituted``), and those of this
    process's failures (``failed``) with what its decoder said."""

    images: Images
    labels: torch.Tensor
    crop_boxes: npt.NDArray[np.float32]
    flipped: npt.NDArray[np.bool_]
    substituted: list[int]
    failed: list[tuple[int, str]] = field(default_factory=list)
    view_boxes: list[tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]] = field(
        default_factory=list
    )


class BatchDecoder:
    """Decodes encoded batches (``delivery="encoded"``) on ``device``.

    ``client``: where to report decodes and failures (every
    ``report_every`` batches, and at once on a failure); None reports
    nothing (the counts stay in :attr:`decoded` and :attr:`failures`).
    """

    def __init__(
        self,
        device: str | torch.device = "cpu",
        *,
        client: Any = None,
        rank: int = 0,
        report_every: int = 32,
    ) -> None:
        self.device = torch.device(device)
        self._decoders = {form: make(self.device) for form, make in FORM_DECODERS.items()}
        self.client = client
        self.rank = rank
        self.report_every = report_every
        self.decoded = 0
        self.failures = 0
        self._unreported: tuple[int, list[tuple[str, str, str]], int] = (0, [], 0)

    def decode(self, batch: Batch) -> ClientDecoded:
        """One pass down: the batch's parts read once, then its compressed
        samples decoded by form, cropped and resized, the ops replayed, the
        failures substituted by the server's rule and counted. A batch of
        views decodes each compressed sample once and makes every view of
        it from that decode."""
        encoded = batch.encoded
        if encoded is None:
            raise ValueError("the batch was delivered decoded: use batch.images")
        if batch.views:
            return self._decode_views(batch, encoded)
        n = len(batch.keys)
        height, width = encoded.height, encoded.width
        slot_bytes = [encoded.bytes_of(slot) for slot in range(n)]
        keys = batch.keys
        labels = torch.from_numpy(batch.labels.copy())
        boxes, flipped = batch.crop_boxes.copy(), batch.flipped.copy()
        crops, augmentation = batch.decisions or ((), None)
        server_failed = set(batch.substituted)
        server = (batch.substituted, batch.substitute_sources)

        out = torch.empty((n, height, width, 3), dtype=torch.uint8, device=self.device)
        compressed = _compressed(encoded, n, server_failed)
        with warnings.catch_warnings():
            # Received bytes are read-only; nothing here writes to them.
            warnings.simplefilter("ignore", UserWarning)
            for slot in range(n):
                if encoded.decoded[slot] and slot not in server_failed:
                    pixels = torch.from_numpy(slot_bytes[slot])
                    out[slot] = pixels.view(height, width, 3).to(self.device, non_blocking=True)
        decoded_slots, decoded_images, failed = self._decode_compressed(encoded, compressed)
        if decoded_images:
            _make(out, decoded_slots, decoded_images, (boxes, flipped), crops, augmentation)
        fill_substitutes(out, labels, (boxes, flipped), keys, server, {slot for slot, _ in failed})
        return self._settled(batch, out, labels, (boxes, flipped), len(compressed), failed)

    def _decode_views(self, batch: Batch, encoded: EncodedImages) -> ClientDecoded:
        """A batch of views: the server's samples' views as they came, each
        compressed sample decoded once and every view of it cropped,
        resized and given its ops from that decode, into its row."""
        n = len(batch.keys)
        labels = torch.from_numpy(batch.labels.copy())
        server_failed = set(batch.substituted)
        compressed = _compressed(encoded, n, server_failed)
        client_side = set(compressed)
        as_sent = [slot for slot in range(n) if slot not in client_side]
        groups: list[torch.Tensor] = []
        with warnings.catch_warnings():
            # Received bytes are read-only; nothing here writes to them.
            warnings.simplefilter("ignore", UserWarning)
            for group in batch.views:
                pixels = torch.from_numpy(group.images)
                out = torch.empty(pixels.shape, dtype=torch.uint8, device=self.device)
                if len(as_sent) == n:
                    out.copy_(pixels, non_blocking=True)
                elif as_sent:
                    rows = [view * n + slot for view in range(group.count) for slot in as_sent]
                    index = torch.tensor(rows, dtype=torch.long)
                    out[index.to(self.device)] = pixels[index].to(self.device)
                groups.append(out)
        decoded_slots, decoded_images, failed = self._decode_compressed(encoded, compressed)
        if decoded_images:
            for group, out in zip(batch.views, groups):
                crops, augmentations = group.decisions
                boxes = (group.crop_boxes, group.flipped)
                for view, augmentation in enumerate(augmentations):
                    rows = [view * n + slot for slot in decoded_slots]
                    _make(out, rows, decoded_images, boxes, crops, augmentation)
        server = (batch.substituted, batch.substitute_sources)
        view_boxes = [(group.crop_boxes.copy(), group.flipped.copy()) for group in batch.views]
        failed_here = {slot for slot, _ in failed}
        fill_view_substitutes(groups, view_boxes, labels, batch.keys, server, failed_here)
        no_boxes = (batch.crop_boxes, batch.flipped)
        decoded = self._settled(batch, groups, labels, no_boxes, len(compressed), failed)
        decoded.view_boxes = view_boxes
        return decoded

    def _decode_compressed(
        self, encoded: EncodedImages, compressed: list[int]
    ) -> tuple[list[int], list[torch.Tensor], list[tuple[int, str]]]:
        """The compressed slots decoded by form: those that decoded, their
        images (``(3, h, w)`` on the device), and those that failed with
        why (a decode error, or a size other than the header's)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            forms = [int(encoded.forms[slot]) for slot in compressed]
            images, errors = decode_forms(
                self._decoders, forms, [encoded.bytes_of(slot) for slot in compressed]
            )
        failed: list[tuple[int, str]] = []
        decoded_slots: list[int] = []
        decoded_images: list[torch.Tensor] = []
        for slot, image, error in zip(compressed, images, errors):
            expected = (int(encoded.source_sizes[slot][1]), int(encoded.source_sizes[slot][0]))
            if image is not None and tuple(image.shape[1:]) != expected:
                error = f"decoded to {tuple(image.shape[1:])}, its header says {expected}"
            if error is not None or image is None:
                failed.append((slot, error or "no image"))
                continue
            decoded_slots.append(slot)
            decoded_images.append(image)
        return decoded_slots, decoded_images, failed

    def _settled(
        self,
        batch: Batch,
        images: Images,
        labels: torch.Tensor,
        boxes: tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]],
        compressed: int,
        failed: list[tuple[int, str]],
    ) -> ClientDecoded:
        """The decoded batch, its decodes and failures counted and logged."""
        shards = batch.shards
        named = [
            (shards[slot] if slot < len(shards) else "", batch.keys[slot], reason)
            for slot, reason in failed
        ]
        self._count(compressed - len(failed), named)
        substituted = sorted(set(batch.substituted) | {slot for slot, _ in failed})
        return ClientDecoded(images, labels, boxes[0], boxes[1], substituted, failed)

    def _count(self, decoded: int, failed: list[tuple[str, str, str]]) -> None:
        """Counts a batch's decodes and its failures (shard, key, reason),
        logs each failure, and reports when due (at once on a failure)."""
        self.decoded += decoded
        self.failures += len(failed)
        for shard, key, reason in failed:
            _log.warning(
                "substituted a sample this process could not decode: shard %s key %s: %s",
                shard or "?",
                key,
                reason,
            )
        count, failures, batches = self._unreported
        self._unreported = (count + decoded, failures + failed, batches + 1)
        if failed or batches + 1 >= self.report_every:
            self.flush()

    def flush(self) -> None:
        """Reports what is not reported yet to the server."""
        count, failures, batches = self._unreported
        if self.client is None or (count == 0 and not failures):
            return
        self._unreported = (0, [], 0)
        try:
            self.client.report_client_decodes(count, failures, rank=self.rank)
        except Exception as exc:  # the report is best effort: training goes on
            _log.warning("could not report client decodes to the server: %s", exc)


def _compressed(encoded: EncodedImages, count: int, server_failed: set[int]) -> list[int]:
    """The slots sent in a client form for this process to decode (a slot
    the server substituted is filled from its source instead)."""
    return [
        slot for slot in range(count) if not encoded.decoded[slot] and slot not in server_failed
    ]


def _make(
    out: torch.Tensor,
    rows: list[int],
    images: list[torch.Tensor],
    boxes: tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]],
    crops: Any,
    augmentation: Any,
) -> None:
    """``images`` made into ``out[rows]`` as the sidecar makes outputs:
    each cropped to its row's box, resized by the stream's filter and
    mirrored where its row says, then its row's ops applied."""
    crop_boxes, flipped = boxes
    crop_resize_batch(
        images,
        crop_boxes[rows],
        flipped[rows],
        out.shape[1],
        out.shape[2],
        out=out,
        slots=rows,
        interpolation=resize_interpolation(augmentation),
    )
    apply_decisions(out, rows, crops, augmentation)
