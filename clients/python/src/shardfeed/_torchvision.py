"""``from_torchvision``: a torchvision transform (v1 or v2) as the
``Augment`` the sidecar runs, with the trainer's Normalize and dtype.

Each transform the sidecar runs maps onto a row of its table, in the
table's order: the crop (``RandomResizedCrop``, or ``Resize`` +
``CenterCrop``), ``RandomHorizontalFlip``, one auto-augment policy,
``ColorJitter``, ``RandomGrayscale``, then the conversions
(``ToImage``/``PILToTensor``/``ToTensor``, ``ToDtype``/``ConvertImageDtype``,
``Normalize``, which the trainer's side applies) and ``RandomErasing``.
Anything else, or out of that order, raises ``TypeError`` naming the
transform and the way out: apply it to the delivered batch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ._augment import Augment
from ._policies import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    AutoAugment,
    ColorJitter,
    Interpolation,
    RandAugment,
    RandomErasing,
    TrivialAugmentWide,
)

# The table's order: each transform's stage, never decreasing.
_STAGES = {
    "RandomResizedCrop": 0,
    "Resize": 0,
    "CenterCrop": 0,
    "RandomHorizontalFlip": 1,
    "TrivialAugmentWide": 2,
    "RandAugment": 2,
    "AutoAugment": 2,
    "ColorJitter": 3,
    "RandomGrayscale": 4,
    "ToImage": 5,
    "PILToTensor": 5,
    "ToTensor": 5,
    "ToDtype": 5,
    "ConvertImageDtype": 5,
    "Normalize": 5,
    "RandomErasing": 6,
}

# Conversions without an effect on the pixels, allowed anywhere.
_NEUTRAL = frozenset({"ToPureTensor"})

_WAY_OUT = (
    "apply it to the delivered batch instead (the sidecar runs RandomResizedCrop, "
    "Resize + CenterCrop, RandomHorizontalFlip, TrivialAugmentWide, RandAugment, "
    "AutoAugment(IMAGENET), ColorJitter, RandomGrayscale, RandomErasing)"
)


def _flatten(transform: Any) -> list[Any]:
    """The steps of a Compose (v1 or v2), of a reference preset that holds
    one (``ClassificationPresetTrain/Eval``), or the transform itself."""
    inner = getattr(transform, "transforms", None)
    if isinstance(inner, (list, tuple)):
        return [step for t in inner for step in _flatten(t)]
    if inner is not None and inner is not transform:
        return _flatten(inner)
    return [transform]


def _interpolation(step: Any) -> Interpolation:
    mode = getattr(step, "interpolation", None)
    name = getattr(mode, "value", mode)
    if name in ("nearest", 0):
        return "nearest"
    if name in ("bilinear", 2):
        return "bilinear"
    raise TypeError(
        f"{type(step).__name__} with interpolation {mode}: the sidecar's tensor kernels "
        "sample nearest or bilinear; pass one of them, or " + _WAY_OUT
    )


def _fill(step: Any) -> tuple[int, int, int] | None:
    fill = getattr(step, "fill", None)
    if isinstance(fill, dict):  # v2 keeps a fill per input type
        fill = next(iter(fill.values()), None) if fill else None
    if fill is None:
        return None
    if isinstance(fill, (int, float)):
        return (int(fill),) * 3
    levels = [int(v) for v in fill]
    return (levels[0],) * 3 if len(levels) == 1 else tuple(levels)  # type: ignore[return-value]


def _size(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    values = list(value)
    return (int(values[0]),) * 2 if len(values) == 1 else (int(values[0]), int(values[1]))


def from_torchvision(transform: Any) -> Augment:
    """The ``Augment`` of a torchvision transform (see the module). Its
    ``size`` is the output size the transform makes; its ``normalize`` and
    ``dtype`` are applied on the trainer's side by ``ShardfeedDataset``."""
    augment = Augment()
    stage = -1
    resize: int | None = None
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    to_float = False
    for step in _flatten(transform):
        name = type(step).__name__
        if name in _NEUTRAL:
            continue
        if name not in _STAGES:
            raise TypeError(f"{name} is not run by the sidecar: {_WAY_OUT}")
        if _STAGES[name] < stage:
            raise TypeError(
                f"{name} comes after a transform the sidecar applies later "
                f"(its order: crop, flip, policy, ColorJitter, RandomGrayscale, "
                f"Normalize, RandomErasing): reorder it, or {_WAY_OUT}"
            )
        stage = _STAGES[name]
        if name == "RandomResizedCrop":
            if _interpolation(step) != "bilinear":
                raise TypeError(
                    "RandomResizedCrop with a nearest resize: the sidecar resizes bilinear "
                    "(antialiased); " + _WAY_OUT
                )
            augment = replace(
                augment,
                crop="random_resized",
                size=_size(step.size),
                scale=tuple(step.scale),
                ratio=tuple(step.ratio),
            )
        elif name == "Resize":
            size = step.size
            if not isinstance(size, int) and len(list(size)) != 1:
                raise TypeError(
                    f"Resize({size}) to a fixed shape: the sidecar resizes the shorter side "
                    "(Resize(int) + CenterCrop); use crop='stretch', or " + _WAY_OUT
                )
            resize = size if isinstance(size, int) else int(list(size)[0])
        elif name == "CenterCrop":
            augment = replace(augment, crop="center", resize=resize or 0, size=_size(step.size))
        elif name == "RandomHorizontalFlip":
            augment = replace(augment, horizontal_flip=float(step.p))
        elif name == "TrivialAugmentWide":
            policy: Any = TrivialAugmentWide(
                step.num_magnitude_bins, _interpolation(step), _fill(step)
            )
            augment = replace(augment, auto_augment=policy)
        elif name == "RandAugment":
            policy = RandAugment(
                step.num_ops,
                step.magnitude,
                step.num_magnitude_bins,
                _interpolation(step),
                _fill(step),
            )
            augment = replace(augment, auto_augment=policy)
        elif name == "AutoAugment":
            if str(getattr(step.policy, "value", step.policy)).lower() != "imagenet":
                raise TypeError(
                    f"AutoAugment({step.policy}): the sidecar serves the IMAGENET policy; "
                    + _WAY_OUT
                )
            policy = AutoAugment("imagenet", _interpolation(step), _fill(step))
            augment = replace(augment, auto_augment=policy)
        elif name == "ColorJitter":
            ranges = [
                tuple(r) if r is not None else 0.0
                for r in (step.brightness, step.contrast, step.saturation, step.hue)
            ]
            augment = replace(augment, color_jitter=ColorJitter(*ranges))
        elif name == "RandomGrayscale":
            augment = replace(augment, grayscale=float(step.p))
        elif name == "ToTensor":
            to_float = True
        elif name in ("ToDtype", "ConvertImageDtype"):
            dtype = step.dtype
            if isinstance(dtype, dict):
                dtype = next(iter(dtype.values()))
            if getattr(dtype, "is_floating_point", False):
                augment = replace(augment, dtype=dtype)
                to_float = True
        elif name == "Normalize":
            normalize = (tuple(map(float, step.mean)), tuple(map(float, step.std)))
            augment = replace(augment, normalize=normalize)
        elif name == "RandomErasing":
            augment = replace(augment, random_erasing=_erasing(step, normalize, to_float))
    if augment.normalize is not None and augment.dtype is None:
        import torch

        augment = replace(augment, dtype=torch.float32)
    return augment


