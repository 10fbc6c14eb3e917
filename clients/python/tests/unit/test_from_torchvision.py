"""``from_torchvision``: the reference recipes convert whole, in v1 and v2;
anything the sidecar does not run is refused, naming the transform."""

from __future__ import annotations

import math
from typing import Any

import pytest

from shardfeed import (
    Augment,
    AutoAugment,
    ColorJitter,
    GaussianBlur,
    OpGroup,
    RandAugment,
    RandomAdjustSharpness,
    RandomAffine,
    RandomErasing,
    RandomPhotometricDistort,
    RandomPosterize,
    RandomRotation,
    RandomSolarize,
    TrivialAugmentWide,
    from_torchvision,
)
from shardfeed._proto import shardfeed_pb2 as pb

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
from torchvision import transforms as v1  # noqa: E402
from torchvision.transforms import InterpolationMode, v2  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BILINEAR = InterpolationMode.BILINEAR


class PresetTrain:
    """The shape of torchvision's reference ``ClassificationPresetTrain``
    (references/classification/presets.py): a Compose kept in
    ``self.transforms``, built from the same arguments."""

    def __init__(self, auto_augment_policy: str | None, random_erase_prob: float) -> None:
        steps: list[Any] = [
            v2.RandomResizedCrop(176, interpolation=BILINEAR, antialias=True),
            v2.RandomHorizontalFlip(0.5),
        ]
        if auto_augment_policy == "ta_wide":
            steps.append(v2.TrivialAugmentWide(interpolation=BILINEAR))
        elif auto_augment_policy == "ra":
            steps.append(v2.RandAugment(interpolation=BILINEAR, magnitude=9))
        elif auto_augment_policy == "autoaugment":
            steps.append(v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET, interpolation=BILINEAR))
        steps += [v2.PILToTensor(), v2.ToDtype(torch.float, scale=True), v2.Normalize(MEAN, STD)]
        if random_erase_prob > 0:
            steps.append(v2.RandomErasing(p=random_erase_prob))
        steps.append(v2.ToPureTensor())
        self.transforms = v2.Compose(steps)


def test_the_resnet50_v2_recipe_converts_whole() -> None:
    augment = from_torchvision(PresetTrain("ta_wide", 0.1))
    assert augment == Augment(
        crop="random_resized",
        scale=(0.08, 1.0),
        ratio=(3 / 4, 4 / 3),
        horizontal_flip=0.5,
        auto_augment=TrivialAugmentWide(31, "bilinear", None),
        random_erasing=RandomErasing(0.1, value="mean", normalize=(MEAN, STD)),
        normalize=(MEAN, STD),
        dtype=torch.float32,
        to_unit_range=True,
        layout="NCHW",
        size=(176, 176),
    )


@pytest.mark.parametrize(
    "policy, expected",
    [
        ("ra", RandAugment(2, 9, 31, "bilinear", None)),
        ("autoaugment", AutoAugment("imagenet", "bilinear", None)),
    ],
)
def test_each_reference_policy_converts(policy: str, expected: Any) -> None:
    augment = from_torchvision(PresetTrain(policy, 0.25))
    assert augment.auto_augment == expected
    assert augment.random_erasing is not None and augment.random_erasing.p == 0.25


def test_v1_eval_and_colour_recipes() -> None:
    evaluation = from_torchvision(
        v1.Compose([v1.Resize(256), v1.CenterCrop(224), v1.ToTensor(), v1.Normalize(MEAN, STD)])
    )
    assert (evaluation.crop, evaluation.resize, evaluation.size) == ("center", 256, (224, 224))
    assert evaluation.normalize == (MEAN, STD) and evaluation.dtype == torch.float32
    colour = from_torchvision(
        v1.Compose(
            [
                v1.RandomResizedCrop(224),
                v1.RandomHorizontalFlip(),
                v1.ColorJitter(0.4, 0.4, 0.4, 0.1),
                v1.RandomGrayscale(0.2),
                v1.ToTensor(),
                v1.Normalize(MEAN, STD),
                v1.RandomErasing(0.25, value="random"),
            ]
        )
    )
    assert colour.color_jitter == ColorJitter((0.6, 1.4), (0.6, 1.4), (0.6, 1.4), (-0.1, 0.1))
    assert colour.grayscale == 0.2
    assert colour.random_erasing == RandomErasing(0.25, value="random", normalize=(MEAN, STD))
    assert colour.to_message().color_jitter.hue.max == pytest.approx(0.1)


