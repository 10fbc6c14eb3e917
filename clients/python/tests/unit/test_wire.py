"""The batch deserializer against the generated protobuf parser."""

from __future__ import annotations

import numpy as np
import pytest

from shardfeed._proto import shardfeed_pb2 as pb
from shardfeed._wire import _batch_from_wire


def _message(n: int = 3, height: int = 4, width: int = 5) -> pb.Batch:
    rng = np.random.default_rng(1)
    message = pb.Batch(
        epoch=2,
        index=7,
        shape=pb.Shape(n=n, height=height, width=width, channels=3),
        images=rng.integers(0, 256, n * height * width * 3, dtype=np.uint8).tobytes(),
        labels=[5, -1, 300][:n],
        keys=[f"k{i}" for i in range(n)],
        shards=["s3://b/a.tar"] * n,
        substituted=[1],
        substitution_reasons=["corrupt JPEG"],
        global_samples=99,
    )
    message.position.segments.add(world_size=8, batches=12)
    return message


def test_matches_the_generated_parser() -> None:
    message = _message()
    batch = _batch_from_wire(message.SerializeToString())
    assert batch.images.shape == (3, 4, 5, 3)
    assert batch.images.tobytes() == message.images
    assert batch.labels.tolist() == [5, -1, 300]
    assert batch.keys == ["k0", "k1", "k2"]
    assert batch.shards == ["s3://b/a.tar"] * 3
    assert (batch.epoch, batch.index, batch.global_samples) == (2, 7, 99)
    assert batch.substituted == [1] and batch.substitution_reasons == ["corrupt JPEG"]
    assert batch.position.segments == ((8, 12),)


def test_shares_the_received_buffer() -> None:
    data = _message().SerializeToString()
    batch = _batch_from_wire(data)
    assert batch.images.base is not None
    assert not batch.images.flags.writeable
    assert np.shares_memory(batch.images, np.frombuffer(data, dtype=np.uint8))


def test_unknown_fields_and_an_empty_batch_parse() -> None:
    # A newer server may add fields: they must not be mistaken for images.
    unknown = bytes([0xA8, 0x06, 0x01]) + bytes([0xB2, 0x06, 0x02]) + b"hi"  # fields 101, 102
    batch = _batch_from_wire(unknown + _message().SerializeToString())
    assert batch.keys == ["k0", "k1", "k2"]
    empty = _batch_from_wire(_message(n=0).SerializeToString())
    assert empty.images.shape == (0, 4, 5, 3)


@pytest.mark.parametrize("cut", [1, 10, 40, -1])
def test_truncated_messages_raise(cut: int) -> None:
    data = _message().SerializeToString()
    with pytest.raises(ValueError):
        _batch_from_wire(data[:cut])


def test_a_stream_errors_resume_position_keeps_a_mixed_streams_history() -> None:
    from shardfeed import EpochPosition, ShardfeedError

    error = ShardfeedError(
        "UNAVAILABLE",
        "draining",
        "SERVER_DRAINING",
        {"position": "4:3,2:1", "dataset": "d", "before_epoch": "8:10,4:2"},
    )
    assert error.resume_position() == EpochPosition(((4, 3), (2, 1)), "d", ((8, 10), (4, 2)))
