"""The implementation of :mod:`shardfeed.decode` (its public face): the
encoded deliveries decoded in the trainer's process. See that module's
docstring for what it does and the tolerance it holds to.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from .._modes import FORM_DECODERS, form_name
from .._resize import crop_resize, crop_resize_batch
from .._wire import Batch, EncodedImages
from .ops import apply_decisions

__all__ = ["BatchDecoder", "ClientDecoded", "crop_resize", "substitute_source"]

_log = logging.getLogger("shardfeed")

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1


def _fmix64(value: int) -> int:
    value ^= value >> 33
    value = (value * 0xFF51AFD7ED558CCD) & _MASK
    value ^= value >> 33
    value = (value * 0xC4CEB9FE1A85EC53) & _MASK
    return value ^ (value >> 33)


def substitute_source(key: str, good: Sequence[int]) -> int | None:
    """The slot standing in for the failed sample ``key`` among a batch's
    ``good`` slots: the server's rule (FNV-1a of the key, MurmurHash3's
    finalizer, modulo), so either side substitutes alike."""
    if not good:
        return None
    value = _FNV_OFFSET
    for byte in key.encode():
        value = ((value ^ byte) * _FNV_PRIME) & _MASK
    return good[_fmix64(value) % len(good)]


@dataclass
class ClientDecoded:
    """A batch decoded here: ``images`` uint8 ``(N, H, W, 3)`` on the
    decoder's device; ``labels`` int64 ``(N,)``, ``crop_boxes`` and
    ``flipped`` as in :class:`shardfeed.Batch` (a substituted slot carries
    its source's); the slots substituted on either side (``substituted``),
    and those of this process's failures (``failed``) with what its decoder
    said."""

    images: torch.Tensor
    labels: torch.Tensor
    crop_boxes: npt.NDArray[np.float32]
    flipped: npt.NDArray[np.bool_]
    substituted: list[int]
    failed: list[tuple[int, str]] = field(default_factory=list)


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
        encoded = batch.encoded
        if encoded is None:
            raise ValueError("the batch was delivered decoded: use batch.images")
        n = len(batch.keys)
        height, width = encoded.height, encoded.width
        out = torch.empty((n, height, width, 3), dtype=torch.uint8, device=self.device)
        labels = torch.from_numpy(batch.labels.copy())
        boxes, flipped = batch.crop_boxes.copy(), batch.flipped.copy()
        server_failed = set(batch.substituted)
        compressed = [
            slot for slot in range(n) if not encoded.decoded[slot] and slot not in server_failed
        ]
        with warnings.catch_warnings():
            # Received bytes are read-only; nothing here writes to them.
            warnings.simplefilter("ignore", UserWarning)
            for slot in range(n):
                if encoded.decoded[slot] and slot not in server_failed:
                    pixels = torch.from_numpy(encoded.bytes_of(slot))
                    out[slot] = pixels.view(height, width, 3).to(self.device, non_blocking=True)
            images, errors = self._decode_forms(encoded, compressed)
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
        if decoded_images:
            crop_resize_batch(
                decoded_images,
                batch.crop_boxes[decoded_slots],
                batch.flipped[decoded_slots],
                height,
                width,
                out=out,
                slots=decoded_slots,
            )
            crops, augmentation = batch.decisions or ((), None)
            apply_decisions(out, decoded_slots, crops, augmentation)
        self._substitute(batch, out, labels, (boxes, flipped), server_failed, failed)
        self._count(batch, len(compressed) - len(failed), failed)
        substituted = sorted(server_failed | {slot for slot, _ in failed})
        return ClientDecoded(out, labels, boxes, flipped, substituted, failed)

    def _decode_forms(
        self, encoded: EncodedImages, slots: list[int]
    ) -> tuple[list[torch.Tensor | None], list[str | None]]:
        """Decodes each slot with its form's decoder, one batched call per
        form in the batch; a form this client has no decoder for fails its
        samples (they are substituted and reported like any failure)."""
        images: list[torch.Tensor | None] = [None] * len(slots)
        errors: list[str | None] = [None] * len(slots)
        by_form: dict[int, list[int]] = {}
        for index, slot in enumerate(slots):
            by_form.setdefault(int(encoded.forms[slot]), []).append(index)
        for form, indices in by_form.items():
            decoder = self._decoders.get(form)
            if decoder is None:
                for index in indices:
                    errors[index] = f"{form_name(form)}: this client has no decoder for it"
                continue
            got, why = decoder([encoded.bytes_of(slots[index]) for index in indices])
            for index, image, error in zip(indices, got, why):
                images[index], errors[index] = image, error
        return images, errors

    @staticmethod
    def _substitute(
        batch: Batch,
        out: torch.Tensor,
        labels: torch.Tensor,
        crops: tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]],
        server_failed: set[int],
        failed: list[tuple[int, str]],
    ) -> None:
        """Fills the failed slots by the server's rule. With no failure here
        the server's choices stand; otherwise every failed slot (either
        side's) is chosen again among the slots that decoded, as the server
        would have had it decoded them all."""
        if not failed:
            for slot, source in zip(batch.substituted, batch.substitute_sources):
                if source >= 0:
                    out[slot] = out[source]
                else:
                    out[slot].zero_()
            return
        boxes, flipped = crops
        bad = server_failed | {slot for slot, _ in failed}
        good = [slot for slot in range(len(batch.keys)) if slot not in bad]
        for slot in sorted(bad):
            chosen = substitute_source(batch.keys[slot], good)
            if chosen is None:
                out[slot].zero_()
                labels[slot] = -1
                boxes[slot], flipped[slot] = 0, False
            else:
                out[slot] = out[chosen]
                labels[slot] = labels[chosen]
                boxes[slot], flipped[slot] = boxes[chosen], flipped[chosen]

    def _count(self, batch: Batch, decoded: int, failed: list[tuple[int, str]]) -> None:
        self.decoded += decoded
        self.failures += len(failed)
        for slot, reason in failed:
            _log.warning(
                "substituted a sample this process could not decode: shard %s key %s: %s",
                batch.shards[slot] if slot < len(batch.shards) else "?",
                batch.keys[slot],
                reason,
            )
        count, failures, batches = self._unreported
        failures = failures + [
            (batch.shards[slot] if slot < len(batch.shards) else "", batch.keys[slot], reason)
            for slot, reason in failed
        ]
        self._unreported = (count + decoded, failures, batches + 1)
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
