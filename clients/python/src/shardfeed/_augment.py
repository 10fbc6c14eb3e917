"""How each source image becomes a sample: the augmentation a request
names (the server decides each sample's crop and flip before decoding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Union

from ._policies import (
    ColorJitter,
    GaussianBlur,
    Policy,
    RandomAdjustSharpness,
    RandomAffine,
    RandomErasing,
    RandomPhotometricDistort,
    RandomPosterize,
    RandomRotation,
    RandomSolarize,
)
from ._proto import shardfeed_pb2 as pb
from ._timm import TimmRandAugment

ImageSize = Union[int, tuple[int, int]]

Crop = Literal["center", "random_resized", "stretch"]
# How the crop is resized: antialiased, as torchvision's and PIL's resize.
ResizeInterpolation = Literal["bilinear", "bicubic"]

# torchvision's evaluation convention: Resize(256) + CenterCrop(224).
_EVAL_RESIZE_RATIO = 256 / 224


# The ops that are a probability alone (torchvision's p).
_PROBABILITIES = (
    "horizontal_flip",
    "vertical_flip",
    "grayscale",
    "equalize",
    "autocontrast",
    "invert",
)


# The ops that are a message of their own (None: off).
_MESSAGES = (
    "auto_augment",
    "color_jitter",
    "random_erasing",
    "gaussian_blur",
    "solarize",
    "rotation",
    "affine",
    "photometric_distort",
    "timm_rand_augment",
    "sharpness",
    "posterize",
)


GroupKind = Literal["apply", "choice", "order"]

_GROUP_KINDS = {
    "apply": pb.OP_GROUP_KIND_APPLY,
    "choice": pb.OP_GROUP_KIND_CHOICE,
    "order": pb.OP_GROUP_KIND_ORDER,
}


@dataclass(frozen=True)
class OpGroup:
    """torchvision's containers over ops of an :class:`Augment`, by the
    server's row names (``Describe.augmentation_ops``: ``"grayscale"``,
    ``"gaussian_blur"``, ...): ``"apply"`` is ``RandomApply([...], p)``
    (one coin for all the rows), ``"choice"`` ``RandomChoice([...], p)``
    (exactly one row runs, by ``weights``; None: equal), ``"order"``
    ``RandomOrder([...])`` (every row runs, in an order drawn per sample).
    The rows must be on in the ``Augment`` and next to each other in the
    table's order (the server refuses the rest, naming the row); each
    group draws from its own key, so its decisions are the sample's own."""

    kind: GroupKind
    rows: tuple[str, ...]
    p: float = 0.5
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in _GROUP_KINDS:
            raise ValueError(f"kind must be 'apply', 'choice' or 'order', not {self.kind!r}")
        if not self.rows:
            raise ValueError("a group names at least one row")
        if self.kind == "apply" and not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], not {self.p}")
        if self.weights is not None and (
            self.kind != "choice" or len(self.weights) != len(self.rows)
        ):
            raise ValueError("weights are for a 'choice' group, one per row")

    def to_message(self) -> Any:
        return pb.OpGroup(
            kind=_GROUP_KINDS[self.kind],
            rows=list(self.rows),
            p=self.p if self.kind == "apply" else 0.0,
            weights=list(self.weights or ()),
        )


