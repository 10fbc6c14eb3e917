"""What the user wrote is what runs, through the real binary: each row of
the recipes issue's table either yields what torchvision's transform yields
on the same decoded crop (same dtype, layout, range), or is refused by name
before a stream starts."""

from __future__ import annotations

from typing import Any

import pytest

from shardfeed import Client, from_torchvision

from ..conftest import Server
from .test_augment import photos  # noqa: F401  (the module's dataset fixture)

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402
from torchvision.transforms import transforms as v1  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from shardfeed.torch import ModelInput, ShardfeedDataset  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _pairs(server: Server, uri: str, transform: Any) -> list[tuple[Any, Any]]:
    """(what the dataset yields, the uint8 NHWC crops it was made from),
    batch by batch, for the converted ``transform``."""
    augment = from_torchvision(transform)
    common = dict(client=Client(server.target), batch_size=4, seed=7, rank=0, world_size=1)
    served = ShardfeedDataset(uri, augment=augment, **common)
    raw = ShardfeedDataset(uri, augment=augment, **common)
    raw.model_input = ModelInput()
    raw.layout = "NHWC"
    return [(images, crops.clone()) for (images, _), (crops, _) in zip(served, raw)]


def _torchvision_tail(steps: list[Any], crops: Any) -> Any:
    """torchvision's conversion steps on each decoded crop, stacked as a
    DataLoader's collate stacks them."""
    out = []
    for crop in crops:
        image: Any = Image.fromarray(crop.numpy())
        for step in steps:
            image = step(image)
        out.append(image)
    return torch.stack([torch.as_tensor(t) for t in out])


ROWS = {
    "ToImage + ToDtype(float32, scale=True)": [
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
    ],
    "v1 ToTensor": [v1.ToTensor()],
    "ToDtype(float32) without scale": [v2.ToImage(), v2.ToDtype(torch.float32)],
    "ToImage alone": [v2.ToImage()],
    "ToDtype(float32) + Normalize in levels": [
        v2.ToImage(),
        v2.ToDtype(torch.float32),
        v2.Normalize((124.0, 116.0, 104.0), (58.0, 57.0, 57.0)),
    ],
    "ToTensor + Normalize": [v1.ToTensor(), v1.Normalize(MEAN, STD)],
}


@pytest.mark.parametrize("row", sorted(ROWS))
def test_each_conversion_yields_what_torchvision_yields(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
    row: str,
) -> None:
    uri, _ = photos
    steps = ROWS[row]
    pairs = _pairs(server, uri, v2.Compose([v2.RandomResizedCrop(40), *steps]))
    assert len(pairs) == 4
    for images, crops in pairs:
        theirs = _torchvision_tail(steps, crops)
        assert images.dtype == theirs.dtype, row
        assert images.shape == theirs.shape == (4, 3, 40, 40), row
        if images.dtype == torch.uint8:
            assert torch.equal(images, theirs), row
        else:
            # One fused multiply-add against torchvision's subtract, divide.
            torch.testing.assert_close(images, theirs, rtol=1e-5, atol=1e-5)


def test_the_crop_size_is_the_streams_output_size(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    uri, _ = photos
    augment = from_torchvision(v2.Compose([v2.RandomResizedCrop(36), v2.RandomHorizontalFlip()]))
    batch = next(iter(Client(server.target).batches(uri, batch_size=4, augment=augment)))
    assert batch.images.shape == (4, 36, 36, 3)
    images, _ = next(
        iter(ShardfeedDataset(uri, client=Client(server.target), augment=augment, batch_size=4))
    )
    assert tuple(images.shape) == (4, 36, 36, 3)
    with pytest.raises(ValueError, match="image_size=224 differs from the 36x36 output"):
        ShardfeedDataset(uri, target=server.target, augment=augment, image_size=224)


@pytest.mark.parametrize(
    "transform, message",
    [
        (
            v2.RandomOrder([v2.RandomRotation(5), v2.RandomResizedCrop(40)]),
            "RandomResizedCrop is not an op of the sidecar's table",
        ),
        (v2.RandomChoice([v2.TrivialAugmentWide(), v2.RandAugment()]), "RandomChoice"),
        (v2.CenterCrop(40), "without a Resize"),
        (v2.Compose([v2.Resize(48, antialias=False), v2.CenterCrop(40)]), "antialias=False"),
    ],
)
def test_what_is_not_served_is_refused_before_a_stream(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
    transform: Any,
    message: str,
) -> None:
    uri, _ = photos
    with pytest.raises(TypeError, match=message):
        ShardfeedDataset(uri, target=server.target, augment=from_torchvision(transform))


def test_random_choice_runs_one_of_its_transforms_per_sample(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    """DeiT III's three augmentations: each sample reports exactly one."""
    uri, _ = photos
    three = v2.RandomChoice(
        [v2.RandomGrayscale(p=1.0), v2.RandomSolarize(128, p=1.0), v2.GaussianBlur(9, (0.1, 2.0))]
    )
    augment = from_torchvision(v2.Compose([v2.RandomResizedCrop(36), three]))
    chosen = []
    for batch in Client(server.target).batches(uri, batch_size=4, augment=augment):
        for ops in batch.ops:
            names = [name for name, _ in ops if name != "horizontal_flip"]
            assert len(names) == 1, ops
            chosen.append(names[0])
    assert set(chosen) <= {"rgb_to_grayscale", "solarize", "gaussian_blur"}
    assert len(set(chosen)) >= 2, chosen


def test_a_compose_given_to_augment_is_refused_with_the_way_in(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    uri, _ = photos
    compose = v2.Compose([v2.RandomResizedCrop(40)])
    with pytest.raises(TypeError, match=r"wrap it in shardfeed.from_torchvision"):
        ShardfeedDataset(uri, target=server.target, augment=compose)
    with pytest.raises(TypeError, match=r"wrap it in shardfeed.from_torchvision"):
        Client(server.target).batches(uri, augment=compose)


def test_the_converters_order_is_the_servers_table(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    """The table's order is written once on the server (``Ops::NAMES``,
    published by Describe); the converter's stages and the client
    decoder's ops must follow it, or an op would run out of its place."""
    from shardfeed._ops import CLIENT_OPS
    from shardfeed._proto import shardfeed_pb2 as pb
    from shardfeed._torchvision import _STAGES, SERVER_ROWS

    uri, _ = photos
    client = Client(server.target)
    client.describe(uri, world_size=1, batch_size=8)  # opens the channel
    request = pb.DescribeRequest(dataset=uri, world_size=1, batch_size=8)
    table = list(client._channel.stub().Describe(request, timeout=30).augmentation_ops)
    by_stage = sorted(SERVER_ROWS, key=lambda name: _STAGES[name])
    assert list(dict.fromkeys(SERVER_ROWS[name] for name in by_stage)) == table
    assert [op for op in table if op in CLIENT_OPS] == list(CLIENT_OPS)