def test_the_crop_size_is_the_output_size() -> None:
    from shardfeed._augment import resolve_image_size

    augment = from_torchvision(v2.RandomResizedCrop(176))
    assert resolve_image_size(None, augment) == (176, 176)
    assert resolve_image_size(176, augment) == 176
    with pytest.raises(ValueError, match="image_size=224 differs from the 176x176 output"):
        resolve_image_size(224, augment)
    assert resolve_image_size(None, None) == 224


@pytest.mark.parametrize(
    "transform, p",
    [
        (v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8), 0.8),
        (v1.RandomApply([v1.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8), 0.8),
    ],
)
def test_random_apply_keeps_its_probability(transform: Any, p: float) -> None:
    augment = from_torchvision(v2.Compose([v2.RandomResizedCrop(224), transform]))
    jitter = ColorJitter((0.6, 1.4), (0.6, 1.4), (0.8, 1.2), (-0.1, 0.1), p=p)
    assert augment.color_jitter == jitter
    assert augment.to_message().color_jitter.p == pytest.approx(p)
    # p = 1 and p = 0 are exact: always, never.
    always = from_torchvision(v2.RandomApply([v2.ColorJitter(0.4)], p=1.0))
    assert always.color_jitter == ColorJitter((0.6, 1.4))
    assert from_torchvision(v2.RandomApply([v2.ColorJitter(0.4)], p=0.0)).color_jitter is None


def test_random_apply_of_a_coin_flip_multiplies_and_of_several_is_one_coin() -> None:
    augment = from_torchvision(
        v2.Compose(
            [
                v2.RandomResizedCrop(224),
                v2.RandomApply([v2.RandomHorizontalFlip(0.5)], p=0.5),
                v2.RandomApply([v2.RandomGrayscale(0.4)], p=0.5),
            ]
        )
    )
    assert (augment.horizontal_flip, augment.grayscale) == (0.25, 0.2)
    # Several rows under one coin: a group, each row as written.
    both = from_torchvision(v2.RandomApply([v2.ColorJitter(0.4), v2.RandomGrayscale(1.0)], p=0.8))
    assert both.groups == (OpGroup("apply", ("color_jitter", "grayscale"), p=0.8),)
    assert (both.color_jitter, both.grayscale) == (ColorJitter((0.6, 1.4)), 1.0)
    # A row without a probability of its own: a group of one.
    policy = from_torchvision(v2.RandomApply([v2.TrivialAugmentWide()], p=0.5))
    assert policy.groups == (OpGroup("apply", ("auto_augment",), p=0.5),)
    message = policy.to_message().groups[0]
    assert (message.kind, list(message.rows), message.p) == (
        pb.OP_GROUP_KIND_APPLY,
        ["auto_augment"],
        0.5,
    )


def test_dinov2s_global_crop_converts_whole() -> None:
    """facebookresearch/dinov2 ``dinov2/data/augmentations.py``'s first
    global crop, written out: bicubic crop, flip, RandomApply(ColorJitter)
    0.8, grayscale 0.2, GaussianBlur(9, 0.1-2) with p 1.0; the second adds
    RandomSolarize(128, 0.2) after a blur with p 0.1."""
    bicubic = InterpolationMode.BICUBIC
    colour = [
        v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
        v2.RandomGrayscale(p=0.2),
    ]
    common = [
        v2.RandomResizedCrop(224, scale=(0.32, 1.0), interpolation=bicubic),
        v2.RandomHorizontalFlip(p=0.5),
        *colour,
    ]
    first = from_torchvision(
        v2.Compose([*common, v2.RandomApply([v2.GaussianBlur(9, sigma=(0.1, 2.0))], p=1.0)])
    )
    assert first.gaussian_blur == GaussianBlur((9, 9), (0.1, 2.0), p=1.0)
    assert first.color_jitter is not None and first.color_jitter.p == 0.8
    assert (first.interpolation, first.scale, first.grayscale) == ("bicubic", (0.32, 1.0), 0.2)
    second = from_torchvision(
        v2.Compose(
            [
                *common,
                v2.RandomApply([v2.GaussianBlur(9, sigma=(0.1, 2.0))], p=0.1),
                v2.RandomSolarize(threshold=128, p=0.2),
            ]
        )
    )
    assert second.gaussian_blur == GaussianBlur((9, 9), (0.1, 2.0), p=0.1)
    assert second.solarize == RandomSolarize(128.0, 0.2)
    message = second.to_message()
    assert message.gaussian_blur.p == pytest.approx(0.1)
    assert message.solarize.threshold == 128.0


