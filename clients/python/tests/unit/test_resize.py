"""The batched crop/resize against the per-image reference: every box shape
the plan makes, both recipes, any output size, both filters, within one
level."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardfeed._resize import _chunks, crop_resize, crop_resize_batch  # noqa: E402


def _image(rows: int, cols: int, seed: int) -> torch.Tensor:
    """A photo-like image: smooth gradients under noise, so both the filter's
    averaging and its edges show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:rows, 0:cols]
    base = np.stack([x * 255 / max(cols, 1), y * 255 / max(rows, 1), (x + y) % 256])
    noisy = base + rng.normal(0, 40, size=(3, rows, cols))
    return torch.from_numpy(np.clip(noisy, 0, 255).astype(np.uint8))


def _center(rows: int, cols: int, fraction: float = 0.875) -> tuple[float, float, float, float]:
    side = min(rows, cols) * fraction
    return ((cols - side) / 2, (rows - side) / 2, side, side)


def _random_resized(rows: int, cols: int, rng: np.random.Generator) -> tuple[float, ...]:
    """RandomResizedCrop's boxes: 8-100% of the area, aspect 3/4 to 4/3."""
    for _ in range(10):
        area = rows * cols * rng.uniform(0.08, 1.0)
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        width, height = np.sqrt(area * aspect), np.sqrt(area / aspect)
        if width <= cols and height <= rows:
            return (rng.uniform(0, cols - width), rng.uniform(0, rows - height), width, height)
    return _center(rows, cols, 1.0)


# (image rows, cols, box): every shape the plan makes and then some.
CASES = [
    (375, 500, _center(375, 500)),  # evaluation's center crop
    (375, 500, (0.0, 0.0, 500.0, 375.0)),  # the full image
    (375, 500, (0.0, 0.0, 40.0, 30.0)),  # touching the top-left edge
    (375, 500, (460.0, 345.0, 40.0, 30.0)),  # touching the bottom-right edge
    (375, 500, (200.25, 100.5, 3.5, 2.25)),  # tiny: upscaled far past the output
    (64, 48, (0.0, 0.0, 48.0, 64.0)),  # smaller than the output: upscaled
    (600, 40, (0.0, 0.0, 40.0, 600.0)),  # extreme aspect ratios
    (40, 900, (12.0, 3.0, 880.0, 30.0)),
    (1, 1, (0.0, 0.0, 1.0, 1.0)),  # one pixel
    (333, 217, (17.3, 9.9, 150.7, 201.1)),  # fractional everything
]


def _reference(
    images: list[torch.Tensor],
    boxes: np.ndarray,
    flipped: np.ndarray,
    height: int,
    width: int,
    interpolation: str = "bilinear",
) -> torch.Tensor:
    return torch.stack(
        [
            crop_resize(image, box, bool(flip), height, width, interpolation)  # type: ignore[arg-type]
            for image, box, flip in zip(images, boxes, flipped)
        ]
    )


