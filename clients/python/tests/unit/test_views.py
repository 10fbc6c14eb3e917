"""``views_from_torchvision``: DINOv2's and SimCLR's views read as their
recipes write them, and the bounds refused naming the field."""

from __future__ import annotations

import re
from typing import Any

import pytest

from shardfeed import Augment, ColorJitter, GaussianBlur, RandomSolarize
from shardfeed._views import MAX_VIEW_BYTES_PER_SAMPLE, views, views_from_torchvision

torch = pytest.importorskip("torch")
T = pytest.importorskip("torchvision.transforms")

# DataAugmentationDINO written out from dinov2's published values (the
# benchmark runs the same transforms on PIL).
from shardfeed_benchmarks.views import dinov2_transforms  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_dinov2s_views_convert_view_by_view() -> None:
    converted = views_from_torchvision(dinov2_transforms())
    assert [(g.name, g.size, g.count) for g in converted.groups] == [
        ("global", (224, 224), 2),
        ("local", (96, 96), 8),
    ]
    assert converted.count == 10
    assert converted.bytes_per_sample() == (2 * 224 * 224 + 8 * 96 * 96) * 3
    jitter = ColorJitter(
        brightness=(0.6, 1.4), contrast=(0.6, 1.4), saturation=(0.8, 1.2), hue=(-0.1, 0.1), p=0.8
    )

    def blur(p: float) -> GaussianBlur:
        return GaussianBlur(kernel_size=(9, 9), sigma=(0.1, 2.0), p=p)

    first, second = converted.groups[0].views
    for view, scale in ((first, (0.32, 1.0)), (second, (0.32, 1.0))):
        assert (view.crop, view.scale, view.interpolation) == ("random_resized", scale, "bicubic")
        assert (view.horizontal_flip, view.color_jitter, view.grayscale) == (0.5, jitter, 0.2)
        assert view.normalize == (MEAN, STD)
    assert (first.gaussian_blur, first.solarize) == (blur(1.0), None)
    assert second.gaussian_blur == blur(0.1)
    assert second.solarize == RandomSolarize(threshold=128, p=0.2)
    local = converted.groups[1].views
    assert len(set(local)) == 1, "eight views of one transform"
    assert (local[0].scale, local[0].gaussian_blur, local[0].size) == (
        (0.05, 0.32),
        blur(0.5),
        (96, 96),
    )


def test_simclrs_two_views_of_one_pipeline() -> None:
    pipeline = T.Compose(
        [
            T.RandomResizedCrop(224),
            T.RandomHorizontalFlip(),
            T.RandomApply([T.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8),
            T.RandomGrayscale(p=0.2),
        ]
    )
    converted = views_from_torchvision({"views": (pipeline, 2)})
    (group,) = converted.groups
    assert (group.count, group.size, group.views[0] == group.views[1]) == (2, (224, 224), True)


def crop(side: int, **changes: Any) -> Augment:
    return Augment(crop="random_resized", size=(side, side), **changes)


@pytest.mark.parametrize(
    ("groups", "field"),
    [
        ({}, "views: no groups"),
        ({"local": (crop(96), 0)}, "views['local'].count: 0"),
        ({"local": (crop(96), 33)}, "views['local'].count: 33"),
        ({"local": []}, "views['local'].count: 0 views"),
        ({f"g{i}": crop(32) for i in range(9)}, "views: 9 groups"),
        ({"global": [crop(224), crop(200)]}, "views['global'].size: view 1 is (200, 200)"),
        ({"global": [crop(224), Augment(crop="random_resized")]}, "views['global'].size"),
        ({"global": [Augment(horizontal_flip=0.5)]}, "views['global'].size: its first view"),
        (
            {"global": [crop(224), crop(224, normalize=(MEAN, STD))]},
            "views['global']: view 1's normalize",
        ),
        ({"big": (crop(4096), 17)}, f"at most {MAX_VIEW_BYTES_PER_SAMPLE}"),
    ],
)
def test_what_is_past_the_bounds_is_refused_naming_the_field(
    groups: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        views(groups)