@dataclass(frozen=True)
class Augment:
    """How each source image becomes a sample, decided by the server per
    sample from (seed, epoch, shard, key) before decoding: the same sample
    gets the same crop and flip at any world size, worker count or resume
    point, and a fresh one each epoch.

    ``crop="random_resized"`` is torchvision's ``RandomResizedCrop(scale,
    ratio)``; ``crop="center"`` is ``Resize(resize) + CenterCrop`` (``resize``
    0: the smallest scale that covers the output); ``crop="stretch"`` scales
    each side to the output. ``interpolation`` is the crop's resize,
    ``"bilinear"`` or ``"bicubic"``, antialiased as torchvision's and PIL's.
    The ops after the crop follow, each applied to the resized output in
    the server's table order: ``horizontal_flip`` is the probability of
    mirroring a sample; ``auto_augment`` one of
    :class:`TrivialAugmentWide`, :class:`RandAugment`, :class:`AutoAugment`;
    ``timm_rand_augment`` a :class:`TimmRandAugment` (timm's, after it);
    ``color_jitter`` a :class:`ColorJitter`; ``grayscale`` the probability
    of ``RandomGrayscale``; ``gaussian_blur`` a :class:`GaussianBlur` and
    ``solarize`` a :class:`RandomSolarize` (after the grayscale coin, as
    the self-supervised recipes order them); ``random_erasing`` a
    :class:`RandomErasing`
    (last, as the recipes apply it after Normalize). torchvision's other
    single-op transforms: ``vertical_flip`` (its p, right after the
    horizontal flip), ``rotation`` a :class:`RandomRotation` and ``affine``
    a :class:`RandomAffine` (then), ``photometric_distort`` a
    :class:`RandomPhotometricDistort` (after ``color_jitter``), and
    after ``solarize``: ``sharpness`` a :class:`RandomAdjustSharpness`,
    ``posterize`` a :class:`RandomPosterize`, then the probabilities
    ``equalize``, ``autocontrast`` and ``invert``. Each sample's ops are
    its own draws, reported in :attr:`Batch.ops`. ``groups`` puts
    torchvision's containers (RandomApply of several, RandomChoice,
    RandomOrder) over rows that are on, each an :class:`OpGroup`. Use
    :meth:`train` and :meth:`eval` for the standard recipes.
    """

    crop: Crop = "center"
    resize: int = 0
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    horizontal_flip: float = 0.0
    interpolation: ResizeInterpolation = "bilinear"
    auto_augment: Policy | None = None
    color_jitter: ColorJitter | None = None
    grayscale: float = 0.0
    random_erasing: RandomErasing | None = None
    gaussian_blur: GaussianBlur | None = None
    solarize: RandomSolarize | None = None
    vertical_flip: float = 0.0
    rotation: RandomRotation | None = None
    affine: RandomAffine | None = None
    photometric_distort: RandomPhotometricDistort | None = None
    sharpness: RandomAdjustSharpness | None = None
    posterize: RandomPosterize | None = None
    equalize: float = 0.0
    autocontrast: float = 0.0
    invert: float = 0.0
    timm_rand_augment: TimmRandAugment | None = None
    groups: tuple[OpGroup, ...] = ()
    # What the trainer does after the ops (not sent: the client applies
    # them, see ShardfeedDataset): Normalize's (mean, std) and the dtype.
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    dtype: Any = None
    # Whether a float dtype divides by 255 first (torchvision's
    # ToDtype(scale=True) and ToTensor; ToDtype(float32) alone does not);
    # None: ModelInput's default (divided where normalized).
    to_unit_range: bool | None = None
    # "NCHW" where the transform ends in torchvision's CHW tensors (ToImage
    # with no float dtype); None: the stream's own layout.
    layout: Literal["NHWC", "NCHW"] | None = None
    # The output size a converted transform makes: the stream's
    # `image_size` when it names none; None: whatever the stream asks.
    size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name in _PROBABILITIES:
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], not {p}")
        if self.interpolation not in ("bilinear", "bicubic"):
            raise ValueError(
                f"interpolation must be 'bilinear' or 'bicubic' (the crop's antialiased "
                f"resize), not {self.interpolation!r}"
            )

    @classmethod
    def train(
        cls,
        *,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        horizontal_flip: float = 0.5,
        auto_augment: Policy | None = None,
        color_jitter: ColorJitter | None = None,
        grayscale: float = 0.0,
        random_erasing: RandomErasing | None = None,
        interpolation: ResizeInterpolation = "bilinear",
        gaussian_blur: GaussianBlur | None = None,
        solarize: RandomSolarize | None = None,
        **single_ops: Any,
    ) -> Augment:
        """RandomResizedCrop (``interpolation`` its resize) +
        RandomHorizontalFlip, torchvision's defaults, then the ops named
        (torchvision's recipe of ResNet-50 V2 is
        ``auto_augment=TrivialAugmentWide(interpolation="bilinear"),
        random_erasing=RandomErasing(0.1)``); ``single_ops`` are the other
        fields of the ops (``vertical_flip=0.5``, ``rotation=...``)."""
        return cls(
            crop="random_resized",
            scale=scale,
            ratio=ratio,
            horizontal_flip=horizontal_flip,
            interpolation=interpolation,
            auto_augment=auto_augment,
            color_jitter=color_jitter,
            grayscale=grayscale,
            random_erasing=random_erasing,
            gaussian_blur=gaussian_blur,
            solarize=solarize,
            **single_ops,
        )

    @classmethod
    def eval(
        cls,
        image_size: ImageSize = 224,
        *,
        resize: int | None = None,
        interpolation: ResizeInterpolation = "bilinear",
    ) -> Augment:
        """Resize(resize, interpolation) + CenterCrop(image_size);
        ``resize`` defaults to the longer output side x 256/224 (256 for
        224)."""
        if resize is None:
            resize = round(max(_image_size(image_size)) * _EVAL_RESIZE_RATIO)
        return cls("center", resize, interpolation=interpolation)

    def to_message(self) -> Any:
        """The request's ``Augmentation``: the crop, then the ops after it
        (the Python mirror of the server's op table, one field per op)."""
        message = pb.Augmentation(**{name: getattr(self, name) for name in _PROBABILITIES})
        if self.interpolation == "bicubic":
            message.resize_interpolation = pb.INTERPOLATION_BICUBIC
        for name in _MESSAGES:
            op = getattr(self, name)
            if op is not None:
                getattr(message, name).CopyFrom(op.to_message())
        message.groups.extend(group.to_message() for group in self.groups)
        if self.crop == "center":
            message.center_crop.CopyFrom(pb.CenterCrop(resize=self.resize))
        elif self.crop == "random_resized":
            message.random_resized_crop.CopyFrom(
                pb.RandomResizedCrop(
                    scale_min=self.scale[0],
                    scale_max=self.scale[1],
                    ratio_min=self.ratio[0],
                    ratio_max=self.ratio[1],
                )
            )
        elif self.crop == "stretch":
            message.stretch.SetInParent()
        else:
            raise ValueError(
                f"crop must be 'center', 'random_resized' or 'stretch', not {self.crop!r}"
            )
        return message