def _assert_within_a_level(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == torch.uint8
    difference = (got.int() - want.int()).abs()
    assert int(difference.max()) <= 1, f"max difference {int(difference.max())}"


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("method", ["matmul", "pillow"])
@pytest.mark.parametrize("size", [(224, 224), (17, 31), (1, 1), (96, 64)])
def test_every_box_shape_within_a_level_of_the_reference(
    size: tuple[int, int], method: str, interpolation: str
) -> None:
    height, width = size
    images = [_image(rows, cols, seed) for seed, (rows, cols, _) in enumerate(CASES)]
    boxes = np.array([box for _, _, box in CASES], dtype=np.float32)
    flipped = np.array([i % 2 == 1 for i in range(len(CASES))])
    got = crop_resize_batch(
        images,
        boxes,
        flipped,
        height,
        width,
        method=method,  # type: ignore[arg-type]
        interpolation=interpolation,  # type: ignore[arg-type]
    )
    want = _reference(images, boxes, flipped, height, width, interpolation)
    _assert_within_a_level(got, want)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("method", ["matmul", "pillow"])
@pytest.mark.parametrize("recipe", ["train", "eval"])
def test_both_recipes_on_photo_sized_images(recipe: str, method: str, interpolation: str) -> None:
    rng = np.random.default_rng(5)
    shapes = [(int(rng.integers(200, 700)), int(rng.integers(200, 700))) for _ in range(24)]
    images = [_image(rows, cols, seed) for seed, (rows, cols) in enumerate(shapes)]
    if recipe == "train":
        boxes = np.array([_random_resized(r, c, rng) for r, c in shapes], dtype=np.float32)
        flipped = rng.random(len(shapes)) < 0.5
    else:
        boxes = np.array([_center(r, c) for r, c in shapes], dtype=np.float32)
        flipped = np.zeros(len(shapes), dtype=bool)
    got = crop_resize_batch(
        images,
        boxes,
        flipped,
        224,
        224,
        method=method,  # type: ignore[arg-type]
        interpolation=interpolation,  # type: ignore[arg-type]
    )
    _assert_within_a_level(got, _reference(images, boxes, flipped, 224, 224, interpolation))


def test_the_batched_bicubic_is_pillows_to_the_level() -> None:
    """The cubic's fixed-point weights, negative lobes included, are
    Pillow's: the batched products give Pillow's bytes (both passes in
    Pillow's order), not merely bytes within a level."""
    rng = np.random.default_rng(11)
    shapes = [(int(rng.integers(200, 700)), int(rng.integers(200, 700))) for _ in range(12)]
    images = [_image(rows, cols, seed) for seed, (rows, cols) in enumerate(shapes)]
    boxes = np.array([_random_resized(r, c, rng) for r, c in shapes], dtype=np.float32)
    flipped = rng.random(len(shapes)) < 0.5
    kwargs = dict(interpolation="bicubic")
    batched = crop_resize_batch(images, boxes, flipped, 224, 224, method="matmul", **kwargs)  # type: ignore[arg-type]
    pillow = crop_resize_batch(images, boxes, flipped, 224, 224, method="pillow", **kwargs)  # type: ignore[arg-type]
    difference = (batched.int() - pillow.int()).abs()
    assert float((difference > 0).float().mean()) < 1e-3, int(difference.max())


def _random_batch(count: int, seed: int) -> tuple[list[torch.Tensor], np.ndarray, np.ndarray]:
    """``count`` images of 100-900 px a side with training boxes and flips."""
    rng = np.random.default_rng(seed)
    shapes = [(int(rng.integers(100, 900)), int(rng.integers(100, 900))) for _ in range(count)]
    images = [_image(rows, cols, n) for n, (rows, cols) in enumerate(shapes)]
    boxes = np.array([_random_resized(r, c, rng) for r, c in shapes], dtype=np.float32)
    return images, boxes, rng.random(count) < 0.5


def test_an_images_pixels_do_not_depend_on_its_batch() -> None:
    """What decides world-size independence: the same image and box give
    the same bytes whatever else is in the batch, however it is chunked."""
    images, boxes, flipped = _random_batch(16, seed=13)
    whole = crop_resize_batch(images, boxes, flipped, 64, 64, method="matmul")
    for start, stop, budget in ((0, 8, 1 << 23), (5, 16, 1 << 23), (0, 16, 60_000)):
        part = crop_resize_batch(
            images[start:stop],
            boxes[start:stop],
            flipped[start:stop],
            64,
            64,
            method="matmul",
            max_window_pixels=budget,
        )
        assert torch.equal(part, whole[start:stop]), (start, stop, budget)
    for index in (0, 7, 15):
        alone = crop_resize_batch(
            images[index : index + 1],
            boxes[index : index + 1],
            flipped[index : index + 1],
            64,
            64,
            method="matmul",
        )
        assert torch.equal(alone[0], whole[index])


def test_chunks_bound_the_padded_windows_and_change_nothing() -> None:
    rng = np.random.default_rng(3)
    shapes = [(375, 500)] * 6 + [(1200, 1600), (40, 50)]
    images = [_image(rows, cols, seed) for seed, (rows, cols) in enumerate(shapes)]
    boxes = np.array([_random_resized(r, c, rng) for r, c in shapes], dtype=np.float32)
    flipped = rng.random(len(shapes)) < 0.5
    whole = crop_resize_batch(images, boxes, flipped, 48, 48, method="matmul")
    # A budget below the large photo's window: it alone in its chunk, the
    # rest in chunks within the budget.
    budget = 200_000
    chunked = crop_resize_batch(
        images, boxes, flipped, 48, 48, max_window_pixels=budget, method="matmul"
    )
    assert torch.equal(whole, chunked)
    rows = np.array([480, 1200, 30, 480, 40], dtype=np.int64)
    cols = np.array([640, 1600, 30, 640, 50], dtype=np.int64)
    groups = _chunks(rows, cols, budget)
    assert sorted(i for group in groups for i in group) == list(range(5))
    for group in groups:
        padded = len(group) * rows[group].max() * cols[group].max()
        assert padded <= budget or len(group) == 1, (group, padded)
    assert [1] in groups, "the window over the budget is a chunk of its own"


def test_results_land_in_the_slots_given() -> None:
    images = [_image(50, 60, 1), _image(70, 40, 2)]
    boxes = np.array([[0, 0, 60, 50], [5, 5, 30, 60]], dtype=np.float32)
    flipped = np.array([False, True])
    out = torch.zeros((4, 16, 16, 3), dtype=torch.uint8)
    crop_resize_batch(images, boxes, flipped, 16, 16, out=out, slots=[3, 1])
    want = _reference(images, boxes, flipped, 16, 16)
    _assert_within_a_level(out[3], want[0])
    _assert_within_a_level(out[1], want[1])
    assert int(out[0].max()) == 0 and int(out[2].max()) == 0
    with pytest.raises(ValueError):
        crop_resize_batch(images, boxes, flipped, 16, 16, out=out, slots=[3])


def test_the_pixels_do_not_depend_on_how_a_product_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's kernels add in an order of their own, which changes with the
    shapes (so with the batch): here a product that adds in blocks, the
    last block first, must give the very bytes of the plain one."""
    import shardfeed._resize as resize

    images, boxes, flipped = _random_batch(12, seed=17)
    plain = crop_resize_batch(images, boxes, flipped, 224, 224, method="matmul")
    matmul = torch.matmul

    def blocked(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        inner = a.shape[-1]
        bounds = list(range(0, inner, 7)) + [inner]
        parts = [matmul(a[..., lo:hi], b[..., lo:hi, :]) for lo, hi in zip(bounds, bounds[1:])]
        total = parts[-1]
        for part in reversed(parts[:-1]):
            total = total + part
        return total

    monkeypatch.setattr(resize.torch, "matmul", blocked)
    assert torch.equal(crop_resize_batch(images, boxes, flipped, 224, 224, method="matmul"), plain)
