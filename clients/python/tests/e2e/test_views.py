"""Several views of one sample through the real binary: each group one
view-major array, each row's box and ops reported; a view's pixels are its
box resized (within the decoders' stated tolerance) and its ops replayed;
views are the sample's own at any world size and over shared memory; what
cannot be served is refused naming the field."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import grpc
import numpy as np
import pytest

from shardfeed import (
    Augment,
    Client,
    ColorJitter,
    GaussianBlur,
    RandomSolarize,
    Views,
    views,
)
from shardfeed._proto import shardfeed_pb2 as pb
from shardfeed._proto import shardfeed_pb2_grpc

from ..conftest import Server
from .test_augment import photos, pillow_reference  # noqa: F401  (the module's dataset fixture)

GLOBAL, LOCAL = 40, 24


def dino_like(with_ops: bool = True) -> Views:
    """DINO's shape at small sizes: two global views whose ops differ, and
    four local ones of one transform."""

    def view(side: int, scale: tuple[float, float], **ops: Any) -> Augment:
        if not with_ops:
            ops = {"horizontal_flip": 0.0}
        base = Augment.train(scale=scale, interpolation="bicubic", **ops)
        return dataclasses.replace(base, size=(side, side))

    jitter = ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8)
    first = view(GLOBAL, (0.32, 1.0), color_jitter=jitter, grayscale=0.2)
    second = view(
        GLOBAL,
        (0.32, 1.0),
        color_jitter=jitter,
        gaussian_blur=GaussianBlur(5, (0.1, 2.0), p=0.5),
        solarize=RandomSolarize(128, 0.5),
    )
    local = view(LOCAL, (0.05, 0.32), gaussian_blur=GaussianBlur(5, (0.1, 2.0), p=0.5))
    return views({"global": [first, second], "local": (local, 4)})


def _rows(client: Client, uri: str, spec: Views, world_size: int = 1, **kw: Any) -> dict:
    """Per (key, group, view): the pixels, box, flip and ops."""
    out: dict = {}
    for rank in range(world_size):
        for batch in client.batches(
            uri,
            batch_size=8 // world_size,
            rank=rank,
            world_size=world_size,
            seed=5,
            views=spec,
            **kw,
        ):
            assert batch.images.shape == (0, 0, 0, 3)
            for g, group in enumerate(batch.views):
                ops = group.ops
                for row in range(len(group.images)):
                    view, slot = divmod(row, group.batch)
                    out[(batch.keys[slot], g, view)] = (
                        group.images[row].copy(),
                        group.crop_boxes[row],
                        bool(group.flipped[row]),
                        ops[row],
                    )
    return out


def test_each_group_is_one_view_major_array(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    uri, _ = photos
    client = Client(server.target)
    batches = list(client.batches(uri, batch_size=8, seed=5, views=dino_like()))
    assert len(batches) == 2
    for batch in batches:
        assert [g.images.shape for g in batch.views] == [
            (16, GLOBAL, GLOBAL, 3),
            (32, LOCAL, LOCAL, 3),
        ]
        assert [g.count for g in batch.views] == [2, 4]
        for group in batch.views:
            # View v of every sample is one contiguous slice, no copy.
            assert np.shares_memory(group.view(1), group.images)
            assert group.view(1).shape[0] == 8
            assert group.crop_boxes.shape == (len(group.images), 4)
        # Views differ from each other: each draws its own box.
        boxes = batch.views[1].crop_boxes.reshape(4, 8, 4)
        assert not np.array_equal(boxes[0], boxes[1])


def test_a_view_is_its_box_resized_then_its_ops(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from shardfeed import replay

    uri, written = photos
    client = Client(server.target)
    augmented = _rows(client, uri, dino_like())
    plain = _rows(client, uri, dino_like(with_ops=False))
    assert augmented.keys() == plain.keys()
    assert len(augmented) == 16 * 6
    decoder = client.describe(uri, world_size=1, batch_size=8).decoder
    tolerance = 2.5 if decoder.startswith("libjpeg-turbo") else 1.0
    ran = set()
    flips = 0
    for (key, g, view), (image, box, flipped, ops) in augmented.items():
        source, plain_box, _, _ = plain[(key, g, view)]
        # The ops draw from keys of their own: the view's box does not move.
        np.testing.assert_array_equal(box, plain_box)
        side = GLOBAL if g == 0 else LOCAL
        reference = pillow_reference(written[key], box, False, (side, side), "bicubic")
        diff = np.abs(source.astype(np.int16) - reference.astype(np.int16))
        assert diff.mean() <= tolerance, (key, g, view, diff.mean())
        chw = torch.from_numpy(source.transpose(2, 0, 1).copy())
        theirs = replay(chw, ops).permute(1, 2, 0).numpy()
        diff = np.abs(image.astype(np.int16) - theirs.astype(np.int16))
        mse = float(np.mean(diff.astype(np.float64) ** 2))
        psnr = math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
        assert np.mean(diff <= 1) >= 0.99 and psnr >= 40.0, (key, g, view, ops, psnr)
        ran.update(name for name, _ in ops)
        flips += flipped
    assert {"horizontal_flip", "adjust_brightness", "gaussian_blur"} <= ran, ran
    assert 0 < flips < len(augmented)


def _without_ops(spec: Views) -> Views:
    """The same views with only their crops (no flip, no ops after it)."""
    stripped = {
        "horizontal_flip": 0.0,
        "color_jitter": None,
        "grayscale": 0.0,
        "gaussian_blur": None,
        "solarize": None,
    }
    return views(
        {
            group.name: [dataclasses.replace(view, **stripped) for view in group.views]
            for group in spec.groups
        }
    )


def test_dinov2s_own_transforms_replay_view_by_view_with_torchvision(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    """DataAugmentationDINO's transforms as dinov2 writes them, converted
    and served: each view's reported decisions, replayed by torchvision on
    the same view without its ops, give the pixels the sidecar sent."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from shardfeed import replay, views_from_torchvision
    from shardfeed_benchmarks.views import dinov2_transforms

    uri, _ = photos
    client = Client(server.target)
    dinov2 = views_from_torchvision(dinov2_transforms())
    augmented = _rows(client, uri, dinov2)
    plain = _rows(client, uri, _without_ops(dinov2))
    assert len(augmented) == 16 * 10
    ran = set()
    for row, (image, box, _, ops) in augmented.items():
        source, plain_box, _, _ = plain[row]
        np.testing.assert_array_equal(box, plain_box)
        chw = torch.from_numpy(source.transpose(2, 0, 1).copy())
        theirs = replay(chw, ops).permute(1, 2, 0).numpy()
        diff = np.abs(image.astype(np.int16) - theirs.astype(np.int16))
        assert np.mean(diff <= 1) >= 0.99, (row, ops)
        ran.update(name for name, _ in ops)
    assert {"horizontal_flip", "adjust_brightness", "gaussian_blur"} <= ran, ran


