"""A small client for the shardfeed gRPC service that yields numpy arrays."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Union

import grpc

from . import _shm
from ._augment import AugmentSpec, ImageSize, _augment, _image_size
from ._options import Partition, StreamOptions, stream_options
from ._proto import shardfeed_pb2 as pb
from ._proto import shardfeed_pb2_grpc as pb_grpc
from ._wire import (
    Batch,
    DatasetInfo,
    EpochPosition,
    ShardfeedError,
    _batch_with_images,
    _error,
    _message_from_wire,
)

# Batches are tens of MB: lift gRPC's 4 MB default and let HTTP/2 flow control
# grow its windows for large messages.
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.http2.bdp_probe", 1),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
]

_SERVICE = pb.DESCRIPTOR.services_by_name["Shardfeed"].full_name
_log = logging.getLogger("shardfeed")

TARGET_ENV = "SHARDFEED_TARGET"
DEFAULT_TARGET = "127.0.0.1:50051"
# A sidecar restart (drain, new pod process, socket back) takes seconds; a
# node going away takes the trainer with it. Two minutes covers the first.
DEFAULT_RECONNECT_TIMEOUT = 120.0
# A target no call has reached yet is given this long to answer before the
# client says it is wrong: long enough for a sidecar restarting beside a
# trainer that starts again, short enough that a typo costs seconds.
DEFAULT_CONNECT_TIMEOUT = 5.0
_RECONNECT_FIRST_DELAY = 0.1
_RECONNECT_MAX_DELAY = 5.0
_HEALTH_SERVING = b"\x08\x01"
# The process that first opened a channel: gRPC's core then runs threads whose
# locks a fork() copies mid-use, so a forked child that opens a channel of its
# own can hang for good (grpc/grpc#31885). Children check it and refuse.
_grpc_started_in: int | None = None
_FORK_SUPPORT_ENV = "GRPC_ENABLE_FORK_SUPPORT"
_PARTITIONS = {"drop_last": pb.PARTITION_DROP_LAST, "pad": pb.PARTITION_PAD}
_RESIZE = {"center_crop": pb.RESIZE_MODE_CENTER_CROP, "stretch": pb.RESIZE_MODE_STRETCH}
_TRANSPORTS = {
    "auto": pb.TRANSPORT_INLINE,
    "inline": pb.TRANSPORT_INLINE,
    "shared_memory": pb.TRANSPORT_SHARED_MEMORY,
}


def _refuse_after_unsafe_fork() -> None:
    """Fails fast, instead of hanging at random, in a process forked after its
    parent started gRPC (a DataLoader worker under the default ``fork``)."""
    if _grpc_started_in is None or _grpc_started_in == os.getpid():
        return
    if os.environ.get(_FORK_SUPPORT_ENV, "").lower() in ("1", "true", "yes"):
        return  # gRPC's own fork handlers were asked for: the user's choice.
    raise RuntimeError(
        f"this process was forked from process {_grpc_started_in} after it had opened a "
        "gRPC channel, and gRPC is not fork-safe: a channel opened here can hang for good. "
        "Give the DataLoader multiprocessing_context='forkserver' (or 'spawn'), or use "
        "num_workers=0 (the sidecar already decodes and batches in parallel)."
    )


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


DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_BATCH_TIMEOUT = 600.0


class _IdleWatchdog:
    """Cancels a stream when the consumer has waited too long for one batch.

    Only time spent waiting for the next batch counts: a training step that
    takes long between two batches never trips it. An epoch may take hours;
    a whole-call deadline would cut it, so streams get this instead.
    """

    def __init__(self, call: Any, limit: float) -> None:
        self._call = call
        self._limit = limit
        self._waiting_since: float | None = None
        self._stopped = threading.Event()
        self.expired = False
        self._thread = threading.Thread(target=self._watch, name="shardfeed-watchdog", daemon=True)
        self._thread.start()

    def waiting(self) -> None:
        self._waiting_since = time.monotonic()

    def received(self) -> None:
        self._waiting_since = None

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        check = min(1.0, self._limit / 4)
        while not self._stopped.wait(check):
            since = self._waiting_since
            if since is not None and time.monotonic() - since > self._limit:
                self.expired = True
                self._call.cancel()
                return


class Client:
    """Connects to one shardfeed server.

    ``target`` defaults to ``$SHARDFEED_TARGET`` (the chart sets it), else
    ``127.0.0.1:50051``. ``call_timeout`` is the deadline, in seconds, of
    each short call (``describe``); ``batch_timeout`` is how long a stream
    may keep the caller waiting for its next batch before it is cancelled
    with ``DEADLINE_EXCEEDED`` (time the caller spends between batches does
    not count, so long epochs and slow steps are fine). ``None`` disables
    either. ``timeout`` is the former name of ``call_timeout``.

    A target that nothing has answered at yet (a typo, no sidecar started)
    fails within ``connect_timeout`` seconds with ``UNAVAILABLE`` naming
    the target and where it came from. Once the server has answered, a
    stream that ends with ``UNAVAILABLE`` (the sidecar draining on
    SIGTERM, restarting, or the connection lost) is reopened with bounded
    exponential backoff and resumed right after the last batch it
    delivered, for up to ``reconnect_timeout`` seconds per outage (``None``
    or 0: fail at once); other codes fail at once.

    The channel is created lazily, once per process: a Client made before a
    DataLoader forks its workers is safe to use in each of them.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
        batch_timeout: float | None = DEFAULT_BATCH_TIMEOUT,
        timeout: float | None = None,
        reconnect_timeout: float | None = DEFAULT_RECONNECT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        for name, value in (
            ("call_timeout", call_timeout),
            ("batch_timeout", batch_timeout),
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, not {value!r}")
        if reconnect_timeout is not None and reconnect_timeout < 0:
            raise ValueError(f"reconnect_timeout must be >= 0 or None, not {reconnect_timeout!r}")
        if target:
            self._target, self._target_source = target, "the target passed"
        elif os.environ.get(TARGET_ENV):
            self._target, self._target_source = os.environ[TARGET_ENV], f"${TARGET_ENV}"
        else:
            self._target = DEFAULT_TARGET
            self._target_source = f"the default: ${TARGET_ENV} is not set"
        self._reconnect_timeout = reconnect_timeout or 0.0
        self._connect_timeout = connect_timeout
        # Whether the server has answered: until it has, UNAVAILABLE more
        # likely means a wrong target than a restart (see _check_reachable).
        self._reached = False
        self._call_timeout = timeout if timeout is not None else call_timeout
        self._batch_timeout = batch_timeout
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._stream_batches: Any = None

    @property
    def target(self) -> str:
        return self._target

    def _get_stub(self) -> Any:
        with self._lock:
            if self._pid != os.getpid() or self._stub is None:
                _refuse_after_unsafe_fork()
                # No authority override over a Unix socket: the server takes
                # the socket path grpcio sends, as any client's.
                options = list(_CHANNEL_OPTIONS)
                self._channel = grpc.insecure_channel(self._target, options=options)
                self._stub = pb_grpc.ShardfeedStub(self._channel)  # type: ignore[no-untyped-call]
                # Batches skip the generated parser: see _split_images.
                self._stream_batches = self._channel.unary_stream(
                    f"/{_SERVICE}/StreamBatches",
                    request_serializer=pb.StreamBatchesRequest.SerializeToString,
                    response_deserializer=_message_from_wire,
                )
                self._pid = os.getpid()
                global _grpc_started_in
                if _grpc_started_in is None:
                    _grpc_started_in = self._pid
            return self._stub

    def close(self) -> None:
        with self._lock:
            if self._channel is not None and self._pid == os.getpid():
                self._channel.close()
            self._channel = None
            self._stub = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "target": self._target,
            "call_timeout": self._call_timeout,
            "batch_timeout": self._batch_timeout,
            "reconnect_timeout": self._reconnect_timeout,
            "connect_timeout": self._connect_timeout,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["target"],
            call_timeout=state["call_timeout"],
            batch_timeout=state["batch_timeout"],
            reconnect_timeout=state.get("reconnect_timeout", DEFAULT_RECONNECT_TIMEOUT),
            connect_timeout=state.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT),
        )

    def _unreachable(self, error: ShardfeedError) -> ShardfeedError:
        """Names the target in an UNAVAILABLE error, and where it came from."""
        if error.code != "UNAVAILABLE" or self._target in error.message:
            return error
        return error.with_message(
            f"{error.message} (target {self._target}, {self._target_source})",
        )

    def _check_reachable(self, error: ShardfeedError) -> None:
        """After ``error`` (UNAVAILABLE) on a target nothing has answered at
        yet: returns if a server answers within ``connect_timeout`` (one
        starting or restarting: the caller waits for it as for any outage),
        else raises, naming the target and ``$SHARDFEED_TARGET``."""
        if self._reached or error.code != "UNAVAILABLE":
            return
        if self._answers(self._connect_timeout):
            self._reached = True
            return
        raise ShardfeedError(
            "UNAVAILABLE",
            f"no shardfeed server answers at {self._target} ({self._target_source}) "
            f"within connect_timeout={self._connect_timeout:g}s: {error.message}. Start one "
            "(shardfeed.serve() on this host, or the chart's sidecar), or point the client "
            f"at it: target=... or ${TARGET_ENV}",
        )

    def _health_check(self) -> Any:
        """gRPC health's Check on this client's channel, bytes in and out:
        ``HealthCheckRequest{service: ""}`` is empty on the wire, and the
        answer ``HealthCheckResponse{status}`` is compared as bytes."""
        self._get_stub()
        assert self._channel is not None
        return self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda service: service,
            response_deserializer=lambda response: response,
        )

    def _answers(self, timeout: float) -> bool:
        """Whether any gRPC server answers the health check at the target
        within ``timeout`` (waiting for a listener to appear meanwhile)."""
        check = self._health_check()
        try:
            check(b"", timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            # Any answer, even UNIMPLEMENTED, came from a server.
            return exc.code() not in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
        return True

    def wait_until_serving(self, timeout: float = 60.0) -> None:
        """Blocks until the server's gRPC health says SERVING.

        A starting server answers NOT_SERVING while it opens its disk cache
        (and refuses requests with UNAVAILABLE); one not yet listening does
        not answer. Raises ``ShardfeedError("DEADLINE_EXCEEDED", ...)``
        naming the target and the last answer after ``timeout`` seconds.
        """
        check = self._health_check()
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            try:
                # HealthCheckRequest{service: ""} is empty on the wire; the
                # answer is HealthCheckResponse{status}, SERVING = 1.
                status = check(b"", timeout=max(0.05, min(1.0, deadline - time.monotonic())))
                if status == _HEALTH_SERVING:
                    return
                last = "NOT_SERVING"
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            if time.monotonic() >= deadline:
                raise ShardfeedError(
                    "DEADLINE_EXCEEDED",
                    f"{self._target} was not SERVING after {timeout:g}s (last: {last})",
                )
            time.sleep(0.05)

    def report_client_decodes(
        self,
        decoded: int,
        failures: Sequence[tuple[str, str, str]] = (),
        *,
        rank: int = 0,
    ) -> None:
        """Tells the server what this process decoded of encoded deliveries:
        ``decoded`` samples, and ``failures`` as (shard, key, reason), each
        substituted here; they enter the server's metrics and log."""
        request = pb.ClientDecodeReport(
            rank=rank,
            decoded=decoded,
            failures=[
                pb.ClientDecodeFailure(shard=shard, key=key, reason=reason)
                for shard, key, reason in failures
            ],
        )
        try:
            self._get_stub().ReportClientDecodes(request, timeout=self._call_timeout)
        except grpc.RpcError as exc:
            raise self._unreachable(_error(exc)) from None

    def describe(
        self,
        dataset: str,
        *,
        world_size: int | None = None,
        batch_size: int = 128,
        partition: Partition = "drop_last",
    ) -> DatasetInfo:
        if world_size is None:
            world_size = distributed_rank_and_world()[1]
        request = pb.DescribeRequest(
            dataset=dataset,
            world_size=world_size,
            batch_size=batch_size,
            partition=_partition(partition),
        )
        reconnect = _Reconnect(self, "Describe")
        while True:
            try:
                response = self._get_stub().Describe(request, timeout=self._call_timeout)
                self._reached = True
                break
            except grpc.RpcError as exc:
                error = _error(exc)
                self._check_reachable(error)
                # A sidecar restarting (its container's restart) is waited
                # for within reconnect_timeout, as a stream's reconnect is.
                reconnect.wait(error)
        return DatasetInfo(
            shards=response.shards,
            samples=response.samples,
            batches_per_rank=response.batches_per_rank,
            dropped_per_epoch=response.dropped_per_epoch,
            padded_per_epoch=response.padded_per_epoch,
            total_bytes=response.total_bytes,
            decoder=response.decoder,
            classes=tuple(response.classes),
        )

    def batches(
        self,
        dataset: str | None = None,
        *,
        sources: Sequence[SourceSpec] | None = None,
        seed: int = 0,
        epoch: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        batch_size: int = 128,
        image_size: ImageSize = 224,
        start_batch: int = 0,
        resume_from: EpochPosition | None = None,
        augment: AugmentSpec = None,
        options: StreamOptions | None = None,
        **keywords: Any,
    ) -> Iterator[Batch]:
        """Streams this rank's batches of one epoch, in order.

        ``augment``: ``"train"`` (RandomResizedCrop + flip), ``"eval"``
        (Resize(256) + CenterCrop(224), scaled to ``image_size``), an
        :class:`Augment`, or None (``options.resize`` decides: the center
        crop that covers the output, or a stretch).

        ``options``: a :class:`StreamOptions` (shuffle, sample layout,
        delivery, a mix's weight history, partition, resize, transport, the
        decoded-source tier, host pinning); today's flat keywords
        (``shuffle=False``, ``fields=["txt"]``, ``delivery="encoded"``,
        ``server_decode_fraction="auto"``, ...) are applied on top of it. An
        unknown keyword or a bad value raises here, before any request.

        ``transport``: ``"shared_memory"`` has the server decode into memory
        this process maps (over a ``unix:`` target; the server falls back to
        inline elsewhere), ``"inline"`` sends the bytes in the gRPC messages,
        ``"auto"`` picks shared memory on ``unix:`` targets. Shared-memory
        images are read-only views; a batch's slot is reused once every view
        of it is gone, and a consumer holding more than a couple of batches
        gets the later ones as private copies.

        ``fields``: other parts of each sample to return as bytes in
        ``Batch.fields`` (tar member extensions such as ``"txt"``, or TFRecord
        feature names), each at most ``max_field_bytes`` (0: 1 MiB; a larger
        one ends the stream with ``FAILED_PRECONDITION`` naming it).
        ``label_json_key``: take the label from this key of the sample's
        ``.json`` member instead of ``.cls``. ``image_feature`` /
        ``label_feature``: TFRecord feature names (default
        ``image/encoded`` / ``image/class/label``: TensorFlow's ImageNet
        records, whose labels are 1..1000 with 0 for background).
        ``key_feature``: the TFRecord feature naming each sample in
        ``Batch.keys`` (default ``image/filename``; records without it are
        named by record number). ``label_offset``: added to every label (-1
        turns ImageNet's 1..1000 into 0..999); a label below 0 is sent as -1.

        ``sources`` instead of ``dataset`` mixes datasets in one stream:
        ``[("s3://a/", 0.7), ("s3://b/", 0.3)]``, or :class:`Source` items
        for a source's own labels (e.g. its ``label_feature``). Every global
        batch holds each source's share exactly (rounded so that every
        prefix of the stream keeps the weights as closely as integers allow),
        whatever the world size; each batch says each sample's source and
        source-epoch (``Batch.sources``, ``Batch.source_epochs``).
        ``weight_changes``: the stream's earlier weights as ``(from_step,
        weights)``, oldest first (global steps: ``epoch * epoch_steps +
        batch``); the sources' weights hold from ``weights_from`` (a global
        step, not after this stream's first batch), else from its first batch.
        A reconnect keeps where they began.

        ``decoded_source=S``: outputs defined from each image brought once to
        a shorter side of ``S`` (64 to 4096) and kept by the server's
        decoded-source tier, so later epochs skip the JPEG decode; the crop
        box is drawn as without it, and the batches are the same bytes
        whether the tier held the source or not. The epochs before
        ``decoded_source_from_epoch`` (default 1) are defined from the
        original, the same bytes as without the tier, and cost what it does:
        the server fills the tier meanwhile on otherwise idle cores. ``0``:
        every epoch from the stored source (a tier filled ahead by
        ``shardfeed warm --decoded``). A server with a tier directory uses
        it for decoded streams that do not say (``--decoded-default-side``,
        320); ``decoded_source=0`` opts out.

        ``delivery="encoded"``: baseline JPEGs arrive compressed, with the
        crop box and flip a decoded delivery would have applied
        (``Batch.encoded``; ``images`` is then empty), for the trainer to
        decode (:class:`shardfeed.decode.BatchDecoder`, on CPU or GPU); the
        other images, and ``server_decode_fraction`` (0 to 1) of each batch,
        arrive as pixels. ``server_decode_fraction="auto"``: the server
        seeks the share at which this client takes batches fastest (times a
        few batches at its share and a step to either side, moves where the
        rate is higher, then probes ever more rarely), starting from
        ``server_decode_start`` (default: 0.5, coarse steps first); each
        batch's ``encoded.server_settled`` is its best share so far, and
        ``encoded.server_search`` where the search stands
        (``server_decode_search=`` goes on from it in a next stream).

        ``host_pinning``: registers each shared-memory ring with a device
        runtime once, when it is mapped (``ShardfeedDataset(device="cuda")``
        passes CUDA's), so copies out of it run asynchronously.
        """
        stream = stream_options(options, **keywords)
        transport = stream.transport
        if transport == "auto":
            transport = "shared_memory" if _shm.socket_path(self._target) else "inline"
        if rank is None or world_size is None:
            default_rank, default_world = distributed_rank_and_world()
            rank = default_rank if rank is None else rank
            world_size = default_world if world_size is None else world_size
        height, width = _image_size(image_size)
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
            shuffle_buffer=stream.shuffle.buffer,
            interleave=stream.shuffle.interleave,
            transport=_TRANSPORTS[transport],
            layout=stream.layout.to_message(),
        )
        augmentation = _augment(augment, image_size)
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
        return self._stream(request, stream.host_pinning)

    def _stream(
        self, request: Any, host_pinning: _shm.HostPinning | None = None
    ) -> Iterator[Batch]:
        """The stream of ``request``, reopened after ``UNAVAILABLE`` right
        after the last batch delivered (each batch carries its position)."""
        reconnect = _Reconnect(self, "stream")
        delivered = False
        while True:
            try:
                for batch in self._stream_once(request, host_pinning):
                    reconnect.reset()
                    self._reached = delivered = True
                    if request.sources and not request.HasField("weights_from_step"):
                        # The weights began at this first batch: a reconnect
                        # resumes past it and must say so (the plan rounds
                        # each weight span from its own start).
                        done = sum(batches for _, batches in batch.position.segments)
                        request.weights_from_step = batch.epoch * batch.epoch_steps + done - 1
                    yield batch
                    batch.position.to_message(request.resume_from)
                    request.start_batch = 0
                return
            except ShardfeedError as error:
                self._check_reachable(error)
                then = "resuming after the last batch received" if delivered else "retrying"
                reconnect.wait(error, then)

    def _stream_once(
        self, request: Any, host_pinning: _shm.HostPinning | None = None
    ) -> Iterator[Batch]:
        self._get_stub()
        assert self._stream_batches is not None
        call = self._stream_batches(request)
        limit = self._batch_timeout
        watchdog = _IdleWatchdog(call, limit) if limit is not None else None
        rings: dict[bytes, _shm.SharedRing] = {}
        try:
            while True:
                if watchdog is not None:
                    watchdog.waiting()
                try:
                    message, flat = next(call)
                except StopIteration:
                    return
                if watchdog is not None:
                    watchdog.received()
                if message.HasField("shared"):
                    flat = self._shared_images(rings, message.shared, host_pinning)
                yield _batch_with_images(message, flat)
        except grpc.RpcError as exc:
            if watchdog is not None and watchdog.expired:
                raise ShardfeedError(
                    "DEADLINE_EXCEEDED", f"no batch arrived within batch_timeout={limit}s"
                ) from None
            raise _error(exc) from None
        finally:
            if watchdog is not None:
                watchdog.stop()
            # Leaving the loop early cancels the stream, freeing the server's work.
            call.cancel()
            for ring in rings.values():
                ring.close()

    def _shared_images(
        self,
        rings: dict[bytes, _shm.SharedRing],
        shared: Any,
        host_pinning: _shm.HostPinning | None = None,
    ) -> Any:
        path = _shm.socket_path(self._target)
        if path is None:
            raise ShardfeedError(
                "FAILED_PRECONDITION", "the server sent shared memory over a non-Unix target"
            )
        try:
            ring = _shm.attach(rings, path, shared, host_pinning)
        except OSError as exc:
            raise ShardfeedError(
                "UNAVAILABLE",
                f"cannot map the server's shared memory through {path}.fds: {exc}; "
                "use transport='inline'",
            ) from None
        # Holding more batches than the ring allows would stall the stream:
        # later ones are copied out and their slots returned at once.
        return ring.view(
            shared.slot, shared.offset, shared.length, copy=ring.held >= shared.holdable
        )


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


