"""The decoded-source tier through the real binary: the same batches with
the tier cold, warm, damaged, or absent, over shared memory."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shardfeed import Client

from ..conftest import S3, Server, noise_jpeg, start_server, stop, upload, write_tar


def _batches(
    server: Server, uri: str, epoch: int = 1, **options: Any
) -> list[tuple[np.ndarray, list[int]]]:
    options.setdefault("decoded_source", 64)
    client = Client(server.target)
    return [
        (b.images.copy(), b.labels.tolist())
        for b in client.batches(
            uri,
            batch_size=5,
            image_size=32,
            augment="train",
            seed=4,
            epoch=epoch,
            rank=0,
            world_size=1,
            **options,
        )
    ]


def test_the_tier_gives_the_same_batches_cold_warm_damaged_and_absent(
    s3: S3, unix_server: Server
) -> None:
    shards = [
        write_tar(
            [
                (f"t{s}{i:02d}", {"jpg": noise_jpeg(300 + s * 10 + i, 90, 120), "cls": b"%d" % i})
                for i in range(10)
            ]
        )
        for s in range(2)
    ]
    uri = upload(s3, "tier", "", shards)
    # No tier directory: every source derived, nothing kept.
    expected = _batches(unix_server, uri)
    assert len(expected) == 4

    directory = Path(tempfile.mkdtemp(prefix="sf-tier-"))
    tiered = start_server(
        s3,
        f"unix:{directory}/sf.sock",
        "--decoded-cache-dir",
        str(directory / "decoded"),
    )
    try:
        for attempt in ("cold", "warm"):
            got = _batches(tiered, uri)
            assert [labels for _, labels in got] == [labels for _, labels in expected]
            assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(got, expected)), attempt
        records = sorted((directory / "decoded").glob("*/*.src"))
        assert len(records) == 20
        for record in records[::3]:
            record.write_bytes(record.read_bytes()[:-7])
        got = _batches(tiered, uri)
        assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(got, expected)), "damaged"
        # A server with a tier uses it unless the request opts out (0).
        original = _batches(unix_server, uri, decoded_source=None)
        opted_out = _batches(tiered, uri, decoded_source=0)
        assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(opted_out, original))
        # Without decoded_source: the server's default form (shorter side
        # 320, the photos' whole size here): 20 more records.
        _batches(tiered, uri, decoded_source=None)
        assert len(sorted((directory / "decoded").glob("*/*.src"))) == 40
    finally:
        stop(tiered.process)


def _views(
    server: Server, uri: str, epoch: int = 1, **options: Any
) -> list[tuple[list[np.ndarray], list[np.ndarray], list[int]]]:
    """Each batch's groups' pixels and boxes, and its labels."""
    from .test_views import dino_like

    options.setdefault("decoded_source", 64)
    client = Client(server.target)
    return [
        (
            [group.images.copy() for group in b.views],
            [group.crop_boxes.copy() for group in b.views],
            b.labels.tolist(),
        )
        for b in client.batches(
            uri, batch_size=4, views=dino_like(), seed=4, epoch=epoch, **options
        )
    ]


def _same_views(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        x[2] == y[2]
        and all(np.array_equal(p, q) for p, q in zip(x[0], y[0]))
        and all(np.array_equal(p, q) for p, q in zip(x[1], y[1]))
        for x, y in zip(a, b)
    )


def test_views_from_the_tier_store_each_source_once_and_match_cold_warm_damaged_and_absent(
    s3: S3, unix_server: Server
) -> None:
    """A stream of views through the tier: one stored source per sample
    (not per view), every view cropped from it, the same bytes and boxes
    whatever the tier holds; the epochs before the first stored one are the
    original's."""
    shards = [
        write_tar(
            [
                (f"v{s}{i:02d}", {"jpg": noise_jpeg(900 + s * 10 + i, 90, 120), "cls": b"%d" % i})
                for i in range(8)
            ]
        )
        for s in range(2)
    ]
    uri = upload(s3, "tierviews", "", shards)
    expected = _views(unix_server, uri)
    assert len(expected) == 4 and len(expected[0][0]) == 2
    original = _views(unix_server, uri, decoded_source=None)
    assert not _same_views(expected, original), "the stored source defines other bytes"
    assert _same_views(
        _views(unix_server, uri, epoch=0), _views(unix_server, uri, epoch=0, decoded_source=None)
    )

    directory = Path(tempfile.mkdtemp(prefix="sf-tier-views-"))
    tiered = start_server(
        s3, f"unix:{directory}/sf.sock", "--decoded-cache-dir", str(directory / "decoded")
    )
    try:
        for attempt in ("cold", "warm"):
            assert _same_views(_views(tiered, uri), expected), attempt
        records = sorted((directory / "decoded").glob("*/*.src"))
        assert len(records) == 16, "one source per sample, whatever its views"
        for record in records[::3]:
            record.write_bytes(record.read_bytes()[:-7])
        assert _same_views(_views(tiered, uri), expected), "damaged"
        # The server's default tier applies to a stream of views too.
        _views(tiered, uri, decoded_source=None)
        assert len(sorted((directory / "decoded").glob("*/*.src"))) == 32
    finally:
        stop(tiered.process)


