"""Augmented batches from the real binary match Pillow's resize of the same box."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from shardfeed import Augment, Client, ShardfeedError, StreamOptions

from ..conftest import S3, Server, upload, write_tar

SIZES = [(320, 240), (200, 300), (500, 375), (256, 256)]


def photo(n: int, size: tuple[int, int]) -> bytes:
    """A smooth, photo-like JPEG: gradients and a soft blob, no flat color."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    dx, dy = (x - width * 0.3) / (width / 4), (y - height * 0.6) / (height / 5)
    blob = np.exp(-(dx**2 + dy**2))
    red = 255 * x / width
    green = 255 * (0.5 + 0.5 * np.sin(y / (7 + n)))
    blue = 255 * blob
    pixels = np.stack([red, green, blue], axis=-1).clip(0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=95)
    return out.getvalue()


@pytest.fixture(scope="module")
def photos(s3: S3) -> tuple[str, dict[str, bytes]]:
    written = {}
    samples = []
    for n in range(16):
        key = f"p{n:03d}"
        data = photo(n, SIZES[n % len(SIZES)])
        written[key] = data
        samples.append((key, {"jpg": data, "cls": str(n % 3).encode()}))
    return upload(s3, "photos", "", [write_tar(samples)]), written


_PILLOW = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def pillow_reference(
    jpeg: bytes,
    box: np.ndarray,
    flipped: bool,
    size: tuple[int, int],
    interpolation: str = "bilinear",
) -> np.ndarray:
    """Pillow's antialiased resize of the same fractional box."""
    left, top, width, height = (float(v) for v in box)
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    out = image.resize(
        (size[1], size[0]), _PILLOW[interpolation], box=(left, top, left + width, top + height)
    )
    if flipped:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("augment", ["train", "eval"])
def test_pixels_match_pillow_on_the_reported_box(
    server: Server,
    photos: tuple[str, dict[str, bytes]],
    augment: str,
    interpolation: str,
) -> None:
    uri, written = photos
    size = (96, 128)
    client = Client(server.target)
    spec = (
        Augment.train(interpolation=interpolation)  # type: ignore[arg-type]
        if augment == "train"
        else Augment.eval(size, interpolation=interpolation)  # type: ignore[arg-type]
    )
    batches = list(
        client.batches(
            uri, batch_size=8, image_size=size, seed=3, augment=spec, rank=0, world_size=1
        )
    )
    assert sum(len(b.keys) for b in batches) == 16
    # Stated tolerances (docs/AUGMENTATION.md): the full-decode path differs
    # from Pillow by rounding only; libjpeg-turbo's region decode at a DCT
    # scale averages in the DCT domain before the bilinear resize.
    decoder = client.describe(uri, world_size=1, batch_size=8).decoder
    tolerance = 2.5 if decoder.startswith("libjpeg-turbo") else 1.0
    flips = 0
    for batch in batches:
        assert batch.crop_boxes.shape == (8, 4) and batch.flipped.shape == (8,)
        for slot, key in enumerate(batch.keys):
            box, flipped = batch.crop_boxes[slot], bool(batch.flipped[slot])
            flips += flipped
            reference = pillow_reference(written[key], box, flipped, size, interpolation)
            diff = np.abs(batch.images[slot].astype(np.int16) - reference.astype(np.int16))
            assert diff.mean() <= tolerance, (decoder, key, box, flipped, diff.mean())
            if augment == "eval":
                # Resize(round(128 * 256/224) = 146) + CenterCrop(96, 128).
                width, height = Image.open(io.BytesIO(written[key])).size
                scale = 146 / min(width, height)
                expected = ((width - 128 / scale) / 2, (height - 96 / scale) / 2)
                assert np.allclose(box[:2], expected, atol=0.01), (key, box, expected)
    if augment == "eval":
        assert flips == 0
    else:
        assert 2 <= flips <= 14


