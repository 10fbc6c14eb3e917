"""One pass of a ``ShardfeedDataset``: the streams it opens (one per rank it
streams: its own, or every rank's under accelerate's dispatch), from where
its progress stands, and the batches they deliver in step, handed out as
the dataset's samples with the progress kept.

A pass is an object of its own: the dataset gives it what it streams
(:class:`StreamSpec`, fixed when the dataset was made) and the state a
pass keeps (the progress, the share search, a mix's weights), so nothing
here reads the dataset's attributes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import get_worker_info

from .._augment import AugmentSpec, ImageSize
from .._client import Client
from .._options import Partition, StreamOptions
from .._stats import WaitMeter
from .._views import Views
from .._wire import EpochPosition
from ._delivery import ShareCarry, stream_options
from ._device import Images, on_device
from ._frameworks import in_step
from ._model_input import ModelInput, to_model
from ._output import Sample, as_dict
from ._progress import MixWeights, Progress


@dataclass(frozen=True)
class StreamSpec:
    """What every stream of a dataset asks, and how its batches are
    handed out."""

    client: Client
    dataset: str | None
    seed: int
    batch_size: int
    image_size: ImageSize
    augment: AugmentSpec
    partition: Partition
    options: StreamOptions
    decode: str
    device: Any
    model_input: ModelInput
    layout: str
    output: str
    # Several views per sample: the groups, and what each group's tensor
    # is made into (its views' Normalize and dtype).
    views: Views | None = None
    view_inputs: tuple[ModelInput, ...] = ()

    def to_model(self, images: Images, labels: Any, key: tuple[int, int, int, int]) -> Any:
        """A batch's images and labels as the model takes them."""
        if isinstance(images, list):
            return [self._group(g, images[g], labels, key) for g in range(len(images))], labels
        if self.model_input.active:
            return to_model(images, labels, self.model_input, key)
        if self.layout == "NCHW":
            images = images.permute(0, 3, 1, 2)
        return images, labels

    def _group(self, g: int, images: Any, labels: Any, key: tuple[int, int, int, int]) -> Any:
        if self.view_inputs[g].active:
            return to_model(images, labels, self.view_inputs[g], key)[0]
        return images.permute(0, 3, 1, 2) if self.layout == "NCHW" else images


@dataclass
class Pass:
    """One pass over a dataset's epoch. ``rank_and_world`` and ``dispatch``
    are asked when the pass starts (in the process that iterates it: a
    DataLoader worker is a rank of its own); ``meter`` measures the loop's
    waits (None: in a worker, where the loader measures)."""

    spec: StreamSpec
    progress: Progress
    share: ShareCarry
    mix: MixWeights | None
    epoch_steps: Callable[[int], int]
    next_epoch_start: Callable[[int, int], EpochPosition]
    rank_and_world: Callable[[], tuple[int, int]]
    dispatch: Callable[[], bool]
    meter: WaitMeter | None

    def _open(self, world: int, ranks: list[int]) -> tuple[list[Iterator[Any]], bool]:
        """Opens a stream for each of ``ranks`` at ``world`` ranks, from the
        position the progress has loaded (none: the epoch's start), and
        marks the pass started there; and whether the server-decode share
        is tuned (each batch then reports the search for the next stream
        to go on from)."""
        spec, progress = self.spec, self.progress
        # A loaded position stays loaded until the resumed stream delivers:
        # an attempt that fails before its first batch, retried, must not
        # restart the epoch at batch 0.
        resume = progress.resume
        mix: dict[str, Any] = {}
        if self.mix is not None:
            # A mixed stream always says where it stands: its history (the
            # world sizes before this epoch) keys every source's progress.
            resume = resume or EpochPosition(before_epoch=progress.position.before_epoch)
            begun = resume
            mix = self.mix.stream_keywords(
                lambda: (
                    progress.epoch * self.epoch_steps(world)
                    + sum(batches for _, batches in begun.segments)
                )
            )
        progress.start(resume or EpochPosition())
        options = stream_options(spec.options, spec.decode, spec.device, self.share)
        streams = [
            on_device(
                spec.client.batches(
                    spec.dataset,
                    seed=spec.seed,
                    epoch=progress.epoch,
                    rank=stream_rank,
                    world_size=world,
                    batch_size=spec.batch_size,
                    image_size=None if spec.views is not None else spec.image_size,
                    augment=None if spec.views is not None else spec.augment,
                    views=spec.views,
                    partition=spec.partition,
                    resume_from=resume,
                    options=options,
                    **mix,
                ),
                decode=spec.decode,
                device=spec.device,
                client=spec.client,
                rank=stream_rank,
            )
            for stream_rank in ranks
        ]
        return streams, options.delivery.tuned

    def __iter__(self) -> Iterator[Sample]:
        """The pass's samples, each batch's position kept in its progress."""
        spec, progress, meter = self.spec, self.progress, self.meter
        if meter is not None:
            meter.begin_pass()
        if get_worker_info() is not None:
            progress.shared.set_worker_used()
        rank, world = self.rank_and_world()
        token = progress.begin_pass(world, self.next_epoch_start)
        # Under accelerate's dispatch, process 0 streams every rank's batches.
        ranks = list(range(world)) if self.dispatch() else [rank]
        streams, tuned = self._open(world, ranks)
        # Trainers that know len() stop after that many batches without
        # asking for another (Lightning): the pass completes with its last
        # batch, not when the stream ends. Each batch says the epoch's steps.
        steps: int | None = None
        for group in in_step(streams):
            for stream_rank, delivered in zip(ranks, group):
                batch, images, labels, crop_boxes, flipped, substituted = delivered
                if steps is None:
                    progress.shared.set_started(progress.epoch, progress.choice, token)
                    # Servers before `epoch_steps` are asked with Describe.
                    steps = batch.epoch_steps or self.epoch_steps(world)
                if tuned:
                    self.share.observe(batch)
                step = sum(batches for _, batches in batch.position.segments) - 1
                key = (spec.seed, batch.epoch, stream_rank, step)
                images, labels = spec.to_model(images, labels, key)
                progress.handed_out(batch.position)
                if sum(batches for _, batches in batch.position.segments) >= steps:
                    progress.set_completed()
                if meter is not None:
                    meter.received()
                    if tuned:
                        self.share.tell_loop(spec.client, meter)
                if spec.output == "tuple":
                    yield images, labels
                else:
                    yield as_dict(batch, images, labels, crop_boxes, flipped, substituted)
                if meter is not None:
                    meter.asking()
        # Resumed at the epoch's end: nothing was left, the position is spent.
        progress.resume = None
        # Seen by this process and, after a fork, by the one that made the
        # dataset (a DataLoader worker's pass counts).
        progress.shared.set_started(progress.epoch, progress.choice, token)
        progress.set_completed()
