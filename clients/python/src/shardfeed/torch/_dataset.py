"""The ``IterableDataset`` surface of a shardfeed stream (see the package)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, TypedDict, Union

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .._augment import AugmentSpec, ImageSize
from .._client import Client, Source, SourceSpec, distributed_rank_and_world
from .._epochs import EpochPage, choose_epoch, pass_token
from .._options import Partition, StreamOptions, unknown_keywords
from .._stats import InputStats, WaitMeter
from .._wire import EpochPosition
from ._delivery import ShareCarry, stream_options
from ._device import mask, on_device
from ._frameworks import accelerate_dispatch, in_step
from ._loader import loader_class

__all__ = ["BatchDict", "ShardfeedDataset"]

_log = logging.getLogger("shardfeed")

Layout = Literal["NHWC", "NCHW"]
Decode = Literal["server", "client", "gpu"]
Output = Literal["tuple", "dict"]
_LAYOUTS = ("NHWC", "NCHW")
_DECODES = ("server", "client", "gpu")
_OUTPUTS = ("tuple", "dict")
_STATE_VERSION = 1


class BatchDict(TypedDict):
    """One batch with ``output="dict"`` (see :class:`ShardfeedDataset`)."""

    images: torch.Tensor
    labels: torch.Tensor
    keys: list[str]
    shards: list[str]
    crop_boxes: torch.Tensor
    flipped: torch.Tensor
    substituted: torch.Tensor
    padded: torch.Tensor
    fields: dict[str, list[bytes | None]]
    sources: torch.Tensor
    source_epochs: torch.Tensor
    epoch: int
    index: int


Sample = Union[tuple[torch.Tensor, torch.Tensor], BatchDict]


# Batches handed out but not yet consumed that a DataModule-driven dataset
# keeps positions for: Lightning fetches one ahead; far more means the
# consumption hook is not being called.
MAX_FETCH_AHEAD = 64


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
    ``epoch`` and ``index``.

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
        image_size: ImageSize = 224,
        seed: int = 0,
        augment: AugmentSpec = None,
        layout: Layout = "NHWC",
        output: Output = "tuple",
        rank: int | None = None,
        world_size: int | None = None,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        device_mesh: Any = None,
        partition: Partition = "drop_last",
        decode: Decode = "server",
        device: str | torch.device | None = None,
        **options: Any,
    ) -> None:
        if decode not in _DECODES:
            raise ValueError(f"decode must be one of {_DECODES}, not {decode!r}")
        if decode != "server" and "delivery" in options:
            raise ValueError(f"decode={decode!r} sets delivery itself")
        # Checked now: a misspelt or ill-valued option fails here, not at
        # the first iteration (in a DataLoader worker).
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
        if client is None:
            client = Client(target)
        # The client opens its channel lazily, once per process: a dataset
        # made before DataLoader forks its workers is usable in each of them.
        self.client = client
        self.dataset = dataset
        self.sources = None if sources is None else [_as_source(s) for s in sources]
        # A mixed stream's weights: those in force and the step they began
        # at (None: at the next iteration's first step), and the earlier ones.
        self._weights_from: int | None = 0
        self._weight_changes: list[tuple[int, list[float]]] = []
        self.batch_size = batch_size
        self.image_size = image_size
        self.seed = seed
        self.augment = augment
        self.layout = layout
        self.output = output
        self.rank = rank
        self.world_size = world_size
        self.device_mesh = device_mesh
        self.partition = partition
        self.decode = decode
        self.device = None if device is None else torch.device(device)
        self.options = stream_options
        self._epoch = 0
        # Where the current epoch stands in this process: the position of the
        # last batch handed out (or the one loaded, before any).
        self._position = EpochPosition()
        # Set by load_state_dict, used by the next iteration of its epoch.
        self._resume: EpochPosition | None = None
        self._lengths: dict[tuple[int, int, str], int] = {}
        # Counts explicit epoch choices (set_epoch, load_state_dict): a pass
        # completed under the current count advances the epoch by itself.
        self._choice = 0
        # Passes this copy began (with the DataLoader's seed, the identity of
        # a pass that sibling workers share), and whether a worker's copy was
        # given a state to resume (StatefulDataLoader) that its next pass
        # must follow whatever passes the record shows.
        self._passes = 0
        self._worker_loaded = False
        # With server_decode_fraction="auto": where the last stream's share
        # search stood, where the next one goes on.
        self._share = ShareCarry()
        self._repeat_logged = False
        self._shared = EpochPage()
        # The last pass this copy completed: (epoch, choice count).
        self._completed_here: tuple[int, int] | None = None
        # For a trainer that fetches ahead (Lightning): positions of batches
        # handed out but not yet consumed, and of the last one consumed.
        self._tracking = False
        self._pending: deque[EpochPosition] = deque()
        self._pass_start = EpochPosition()
        self._consumed: EpochPosition | None = None
        # The training loop's waits for batches, in the process it runs in.
        self._meter = WaitMeter()

    @property
    def epoch(self) -> int:
        """The epoch the next iteration streams (while one is under way in
        this process: the one after it)."""
        # As a new pass would choose: no pass shares the token -1.
        started = self._shared.started()
        return choose_epoch(self._epoch, self._choice, started, -1, self._worker_loaded)

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch the next iteration streams. Setting the epoch a
        loaded state is in keeps its resume position."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        self._choice += 1
        self._worker_loaded = False
        if epoch != self._epoch:
            self._epoch = epoch
            self._position = EpochPosition()
            self._resume = None

    def _completed_epoch(self) -> int:
        """The epoch a checkpoint taken now resumes: after a complete pass
        under the current choice (here or in a worker), the next one. A
        worker's copy counts only its own pass: its siblings stream other
        sub-ranks, and one that finished first says nothing of this one's
        batches still to come (StatefulDataLoader snapshots each worker)."""
        if get_worker_info() is not None:
            completed = self._completed_here
        else:
            completed = self._shared.completed()
        if completed is not None and completed[1] == self._choice and completed[0] >= self._epoch:
            return completed[0] + 1
        return self._epoch

    def _begin_pass(self, world: int) -> int:
        """Chooses the epoch this pass streams (``shardfeed._epochs``) and
        returns the pass's token."""
        self._passes += 1
        worker = get_worker_info()
        # The DataLoader's base seed is drawn anew for each of its iterators
        # and shared by that iterator's workers.
        token = pass_token(
            None if worker is None else worker.seed - worker.id,
            self._passes,
            int.from_bytes(os.urandom(7), "little"),
        )
        started = self._shared.started()
        epoch = choose_epoch(self._epoch, self._choice, started, token, self._worker_loaded)
        self._worker_loaded = False
        if (
            started is not None
            and started.choice != self._choice
            and started.epoch == epoch
            and not self._repeat_logged
        ):
            self._repeat_logged = True
            _log.info(
                "streaming epoch %d again, as set_epoch chose (the same order and "
                "augmentation as its previous pass)",
                epoch,
            )
        if epoch != self._epoch:
            self._position = self._next_epoch_start(epoch, world)
            self._epoch = epoch
            self._resume = None
        return token

    def _stream_rank_and_world(self) -> tuple[int, int]:
        """This process's stream: in a DataLoader worker, its sub-rank."""
        rank, world = self._rank_and_world()
        worker = get_worker_info()
        if worker is None:
            return rank, world
        return rank * worker.num_workers + worker.id, world * worker.num_workers

    def _next_epoch_start(self, epoch: int, world: int) -> EpochPosition:
        """Epoch ``epoch``'s start, after this copy's epoch. A mixed stream's
        keeps its history: the rest of this copy's epoch and any epochs
        between count as run at ``world`` (the stream's global steps go on,
        so what a shortened epoch left out is not streamed later)."""
        if self.sources is None:
            return EpochPosition()
        steps = self._epoch_steps(world)
        done = sum(batches for _, batches in self._position.segments)
        rest = steps - done + steps * max(epoch - self._epoch - 1, 0)
        return EpochPosition(
            self._position.segments + ((world, rest),),
            before_epoch=self._position.before_epoch,
        ).next_epoch()

    def _rank_and_world(self) -> tuple[int, int]:
        if self.device_mesh is not None:
            return int(self.device_mesh.get_local_rank()), int(self.device_mesh.size())
        default_rank, default_world = distributed_rank_and_world()
        rank = default_rank if self.rank is None else self.rank
        world = default_world if self.world_size is None else self.world_size
        return rank, world

    def __len__(self) -> int:
        return self._epoch_steps(self._rank_and_world()[1])

    def _epoch_steps(self, world: int) -> int:
        """Batches per rank of an epoch at ``world`` ranks: also the epoch's
        global steps, the same at any world size with the same global batch."""
        key = (world, self.batch_size, self.partition)
        if key not in self._lengths and self.sources is not None:
            # A mixed epoch has as many global batches as its sources hold.
            samples = sum(
                self.client.describe(s.dataset, world_size=1, batch_size=1).samples
                for s in self.sources
            )
            self._lengths[key] = samples // (world * self.batch_size)
        if key not in self._lengths:
            assert self.dataset is not None
            info = self.client.describe(
                self.dataset,
                world_size=world,
                batch_size=self.batch_size,
                partition=self.partition,
            )
            self._lengths[key] = info.batches_per_rank
        return self._lengths[key]

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
        if options.get("batch_size") is not None:
            raise ValueError(
                f"batch_size={options['batch_size']!r}: this dataset yields whole batches of "
                f"its own batch_size ({self.batch_size}); the loader must not batch again"
            )
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, not {num_workers}")
        options["batch_size"] = None
        if num_workers > 0:
            options.setdefault("multiprocessing_context", "forkserver")
        kind = loader_class(stateful, measured=num_workers > 0)
        loader: DataLoader[Any] = kind(self, num_workers=num_workers, **options)
        return loader

    def __iter__(self) -> Iterator[Sample]:
        # The loop's waits are measured here when it runs in this process;
        # a DataLoader worker's copy leaves it to dataloader()'s loader.
        meter = self._meter if get_worker_info() is None else None
        if meter is not None:
            meter.begin_pass()
        if get_worker_info() is not None:
            self._shared.set_worker_used()
        rank, world = self._stream_rank_and_world()
        token = self._begin_pass(world)
        # Under accelerate's dispatch, process 0 streams every rank's batches.
        ranks = list(range(world)) if accelerate_dispatch(self) else [rank]
        # A loaded position stays loaded until the resumed stream delivers:
        # an attempt that fails before its first batch, retried, must not
        # restart the epoch at batch 0.
        resume = self._resume
        mix: dict[str, Any] = {}
        if self.sources is not None:
            # A mixed stream always says where it stands: its history (the
            # world sizes before this epoch) keys every source's progress.
            resume = resume or EpochPosition(before_epoch=self._position.before_epoch)
            if self._weights_from is None:
                done = sum(batches for _, batches in resume.segments)
                self._weights_from = self._epoch * self._epoch_steps(world) + done
            mix = {
                "sources": self.sources,
                "weight_changes": self._weight_changes,
                "weights_from": self._weights_from,
            }
        # Trainers that know len() stop after that many batches without
        # asking for another (Lightning): the pass completes with its last
        # batch, not when the stream ends. Each batch says the epoch's steps.
        steps: int | None = None
        self._position = resume or EpochPosition()
        self._pass_start, self._consumed = self._position, None
        self._pending.clear()
        options = stream_options(self.options, self.decode, self.device, self._share)
        tuned = options.delivery.tuned
        streams = [
            on_device(
                self.client.batches(
                    self.dataset,
                    seed=self.seed,
                    epoch=self._epoch,
                    rank=stream_rank,
                    world_size=world,
                    batch_size=self.batch_size,
                    image_size=self.image_size,
                    augment=self.augment,
                    partition=self.partition,
                    resume_from=resume,
                    options=options,
                    **mix,
                ),
                decode=self.decode,
                device=self.device,
                client=self.client,
                rank=stream_rank,
            )
            for stream_rank in ranks
        ]
        for group in in_step(streams):
            for batch, images, labels, crop_boxes, flipped, substituted in group:
                if steps is None:
                    self._shared.set_started(self._epoch, self._choice, token)
                self._resume = None
                if tuned:
                    self._share.observe(batch)
                if self.layout == "NCHW":
                    images = images.permute(0, 3, 1, 2)
                self._position = batch.position
                if steps is None:
                    # Servers before `epoch_steps` are asked with Describe.
                    steps = batch.epoch_steps or self._epoch_steps(world)
                if sum(batches for _, batches in batch.position.segments) >= steps:
                    self._set_completed()
                if self._tracking:
                    if len(self._pending) >= MAX_FETCH_AHEAD:
                        raise RuntimeError(
                            f"{MAX_FETCH_AHEAD} batches were handed out that no training step "
                            "consumed: ShardfeedDataModule marks a batch consumed as a step "
                            "takes it (on_before_batch_transfer), so a loop fetching this far "
                            "ahead, or one that skips that hook, cannot be checkpointed exactly"
                        )
                    self._pending.append(batch.position)
                if meter is not None:
                    meter.received()
                if self.output == "tuple":
                    yield images, labels
                else:
                    yield self._as_dict(batch, images, labels, crop_boxes, flipped, substituted)
                if meter is not None:
                    meter.asking()
        # Resumed at the epoch's end: nothing was left, the position is spent.
        self._resume = None
        # Seen by this process and, after a fork, by the one that made the
        # dataset (a DataLoader worker's pass counts).
        self._shared.set_started(self._epoch, self._choice, token)
        self._set_completed()

    @staticmethod
    def _as_dict(
        batch: Any,
        images: torch.Tensor,
        labels: torch.Tensor,
        crop_boxes: Any,
        flipped: Any,
        substituted: Any,
    ) -> BatchDict:
        return {
            "images": images,
            "labels": labels,
            "keys": batch.keys,
            "shards": batch.shards,
            "crop_boxes": torch.from_numpy(crop_boxes),
            "flipped": torch.from_numpy(flipped),
            "substituted": mask(len(batch.keys), substituted),
            "padded": mask(len(batch.keys), batch.padded),
            "fields": batch.fields,
            "sources": torch.tensor(batch.sources, dtype=torch.int64),
            "source_epochs": torch.tensor(batch.source_epochs, dtype=torch.int64),
            "epoch": batch.epoch,
            "index": batch.index,
        }

    def _set_completed(self) -> None:
        """This copy's pass is complete: here, and on the page the process
        that made the dataset reads."""
        self._completed_here = (self._epoch, self._choice)
        self._shared.set_completed(self._epoch, self._choice)

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the position of the last batch handed out, as plain
        values for a checkpoint."""
        if get_worker_info() is None and self._shared.worker_used():
            raise RuntimeError(
                "ShardfeedDataset was iterated in a DataLoader worker, whose progress this "
                "process cannot see: use num_workers=0, or torchdata's StatefulDataLoader "
                "(which asks each worker for its state), to checkpoint mid-epoch"
            )
        epoch = self._completed_epoch()
        if epoch != self._epoch:
            # The pass is complete: the next epoch, from its start.
            position = self._next_epoch_start(epoch, self._stream_rank_and_world()[1])
        else:
            position = self._resume if self._resume is not None else self._position
        return self._state(epoch, position)

    def track_consumption(self) -> None:
        """For a trainer that fetches batches ahead of its steps (Lightning):
        from now on the positions of batches handed out are kept until
        :meth:`mark_consumed` says a step took them, so that
        :meth:`consumed_state_dict` can checkpoint at the last one consumed."""
        self._tracking = True

    def mark_consumed(self) -> None:
        """The oldest batch handed out has been consumed (a trainer's step)."""
        if self._pending:
            self._consumed = self._pending.popleft()

    def consumed_state_dict(self) -> dict[str, Any]:
        """Like :meth:`state_dict`, at the last batch consumed rather than the
        last handed out (the DataModule's checkpoints, with batches fetched
        ahead; see :meth:`track_consumption`)."""
        if not self._pending:
            return self.state_dict()
        position = self._consumed if self._consumed is not None else self._pass_start
        return self._state(self._epoch, position)

    def _state(self, epoch: int, position: EpochPosition) -> dict[str, Any]:
        state: dict[str, Any] = {
            "version": _STATE_VERSION,
            "dataset": self.dataset,
            "seed": self.seed,
            "epoch": epoch,
            "global_batch": self._global_batch(),
            "position": position.to_dict(),
        }
        if self.sources is not None:
            state["sources"] = [s.dataset for s in self.sources]
            state["weights"] = [s.weight for s in self.sources]
            state["weights_from"] = self._weights_from
            state["weight_changes"] = [[step, list(w)] for step, w in self._weight_changes]
        return state

    def set_weights(self, weights: Sequence[float]) -> None:
        """New weights for a mixed stream's sources, from the next
        iteration's first batch on (exactly, from there; nothing of a
        source's epoch is repeated or skipped). Recorded in the state."""
        if self.sources is None:
            raise ValueError("set_weights is for a dataset made with sources=")
        if len(weights) != len(self.sources):
            raise ValueError(f"{len(weights)} weights for {len(self.sources)} sources")
        if self._weights_from is not None:
            self._weight_changes.append((self._weights_from, [s.weight for s in self.sources]))
        self._weights_from = None
        self.sources = [
            dataclasses.replace(source, weight=float(weight))
            for source, weight in zip(self.sources, weights)
        ]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict`: the next iteration of its epoch
        continues after the last batch it recorded, at this job's world size
        (which may differ, if ``world_size * batch_size`` does not)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported ShardfeedDataset state version {state.get('version')!r}")
        for name in ("dataset", "seed"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"the state is of {name}={state[name]!r}, this dataset has "
                    f"{name}={getattr(self, name)!r}: its position means nothing here"
                )
        position = EpochPosition.from_dict(state["position"])
        if (self.sources is not None) != ("sources" in state) or (
            self.sources is not None and state["sources"] != [s.dataset for s in self.sources]
        ):
            raise ValueError(
                f"the state is of sources={state.get('sources')!r}, this dataset mixes "
                f"{None if self.sources is None else [s.dataset for s in self.sources]!r}"
            )
        global_batch = self._global_batch()
        if position.segments and state["global_batch"] != global_batch:
            raise ValueError(
                f"the state was saved mid-epoch with a global batch (world_size x batch_size) "
                f"of {state['global_batch']}; this job's is {global_batch}. Resume mid-epoch "
                "with the same global batch, or start the next epoch."
            )
        if get_worker_info() is None:
            self._choice += 1
        else:
            # StatefulDataLoader restoring a worker's copy: its next pass
            # resumes this state. Its passes must still count for the
            # process that made the dataset (whose choice count this keeps).
            self._worker_loaded = True
        self._epoch = int(state["epoch"])
        self._position = position
        self._resume = position if position.segments else None
        self._completed_here = None
        if self.sources is not None:
            self._load_weights(state)

    def _load_weights(self, state: Mapping[str, Any]) -> None:
        self._weight_changes = [(int(step), list(w)) for step, w in state["weight_changes"]]
        saved = [float(w) for w in state["weights"]]
        self._weights_from = state["weights_from"]
        assert self.sources is not None
        if saved != [s.weight for s in self.sources]:
            # Reweighted at the resume: the saved weights become history.
            if self._weights_from is not None:
                self._weight_changes.append((int(self._weights_from), saved))
            self._weights_from = None

    def _global_batch(self) -> int:
        return self._stream_rank_and_world()[1] * self.batch_size

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # A mapping does not pickle: a spawned worker maps the owner's page
        # again (see _SharedState).
        state["_shared"] = self._shared.to_pickle()
        # A copy (a worker's) measures nothing of the loop: a fresh meter.
        del state["_meter"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        source = state.pop("_shared")
        self.__dict__.update(state)
        self._shared = EpochPage(source)
        self._meter = WaitMeter()


def _as_source(source: SourceSpec) -> Source:
    if isinstance(source, Source):
        return source
    dataset, weight = source
    return Source(dataset, float(weight))


# ShardfeedDataset's own keywords, for the list a misspelt one gets.
_OWN_KEYWORDS = (
    "dataset sources target client batch_size image_size seed augment layout output rank "
    "world_size dp_rank dp_size device_mesh partition decode device"
).split()
