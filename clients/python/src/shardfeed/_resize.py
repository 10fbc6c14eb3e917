"""The server's crop and resize, for a whole batch at once on the decoder's
device.

The filter is the server's: a separable triangle (bilinear) or cubic
(bicubic, Pillow's and the server's a = -0.5) filter whose support widens
with the downscale factor, so it antialiases, reading the pixels just
outside the box at its edges. Per image it is two matrix
products over the window the filter reads; here the windows of many images
are padded into one tensor and the weights of all of them are built on the
device from a handful of numbers per image, so a batch costs one small
host-to-device copy, one window copy per image and one pair of batched
products per chunk, with no per-image host arrays and nothing that waits for
the device.

The arithmetic is Pillow's fixed point: weights worked out in float64 as
Pillow works them out, rounded to integers of 2**22 a unit, the horizontal
pass first, rounded to 8 bits before the vertical one. Every product and
sum is then an integer below 2**31, which float64 holds exactly, so the
result cannot depend on the order a matrix product adds in: not on the
other images of the batch, the chunking, the padding, the GPU's kernels,
nor global precision settings (TF32, reduced-precision reductions), none of
which touch float64. So an image's pixels depend on the image alone, the
same at any world size. (Pillow itself picks the order of its passes by
version and shape, so ``method="pillow"`` may differ from these by a level.)

Memory: the padded windows are ``count x 3 x rows x cols`` float64
elements, where rows and cols are the largest window's in the chunk.
Images are taken largest window first and a chunk closes before its padded
windows would pass ``max_window_pixels`` (per channel), so a batch holding
one 48-Mpx photo pads only that photo's chunk to its size. The peak is
``3 x 8 bytes x max(max_window_pixels, the largest single window)`` for the
windows, plus the first pass's ``count x 3 x rows x out_width`` and the
weights' ``count x out x window`` (float64 each), and the decoded images.

:func:`crop_resize` is the per-image float32 reference the batched path is
tested against (within one level).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["crop_resize", "crop_resize_batch", "MAX_WINDOW_PIXELS", "Interpolation", "Method"]

# "matmul": the batched products (any device); "pillow": Pillow's resize,
# image by image (CPU); "auto": the faster one for the images' device.
Method = Literal["auto", "matmul", "pillow"]

# The resize's filter, as a stream's `resize_interpolation` names it.
Interpolation = Literal["bilinear", "bicubic"]

# Each filter's support (in source pixels at no downscale) and Pillow's
# enum for it.
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}
_PILLOW_FILTER = {"bilinear": "BILINEAR", "bicubic": "BICUBIC"}
# Pillow's bicubic: Keys' cubic with a = -0.5 (Catmull-Rom).
_CUBIC_A = -0.5


def _filter(x: Any, interpolation: Interpolation) -> Any:
    """The filter's weight at distance ``x`` (numpy or torch, any sign),
    operation for operation as Pillow's ``bilinear_filter`` and
    ``bicubic_filter``, 0 past the support."""
    x = abs(x)
    if interpolation == "bilinear":
        return (x < 1.0) * (1.0 - x)
    near = ((_CUBIC_A + 2.0) * x - (_CUBIC_A + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * _CUBIC_A
    return (x < 1.0) * near + ((x >= 1.0) & (x < 2.0)) * far


# Padded window pixels (per channel) in one chunk: 8 Mpx, 192 MiB of
# float64 windows. ~45 windows of a ~500x375 photo fit in one chunk; a
# multi-megapixel photo gets a chunk of its own.
MAX_WINDOW_PIXELS = 1 << 23

# Pillow's fixed point for 8-bit images: weights of 2**22 a unit; a sum is
# rounded by adding half a unit and dropping the fraction.
_PRECISION_BITS = 22
_UNIT = float(1 << _PRECISION_BITS)
_HALF_UNIT = float(1 << (_PRECISION_BITS - 1))


def _weights(
    start: float, length: float, out_size: int, full: int, interpolation: Interpolation
) -> tuple[int, npt.NDArray[Any]]:
    """Resampling weights along one axis: the first source index the filter
    reads and an ``(out_size, window)`` matrix over the window it reads."""
    scale = length / out_size
    filter_scale = max(scale, 1.0)
    support = _SUPPORT[interpolation] * filter_scale
    centers = start + (np.arange(out_size) + 0.5) * scale
    low = max(int(np.floor(centers[0] - support)), 0)
    high = min(int(np.ceil(centers[-1] + support)), full)
    positions = np.arange(low, high) + 0.5
    weights = _filter((positions[None, :] - centers[:, None]) / filter_scale, interpolation)
    totals = weights.sum(axis=1, keepdims=True)
    np.divide(weights, totals, out=weights, where=totals > 0)
    return low, weights.astype(np.float32)


def crop_resize(
    image: torch.Tensor,
    box: Sequence[float],
    flipped: bool,
    height: int,
    width: int,
    interpolation: Interpolation = "bilinear",
) -> torch.Tensor:
    """``image`` (uint8 ``(3, h, w)``) cropped to ``box`` (left, top,
    width, height in its pixels), resized to ``height`` x ``width`` with the
    server's filter and mirrored when ``flipped``: uint8 ``(height, width,
    3)`` on the image's device. One image at a time, in float32: the
    reference for :func:`crop_resize_batch`."""
    left, top, box_width, box_height = (float(v) for v in box)
    _, rows, cols = image.shape
    y0, wy = _weights(top, box_height, height, rows, interpolation)
    x0, wx = _weights(left, box_width, width, cols, interpolation)
    device = image.device
    window = image[:, y0 : y0 + wy.shape[1], x0 : x0 + wx.shape[1]].float()
    vertical = torch.from_numpy(wy).to(device)
    horizontal = torch.from_numpy(wx).to(device)
    # Pillow's order, clipped to 8 bits between the passes (the cubic's
    # lobes overshoot, and where the clip falls matters; its rounding there
    # is within the level this reference is held to).
    across = torch.matmul(window, horizontal.T).clamp_(0, 255)
    out = torch.matmul(vertical, across)
    pixels = out.round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0)
    return pixels.flip(1) if flipped else pixels


def _crop_resize_pillow(
    image: torch.Tensor,
    box: Sequence[float],
    flipped: bool,
    height: int,
    width: int,
    interpolation: Interpolation,
) -> torch.Tensor:
    """:func:`crop_resize` by Pillow (its ``resize(box=...)`` is the same
    filter, in fixed point, rounding between passes as the server does): an
    image costs its taps, not a dense product over its window, which on CPU
    is several times faster."""
    from PIL import Image

    _, rows, cols = image.shape
    left, top, box_width, box_height = (float(v) for v in box)
    # Pillow refuses a box past the image by a float32 rounding's width.
    left, top = min(max(left, 0.0), cols), min(max(top, 0.0), rows)
    right, bottom = min(left + box_width, cols), min(top + box_height, rows)
    # Only the window the filter reads goes to Pillow (a pixel past its
    # taps each way, so no tap is clipped that the whole image would not
    # clip): several views of one decode each copy their window, not the
    # image. Shifting the box by whole pixels moves no weight.
    y0, y1 = _window(top, bottom, height, rows, interpolation)
    x0, x1 = _window(left, right, width, cols, interpolation)
    window = image[:, y0:y1, x0:x1].permute(1, 2, 0).contiguous().numpy()
    picture = Image.fromarray(window, mode="RGB")
    rows = y1 - y0
    left, right, top, bottom = left - x0, right - x0, top - y0, bottom - y0
    resample = getattr(Image.Resampling, _PILLOW_FILTER[interpolation])
    if interpolation == "bilinear":
        resized = picture.resize((width, height), resample, box=(left, top, right, bottom))
    else:
        # Pillow picks its passes' order by shape; the server runs the
        # horizontal one first and clips to 8 bits between, which the
        # cubic's overshoot makes matter (by up to ~20 levels at an edge):
        # two calls of one pass each, in the server's order.
        across = picture.resize((width, rows), resample, box=(left, 0, right, rows))
        resized = across.resize((width, height), resample, box=(0, top, width, bottom))
    if flipped:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(resized))


def _window(
    begin: float, end: float, out_size: int, full: int, interpolation: Interpolation
) -> tuple[int, int]:
    """The source pixels one axis's pass reads for the box ``begin..end``,
    a pixel to spare each way, within ``0..full``."""
    support = _SUPPORT[interpolation] * max((end - begin) / out_size, 1.0)
    low = max(int(np.floor(begin - support)) - 1, 0)
    high = min(int(np.ceil(end + support)) + 1, full)
    return low, max(high, low + 1)


@dataclass(frozen=True)
class _Axis:
    """Per image, along one axis (host numbers): where the box begins and
    how long it is as Pillow reads them (float32 edges, their difference
    taken in float32), the image's extent, the window the filter reads (its
    first index and length) and the most taps one output reads (Pillow's
    ``ksize``)."""

    begin: npt.NDArray[np.float64]
    span: npt.NDArray[np.float64]
    full: npt.NDArray[np.int64]
    low: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    taps: npt.NDArray[np.int64]


def _axis(
    begin: npt.NDArray[np.float64],
    length: npt.NDArray[np.float64],
    out_size: int,
    full: npt.NDArray[np.int64],
    filter_support: float,
) -> _Axis:
    """Every image's window along one axis (on the host, a few numbers per
    image); the box clamped as :func:`_crop_resize_pillow` clamps it and
    rounded to float32 as Pillow takes it, so both read the same edges."""
    begin = np.minimum(np.maximum(begin, 0.0), full)
    end = np.minimum(begin + length, full)
    begin32, end32 = begin.astype(np.float32), end.astype(np.float32)
    span = (end32 - begin32).astype(np.float64)
    begin = begin32.astype(np.float64)
    scale = span / out_size
    support = np.maximum(scale, 1.0) * filter_support
    first = begin + 0.5 * scale
    last = begin + (out_size - 0.5) * scale
    # Pillow's bounds for the first and last outputs, a pixel wider each
    # way: the window holds every tap any output reads.
    low = np.maximum(np.trunc(first - support + 0.5) - 1, 0).astype(np.int64)
    high = np.minimum(np.trunc(last + support + 0.5) + 1, full).astype(np.int64)
    size = np.maximum(high - low, 1)
    low = np.minimum(low, np.maximum(full - size, 0))
    taps = np.ceil(support).astype(np.int64) * 2 + 1
    return _Axis(begin, span, full, low, size, taps)


def _chunks(
    area_rows: npt.NDArray[np.int64], area_cols: npt.NDArray[np.int64], budget: int
) -> list[list[int]]:
    """Images grouped so that each group's padded windows (count x the
    group's largest rows x its largest cols) stay within ``budget``, largest
    windows first so that like sizes pad together; an image over the budget
    alone is a group of its own."""
    order = np.argsort(-(area_rows * area_cols), kind="stable")
    groups: list[list[int]] = []
    current: list[int] = []
    rows = cols = 0
    for index in order.tolist():
        grown_rows = max(rows, int(area_rows[index]))
        grown_cols = max(cols, int(area_cols[index]))
        if current and (len(current) + 1) * grown_rows * grown_cols > budget:
            groups.append(current)
            current, grown_rows, grown_cols = [], int(area_rows[index]), int(area_cols[index])
        current.append(index)
        rows, cols = grown_rows, grown_cols
    if current:
        groups.append(current)
    return groups


def _axis_weights(
    params: torch.Tensor,
    out_size: int,
    window: int,
    taps: int,
    mirror: torch.Tensor | None,
    interpolation: Interpolation,
) -> torch.Tensor:
    """``(count, out_size, window)`` float64 weights, integers of 2**22 a
    unit, built on the device from ``params`` columns (begin, span, full,
    low) per image as Pillow builds them (``precompute_coeffs`` and
    ``normalize_coeffs_8bpc``), operation for operation, each output's taps
    summed in order so that its total is Pillow's whatever the padding.
    ``taps``: at least the most taps an output reads. ``mirror`` (bool per
    image) reverses the outputs, which flips the image."""
    begin, span, full, low = (params[:, i : i + 1] for i in range(4))
    device = params.device
    scale = span / out_size
    filter_scale = torch.clamp(scale, min=1.0)
    support = filter_scale * _SUPPORT[interpolation]
    inverse = 1.0 / filter_scale
    outputs = torch.arange(out_size, device=device, dtype=torch.float64) + 0.5
    centers = begin + outputs * scale
    first = torch.clamp(torch.trunc((centers - support) + 0.5), min=0.0)
    last = torch.minimum(torch.trunc((centers + support) + 0.5), full)
    tap = torch.arange(taps, device=device, dtype=torch.float64)
    distance = ((first[..., None] + tap) - centers[..., None]) + 0.5
    x = distance * inverse[..., None]
    reads = tap < (last - first)[..., None]
    weights = torch.where(reads, _filter(x, interpolation), torch.zeros_like(x))
    total = weights[..., 0]
    for k in range(1, taps):
        total = total + weights[..., k]
    total = total[..., None]
    weights = torch.where(total != 0, weights / torch.where(total != 0, total, 1.0), weights)
    # Pillow's (int) casts: a negative weight (the cubic's lobes) rounds
    # half away from zero, as a positive one does.
    fixed = torch.where(
        weights < 0, torch.trunc(weights * _UNIT - 0.5), torch.floor(weights * _UNIT + 0.5)
    )
    # Taps past an output's last read none (weight 0): clamped into the
    # window, they add nothing.
    index = (first[..., None] + tap - low[..., None]).clamp_(0, window - 1).long()
    dense = torch.zeros((params.shape[0], out_size, window), dtype=torch.float64, device=device)
    dense.scatter_add_(2, index, fixed)
    if mirror is not None:
        dense = torch.where(mirror[:, None, None], dense.flip(1), dense)
    return dense


def _round_pass(sums: torch.Tensor) -> torch.Tensor:
    """Pillow's ``clip8``: a fixed-point sum rounded to 8 bits (float64)."""
    return torch.floor((sums + _HALF_UNIT) / _UNIT).clamp_(0.0, 255.0)


