"""``from_torchvision``: a torchvision (v1 or v2) or timm transform as the
``Augment`` the sidecar runs, with the trainer's conversions.

What the user wrote is what runs. Each step becomes a row of the sidecar's
table with torchvision's own semantics (sizes, probabilities,
interpolation, antialiasing, dtype, scaling, layout), or the conversion
raises ``TypeError`` naming the transform, the argument and the nearest
form that is served. Nothing is converted to something close: a
``RandomApply`` is not flattened, a ``RandomChoice`` does not become its
last choice (containers over rows are the sidecar's groups, drawn as
torchvision draws them), a ``CenterCrop`` without a ``Resize`` is not a
resize.

The table's order (``_ORDER``): the crop (``RandomResizedCrop``,
``Resize`` + ``CenterCrop``, or ``Resize((h, w))``),
``RandomHorizontalFlip``, ``RandomVerticalFlip``, ``RandomRotation``,
``RandomAffine``, one
auto-augment policy, ``ColorJitter``, ``RandomPhotometricDistort``,
``RandomGrayscale``,
``GaussianBlur``, ``RandomSolarize``, ``RandomAdjustSharpness``,
``RandomPosterize``, ``RandomEqualize``, ``RandomAutocontrast``,
``RandomInvert``, the conversions (``ToImage``/``PILToTensor``/
``ToTensor``, ``ToDtype``/``ConvertImageDtype``, ``Normalize``: the
trainer's side applies these, see :class:`shardfeed.torch.ModelInput`),
then ``RandomErasing``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from . import _timm
from ._augment import Augment, OpGroup
from ._policies import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    AutoAugment,
    ColorJitter,
    GaussianBlur,
    Interpolation,
    RandAugment,
    RandomAdjustSharpness,
    RandomAffine,
    RandomErasing,
    RandomPhotometricDistort,
    RandomPosterize,
    RandomRotation,
    RandomSolarize,
    TrivialAugmentWide,
)

# The table's order, a stage per entry; the stages of a transform's steps
# never decrease. The conversions' stage is the trainer's side: it applies
# them between the sidecar's last pixel op and RandomErasing.
_ORDER: tuple[tuple[str, ...], ...] = (
    ("RandomResizedCrop", "Resize", "CenterCrop"),
    ("RandomHorizontalFlip",),
    ("RandomVerticalFlip",),
    ("RandomRotation",),
    ("RandomAffine",),
    ("TrivialAugmentWide", "RandAugment", "AutoAugment"),
    ("TimmRandAugment",),
    ("ColorJitter",),
    ("RandomPhotometricDistort",),
    ("RandomGrayscale",),
    ("GaussianBlur",),
    ("RandomSolarize",),
    ("RandomAdjustSharpness",),
    ("RandomPosterize",),
    ("RandomEqualize",),
    ("RandomAutocontrast",),
    ("RandomInvert",),
    ("ToImage", "PILToTensor", "ToTensor", "ToDtype", "ConvertImageDtype", "Normalize"),
    ("RandomErasing",),
)
_STAGES = {name: stage for stage, names in enumerate(_ORDER) for name in names}
_CONVERSIONS = _STAGES["Normalize"]

# The server's row (``Describe.augmentation_ops``) each op transform is:
# ordered by _STAGES, the rows must come in the server's table order (a
# test holds the two to each other).
SERVER_ROWS = {
    "RandomHorizontalFlip": "horizontal_flip",
    "TrivialAugmentWide": "auto_augment",
    "RandAugment": "auto_augment",
    "AutoAugment": "auto_augment",
    "TimmRandAugment": "timm_rand_augment",
    "ColorJitter": "color_jitter",
    "RandomPhotometricDistort": "photometric_distort",
    "RandomGrayscale": "grayscale",
    "GaussianBlur": "gaussian_blur",
    "RandomSolarize": "solarize",
    "RandomVerticalFlip": "vertical_flip",
    "RandomRotation": "rotation",
    "RandomAffine": "affine",
    "RandomAdjustSharpness": "sharpness",
    "RandomPosterize": "posterize",
    "RandomEqualize": "equalize",
    "RandomAutocontrast": "autocontrast",
    "RandomInvert": "invert",
    "RandomErasing": "random_erasing",
}

# What a flip gives the same pixels before or after (to the level): the
# ops that treat each pixel alike wherever it is (pointwise, a whole
# channel's statistics, or a symmetric kernel with mirrored borders). MoCo
# v2 writes its flip after the blur.
_FLIPS = frozenset({"RandomHorizontalFlip", "RandomVerticalFlip"})
_COMMUTE_WITH_FLIPS = frozenset(
    {
        # A mirror and the other axis's mirror give the same image in
        # either order; the photometric distortion is pointwise, whole-image
        # statistics and a channel shuffle.
        *_FLIPS,
        "RandomPhotometricDistort",
        "ColorJitter",
        "RandomGrayscale",
        "GaussianBlur",
        "RandomSolarize",
        "RandomAdjustSharpness",
        "RandomPosterize",
        "RandomEqualize",
        "RandomAutocontrast",
        "RandomInvert",
        *_ORDER[_CONVERSIONS],
    }
)


def _commutes(name: str, seen: list[str]) -> bool:
    """Whether ``name``, written after the steps ``seen``, can run at its
    own (earlier) place in the table with the same result: a flip after
    ops that a flip does not change."""
    later = [other for other in seen if _STAGES[other] > _STAGES[name]]
    return name in _FLIPS and all(other in _COMMUTE_WITH_FLIPS for other in later)


# Conversions without an effect on the pixels, allowed anywhere.
_NEUTRAL = frozenset({"ToPureTensor"})

WAY_OUT = (
    "apply it to the delivered batch instead (the sidecar runs RandomResizedCrop, "
    "Resize + CenterCrop, RandomHorizontalFlip, RandomVerticalFlip, RandomRotation, "
    "RandomAffine, "
    "TrivialAugmentWide, RandAugment, AutoAugment(IMAGENET), timm's RandAugment, ColorJitter, "
    "RandomPhotometricDistort, RandomGrayscale, "
    "GaussianBlur, RandomSolarize, RandomAdjustSharpness, RandomPosterize, RandomEqualize, "
    "RandomAutocontrast, RandomInvert, RandomErasing)"
)

# The order as an error message names it.
_ORDER_NAMED = ", ".join(
    "crop" if stage == 0 else "the conversions" if stage == _CONVERSIONS else " / ".join(names)
    for stage, names in enumerate(_ORDER)
)

_MIXING = frozenset({"MixUp", "CutMix", "Mixup", "FastCollateMixup"})

# How the sidecar resizes a crop (antialiased, as torchvision and PIL).
_RESIZES = ("bilinear", "bicubic")

# The dtypes the trainer's side converts to (ModelInput).
_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def refuse_mixing(name: str) -> TypeError:
    return TypeError(
        f"{name} mixes whole batches, after the sidecar: use "
        "ShardfeedDataset(mixing=shardfeed.torch.Mixing(num_classes, mixup_alpha, "
        "cutmix_alpha, switch_prob, label_smoothing)), which mixes each batch as "
        "torchvision v2's MixUp/CutMix do"
    )


# The rows a probability can be put on exactly: RandomApply([t], p) of
# these is the row with its own probability (jitter) or the product of
# both (independent coin flips).
_PROBABLE = frozenset(
    {
        "ColorJitter",
        "GaussianBlur",
        "RandomErasing",
        "RandomGrayscale",
        "RandomHorizontalFlip",
        "RandomSolarize",
        "RandomVerticalFlip",
        "RandomAdjustSharpness",
        "RandomPosterize",
        "RandomEqualize",
        "RandomAutocontrast",
        "RandomInvert",
    }
)


@dataclass(frozen=True)
class _Applied:
    """One step of a ``RandomApply``, applied with probability ``p``."""

    step: Any
    p: float


@dataclass(frozen=True)
class _Grouped:
    """A container over rows (RandomApply of several, RandomChoice,
    RandomOrder): each member one step (possibly ``_Applied``)."""

    kind: str
    container: str
    members: list[Any]
    p: float = 0.5
    weights: tuple[float, ...] | None = None


def _leaves(transform: Any) -> list[Any]:
    """The steps a transform runs, containers opened where that is exact:
    a Compose (v1 or v2) or a reference preset holding one, a
    ``RandomApply`` with p 1 (always) or 0 (never) or around one row that
    takes a probability, a ``RandomChoice`` or ``RandomOrder`` of one
    transform. ``RandomApply`` of other rows, ``RandomChoice`` and
    ``RandomOrder`` become a group (``_Grouped``) over their rows. Any
    other container is refused."""
    name = type(transform).__name__
    inner: Any = getattr(transform, "transforms", None)
    if name == "RandomApply":
        p = float(transform.p)
        steps = [step for t in inner for step in _leaves(t)]
        if p == 1.0:
            return steps
        if p == 0.0:
            return []
        if len(steps) == 1 and type(steps[0]).__name__ in _PROBABLE:
            return [_Applied(steps[0], p)]
        return [_Grouped("apply", _listed(name, steps), steps, p=p)]
    if name in ("RandomChoice", "RandomOrder"):
        if len(inner) == 1:
            return _leaves(inner[0])
        members = []
        for member in inner:
            steps = _leaves(member)
            if len(steps) != 1 or isinstance(steps[0], _Grouped):
                raise TypeError(
                    f"{_listed(name, inner)}: a member that is itself several transforms "
                    f"({type(member).__name__}) is not one op of the sidecar's table; "
                    f"make each member one transform, or {WAY_OUT}"
                )
            members.append(steps[0])
        if name == "RandomOrder":
            return [_Grouped("order", _listed(name, inner), members)]
        weights = getattr(transform, "p", None)
        weights = None if weights is None else tuple(float(w) for w in weights)
        return [_Grouped("choice", _listed(name, inner), members, weights=weights)]
    if isinstance(inner, (list, tuple)):
        if name != "Compose":
            raise TypeError(f"{name} holds transforms the sidecar cannot order: {WAY_OUT}")
        return [step for t in inner for step in _leaves(t)]
    if inner is not None and inner is not transform:
        return _leaves(inner)  # a preset: ClassificationPresetTrain/Eval
    return [transform]


def _listed(container: str, steps: list[Any]) -> str:
    """A container as an error message names it: ``RandomChoice([A, B])``."""
    names = (type(getattr(t, "step", t)).__name__ for t in steps)
    return f"{container}([{', '.join(names)}])"


def interpolation(step: Any, *, allowed: tuple[str, ...] = ("nearest", "bilinear")) -> Any:
    """A transform's interpolation as the sidecar names it, or ``TypeError``."""
    mode = getattr(step, "interpolation", None)
    name: Any = getattr(mode, "value", mode)
    name = {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(name, name)
    if name in allowed:
        return str(name)
    served = " or ".join(allowed)
    raise TypeError(
        f"{type(step).__name__} with interpolation {name}: the sidecar serves {served} "
        f"here; pass one of them, or {WAY_OUT}"
    )


def _antialiased(step: Any) -> None:
    if getattr(step, "antialias", True) is False:
        raise TypeError(
            f"{type(step).__name__}(antialias=False): the sidecar's resize is antialiased "
            f"(torchvision's default, and PIL's); drop antialias=False, or {WAY_OUT}"
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


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class _Conversion:
    """What the steps read so far make of a sample."""

    augment: Augment = field(default_factory=Augment)
    stage: int = -1
    seen: list[str] = field(default_factory=list)
    # The crop's steps so far: "resize" (Resize(S), waiting for its
    # CenterCrop), "crop" (an output size is set).
    crop: str | None = None
    resize: int = 0
    # None while the sample is uint8; else the float dtype and whether the
    # conversion divided by 255.
    dtype: Any = None
    to_unit_range: bool = True
    tensor: bool = False
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def crop_step(self, name: str, step: Any) -> None:
        if name == "RandomResizedCrop":
            if self.crop is not None:
                raise TypeError(
                    f"RandomResizedCrop after {self.crop_name()}: the sidecar crops the "
                    f"source image once; keep one of them, or {WAY_OUT}"
                )
            resize_with = interpolation(step, allowed=_RESIZES)
            _antialiased(step)
            self.set_crop(
                crop="random_resized",
                interpolation=resize_with,
                size=_size(step.size),
                scale=tuple(step.scale),
                ratio=tuple(step.ratio),
            )
        elif name == "Resize":
            self.resize_step(step)
        else:
            self.center_crop(step)

    def crop_name(self) -> str:
        return {"resize": "Resize", "crop": "a crop"}.get(self.crop or "", "nothing")

    def set_crop(self, **changes: Any) -> None:
        self.augment = replace(self.augment, **changes)
        self.crop = "crop"

    def resize_step(self, step: Any) -> None:
        if self.crop is not None:
            raise TypeError(
                f"Resize after {self.crop_name()}: the sidecar resizes once, from the source "
                f"image; keep one of them, or {WAY_OUT}"
            )
        self.augment = replace(self.augment, interpolation=interpolation(step, allowed=_RESIZES))
        _antialiased(step)
        if getattr(step, "max_size", None) is not None:
            raise TypeError(
                f"Resize(max_size={step.max_size}): the sidecar does not cap the longer "
                f"side; drop max_size, or {WAY_OUT}"
            )
        size = step.size
        if isinstance(size, int) or len(list(size)) == 1:
            self.resize = size if isinstance(size, int) else int(list(size)[0])
            self.crop = "resize"
        else:  # Resize((h, w)) scales each side to the output: a stretch.
            self.set_crop(crop="stretch", size=_size(size))

    def center_crop(self, step: Any) -> None:
        size = _size(step.size)
        if self.crop == "crop":
            if self.augment.size == size:
                return  # a crop to the size the output already has
            raise TypeError(
                f"CenterCrop({list(size)}) after a crop to {list(self.augment.size or ())}: "
                f"the sidecar crops the source image once; keep one of them, or {WAY_OUT}"
            )
        if self.crop is None:
            raise TypeError(
                f"CenterCrop({list(size)}) without a Resize before it cuts a window at the "
                "source's own scale, which the sidecar does not serve; the nearest served "
                f"form is Resize(S) + CenterCrop({list(size)}) with S >= {max(size)}; or " + WAY_OUT
            )
        if self.resize < max(size):
            raise TypeError(
                f"CenterCrop({list(size)}) after Resize({self.resize}): the crop is larger "
                "than the resized shorter side, so torchvision pads it with black, which "
                f"the sidecar does not; use Resize(S) with S >= {max(size)}, or {WAY_OUT}"
            )
        self.set_crop(crop="center", resize=self.resize, size=size)

    def conversion(self, name: str, step: Any) -> None:
        if name in ("ToImage", "PILToTensor"):
            self.tensor = True
        elif name == "ToTensor":
            import torch

            self.to_float(step, torch.float32, scale=True)
        elif name in ("ToDtype", "ConvertImageDtype"):
            dtype = step.dtype
            if isinstance(dtype, dict):  # v2: a dtype per input type
                dtype = next((v for k, v in dtype.items() if "Video" not in str(k)), None)
            scale = name == "ConvertImageDtype" or bool(getattr(step, "scale", False))
            self.to_float(step, dtype, scale=scale)
        else:  # Normalize
            if self.dtype is None:
                raise TypeError(
                    "Normalize on uint8 pixels: torchvision refuses it too; put "
                    "ToDtype(torch.float32, scale=True) (or ToTensor()) before it"
                )
            if self.normalize is not None:
                raise TypeError(f"a second Normalize: the trainer's side applies one; {WAY_OUT}")
            self.normalize = (tuple(map(float, step.mean)), tuple(map(float, step.std)))

    def to_float(self, step: Any, dtype: Any, *, scale: bool) -> None:
        name = _dtype_name(dtype)
        if name == "uint8" and self.dtype is None:
            self.tensor = True  # uint8 to uint8: nothing changes
            return
        if name not in _FLOAT_DTYPES:
            raise TypeError(
                f"{type(step).__name__}({name}): the trainer's side makes uint8, float32, "
                f"float16 or bfloat16 batches; convert the delivered batch, or {WAY_OUT}"
            )
        if self.normalize is not None:
            raise TypeError(
                f"{type(step).__name__}({name}) after Normalize: the trainer's side "
                "normalizes in the final dtype in one pass; put it before Normalize"
            )
        if self.dtype is None:
            self.to_unit_range = scale  # float to float never rescales
        self.dtype = dtype
        self.tensor = True

    def erasing(self, step: Any) -> RandomErasing:
        if _timm.is_timm(step):
            return _timm.erasing(step, self.erasing_normalize())
        value = step.value
        if value is None or value == "random":
            kind: Any = "random"
        elif isinstance(value, (int, float)):
            kind = [float(value)]
        else:
            kind = [float(v) for v in value]
        common = dict(p=float(step.p), scale=tuple(step.scale), ratio=tuple(step.ratio))
        if self.normalize is None:
            # Before Normalize: a value in the sample's own units.
            if kind == "random":
                raise TypeError(
                    "RandomErasing(value='random') before Normalize: the sidecar's noise is "
                    "N(0, 1) after Normalize; place it after Normalize, or " + WAY_OUT
                )
            scale = 255.0 if self.dtype is not None and self.to_unit_range else 1.0
            levels = [kind[0]] * 3 if len(kind) == 1 else kind
            colour = tuple(int(round(v * scale)) for v in levels)
            return RandomErasing(value=colour, **common)  # type: ignore[arg-type]
        norm = self.erasing_normalize()
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

    def erasing_normalize(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Normalize's (mean, std) in [0, 1] units, as the sidecar's erasing
        takes them (an unscaled float sample's are in levels)."""
        if self.normalize is None:
            return IMAGENET_MEAN, IMAGENET_STD
        if self.to_unit_range:
            return self.normalize
        mean, std = self.normalize
        return tuple(m / 255 for m in mean), tuple(s / 255 for s in std)

    def finish(self) -> Augment:
        if self.crop == "resize":
            raise TypeError(
                f"Resize({self.resize}) without a CenterCrop after it makes images of each "
                "source's own aspect ratio, which one batch cannot hold; add "
                f"CenterCrop({self.resize}) (or the size wanted), or use Resize((h, w))"
            )
        return replace(
            self.augment,
            normalize=self.normalize,
            dtype=self.dtype,
            # Without a float conversion there is no scaling to speak of.
            to_unit_range=self.to_unit_range if self.dtype is not None else None,
            layout="NCHW" if self.tensor else None,
        )


def from_torchvision(transform: Any) -> Augment:
    """The ``Augment`` of a torchvision or timm transform (see the module):
    served with its own semantics, or ``TypeError`` naming what is not.

    Its ``size`` is the output size the transform makes (``ShardfeedDataset``
    and ``Client.batches`` stream at it); ``normalize``, ``dtype``,
    ``to_unit_range`` and ``layout`` are what the trainer's side makes of
    the uint8 batch, as torchvision's conversions make them: ``ToImage``
    alone gives uint8 ``(N, 3, H, W)``, ``ToTensor`` or ``ToDtype(float32,
    scale=True)`` float32 in [0, 1], ``ToDtype(float32)`` float32 in
    [0, 255]."""
    state = _Conversion()
    for leaf in _leaves(transform):
        if isinstance(leaf, _Grouped):
            _group(state, leaf)
            continue
        step, p = _unwrapped(leaf)
        name = _row_name(step)
        if name is None:
            continue
        if _STAGES[name] < state.stage and not _commutes(name, state.seen):
            raise TypeError(
                f"{name} comes after a transform the sidecar applies later "
                f"(its order: {_ORDER_NAMED}): reorder it, or {WAY_OUT}"
            )
        state.stage = max(state.stage, _STAGES[name])
        state.seen.append(name)
        _step(state, name, step, p)
    return state.finish()


def _unwrapped(leaf: Any) -> tuple[Any, float]:
    return (leaf.step, leaf.p) if isinstance(leaf, _Applied) else (leaf, 1.0)


def _row_name(step: Any) -> str | None:
    """The table's name of a step (torchvision's), None for a step without
    an effect, or ``TypeError`` for one the sidecar does not run."""
    name = type(step).__name__
    if name in _MIXING:
        raise refuse_mixing(name)
    if name in _NEUTRAL:
        return None
    if _timm.is_timm(step):
        name = _timm.as_torchvision(step)
    if name not in _STAGES:
        raise TypeError(f"{name} is not run by the sidecar: {WAY_OUT}")
    return name


def _group(state: _Conversion, group: _Grouped) -> None:
    """A container over rows: each member set as its row, the group placed
    where its rows sit in the table's order (they run at one place, as the
    container does in the Compose)."""
    named = []
    for member in group.members:
        if isinstance(member, _Grouped):
            raise TypeError(
                f"{group.container} holds {member.container}: the sidecar's groups do not "
                f"nest; or {WAY_OUT}"
            )
        step, p = _unwrapped(member)
        name = _row_name(step)
        if name is None or name not in SERVER_ROWS or name == "RandomErasing":
            raise TypeError(
                f"{group.container}: {type(step).__name__} is not an op of the sidecar's "
                "table, which is what a container holds there (RandomErasing runs after "
                f"the trainer's conversions, apart); or {WAY_OUT}"
            )
        if p * float(getattr(step, "p", 1.0)) == 0.0:
            # torchvision would pick it and do nothing; the sidecar's
            # groups hold rows that run, so the member is named instead.
            raise TypeError(
                f"{group.container}: {name} with p=0 never runs, and a group holds ops "
                f"that run; drop it from the container (picking it does nothing), or {WAY_OUT}"
            )
        named.append((name, step, p))
    rows = [SERVER_ROWS[name] for name, _, _ in named]
    if len(set(rows)) != len(rows):
        raise TypeError(
            f"{group.container}: two of its transforms are one row of the sidecar's table "
            f"({', '.join(rows)}), which a stream runs once; the nearest served form is "
            f"one of them alone; or {WAY_OUT}"
        )
    for name, _, _ in named:
        if name in state.seen:
            raise TypeError(f"{group.container}: {name} also appears outside it; {WAY_OUT}")
    stages = [_STAGES[name] for name, _, _ in named]
    if min(stages) < state.stage:
        raise TypeError(
            f"{group.container} comes after a transform the sidecar applies later "
            f"(its order: {_ORDER_NAMED}): reorder it, or {WAY_OUT}"
        )
    state.stage = max(stages)
    for name, step, p in named:
        state.seen.append(name)
        _step(state, name, step, p)
    op_group = OpGroup(group.kind, tuple(rows), p=group.p, weights=group.weights)  # type: ignore[arg-type]
    state.augment = replace(state.augment, groups=(*state.augment.groups, op_group))


# The rows that are a probability alone: the Augment field each sets, to
# the transform's p times the RandomApply's around it.
_COINS = {
    "RandomHorizontalFlip": "horizontal_flip",
    "RandomVerticalFlip": "vertical_flip",
    "RandomGrayscale": "grayscale",
    "RandomEqualize": "equalize",
    "RandomAutocontrast": "autocontrast",
    "RandomInvert": "invert",
}


def _step(state: _Conversion, name: str, step: Any, p: float) -> None:
    """One step into ``state``; ``p``: the RandomApply around it."""
    if _STAGES[name] == 0:
        state.crop_step(name, step)
    elif _STAGES[name] == _CONVERSIONS:
        state.conversion(name, step)
    elif name in _COINS:
        probability: dict[str, Any] = {_COINS[name]: p * float(step.p)}
        state.augment = replace(state.augment, **probability)
    elif name == "RandomErasing":
        erasing = state.erasing(step)
        state.augment = replace(state.augment, random_erasing=replace(erasing, p=p * erasing.p))
    elif name in _ROWS:
        field_name, build = _ROWS[name]
        row: dict[str, Any] = {field_name: build(step, p)}
        state.augment = replace(state.augment, **row)
    else:
        state.augment = replace(state.augment, auto_augment=_policy(name, step))


def _jitter(step: Any, p: float) -> ColorJitter:
    b, c, s, h = (
        tuple(r) if r is not None else 0.0
        for r in (step.brightness, step.contrast, step.saturation, step.hue)
    )
    return ColorJitter(brightness=b, contrast=c, saturation=s, hue=h, p=p)


def _blur(step: Any, p: float) -> GaussianBlur:
    width, height = (int(side) for side in step.kernel_size)
    low, high = (float(v) for v in step.sigma)
    return GaussianBlur((width, height), (low, high), p=p)


def _distort(step: Any, p: float) -> RandomPhotometricDistort:
    del p  # not in _PROBABLE: a RandomApply around it is refused
    return RandomPhotometricDistort(
        brightness=_pair(step.brightness),
        contrast=_pair(step.contrast),
        saturation=_pair(step.saturation),
        hue=_pair(step.hue),
        p=float(step.p),
    )


# The rows built from the step: the Augment field and the builder, which
# takes the RandomApply's p around it (1 where _PROBABLE does not name it).
_ROWS: dict[str, tuple[str, Callable[[Any, float], Any]]] = {
    "ColorJitter": ("color_jitter", _jitter),
    "GaussianBlur": ("gaussian_blur", _blur),
    "RandomSolarize": (
        "solarize",
        lambda step, p: RandomSolarize(float(step.threshold), p * float(step.p)),
    ),
    "RandomRotation": ("rotation", lambda step, p: _rotation(step)),
    "RandomAffine": ("affine", lambda step, p: _affine(step)),
    "RandomPhotometricDistort": ("photometric_distort", _distort),
    "TimmRandAugment": ("timm_rand_augment", lambda step, p: _timm.rand_augment(step)),
    "RandomAdjustSharpness": (
        "sharpness",
        lambda step, p: RandomAdjustSharpness(float(step.sharpness_factor), p * float(step.p)),
    ),
    "RandomPosterize": (
        "posterize",
        lambda step, p: RandomPosterize(int(step.bits), p * float(step.p)),
    ),
}


def _rotation(step: Any) -> RandomRotation:
    if getattr(step, "expand", False):
        raise TypeError(
            "RandomRotation(expand=True) makes each sample's own size, which one batch "
            f"cannot hold; drop expand, or {WAY_OUT}"
        )
    _about_the_centre(step)
    low, high = (float(v) for v in step.degrees)
    sampling: Interpolation = interpolation(step)
    return RandomRotation((low, high), sampling, _fill(step))


def _pair(values: Any) -> tuple[float, float]:
    low, high = values
    return float(low), float(high)


def _about_the_centre(step: Any) -> None:
    if getattr(step, "center", None) is not None:
        raise TypeError(
            f"{type(step).__name__}(center={list(step.center)}): the sidecar turns about the "
            f"output's centre; drop center, or {WAY_OUT}"
        )


def _affine(step: Any) -> RandomAffine:
    _about_the_centre(step)
    low, high = (float(v) for v in step.degrees)
    translate = None if step.translate is None else tuple(map(float, step.translate))
    scale = None if step.scale is None else tuple(map(float, step.scale))
    shear = None if step.shear is None else [float(v) for v in step.shear]
    sampling: Interpolation = interpolation(step)
    return RandomAffine(
        (low, high),
        translate,  # type: ignore[arg-type]
        scale,  # type: ignore[arg-type]
        shear,
        sampling,
        _fill(step),
    )


def _policy(name: str, step: Any) -> Any:
    sampling: Interpolation = interpolation(step)
    if name == "TrivialAugmentWide":
        return TrivialAugmentWide(step.num_magnitude_bins, sampling, _fill(step))
    if name == "RandAugment":
        return RandAugment(
            step.num_ops, step.magnitude, step.num_magnitude_bins, sampling, _fill(step)
        )
    if str(getattr(step.policy, "value", step.policy)).lower() != "imagenet":
        raise TypeError(
            f"AutoAugment({step.policy}): the sidecar serves the IMAGENET policy; " + WAY_OUT
        )
    return AutoAugment("imagenet", sampling, _fill(step))