def _erasing(step: Any, normalize: Any, to_float: bool) -> RandomErasing:
    value = step.value
    if value is None or value == "random":
        kind: Any = "random"
    elif isinstance(value, (int, float)):
        kind = [float(value)]
    else:
        kind = [float(v) for v in value]
    norm = normalize or (IMAGENET_MEAN, IMAGENET_STD)
    common = dict(p=float(step.p), scale=tuple(step.scale), ratio=tuple(step.ratio))
    if normalize is None:
        # Before Normalize: a value in the image's own units.
        if kind == "random":
            raise TypeError(
                "RandomErasing(value='random') before Normalize: the sidecar's noise is "
                "N(0, 1) after Normalize; place it after Normalize, or " + _WAY_OUT
            )
        scale = 255.0 if to_float else 1.0
        levels = [kind[0]] * 3 if len(kind) == 1 else kind
        colour = tuple(int(round(v * scale)) for v in levels)
        return RandomErasing(value=colour, **common)  # type: ignore[arg-type]
    if kind == "random":
        return RandomErasing(value="random", normalize=norm, **common)  # type: ignore[arg-type]
    if all(v == 0 for v in kind):
        return RandomErasing(value="mean", normalize=norm, **common)  # type: ignore[arg-type]
    levels = [kind[0]] * 3 if len(kind) == 1 else kind
    mean, std = norm
    colour = tuple(
        min(255, max(0, int((m + s * v) * 255 + 0.5))) for m, s, v in zip(mean, std, levels)
    )
    return RandomErasing(value=colour, normalize=norm, **common)  # type: ignore[arg-type]
