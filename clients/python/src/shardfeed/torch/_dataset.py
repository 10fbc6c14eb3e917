"""The ``IterableDataset`` surface of a shardfeed stream (see the package).

Its parts: the arguments checked when it is made (``_arguments``), where it
stands and its checkpoints (``_progress``), a pass: the streams it opens and
its batches handed out (``_pass``), what it yields (``_output``), the
streams' delivery options (``_delivery``), the tensors where training wants
them (``_device``), and its DataLoader (``_loader``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .._augment import AugmentSpec, ImageSize, _augment, resolve_image_size
from .._client import Client, Source, SourceSpec
from .._options import Partition
from .._stats import InputStats, WaitMeter
from .._views import Views, refuse_conflicts
from .._wire import EpochPosition
from ._arguments import Decode, Layout, Output, as_source, check_arguments
from ._delivery import ShareCarry
from ._frameworks import accelerate_dispatch
from ._loader import make_dataloader
from ._model_input import Mixing, ModelInput
from ._output import BatchDict, Sample
from ._pass import Pass, StreamSpec
from ._progress import MAX_FETCH_AHEAD, STATE_VERSION, MixWeights, Progress, check_state
from ._ranks import EpochSteps, rank_and_world, worker_sub_rank

__all__ = ["MAX_FETCH_AHEAD", "BatchDict", "Output", "ShardfeedDataset"]


def _check_views(views: Views, augment: AugmentSpec, image_size: Any, mixing: Any) -> None:
    """What a dataset of views cannot be made with, refused by name."""
    conflicts = {
        "augment": augment is not None,
        "image_size": image_size is not None,
        "mixing": mixing is not None,
    }
    refuse_conflicts(
        views,
        conflicts,
        "each view group names its own size and transforms, and views are not mixed "
        "(MixUp/CutMix pair one image per sample)",
    )


def _layout(layout: Layout | None, augment: AugmentSpec) -> Layout:
    made = getattr(augment, "layout", None)
    if layout is None:
        return made or "NHWC"
    if made is not None and layout != made:
        raise ValueError(
            f"layout={layout!r}, but the transform the augment was converted from makes "
            f"{made} tensors (ToImage without a float dtype); pass neither or the same"
        )
    return layout


class ShardfeedDataset(IterableDataset[Sample]):
    """This rank's batches of one epoch as ``(images, labels)`` tensors.

    ``output="dict"`` yields everything a batch carries instead: ``images``,
    ``labels``, ``keys`` (list of str), ``shards``, ``crop_boxes`` (float32
    ``(N, 4)``: left, top, width, height in source pixels), ``flipped``,
    ``substituted`` and ``padded`` (bool ``(N,)`` masks: a sample replaced
    because it could not be decoded; a repeat that pads the epoch with
    ``partition="pad"``, to leave out of evaluation metrics), ``fields`` (the
    requested extra fields by name, one ``bytes`` or ``None`` per sample),
    ``sources`` and ``source_epochs`` (int64 ``(N,)``: a mixed stream's
    source of each sample and that source's epoch; empty for one dataset),
    ``copies`` (int64 ``(N,)``: with ``repeats=k``, which of its ``k``
    copies each sample is; zeros otherwise), ``epoch`` and ``index``.

    The batch as a model takes it: ``normalize=(mean, std)`` (in [0, 1]
    units, as torchvision's ``Normalize`` after ``ToDtype(float32,
    scale=True)``) and ``dtype`` (float32, float16 or bfloat16) make
    ``images`` an NCHW-contiguous tensor of that dtype, normalized in the
    same pass that converts it, on the batch's device; ``mixing=Mixing(
    num_classes, mixup_alpha, cutmix_alpha, switch_prob, label_smoothing)``
    mixes each batch with torchvision v2's MixUp or CutMix (one λ per
    batch, each sample with the one before it) and makes ``labels`` float
    targets ``(N, num_classes)``; its draws come from (seed, epoch, rank,
    batch's step), so a resumed run mixes alike. An ``augment`` made by
    :func:`shardfeed.from_torchvision` brings its Normalize and dtype.

    ``views=`` (:func:`shardfeed.views_from_torchvision` or
    :func:`shardfeed.views`), in place of ``augment`` and ``image_size``:
    several views of each sample, decoded once (DINO's global and local
    crops, SimCLR's two views); ``images`` is then a list with one tensor
    per group, ``[views × N, H, W, 3]`` view-major as DINO's collate stacks
    them (rows ``v*N:(v+1)*N`` are view ``v`` of every sample), made as the
    group's transforms say (their Normalize and dtype; ``normalize`` and
    ``dtype`` apply to every group) and ``labels`` one per sample. With
    ``decode="client"`` or ``"gpu"`` each sample sent compressed is decoded
    once here and every view made from it (the sidecar's boxes and ops);
    no ``mixing``.

    ``sources=[("s3://a/", 0.7), ("s3://b/", 0.3)]`` (or
    :class:`shardfeed.Source` items) instead of ``dataset`` mixes datasets:
    see :meth:`shardfeed.Client.batches`. ``set_weights`` changes the
    weights from the next iteration on; ``state_dict`` records them and
    their history, and a dataset made with other weights that loads the
    state continues with its own from the resumed batch on.

    ``images`` is uint8 ``(N, H, W, 3)`` for ``layout="NHWC"``, or the same
    memory seen as ``(N, 3, H, W)`` for ``layout="NCHW"`` (a
    ``torch.channels_last`` tensor: no copy is made either way; call
    ``.contiguous()`` if a model needs NCHW-contiguous input). ``labels`` is
    int64 ``(N,)``. Both are views of the received batch: with shared memory
    (the default over a ``unix:`` target) of the server's slot, which is
    reused only once every view of it is gone.

    ``target`` defaults to ``$SHARDFEED_TARGET`` (the chart sets it), else
    ``127.0.0.1:50051``. The stream is split across *data-parallel* ranks:
    ``dp_rank`` / ``dp_size``, or ``device_mesh`` (the data-parallel
    sub-mesh, e.g. ``mesh["dp"]``: tensor-, pipeline- and context-parallel
    peers then receive identical batches). ``rank`` / ``world_size`` are
    the same as ``dp_rank`` / ``dp_size``. Without any of them,
    ``torch.distributed``'s rank and world size when initialized (right
    only for pure data parallelism), else ``RANK`` / ``WORLD_SIZE``, read
    when iterating, not when constructed. Other keyword arguments
    (``shuffle``, ``partition``, ``shuffle_buffer``, ``interleave``,
    ``transport`` ...) go to :meth:`shardfeed.Client.batches`.

    ``decode="gpu"`` (``device="cuda"``) has the sidecar send baseline JPEGs
    compressed and decodes, crops and resizes them in this process on the
    GPU, a batch at a time (:class:`shardfeed.decode.BatchDecoder`); the
    sidecar decodes a share of the samples, sought for the rate this loop
    takes batches at (``server_decode_fraction="auto"`` unless one is
    given: a fixed share repeats pixels byte for byte, a sought one within
    the stated tolerance). ``decode="client"`` does the same on this
    process's CPU, the sidecar decoding none unless a share is given.

    Epochs advance by themselves: each new iteration streams the next
    epoch (a fresh order and fresh augmentation), whether the last pass
    reached the epoch's end or stopped early (``break``, Lightning's
    ``limit_train_batches`` or ``max_steps``), unless ``set_epoch(e)`` or
    ``load_state_dict()`` chose what it streams. So frameworks that never
    call ``set_epoch`` on a dataset (PyTorch Lightning) train on a new epoch
    every time, and nothing is replayed silently. ``set_epoch(e)`` chooses
    the epoch of the next iteration, also one already streamed (logged
    once). ``len()`` is the epoch's batches per rank, asked of the server
    once per (world size, batch size). ``state_dict()`` records the epoch
    and the position of the last batch handed out (after a complete pass:
    the next epoch's start); ``load_state_dict()`` makes the next iteration
    of that epoch resume right after it, also at another world size with
    the same global batch (``world_size * batch_size``).

    accelerate: ``accelerator.prepare(model, optimizer, loader)`` with the
    loader of this dataset works as written. accelerate's default for an
    ``IterableDataset`` is to iterate it on process 0 only and hand each
    process its slice of what that yields; there the dataset streams every
    rank's batches in turn (rank 0's batch k, rank 1's batch k, ...), so
    each process receives its own partition, the same batches a plain loop
    on each rank gets.

    Workers: the sidecar does the work DataLoader workers would, so
    ``num_workers=0`` is the intended use. With ``num_workers=W`` each worker
    opens its own stream as one of ``W`` sub-ranks of this rank (sub-rank
    ``rank * W + worker``, world ``world_size * W``): together they receive
    each sample of this rank's share once, the DataLoader interleaves their
    batches, and each costs the sidecar one stream's memory. ``W = 1`` gives
    the same batches as ``W = 0``; other ``W`` a different (equally exact)
    split, so resume with the same ``W``. Give the DataLoader
    ``multiprocessing_context="forkserver"`` (or ``"spawn"``): gRPC is not
    fork-safe, and a worker forked after this process opened a channel
    (``len()``, an earlier pass) raises rather than risk hanging. A plain
    DataLoader's workers
    progress out of this process's sight, so ``state_dict()`` refuses there;
    torchdata's ``StatefulDataLoader`` asks each worker for its own state and
    resumes each worker's stream right after its last batch.
    """

    def __init__(
        self,
        dataset: str | None = None,
        *,
        sources: Sequence[SourceSpec] | None = None,
        target: str | None = None,
        client: Client | None = None,
        batch_size: int = 128,
        image_size: ImageSize | None = None,
        seed: int = 0,
        augment: AugmentSpec = None,
        layout: Layout | None = None,
        output: Output = "tuple",
        rank: int | None = None,
        world_size: int | None = None,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        device_mesh: Any = None,
        partition: Partition = "drop_last",
        decode: Decode = "server",
        device: str | torch.device | None = None,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        dtype: torch.dtype | None = None,
        mixing: Mixing | None = None,
        views: Views | None = None,
        **options: Any,
    ) -> None:
        if views is not None:
            _check_views(views, augment, image_size, mixing)
        # A converted transform brings its output size and layout; one
        # that disagrees with the arguments is refused, never overridden.
        image_size = resolve_image_size(image_size, augment)
        _augment(augment, image_size)
        layout = _layout(layout, augment)
        checked = check_arguments(
            dataset=dataset,
            sources=sources,
            target=target,
            client=client,
            batch_size=batch_size,
            layout=layout,
            output=output,
            rank=rank,
            world_size=world_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            device_mesh=device_mesh,
            decode=decode,
            device=device,
            options=options,
        )
        # The client opens its channel lazily, once per process: a dataset
        # made before DataLoader forks its workers is usable in each of them.
        self.client = client if client is not None else Client(target)
        self.dataset = dataset
        self._mix = None if sources is None else MixWeights([as_source(s) for s in sources])
        self.batch_size = batch_size
        self.image_size = image_size
        self.seed = seed
        self.augment = augment
        self.model_input = ModelInput.of(augment, mixing, normalize=normalize, dtype=dtype)
        self.views = views
        self._view_inputs = tuple(
            ModelInput.of(group.views[0], normalize=normalize, dtype=dtype)
            for group in (views.groups if views is not None else ())
        )
        self.layout = layout
        self.output = output
        self.rank, self.world_size = checked.rank, checked.world_size
        self.device_mesh = device_mesh
        self.partition = partition
        self.decode = decode
        self.device = checked.device
        self.options = checked.options
        self._progress = Progress()
        self._lengths = EpochSteps()
        # With server_decode_fraction="auto": where the last stream's share
        # search stood, where the next one goes on.
        self._share = ShareCarry()
        # The training loop's waits for batches, in the process it runs in.
        self._meter = WaitMeter()

    @property
    def sources(self) -> list[Source] | None:
        """A mixed stream's sources, with the weights in force."""
        return None if self._mix is None else self._mix.sources

    @property
    def epoch(self) -> int:
        """The epoch the next iteration streams (while one is under way in
        this process: the one after it)."""
        return self._progress.next_epoch()

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch the next iteration streams. Setting the epoch a
        loaded state is in keeps its resume position."""
        self._progress.set_epoch(epoch)

    def _stream_rank_and_world(self) -> tuple[int, int]:
        """This process's stream: in a DataLoader worker, its sub-rank."""
        return worker_sub_rank(*self._rank_and_world())

    def _next_epoch_start(self, epoch: int, world: int) -> EpochPosition:
        """Epoch ``epoch``'s start, after this copy's epoch (a mix's keeps
        its history: :meth:`Progress.mixed_epoch_start`)."""
        if self._mix is None:
            return EpochPosition()
        return self._progress.mixed_epoch_start(epoch, world, self._epoch_steps(world))

    def _rank_and_world(self) -> tuple[int, int]:
        return rank_and_world(self.rank, self.world_size, self.device_mesh)

    def __len__(self) -> int:
        return self._epoch_steps(self._rank_and_world()[1])

    def _epoch_steps(self, world: int) -> int:
        """Batches per rank of an epoch at ``world`` ranks: also the epoch's
        global steps, the same at any world size with the same global batch."""
        names = None if self._mix is None else self._mix.names()
        return self._lengths.steps(
            self.client,
            self.dataset,
            names,
            world,
            self.batch_size,
            self.partition,
            self.options.repeats,
        )

    def stats(self, last: int | None = None) -> InputStats:
        """Whether the training loop waits for data: over its last ``last``
        steps (default: the last 1,000), the time it waited for each batch
        against the time between batches, measured in the process running
        the loop. With DataLoader workers, iterate :meth:`dataloader`'s
        loader (which measures in this process); a plain DataLoader's
        workers are out of sight here. ``str()`` of it reads as a sentence;
        ``docs/INPUT_BOUND.md`` says what to change for each answer."""
        return self._meter.stats(last)

    def dataloader(
        self, *, stateful: bool = False, num_workers: int = 0, **options: Any
    ) -> DataLoader[Any]:
        """The ``DataLoader`` for this dataset: ``batch_size=None`` (the
        dataset yields whole batches), a fork-safe start method for workers
        (``forkserver``; gRPC is not fork-safe), and waits measured for
        :meth:`stats`. ``stateful=True``: torchdata's
        ``StatefulDataLoader``, whose ``state_dict()`` checkpoints mid-epoch
        also with workers (see the class's notes on workers). Other
        keywords go to the loader (``pin_memory``, ``prefetch_factor`` ...).
        """
        return make_dataloader(self, self.batch_size, stateful, num_workers, options)

    def __iter__(self) -> Iterator[Sample]:
        spec = StreamSpec(
            client=self.client,
            dataset=self.dataset,
            seed=self.seed,
            batch_size=self.batch_size,
            image_size=self.image_size,
            augment=self.augment,
            partition=self.partition,
            options=self.options,
            decode=self.decode,
            device=self.device,
            model_input=self.model_input,
            layout=self.layout,
            output=self.output,
            views=self.views,
            view_inputs=self._view_inputs,
        )
        return iter(
            Pass(
                spec,
                self._progress,
                self._share,
                self._mix,
                epoch_steps=self._epoch_steps,
                next_epoch_start=self._next_epoch_start,
                rank_and_world=self._stream_rank_and_world,
                dispatch=lambda: accelerate_dispatch(self),
                # The loop's waits are measured here when it runs in this
                # process; a DataLoader worker's copy leaves it to
                # dataloader()'s loader.
                meter=self._meter if get_worker_info() is None else None,
            )
        )

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the position of the last batch handed out, as plain
        values for a checkpoint."""
        world = self._stream_rank_and_world()[1]
        return self._state(*self._progress.checkpoint(self._next_epoch_start, world))

    def track_consumption(self) -> None:
        """For a trainer that fetches batches ahead of its steps (Lightning):
        from now on the positions of batches handed out are kept until
        :meth:`mark_consumed` says a step took them, so that
        :meth:`consumed_state_dict` can checkpoint at the last one consumed."""
        self._progress.track_consumption()

    def mark_consumed(self) -> None:
        """The oldest batch handed out has been consumed (a trainer's step)."""
        self._progress.mark_consumed()

    def consumed_state_dict(self) -> dict[str, Any]:
        """Like :meth:`state_dict`, at the last batch consumed rather than the
        last handed out (the DataModule's checkpoints, with batches fetched
        ahead; see :meth:`track_consumption`)."""
        consumed = self._progress.consumed_checkpoint()
        return self.state_dict() if consumed is None else self._state(*consumed)

    def _state(self, epoch: int, position: EpochPosition) -> dict[str, Any]:
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "dataset": self.dataset,
            "seed": self.seed,
            "epoch": epoch,
            "global_batch": self._global_batch(),
            "position": position.to_dict(),
        }
        if self._mix is not None:
            state.update(self._mix.to_state())
        return state

    def set_weights(self, weights: Sequence[float]) -> None:
        """New weights for a mixed stream's sources, from the next
        iteration's first batch on (exactly, from there; nothing of a
        source's epoch is repeated or skipped). Recorded in the state."""
        if self._mix is None:
            raise ValueError("set_weights is for a dataset made with sources=")
        self._mix.set(weights)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict`: the next iteration of its epoch
        continues after the last batch it recorded, at this job's world size
        (which may differ, if ``world_size * batch_size`` does not)."""
        names = None if self._mix is None else self._mix.names()
        position = check_state(state, self.dataset, self.seed, names, self._global_batch())
        self._progress.load(int(state["epoch"]), position)
        if self._mix is not None:
            self._mix.load(state)

    def _global_batch(self) -> int:
        return self._stream_rank_and_world()[1] * self.batch_size

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # A copy (a worker's) measures nothing of the loop: a fresh meter.
        del state["_meter"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._meter = WaitMeter()