def crop_resize_batch(
    images: Sequence[torch.Tensor],
    boxes: npt.NDArray[np.float32],
    flipped: npt.NDArray[np.bool_],
    height: int,
    width: int,
    *,
    out: torch.Tensor | None = None,
    slots: Sequence[int] | None = None,
    max_window_pixels: int = MAX_WINDOW_PIXELS,
    method: Method = "auto",
    interpolation: Interpolation = "bilinear",
) -> torch.Tensor:
    """Every ``images[i]`` (uint8 ``(3, h, w)``, all on one device) cropped
    to ``boxes[i]`` (left, top, width, height), resized to ``height`` x
    ``width`` and mirrored where ``flipped[i]``: uint8 ``(N, height, width,
    3)`` on their device, within one level of :func:`crop_resize` per image.
    With ``out`` (uint8 ``(M, height, width,
    3)``), image ``i`` is written to ``out[slots[i]]`` instead and ``out``
    returned. ``method``: ``"auto"`` takes Pillow's resize image by image on
    CPU (a dense product there costs far more than the filter's taps) and
    the batched products on a GPU (the two agree within a level)."""
    count = len(images)
    if count == 0:
        raise ValueError("crop_resize_batch needs at least one image")
    device = images[0].device
    if out is None:
        out = torch.empty((count, height, width, 3), dtype=torch.uint8, device=device)
        slots = range(count)
    elif slots is None or len(slots) != count:
        raise ValueError("out needs a slot for every image")
    if method == "auto":
        method = "pillow" if device.type == "cpu" and _has_pillow() else "matmul"
    if method == "pillow":
        for index, image in enumerate(images):
            out[slots[index]] = _crop_resize_pillow(
                image, boxes[index], bool(flipped[index]), height, width, interpolation
            )
        return out
    rows = np.array([image.shape[1] for image in images], dtype=np.int64)
    cols = np.array([image.shape[2] for image in images], dtype=np.int64)
    boxes64 = np.asarray(boxes, dtype=np.float32).astype(np.float64).reshape(count, 4)
    support = _SUPPORT[interpolation]
    along_y = _axis(boxes64[:, 1], boxes64[:, 3], height, rows, support)
    along_x = _axis(boxes64[:, 0], boxes64[:, 2], width, cols, support)
    groups = _chunks(along_y.size, along_x.size, max_window_pixels)
    order = np.array([index for group in groups for index in group], dtype=np.int64)
    # Every image's numbers in chunk order, and their slots: two
    # host-to-device copies a batch, neither waiting for the device.
    table = np.stack(
        [
            along_y.begin,
            along_y.span,
            along_y.full,
            along_y.low,
            along_x.begin,
            along_x.span,
            along_x.full,
            along_x.low,
            np.asarray(flipped, dtype=np.float64).reshape(count),
        ],
        axis=1,
    )[order]
    params = torch.from_numpy(table).to(device, non_blocking=True)
    destinations = np.asarray(slots, dtype=np.int64)[order]
    slot_of = torch.from_numpy(destinations).to(device, non_blocking=True)
    start = 0
    for group in groups:
        end = start + len(group)
        window_rows = int(along_y.size[group].max())
        window_cols = int(along_x.size[group].max())
        windows = torch.zeros(
            (len(group), 3, window_rows, window_cols), dtype=torch.float64, device=device
        )
        for at, index in enumerate(group):
            y0, x0 = int(along_y.low[index]), int(along_x.low[index])
            ky, kx = int(along_y.size[index]), int(along_x.size[index])
            windows[at, :, :ky, :kx].copy_(images[index][:, y0 : y0 + ky, x0 : x0 + kx])
        chosen = params[start:end]
        vertical = _axis_weights(
            chosen[:, 0:4],
            height,
            window_rows,
            int(along_y.taps[group].max()),
            None,
            interpolation,
        )
        horizontal = _axis_weights(
            chosen[:, 4:8],
            width,
            window_cols,
            int(along_x.taps[group].max()),
            chosen[:, 8] > 0.5,
            interpolation,
        )
        # Pillow's order, rounding to 8 bits between the passes.
        across = _round_pass(torch.matmul(windows, horizontal.transpose(1, 2)[:, None]))
        del windows
        resized = _round_pass(torch.matmul(vertical[:, None], across))
        pixels = resized.to(torch.uint8).permute(0, 2, 3, 1)
        out.index_copy_(0, slot_of[start:end], pixels)
        start = end
    return out


def _has_pillow() -> bool:
    try:
        import PIL  # noqa: F401
    except ImportError:
        return False
    return True