def test_views_are_the_samples_own_at_any_world_size_and_over_shared_memory(
    server: Server,
    unix_server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    uri, _ = photos
    one = _rows(Client(server.target), uri, dino_like())
    two = _rows(Client(server.target), uri, dino_like(), world_size=2)
    shared = _rows(Client(unix_server.target), uri, dino_like(), transport="shared_memory")
    for other in (two, shared):
        assert one.keys() == other.keys()
        for row, (image, box, _, ops) in one.items():
            np.testing.assert_array_equal(image, other[row][0])
            np.testing.assert_array_equal(box, other[row][1])
            assert repr(ops) == repr(other[row][3])


def test_what_views_cannot_be_asked_with_is_refused_by_name(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    uri, _ = photos
    client = Client(server.target)
    for keyword, value in (
        ("augment", "train"),
        ("image_size", 64),
        ("resize", "stretch"),
    ):
        with pytest.raises(ValueError, match=f"^{keyword} is set with views"):
            client.batches(uri, views=dino_like(), **{keyword: value})
    # The sidecar's own checks, past the client's: a request as any client
    # could send it.
    channel = grpc.insecure_channel(server.target)
    stub = shardfeed_pb2_grpc.ShardfeedStub(channel)

    def refused(**fields: Any) -> str:
        request = pb.StreamBatchesRequest(dataset=uri, **{"batch_size": 8, **fields})
        with pytest.raises(grpc.RpcError) as error:
            next(iter(stub.StreamBatches(request, timeout=30)))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value
        return str(error.value.details())

    group = dino_like().to_messages()
    assert "views.count" in refused(views=[pb.ViewGroup(count=33, views=group[1].views)])
    assert "views.count" in refused(views=[pb.ViewGroup(count=2**32 - 1)])
    assert "height is set with views" in refused(views=group, height=64)
    tier = pb.DecodedSource(shorter_side=64)
    assert "decoded_source" in refused(
        views=group, delivery=pb.DELIVERY_ENCODED, decoded_source=tier
    )
    assert "views" in refused(views=[pb.ViewGroup(height=4096, width=4096, count=2)])
    huge = [pb.ViewGroup(height=1024, width=1024, count=16)]
    message = refused(views=huge, batch_size=128)
    assert "views" in message and "batch_size" in message
    channel.close()


def test_the_dataset_yields_each_group_as_its_transforms_make_it(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    torch = pytest.importorskip("torch")
    T = pytest.importorskip("torchvision.transforms")
    from shardfeed import views_from_torchvision
    from shardfeed.torch import ShardfeedDataset

    uri, _ = photos
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    bicubic = T.InterpolationMode.BICUBIC
    normalized = T.Compose(
        [
            T.RandomResizedCrop(GLOBAL, scale=(0.32, 1.0), interpolation=bicubic),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(mean, std),
        ]
    )
    local = T.Compose([T.RandomResizedCrop(LOCAL, scale=(0.05, 0.32)), T.RandomGrayscale(0.2)])
    spec = views_from_torchvision({"global": (normalized, 2), "local": (local, 3)})
    data = ShardfeedDataset(uri, target=server.target, views=spec, batch_size=8, seed=5)
    raw = list(Client(server.target).batches(uri, batch_size=8, seed=5, views=spec))
    got = list(data)
    assert len(got) == len(raw) == 2
    for (groups, labels), batch in zip(got, raw):
        global_crops, local_crops = groups
        assert global_crops.shape == (16, 3, GLOBAL, GLOBAL)
        assert global_crops.dtype == torch.float32
        assert local_crops.shape == (24, LOCAL, LOCAL, 3) and local_crops.dtype == torch.uint8
        assert labels.shape == (8,)
        pixels = torch.from_numpy(batch.views[0].images.copy()).permute(0, 3, 1, 2).float() / 255
        expected = (pixels - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
            1, 3, 1, 1
        )
        torch.testing.assert_close(global_crops, expected, atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(local_crops.numpy(), batch.views[1].images)
    # decode="client": this process decodes each sample once and makes
    # every view (the sidecar's boxes and ops; pixels within the decoders'
    # tolerance), each group made into its model input alike.
    client_side = ShardfeedDataset(
        uri, target=server.target, views=spec, batch_size=8, seed=5, decode="client"
    )
    levels = torch.tensor(std).view(1, 3, 1, 1) * 255
    for (groups, labels), (theirs, their_labels) in zip(client_side, got):
        assert torch.equal(labels, their_labels)
        (mine_global, mine_local), (their_global, their_local) = groups, theirs
        assert mine_global.shape == their_global.shape and mine_global.dtype == torch.float32
        assert mine_local.shape == their_local.shape and mine_local.dtype == torch.uint8
        for mine, other in (
            (mine_global * levels, their_global * levels),
            (mine_local, their_local),
        ):
            for row in range(len(mine)):
                error = float(((mine[row].double() - other[row].double()) ** 2).mean())
                assert error == 0 or 10 * math.log10(255.0**2 / error) >= 35.0, row
    with pytest.raises(ValueError, match="^image_size is set with views"):
        ShardfeedDataset(uri, target=server.target, views=spec, image_size=64)
