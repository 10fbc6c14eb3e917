"""Repeated augmentation through the real binary: every sample ``k`` times
an epoch, each copy with its own crop and ops, a sample's copies on
different ranks, copy 0 the sample as a stream without repeats draws it,
and an out-of-range ``repeats`` refused where it is written."""

from __future__ import annotations

from collections import defaultdict

import pytest

from shardfeed import Augment, Client, RandomErasing, StreamOptions, TrivialAugmentWide

from ..conftest import Server
from .test_augment import photos  # noqa: F401  (the module's dataset fixture)

RECIPE = Augment.train(
    auto_augment=TrivialAugmentWide(interpolation="bilinear"), random_erasing=RandomErasing(0.5)
)


def _deliveries(
    client: Client, uri: str, *, repeats: int, world_size: int, start_batch: int = 0
) -> list[tuple[int, str, int, tuple[float, ...], str, bytes]]:
    """(rank, key, copy, crop box, ops, pixels) of every sample delivered."""
    out = []
    for rank in range(world_size):
        for batch in client.batches(
            uri,
            batch_size=4,
            rank=rank,
            world_size=world_size,
            image_size=32,
            seed=3,
            augment=RECIPE,
            repeats=repeats,
            start_batch=start_batch,
        ):
            copies = batch.copies or [0] * len(batch.keys)
            for slot, key in enumerate(batch.keys):
                out.append(
                    (
                        rank,
                        key,
                        copies[slot],
                        tuple(float(v) for v in batch.crop_boxes[slot]),
                        repr(batch.ops[slot]),
                        batch.images[slot].tobytes(),
                    )
                )
    return out


def test_each_copy_once_on_its_own_rank_with_its_own_decisions(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    uri, written = photos
    client = Client(server.target)
    repeated = _deliveries(client, uri, repeats=3, world_size=4)
    # 16 samples x 3 copies = 48 = 3 global batches of 16: nothing dropped.
    assert sorted((key, copy) for _, key, copy, *_ in repeated) == sorted(
        (key, copy) for key in written for copy in range(3)
    )
    ranks = defaultdict(set)
    boxes = defaultdict(set)
    for rank, key, _, box, _, _ in repeated:
        ranks[key].add(rank)
        boxes[key].add(box)
    # World 4 >= 3 copies: each copy on a rank of its own, a box of its own.
    assert all(len(r) == 3 for r in ranks.values()), dict(ranks)
    assert all(len(b) == 3 for b in boxes.values()), dict(boxes)
    # Copy 0 is the sample as a stream without repeats draws it.
    single = {key: rest for _, key, _, *rest in _deliveries(client, uri, repeats=1, world_size=1)}
    for _, key, copy, box, ops, pixels in repeated:
        if copy == 0:
            assert (box, ops, pixels) == tuple(single[key]), key
    # The same request again, and one started later, give the same copies.
    assert _deliveries(client, uri, repeats=3, world_size=4) == repeated
    later = _deliveries(client, uri, repeats=3, world_size=4, start_batch=1)
    by_rank = defaultdict(list)
    for delivery in repeated:
        by_rank[delivery[0]].append(delivery)
    assert later == [d for rank in sorted(by_rank) for d in by_rank[rank][4:]]


def test_repeats_out_of_range_are_refused_where_written() -> None:
    for bad in (0, 17):
        with pytest.raises(ValueError, match="repeats"):
            StreamOptions(repeats=bad)
    with pytest.raises(TypeError, match="repeats"):
        StreamOptions(repeats=2.0)  # type: ignore[arg-type]
    assert StreamOptions().with_keywords(repeats=4).repeats == 4


def test_the_dataset_counts_and_reports_every_copy(
    server: Server,
    photos: tuple[str, dict[str, bytes]],  # noqa: F811
) -> None:
    pytest.importorskip("torch")
    from shardfeed.torch import ShardfeedDataset

    uri, written = photos
    seen = []
    for rank in range(2):
        ds = ShardfeedDataset(
            uri,
            client=Client(server.target),
            batch_size=4,
            image_size=16,
            rank=rank,
            world_size=2,
            augment="train",
            output="dict",
            repeats=2,
        )
        batches = list(ds)
        # 16 samples x 2 copies over 2 ranks of 4: 4 batches each.
        assert len(ds) == len(batches) == 4
        for batch in batches:
            seen += zip(batch["keys"], batch["copies"].tolist())
    assert sorted(seen) == sorted((key, copy) for key in written for copy in range(2))
