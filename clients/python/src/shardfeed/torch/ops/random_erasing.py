"""RandomErasing as the server reports it: per sample, the erased box and
the seed of its noise. The boxes of a batch are written in one scatter:
every erased value's sample, channel, row and column laid end to end, so
the work is the erased area's, whatever the boxes' sizes.

The values: the stream's colour; Normalize's mean (0 after it); or, for
``"random"``, per-value N(0, 1) after Normalize, drawn as the server draws
them (Box-Muller over SplitMix64 of the box's seed, value ``i`` of the box
from outputs ``2i + 1`` and ``2i + 2``, channel-first), here in int64
arithmetic on the batch's device: multiplication wraps as uint64's does,
and each right shift is masked to be a logical one."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..._ops import SPLITMIX_GAMMA, SPLITMIX_MULTIPLIERS

NAME = "random_erasing"

_GOLDEN_GAMMA = SPLITMIX_GAMMA
_MIX = SPLITMIX_MULTIPLIERS


def _signed(value: int) -> int:
    """A uint64 constant as the int64 of the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(values: torch.Tensor, bits: int) -> torch.Tensor:
    return (values >> bits) & ((1 << (64 - bits)) - 1)


def _mixed(values: torch.Tensor) -> torch.Tensor:
    values = (values ^ _shift_right(values, 30)) * _signed(_MIX[0])
    values = (values ^ _shift_right(values, 27)) * _signed(_MIX[1])
    return values ^ _shift_right(values, 31)


def normals(seeds: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """float64 N(0, 1) for value ``index`` of the box of ``seed`` (int64
    tensors of the same shape)."""
    gamma = _signed(_GOLDEN_GAMMA)
    first = seeds + (2 * index + 1) * gamma
    second = seeds + (2 * index + 2) * gamma
    u1 = (_shift_right(_mixed(first), 11) + 1).double() * 2.0**-53
    u2 = _shift_right(_mixed(second), 11).double() * 2.0**-53
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


def _levels(normalized: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``uint8`` of ``mean + std * z`` (Normalize's inverse), rounded half
    up and clamped."""
    return torch.floor((mean + std * normalized) * 255.0 + 0.5).clamp_(0, 255).to(torch.uint8)


def apply(images: torch.Tensor, crops: Any, augmentation: Any) -> None:
    if not augmentation.HasField("random_erasing"):
        return
    rows = [row for row, crop in enumerate(crops) if crop.HasField("erased")]
    if not rows:
        return
    settings = augmentation.random_erasing
    device = images.device
    erased = [crops[row].erased for row in rows]
    boxes = torch.tensor(
        [(box.top, box.left, box.height, box.width) for box in erased],
        dtype=torch.long,
        device=device,
    )
    top, left, height, width = boxes.unbind(dim=1)
    plane = height * width
    counts = 3 * plane
    box = torch.repeat_interleave(torch.arange(len(rows), device=device), counts)
    starts = torch.cumsum(counts, 0) - counts
    index = torch.arange(box.numel(), device=device) - starts[box]
    channel = index // plane[box]
    within = index % plane[box]
    y = top[box] + within // width[box]
    x = left[box] + within % width[box]
    # float32 constants widened, as the server holds them.
    mean = torch.tensor(list(settings.normalize_mean), dtype=torch.float32).double().to(device)
    std = torch.tensor(list(settings.normalize_std), dtype=torch.float32).double().to(device)
    value = settings.WhichOneof("value")
    if value == "colour":
        colour = torch.tensor(list(settings.colour.levels), dtype=torch.uint8, device=device)
        levels = colour[channel]
    elif value == "random":
        seeds = torch.tensor(
            [_signed(box.noise) for box in erased], dtype=torch.long, device=device
        )
        levels = _levels(normals(seeds[box], index), mean[channel], std[channel])
    else:
        levels = _levels(torch.zeros_like(mean), mean, std)[channel]
    sample = torch.tensor(rows, dtype=torch.long, device=device)[box]
    images[sample, channel, y, x] = levels
