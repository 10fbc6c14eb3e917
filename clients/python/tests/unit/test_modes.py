"""The client's table of delivery modes and sample forms (_modes.py): it
agrees with the proto, and BatchDecoder decodes by it."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

from shardfeed._modes import (
    CLIENT_DEFAULT,
    DELIVERY_VALUES,
    FORM_DECODERS,
    DeliveryMode,
    form_name,
)
from shardfeed._proto import shardfeed_pb2 as pb
from shardfeed._wire import _batch_with_images


def test_every_delivery_and_form_of_the_proto_has_its_row() -> None:
    assert set(get_args(DeliveryMode)) == set(DELIVERY_VALUES)
    assert sorted(DELIVERY_VALUES.values()) == sorted(pb.Delivery.values())
    assert DELIVERY_VALUES[CLIENT_DEFAULT] != pb.DELIVERY_DECODED
    client_forms = set(pb.SampleForm.values()) - {
        pb.SAMPLE_FORM_UNSPECIFIED,
        pb.SAMPLE_FORM_PIXELS,
    }
    assert set(FORM_DECODERS) == client_forms
    assert form_name(pb.SAMPLE_FORM_JPEG) == "SAMPLE_FORM_JPEG"
    assert form_name(99) == "form 99"


def test_each_sample_is_decoded_by_its_forms_decoder_and_an_unknown_form_substituted() -> None:
    torch = pytest.importorskip("torch")
    io = pytest.importorskip("torchvision.io")
    from shardfeed.decode import BatchDecoder

    generator = torch.Generator().manual_seed(5)
    sources = [
        torch.randint(0, 256, (3, 24, 32), dtype=torch.uint8, generator=generator) for _ in range(3)
    ]
    jpegs = [io.encode_jpeg(source, quality=95).numpy() for source in sources]
    out = 8
    pixels = np.full(out * out * 3, 7, dtype=np.uint8)
    message = pb.Batch(
        index=4,
        keys=["named", "legacy", "unknown", "pixels"],
        shards=["s"] * 4,
        labels=[1, 2, 3, 4],
        shape=pb.Shape(n=4, height=out, width=out, channels=3),
    )
    # A JPEG named as one; one from a server before the field (form unset);
    # one in a form this client has no decoder for; final pixels.
    parts = [(jpegs[0], pb.SAMPLE_FORM_JPEG), (jpegs[1], 0), (jpegs[2], 99), (pixels, 0)]
    offset = 0
    for data, form in parts:
        decoded = data is pixels
        message.encoded.add(
            offset=offset,
            length=data.size,
            decoded=decoded,
            source_width=0 if decoded else 32,
            source_height=0 if decoded else 24,
            form=form,
        )
        message.crops.add(left=0, top=0, width=0 if decoded else 32, height=0 if decoded else 24)
        offset += data.size
    batch = _batch_with_images(message, np.concatenate([data for data, _ in parts]))
    assert batch.encoded is not None
    assert batch.encoded.forms.tolist() == [
        pb.SAMPLE_FORM_JPEG,
        pb.SAMPLE_FORM_JPEG,
        99,
        pb.SAMPLE_FORM_PIXELS,
    ]

    got = BatchDecoder("cpu").decode(batch)

    assert got.failed == [(2, "form 99: this client has no decoder for it")]
    assert got.substituted == [2]
    for slot in (0, 1):
        # Resized from its own source: close to its mean colour, not another's.
        mean = got.images[slot].float().mean(dim=(0, 1))
        assert torch.allclose(mean, sources[slot].float().mean(dim=(1, 2)), atol=4), slot
    assert bool((got.images[3] == 7).all())
    assert int(got.labels[2]) in (1, 2, 4)
    source = [1, 2, 4].index(int(got.labels[2]))
    assert torch.equal(got.images[2], got.images[[0, 1, 3][source]])
