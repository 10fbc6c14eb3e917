"""The real client against the real binary and a real S3-compatible server."""

from __future__ import annotations

import io
import pickle
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from PIL import Image

from shardfeed import Client, ShardfeedError
from shardfeed._proto import shardfeed_pb2 as pb
from shardfeed._proto import shardfeed_pb2_grpc as pb_grpc

from ..conftest import S3, Server, start_server, stop, upload, write_tar

COLORS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 40), (128, 128, 128)]


def jpeg(color: tuple[int, int, int], size: tuple[int, int] = (80, 60), mode: str = "RGB") -> bytes:
    image = Image.new("RGB", size, color)
    if mode != "RGB":
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=95)
    return out.getvalue()


@pytest.fixture(scope="module")
def colors(s3: S3) -> tuple[str, list[tuple[str, int, tuple[int, int, int]]]]:
    """3 shards x 10 solid-color samples (RGB, grayscale and CMYK JPEGs)."""
    written = []
    shards = []
    for s in range(3):
        samples = []
        for i in range(10):
            n = s * 10 + i
            color = COLORS[n % len(COLORS)]
            mode = ["RGB", "L", "CMYK"][n % 3]
            expected = color if mode != "L" else (round(sum(color) / 3),) * 3
            if mode == "L":
                gray = Image.new("RGB", (1, 1), color).convert("L").getpixel((0, 0))
                expected = (gray, gray, gray)
            key = f"img{n:04d}"
            samples.append((key, {"jpg": jpeg(color, mode=mode), "cls": str(n % 5).encode()}))
            written.append((key, n % 5, expected))
        shards.append(write_tar(samples))
    return upload(s3, "colors", "v1/", shards), written


def test_describe_and_stream_match(server: Server, colors) -> None:  # type: ignore[no-untyped-def]
    uri, written = colors
    client = Client(server.target)
    info = client.describe(uri, world_size=1, batch_size=8)
    assert (info.shards, info.samples, info.batches_per_rank) == (3, 30, 3)
    batches = list(
        client.batches(
            uri,
            seed=0,
            epoch=0,
            rank=0,
            world_size=1,
            batch_size=8,
            image_size=(16, 24),
            shuffle=False,
        )
    )
    assert len(batches) == info.batches_per_rank
    by_key = {key: (label, color) for key, label, color in written}
    for i, batch in enumerate(batches):
        assert batch.index == i and batch.epoch == 0
        assert batch.images.shape == (8, 16, 24, 3)
        assert batch.images.dtype == np.uint8
        # A view of the received bytes, not a copy.
        assert not batch.images.flags.owndata
        assert batch.labels.dtype == np.int64
        for slot, key in enumerate(batch.keys):
            label, color = by_key[key]
            assert batch.labels[slot] == label
            mean = batch.images[slot].reshape(-1, 3).mean(axis=0)
            assert np.abs(mean - np.array(color)).max() < 6, (key, mean, color)
        assert batch.position.segments == ((1, i + 1),)
        assert batch.position.dataset == batches[0].position.dataset
        assert batch.position.dataset.startswith("samples=30 shards=3 digest=")
        assert batch.global_samples == 8 * (i + 1)
    assert [k for b in batches for k in b.keys] == [w[0] for w in written][:24]


def test_a_full_size_batch_passes_the_message_limits(server: Server, s3: S3) -> None:
    samples = [(f"k{i:04d}", {"jpg": jpeg(COLORS[i % 5], (64, 48))}) for i in range(130)]
    uri = upload(s3, "big", "", [write_tar(samples)])
    client = Client(server.target)
    batches = list(client.batches(uri, batch_size=128, image_size=224))
    assert len(batches) == 1
    assert batches[0].images.nbytes == 128 * 224 * 224 * 3  # 19.3 MB
    assert (batches[0].labels == -1).all(), "no .cls member means label -1"


def test_errors_carry_the_grpc_code(server: Server, colors) -> None:  # type: ignore[no-untyped-def]
    uri, _ = colors
    client = Client(server.target)
    with pytest.raises(ShardfeedError) as missing:
        list(client.batches("s3://no-such-bucket/x/", batch_size=8))
    assert missing.value.code == "NOT_FOUND"
    assert "no-such-bucket" in missing.value.message
    with pytest.raises(ShardfeedError) as bad:
        list(client.batches(uri, batch_size=0))
    assert bad.value.code == "INVALID_ARGUMENT"
    assert bad.value.field == "batch_size", bad.value.message
    assert missing.value.field == "", "only a refused argument names a field"
    with pytest.raises(ShardfeedError) as describe_missing:
        client.describe("s3://no-such-bucket/x/")
    assert describe_missing.value.code == "NOT_FOUND"
    again = pickle.loads(pickle.dumps(bad.value))
    assert (again.code, again.message, again.field) == (
        bad.value.code,
        bad.value.message,
        bad.value.field,
    )