class _Reconnect:
    """Waits out an ``UNAVAILABLE`` server (a sidecar restarting) with
    exponential backoff, within the client's ``reconnect_timeout`` from the
    outage's start; other errors, and an outage past the budget, raise."""

    def __init__(self, client: Client, what: str) -> None:
        self._client = client
        self._what = what
        self.reset()

    def reset(self) -> None:
        self._started: float | None = None
        self._delay = _RECONNECT_FIRST_DELAY

    def wait(self, error: ShardfeedError, then: str = "retrying") -> None:
        client = self._client
        if error.code != "UNAVAILABLE" or not client._reconnect_timeout:
            raise client._unreachable(error) from None
        now = time.monotonic()
        self._started = now if self._started is None else self._started
        left = self._started + client._reconnect_timeout - now
        if left <= 0:
            raise error.with_message(
                f"{error.message}; gave up reconnecting to {client._target} after "
                f"{client._reconnect_timeout:g}s (reconnect_timeout)",
            ) from None
        # The server's advice (RetryInfo) when it says to wait longer.
        wait = min(max(self._delay, error.retry_delay or 0.0), left)
        _log.warning(
            "%s from %s ended with UNAVAILABLE (%s); reconnecting in %.1fs and %s",
            self._what,
            client._target,
            error.message,
            wait,
            then,
        )
        time.sleep(wait)
        self._delay = min(self._delay * 2, _RECONNECT_MAX_DELAY)


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
