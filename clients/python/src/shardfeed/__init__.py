"""shardfeed: decoded, batched images from S3 tar shards, streamed over gRPC."""

from ._augment import Augment, OpGroup
from ._client import Client, Source, distributed_rank_and_world
from ._ops import replay
from ._options import Delivery, MixHistory, SampleLayout, Shuffle, StreamOptions
from ._policies import (
    AutoAugment,
    ColorJitter,
    GaussianBlur,
    RandAugment,
    RandomAdjustSharpness,
    RandomAffine,
    RandomErasing,
    RandomPhotometricDistort,
    RandomPosterize,
    RandomRotation,
    RandomSolarize,
    TrivialAugmentWide,
)
from ._server import PackReport, Server, SkippedFile, pack, serve
from ._stats import InputStats
from ._timm import TimmRandAugment
from ._torchvision import from_torchvision
from ._views import ViewGroup, Views, views, views_from_torchvision
from ._wire import Batch, DatasetInfo, EpochPosition, ShardfeedError, ViewImages

__all__ = [
    "Augment",
    "AutoAugment",
    "ColorJitter",
    "GaussianBlur",
    "OpGroup",
    "RandAugment",
    "RandomAdjustSharpness",
    "RandomAffine",
    "RandomErasing",
    "RandomPhotometricDistort",
    "RandomPosterize",
    "RandomRotation",
    "RandomSolarize",
    "TimmRandAugment",
    "TrivialAugmentWide",
    "ViewGroup",
    "ViewImages",
    "Views",
    "Batch",
    "Client",
    "DatasetInfo",
    "Delivery",
    "EpochPosition",
    "InputStats",
    "MixHistory",
    "PackReport",
    "SampleLayout",
    "Server",
    "ShardfeedError",
    "Shuffle",
    "SkippedFile",
    "Source",
    "StreamOptions",
    "distributed_rank_and_world",
    "from_torchvision",
    "pack",
    "replay",
    "serve",
    "views",
    "views_from_torchvision",
]
__version__ = "0.2.0"
