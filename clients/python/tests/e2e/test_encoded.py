"""Encoded delivery through the real binary, decoded by the client with
torchvision on CPU: the same samples, labels and boxes as the server's own
decode, within the stated tolerance; every sample in its slot when the
server decodes part of each batch; failures substituted by the server's
rule and reported to it."""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from shardfeed import (  # noqa: E402
    Augment,
    Client,
    ColorJitter,
    GaussianBlur,
    RandomErasing,
    RandomSolarize,
    TrivialAugmentWide,
)
from shardfeed.decode import BatchDecoder, crop_resize, substitute_source  # noqa: E402
from shardfeed.torch import ShardfeedDataset  # noqa: E402

from ..conftest import (  # noqa: E402
    S3,
    Server,
    free_port,
    scrape,
    start_server,
    stop,
    upload,
    write_tar,
)

TOLERANCE_DB = 35.0


def photo(seed: int, width: int, height: int, **save: Any) -> bytes:
    """A smooth, photo-like JPEG: gradients, soft shapes and mild grain."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(0.005, 0.05, 2).tolist() + [rng.uniform(0, 6.28)]
        wave = 0.5 + 0.35 * np.sin(x * fx + y * fy + phase)
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(15, 60)
        blob = 0.3 * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))
        channels.append(wave + blob + rng.normal(0, 0.015, (height, width)))
    pixels = (np.clip(np.stack(channels, -1), 0, 1) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=save.pop("format", "JPEG"), quality=90, **save)
    return out.getvalue()


def without_quantization_tables(jpeg: bytes) -> bytes:
    """A JPEG whose headers parse but that no decoder can decode."""
    out, at = bytearray(jpeg[:2]), 2
    while at < len(jpeg):
        marker, length = jpeg[at + 1], int.from_bytes(jpeg[at + 2 : at + 4], "big")
        if marker == 0xDA:
            out += jpeg[at:]
            break
        if marker != 0xDB:
            out += jpeg[at : at + 2 + length]
        at += 2 + length
    return bytes(out)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255 * 255 / mse)


@pytest.fixture(scope="module")
def dataset(s3: S3) -> str:
    from PIL import Image

    shards = []
    for s in range(2):
        samples = []
        for i in range(12):
            n = s * 12 + i
            image = photo(n, 160 + 9 * i, 120 + 7 * (n % 5))
            extension = "jpg"
            if n == 3:
                image, extension = photo(n, 150, 130, format="PNG"), "png"
            elif n == 5:
                image = photo(n, 170, 140, progressive=True)
            elif n == 8:
                grey = Image.open(io.BytesIO(photo(n, 150, 120))).convert("L")
                buffer = io.BytesIO()
                grey.save(buffer, format="JPEG", quality=90)
                image = buffer.getvalue()
            elif n == 14:
                image = without_quantization_tables(photo(n, 160, 120))
            samples.append((f"p{s}{i:02d}", {extension: image, "cls": b"%d" % (n % 7)}))
        shards.append(write_tar(samples))
    return upload(s3, "encoded", "", shards)


def _stream(server: Server, uri: str, augment: str, **options: Any) -> list[Any]:
    client = Client(server.target)
    return list(
        client.batches(
            uri,
            batch_size=8,
            image_size=48,
            augment=augment,
            seed=3,
            epoch=2,
            rank=0,
            world_size=1,
            **options,
        )
    )


# Every op the client mirrors, drawn often: the policy's geometry and
# colour, the jitter's four factors in their order, grey, noise erasing.
RECIPE = Augment.train(
    auto_augment=TrivialAugmentWide(interpolation="bilinear", fill=(124, 116, 104)),
    color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1),
    grayscale=0.2,
    random_erasing=RandomErasing(0.5, value="random"),
)


# The self-supervised recipes' view (DINOv2's second global view, BYOL's
# second view): a bicubic crop, jitter, grey, blur and solarize, each drawn
# often. At 128 a solarize keeps levels a level apart: the client decodes
# the samples it solarized; at 200 they are the sidecar's.
SELF_SUPERVISED = Augment.train(
    interpolation="bicubic",
    color_jitter=ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8),
    grayscale=0.2,
    gaussian_blur=GaussianBlur(9, (0.1, 2.0), p=0.5),
    solarize=RandomSolarize(128, 0.5),
)
SOLARIZE_200 = Augment.train(solarize=RandomSolarize(200, 0.5))


# torchvision's names of the ops with a threshold (Solarize, Posterize,
# Equalize).
THRESHOLD_OPS = {"solarize", "posterize", "equalize"}


@pytest.mark.parametrize(
    "augment",
    ["train", "eval", RECIPE, SELF_SUPERVISED, SOLARIZE_200],
    ids=["train", "eval", "recipe", "self_supervised", "solarize_200"],
)
def test_client_decodes_match_the_servers_within_the_tolerance(
    unix_server: Server, dataset: str, augment: Any
) -> None:
    reference = _stream(unix_server, dataset, augment)
    encoded = _stream(unix_server, dataset, augment, delivery="encoded")
    decoder = BatchDecoder("cpu")
    assert len(reference) == len(encoded) == 3
    worst, compressed = math.inf, 0
    for want, got in zip(reference, encoded):
        assert got.encoded is not None and got.images.shape == (0, 48, 48, 3)
        assert got.keys == want.keys and got.shards == want.shards
        compressed += int((~got.encoded.decoded).sum())
        decoded = decoder.decode(got)
        np.testing.assert_array_equal(decoded.crop_boxes, want.crop_boxes)
        np.testing.assert_array_equal(decoded.flipped, want.flipped)
        # The undecodable JPEG fails on either side, and is substituted alike.
        assert decoded.substituted == want.substituted
        np.testing.assert_array_equal(decoded.labels.numpy(), want.labels)
        for slot in range(len(want.keys)):
            quality = psnr(decoded.images[slot].numpy(), want.images[slot])
            assert quality >= TOLERANCE_DB, (want.keys[slot], quality)
            worst = min(worst, quality)
    assert decoder.decoded == compressed - 1 and decoder.failures == 1
    if augment is RECIPE:
        # The client applied the ops: none of these streams went to the server.
        assert compressed >= 15
        drawn = {name for batch in encoded for ops in batch.ops for name, _ in ops}
        assert {"erase", "adjust_hue", "rgb_to_grayscale"} <= drawn, drawn
        # A threshold op turns the decoders' one-level differences into up
        # to 255: the samples that drew one are the sidecar's to decode.
        for batch in encoded:
            assert batch.encoded is not None
            for slot, ops in enumerate(batch.ops):
                if {name for name, _ in ops} & THRESHOLD_OPS:
                    assert batch.encoded.decoded[slot], (batch.keys[slot], ops)
    if augment is SELF_SUPERVISED:
        assert compressed >= 15
        drawn = {name for batch in encoded for ops in batch.ops for name, _ in ops}
        assert {"gaussian_blur", "solarize", "adjust_hue"} <= drawn, drawn
        solarized_here = [
            batch.keys[slot]
            for batch in encoded
            for slot, ops in enumerate(batch.ops)
            if "solarize" in {name for name, _ in ops} and not batch.encoded.decoded[slot]  # type: ignore[union-attr]
        ]
        assert solarized_here, "no solarized sample was the client's to decode"
    if augment is SOLARIZE_200:
        for batch in encoded:
            assert batch.encoded is not None
            for slot, ops in enumerate(batch.ops):
                solarized = "solarize" in {name for name, _ in ops}
                assert not solarized or batch.encoded.decoded[slot], batch.keys[slot]
        assert compressed >= 4
    names = {id(RECIPE): "recipe", id(SELF_SUPERVISED): "self_supervised"}
    name = augment if isinstance(augment, str) else names.get(id(augment), "solarize_200")
    print(f"{name}: {compressed} decoded by the client, worst PSNR {worst:.1f} dB")


def test_a_server_share_puts_every_sample_in_its_slot(unix_server: Server, dataset: str) -> None:
    reference = _stream(unix_server, dataset, "train")
    half = _stream(unix_server, dataset, "train", delivery="encoded", server_decode_fraction=0.5)
    decoder = BatchDecoder("cpu")
    # Drawn per sample: about half of the stream, not half of every batch.
    server = [
        len(set(np.flatnonzero(got.encoded.decoded).tolist()) | set(got.substituted))
        for got in half
        if got.encoded is not None
    ]
    samples = sum(len(got.keys) for got in half)
    assert 0.3 * samples <= sum(server) <= 0.8 * samples, server
    for want, got in zip(reference, half):
        assert got.encoded is not None
        decoded = decoder.decode(got)
        for slot in range(len(want.keys)):
            if got.encoded.decoded[slot] and slot not in got.substituted:
                # The server's pixels, untouched.
                np.testing.assert_array_equal(decoded.images[slot].numpy(), want.images[slot])
            assert psnr(decoded.images[slot].numpy(), want.images[slot]) >= TOLERANCE_DB
    # A tuned share moves only who decodes: the same boxes and samples.
    auto = _stream(unix_server, dataset, "train", delivery="encoded", server_decode_fraction="auto")
    for want, got in zip(reference, auto):
        decoded = decoder.decode(got)
        np.testing.assert_array_equal(decoded.crop_boxes, want.crop_boxes)
        for slot in range(len(want.keys)):
            assert psnr(decoded.images[slot].numpy(), want.images[slot]) >= TOLERANCE_DB
    with pytest.raises(ValueError, match='a number or "auto"'):
        _stream(unix_server, dataset, "train", delivery="encoded", server_decode_fraction="half")
    with pytest.raises(ValueError, match="server_decode_start is for"):
        _stream(unix_server, dataset, "train", delivery="encoded", server_decode_start=0.5)
    # A tuned stream starts where it is told: from all of it decoded here,
    # the first batch has every slot decoded by the server.
    started = _stream(
        unix_server,
        dataset,
        "train",
        delivery="encoded",
        server_decode_fraction="auto",
        server_decode_start=1.0,
    )
    assert started[0].encoded is not None and started[0].encoded.decoded.all()
    # The PNG and the progressive JPEG always arrive as pixels.
    for batch in half:
        assert batch.encoded is not None
        for slot, key in enumerate(batch.keys):
            if key in ("p003", "p005"):
                assert batch.encoded.decoded[slot], key


def test_failures_are_substituted_by_the_servers_rule_and_reported(
    server: Server, dataset: str
) -> None:
    assert substitute_source("a", [0, 1, 3, 4, 6, 7]) == 7
    assert substitute_source("train/000123", [0, 1, 3, 4, 6, 7]) == 6
    assert substitute_source("", [0, 1, 3, 4, 6, 7]) == 3
    assert substitute_source("a", []) is None

    before = scrape(server.metrics_url)
    client = Client(server.target)
    decoder = BatchDecoder("cpu", client=client, report_every=1000)
    batches = _stream(server, dataset, "eval", delivery="encoded", transport="inline")
    for batch in batches:
        decoder.decode(batch)
    decoder.flush()
    after = scrape(server.metrics_url)

    def moved(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert moved('shardfeed_substituted_samples_total{reason="client_decode"}') == 1
    assert moved("shardfeed_client_decoded_samples_total") == decoder.decoded
    assert moved('shardfeed_delivered_samples_total{decoded_by="client"}') == decoder.decoded + 1


def test_the_resize_is_the_servers_filter() -> None:
    # A whole-image "crop" to the same size is the identity; a 2x
    # downscale averages each 2x2 block's neighbourhood with the triangle.
    image = torch.arange(3 * 8 * 8, dtype=torch.uint8).reshape(3, 8, 8)
    same = crop_resize(image, (0, 0, 8, 8), False, 8, 8)
    assert torch.equal(same, image.permute(1, 2, 0))
    flipped = crop_resize(image, (0, 0, 8, 8), True, 8, 8)
    assert torch.equal(flipped, image.permute(1, 2, 0).flip(1))
    ramp = torch.arange(8, dtype=torch.uint8).repeat(3, 8, 1) * 16
    half = crop_resize(ramp, (0, 0, 8, 8), False, 4, 4)
    assert half[0, :, 0].tolist() == [11, 40, 72, 101]


def test_the_dataset_decodes_on_the_client_and_resumes(unix_server: Server, dataset: str) -> None:
    common: dict[str, Any] = {
        "target": unix_server.target,
        "batch_size": 8,
        "image_size": 48,
        "augment": "train",
        "seed": 3,
        "rank": 0,
        "world_size": 1,
        "output": "dict",
    }
    server_side = list(ShardfeedDataset(dataset, **common))
    ds = ShardfeedDataset(dataset, decode="client", **common)
    client_side = list(ds)
    assert len(client_side) == len(server_side) == 3
    for want, got in zip(server_side, client_side):
        assert got["keys"] == want["keys"]
        assert torch.equal(got["labels"], want["labels"])
        assert torch.equal(got["substituted"], want["substituted"])
        assert got["images"].shape == want["images"].shape
        for a, b in zip(got["images"], want["images"]):
            assert psnr(a.numpy(), b.numpy()) >= TOLERANCE_DB

    # A resume after the first batch continues with the same samples.
    resumed = ShardfeedDataset(dataset, decode="client", **common)
    first = iter(resumed)
    next(first)
    state = resumed.state_dict()
    again = ShardfeedDataset(dataset, decode="client", **common)
    again.load_state_dict(state)
    tail = list(again)
    assert [b["keys"] for b in tail] == [b["keys"] for b in client_side[1:]]
    assert all(torch.equal(a["images"], b["images"]) for a, b in zip(tail, client_side[1:]))

    # Tuned: the first stream starts from the server decoding everything (the
    # trainer decodes on its CPU), each later one from the share the last one
    # ended at.
    tuned = ShardfeedDataset(dataset, decode="client", server_decode_fraction="auto", **common)
    assert tuned._share.share is None
    starts: list[float | None] = []
    searches: list[Any] = []
    original = tuned.client.batches

    def recording(*args: Any, **kwargs: Any) -> Any:
        starts.append(kwargs["options"].delivery.server_start)
        searches.append(kwargs["options"].delivery.server_search)
        return original(*args, **kwargs)

    tuned.client.batches = recording  # type: ignore[method-assign]
    list(tuned)
    share, search = tuned._share.share, tuned._share.search
    assert share is not None and 0.0 <= share <= 1.0
    # The search's whole state comes with each batch, and the next stream
    # goes on with it rather than holding its start afresh.
    assert search is not None and search.center == share and 32 <= search.next_hold <= 512
    assert len(list(tuned)) == 3
    assert starts == [1.0, share]
    assert searches == [None, search]

    with pytest.raises(ValueError, match="decode must be one of"):
        ShardfeedDataset(dataset, decode="nvjpeg", **common)
    with pytest.raises(ValueError, match="CUDA device"):
        ShardfeedDataset(dataset, decode="gpu", device="cpu", **common)


def test_a_jpeg_cut_short_and_one_over_the_budget_are_substituted_in_both_deliveries(
    s3: S3,
) -> None:
    from PIL import Image

    whole = photo(40, 200, 150)
    # Pillow refuses it; a lenient decoder would fill the missing rows.
    cut = whole[: len(whole) // 3]
    with pytest.raises(OSError):
        Image.open(io.BytesIO(cut)).load()
    # 48 Mpx: 288 MB of decode scratch, over the 256 MB of a 2 GiB sidecar.
    large = io.BytesIO()
    Image.new("RGB", (8000, 6000), (90, 120, 30)).save(large, format="JPEG", quality=50)
    samples = [(f"c{i:02d}", {"jpg": photo(41 + i, 160, 120), "cls": b"1"}) for i in range(8)]
    samples[2] = ("c02", {"jpg": cut, "cls": b"2"})
    samples[4] = ("c04", {"jpg": large.getvalue(), "cls": b"4"})
    uri = upload(s3, "cutshort", "", [write_tar(samples)])
    server = start_server(s3, f"127.0.0.1:{free_port()}", "--memory-limit", "2G")
    try:
        decoded = _stream(server, uri, "eval", shuffle=False)
        encoded = _stream(server, uri, "eval", shuffle=False, delivery="encoded")
    finally:
        stop(server.process)
    assert len(decoded) == len(encoded) == 1
    want, got = decoded[0], encoded[0]
    slots = {want.keys.index("c02"), want.keys.index("c04")}
    assert set(want.substituted) == slots, want.substitution_reasons
    reasons = dict(zip(want.substituted, want.substitution_reasons))
    assert "premature end of JPEG data" in reasons[want.keys.index("c02")]
    assert "decode memory budget" in reasons[want.keys.index("c04")]
    # The server's refusal, as in the decoded delivery: the client is never
    # handed the images to decode.
    assert got.encoded is not None
    assert set(got.substituted) == slots
    decoder = BatchDecoder("cpu")
    assert decoder.decode(got).substituted == want.substituted
    assert decoder.failures == 0


# DINO's shape at small sizes, every op the client mirrors: two bicubic
# global views whose ops differ, three local ones.
def _views() -> Any:
    import dataclasses

    from shardfeed import views

    def view(side: int, scale: tuple[float, float], **ops: Any) -> Augment:
        base = Augment.train(scale=scale, interpolation="bicubic", **ops)
        return dataclasses.replace(base, size=(side, side))

    jitter = ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8)
    first = view(48, (0.32, 1.0), color_jitter=jitter, grayscale=0.2)
    second = view(
        48,
        (0.32, 1.0),
        color_jitter=jitter,
        gaussian_blur=GaussianBlur(9, (0.1, 2.0), p=0.5),
        solarize=RandomSolarize(128, 0.5),
    )
    local = view(24, (0.05, 0.32), gaussian_blur=GaussianBlur(9, (0.1, 2.0), p=0.5))
    return views({"global": [first, second], "local": (local, 3)})


def test_views_decoded_here_match_the_sidecars_view_by_view(
    unix_server: Server, dataset: str
) -> None:
    """Each compressed sample decoded once in this process, every view made
    from that decode with the sidecar's box and ops: each row within the
    tolerance of the sidecar's own view; the undecodable JPEG fails here
    and is substituted (every view) by the server's rule."""
    client = Client(unix_server.target)
    spec = _views()
    ask = dict(batch_size=8, seed=3, epoch=2, views=spec)
    reference = list(client.batches(dataset, **ask))
    encoded = list(client.batches(dataset, delivery="encoded", **ask))
    decoder = BatchDecoder("cpu")
    assert len(reference) == len(encoded) == 3
    worst, compressed = math.inf, 0
    for want, got in zip(reference, encoded):
        assert got.encoded is not None and got.keys == want.keys
        compressed += int((~got.encoded.decoded).sum())
        decoded = decoder.decode(got)
        assert decoded.substituted == want.substituted
        np.testing.assert_array_equal(decoded.labels.numpy(), want.labels)
        assert isinstance(decoded.images, list) and len(decoded.images) == 2
        # A slot that failed here carries its substitute's views, boxes
        # and flips, as the sidecar's substitution gives them.
        assert decoded.failed == [] or len(decoded.view_boxes) == 2
        for g, (mine, theirs) in enumerate(zip(decoded.images, want.views)):
            assert tuple(mine.shape) == theirs.images.shape
            boxes, flipped = decoded.view_boxes[g]
            np.testing.assert_array_equal(boxes, theirs.crop_boxes)
            np.testing.assert_array_equal(flipped, theirs.flipped)
            for row in range(len(theirs.images)):
                quality = psnr(mine[row].numpy(), theirs.images[row])
                assert quality >= TOLERANCE_DB, (g, row, quality)
                worst = min(worst, quality)
    # 24 samples: a PNG and a progressive JPEG are the sidecar's.
    assert compressed >= 18, compressed
    assert decoder.decoded == compressed - 1 and decoder.failures == 1
    drawn = {name for batch in encoded for g in batch.views for ops in g.ops for name, _ in ops}
    assert {"gaussian_blur", "solarize", "adjust_hue"} <= drawn, drawn
    print(f"views: {compressed} samples decoded by the client, worst PSNR {worst:.1f} dB")
