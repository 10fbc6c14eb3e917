"""The server's crop and resize, for a whole batch at once on the decoder's
device.

The filter is the server's: a separable triangle (bilinear) filter whose
support widens with the downscale factor, so it antialiases, reading the
pixels just outside the box at its edges. Per image it is two matrix
products over the window the filter reads; here the windows of many images
are padded into one tensor and the weights of all of them are built on the
device from a handful of numbers per image, so a batch costs one small
host-to-device copy, one window copy per image and one pair of batched
products per chunk, with no per-image host arrays and nothing that waits for
the device.

Memory: the padded windows are ``count x 3 x rows x cols`` elements, where
rows and cols are the largest window's in the chunk. Images are taken
largest window first and a chunk closes before its padded windows would
pass ``max_window_pixels`` (per channel), so a batch holding one 48-Mpx
photo pads only that photo's chunk to its size. The peak is
``3 x max(max_window_pixels, the largest single window) x element size``
for the windows (float16 on CUDA, float32 elsewhere), plus the products'
intermediate of ``count x 3 x out_height x window cols`` (or rows) and the
decoded images themselves.

:func:`crop_resize` is the per-image reference the batched path is tested
against (within one level).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["crop_resize", "crop_resize_batch", "MAX_WINDOW_PIXELS", "Method"]

# "matmul": the batched products (any device); "pillow": Pillow's resize,
# image by image (CPU); "auto": the faster one for the images' device.
Method = Literal["auto", "matmul", "pillow"]

# Padded window pixels (per channel) in one chunk: 32 Mpx, 192 MiB of
# float16 windows (384 MiB in float32). 128 windows of a ~500x375 photo's
# crop fit in one chunk; a multi-megapixel photo gets a chunk of its own.
MAX_WINDOW_PIXELS = 1 << 25


def _weights(start: float, length: float, out_size: int, full: int) -> tuple[int, npt.NDArray[Any]]:
    """Resampling weights along one axis: the first source index the filter
    reads and an ``(out_size, window)`` matrix over the window it reads."""
    scale = length / out_size
    filter_scale = max(scale, 1.0)
    centers = start + (np.arange(out_size) + 0.5) * scale
    low = max(int(np.floor(centers[0] - filter_scale)), 0)
    high = min(int(np.ceil(centers[-1] + filter_scale)), full)
    positions = np.arange(low, high) + 0.5
    weights = np.clip(1.0 - np.abs(positions[None, :] - centers[:, None]) / filter_scale, 0, None)
    totals = weights.sum(axis=1, keepdims=True)
    np.divide(weights, totals, out=weights, where=totals > 0)
    return low, weights.astype(np.float32)


def crop_resize(
    image: torch.Tensor, box: Sequence[float], flipped: bool, height: int, width: int
) -> torch.Tensor:
    """``image`` (uint8 ``(3, h, w)``) cropped to ``box`` (left, top,
    width, height in its pixels), resized to ``height`` x ``width`` with the
    server's filter and mirrored when ``flipped``: uint8 ``(height, width,
    3)`` on the image's device. One image at a time, in float32: the
    reference for :func:`crop_resize_batch`."""
    left, top, box_width, box_height = (float(v) for v in box)
    _, rows, cols = image.shape
    y0, wy = _weights(top, box_height, height, rows)
    x0, wx = _weights(left, box_width, width, cols)
    device = image.device
    window = image[:, y0 : y0 + wy.shape[1], x0 : x0 + wx.shape[1]].float()
    vertical = torch.from_numpy(wy).to(device)
    horizontal = torch.from_numpy(wx).to(device)
    out = torch.matmul(torch.matmul(vertical, window), horizontal.T)
    pixels = out.round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0)
    return pixels.flip(1) if flipped else pixels


def _crop_resize_pillow(
    image: torch.Tensor, box: Sequence[float], flipped: bool, height: int, width: int
) -> torch.Tensor:
    """:func:`crop_resize` by Pillow (its ``resize(box=...)`` is the same
    triangle filter, in fixed point, rounding between passes as the server
    does): an image costs its taps, not a dense product over its window,
    which on CPU is several times faster."""
    from PIL import Image

    _, rows, cols = image.shape
    picture = Image.fromarray(image.permute(1, 2, 0).contiguous().numpy(), mode="RGB")
    left, top, box_width, box_height = (float(v) for v in box)
    # Pillow refuses a box past the image by a float32 rounding's width.
    left, top = min(max(left, 0.0), cols), min(max(top, 0.0), rows)
    right, bottom = min(left + box_width, cols), min(top + box_height, rows)
    resized = picture.resize(
        (width, height), Image.Resampling.BILINEAR, box=(left, top, right, bottom)
    )
    if flipped:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(resized))


@dataclass(frozen=True)
class _Windows:
    """Per image, along one axis: the first source index the filter reads,
    how many it reads, and the output pixels' centers as ``offset + (i +
    0.5) * scale`` in window coordinates, with the filter's half-width."""

    low: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    offset: npt.NDArray[np.float64]
    scale: npt.NDArray[np.float64]
    support: npt.NDArray[np.float64]


