"""The colour kernels of torchvision's tensor ops on ``uint8``
(``transforms.v2.functional``), batched with an argument per sample: each
computes in float32 as torchvision does, and truncates where it truncates
(blends) or rounds where it rounds (the sharpness blur), so that a
sample's output is the one torchvision's call with that sample's argument
gives, to a level."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from ._batched import per_sample

_LUMA = (0.2989, 0.587, 0.114)


def _luma(images: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 grey of ``(N, 3, H, W)`` as float32 ``(N, 1, H, W)``,
    floored as torchvision floors it before blending integer images."""
    r, g, b = images.float().unbind(dim=-3)
    grey = r.mul(_LUMA[0]).add_(g, alpha=_LUMA[1]).add_(b, alpha=_LUMA[2])
    return grey.floor_().unsqueeze(-3)


def _blend(
    images: torch.Tensor, other: torch.Tensor, ratios: npt.NDArray[np.float64]
) -> torch.Tensor:
    """``ratio * images + (1 - ratio) * other``, clamped and truncated."""
    ratio = per_sample(ratios, images)
    rest = per_sample(1.0 - ratios, images)
    out = images.float().mul_(ratio).add_(other * rest)
    return out.clamp_(0, 255).to(torch.uint8)


def brightness(images: torch.Tensor, factors: npt.NDArray[np.float64]) -> torch.Tensor:
    out = images.float().mul_(per_sample(factors, images))
    return out.clamp_(0, 255).to(torch.uint8)


def saturation(images: torch.Tensor, factors: npt.NDArray[np.float64]) -> torch.Tensor:
    return _blend(images, _luma(images), factors)


def contrast(images: torch.Tensor, factors: npt.NDArray[np.float64]) -> torch.Tensor:
    mean = _luma(images).mean(dim=(-3, -2, -1), keepdim=True)
    return _blend(images, mean, factors)


def sharpness(images: torch.Tensor, factors: npt.NDArray[np.float64]) -> torch.Tensor:
    """Blends toward a 3x3 smoothing (1s around a 5, over 13), rounded,
    leaving the one-pixel border as it was (torchvision's border).

    The smoothing is summed as a 3x3 box plus four times the centre, over
    13, rather than convolved: the sums are exact integers in float32 and
    a multiple of 1/13 is never within float error of a half, so it rounds
    to the convolution's levels, at a fraction of a batched conv2d's cost
    on CPU."""
    height, width = images.shape[-2:]
    if height <= 2 or width <= 2:
        return images
    out = images.float()
    rows = out[..., :-2, :] + out[..., 1:-1, :] + out[..., 2:, :]
    box = rows[..., :-2] + rows[..., 1:-1] + rows[..., 2:]
    inner = out[..., 1:-1, 1:-1]
    blurred = box.add_(inner, alpha=4.0).div_(13.0).round_()
    inner.add_(blurred.sub_(inner).mul_(per_sample(1.0 - factors, images)))
    return out.clamp_(0, 255).to(torch.uint8)


def posterize(images: torch.Tensor, bits: npt.NDArray[np.float64]) -> torch.Tensor:
    kept = np.clip(bits.astype(np.int64), 0, 8)
    masks = ((1 << kept) - 1) << (8 - kept)
    mask = torch.as_tensor(masks, dtype=torch.uint8, device=images.device).view(-1, 1, 1, 1)
    return images & mask


def solarize(images: torch.Tensor, thresholds: npt.NDArray[np.float64]) -> torch.Tensor:
    above = images >= per_sample(thresholds, images)
    return torch.where(above, images.bitwise_not(), images)


def hue(images: torch.Tensor, factors: npt.NDArray[np.float64]) -> torch.Tensor:
    """Shifts the hue in HSV (Pillow's conversion, as torchvision's), from
    and back to ``uint8`` by torchvision's scaling."""
    rgb = images.float().mul_(1.0 / 255.0)
    h, s, v = _hsv(rgb)
    h = h.add_(per_sample(factors, images).squeeze(1)).remainder_(1.0)
    return _rgb(h, s, v).mul_(255.0 + 1.0 - 1e-3).to(torch.uint8)


def _hsv(rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r, g, _ = rgb.unbind(dim=-3)
    low, high = torch.aminmax(rgb, dim=-3)
    grey = high == low
    spread = high - low
    ones = torch.ones_like(high)
    s = spread / torch.where(grey, ones, high)
    # Where the channels are equal every distance below is 0: any divisor
    # does, and 1 keeps NaN out.
    divisor = torch.where(grey, ones, spread).unsqueeze(-3)
    rc, gc, bc = ((high.unsqueeze(-3) - rgb) / divisor).unbind(dim=-3)
    red_not_max = high != r
    green_max = high == g
    from_green = rc.add(2.0).sub_(bc).mul_(green_max & red_not_max)
    from_red = bc.sub(gc).mul_(~red_not_max)
    from_blue = gc.add(4.0).sub_(rc).mul_(red_not_max & ~green_max)
    h = from_red.add_(from_green).add_(from_blue)
    return h.mul_(1.0 / 6.0).add_(1.0).fmod_(1.0), s, high


# For each sextant of the hue wheel, which of (v, p, q, t) each of r, g, b
# takes.
_SEXTANTS = ((0, 2, 1, 1, 3, 0), (3, 0, 0, 2, 1, 1), (1, 1, 3, 0, 0, 2))


def _rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    h6 = h.mul(6)
    sextant = torch.floor(h6)
    f = h6.sub_(sextant)
    sxf = s * f
    one_minus_s = 1.0 - s
    q = (1.0 - sxf).mul_(v).clamp_(0.0, 1.0)
    t = sxf.add_(one_minus_s).mul_(v).clamp_(0.0, 1.0)
    p = one_minus_s.mul_(v).clamp_(0.0, 1.0)
    which = sextant.to(torch.long).remainder_(6)
    table = torch.tensor(_SEXTANTS, dtype=torch.long, device=h.device)
    select = table[:, which].movedim(0, -3)
    return torch.stack((v, p, q, t), dim=-3).gather(-3, select)