def test_rank_and_world_size_come_from_the_environment(
    server: Server,
    colors,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    uri, _ = colors
    client = Client(server.target)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    from_env = [b.keys for b in client.batches(uri, batch_size=4)]
    explicit = [b.keys for b in client.batches(uri, batch_size=4, rank=1, world_size=2)]
    other = [b.keys for b in client.batches(uri, batch_size=4, rank=0, world_size=2)]
    assert from_env == explicit
    assert len(from_env) == len(other) == 3
    assert not {k for b in from_env for k in b} & {k for b in other for k in b}


def test_resume_and_early_exit(server: Server, colors) -> None:  # type: ignore[no-untyped-def]
    uri, _ = colors
    client = Client(server.target)
    full = list(client.batches(uri, seed=3, epoch=1, batch_size=4))
    tail = list(client.batches(uri, seed=3, epoch=1, batch_size=4, start_batch=5))
    assert [b.keys for b in tail] == [b.keys for b in full[5:]]
    assert all(np.array_equal(a.images, b.images) for a, b in zip(tail, full[5:]))
    # Leaving a stream early cancels it; the server keeps serving.
    for batch in client.batches(uri, batch_size=2):
        assert batch.index == 0
        break
    # Elastic: 2 ranks x 2 for 3 batches, then 1 rank x 4 for the rest.
    position = None
    seen = []
    for rank in range(2):
        batches = list(client.batches(uri, seed=3, batch_size=2, rank=rank, world_size=2))[:3]
        seen += [k for b in batches for k in b.keys]
        position = batches[-1].position
    assert position is not None and position.segments == ((2, 3),)
    assert position.dataset.startswith("samples=30 ")
    rest = list(
        client.batches(uri, seed=3, batch_size=4, rank=0, world_size=1, resume_from=position)
    )
    seen += [k for b in rest for k in b.keys]
    assert len(seen) == len(set(seen)) == 28


def test_unix_socket(s3: S3, colors, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    uri, _ = colors
    srv = start_server(s3, f"unix:{tmp_path / 'shardfeed.sock'}")
    try:
        client = Client(srv.target)
        assert client.describe(uri, batch_size=8).batches_per_rank == 3
        assert len(list(client.batches(uri, batch_size=8))) == 3
        # Any gRPC client: the generated stubs on a plain channel, no options
        # (grpcio sends the socket path as :authority, which h2 refuses).
        with grpc.insecure_channel(srv.target) as channel:
            stub = pb_grpc.ShardfeedStub(channel)  # type: ignore[no-untyped-call]
            info = stub.Describe(pb.DescribeRequest(dataset=uri, world_size=1, batch_size=8))
            assert info.batches_per_rank == 3
            request = pb.StreamBatchesRequest(
                dataset=uri, world_size=1, batch_size=8, height=16, width=16
            )
            assert len(list(stub.StreamBatches(request))) == 3
    finally:
        stop(srv.process)


def test_metrics_are_exported(server: Server, colors) -> None:  # type: ignore[no-untyped-def]
    uri, _ = colors
    list(Client(server.target).batches(uri, batch_size=8))
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    for name in (
        "shardfeed_requests_total",
        "shardfeed_batches_total",
        "shardfeed_samples_total",
        "shardfeed_s3_requests_total",
    ):
        assert name in text, name
    import shardfeed

    assert f'shardfeed_build_info{{version="{shardfeed.__version__}"}} 1' in text


def test_bytes_that_are_not_the_request_are_the_callers_fault(server: Server) -> None:
    """A `string` field that is not UTF-8 (here `client_ops`) is the
    caller's error, INVALID_ARGUMENT, not the server's (INTERNAL)."""
    valid = pb.StreamBatchesRequest(dataset="s3://bucket/x/").SerializeToString()
    not_utf8 = valid + bytes([0xE2, 0x01, 0x02, 0xFF, 0xFE])  # field 28, 2 bytes
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_stream(
            "/shardfeed.v1.Shardfeed/StreamBatches",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        with pytest.raises(grpc.RpcError) as refused:
            list(call(not_utf8, timeout=30))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not valid protobuf" in (refused.value.details() or "")