def _windows(
    start: npt.NDArray[np.float64],
    length: npt.NDArray[np.float64],
    out_size: int,
    full: npt.NDArray[np.int64],
) -> _Windows:
    """:func:`_weights`' window arithmetic for every image at once (float64,
    on the host: a few numbers per image)."""
    scale = length / out_size
    support = np.maximum(scale, 1.0)
    first = start + 0.5 * scale
    last = start + (out_size - 0.5) * scale
    low = np.maximum(np.floor(first - support), 0).astype(np.int64)
    high = np.minimum(np.ceil(last + support), full).astype(np.int64)
    # A degenerate box still reads one pixel rather than none.
    size = np.maximum(high - low, 1)
    low = np.minimum(low, np.maximum(full - size, 0))
    return _Windows(low, size, start - low, scale, support)


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
    params: torch.Tensor, out_size: int, window: int, mirror: torch.Tensor | None
) -> torch.Tensor:
    """``(count, out_size, window)`` float32 weights built on the device from
    ``params`` columns (offset, scale, support, size) per image; ``mirror``
    (bool per image) reverses the outputs, which flips the image."""
    offset, scale, support, size = (params[:, i : i + 1] for i in range(4))
    device = params.device
    outputs = torch.arange(out_size, device=device, dtype=torch.float32) + 0.5
    if mirror is not None:
        outputs = torch.where(mirror[:, None], out_size - outputs, outputs)
    centers = offset + outputs * scale
    taps = torch.arange(window, device=device, dtype=torch.float32)
    distance = (taps + 0.5)[None, None, :] - centers[:, :, None]
    weights = (1.0 - distance.abs() / support[:, :, None]).clamp_(min=0.0)
    weights *= taps[None, None, :] < size[:, :, None]
    totals = weights.sum(dim=2, keepdim=True)
    return weights / torch.where(totals > 0, totals, torch.ones_like(totals))


def crop_resize_batch(
    images: Sequence[torch.Tensor],
    boxes: npt.NDArray[np.float32],
    flipped: npt.NDArray[np.bool_],
    height: int,
    width: int,
    *,
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    slots: Sequence[int] | None = None,
    max_window_pixels: int = MAX_WINDOW_PIXELS,
    method: Method = "auto",
) -> torch.Tensor:
    """Every ``images[i]`` (uint8 ``(3, h, w)``, all on one device) cropped
    to ``boxes[i]`` (left, top, width, height), resized to ``height`` x
    ``width`` and mirrored where ``flipped[i]``: uint8 ``(N, height, width,
    3)`` on their device, within one level of :func:`crop_resize` per image.
    With ``out`` (uint8 ``(M, height, width, 3)``), image ``i`` is written to
    ``out[slots[i]]`` instead and ``out`` returned. ``dtype``: the products'
    precision (default float16 on CUDA, where it stays within that level and
    runs on the tensor cores; float32 elsewhere, where half precision is
    slower). ``method``: ``"auto"`` takes Pillow's resize image by image on
    CPU (a dense product there costs far more than the filter's taps) and
    the batched products on a GPU."""
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
                image, boxes[index], bool(flipped[index]), height, width
            )
        return out
    if dtype is None:
        dtype = torch.float16 if device.type == "cuda" else torch.float32
    rows = np.array([image.shape[1] for image in images], dtype=np.int64)
    cols = np.array([image.shape[2] for image in images], dtype=np.int64)
    boxes64 = np.asarray(boxes, dtype=np.float64).reshape(count, 4)
    along_y = _windows(boxes64[:, 1], boxes64[:, 3], height, rows)
    along_x = _windows(boxes64[:, 0], boxes64[:, 2], width, cols)
    groups = _chunks(along_y.size, along_x.size, max_window_pixels)
    order = np.array([index for group in groups for index in group], dtype=np.int64)
    # Every image's numbers in chunk order, and their slots: two
    # host-to-device copies a batch, neither waiting for the device.
    table = np.stack(
        [
            along_y.offset,
            along_y.scale,
            along_y.support,
            along_y.size,
            along_x.offset,
            along_x.scale,
            along_x.support,
            along_x.size,
            np.asarray(flipped, dtype=np.float64).reshape(count),
        ],
        axis=1,
    )[order].astype(np.float32)
    params = torch.from_numpy(table).to(device, non_blocking=True)
    destinations = np.asarray(slots, dtype=np.int64)[order]
    slot_of = torch.from_numpy(destinations).to(device, non_blocking=True)
    start = 0
    for group in groups:
        end = start + len(group)
        window_rows = int(along_y.size[group].max())
        window_cols = int(along_x.size[group].max())
        windows = torch.zeros((len(group), 3, window_rows, window_cols), dtype=dtype, device=device)
        for at, index in enumerate(group):
            y0, x0 = int(along_y.low[index]), int(along_x.low[index])
            ky, kx = int(along_y.size[index]), int(along_x.size[index])
            windows[at, :, :ky, :kx].copy_(images[index][:, y0 : y0 + ky, x0 : x0 + kx])
        chosen = params[start:end]
        vertical = _axis_weights(chosen[:, 0:4], height, window_rows, None).to(dtype)
        horizontal = _axis_weights(chosen[:, 4:8], width, window_cols, chosen[:, 8] > 0.5).to(dtype)
        vertical, horizontal = vertical[:, None], horizontal.transpose(1, 2)[:, None]
        # The cheaper order of the two products (both read the same window).
        rows_first = height * window_cols * (window_rows + width)
        cols_first = window_rows * width * (window_cols + height)
        if rows_first <= cols_first:
            resized = torch.matmul(torch.matmul(vertical, windows), horizontal)
        else:
            resized = torch.matmul(vertical, torch.matmul(windows, horizontal))
        pixels = resized.float().round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        out.index_copy_(0, slot_of[start:end], pixels)
        start = end
    return out


def _has_pillow() -> bool:
    try:
        import PIL  # noqa: F401
    except ImportError:
        return False
    return True
