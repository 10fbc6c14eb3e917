"""``from_torchvision``: the reference recipes convert whole, in v1 and v2;
anything the sidecar does not run is refused, naming the transform."""

from __future__ import annotations

from typing import Any

import pytest

from shardfeed import (
    Augment,
    AutoAugment,
    ColorJitter,
    RandAugment,
    RandomErasing,
    TrivialAugmentWide,
    from_torchvision,
)

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


def test_what_the_sidecar_does_not_run_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="GaussianBlur is not run by the sidecar.*delivered batch"):
        from_torchvision(v2.Compose([v2.RandomResizedCrop(224), v2.GaussianBlur(3)]))
    with pytest.raises(TypeError, match="RandomHorizontalFlip comes after"):
        from_torchvision(v2.Compose([v2.TrivialAugmentWide(), v2.RandomHorizontalFlip()]))
    with pytest.raises(TypeError, match="interpolation"):
        from_torchvision(v2.TrivialAugmentWide(interpolation=InterpolationMode.BICUBIC))
    with pytest.raises(TypeError, match="IMAGENET"):
        from_torchvision(v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10))
