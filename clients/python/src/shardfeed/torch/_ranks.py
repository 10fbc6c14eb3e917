"""Which rank of how many a ``ShardfeedDataset``'s stream is, and how many
steps an epoch has at a world size (asked of the server once each)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import get_worker_info

from .._client import Client, distributed_rank_and_world
from .._options import Partition


def rank_and_world(rank: int | None, world_size: int | None, device_mesh: Any) -> tuple[int, int]:
    """The data-parallel rank and world size: the mesh's, else those given,
    else ``torch.distributed``'s or the environment's."""
    if device_mesh is not None:
        return int(device_mesh.get_local_rank()), int(device_mesh.size())
    default_rank, default_world = distributed_rank_and_world()
    return (
        default_rank if rank is None else rank,
        default_world if world_size is None else world_size,
    )


def worker_sub_rank(rank: int, world: int) -> tuple[int, int]:
    """In a DataLoader worker, its sub-rank of ``world * num_workers``."""
    worker = get_worker_info()
    if worker is None:
        return rank, world
    return rank * worker.num_workers + worker.id, world * worker.num_workers


class EpochSteps:
    """Batches per rank of an epoch, by (world size, batch size, partition,
    repeats)."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, int, Partition, int], int] = {}

    def steps(
        self,
        client: Client,
        dataset: str | None,
        sources: list[str] | None,
        world: int,
        batch_size: int,
        partition: Partition,
        repeats: int = 1,
    ) -> int:
        key = (world, batch_size, partition, repeats)
        if key in self._known:
            return self._known[key]
        if sources is not None:
            # A mixed epoch has as many global batches as its sources hold
            # (each sample once a copy).
            samples = repeats * sum(
                client.describe(name, world_size=1, batch_size=1).samples for name in sources
            )
            self._known[key] = samples // (world * batch_size)
        else:
            assert dataset is not None
            info = client.describe(
                dataset,
                world_size=world,
                batch_size=batch_size,
                partition=partition,
                repeats=repeats,
            )
            self._known[key] = info.batches_per_rank
        return self._known[key]
