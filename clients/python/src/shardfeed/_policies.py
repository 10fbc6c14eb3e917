"""The ops after the crop a request can name, as torchvision names them:
the auto-augment policies, ColorJitter, the single-op transforms with
parameters, GaussianBlur and RandomErasing. Each checks its
arguments at construction (``ValueError`` naming the argument), the server
checks them again (``INVALID_ARGUMENT`` naming the wire field)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from ._proto import shardfeed_pb2 as pb

Interpolation = Literal["nearest", "bilinear"]
Fill = Union[tuple[int, int, int], None]
Range = tuple[float, float]

# torchvision's ImageNet normalization (``Normalize(mean, std)`` after
# ``ToDtype(float32, scale=True)``).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_MAX_BINS = 1024
_MAX_OPS = 8
# The server's bound on a blur kernel's side (kernels::MAX_BLUR_KERNEL).
_MAX_BLUR_KERNEL = 127


def _check_sampling(interpolation: str, fill: Fill) -> None:
    if interpolation not in ("nearest", "bilinear"):
        raise ValueError(
            f"interpolation must be 'nearest' or 'bilinear' (torchvision's tensor "
            f"kernels take these), not {interpolation!r}"
        )
    if fill is not None and (len(fill) != 3 or any(not 0 <= int(v) <= 255 for v in fill)):
        raise ValueError(f"fill must be None or three levels in 0..255, not {fill!r}")


def _check_p(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], not {p}")


def _interpolation_wire(interpolation: str) -> Any:
    return pb.INTERPOLATION_BILINEAR if interpolation == "bilinear" else pb.INTERPOLATION_NEAREST


def _check_bins(bins: int) -> None:
    if not 2 <= bins <= _MAX_BINS:
        raise ValueError(f"num_magnitude_bins must be in 2..{_MAX_BINS}, not {bins}")


class _Policy:
    interpolation: Interpolation
    fill: Fill

    def _message(self, policy: dict[str, Any]) -> Any:
        return pb.AutoAugment(
            interpolation=_interpolation_wire(self.interpolation),
            fill=list(self.fill) if self.fill is not None else [],
            **policy,
        )


@dataclass(frozen=True)
class TrivialAugmentWide(_Policy):
    """torchvision's ``TrivialAugmentWide``: one op of 14 and one bin per
    sample."""

    num_magnitude_bins: int = 31
    interpolation: Interpolation = "nearest"
    fill: Fill = None

    def __post_init__(self) -> None:
        _check_bins(self.num_magnitude_bins)
        _check_sampling(self.interpolation, self.fill)

    def to_message(self) -> Any:
        wide = pb.TrivialAugmentWide(num_magnitude_bins=self.num_magnitude_bins)
        return self._message({"trivial_augment_wide": wide})


@dataclass(frozen=True)
class RandAugment(_Policy):
    """torchvision's ``RandAugment``: ``num_ops`` ops of 14 per sample, drawn
    with replacement, at bin ``magnitude``."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    interpolation: Interpolation = "nearest"
    fill: Fill = None

    def __post_init__(self) -> None:
        _check_bins(self.num_magnitude_bins)
        if not 1 <= self.num_ops <= _MAX_OPS:
            raise ValueError(f"num_ops must be in 1..{_MAX_OPS}, not {self.num_ops}")
        if not 0 <= self.magnitude < self.num_magnitude_bins:
            raise ValueError(
                f"magnitude must be a bin below num_magnitude_bins "
                f"({self.num_magnitude_bins}), not {self.magnitude}"
            )
        _check_sampling(self.interpolation, self.fill)

    def to_message(self) -> Any:
        rand = pb.RandAugment(
            num_ops=self.num_ops,
            magnitude=self.magnitude,
            num_magnitude_bins=self.num_magnitude_bins,
        )
        return self._message({"rand_augment": rand})


@dataclass(frozen=True)
class AutoAugment(_Policy):
    """torchvision's ``AutoAugment`` with its ImageNet policy."""

    policy: Literal["imagenet"] = "imagenet"
    interpolation: Interpolation = "nearest"
    fill: Fill = None

    def __post_init__(self) -> None:
        if self.policy != "imagenet":
            raise ValueError(f"policy must be 'imagenet' (the one served), not {self.policy!r}")
        _check_sampling(self.interpolation, self.fill)

    def to_message(self) -> Any:
        return self._message({"imagenet": pb.AutoAugmentImageNet()})


Policy = Union[TrivialAugmentWide, RandAugment, AutoAugment]


