"""Mixed streams through Client.batches and ShardfeedDataset, real binary."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shardfeed import Client, Source

from ..conftest import S3, Server, noise_jpeg, upload, write_tar


@pytest.fixture(scope="module")
def two(s3: S3) -> tuple[str, str]:
    def shards(first: int, count: int, per: int) -> list[bytes]:
        return [
            write_tar(
                [
                    (
                        f"m{first + s * per + i:04d}",
                        {
                            "jpg": noise_jpeg(first + s * per + i, 30, 40),
                            "cls": str(first + s * per + i).encode(),
                        },
                    )
                    for i in range(per)
                ]
            )
            for s in range(count)
        ]

    # 60 samples labelled 0..59 and 20 labelled 1000..1019.
    return upload(s3, "mixa", "", shards(0, 3, 20)), upload(s3, "mixb", "", shards(1000, 2, 10))


def _dataset(server: Server, two: tuple[str, str], weights: tuple[float, float]) -> Any:
    # The minimum-versions venv has no torch: only this test needs it.
    pytest.importorskip("torch")
    from shardfeed.torch import ShardfeedDataset

    return ShardfeedDataset(
        sources=[(two[0], weights[0]), (two[1], weights[1])],
        client=Client(server.target),
        batch_size=8,
        image_size=16,
        seed=5,
        rank=0,
        world_size=1,
        augment="train",
        output="dict",
    )


Id = tuple[int, int, int]


def _ids(batch: dict) -> list[Id]:  # type: ignore[type-arg]
    return list(
        zip(batch["sources"].tolist(), batch["source_epochs"].tolist(), batch["labels"].tolist())
    )


def test_client_batches_mix_two_datasets_exactly(unix_server: Server, two: tuple[str, str]) -> None:
    client = Client(unix_server.target)
    batches = list(
        client.batches(
            sources=[(two[0], 3.0), Source(two[1], 1.0, label_offset=-1000)],
            batch_size=8,
            image_size=16,
            rank=0,
            world_size=1,
        )
    )
    assert len(batches) == 10 and all(b.epoch_steps == 10 for b in batches)
    for batch in batches:
        assert batch.sources.count(0) == 6 and batch.sources.count(1) == 2
        # The second source's own label offset: 1000..1019 arrive as 0..19.
        for source, label in zip(batch.sources, batch.labels.tolist()):
            assert (label < 20) if source == 1 else (0 <= label < 60)
    with pytest.raises(ValueError, match="dataset or sources"):
        client.batches("s3://x/", sources=[("s3://y/", 1.0)])


def test_a_mixed_dataset_resumes_and_reweights_from_its_state(
    unix_server: Server, two: tuple[str, str]
) -> None:
    whole = list(_dataset(unix_server, two, (0.75, 0.25)))
    assert len(whole) == 10
    assert all(b["sources"].tolist().count(1) == 2 for b in whole)

    first = _dataset(unix_server, two, (0.75, 0.25))
    head = []
    for batch in first:
        head.append(batch)
        if len(head) == 4:
            state = first.state_dict()
            break
    assert state["weights"] == [0.75, 0.25]

    resumed = _dataset(unix_server, two, (0.75, 0.25))
    resumed.load_state_dict(state)
    tail = list(resumed)
    assert [_ids(b) for b in tail] == [_ids(b) for b in whole[4:]]
    assert all(np.array_equal(a["images"], b["images"]) for a, b in zip(tail, whole[4:]))

    # Made with new weights, loading the state: 50/50 from the resumed batch on.
    reweighted = _dataset(unix_server, two, (0.5, 0.5))
    reweighted.load_state_dict(state)
    after = list(reweighted)
    assert len(after) == 6
    assert all(b["sources"].tolist().count(1) == 4 for b in after)
    seen = [i for b in head + after for i in _ids(b)]
    assert len(seen) == len(set(seen)), "nothing of a source-epoch twice"
    assert reweighted.state_dict()["weight_changes"] == [[0, [0.75, 0.25]]]

    # The next pass is epoch 1; the smaller source has run out and come back.
    nxt = list(reweighted)
    assert len(nxt) == 10 and reweighted.epoch == 2
    assert {e for b in nxt for s, e, _ in _ids(b) if s == 1} >= {1}
