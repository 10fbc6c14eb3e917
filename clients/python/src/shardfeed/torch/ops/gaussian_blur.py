"""GaussianBlur: each sample that drew it blurred with its own sigma, as
torchvision's ``gaussian_blur`` blurs a ``uint8`` image (a float32 kernel
from the softmax of the squared taps, the image reflect-padded by half the
kernel, the sum rounded), all of them in one grouped convolution with a
kernel per sample.

The padding reflects again past the far edge, as the server's does
(``src/decode/augment/kernels/blur.rs``), so an image narrower than half
the kernel is blurred where torch's own reflect padding would refuse it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

NAME = "gaussian_blur"


def _taps(side: int, sigmas: torch.Tensor) -> torch.Tensor:
    """Per sigma, torchvision's 1-D kernel of ``side`` taps (float32)."""
    limit = (side - 1) / (2.0 * math.sqrt(2.0))
    x = torch.linspace(-limit, limit, steps=side, dtype=torch.float32, device=sigmas.device)
    return torch.softmax(x[None, :].div(sigmas[:, None]).pow(2).neg(), dim=1)


def _reflected(length: int, pad: int, device: torch.device) -> torch.Tensor:
    """Indices of ``length`` values read through ``pad`` of reflect padding
    on each side (no edge repeated; periodic past one reflection)."""
    index = torch.arange(-pad, length + pad, device=device)
    if length == 1:
        return torch.zeros_like(index)
    period = 2 * (length - 1)
    index = index.remainder(period)
    return torch.where(index < length, index, period - index)


def apply(images: torch.Tensor, crops: Any, augmentation: Any) -> None:
    rows = [row for row, crop in enumerate(crops) if crop.HasField("blur_sigma")]
    if not rows:
        return
    blur = augmentation.gaussian_blur
    kernel_width, kernel_height = int(blur.kernel_width), int(blur.kernel_height)
    device = images.device
    index = torch.tensor(rows, dtype=torch.long, device=device)
    sigmas = torch.tensor(
        [crops[row].blur_sigma for row in rows], dtype=torch.float32, device=device
    )
    # torchvision's 2-D kernel: the vertical taps' outer product with the
    # horizontal ones, one per sample, the same for its three channels.
    kernel = _taps(kernel_height, sigmas)[:, :, None] * _taps(kernel_width, sigmas)[:, None, :]
    count, channels, height, width = len(rows), images.shape[1], images.shape[2], images.shape[3]
    weights = kernel[:, None].expand(count, channels, kernel_height, kernel_width)
    chosen = images[index].to(torch.float32)
    padded = chosen.index_select(2, _reflected(height, kernel_height // 2, device))
    padded = padded.index_select(3, _reflected(width, kernel_width // 2, device))
    blurred = torch.nn.functional.conv2d(
        padded.reshape(1, count * channels, padded.shape[2], padded.shape[3]),
        weights.reshape(count * channels, 1, kernel_height, kernel_width),
        groups=count * channels,
    )
    images[index] = blurred.reshape(count, channels, height, width).round_().to(torch.uint8)
