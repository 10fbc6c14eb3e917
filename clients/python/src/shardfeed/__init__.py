"""shardfeed: decoded, batched images from S3 tar shards, streamed over gRPC."""

from ._client import (
    Augment,
    Batch,
    Client,
    DatasetInfo,
    EpochPosition,
    ShardfeedError,
    distributed_rank_and_world,
)

__all__ = [
    "Augment",
    "Batch",
    "Client",
    "DatasetInfo",
    "EpochPosition",
    "ShardfeedError",
    "distributed_rank_and_world",
]
__version__ = "0.1.0"
