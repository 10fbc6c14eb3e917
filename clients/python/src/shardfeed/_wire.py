"""What the server sends back, as Python values: batches (decoded from the
wire without copying their images), positions, and errors with their
rich-status details."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError

from ._ops import SampleOps, batch_ops
from ._proto import rpc_status_pb2 as rpc
from ._proto import shardfeed_pb2 as pb

_log = logging.getLogger("shardfeed")


class ShardfeedError(Exception):
    """Any error from the server: the gRPC status code name and its message.

    Where the server detailed the status (gRPC's rich error model, see
    proto/shardfeed/v1/rpc_status.proto): ``reason`` (``SERVER_DRAINING``,
    ``SERVER_STARTING``, ``STREAM_FAILED``), ``metadata`` (a stream that ended
    early: ``start_batch``, ``epoch``, ``dataset``, ``position``) and
    ``retry_delay`` in seconds, the server's advice on when to retry.
    An ``INVALID_ARGUMENT`` error names the request ``field`` it refuses (a
    path such as ``layout.fields`` or ``sources[1].weight``; ``""`` when
    none is named).
    """

    def __init__(
        self,
        code: str,
        message: str,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
        retry_delay: float | None = None,
        field: str = "",
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.retry_delay = retry_delay
        self.field = field

    def with_message(self, message: str) -> ShardfeedError:
        """The same error (code and details) saying more."""
        return ShardfeedError(
            self.code, message, self.reason, self.metadata, self.retry_delay, self.field
        )

    def resume_position(self) -> EpochPosition | None:
        """Where the stream that ended with this error goes on (``resume_from``)."""
        if "position" not in self.metadata:
            return None
        return EpochPosition(
            _segments(self.metadata["position"]),
            self.metadata.get("dataset", ""),
            _segments(self.metadata.get("before_epoch", "")),
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable, so DataLoader workers can pass it to the main process.
        return (
            ShardfeedError,
            (self.code, self.message, self.reason, self.metadata, self.retry_delay, self.field),
        )


def _segments(text: str) -> tuple[tuple[int, int], ...]:
    """``world_size:batches`` segments joined by commas, as the server's
    ``ErrorInfo`` metadata writes them."""
    return tuple(
        (int(world), int(batches))
        for world, batches in (part.split(":") for part in text.split(",") if part)
    )


_DETAILS_TRAILER = "grpc-status-details-bin"
_ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
_RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo"
_BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"


@dataclass
class _Details:
    reason: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    retry_delay: float | None = None
    field_path: str = ""


def _error(exc: grpc.RpcError) -> ShardfeedError:
    code = exc.code() if hasattr(exc, "code") else None
    message = exc.details() if hasattr(exc, "details") else str(exc)
    details = _status_details(exc)
    return ShardfeedError(
        code.name if code is not None else "UNKNOWN",
        message or "",
        details.reason,
        details.metadata,
        details.retry_delay,
        details.field_path,
    )


def _status_details(exc: grpc.RpcError) -> _Details:
    """The ErrorInfo, RetryInfo and BadRequest of a status's details trailer, if sent."""
    found = _Details()
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailers or ():
        if key != _DETAILS_TRAILER or not isinstance(value, bytes):
            continue
        try:
            status = rpc.Status.FromString(value)
            for detail in status.details:
                if detail.type_url == _ERROR_INFO_TYPE:
                    info = rpc.ErrorInfo.FromString(detail.value)
                    found.reason, found.metadata = info.reason, dict(info.metadata)
                elif detail.type_url == _RETRY_INFO_TYPE:
                    delay = rpc.RetryInfo.FromString(detail.value).retry_delay
                    found.retry_delay = delay.seconds + delay.nanos / 1e9
                elif detail.type_url == _BAD_REQUEST_TYPE:
                    violations = rpc.BadRequest.FromString(detail.value).field_violations
                    if violations:
                        found.field_path = violations[0].field
        except DecodeError:
            _log.warning("ignored undecodable status details from the server")
    return found


