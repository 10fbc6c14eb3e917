"""The geometric kernels of torchvision's tensor ops (``affine`` and
``rotate`` with ``expand=False``), batched with a matrix per sample: each
output pixel's centre is mapped back through the sample's inverse affine
matrix and sampled with ``grid_sample`` (nearest or bilinear, corners not
aligned, zeros or the fill colour outside), then rounded to ``uint8``, as
torchvision does for one image. Rotations by multiples of 90 degrees take
torchvision's exact transposes instead, where it takes them."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from ._batched import groups

Matrices = npt.NDArray[np.float64]


def inverse_matrices(
    center: tuple[float, float],
    angle: npt.NDArray[np.float64],
    translate: npt.NDArray[np.float64],
    shear: npt.NDArray[np.float64],
) -> Matrices:
    """``(N, 6)`` inverse matrices of rotation by ``angle`` and shears
    ``shear[:, 0]``/``shear[:, 1]`` (degrees) about ``center`` (relative to
    the image's centre), after a translation: torchvision's
    ``_get_inverse_affine_matrix`` at scale 1, for every sample at once."""
    rotation = np.radians(angle)
    shear_x, shear_y = np.radians(shear[:, 0]), np.radians(shear[:, 1])
    cx, cy = center
    # The forward rotation-shear [[a, b], [c, d]] has determinant 1, so its
    # inverse is [[d, -b], [-c, a]].
    a = np.cos(rotation - shear_y) / np.cos(shear_y)
    b = -(a * np.tan(shear_x) + np.sin(rotation))
    c = np.sin(rotation - shear_y) / np.cos(shear_y)
    d = np.cos(rotation) - c * np.tan(shear_x)
    moved_x, moved_y = cx + translate[:, 0], cy + translate[:, 1]
    out = np.empty((len(angle), 6), dtype=np.float64)
    out[:, 0], out[:, 1], out[:, 3], out[:, 4] = d, -b, -c, a
    out[:, 2] = cx - d * moved_x + b * moved_y
    out[:, 5] = cy + c * moved_x - a * moved_y
    return out


def warp(
    images: torch.Tensor, matrices: Matrices, bilinear: bool, fill: list[float] | None
) -> torch.Tensor:
    """Samples each image ``(N, 3, H, W)`` through its inverse matrix."""
    count = images.shape[0]
    height, width = images.shape[-2:]
    device = images.device
    theta = torch.as_tensor(matrices, dtype=torch.float32, device=device).view(count, 2, 3)
    base = torch.empty(1, height, width, 3, dtype=torch.float32, device=device)
    base[..., 0].copy_(
        torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width, device=device)
    )
    base[..., 1].copy_(
        torch.linspace(
            (1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height, device=device
        ).unsqueeze(-1)
    )
    base[..., 2].fill_(1)
    # The grid is normalized after the matrix applies, by the input's size.
    scale = torch.tensor([0.5 * width, 0.5 * height], dtype=torch.float32, device=device)
    rescaled = theta.transpose(1, 2).div(scale)
    grid = base.view(1, height * width, 3).expand(count, -1, -1).bmm(rescaled)
    grid = grid.view(count, height, width, 2)
    pixels = images.float()
    if fill is not None:
        # A channel of ones, sampled alike, says how much of each output
        # came from inside the image.
        inside = torch.ones((count, 1, height, width), dtype=torch.float32, device=device)
        pixels = torch.cat((pixels, inside), dim=1)
    mode = "bilinear" if bilinear else "nearest"
    pixels = torch.nn.functional.grid_sample(
        pixels, grid, mode=mode, padding_mode="zeros", align_corners=False
    )
    if fill is not None:
        pixels, inside = torch.tensor_split(pixels, indices=(-1,), dim=-3)
        inside = inside.expand_as(pixels)
        colour = torch.tensor(fill, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        if bilinear:
            pixels = pixels.sub_(colour).mul_(inside).add_(colour)
        else:
            pixels = torch.where(inside < 0.5, colour.expand_as(pixels), pixels)
    return pixels.round_().to(torch.uint8)


def _zeros(count: int) -> npt.NDArray[np.float64]:
    return np.zeros((count, 2), dtype=np.float64)


def _on_axis(values: npt.NDArray[np.float64], axis: int) -> npt.NDArray[np.float64]:
    """``(N, 2)`` pairs holding ``values`` on ``axis`` (0: x) and 0 on the other."""
    pairs = _zeros(len(values))
    pairs[:, axis] = values
    return pairs


def shear(
    images: torch.Tensor,
    magnitudes: npt.NDArray[np.float64],
    axis: int,
    bilinear: bool,
    fill: list[float] | None,
) -> torch.Tensor:
    """The policies' shear: ``atan(magnitude)`` in degrees along ``axis``
    (0: x), about the top-left corner."""
    height, width = images.shape[-2:]
    count = len(magnitudes)
    angles = _on_axis(np.degrees(np.arctan(magnitudes)), axis)
    corner = (-width * 0.5, -height * 0.5)
    matrices = inverse_matrices(corner, np.zeros(count), _zeros(count), angles)
    return warp(images, matrices, bilinear, fill)


def translate(
    images: torch.Tensor,
    magnitudes: npt.NDArray[np.float64],
    axis: int,
    bilinear: bool,
    fill: list[float] | None,
) -> torch.Tensor:
    """The policies' translation by ``int(magnitude)`` pixels (truncated)."""
    count = len(magnitudes)
    offsets = _on_axis(np.trunc(magnitudes), axis)
    matrices = inverse_matrices((0.0, 0.0), np.zeros(count), offsets, _zeros(count))
    return warp(images, matrices, bilinear, fill)


def rotate(
    images: torch.Tensor,
    angles: npt.NDArray[np.float64],
    bilinear: bool,
    fill: list[float] | None,
) -> torch.Tensor:
    """Counter-clockwise by ``angle`` degrees about the centre, the output
    the input's size."""
    height, width = images.shape[-2:]
    turned = np.mod(angles, 360.0)
    quarter = {0.0: 0, 180.0: 2}
    if height == width:
        quarter.update({90.0: 1, 270.0: 3})
    kinds: list[int] = [quarter.get(float(a), -1) for a in turned]
    out = torch.empty_like(images)
    for turns, rows in groups(kinds):
        index = torch.tensor(rows, dtype=torch.long, device=images.device)
        if turns == -1:
            count = len(rows)
            matrices = inverse_matrices((0.0, 0.0), -turned[rows], _zeros(count), _zeros(count))
            out[index] = warp(images[index], matrices, bilinear, fill)
        else:
            out[index] = torch.rot90(images[index], k=kinds[rows[0]], dims=(-2, -1))
    return out
