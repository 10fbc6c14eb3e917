"""The recipes' ops through the real binary: each sample's decisions are
reported in torchvision's terms and replay, on the same request without
the ops, to the pixels the server delivered; they are the sample's own at
any world size; bad arguments are refused before a stream starts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardfeed import (
    Augment,
    AutoAugment,
    Client,
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
    ShardfeedError,
    TimmRandAugment,
    TrivialAugmentWide,
)

from ..conftest import Server
from .test_augment import photos  # noqa: F401  (the module's dataset fixture)

RECIPES = {
    "trivial_augment+erasing": Augment.train(
        auto_augment=TrivialAugmentWide(interpolation="bilinear"),
        random_erasing=RandomErasing(0.5, value="random"),
    ),
    "rand_augment": Augment.train(auto_augment=RandAugment(2, 9)),
    "auto_augment+erasing": Augment.train(
        auto_augment=AutoAugment(fill=(124, 116, 104)), random_erasing=RandomErasing(0.5)
    ),
    "color_jitter+grayscale": Augment.train(
        color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1), grayscale=0.3
    ),
    # RandomApply([ColorJitter(...)], p=0.5): a sample left alone reports
    # no jitter steps, and replays to the unjittered pixels.
    "random_apply(color_jitter)": Augment.train(
        color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.5)
    ),
    # DINOv2's second global view's ops (blur's p raised so it is drawn
    # often): RandomApply(ColorJitter) 0.8, grayscale 0.2, GaussianBlur(9,
    # 0.1-2), RandomSolarize(128, 0.2).
    "dinov2_global": Augment.train(
        color_jitter=ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8),
        grayscale=0.2,
        gaussian_blur=GaussianBlur(9, (0.1, 2.0), p=0.5),
        solarize=RandomSolarize(128, 0.3),
    ),
    # torchvision's single-op transforms, each its own coin (raised p so
    # each is drawn often) and a rotation of each sample's own angle.
    "single_ops": Augment.train(
        vertical_flip=0.5,
        rotation=RandomRotation(30),
        sharpness=RandomAdjustSharpness(2.0, 0.5),
        posterize=RandomPosterize(4, 0.3),
        equalize=0.3,
        autocontrast=0.3,
        invert=0.4,
    ),
    "affine": Augment.train(
        affine=RandomAffine(20, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=(-8, 8, -4, 4)),
        equalize=0.5,
    ),
    "photometric_distort": Augment.train(
        photometric_distort=RandomPhotometricDistort(p=0.6), vertical_flip=0.5
    ),
    # timm's RandAugment with its ops more often than DeiT's 0.5 and the
    # random sampling, so that every kind of op runs in a small dataset.
    "timm_rand_augment": Augment.train(
        timm_rand_augment=TimmRandAugment(prob=0.9, interpolation="random", fill=(124, 116, 104))
    ),
    # RandomOrder(jitter, grayscale), RandomChoice(blur, solarize) by
    # weight, RandomApply(equalize, invert): each sample's rows in the
    # order it ran them.
    "groups": Augment.train(
        color_jitter=ColorJitter(0.4, 0.4, 0.2, 0.1),
        grayscale=1.0,
        gaussian_blur=GaussianBlur(9, (0.1, 2.0), p=1.0),
        solarize=RandomSolarize(128, 1.0),
        equalize=1.0,
        invert=1.0,
        groups=(
            OpGroup("order", ("color_jitter", "grayscale")),
            OpGroup("choice", ("gaussian_blur", "solarize"), weights=(1.0, 2.0)),
            OpGroup("apply", ("equalize", "invert"), p=0.5),
        ),
    ),
    "rotation_bilinear": Augment.train(
        rotation=RandomRotation((-45, 45), "bilinear", fill=(124, 116, 104)), invert=0.5
    ),
}


def _by_key(client: Client, uri: str, augment: Augment, world_size: int = 1) -> dict:
    out = {}
    for rank in range(world_size):
        for batch in client.batches(
            uri,
            batch_size=16 // (2 * world_size),
            rank=rank,
            world_size=world_size,
            image_size=48,
            seed=5,
            augment=augment,
        ):
            for slot, key in enumerate(batch.keys):
                out[key] = (batch.images[slot].copy(), batch.crop_boxes[slot], batch.ops[slot])
    return out


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_reported_ops_replay_on_the_same_request_without_them(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
    recipe: str,
) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from shardfeed import replay

    uri, _ = photos
    client = Client(server.target)
    augmented = _by_key(client, uri, RECIPES[recipe])
    plain = _by_key(client, uri, Augment.train(horizontal_flip=0.0))
    assert augmented.keys() == plain.keys()
    ran = set()
    for key, (image, box, ops) in augmented.items():
        source, plain_box, _ = plain[key]
        # The ops draw from keys of their own: the crop does not move.
        np.testing.assert_array_equal(box, plain_box)
        chw = source.transpose(2, 0, 1)
        # Public replay takes numpy (and gives numpy back) or torch alike.
        theirs = replay(chw, ops).transpose(1, 2, 0)
        from_torch = replay(torch.from_numpy(chw.copy()), ops).permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(theirs, from_torch)
        diff = np.abs(image.astype(np.int16) - theirs.astype(np.int16))
        mse = float(np.mean(diff.astype(np.float64) ** 2))
        psnr = math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
        assert np.mean(diff <= 1) >= 0.99 and psnr >= 40.0, (key, ops, psnr)
        ran.update(name for name, _ in ops)
    assert len(ran) >= 3, ran


@pytest.mark.parametrize(
    "recipe_name",
    [
        "trivial_augment+erasing",
        "single_ops",
        "affine",
        "photometric_distort",
        "timm_rand_augment",
        "groups",
    ],
)
def test_decisions_are_the_samples_own_at_any_world_size(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
    recipe_name: str,
) -> None:
    uri, _ = photos
    client = Client(server.target)
    recipe = RECIPES[recipe_name]
    one = _by_key(client, uri, recipe, world_size=1)
    two = _by_key(client, uri, recipe, world_size=2)
    assert one.keys() == two.keys()
    for key in one:
        np.testing.assert_array_equal(one[key][0], two[key][0])
        assert repr(one[key][2]) == repr(two[key][2])


def test_a_group_the_table_cannot_run_is_invalid_argument_naming_the_row(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    uri, _ = photos
    client = Client(server.target)
    # The blur is on and sits between grayscale and solarize in the table.
    apart = Augment.train(
        grayscale=1.0,
        gaussian_blur=GaussianBlur(9, (0.1, 2.0), p=1.0),
        solarize=RandomSolarize(128, 1.0),
        groups=(OpGroup("choice", ("grayscale", "solarize")),),
    )
    off = Augment.train(grayscale=0.5, groups=(OpGroup("order", ("grayscale", "invert")),))
    for augment, says in ((apart, "`gaussian_blur` runs between"), (off, "`invert` is off")):
        with pytest.raises(ShardfeedError) as error:
            next(iter(client.batches(uri, batch_size=4, image_size=32, augment=augment)))
        assert error.value.code == "INVALID_ARGUMENT"
        assert error.value.field == "augmentation.groups" and says in error.value.message


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: RandAugment(num_ops=2, magnitude=31), "magnitude"),
        (lambda: TrivialAugmentWide(num_magnitude_bins=1), "num_magnitude_bins"),
        (lambda: TrivialAugmentWide(interpolation="bicubic"), "interpolation"),  # type: ignore[arg-type]
        (lambda: ColorJitter(hue=0.7), "hue"),
        (lambda: RandomErasing(p=1.5), "probability"),
        (lambda: RandomErasing(scale=(0.5, 1.2)), "scale"),
        (lambda: RandomErasing(normalize=((0.5, 0.5, 0.5), (0.2, 0.0, 0.2))), "std"),
        (lambda: Augment.train(grayscale=2.0), "grayscale"),
    ],
)
def test_bad_arguments_raise_value_error_at_construction(build, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        build()


def test_the_dataset_yields_the_batch_as_the_model_takes_it(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    torch = pytest.importorskip("torch")
    from torchvision.transforms import InterpolationMode, v2

    from shardfeed import from_torchvision
    from shardfeed.torch import Mixing, ModelInput, ShardfeedDataset, model_batch, to_model

    uri, _ = photos
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(48, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.TrivialAugmentWide(interpolation=InterpolationMode.BILINEAR),
            v2.ToImage(),
            v2.ToDtype(torch.bfloat16, scale=True),
            v2.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
            v2.RandomErasing(0.5),
        ]
    )
    augment = from_torchvision(transform)
    assert augment.size == (48, 48)
    common = dict(client=Client(server.target), batch_size=4, image_size=48, seed=3, rank=0)
    plain = ShardfeedDataset(uri, augment=augment, normalize=None, world_size=1, **common)
    # The uint8 NHWC batches the model input is made from.
    plain.model_input, plain.layout = ModelInput(), "NHWC"
    mixing = Mixing(num_classes=3, mixup_alpha=0.2, cutmix_alpha=1.0)
    model = ShardfeedDataset(uri, augment=augment, mixing=mixing, world_size=1, **common)
    spec = ModelInput(augment.normalize, torch.bfloat16, mixing)
    steps = 0
    for step, ((raw, labels), (images, targets)) in enumerate(zip(plain, model)):
        assert images.dtype == torch.bfloat16 and images.shape == (4, 3, 48, 48)
        assert images.is_contiguous() and targets.shape == (4, 3)
        expected, expected_targets = to_model(raw, labels, spec, (3, 0, 0, step))
        assert torch.equal(images, expected)
        assert torch.allclose(targets, expected_targets)
        steps += 1
    assert steps == 4
    # A loop over Client.batches gets the dataset's inputs, draws and all
    # (the dataset's second pass is epoch 1).
    stream = Client(server.target).batches(
        uri, batch_size=4, image_size=48, seed=3, epoch=1, rank=0, world_size=1, augment=augment
    )
    compared = 0
    for batch, (images, targets) in zip(stream, model):
        ours, our_targets = model_batch(batch, spec, seed=3, rank=0)
        assert torch.equal(ours, images)
        assert torch.allclose(our_targets, targets)
        compared += 1
    assert compared == 4