def _jitter_range(name: str, value: float | Range, *, hue: bool = False) -> Range | None:
    if isinstance(value, (int, float)):
        if value < 0 or (hue and value > 0.5):
            bound = "[0, 0.5]" if hue else ">= 0"
            raise ValueError(f"{name} must be {bound}, not {value}")
        if value == 0:
            return None
        return (-float(value), float(value)) if hue else (max(0.0, 1.0 - value), 1.0 + value)
    low, high = (float(v) for v in value)
    floor, ceiling = (-0.5, 0.5) if hue else (0.0, float("inf"))
    if not floor <= low <= high <= ceiling:
        raise ValueError(f"{name} must be a range within [{floor}, {ceiling}], not {value!r}")
    return low, high


@dataclass(frozen=True)
class ColorJitter:
    """torchvision's ``ColorJitter``: a float ``v`` is ``[max(0, 1 - v), 1 +
    v]`` (hue: ``[-h, h]``, within [-0.5, 0.5]), a pair is the range; 0
    leaves the adjustment out. The four apply in a random order per
    sample, to a share ``p`` of the samples (``RandomApply``; a sample
    left alone reports no jitter steps)."""

    brightness: float | Range = 0.0
    contrast: float | Range = 0.0
    saturation: float | Range = 0.0
    hue: float | Range = 0.0
    # The probability that a sample is jittered at all (torchvision's
    # ``RandomApply([ColorJitter(...)], p)``).
    p: float = 1.0

    def __post_init__(self) -> None:
        self.ranges()
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], not {self.p}")

    def ranges(self) -> dict[str, Range | None]:
        return {
            "brightness": _jitter_range("brightness", self.brightness),
            "contrast": _jitter_range("contrast", self.contrast),
            "saturation": _jitter_range("saturation", self.saturation),
            "hue": _jitter_range("hue", self.hue, hue=True),
        }

    def to_message(self) -> Any:
        message = pb.ColorJitter()
        for name, r in self.ranges().items():
            if r is not None:
                getattr(message, name).CopyFrom(pb.Range(min=r[0], max=r[1]))
        if self.p < 1.0:
            message.p = self.p
        return message


@dataclass(frozen=True)
class RandomPhotometricDistort:
    """torchvision v2's ``RandomPhotometricDistort``: each of brightness,
    contrast, saturation and hue on its own coin ``p`` with a factor
    uniform in its range, the contrast before or after the saturation and
    hue (a fair coin), then the channels shuffled on a coin ``p``."""

    brightness: Range = (0.875, 1.125)
    contrast: Range = (0.5, 1.5)
    saturation: Range = (0.5, 1.5)
    hue: Range = (-0.05, 0.05)
    p: float = 0.5

    def __post_init__(self) -> None:
        for name in ("brightness", "contrast", "saturation"):
            low, high = getattr(self, name)
            if not 0.0 <= low <= high < float("inf"):
                raise ValueError(f"{name} must be a range 0 <= min <= max, not {(low, high)}")
        low, high = self.hue
        if not -0.5 <= low <= high <= 0.5:
            raise ValueError(f"hue must be a range within [-0.5, 0.5], not {self.hue}")
        _check_p(self.p)

    def to_message(self) -> Any:
        ranges = {
            name: pb.Range(min=float(getattr(self, name)[0]), max=float(getattr(self, name)[1]))
            for name in ("brightness", "contrast", "saturation", "hue")
        }
        return pb.RandomPhotometricDistort(p=self.p, **ranges)


@dataclass(frozen=True)
class GaussianBlur:
    """torchvision's ``GaussianBlur(kernel_size, sigma)`` (odd sides, sigma
    drawn per sample uniform in the range) on a share ``p`` of the samples
    (``RandomApply([GaussianBlur(...)], p)``)."""

    kernel_size: int | tuple[int, int] = 9
    sigma: float | Range = (0.1, 2.0)
    p: float = 1.0

    def __post_init__(self) -> None:
        width, height = self.sides()
        for side in (width, height):
            if side % 2 == 0 or not 1 <= side <= _MAX_BLUR_KERNEL:
                raise ValueError(
                    f"kernel_size sides must be odd, 1 to {_MAX_BLUR_KERNEL}, "
                    f"not {self.kernel_size!r}"
                )
        low, high = self.sigma_range()
        if not 0 < low <= high < float("inf"):
            raise ValueError(f"sigma must be > 0 (a range: 0 < min <= max), not {self.sigma!r}")
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], not {self.p}")

    def sides(self) -> tuple[int, int]:
        """(width, height) of the kernel, as torchvision's ``kernel_size``."""
        if isinstance(self.kernel_size, int):
            return self.kernel_size, self.kernel_size
        width, height = self.kernel_size
        return int(width), int(height)

    def sigma_range(self) -> Range:
        if isinstance(self.sigma, (int, float)):
            return float(self.sigma), float(self.sigma)
        low, high = self.sigma
        return float(low), float(high)

    def to_message(self) -> Any:
        width, height = self.sides()
        low, high = self.sigma_range()
        message = pb.GaussianBlur(
            kernel_width=width, kernel_height=height, sigma=pb.Range(min=low, max=high)
        )
        if self.p < 1.0:
            message.p = self.p
        return message


