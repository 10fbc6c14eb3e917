"""A stream's options beyond its dataset and place in the epoch, grouped in
typed objects that check themselves when made: ``Client.batches`` and
``ShardfeedDataset`` take them (or today's flat keywords, mapped here), so a
misspelt or ill-valued option fails where it is written, not when the
stream is first iterated."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args

from ._modes import DELIVERY_VALUES, DeliveryMode
from ._ops import CLIENT_OPS, CLIENT_RESIZES
from ._proto import shardfeed_pb2 as pb
from ._shm import HostPinning
from ._wire import ShareSearch

Partition = Literal["drop_last", "pad"]
# The server's bound on copies of each sample an epoch (plan::MAX_REPEATS).
MAX_REPEATS = 16
Resize = Literal["center_crop", "stretch"]
Transport = Literal["auto", "inline", "shared_memory"]
ServerFraction = Union[float, Literal["auto"], None]


def _check_choice(name: str, value: Any, allowed: Any) -> None:
    choices = get_args(allowed)
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, not {value!r}")


@dataclass(frozen=True)
class Shuffle:
    """Whether and how widely samples are shuffled (0: the server's default)."""

    enabled: bool = True
    buffer: int = 0
    interleave: int = 0

    def __post_init__(self) -> None:
        for name in ("buffer", "interleave"):
            if getattr(self, name) < 0:
                raise ValueError(f"shuffle {name} must be >= 0, not {getattr(self, name)}")


@dataclass(frozen=True)
class SampleLayout:
    """What else each sample brings, and where its label and key are.

    ``fields``: other parts of each sample as bytes in ``Batch.fields`` (tar
    member extensions such as ``"txt"``, TFRecord feature names, or Parquet
    columns such as ``"image.path"``), each at most ``max_field_bytes`` (0:
    1 MiB). ``label_json_key``: the label from this key of the ``.json``
    member instead of ``.cls``. ``image_feature``, ``label_feature``,
    ``key_feature``: TFRecord feature names; ``image_feature`` and
    ``label_feature`` are also Parquet column names (default ``image`` and
    ``label``, the Hugging Face layout).
    ``label_offset``: added to every label (a label below 0 is sent as -1).
    """

    fields: tuple[str, ...] = ()
    label_json_key: str | None = None
    image_feature: str | None = None
    label_feature: str | None = None
    key_feature: str | None = None
    label_offset: int = 0
    max_field_bytes: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.fields, str):
            raise TypeError(f"fields is a sequence of names, not the string {self.fields!r}")
        object.__setattr__(self, "fields", tuple(self.fields))

    def to_message(self) -> Any:
        return pb.SampleLayout(
            fields=list(self.fields),
            label_json_key=self.label_json_key or "",
            image_feature=self.image_feature or "",
            label_feature=self.label_feature or "",
            key_feature=self.key_feature or "",
            label_offset=self.label_offset,
            max_field_bytes=self.max_field_bytes,
        )


@dataclass(frozen=True)
class Delivery:
    """How images arrive: decoded pixels, or (``"encoded"``) baseline JPEGs
    for the trainer to decode, ``server_fraction`` (0 to 1) of each batch
    decoded by the server; ``"auto"`` seeks the share at which the client
    takes batches fastest, from ``server_start`` (None: the middle), or
    going on with ``server_search`` (a search an earlier stream left)."""

    mode: DeliveryMode = "decoded"
    server_fraction: ServerFraction = None
    server_start: float | None = None
    server_search: ShareSearch | None = None

    def __post_init__(self) -> None:
        _check_choice("delivery", self.mode, DeliveryMode)
        if isinstance(self.server_fraction, str) and self.server_fraction != "auto":
            raise ValueError(
                f'server_decode_fraction is a number or "auto", not {self.server_fraction!r}'
            )
        if self.server_start is not None and self.server_fraction != "auto":
            raise ValueError('server_decode_start is for server_decode_fraction="auto"')
        if self.server_search is not None and self.server_fraction != "auto":
            raise ValueError('server_decode_search is for server_decode_fraction="auto"')

    @property
    def tuned(self) -> bool:
        return self.server_fraction == "auto"

    def apply(self, request: Any) -> None:
        request.delivery = DELIVERY_VALUES[self.mode]
        if self.mode == "encoded":
            # BatchDecoder applies every op the server reports; a decoder of
            # one's own applies `Batch.ops` (torchvision replays them).
            request.client_ops.extend(CLIENT_OPS + CLIENT_RESIZES)
        if self.tuned:
            request.tune_server_decode = True
            if self.server_start is not None:
                request.server_decode_fraction = self.server_start
            if self.server_search is not None:
                search = request.server_decode_search
                search.center = self.server_search.center
                search.step = self.server_search.step
                search.hold = self.server_search.hold
                search.next_hold = self.server_search.next_hold
                if self.server_search.noise is not None:
                    search.noise = self.server_search.noise
        elif self.server_fraction is not None:
            request.server_decode_fraction = float(self.server_fraction)


@dataclass(frozen=True)
class MixHistory:
    """A mixed stream's earlier weights, ``(from_step, weights)`` oldest
    first, and the global step its sources' weights began at."""

    weight_changes: tuple[tuple[int, tuple[float, ...]], ...] = ()
    weights_from: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "weight_changes",
            tuple((int(step), tuple(weights)) for step, weights in self.weight_changes),
        )


