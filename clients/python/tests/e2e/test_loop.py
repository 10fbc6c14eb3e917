"""The trainer's side: ``ShardfeedDataset.dataloader()`` and ``stats()``
("is the loop waiting for data?") against the real binary."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from shardfeed import Client
from shardfeed.torch import BatchDict, ShardfeedDataset

from ..conftest import S3, Server, noise_jpeg, upload, write_tar

SHARDS, PER_SHARD, BATCH = 4, 24, 4


@pytest.fixture(scope="module")
def dataset(s3: S3) -> str:
    shards = [
        write_tar(
            [
                (f"l{s}{i:03d}", {"jpg": noise_jpeg(3000 + s * 100 + i, 24, 32), "cls": b"%d" % i})
                for i in range(PER_SHARD)
            ]
        )
        for s in range(SHARDS)
    ]
    return upload(s3, "loop", "", shards)


def _dataset(server: Server, uri: str, **options: Any) -> ShardfeedDataset:
    return ShardfeedDataset(
        uri,
        client=Client(server.target),
        batch_size=BATCH,
        image_size=16,
        seed=1,
        rank=0,
        world_size=1,
        **options,
    )


def _labels(loader: Any) -> list[int]:
    return sorted(int(v) for _, labels in loader for v in labels.tolist())


def test_the_loader_yields_the_datasets_batches_plain_with_workers_and_stateful(
    unix_server: Server, dataset: str
) -> None:
    plain = _dataset(unix_server, dataset).dataloader()
    assert isinstance(plain, DataLoader) and plain.batch_size is None
    first = [labels.tolist() for _, labels in plain]
    assert len(first) == SHARDS * PER_SHARD // BATCH

    workers = _dataset(unix_server, dataset).dataloader(num_workers=2)
    assert workers.multiprocessing_context is not None
    assert workers.multiprocessing_context.get_start_method() == "forkserver"
    every = sorted(v for labels in first for v in labels)
    assert _labels(workers) == every, "each sample once, with workers too"

    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = _dataset(unix_server, dataset)
    stateful = ds.dataloader(stateful=True, num_workers=2)
    assert isinstance(stateful, StatefulDataLoader)
    seen: list[int] = []
    for step, (_, labels) in enumerate(stateful):
        seen += labels.tolist()
        if step == 5:
            state = stateful.state_dict()
            break
    again = _dataset(unix_server, dataset).dataloader(stateful=True, num_workers=2)
    again.load_state_dict(state)
    seen += _labels(again)
    assert sorted(seen) == every, "resumed with nothing lost or repeated"


def test_the_loader_refuses_to_batch_again(unix_server: Server, dataset: str) -> None:
    with pytest.raises(ValueError, match="yields whole batches"):
        _dataset(unix_server, dataset).dataloader(batch_size=32)


def _waiting(loader: Any, ds: ShardfeedDataset, work: float) -> float:
    for _ in loader:
        if work:
            time.sleep(work)
    stats = ds.stats()
    assert stats.steps == SHARDS * PER_SHARD // BATCH - 1, stats
    assert len(stats.first_waits) == 1
    return stats.waiting_fraction


@pytest.mark.parametrize("workers", [0, 2])
def test_stats_tell_a_busy_loop_from_a_waiting_one(
    unix_server: Server, dataset: str, workers: int
) -> None:
    busy = _dataset(unix_server, dataset)
    busy_fraction = _waiting(busy.dataloader(num_workers=workers), busy, 0.05)
    idle = _dataset(unix_server, dataset)
    idle_fraction = _waiting(idle.dataloader(num_workers=workers), idle, 0.0)
    print(
        f"waiting fraction, workers={workers}: {busy_fraction:.3f} with 50 ms of work a step, "
        f"{idle_fraction:.3f} with none"
    )
    # Bounds loose enough for a loaded machine: a busy loop's 50 ms of work
    # dwarfs a wait for batches decoded ahead; a loop with no work does
    # nothing but wait.
    assert busy.stats().step_p50 >= 0.05
    assert busy_fraction < 0.5, busy.stats()
    assert idle_fraction > 0.5, idle.stats()
    assert busy_fraction < idle_fraction
    assert idle.stats().verdict == "input-bound"
    assert "input-bound" in str(idle.stats())


def test_a_plain_iteration_measures_itself(unix_server: Server, dataset: str) -> None:
    ds = _dataset(unix_server, dataset)
    for images, _ in ds:
        torch.flip(images, dims=[0])
    assert ds.stats().steps == SHARDS * PER_SHARD // BATCH - 1


def test_dict_output_is_the_typed_dict(unix_server: Server, dataset: str) -> None:
    batch = next(iter(_dataset(unix_server, dataset, output="dict")))
    assert isinstance(batch, dict)
    assert set(batch) == set(BatchDict.__annotations__), "BatchDict names every key"