@pytest.mark.parametrize("module", [v1, v2])
def test_the_single_op_transforms_convert_with_their_arguments(module: Any) -> None:
    augment = from_torchvision(
        module.Compose(
            [
                module.RandomResizedCrop(96),
                module.RandomHorizontalFlip(),
                module.RandomVerticalFlip(0.3),
                module.RandomRotation((-10, 25), interpolation=BILINEAR, fill=(1, 2, 3)),
                module.RandomAdjustSharpness(2.0, p=0.4),
                module.RandomPosterize(3, p=0.25),
                module.RandomEqualize(0.2),
                module.RandomAutocontrast(),
                module.RandomApply([module.RandomInvert(p=0.5)], p=0.5),
            ]
        )
    )
    assert augment.vertical_flip == 0.3
    assert augment.rotation == RandomRotation((-10.0, 25.0), "bilinear", (1, 2, 3))
    assert augment.sharpness == RandomAdjustSharpness(2.0, 0.4)
    assert augment.posterize == RandomPosterize(3, 0.25)
    assert (augment.equalize, augment.autocontrast, augment.invert) == (0.2, 0.5, 0.25)
    message = augment.to_message()
    assert (message.vertical_flip, message.invert) == (0.3, 0.25)
    assert (message.rotation.degrees.min, message.rotation.degrees.max) == (-10.0, 25.0)
    assert list(message.rotation.fill) == [1, 2, 3]
    # torchvision's defaults: nearest, fill 0 (black through a mask).
    plain = from_torchvision(module.RandomRotation(30)).rotation
    assert plain == RandomRotation((-30.0, 30.0), "nearest", (0, 0, 0))
    # v2 keeps fill=None (zero padding without a mask); v1 makes it 0.
    none = from_torchvision(module.RandomRotation(30, fill=None)).rotation  # type: ignore[arg-type]
    assert none is not None and none.levels() == (None if module is v2 else (0, 0, 0))


def test_the_photometric_distortion_converts_with_its_ranges() -> None:
    distort = v2.RandomPhotometricDistort(
        brightness=(0.8, 1.2), contrast=(0.6, 1.4), saturation=(0.7, 1.3), hue=(-0.1, 0.1), p=0.4
    )
    augment = from_torchvision(v2.Compose([v2.RandomResizedCrop(64), distort]))
    assert augment.photometric_distort == RandomPhotometricDistort(
        (0.8, 1.2), (0.6, 1.4), (0.7, 1.3), (-0.1, 0.1), 0.4
    )
    message = augment.to_message().photometric_distort
    assert (message.hue.min, message.p) == (-0.1, 0.4)
    # A RandomApply around it is one more coin: a group of one.
    applied = from_torchvision(v2.RandomApply([v2.RandomPhotometricDistort()], p=0.5))
    assert applied.groups == (OpGroup("apply", ("photometric_distort",), p=0.5),)
    with pytest.raises(ValueError, match="hue"):
        RandomPhotometricDistort(hue=(-0.6, 0.0))


