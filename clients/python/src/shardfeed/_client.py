"""A small client for the shardfeed gRPC service that yields numpy arrays."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from ._augment import AugmentSpec, ImageSize
from ._channel import DEFAULT_CONNECT_TIMEOUT, Channel
from ._options import Partition, StreamOptions, stream_options
from ._proto import shardfeed_pb2 as pb
from ._request import (
    Source,
    SourceSpec,
    _partition,
    distributed_rank_and_world,
    stream_request,
)
from ._stream import Reconnect, stream
from ._views import Views
from ._wire import Batch, DatasetInfo, EpochPosition, _error

__all__ = [
    "DEFAULT_BATCH_TIMEOUT",
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_RECONNECT_TIMEOUT",
    "Client",
    "Source",
    "SourceSpec",
    "distributed_rank_and_world",
]

DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_BATCH_TIMEOUT = 600.0
# A sidecar restart (drain, new pod process, socket back) takes seconds; a
# node going away takes the trainer with it. Two minutes covers the first.
DEFAULT_RECONNECT_TIMEOUT = 120.0


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
        self._channel = Channel(target, connect_timeout)
        self._reconnect_timeout = reconnect_timeout or 0.0
        self._call_timeout = timeout if timeout is not None else call_timeout
        self._batch_timeout = batch_timeout

    @property
    def target(self) -> str:
        return self._channel.target

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "target": self._channel.target,
            "call_timeout": self._call_timeout,
            "batch_timeout": self._batch_timeout,
            "reconnect_timeout": self._reconnect_timeout,
            "connect_timeout": self._channel.connect_timeout,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["target"],
            call_timeout=state["call_timeout"],
            batch_timeout=state["batch_timeout"],
            reconnect_timeout=state.get("reconnect_timeout", DEFAULT_RECONNECT_TIMEOUT),
            connect_timeout=state.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT),
        )

    def wait_until_serving(self, timeout: float = 60.0) -> None:
        """Blocks until the server's gRPC health says SERVING.

        A starting server answers NOT_SERVING while it opens its disk cache
        (and refuses requests with UNAVAILABLE); one not yet listening does
        not answer. Raises ``ShardfeedError("DEADLINE_EXCEEDED", ...)``
        naming the target and the last answer after ``timeout`` seconds.
        """
        self._channel.wait_until_serving(timeout)

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
            self._channel.stub().ReportClientDecodes(request, timeout=self._call_timeout)
        except grpc.RpcError as exc:
            raise self._channel.unreachable(_error(exc)) from None

    def report_loop_waits(self, loop_id: int, waited: float, stepped: float, steps: int) -> None:
        """Tells a tuned stream's share search how its training loop fares:
        ``waited`` and ``stepped`` seconds since the loop began (its waits
        for batches, and its ``steps``: work and wait), running totals, sent
        to the stream's ``ShareSearch.loop_id``. With the loop not waiting,
        the search raises the server's share while the loop stays fed; the
        steps a second are the rate it times otherwise."""
        waits = pb.LoopWaits(
            loop_id=loop_id, waited_seconds=waited, stepped_seconds=stepped, steps=steps
        )
        request = pb.ClientDecodeReport(loop_waits=waits)
        try:
            self._channel.stub().ReportClientDecodes(request, timeout=self._call_timeout)
        except grpc.RpcError as exc:
            raise self._channel.unreachable(_error(exc)) from None

    def describe(
        self,
        dataset: str,
        *,
        world_size: int | None = None,
        batch_size: int = 128,
        partition: Partition = "drop_last",
        repeats: int = 1,
    ) -> DatasetInfo:
        """The dataset's size and its epoch's counts for a stream of this
        world size, batch size, partition and ``repeats``."""
        if world_size is None:
            world_size = distributed_rank_and_world()[1]
        request = pb.DescribeRequest(
            dataset=dataset,
            world_size=world_size,
            batch_size=batch_size,
            partition=_partition(partition),
            repeats=repeats,
        )
        reconnect = Reconnect(self._channel, self._reconnect_timeout, "Describe")
        while True:
            try:
                response = self._channel.stub().Describe(request, timeout=self._call_timeout)
                self._channel.reached = True
                break
            except grpc.RpcError as exc:
                error = _error(exc)
                self._channel.check_reachable(error)
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
        image_size: ImageSize | None = None,
        start_batch: int = 0,
        resume_from: EpochPosition | None = None,
        augment: AugmentSpec = None,
        views: Views | None = None,
        options: StreamOptions | None = None,
        **keywords: Any,
    ) -> Iterator[Batch]:
        """Streams this rank's batches of one epoch, in order.

        ``augment``: ``"train"`` (RandomResizedCrop + flip), ``"eval"``
        (Resize(256) + CenterCrop(224), scaled to ``image_size``), an
        :class:`Augment`, or None (``options.resize`` decides: the center
        crop that covers the output, or a stretch). ``image_size`` (None:
        the size an ``augment`` from :func:`from_torchvision` makes, else
        224) is the output's side or ``(height, width)``; one that differs
        from the converted transform's is a ``ValueError``.

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
        records, whose labels are 1..1000 with 0 for background), or
        Parquet column names (default ``image`` / ``label``, as the Hugging
        Face Hub stores image datasets).
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

        ``repeats=k`` (repeated augmentation, as the DeiT and torchvision
        recipes' ``--ra-reps``): every sample ``k`` times an epoch, each copy
        with crops and ops of its own (``Batch.copies`` says which copy a
        sample is), a sample's copies on ``k`` different ranks when
        ``world_size >= k``. The epoch is ``k`` passes over the data (where
        torchvision's ``RASampler`` keeps one pass's length: see
        docs/AUGMENTATION.md). Resume and elastic resume stay exact.

        ``views``: several views of each sample, decoded once (DINO's global
        and local crops, SimCLR's two views), from :func:`views_from_torchvision`
        or :func:`views`, in place of ``augment`` and ``image_size``: each
        batch's ``views[g]`` is group ``g``'s ``[views × batch, H, W, 3]``
        array, view-major (``views[g].view(v)`` is view ``v`` of every
        sample), with each row's box and ops. Each view draws from its own
        key (seed, epoch, sample, copy, group, view), so views are
        independent of each other and of the world size and resume point.
        From the original image (not with ``decoded_source``). With
        ``delivery="encoded"``, a sample the trainer decodes arrives once,
        compressed, with every view's box and decisions:
        :class:`shardfeed.decode.BatchDecoder` decodes it once and makes
        every view (until then its rows in ``views[g]`` are not pixels).
        """
        settings = stream_options(options, **keywords)
        request = stream_request(
            self._channel.target,
            settings,
            dataset=dataset,
            sources=sources,
            seed=seed,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            batch_size=batch_size,
            image_size=image_size,
            start_batch=start_batch,
            resume_from=resume_from,
            augment=augment,
            views=views,
        )
        return stream(
            self._channel,
            request,
            batch_timeout=self._batch_timeout,
            reconnect_timeout=self._reconnect_timeout,
            host_pinning=settings.host_pinning,
        )
