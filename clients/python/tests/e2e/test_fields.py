"""Extra fields of a sample through the real binary and client."""

from __future__ import annotations

import json

import pytest

from shardfeed import Client, ShardfeedError

from ..conftest import S3, Server, noise_jpeg, upload, write_tar


def _members(n: int) -> dict[str, bytes]:
    members = {
        "jpg": noise_jpeg(n, 24, 32),
        "json": json.dumps({"label": n * 2}).encode(),
        "cls": b"0",
    }
    if n % 4 != 3:
        members["txt"] = f"caption {n}".encode()
    return members


@pytest.fixture(scope="module")
def dataset(s3: S3) -> str:
    shards = [
        write_tar([(f"s{s}/{s * 16 + i:04d}", _members(s * 16 + i)) for i in range(16)])
        for s in range(2)
    ]
    return upload(s3, "fields", "", shards)


def test_fields_follow_their_samples_and_labels_come_from_json(
    server: Server, dataset: str
) -> None:
    batches = list(
        Client(server.target).batches(
            dataset,
            batch_size=8,
            image_size=16,
            rank=0,
            world_size=1,
            fields=["txt", "json"],
            label_json_key="label",
        )
    )
    assert len(batches) == 4
    for batch in batches:
        assert set(batch.fields) == {"txt", "json"}
        for slot, key in enumerate(batch.keys):
            n = int(key.rsplit("/", 1)[1])
            assert batch.labels[slot] == n * 2
            assert json.loads(batch.fields["json"][slot] or b"") == {"label": n * 2}
            expected = None if n % 4 == 3 else f"caption {n}".encode()
            assert batch.fields["txt"][slot] == expected


def test_a_field_over_the_cap_is_a_clear_error(server: Server, dataset: str) -> None:
    with pytest.raises(ShardfeedError) as raised:
        list(
            Client(server.target).batches(
                dataset, batch_size=8, image_size=16, fields=["txt"], max_field_bytes=4
            )
        )
    assert raised.value.code == "FAILED_PRECONDITION"
    assert '"txt"' in raised.value.message and "max_field_bytes" in raised.value.message