def test_epochs_before_the_first_stored_one_are_the_originals_bytes(
    s3: S3, unix_server: Server
) -> None:
    shards = [
        write_tar(
            [
                (f"f{i:02d}", {"jpg": noise_jpeg(700 + i, 90, 120), "cls": b"%d" % i})
                for i in range(8)
            ]
        )
    ]
    uri = upload(s3, "tierfirst", "", shards)

    def same(a: list[tuple[np.ndarray, list[int]]], b: list[tuple[np.ndarray, list[int]]]) -> bool:
        return len(a) == len(b) and all(np.array_equal(x, y) for (x, _), (y, _) in zip(a, b))

    original = _batches(unix_server, uri, epoch=0, decoded_source=None)
    stored = _batches(unix_server, uri, epoch=0, decoded_source_from_epoch=0)
    assert not same(original, stored), "the stored source defines other bytes"
    # Epoch 0 with the tier, by default: the original's bytes.
    assert same(_batches(unix_server, uri, epoch=0), original)
    assert same(
        _batches(unix_server, uri, epoch=2, decoded_source_from_epoch=3),
        _batches(unix_server, uri, epoch=2, decoded_source=None),
    )


def test_a_server_waiting_for_a_tier_slot_answers_not_serving(s3: S3) -> None:
    import os
    import subprocess

    from shardfeed import ShardfeedError

    from ..conftest import ACCESS_KEY, SECRET_KEY, binary, free_port

    directory = Path(tempfile.mkdtemp(prefix="sf-slot-"))
    decoded = str(directory / "decoded")
    holder = start_server(s3, f"unix:{directory}/a.sock", "--decoded-cache-dir", decoded)
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    waiting = subprocess.Popen(
        [
            str(binary()),
            "serve",
            "--listen",
            f"unix:{directory}/b.sock",
            "--metrics-listen",
            f"127.0.0.1:{free_port()}",
            "--decoded-cache-dir",
            decoded,
            "--cache-lock-wait",
            "60",
        ],
        env=env,
    )
    try:
        client = Client(f"unix://{directory}/b.sock")
        # Listening while it waits: health says NOT_SERVING, not "no socket".
        message = ""
        for _ in range(100):
            try:
                client.wait_until_serving(timeout=0.2)
            except ShardfeedError as error:
                message = error.message
                if "NOT_SERVING" in message:
                    break
        assert "NOT_SERVING" in message, message
        # Once the slot is free, it serves.
        stop(holder.process)
        client.wait_until_serving(timeout=30)
    finally:
        stop(holder.process)
        stop(waiting)
