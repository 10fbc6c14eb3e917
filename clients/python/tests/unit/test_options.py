"""Stream options: grouped, typed, and checked where they are written."""

from __future__ import annotations

import pytest

from shardfeed import Client, Delivery, SampleLayout, Shuffle, StreamOptions
from shardfeed._options import stream_options


def test_flat_keywords_land_in_their_groups() -> None:
    options = stream_options(
        shuffle=False,
        shuffle_buffer=64,
        fields=["txt", "json"],
        label_offset=-1,
        delivery="encoded",
        server_decode_fraction="auto",
        server_decode_start=0.25,
        weight_changes=[(0, [1.0, 1.0])],
        weights_from=12,
        partition="pad",
        transport="inline",
        decoded_source=256,
    )
    assert options.shuffle == Shuffle(enabled=False, buffer=64)
    assert options.layout == SampleLayout(fields=("txt", "json"), label_offset=-1)
    assert options.delivery == Delivery("encoded", "auto", 0.25)
    assert options.mix.weight_changes == ((0, (1.0, 1.0)),)
    assert options.mix.weights_from == 12
    assert (options.partition, options.transport, options.decoded_source) == ("pad", "inline", 256)


def test_keywords_apply_on_top_of_an_options_object() -> None:
    base = StreamOptions(shuffle=Shuffle(buffer=8), delivery=Delivery("encoded", 0.5))
    options = stream_options(base, interleave=2, server_decode_fraction=0.75)
    assert options.shuffle == Shuffle(buffer=8, interleave=2)
    assert options.delivery == Delivery("encoded", 0.75)
    assert stream_options(base, shuffle=Shuffle(enabled=False)).shuffle == Shuffle(enabled=False)
    assert base.shuffle == Shuffle(buffer=8), "options are values: the base is unchanged"


def test_unknown_keywords_and_bad_values_fail_where_written() -> None:
    with pytest.raises(
        TypeError, match=r"unknown stream option shufle_buffer \(did you mean shuffle_buffer\?\)"
    ):
        stream_options(shufle_buffer=4)
    with pytest.raises(TypeError, match="unknown stream option"):
        Client("127.0.0.1:1").batches("s3://b/", colour="red")
    with pytest.raises(ValueError, match="delivery must be one of"):
        stream_options(delivery="zipped")
    with pytest.raises(ValueError, match="transport must be one of"):
        StreamOptions(transport="pigeon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='a number or "auto"'):
        Delivery("encoded", "sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="server_decode_start is for"):
        stream_options(server_decode_start=0.5)
    with pytest.raises(TypeError, match="not the string"):
        SampleLayout(fields="txt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="buffer must be >= 0"):
        Shuffle(buffer=-1)