@dataclass(frozen=True)
class DatasetInfo:
    shards: int
    samples: int
    batches_per_rank: int
    dropped_per_epoch: int
    padded_per_epoch: int
    total_bytes: int
    # What decodes JPEGs on the server.
    decoder: str = ""
    # Label i's name is classes[i] (as torchvision's ImageFolder.classes):
    # a packed folder's class directories; empty where labels have no names.
    classes: tuple[str, ...] = ()

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Each class name's label, as ImageFolder's ``class_to_idx``."""
        return {name: label for label, name in enumerate(self.classes)}


@dataclass(frozen=True)
class EpochPosition:
    """Where an epoch stands, valid at any world size with the same global batch.

    Each segment is ``(world_size, batches)``: batches every rank completed at
    that world size. ``dataset`` names the dataset index the position was
    taken on; the server refuses to resume it on another (a loose listing
    that changed between starts). Pass it back as ``resume_from`` after a
    restart.

    A mixed stream's position also has ``before_epoch``: the world sizes the
    stream ran at before this epoch, from its first step (its sources'
    epochs run across the stream's).
    """

    segments: tuple[tuple[int, int], ...] = ()
    dataset: str = ""
    before_epoch: tuple[tuple[int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "segments": [list(s) for s in self.segments],
            "dataset": self.dataset,
        }
        if self.before_epoch:
            value["before_epoch"] = [list(s) for s in self.before_epoch]
        return value

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> EpochPosition:
        segments = tuple((int(w), int(b)) for w, b in value["segments"])
        before = tuple((int(w), int(b)) for w, b in value.get("before_epoch", ()))
        return cls(segments, str(value.get("dataset", "")), before)

    def next_epoch(self) -> EpochPosition:
        """The start of the next epoch, for a mixed stream's history."""
        return EpochPosition((), "", _merged(self.before_epoch + self.segments))

    def to_message(self, message: Any) -> None:
        """Fills a ``shardfeed.v1.EpochPosition`` message."""
        message.Clear()
        for target, segments in (
            (message.segments, self.segments),
            (message.before_epoch, self.before_epoch),
        ):
            target.extend(pb.PositionSegment(world_size=w, batches=b) for w, b in segments)
        message.dataset = self.dataset


def _merged(segments: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Neighbours of equal world size merged, empty ones dropped."""
    out: list[tuple[int, int]] = []
    for world, batches in segments:
        if batches == 0:
            continue
        if out and out[-1][0] == world:
            out[-1] = (world, out[-1][1] + batches)
        else:
            out.append((world, batches))
    return tuple(out)


@dataclass(frozen=True)
class ViewImages:
    """One view group of a batch (``views=``): ``images`` is ``[views ×
    batch, H, W, 3]`` ``uint8``, view-major, as DINO's collate stacks its
    crops: rows ``v*B:(v+1)*B`` are view ``v`` of every sample
    (:meth:`view`), so the group goes to its forward pass whole."""

    images: npt.NDArray[np.uint8]
    # Views of each sample in the group.
    count: int
    # Per row, as ``images``: the source-pixel box (left, top, width,
    # height), shape (rows, 4), and whether it was mirrored, shape (rows,).
    crop_boxes: npt.NDArray[np.float32]
    flipped: npt.NDArray[np.bool_]
    # The wire's per-row decisions and each view's augmentation.
    decisions: tuple[Any, Any] = field(default=((), ()), repr=False, compare=False)

    @property
    def batch(self) -> int:
        """Samples in the batch."""
        return len(self.images) // max(self.count, 1)

    def view(self, index: int) -> npt.NDArray[np.uint8]:
        """View ``index`` of every sample, ``[batch, H, W, 3]`` (no copy)."""
        if not 0 <= index < self.count:
            raise IndexError(f"view {index} of a group of {self.count}")
        return self.images[index * self.batch : (index + 1) * self.batch]

    @property
    def ops(self) -> list[SampleOps]:
        """Per row (as ``images``), the ops the server ran after the view's
        crop, as ``Batch.ops`` gives them (``shardfeed.replay`` replays
        one)."""
        crops, augmentations = self.decisions
        batch = self.batch
        return [
            op
            for view, augmentation in enumerate(augmentations)
            for op in batch_ops(crops[view * batch : (view + 1) * batch], augmentation)
        ]


@dataclass(frozen=True)
class Batch:
    epoch: int
    index: int
    images: npt.NDArray[np.uint8]
    labels: npt.NDArray[np.int64]
    keys: list[str]
    shards: list[str]
    substituted: list[int]
    substitution_reasons: list[str]
    # Parallel to `substituted`: the slot whose image and label were copied
    # into it, or -1 when no sample of the batch decoded (zeros, label -1).
    substitute_sources: list[int]
    position: EpochPosition
    global_samples: int
    # Per sample: the source-pixel box (left, top, width, height) its image
    # was resized from, shape (n, 4), and whether it was mirrored, shape (n,).
    crop_boxes: npt.NDArray[np.float32]
    flipped: npt.NDArray[np.bool_]
    # Whether the images came through shared memory (a view of the server's
    # slot, or a private copy of it when more batches are held than the ring
    # allows) rather than inline in the gRPC message.
    shared: bool = False
    # The request's `fields`, by name: one value per sample (a substituted
    # sample carries its source's), None where the sample has no such field.
    fields: dict[str, list[bytes | None]] = field(default_factory=dict)
    # Slots holding a repeat that pads the epoch (partition="pad"): leave
    # them out of evaluation metrics to count each sample once.
    padded: list[int] = field(default_factory=list)
    # Steps in the epoch (batches per rank from its start, at any world size
    # with this global batch): the epoch is complete once `position` adds up
    # to it. 0 from a server older than the field.
    epoch_steps: int = 0
    # Mixed streams, per sample: the index of the source (in `sources`) it
    # came from, and that source's epoch. Empty for one dataset.
    sources: list[int] = field(default_factory=list)
    source_epochs: list[int] = field(default_factory=list)
    # delivery="encoded": the batch's bytes and where each sample is in
    # them (then `images` is empty, shape (0, H, W, C)); decode them with
    # `shardfeed.decode.BatchDecoder`. None for decoded batches.
    encoded: EncodedImages | None = None
    # repeats=k, per sample: which of its k copies this epoch it is (each
    # copy has decisions of its own). Empty when every sample is copy 0.
    copies: list[int] = field(default_factory=list)
    # The wire's per-sample decisions and the stream's augmentation, which
    # `ops` reads (kept raw: most trainers never ask).
    decisions: tuple[Any, Any] | None = field(default=None, repr=False, compare=False)
    # views=: one per group, in the request's order (then `images` is empty,
    # shape (0, 0, 0, 3), and `crop_boxes` and `ops` hold nothing).
    views: list[ViewImages] = field(default_factory=list)

    @property
    def ops(self) -> list[SampleOps]:
        """Per sample, the ops the server ran after the crop, in the order
        applied, as ``(name, kwargs)`` pairs of
        ``torchvision.transforms.v2.functional``: ``getattr(F, name)(image,
        **kwargs)`` replays each on a CHW ``uint8`` tensor (the same
        request without the ops gives the image they start from)."""
        if self.decisions is None:
            return [[] for _ in self.keys]
        crops, augmentation = self.decisions
        return batch_ops(crops, augmentation)


@dataclass(frozen=True)
class ShareSearch:
    """Where the server's search for its decode share stands (its center is
    the best share so far): a next stream of the same trainer, given it
    (``server_decode_search``), goes on from there instead of holding its
    start afresh."""

    center: float
    step: float
    hold: int
    next_hold: int
    # Where this stream's loop reports its waits (``Client.report_loop_waits``);
    # 0: the server listens for none. Not carried to the next stream.
    loop_id: int = 0
    # The windows' relative noise the search measured (None: not yet).
    noise: float | None = None


@dataclass(frozen=True)
class EncodedImages:
    """An encoded delivery's images: per sample, either its final pixels
    (``decoded``) or its bytes in a client form (``forms``, a
    ``SampleForm`` value: a baseline JPEG for ``delivery="encoded"``) of
    ``source_sizes`` (width, height) to decode, crop to the batch's
    ``crop_boxes``, resize to ``height`` x ``width`` and mirror where
    ``flipped``."""

    data: npt.NDArray[np.uint8]
    offsets: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    decoded: npt.NDArray[np.bool_]
    forms: npt.NDArray[np.int32]
    source_sizes: npt.NDArray[np.int32]
    height: int
    width: int
    channels: int
    # server_decode_fraction="auto": the share the server's search holds
    # best so far, where a next stream starts (``decoded`` may show a probe
    # of a neighbouring share). None for a fixed share, or an older server.
    server_settled: float | None = None
    # The same search's whole state, for the next stream to go on from.
    server_search: ShareSearch | None = None

    def bytes_of(self, slot: int) -> npt.NDArray[np.uint8]:
        """The bytes of one sample (pixels or a JPEG), a view."""
        start = int(self.offsets[slot])
        return self.data[start : start + int(self.lengths[slot])]


_IMAGES_FIELD = pb.Batch.DESCRIPTOR.fields_by_name["images"].number


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint in Batch message")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _split_images(data: bytes) -> tuple[int, int, bytes]:
    """Finds the images field in an encoded Batch without copying it.

    Returns (offset, length) of the image bytes inside ``data`` and the rest
    of the message (a few KB: keys, labels, position) re-encoded without it.
    Parsing the whole message would copy the payload twice (into the parser,
    then into a bytes field): ~20 MB per batch, a tenth of a core at 1,000
    samples/s.
    """
    pos, images, rest = 0, (0, 0), bytearray()
    while pos < len(data):
        start = pos
        tag, pos = _read_varint(data, pos)
        wire_type = tag & 7
        if wire_type == 0:
            _, pos = _read_varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            if tag >> 3 == _IMAGES_FIELD:
                images = (pos, length)
                pos += length
                if pos > len(data):
                    raise ValueError("images field runs past the end of the Batch message")
                continue
            pos += length
        else:
            raise ValueError(f"unsupported wire type {wire_type} in Batch message")
        if pos > len(data):
            raise ValueError("field runs past the end of the Batch message")
        rest += data[start:pos]
    return images[0], images[1], bytes(rest)


def _message_from_wire(data: bytes) -> tuple[Any, npt.NDArray[np.uint8]]:
    """The stream's deserializer: the message without its images, and the
    inline images as a numpy view straight into gRPC's buffer (empty when
    they are in shared memory)."""
    offset, length, rest = _split_images(data)
    message = pb.Batch.FromString(rest)
    return message, np.frombuffer(data, dtype=np.uint8, count=length, offset=offset)


def _batch_from_wire(data: bytes) -> Batch:
    """An inline batch from its encoded message."""
    return _batch_with_images(*_message_from_wire(data))


def _encoded_images(message: Any, flat: npt.NDArray[np.uint8]) -> EncodedImages:
    shape = message.shape
    if len(message.views):
        # A server-decoded sample's range is one view's place: the first
        # of the first group whose views are the largest.
        shape = max(
            (group.shape for group in message.views),
            key=lambda s: s.height * s.width * s.channels,
        )
    table = message.encoded
    offsets = np.array([e.offset for e in table], dtype=np.int64)
    lengths = np.array([e.length for e in table], dtype=np.int64)
    decoded = np.array([e.decoded for e in table], dtype=np.bool_)
    # A server older than the field leaves it unset: its samples are pixels
    # or JPEGs, as `decoded` says.
    forms = np.array(
        [e.form or (pb.SAMPLE_FORM_PIXELS if e.decoded else pb.SAMPLE_FORM_JPEG) for e in table],
        dtype=np.int32,
    )
    pixels = shape.height * shape.width * shape.channels
    if len(table) != len(message.keys) or np.any(offsets + lengths > flat.size):
        raise ValueError(
            f"batch {message.index}: its encoded table does not fit its {flat.size} bytes"
        )
    if np.any(lengths[decoded] != pixels):
        raise ValueError(f"batch {message.index}: a decoded sample is not {pixels} bytes")
    if np.any(decoded != (forms == pb.SAMPLE_FORM_PIXELS)):
        raise ValueError(f"batch {message.index}: a sample's form disagrees with its decoded flag")
    return EncodedImages(
        data=flat,
        offsets=offsets,
        lengths=lengths,
        decoded=decoded,
        forms=forms,
        source_sizes=np.array(
            [(e.source_width, e.source_height) for e in table], dtype=np.int32
        ).reshape(-1, 2),
        height=shape.height,
        width=shape.width,
        channels=shape.channels,
        server_settled=(
            message.server_decode_settled if message.HasField("server_decode_settled") else None
        ),
        server_search=(
            ShareSearch(
                center=message.server_decode_search.center,
                step=message.server_decode_search.step,
                hold=message.server_decode_search.hold,
                next_hold=message.server_decode_search.next_hold,
                loop_id=message.server_decode_search.loop_id,
                noise=(
                    message.server_decode_search.noise
                    if message.server_decode_search.HasField("noise")
                    else None
                ),
            )
            if message.HasField("server_decode_search")
            else None
        ),
    )


def _batch_with_images(message: Any, flat: npt.NDArray[np.uint8]) -> Batch:
    shape = message.shape
    encoded = None
    if len(message.encoded):
        encoded = _encoded_images(message, flat)
    views: list[ViewImages] = []
    if len(message.views):
        # Delivered encoded, the rows of the samples sent compressed are
        # for BatchDecoder to fill.
        views = _view_images(message, flat)
    if encoded is not None or views:
        flat = flat[:0]
    expected = shape.n * shape.height * shape.width * shape.channels
    if encoded is None and not views and flat.size != expected:
        raise ValueError(
            f"batch {message.index}: {flat.size} image bytes for shape "
            f"{shape.n}x{shape.height}x{shape.width}x{shape.channels}"
        )
    # A stream of views has no one size (0x0): its images are the groups'.
    images = flat.reshape(0 if views else -1, shape.height, shape.width, shape.channels)
    return Batch(
        epoch=message.epoch,
        index=message.index,
        images=images,
        labels=np.asarray(message.labels, dtype=np.int64),
        keys=list(message.keys),
        shards=list(message.shards),
        substituted=list(message.substituted),
        substitution_reasons=list(message.substitution_reasons),
        substitute_sources=list(message.substitute_sources),
        position=EpochPosition(
            tuple((s.world_size, s.batches) for s in message.position.segments),
            message.position.dataset,
            tuple((s.world_size, s.batches) for s in message.position.before_epoch),
        ),
        global_samples=message.global_samples,
        crop_boxes=np.array(
            [(c.left, c.top, c.width, c.height) for c in message.crops], dtype=np.float32
        ).reshape(-1, 4),
        flipped=np.array([c.flipped for c in message.crops], dtype=np.bool_),
        shared=message.HasField("shared"),
        fields={values.name: _field_values(values) for values in message.fields},
        padded=list(message.padded),
        epoch_steps=message.epoch_steps,
        sources=list(message.sample_sources),
        source_epochs=list(message.sample_source_epochs),
        encoded=encoded,
        copies=list(message.copies),
        views=views,
        decisions=(
            message.crops,
            message.augmentation if message.HasField("augmentation") else None,
        ),
    )


def _view_images(message: Any, flat: npt.NDArray[np.uint8]) -> list[ViewImages]:
    """Each view group's array: a view of the batch's bytes, no copy."""
    groups = []
    for g, group in enumerate(message.views):
        shape = group.shape
        length = shape.n * shape.height * shape.width * shape.channels
        if group.length != length or group.offset + length > flat.size:
            raise ValueError(
                f"batch {message.index}: view group {g} claims bytes "
                f"{group.offset}..{group.offset + group.length} for shape "
                f"{shape.n}x{shape.height}x{shape.width}x{shape.channels} in {flat.size}"
            )
        count = len(group.augmentations)
        if count == 0 or shape.n % count or len(group.crops) != shape.n:
            raise ValueError(
                f"batch {message.index}: view group {g} has {shape.n} rows, "
                f"{count} views and {len(group.crops)} boxes"
            )
        images = flat[group.offset : group.offset + length]
        groups.append(
            ViewImages(
                images=images.reshape(shape.n, shape.height, shape.width, shape.channels),
                count=count,
                crop_boxes=np.array(
                    [(c.left, c.top, c.width, c.height) for c in group.crops], dtype=np.float32
                ).reshape(-1, 4),
                flipped=np.array([c.flipped for c in group.crops], dtype=np.bool_),
                decisions=(group.crops, list(group.augmentations)),
            )
        )
    return groups


def _field_values(values: Any) -> list[bytes | None]:
    missing = set(values.missing)
    return [None if slot in missing else value for slot, value in enumerate(values.values)]
