"""``ShardfeedDataset``'s arguments checked when it is made, so that a
misspelt or ill-valued one fails there, not at the first iteration (in a
DataLoader worker)."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import torch

from .._client import Source, SourceSpec
from .._options import StreamOptions, unknown_keywords

Layout = Literal["NHWC", "NCHW"]
Decode = Literal["server", "client", "gpu"]
Output = Literal["tuple", "dict"]
_LAYOUTS = ("NHWC", "NCHW")
_DECODES = ("server", "client", "gpu")
_OUTPUTS = ("tuple", "dict")

# ShardfeedDataset's own keywords, for the list a misspelt one gets.
_OWN_KEYWORDS = (
    "dataset sources target client batch_size image_size seed augment layout output rank "
    "world_size dp_rank dp_size device_mesh partition decode device"
).split()


class Checked(NamedTuple):
    """What the arguments come to: the stream's options, the device, and the
    data-parallel rank and world size given (None: found when iterating)."""

    options: StreamOptions
    device: torch.device | None
    rank: int | None
    world_size: int | None


def check_arguments(
    *,
    dataset: str | None,
    sources: Any,
    target: str | None,
    client: Any,
    batch_size: int,
    layout: str,
    output: str,
    rank: int | None,
    world_size: int | None,
    dp_rank: int | None,
    dp_size: int | None,
    device_mesh: Any,
    decode: str,
    device: str | torch.device | None,
    options: dict[str, Any],
) -> Checked:
    """Raises ``ValueError`` (``TypeError`` for an unknown option, naming
    the known ones) for arguments the dataset cannot stream with."""
    if decode not in _DECODES:
        raise ValueError(f"decode must be one of {_DECODES}, not {decode!r}")
    if decode != "server" and "delivery" in options:
        raise ValueError(f"decode={decode!r} sets delivery itself")
    try:
        stream_options = StreamOptions().with_keywords(**options)
    except TypeError as error:
        unknown = [name for name in options if name not in StreamOptions.keywords()]
        if not unknown:
            raise
        known = set(StreamOptions.keywords()) | set(_OWN_KEYWORDS)
        raise unknown_keywords(unknown, known, what="option") from error
    if decode == "gpu":
        device = torch.device("cuda" if device is None else device)
        if device.type != "cuda":
            raise ValueError(f'decode="gpu" decodes on a CUDA device, not {device}')
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, not {layout!r}")
    if output not in _OUTPUTS:
        raise ValueError(f"output must be one of {_OUTPUTS}, not {output!r}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, not {batch_size}")
    if (dataset is None) == (sources is None):
        raise ValueError("pass dataset or sources, one of them")
    if client is not None and target is not None:
        raise ValueError("pass target or client, not both")
    given = [
        name
        for name, values in (
            ("rank/world_size", (rank, world_size)),
            ("dp_rank/dp_size", (dp_rank, dp_size)),
            ("device_mesh", (device_mesh,)),
        )
        if any(value is not None for value in values)
    ]
    if len(given) > 1:
        raise ValueError(f"pass one of {' or '.join(given)}, not several")
    if dp_rank is not None or dp_size is not None:
        rank, world_size = dp_rank, dp_size
    if device_mesh is not None and getattr(device_mesh, "ndim", 1) != 1:
        raise ValueError(
            f"device_mesh has {device_mesh.ndim} dimensions: pass its data-parallel "
            'sub-mesh (e.g. mesh["dp"]), whose ranks split the data'
        )
    return Checked(
        stream_options, None if device is None else torch.device(device), rank, world_size
    )


def as_source(source: SourceSpec) -> Source:
    if isinstance(source, Source):
        return source
    dataset, weight = source
    return Source(dataset, float(weight))