AugmentSpec = Union[Literal["train", "eval"], Augment, None]


def _augment(augment: AugmentSpec, image_size: ImageSize) -> Augment | None:
    if augment is None or isinstance(augment, Augment):
        return augment
    if augment == "train":
        return Augment.train()
    if augment == "eval":
        return Augment.eval(image_size)
    module = type(augment).__module__.split(".")[0]
    if module in ("torchvision", "timm"):
        raise TypeError(
            f"augment takes an Augment, 'train', 'eval' or None, not a {module} "
            f"{type(augment).__name__}: wrap it in shardfeed.from_torchvision(...)"
        )
    raise ValueError(f"augment must be 'train', 'eval', an Augment or None, not {augment!r}")


DEFAULT_IMAGE_SIZE = 224


def resolve_image_size(image_size: ImageSize | None, augment: AugmentSpec) -> ImageSize:
    """The stream's output size: ``image_size``, else the size a converted
    transform makes (``RandomResizedCrop(176)`` streams 176²), else 224. A
    size that differs from the transform's is a ``ValueError``: one of
    them would be silently wrong."""
    made = augment.size if isinstance(augment, Augment) else None
    if image_size is None:
        return made if made is not None else DEFAULT_IMAGE_SIZE
    if made is not None and _image_size(image_size) != made:
        raise ValueError(
            f"image_size={image_size!r} differs from the {made[0]}x{made[1]} output of the "
            "transform the augment was converted from; pass neither (the transform's size "
            "is used) or the same"
        )
    return image_size


def _image_size(size: ImageSize) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    height, width = size
    return int(height), int(width)