@dataclass(frozen=True)
class StreamOptions:
    """Every option of a stream beyond its dataset, seed, epoch, rank,
    batch, image size, augmentation and resume position.

    ``transport``: ``"shared_memory"`` (over a ``unix:`` target), ``"inline"``
    or ``"auto"`` (shared memory on ``unix:`` targets). ``decoded_source=S``:
    outputs from each image brought once to a shorter side of ``S`` and kept
    by the server's decoded-source tier, from epoch
    ``decoded_source_from_epoch`` on (``None``: the server's default, 1; the
    epochs before it are the original's bytes while the tier fills in the
    background). ``decoded_source=None`` takes the server's default (a
    server with a tier directory uses it); ``0`` asks for no tier.
    ``host_pinning``: registers each
    shared-memory ring with a device runtime once, when it is mapped.
    ``repeats=k`` (repeated augmentation, 1 to 16): every sample ``k`` times
    an epoch, each copy with decisions of its own (``Batch.copies``).
    """

    shuffle: Shuffle = field(default_factory=Shuffle)
    layout: SampleLayout = field(default_factory=SampleLayout)
    delivery: Delivery = field(default_factory=Delivery)
    mix: MixHistory = field(default_factory=MixHistory)
    partition: Partition = "drop_last"
    resize: Resize = "center_crop"
    transport: Transport = "auto"
    decoded_source: int | None = None
    decoded_source_from_epoch: int | None = None
    host_pinning: HostPinning | None = None
    repeats: int = 1

    def __post_init__(self) -> None:
        _check_choice("partition", self.partition, Partition)
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int):
            raise TypeError(f"repeats is a whole number, not {self.repeats!r}")
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise ValueError(
                f"repeats must be 1 to {MAX_REPEATS} copies of each sample, not {self.repeats}"
            )
        _check_choice("resize", self.resize, Resize)
        _check_choice("transport", self.transport, Transport)
        if self.decoded_source_from_epoch is not None and self.decoded_source_from_epoch < 0:
            raise ValueError(
                f"decoded_source_from_epoch must be >= 0, not {self.decoded_source_from_epoch}"
            )

    @staticmethod
    def keywords() -> tuple[str, ...]:
        """The flat keywords :meth:`with_keywords` takes."""
        return tuple(_KEYWORDS)

    def with_keywords(self, **keywords: Any) -> StreamOptions:
        """These options with today's flat keywords applied (``shuffle=False``,
        ``shuffle_buffer=``, ``fields=``, ``delivery="encoded"``,
        ``server_decode_fraction=``, ...); an unknown keyword is a
        ``TypeError`` naming it."""
        unknown = sorted(set(keywords) - _KEYWORDS.keys())
        if unknown:
            raise unknown_keywords(unknown, _KEYWORDS)
        groups: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for keyword, value in keywords.items():
            group, name = _KEYWORDS[keyword]
            if group is None and isinstance(value, _GROUP_TYPES.get(name, ())):
                top[name] = value
            elif group is None and name == "shuffle":
                groups.setdefault("shuffle", {})["enabled"] = value
            elif group is None and name == "delivery":
                groups.setdefault("delivery", {})["mode"] = value
            elif group is None:
                top[name] = value
            else:
                groups.setdefault(group, {})[name] = value
        for group, values in groups.items():
            top[group] = dataclasses.replace(top.get(group, getattr(self, group)), **values)
        return dataclasses.replace(self, **top)


# Flat keyword -> (group, field); a group of None is a field of StreamOptions.
_KEYWORDS: dict[str, tuple[str | None, str]] = {
    "shuffle": (None, "shuffle"),
    "shuffle_buffer": ("shuffle", "buffer"),
    "interleave": ("shuffle", "interleave"),
    "fields": ("layout", "fields"),
    "label_json_key": ("layout", "label_json_key"),
    "image_feature": ("layout", "image_feature"),
    "label_feature": ("layout", "label_feature"),
    "key_feature": ("layout", "key_feature"),
    "label_offset": ("layout", "label_offset"),
    "max_field_bytes": ("layout", "max_field_bytes"),
    "delivery": (None, "delivery"),
    "server_decode_fraction": ("delivery", "server_fraction"),
    "server_decode_start": ("delivery", "server_start"),
    "server_decode_search": ("delivery", "server_search"),
    "weight_changes": ("mix", "weight_changes"),
    "weights_from": ("mix", "weights_from"),
    "mix": (None, "mix"),
    "partition": (None, "partition"),
    "resize": (None, "resize"),
    "transport": (None, "transport"),
    "decoded_source": (None, "decoded_source"),
    "decoded_source_from_epoch": (None, "decoded_source_from_epoch"),
    "host_pinning": (None, "host_pinning"),
    "repeats": (None, "repeats"),
}

# A keyword naming a whole group takes the group's object too.
_GROUP_TYPES: dict[str, Any] = {
    "shuffle": Shuffle,
    "layout": SampleLayout,
    "delivery": Delivery,
    "mix": MixHistory,
}


def unknown_keywords(
    unknown: Iterable[str], known: Iterable[str], *, what: str = "stream option"
) -> TypeError:
    """The error for misspelt keywords: each with its closest known names,
    then every known one."""
    known = sorted(known)
    names = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, known, n=2, cutoff=0.7)
        names.append(f"{name} (did you mean {' or '.join(close)}?)" if close else name)
    plural = "s" if len(names) > 1 else ""
    return TypeError(f"unknown {what}{plural} {', '.join(names)}; known: {', '.join(known)}")


def stream_options(options: StreamOptions | None = None, **keywords: Any) -> StreamOptions:
    """``options`` (default: all defaults) with ``keywords`` applied."""
    return (options or StreamOptions()).with_keywords(**keywords)


__all__ = [
    "Delivery",
    "MixHistory",
    "SampleLayout",
    "Shuffle",
    "StreamOptions",
    "stream_options",
    "unknown_keywords",
]