def test_bicubic_matches_torchvisions_uint8_bicubic_on_the_same_box(
    server: Server, photos: tuple[str, dict[str, bytes]]
) -> None:
    """RandomResizedCrop's boxes are whole pixels, so torchvision's own
    ``resized_crop`` (antialiased bicubic on uint8, Keys a = -0.5) of the
    decoded image is the reference; the stated tolerance is the bilinear
    one (docs/AUGMENTATION.md)."""
    torch = pytest.importorskip("torch")
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    uri, written = photos
    client = Client(server.target)
    decoder = client.describe(uri, world_size=1, batch_size=8).decoder
    tolerance = 2.5 if decoder.startswith("libjpeg-turbo") else 1.0
    augment = Augment.train(horizontal_flip=0.0, interpolation="bicubic")
    compared = 0
    for batch in client.batches(uri, batch_size=8, image_size=56, seed=9, augment=augment):
        for slot, key in enumerate(batch.keys):
            left, top, width, height = (int(v) for v in batch.crop_boxes[slot])
            image = np.asarray(Image.open(io.BytesIO(written[key])).convert("RGB"))
            chw = torch.from_numpy(image).permute(2, 0, 1)
            theirs = F.resized_crop(
                chw, top, left, height, width, [56, 56], InterpolationMode.BICUBIC, antialias=True
            )
            ours = torch.from_numpy(batch.images[slot].copy()).permute(2, 0, 1)
            diff = (ours.to(torch.int16) - theirs.to(torch.int16)).abs().float()
            assert diff.mean() <= tolerance, (decoder, key, diff.mean())
            compared += 1
    assert compared == 16


def test_a_named_stretch_is_the_resize_mode_and_the_flip_follows_it(
    server: Server, photos: tuple[str, dict[str, bytes]]
) -> None:
    uri, _ = photos
    client = Client(server.target)

    def first(**keywords: object) -> tuple[np.ndarray, np.ndarray]:
        batch = next(iter(client.batches(uri, batch_size=4, image_size=(16, 40), **keywords)))
        return batch.images.copy(), batch.crop_boxes.copy()

    legacy, legacy_boxes = first(options=StreamOptions(resize="stretch"))
    named, named_boxes = first(augment=Augment(crop="stretch"))
    assert np.array_equal(named, legacy) and np.array_equal(named_boxes, legacy_boxes)
    mirrored, _ = first(augment=Augment(crop="stretch", horizontal_flip=1.0))
    assert np.array_equal(mirrored, legacy[:, :, ::-1, :])
    with pytest.raises(ShardfeedError) as error:
        first(augment=Augment(crop="stretch"), options=StreamOptions(resize="stretch"))
    assert error.value.code == "INVALID_ARGUMENT" and error.value.field == "resize"


def test_the_same_seed_and_epoch_give_the_same_crops(
    server: Server, photos: tuple[str, dict[str, bytes]]
) -> None:
    uri, _ = photos
    client = Client(server.target)

    def crops(epoch: int, world_size: int) -> dict[str, tuple[tuple[float, ...], bool]]:
        out = {}
        for rank in range(world_size):
            for batch in client.batches(
                uri,
                batch_size=16 // (2 * world_size),
                epoch=epoch,
                rank=rank,
                world_size=world_size,
                image_size=32,
                augment=Augment.train(horizontal_flip=0.5),
            ):
                for slot, key in enumerate(batch.keys):
                    out[key] = (tuple(batch.crop_boxes[slot]), bool(batch.flipped[slot]))
        return out

    first = crops(0, 1)
    assert crops(0, 2) == first
    later = crops(1, 1)
    assert sum(later[k] != first[k] for k in first) >= 14


def test_bad_ranges_are_invalid_argument(
    server: Server, photos: tuple[str, dict[str, bytes]]
) -> None:
    uri, _ = photos
    client = Client(server.target)
    with pytest.raises(ShardfeedError) as error:
        next(iter(client.batches(uri, augment=Augment.train(scale=(0.9, 0.1)))))
    assert error.value.code == "INVALID_ARGUMENT"
    assert error.value.field == "augmentation.random_resized_crop.scale", error.value.message
    with pytest.raises(ValueError, match="augment must be"):
        client.batches(uri, augment="sometimes")