@dataclass(frozen=True)
class RandomSolarize:
    """torchvision's ``RandomSolarize(threshold, p)``: values at or above
    ``threshold`` (in levels) inverted on a share ``p`` of the samples."""

    threshold: float = 128.0
    p: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 255.0:
            raise ValueError(f"threshold must be in [0, 255] levels, not {self.threshold}")
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], not {self.p}")

    def to_message(self) -> Any:
        return pb.RandomSolarize(threshold=self.threshold, p=self.p)


@dataclass(frozen=True)
class RandomAdjustSharpness:
    """torchvision's ``RandomAdjustSharpness(sharpness_factor, p)``: a blend
    with the 3x3-smoothed sample (0 smooths, 1 leaves, 2 sharpens)."""

    sharpness_factor: float
    p: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.sharpness_factor < float("inf"):
            raise ValueError(f"sharpness_factor must be >= 0, not {self.sharpness_factor}")
        _check_p(self.p)

    def to_message(self) -> Any:
        return pb.RandomAdjustSharpness(sharpness_factor=self.sharpness_factor, p=self.p)


@dataclass(frozen=True)
class RandomPosterize:
    """torchvision's ``RandomPosterize(bits, p)``: the top ``bits`` bits of
    each value kept."""

    bits: int
    p: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= int(self.bits) <= 8:
            raise ValueError(f"bits must be 0 to 8, not {self.bits}")
        _check_p(self.p)

    def to_message(self) -> Any:
        return pb.RandomPosterize(bits=int(self.bits), p=self.p)


class _Geometric:
    """What RandomRotation and RandomAffine share: an angle range, how
    they sample and their fill (torchvision's: 0 by default, a number is
    every channel's level, None zero padding without a mask)."""

    degrees: float | Range
    interpolation: Interpolation
    fill: Fill | int

    def range(self) -> Range:
        return _symmetric("degrees", self.degrees)

    def levels(self) -> Fill:
        if isinstance(self.fill, int):
            return (self.fill,) * 3
        return self.fill

    def _check(self) -> None:
        _ordered("degrees", *self.range())
        _check_sampling(self.interpolation, self.levels())

    def _geometry(self) -> dict[str, Any]:
        """The request fields both messages name alike."""
        low, high = self.range()
        fill = self.levels()
        return {
            "degrees": pb.Range(min=low, max=high),
            "interpolation": _interpolation_wire(self.interpolation),
            "fill": list(fill) if fill is not None else [],
        }


@dataclass(frozen=True)
class RandomRotation(_Geometric):
    """torchvision's ``RandomRotation(degrees, interpolation, expand=False,
    center=None, fill)``: each sample turned counter-clockwise about its
    centre by an angle uniform in ``degrees`` (a number d: [-d, d]), at its
    own size. ``fill`` is torchvision's: 0 by default (black, blended
    through a mask under bilinear), ``None`` zero padding without a mask."""

    degrees: float | Range
    interpolation: Interpolation = "nearest"
    fill: Fill | int = 0

    def __post_init__(self) -> None:
        self._check()

    def to_message(self) -> Any:
        return pb.RandomRotation(**self._geometry())


def _symmetric(name: str, value: float | Sequence[float]) -> Range:
    """torchvision's ``_setup_angle``: a number d is [-d, d]."""
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{name} as a number must be >= 0, not {value}")
        return -float(value), float(value)
    low, high = value
    return float(low), float(high)


def _ordered(name: str, low: float, high: float) -> None:
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ValueError(f"{name} must be finite, min <= max, not {(low, high)}")


