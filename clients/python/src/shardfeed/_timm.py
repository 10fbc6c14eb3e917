"""timm's transform classes as the torchvision rows they equal, or refused
naming the timm class (timm reuses torchvision's names: its
``RandAugment`` is another policy, its ``ToTensor`` does not scale).

What ``timm.data.create_transform`` makes and how each step is served:
``RandomResizedCropAndInterpolation`` with one interpolation is
torchvision's ``RandomResizedCrop`` (the same box draws); ``MaybeToTensor``
is ``ToTensor``, ``MaybePILToTensor`` is ``PILToTensor``, timm's
``ToTensor(dtype)`` is ``ToDtype(dtype)`` without scaling; timm's
``RandomErasing`` with one box, in ``pixel`` or ``const`` mode, is
torchvision's with timm's ranges. Its RandAugment (the ``rand-`` strings
without weights) is :class:`TimmRandAugment`, served with timm's
semantics and PIL's kernels; ``augmix-`` and the AutoAugment policies
(``original``/``v0``) are refused by name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from ._policies import IMAGENET_MEAN, RandomErasing
from ._proto import shardfeed_pb2 as pb


def is_timm(step: Any) -> bool:
    return type(step).__module__.split(".")[0] == "timm"


# timm's op lists (``_RAND_TRANSFORMS``, ``_RAND_INCREASING_TRANSFORMS``).
RAND_TRANSFORMS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
RAND_INCREASING_TRANSFORMS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
_MAX_OPS, _MAX_LAYERS, _LEVEL_DENOM = 32, 8, 10.0
TimmResample = Literal["bilinear", "bicubic", "random"]


def _op_wire(name: str) -> Any:
    """An op name's wire value, or ``ValueError`` for one not served."""
    try:
        return pb.TimmOp.Value("TIMM_OP_" + re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper())
    except ValueError:
        served = ", ".join(sorted(set(RAND_TRANSFORMS + RAND_INCREASING_TRANSFORMS)))
        raise ValueError(
            f"timm's {name!r} op is not served (served: {served}, PosterizeOriginal, "
            "TranslateX, TranslateY)"
        ) from None


@dataclass(frozen=True)
class TimmRandAugment:
    """timm's RandAugment (``timm.data.rand_augment_transform``) as timm
    runs it: per sample ``num_layers`` ops drawn with replacement from
    ``ops``, each on a coin of ``prob``, at a magnitude drawn around
    ``magnitude`` (``magnitude_std``: 0 none, ``inf`` uniform in [0, m],
    else a normal) clamped to [0, ``magnitude_max``], mapped to the op's
    argument by timm's level functions; the geometric ops sample bilinear,
    bicubic, or ``"random"``ly one of the two per op, with ``fill`` outside
    the image. The pixels are PIL's (timm runs its ops on PIL images). Each
    sample's ops are reported as ``timm.data.auto_augment``'s functions
    take them (``Batch.ops``: ``("timm.rotate", {...})``).

    ``TimmRandAugment.from_config("rand-m9-mstd0.5-inc1")`` is DeiT's, as
    ``create_transform`` builds it for a 224 output."""

    ops: tuple[str, ...] = RAND_INCREASING_TRANSFORMS
    num_layers: int = 2
    magnitude: float = 9.0
    magnitude_std: float = 0.5
    magnitude_max: float = _LEVEL_DENOM
    prob: float = 0.5
    translate_pct: float = 0.45
    translate_const: float = 100.0
    interpolation: TimmResample = "bicubic"
    fill: tuple[int, int, int] = (128, 128, 128)

    def __post_init__(self) -> None:
        if not 1 <= len(self.ops) <= _MAX_OPS:
            raise ValueError(f"ops must list 1 to {_MAX_OPS} op names, not {len(self.ops)}")
        for name in self.ops:
            _op_wire(name)
        if not 1 <= self.num_layers <= _MAX_LAYERS:
            raise ValueError(f"num_layers must be in 1..{_MAX_LAYERS}, not {self.num_layers}")
        bounds = {
            "magnitude": (0.0, 1000.0),
            "magnitude_std": (0.0, math.inf),
            "prob": (0.0, 1.0),
            "translate_pct": (0.0, 1.0),
            "translate_const": (0.0, 10_000.0),
        }
        for name, (low, high) in bounds.items():
            value = float(getattr(self, name))
            if not low <= value <= high:
                raise ValueError(f"{name} must be in [{low}, {high}], not {value}")
        if not 0.0 < self.magnitude_max <= _LEVEL_DENOM:
            raise ValueError(
                f"magnitude_max (timm's mmax) above {_LEVEL_DENOM:g} is not served: Rotate "
                "reaches 90 degrees, where PIL transposes instead of sampling; got "
                f"{self.magnitude_max}"
            )
        if self.interpolation not in ("bilinear", "bicubic", "random"):
            raise ValueError(
                "interpolation must be 'bilinear', 'bicubic' or 'random' (PIL's nearest "
                f"affine path is not served), not {self.interpolation!r}"
            )
        if len(self.fill) != 3 or not all(0 <= int(level) <= 255 for level in self.fill):
            raise ValueError(f"fill must be three levels in 0..255, not {self.fill}")

    @classmethod
    def from_config(
        cls,
        config: str,
        *,
        image_size: int = 224,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        interpolation: TimmResample = "bicubic",
    ) -> TimmRandAugment:
        """timm's own parse of ``config`` with ``create_transform``'s
        hyperparameters (needs timm)."""
        from PIL import Image
        from timm.data.auto_augment import rand_augment_transform

        hparams: dict[str, Any] = {
            "translate_const": int(image_size * 0.45),
            "img_mean": tuple(min(255, round(255 * x)) for x in mean),
        }
        if interpolation != "random":
            hparams["interpolation"] = getattr(Image.Resampling, interpolation.upper())
        return rand_augment(rand_augment_transform(config, hparams))

    def to_message(self) -> Any:
        random = self.interpolation == "random"
        return pb.TimmRandAugment(
            ops=[_op_wire(name) for name in self.ops],
            num_layers=self.num_layers,
            magnitude=float(self.magnitude),
            magnitude_std=float(self.magnitude_std),
            magnitude_max=float(self.magnitude_max),
            prob=float(self.prob),
            translate_pct=float(self.translate_pct),
            translate_const=float(self.translate_const),
            resample=pb.INTERPOLATION_BICUBIC
            if self.interpolation == "bicubic"
            else pb.INTERPOLATION_BILINEAR,
            random_resample=random,
            fill=[int(level) for level in self.fill],
        )


