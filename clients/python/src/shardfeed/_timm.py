"""timm's transform classes as the torchvision rows they equal, or refused
naming the timm class (timm reuses torchvision's names: its
``RandAugment`` is another policy, its ``ToTensor`` does not scale).

What ``timm.data.create_transform`` makes and how each step is served:
``RandomResizedCropAndInterpolation`` with one interpolation is
torchvision's ``RandomResizedCrop`` (the same box draws); ``MaybeToTensor``
is ``ToTensor``, ``MaybePILToTensor`` is ``PILToTensor``, timm's
``ToTensor(dtype)`` is ``ToDtype(dtype)`` without scaling; timm's
``RandomErasing`` with one box, in ``pixel`` or ``const`` mode, is
torchvision's with timm's ranges. Its auto-augment policies (``rand-``,
``augmix-``, ``original``/``v0``) are refused by name.
"""

from __future__ import annotations

import math
from typing import Any

from ._policies import RandomErasing


def is_timm(step: Any) -> bool:
    return type(step).__module__.split(".")[0] == "timm"


_AS_TORCHVISION = {
    "RandomResizedCropAndInterpolation": "RandomResizedCrop",
    "MaybeToTensor": "ToTensor",
    "MaybePILToTensor": "PILToTensor",
    "ToTensor": "ToDtype",
    "RandomErasing": "RandomErasing",
}

_WAY_OUT = "or apply it to the delivered batch"


def as_torchvision(step: Any) -> str:
    """The torchvision row a timm step is, or ``TypeError`` naming it."""
    name = type(step).__name__
    if name in ("RandAugment", "AutoAugment", "AugMixAugment"):
        raise TypeError(
            f"timm's {name} (create_transform's auto_augment string) is not served: its "
            "semantics differ from torchvision's (each op applied with probability 0.5, "
            "magnitude noise mstd, the 'increasing' ops, SolarizeAdd, PIL's kernels), and "
            "the sidecar will not run one for the other. Served instead: torchvision's "
            "RandAugment, TrivialAugmentWide or AutoAugment (create_transform with "
            f"auto_augment=None, then that transform after the flip), {_WAY_OUT}"
        )
    if name == "ToNumpy":
        raise TypeError(
            "timm's ToNumpy (create_transform(use_prefetcher=True)): the prefetcher's "
            "uint8 CHW arrays are what the sidecar delivers already; build the transform "
            "with use_prefetcher=False so its Normalize is converted too"
        )
    if name == "RandomResizedCropAndInterpolation" and isinstance(
        step.interpolation, (list, tuple)
    ):
        modes = ", ".join(str(getattr(m, "value", m)) for m in step.interpolation)
        raise TypeError(
            f"timm's RandomResizedCropAndInterpolation(interpolation=random: {modes}) picks "
            "an interpolation per sample, which the sidecar does not serve; pass "
            f"interpolation='bilinear' to create_transform, {_WAY_OUT}"
        )
    if name not in _AS_TORCHVISION:
        raise TypeError(f"timm's {name} is not run by the sidecar: {_WAY_OUT}")
    return _AS_TORCHVISION[name]


def erasing(step: Any, normalize: tuple[Any, Any]) -> RandomErasing:
    """timm's ``RandomErasing`` (after Normalize): one box of area
    ``[min_area, max_area]`` and log-uniform aspect in ``log_aspect_ratio``,
    per-value N(0, 1) (``pixel``) or 0 (``const``)."""
    if step.min_count != 1 or step.max_count != 1:
        raise TypeError(
            f"timm's RandomErasing(max_count={step.max_count}): the sidecar erases one box "
            f"per sample; pass re_count=1, {_WAY_OUT}"
        )
    if step.num_splits:
        raise TypeError(
            f"timm's RandomErasing(num_splits={step.num_splits}) (aug splits): not served; "
            f"pass re_split=False, {_WAY_OUT}"
        )
    if step.rand_color:
        raise TypeError(
            "timm's RandomErasing(mode='rand') fills each box with one random colour, which "
            f"the sidecar does not serve; mode 'pixel' and 'const' are served, {_WAY_OUT}"
        )
    low, high = step.log_aspect_ratio
    return RandomErasing(
        p=float(step.probability),
        scale=(float(step.min_area), float(step.max_area)),
        ratio=(math.exp(low), math.exp(high)),
        value="random" if step.per_pixel else "mean",
        normalize=normalize,
    )