@dataclass(frozen=True)
class RandomAffine(_Geometric):
    """torchvision's ``RandomAffine(degrees, translate, scale, shear,
    interpolation, fill, center=None)``: per sample an angle (clockwise), a
    translation of up to ``translate`` x the side (rounded to pixels), a
    scale and a shear (``shear`` a number s: x in [-s, s]; two numbers: x's
    range; four: x's and y's), each uniform. ``fill`` as
    :class:`RandomRotation`'s."""

    degrees: float | Range
    translate: Range | None = None
    scale: Range | None = None
    shear: float | Sequence[float] | None = None
    interpolation: Interpolation = "nearest"
    fill: Fill | int = 0

    def __post_init__(self) -> None:
        self._check()
        if self.translate is not None and not all(0.0 <= t <= 1.0 for t in self.translate):
            raise ValueError(f"translate must be two fractions in [0, 1], not {self.translate}")
        if self.scale is not None:
            low, high = self.scale
            if not 0.0 < low <= high < float("inf"):
                raise ValueError(f"scale must be 0 < min <= max, not {self.scale}")
        for shear in self.shears():
            if shear is not None:
                _ordered("shear", *shear)

    def shears(self) -> tuple[Range | None, Range | None]:
        """The x and the y shear ranges (None: none)."""
        if self.shear is None:
            return None, None
        if isinstance(self.shear, (int, float)):
            return _symmetric("shear", self.shear), None
        values = [float(v) for v in self.shear]
        if len(values) == 2:
            return (values[0], values[1]), None
        if len(values) == 4:
            return (values[0], values[1]), (values[2], values[3])
        raise ValueError(f"shear must be a number or 2 or 4 numbers, not {self.shear!r}")

    def to_message(self) -> Any:
        message = pb.RandomAffine(**self._geometry())
        if self.translate is not None:
            message.translate_x, message.translate_y = map(float, self.translate)
        if self.scale is not None:
            message.scale.CopyFrom(pb.Range(min=self.scale[0], max=self.scale[1]))
        shear_x, shear_y = self.shears()
        if shear_x is not None:
            message.shear_x.CopyFrom(pb.Range(min=shear_x[0], max=shear_x[1]))
        if shear_y is not None:
            message.shear_y.CopyFrom(pb.Range(min=shear_y[0], max=shear_y[1]))
        return message


@dataclass(frozen=True)
class RandomErasing:
    """torchvision's ``RandomErasing`` as the recipes apply it, after
    ``Normalize(mean, std)``: ``value`` is a colour (three levels), ``"mean"``
    (0 after Normalize) or ``"random"`` (per-value N(0, 1) after Normalize),
    the last two carried to ``uint8`` through ``normalize``."""

    p: float = 0.5
    scale: Range = (0.02, 0.33)
    ratio: Range = (0.3, 3.3)
    value: tuple[int, int, int] | Literal["mean", "random"] = "mean"
    normalize: tuple[Sequence[float], Sequence[float]] = (IMAGENET_MEAN, IMAGENET_STD)

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], not {self.p}")
        low, high = self.scale
        if not 0 < low <= high < 1:
            raise ValueError(
                f"scale must have 0 < min <= max < 1 (a box must fit), not {self.scale!r}"
            )
        low, high = self.ratio
        if not 0 < low <= high < float("inf"):
            raise ValueError(f"ratio must have 0 < min <= max, not {self.ratio!r}")
        if isinstance(self.value, str):
            if self.value not in ("mean", "random"):
                raise ValueError(f"value must be a colour, 'mean' or 'random', not {self.value!r}")
        elif len(self.value) != 3 or any(not 0 <= int(v) <= 255 for v in self.value):
            raise ValueError(f"a colour value is three levels in 0..255, not {self.value!r}")
        mean, std = self.normalize
        if len(mean) != 3 or any(not 0.0 <= m <= 1.0 for m in mean):
            raise ValueError(f"normalize's mean must be three values in [0, 1], not {mean!r}")
        if len(std) != 3 or any(not s > 0 for s in std):
            raise ValueError(f"normalize's std must be three positive values, not {std!r}")

    def to_message(self) -> Any:
        mean, std = self.normalize
        message = pb.RandomErasing(
            p=self.p,
            scale=pb.Range(min=self.scale[0], max=self.scale[1]),
            ratio=pb.Range(min=self.ratio[0], max=self.ratio[1]),
            normalize_mean=list(mean),
            normalize_std=list(std),
        )
        if self.value == "mean":
            message.mean.SetInParent()
        elif self.value == "random":
            message.random.SetInParent()
        else:
            message.colour.CopyFrom(pb.Colour(levels=[int(v) for v in self.value]))
        return message
