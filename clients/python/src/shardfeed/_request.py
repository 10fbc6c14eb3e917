"""What a stream asks: the rank and world a process is, a mixed stream's
sources, and the ``StreamBatchesRequest`` built from ``Client.batches``'s
arguments and its :class:`StreamOptions`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from . import _shm
from ._augment import AugmentSpec, ImageSize, _augment, _image_size, resolve_image_size
from ._options import StreamOptions
from ._proto import shardfeed_pb2 as pb
from ._views import Views, refuse_conflicts
from ._wire import EpochPosition

_PARTITIONS = {"drop_last": pb.PARTITION_DROP_LAST, "pad": pb.PARTITION_PAD}
_RESIZE = {"center_crop": pb.RESIZE_MODE_CENTER_CROP, "stretch": pb.RESIZE_MODE_STRETCH}
_TRANSPORTS = {
    "auto": pb.TRANSPORT_INLINE,
    "inline": pb.TRANSPORT_INLINE,
    "shared_memory": pb.TRANSPORT_SHARED_MEMORY,
}


def distributed_rank_and_world() -> tuple[int, int]:
    """torch.distributed if initialized, else RANK / WORLD_SIZE, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except ImportError:
        pass
    rank = os.environ.get("RANK")
    world = os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        return int(rank), int(world)
    return 0, 1


@dataclass(frozen=True)
class Source:
    """One dataset of a mixed stream, with its weight and, where they differ
    from the stream's, its own label and key settings."""

    dataset: str
    weight: float
    label_json_key: str | None = None
    image_feature: str | None = None
    label_feature: str | None = None
    key_feature: str | None = None
    label_offset: int = 0


SourceSpec = Union[Source, tuple[str, float]]


def stream_request(
    target: str,
    stream: StreamOptions,
    *,
    dataset: str | None,
    sources: Sequence[SourceSpec] | None,
    seed: int,
    epoch: int,
    rank: int | None,
    world_size: int | None,
    batch_size: int,
    image_size: ImageSize | None,
    start_batch: int,
    resume_from: EpochPosition | None,
    augment: AugmentSpec,
    views: Views | None = None,
) -> Any:
    """The request ``Client.batches`` sends to ``target`` (see there)."""
    transport = stream.transport
    if transport == "auto":
        transport = "shared_memory" if _shm.socket_path(target) else "inline"
    if rank is None or world_size is None:
        default_rank, default_world = distributed_rank_and_world()
        rank = default_rank if rank is None else rank
        world_size = default_world if world_size is None else world_size
    if views is not None:
        _check_views(views, stream, image_size, augment)
    image_size = resolve_image_size(image_size, augment)
    height, width = (0, 0) if views is not None else _image_size(image_size)
    if (dataset is None) == (sources is None):
        raise ValueError("pass dataset or sources, one of them")
    request = pb.StreamBatchesRequest(
        dataset=dataset or "",
        seed=seed,
        epoch=epoch,
        rank=rank,
        world_size=world_size,
        batch_size=batch_size,
        height=height,
        width=width,
        start_batch=start_batch,
        shuffle=stream.shuffle.enabled,
        partition=_PARTITIONS[stream.partition],
        resize=_RESIZE[stream.resize],
        views=views.to_messages() if views is not None else [],
        shuffle_buffer=stream.shuffle.buffer,
        interleave=stream.shuffle.interleave,
        transport=_TRANSPORTS[transport],
        layout=stream.layout.to_message(),
        repeats=stream.repeats,
    )
    augmentation = None if views is not None else _augment(augment, image_size)
    if augmentation is not None:
        request.augmentation.CopyFrom(augmentation.to_message())
    if stream.decoded_source is not None:
        # Present even at 0 (no tier, whatever the server's default).
        request.decoded_source.SetInParent()
        request.decoded_source.shorter_side = stream.decoded_source
        if stream.decoded_source_from_epoch is not None:
            request.decoded_source.stored_from_epoch = stream.decoded_source_from_epoch
    stream.delivery.apply(request)
    if sources is not None:
        request.sources.extend(_source_message(source) for source in sources)
        request.weight_changes.extend(
            pb.WeightChange(from_step=step, weights=list(weights))
            for step, weights in stream.mix.weight_changes
        )
        if stream.mix.weights_from is not None:
            request.weights_from_step = stream.mix.weights_from
    if resume_from is not None:
        resume_from.to_message(request.resume_from)
    return request


def _check_views(
    views: Views, stream: StreamOptions, image_size: ImageSize | None, augment: AugmentSpec
) -> None:
    """What a stream of views cannot be asked with, refused by name."""
    conflicts = {
        "augment": augment is not None,
        "image_size": image_size is not None,
        "resize": stream.resize != "center_crop",
    }
    refuse_conflicts(views, conflicts, "each view group names its own size and augmentation")


def _source_message(source: SourceSpec) -> Any:
    if not isinstance(source, Source):
        dataset, weight = source
        return pb.MixSource(dataset=dataset, weight=float(weight))
    message = pb.MixSource(dataset=source.dataset, weight=float(source.weight))
    own = (
        source.label_json_key,
        source.image_feature,
        source.label_feature,
        source.key_feature,
    )
    if any(own) or source.label_offset:
        message.layout.CopyFrom(
            pb.SampleLayout(
                label_json_key=source.label_json_key or "",
                image_feature=source.image_feature or "",
                label_feature=source.label_feature or "",
                key_feature=source.key_feature or "",
                label_offset=source.label_offset,
            )
        )
    return message


def _partition(name: str) -> Any:
    try:
        return _PARTITIONS[name]
    except KeyError:
        raise ValueError(f"partition must be one of {sorted(_PARTITIONS)}, not {name!r}") from None