@pytest.mark.parametrize("module", [v1, v2])
def test_random_affine_converts_with_each_range(module: Any) -> None:
    augment = from_torchvision(
        module.Compose(
            [
                module.RandomResizedCrop(64),
                module.RandomAffine(
                    15, translate=(0.1, 0.2), scale=(0.9, 1.1), shear=(-5, 5, -2, 2), fill=7
                ),
            ]
        )
    )
    affine = augment.affine
    assert affine == RandomAffine(
        (-15.0, 15.0), (0.1, 0.2), (0.9, 1.1), [-5.0, 5.0, -2.0, 2.0], "nearest", (7, 7, 7)
    )
    assert affine.range() == (-15.0, 15.0)
    assert affine.shears() == ((-5.0, 5.0), (-2.0, 2.0))
    assert (affine.translate, affine.scale, affine.levels()) == ((0.1, 0.2), (0.9, 1.1), (7,) * 3)
    message = augment.to_message().affine
    assert (message.translate_x, message.translate_y) == (0.1, 0.2)
    assert (message.shear_y.min, message.shear_y.max) == (-2.0, 2.0)
    # A shear of one number is x's only; none at all leaves both unset.
    assert from_torchvision(module.RandomAffine(0, shear=10)).affine.shears() == (  # type: ignore[union-attr]
        (-10.0, 10.0),
        None,
    )
    plain = from_torchvision(module.RandomAffine(5)).to_message().affine
    assert not plain.HasField("scale") and not plain.HasField("translate_x")
    with pytest.raises(TypeError, match=r"RandomAffine\(center="):
        from_torchvision(module.RandomAffine(5, center=(1, 2)))