def _resampling(resample: Any) -> TimmResample:
    """timm's ``resample`` kwarg (a PIL filter, or the random pair) as
    served, or ``TypeError``."""
    from PIL import Image

    names = {Image.Resampling.BILINEAR: "bilinear", Image.Resampling.BICUBIC: "bicubic"}
    if isinstance(resample, (list, tuple)):
        if set(resample) == set(names):
            return "random"
    elif resample in names:
        return names[resample]  # type: ignore[return-value]
    raise TypeError(
        f"timm's RandAugment with resample={resample!r}: the sidecar samples timm's "
        "geometric ops bilinear, bicubic or randomly one of the two (create_transform's "
        "interpolation 'bilinear', 'bicubic' or 'random')"
    )


def rand_augment(step: Any) -> TimmRandAugment:
    """timm's ``RandAugment`` object as served, or ``TypeError`` naming
    what is not."""
    if step.choice_weights is not None:
        raise TypeError(
            "timm's RandAugment with weighted op choice ('tweights', '3aw': drawn without "
            f"replacement) is not served; use the unweighted lists, {_WAY_OUT}"
        )
    if not step.ops:
        raise TypeError("timm's RandAugment without ops: nothing to serve")
    first = step.ops[0]
    shared = (
        "prob",
        "magnitude",
        "magnitude_std",
        "magnitude_max",
    )
    for op in step.ops:
        for name in shared:
            if getattr(op, name) != getattr(first, name):
                raise TypeError(
                    f"timm's RandAugment whose ops differ in {name} ({op.name}): the sidecar "
                    f"takes one {name} for all ops, as rand_augment_transform builds them"
                )
        if op.hparams != first.hparams or op.kwargs != first.kwargs:
            raise TypeError(
                f"timm's RandAugment whose ops differ in hparams ({op.name}): the sidecar "
                "takes one set for all ops, as rand_augment_transform builds them"
            )
    fill = first.kwargs.get("fillcolor", (128, 128, 128))
    if not (isinstance(fill, (tuple, list)) and len(fill) == 3):
        raise TypeError(f"timm's RandAugment with fillcolor={fill!r}: three levels are served")
    try:
        return TimmRandAugment(
            ops=tuple(op.name for op in step.ops),
            num_layers=int(step.num_layers),
            magnitude=float(first.magnitude),
            magnitude_std=float(first.magnitude_std or 0.0),
            magnitude_max=float(first.magnitude_max or _LEVEL_DENOM),
            prob=float(first.prob),
            translate_pct=float(first.hparams.get("translate_pct", 0.45)),
            translate_const=float(first.hparams.get("translate_const", 250)),
            interpolation=_resampling(first.kwargs.get("resample")),
            fill=(int(fill[0]), int(fill[1]), int(fill[2])),
        )
    except ValueError as error:
        raise TypeError(f"timm's RandAugment: {error}; {_WAY_OUT}") from None


_AS_TORCHVISION = {
    "RandomResizedCropAndInterpolation": "RandomResizedCrop",
    "RandAugment": "TimmRandAugment",
    "MaybeToTensor": "ToTensor",
    "MaybePILToTensor": "PILToTensor",
    "ToTensor": "ToDtype",
    "RandomErasing": "RandomErasing",
}

_WAY_OUT = "or apply it to the delivered batch"


def as_torchvision(step: Any) -> str:
    """The torchvision row a timm step is, or ``TypeError`` naming it."""
    name = type(step).__name__
    if name in ("AutoAugment", "AugMixAugment"):
        raise TypeError(
            f"timm's {name} (create_transform's auto_augment string) is not served: its "
            "policy and PIL kernels are timm's own, and the sidecar will not run "
            "torchvision's for it. Served: timm's RandAugment (auto_augment='rand-...'), "
            "or torchvision's RandAugment, TrivialAugmentWide or AutoAugment after the "
            f"flip, {_WAY_OUT}"
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
