"""The server's substitution, replayed in the trainer's process: which
slot stands in for a sample that did not decode, and the batch's failed
slots filled by that rule."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

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


def substitutions(
    keys: Sequence[str], server: tuple[Sequence[int], Sequence[int]], failed_here: set[int]
) -> list[tuple[int, int | None]]:
    """Each failed slot and the slot standing in for it (None: zeros, no
    sample decoded), by the server's rule. With no failure here the
    server's choices stand (``server``: the slots it substituted and each
    one's source, -1 where none decoded); otherwise every failed slot
    (either side's) is chosen again among the slots that decoded, as the
    server would have had it decoded them all."""
    substituted, sources = server
    if not failed_here:
        return [
            (slot, source if source >= 0 else None) for slot, source in zip(substituted, sources)
        ]
    bad = set(substituted) | failed_here
    good = [slot for slot in range(len(keys)) if slot not in bad]
    return [(slot, substitute_source(keys[slot], good)) for slot in sorted(bad)]


def fill_substitutes(
    out: torch.Tensor,
    labels: torch.Tensor,
    crops: tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]],
    keys: Sequence[str],
    server: tuple[Sequence[int], Sequence[int]],
    failed_here: set[int],
) -> None:
    """Fills the failed slots (image, label, box and flip) by the server's
    rule (:func:`substitutions`)."""
    boxes, flipped = crops
    for slot, chosen in substitutions(keys, server, failed_here):
        if chosen is None:
            out[slot].zero_()
            labels[slot] = -1
            boxes[slot], flipped[slot] = 0, False
        else:
            out[slot] = out[chosen]
            labels[slot] = labels[chosen]
            boxes[slot], flipped[slot] = boxes[chosen], flipped[chosen]


def fill_view_substitutes(
    groups: Sequence[torch.Tensor],
    boxes: Sequence[tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]],
    labels: torch.Tensor,
    keys: Sequence[str],
    server: tuple[Sequence[int], Sequence[int]],
    failed_here: set[int],
) -> None:
    """Fills every view of the failed slots (pixels, box and flip), and
    their labels, by the server's rule: ``groups`` view-major, ``[views ×
    N, H, W, 3]`` each, ``boxes`` each group's rows' boxes and flips."""
    count = len(keys)
    for slot, chosen in substitutions(keys, server, failed_here):
        for group, (crop_boxes, flipped) in zip(groups, boxes):
            for view in range(len(group) // max(count, 1)):
                row = view * count + slot
                if chosen is None:
                    group[row].zero_()
                    crop_boxes[row], flipped[row] = 0, False
                else:
                    source = view * count + chosen
                    group[row] = group[source]
                    crop_boxes[row], flipped[row] = crop_boxes[source], flipped[source]
        labels[slot] = -1 if chosen is None else labels[chosen]