@pytest.mark.parametrize(
    "transform, message",
    [
        (lambda: v2.RandomRotation(30, expand=True), r"expand=True.*size"),
        (lambda: v2.RandomRotation(30, center=[3, 4]), r"center=\[3, 4\]"),
        (
            lambda: v2.RandomRotation(30, interpolation=InterpolationMode.BICUBIC),
            "RandomRotation with interpolation bicubic",
        ),
        (
            lambda: v2.Compose([v2.TrivialAugmentWide(), v2.RandomRotation(10)]),
            "RandomRotation comes after",
        ),
        # A flip and a rotation do not commute: the flip stays first.
        (
            lambda: v2.Compose([v2.RandomRotation(10), v2.RandomVerticalFlip()]),
            "RandomVerticalFlip comes after",
        ),
        (
            lambda: v2.Compose([v2.RandomErasing(), v2.RandomHorizontalFlip()]),
            "RandomHorizontalFlip comes after",
        ),
    ],
)
def test_single_ops_the_sidecar_cannot_serve_as_written_are_refused(
    transform: Any, message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        from_torchvision(transform())


def test_a_flip_after_ops_it_commutes_with_is_served_at_its_place() -> None:
    """MoCo v2 (facebookresearch/moco main_moco.py) writes its flip after
    the colour ops and the blur; a flip gives the same pixels on either
    side of them, so the sidecar runs it first."""
    moco = from_torchvision(
        v1.Compose(
            [
                v1.RandomResizedCrop(224, scale=(0.2, 1.0)),
                v1.RandomApply([v1.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                v1.RandomGrayscale(p=0.2),
                v1.RandomApply([v1.GaussianBlur(23, sigma=(0.1, 2.0))], p=0.5),
                v1.RandomHorizontalFlip(),
                v1.ToTensor(),
                v1.Normalize(MEAN, STD),
            ]
        )
    )
    assert moco.horizontal_flip == 0.5
    assert moco.gaussian_blur == GaussianBlur((23, 23), (0.1, 2.0), p=0.5)
    assert moco.normalize == (MEAN, STD)
    after_normalize = from_torchvision(
        v2.Compose([v2.RandomResizedCrop(64), v2.ToImage(), v2.RandomVerticalFlip(0.2)])
    )
    assert after_normalize.vertical_flip == 0.2
    # The two mirrors commute, and a flip commutes with the photometric
    # distortion (pointwise, global statistics, a channel shuffle).
    both = from_torchvision(
        v2.Compose(
            [
                v2.RandomResizedCrop(64),
                v2.RandomVerticalFlip(0.3),
                v2.RandomPhotometricDistort(),
                v2.RandomHorizontalFlip(0.6),
            ]
        )
    )
    assert (both.vertical_flip, both.horizontal_flip) == (0.3, 0.6)
    assert both.photometric_distort is not None


def test_random_choice_and_order_are_groups_over_their_rows() -> None:
    # DeiT III's three augmentations (v2 normalizes the weights).
    three = from_torchvision(
        v2.Compose(
            [
                v2.RandomResizedCrop(64),
                v2.RandomChoice(
                    [
                        v2.RandomGrayscale(p=1.0),
                        v2.RandomSolarize(128, p=1.0),
                        v2.GaussianBlur(9, (0.1, 2.0)),
                    ]
                ),
            ]
        )
    )
    assert three.groups == (
        OpGroup("choice", ("grayscale", "solarize", "gaussian_blur"), weights=(1 / 3,) * 3),
    )
    assert (three.grayscale, three.solarize) == (1.0, RandomSolarize(128, 1.0))
    weighted = from_torchvision(
        v1.RandomChoice([v1.RandomGrayscale(p=1.0), v1.RandomInvert(p=1.0)], p=[3, 1])
    )
    assert weighted.groups[0].weights == (3.0, 1.0)
    order = from_torchvision(v2.RandomOrder([v2.ColorJitter(0.4), v2.RandomGrayscale(0.3)]))
    assert order.groups == (OpGroup("order", ("color_jitter", "grayscale")),)
    one = from_torchvision(v2.RandomChoice([v2.TrivialAugmentWide()]))
    assert (one.auto_augment, one.groups) == (TrivialAugmentWide(), ())


@pytest.mark.parametrize(
    "transform, message",
    [
        # Two policies are one row, which a stream runs once.
        (
            lambda: v2.RandomChoice([v2.TrivialAugmentWide(), v2.RandAugment()]),
            r"RandomChoice\(\[TrivialAugmentWide, RandAugment\]\): two of its transforms",
        ),
        (
            lambda: v2.RandomOrder([v2.RandomRotation(5), v2.RandomResizedCrop(64)]),
            r"RandomResizedCrop is not an op of the sidecar's table",
        ),
        (
            lambda: v2.RandomChoice(
                [v2.Compose([v2.RandomInvert(), v2.RandomEqualize()]), v2.RandomGrayscale()]
            ),
            r"a member that is itself several transforms \(Compose\)",
        ),
        (
            lambda: v2.RandomApply(
                [v2.RandomOrder([v2.RandomInvert(), v2.RandomEqualize()]), v2.RandomGrayscale()],
                p=0.5,
            ),
            "do not nest",
        ),
        # The blur runs between the group's rows in the table's order.
        (
            lambda: v2.Compose(
                [
                    v2.RandomChoice([v2.RandomGrayscale(1.0), v2.RandomSolarize(128, 1.0)]),
                    v2.GaussianBlur(9),
                ]
            ),
            "GaussianBlur comes after",
        ),
        (
            lambda: v2.Compose(
                [v2.RandomGrayscale(0.2), v2.RandomOrder([v2.RandomGrayscale(), v2.RandomInvert()])]
            ),
            "RandomGrayscale also appears outside it",
        ),
        # A member that never runs: the server's groups hold rows that run.
        (
            lambda: v2.RandomChoice([v2.RandomGrayscale(p=0.0), v2.RandomInvert(p=1.0)]),
            "RandomGrayscale with p=0 never runs",
        ),
    ],
)
def test_groups_that_cannot_run_as_written_are_refused_by_name(
    transform: Any, message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        from_torchvision(transform())


@pytest.mark.parametrize(
    "steps, dtype, unit, layout",
    [
        # ToImage + ToDtype(scale=True): float32 in [0, 1].
        (
            lambda: [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)],
            torch.float32,
            True,
            "NCHW",
        ),
        # v1 ToTensor: float32 in [0, 1], CHW.
        (lambda: [v1.ToTensor()], torch.float32, True, "NCHW"),
        # ToDtype without scale: float32 in [0, 255].
        (lambda: [v2.ToImage(), v2.ToDtype(torch.float32)], torch.float32, False, "NCHW"),
        (lambda: [v2.ToImage(), v2.ConvertImageDtype(torch.float16)], torch.float16, True, "NCHW"),
        # ToImage alone: uint8 CHW.
        (lambda: [v2.ToImage()], None, None, "NCHW"),
        (lambda: [v2.PILToTensor(), v2.ToDtype(torch.uint8, scale=True)], None, None, "NCHW"),
        # No conversion: the sample as the stream delivers it.
        (lambda: [], None, None, None),
    ],
)
def test_conversions_keep_torchvisions_dtype_range_and_layout(
    steps: Any, dtype: Any, unit: bool | None, layout: Any
) -> None:
    augment = from_torchvision(v2.Compose([v2.RandomResizedCrop(64), *steps()]))
    assert (augment.dtype, augment.to_unit_range, augment.layout) == (dtype, unit, layout)
    assert augment.normalize is None


def test_unscaled_floats_normalize_and_erase_in_levels() -> None:
    augment = from_torchvision(
        v2.Compose(
            [
                v2.RandomResizedCrop(64),
                v2.ToImage(),
                v2.ToDtype(torch.float32),
                v2.Normalize((124.0, 116.0, 104.0), (58.0, 57.0, 57.0)),
                v2.RandomErasing(1.0, value=1.0),
            ]
        )
    )
    assert augment.to_unit_range is False and augment.normalize == (
        (124.0, 116.0, 104.0),
        (58.0, 57.0, 57.0),
    )
    # value 1 after Normalize: mean + std levels.
    assert augment.random_erasing is not None and augment.random_erasing.value == (182, 173, 161)


@pytest.mark.parametrize(
    "steps, message",
    [
        ([v2.ToImage(), v2.Normalize(MEAN, STD)], "Normalize on uint8 pixels: torchvision refuses"),
        ([v2.ToImage(), v2.ToDtype(torch.float64, scale=True)], r"ToDtype\(float64\)"),
        ([v2.ToImage(), v2.ToDtype(torch.int32)], r"ToDtype\(int32\)"),
        (
            [
                v2.ToImage(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(MEAN, STD),
                v2.ToDtype(torch.bfloat16),
            ],
            "after Normalize",
        ),
    ],
)
def test_conversions_torchvision_or_the_trainer_cannot_make_are_refused(
    steps: list[Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        from_torchvision(v2.Compose([v2.RandomResizedCrop(64), *steps]))


@pytest.mark.parametrize(
    "transform, message",
    [
        (v2.CenterCrop(224), r"CenterCrop\(\[224, 224\]\) without a Resize.*window"),
        (v2.Compose([v2.Resize(200), v2.CenterCrop(224)]), "pads it with black"),
        (v2.Compose([v2.Resize(256)]), "without a CenterCrop"),
        (v2.Compose([v2.Resize(256), v2.RandomResizedCrop(224)]), "RandomResizedCrop after Resize"),
        (
            v2.Compose([v2.RandomResizedCrop(224), v2.CenterCrop(200)]),
            "crops the source image once",
        ),
        (v1.Resize(256, interpolation=InterpolationMode.NEAREST), "interpolation nearest"),
        (v2.Resize(232, antialias=False), r"antialias=False"),
        (v2.RandomResizedCrop(224, antialias=False), r"antialias=False"),
        (v2.Resize(256, max_size=300), "max_size"),
    ],
)
def test_crops_and_resizes_are_served_as_written_or_refused(transform: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        from_torchvision(transform)


@pytest.mark.parametrize("module", [v1, v2])
def test_bicubic_crops_and_resizes_keep_their_interpolation(module: Any) -> None:
    bicubic = InterpolationMode.BICUBIC
    train = from_torchvision(module.RandomResizedCrop(224, interpolation=bicubic))
    assert (train.crop, train.interpolation) == ("random_resized", "bicubic")
    evaluation = from_torchvision(
        module.Compose([module.Resize(256, interpolation=bicubic), module.CenterCrop(224)])
    )
    assert (evaluation.crop, evaluation.resize, evaluation.interpolation) == (
        "center",
        256,
        "bicubic",
    )
    assert evaluation.to_message().resize_interpolation == 2  # INTERPOLATION_BICUBIC
    assert (
        not from_torchvision(module.RandomResizedCrop(224))
        .to_message()
        .HasField("resize_interpolation")
    )


def test_a_resize_to_a_shape_is_a_stretch_and_a_matching_crop_changes_nothing() -> None:
    stretch = from_torchvision(v2.Compose([v2.Resize((96, 128)), v2.CenterCrop((96, 128))]))
    assert (stretch.crop, stretch.size) == ("stretch", (96, 128))
    same = from_torchvision(v2.Compose([v2.RandomResizedCrop(64), v2.CenterCrop(64)]))
    assert (same.crop, same.size) == ("random_resized", (64, 64))


@pytest.mark.parametrize("name", ["MixUp", "CutMix"])
def test_batch_mixing_points_to_mixing(name: str) -> None:
    mixing = getattr(v2, name)(num_classes=10)
    with pytest.raises(TypeError, match=rf"{name} mixes whole batches.*Mixing\("):
        from_torchvision(v2.Compose([v2.RandomResizedCrop(224), mixing]))


def test_a_compose_passed_to_augment_says_to_wrap_it() -> None:
    from shardfeed._augment import _augment

    with pytest.raises(TypeError, match=r"wrap it in shardfeed.from_torchvision"):
        _augment(v2.Compose([v2.RandomResizedCrop(224)]), 224)  # type: ignore[arg-type]


def test_what_the_sidecar_does_not_run_is_refused_by_name() -> None:
    with pytest.raises(
        TypeError, match="RandomPerspective is not run by the sidecar.*delivered batch"
    ):
        from_torchvision(v2.Compose([v2.RandomResizedCrop(224), v2.RandomPerspective()]))
    with pytest.raises(TypeError, match="RandomHorizontalFlip comes after"):
        from_torchvision(v2.Compose([v2.TrivialAugmentWide(), v2.RandomHorizontalFlip()]))
    with pytest.raises(TypeError, match="interpolation"):
        from_torchvision(v2.TrivialAugmentWide(interpolation=InterpolationMode.BICUBIC))
    with pytest.raises(TypeError, match="IMAGENET"):
        from_torchvision(v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10))


class TestTimm:
    """timm's classes share torchvision's names; each is served as the
    torchvision row it equals, or refused naming timm's class."""

    @pytest.fixture(autouse=True)
    def _timm(self) -> None:
        pytest.importorskip("timm")

    def test_the_evaluation_transform_converts_whole(self) -> None:
        from timm.data import create_transform

        augment = from_torchvision(create_transform(224, is_training=False, crop_pct=0.875))
        assert (augment.crop, augment.resize, augment.size) == ("center", 256, (224, 224))
        assert augment.normalize == (pytest.approx(MEAN), pytest.approx(STD))
        assert augment.dtype == torch.float32 and augment.to_unit_range
        assert augment.layout == "NCHW"

    def test_the_bicubic_evaluation_transform_keeps_bicubic(self) -> None:
        from timm.data import create_transform

        transform = create_transform(224, is_training=False, interpolation="bicubic")
        assert from_torchvision(transform).interpolation == "bicubic"

    def test_the_plain_training_transform_converts_with_pixel_erasing(self) -> None:
        from timm.data import create_transform

        transform = create_transform(
            224, is_training=True, interpolation="bilinear", re_prob=0.25, re_mode="pixel"
        )
        augment = from_torchvision(transform)
        assert augment.crop == "random_resized" and augment.horizontal_flip == 0.5
        assert augment.color_jitter == ColorJitter((0.6, 1.4), (0.6, 1.4), (0.6, 1.4))
        erasing = augment.random_erasing
        assert erasing is not None and erasing.value == "random" and erasing.p == 0.25
        # timm's ranges, not torchvision's: area up to 1/3, aspect 0.3 to 1/0.3.
        assert erasing.scale == pytest.approx((0.02, 1 / 3))
        assert erasing.ratio == pytest.approx((0.3, 1 / 0.3))

    @pytest.mark.parametrize(
        "keywords, message",
        [
            (
                dict(auto_augment="rand-m9-mstd0.5-tweights", interpolation="bicubic"),
                "timm's RandAugment with weighted op choice",
            ),
            (
                dict(auto_augment="rand-m9-mmax15", interpolation="bicubic"),
                "magnitude_max.*above 10 is not served",
            ),
            (dict(auto_augment="rand-m9-t3a", interpolation="bicubic"), "'Desaturate' op"),
            (dict(auto_augment="original", interpolation="bicubic"), "timm's AutoAugment"),
            (
                dict(auto_augment="augmix-m5-w4-d2", interpolation="bilinear"),
                "timm's AugMixAugment",
            ),
            (dict(interpolation="random"), "interpolation=random.*per sample"),
            (dict(interpolation="bilinear", re_prob=0.25, re_count=3), "max_count=3"),
            (dict(interpolation="bilinear", re_prob=0.25, re_mode="rand"), "mode='rand'"),
        ],
    )
    def test_what_is_not_served_names_the_timm_class(
        self, keywords: dict[str, Any], message: str
    ) -> None:
        from timm.data import create_transform

        with pytest.raises(TypeError, match=message):
            from_torchvision(create_transform(224, is_training=True, **keywords))

    def test_deits_training_transform_converts_whole(self) -> None:
        """DeiT's: create_transform(auto_augment='rand-m9-mstd0.5-inc1',
        interpolation='bicubic', re_prob=0.25, re_mode='pixel')."""
        from timm.data import create_transform

        from shardfeed import TimmRandAugment

        transform = create_transform(
            224,
            is_training=True,
            auto_augment="rand-m9-mstd0.5-inc1",
            interpolation="bicubic",
            re_prob=0.25,
            re_mode="pixel",
        )
        augment = from_torchvision(transform)
        assert augment.crop == "random_resized" and augment.interpolation == "bicubic"
        assert augment.horizontal_flip == 0.5 and augment.color_jitter is None
        timm = augment.timm_rand_augment
        assert timm == TimmRandAugment(fill=(124, 116, 104))
        assert timm == TimmRandAugment.from_config("rand-m9-mstd0.5-inc1")
        assert augment.random_erasing is not None and augment.random_erasing.p == 0.25
        message = augment.to_message().timm_rand_augment
        assert (message.num_layers, message.magnitude, message.magnitude_std) == (2, 9.0, 0.5)
        assert len(message.ops) == 15 and list(message.fill) == [124, 116, 104]

    def test_timms_random_interpolation_and_uniform_magnitude(self) -> None:
        from timm.data import create_transform

        transform = create_transform(
            224, is_training=True, auto_augment="rand-m7-n3-mstd101", interpolation="bilinear"
        )
        # Random interpolation for the crop is refused; the ops' own
        # random sampling (aa_params without an interpolation) is served.
        timm = from_torchvision(transform).timm_rand_augment
        assert timm is not None
        assert (timm.num_layers, timm.magnitude, timm.magnitude_std) == (3, 7.0, math.inf)
        assert timm.interpolation == "bilinear" and timm.ops[4] == "Posterize"
        from timm.data.auto_augment import rand_augment_transform

        from shardfeed._timm import rand_augment

        assert rand_augment(rand_augment_transform("rand-m9", {})).interpolation == "random"
        from PIL import Image

        nearest = rand_augment_transform("rand-m9", {"interpolation": Image.Resampling.NEAREST})
        with pytest.raises(TypeError, match="resample=.*NEAREST.*bilinear, bicubic or randomly"):
            rand_augment(nearest)

    def test_the_prefetchers_transform_is_uint8_chw(self) -> None:
        from timm.data import create_transform

        transform = create_transform(224, is_training=True, use_prefetcher=True)
        augment = from_torchvision(transform)
        assert (augment.dtype, augment.normalize, augment.layout) == (None, None, "NCHW")

    def test_timms_to_tensor_does_not_scale(self) -> None:
        from timm.data.transforms import ToTensor

        augment = from_torchvision(v2.Compose([v2.RandomResizedCrop(64), ToTensor()]))
        assert augment.dtype == torch.float32 and augment.to_unit_range is False

    def test_timms_mixup_points_to_mixing(self) -> None:
        from timm.data import Mixup

        with pytest.raises(TypeError, match="Mixup mixes whole batches.*Mixing"):
            from_torchvision(v2.Compose([v2.RandomResizedCrop(64), Mixup(num_classes=10)]))


def test_replay_takes_chw_uint8_and_says_how_to_get_it() -> None:
    import numpy as np

    from shardfeed import replay

    image = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    flipped = replay(image, [("horizontal_flip", {})])
    assert isinstance(flipped, np.ndarray)
    np.testing.assert_array_equal(flipped, image[:, :, ::-1])
    with pytest.raises(ValueError, match=r"CHW uint8.*permute\(2, 0, 1\)"):
        replay(image.transpose(1, 2, 0), [])


def test_the_model_input_of_a_conversion_keeps_its_scaling() -> None:
    from shardfeed.torch import ModelInput

    levels = from_torchvision(
        v2.Compose([v2.RandomResizedCrop(8), v2.ToImage(), v2.ToDtype(torch.float32)])
    )
    spec = ModelInput.of(levels)
    assert (spec.dtype, spec.to_unit_range) == (torch.float32, False)
    unit = ModelInput.of(from_torchvision(v1.Compose([v1.RandomResizedCrop(8), v1.ToTensor()])))
    assert unit.to_unit_range is True
    assert ModelInput.of("train", dtype=torch.bfloat16).dtype == torch.bfloat16
