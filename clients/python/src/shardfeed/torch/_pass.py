"""One pass of a ``ShardfeedDataset``: the streams it opens (one per rank it
streams: its own, or every rank's under accelerate's dispatch), from where
its progress stands, and the batches they deliver in step, handed out as
the dataset's samples with the progress kept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from torch.utils.data import get_worker_info

from .._stats import WaitMeter
from .._wire import EpochPosition
from ._delivery import stream_options
from ._device import on_device
from ._frameworks import accelerate_dispatch, in_step
from ._model_input import to_model
from ._output import Sample, as_dict
from ._progress import Progress

if TYPE_CHECKING:
    from ._dataset import ShardfeedDataset


class Pass(NamedTuple):
    """A pass's streams, and whether their server-decode share is tuned
    (each batch then reports the search for the next stream to go on from)."""

    streams: list[Iterator[Any]]
    tuned: bool


def open_pass(dataset: ShardfeedDataset, progress: Progress, world: int, ranks: list[int]) -> Pass:
    """Opens a stream for each of ``ranks`` at ``world`` ranks, from the
    position ``progress`` has loaded (none: the epoch's start), and marks
    the pass started there."""
    # A loaded position stays loaded until the resumed stream delivers:
    # an attempt that fails before its first batch, retried, must not
    # restart the epoch at batch 0.
    resume = progress.resume
    mix: dict[str, Any] = {}
    if dataset._mix is not None:
        # A mixed stream always says where it stands: its history (the
        # world sizes before this epoch) keys every source's progress.
        resume = resume or EpochPosition(before_epoch=progress.position.before_epoch)
        begun = resume
        mix = dataset._mix.stream_keywords(
            lambda: (
                progress.epoch * dataset._epoch_steps(world)
                + sum(batches for _, batches in begun.segments)
            )
        )
    progress.start(resume or EpochPosition())
    options = stream_options(dataset.options, dataset.decode, dataset.device, dataset._share)
    streams = [
        on_device(
            dataset.client.batches(
                dataset.dataset,
                seed=dataset.seed,
                epoch=progress.epoch,
                rank=stream_rank,
                world_size=world,
                batch_size=dataset.batch_size,
                image_size=dataset.image_size,
                augment=dataset.augment,
                partition=dataset.partition,
                resume_from=resume,
                options=options,
                **mix,
            ),
            decode=dataset.decode,
            device=dataset.device,
            client=dataset.client,
            rank=stream_rank,
        )
        for stream_rank in ranks
    ]
    return Pass(streams, options.delivery.tuned)


def run_pass(dataset: ShardfeedDataset, meter: WaitMeter | None) -> Iterator[Sample]:
    """A pass of ``dataset``: its samples, each batch's position kept in its
    progress; the training loop's waits measured by ``meter`` (None: in a
    DataLoader worker, where the loader measures)."""
    if meter is not None:
        meter.begin_pass()
    progress = dataset._progress
    if get_worker_info() is not None:
        progress.shared.set_worker_used()
    rank, world = dataset._stream_rank_and_world()
    token = progress.begin_pass(world, dataset._next_epoch_start)
    # Under accelerate's dispatch, process 0 streams every rank's batches.
    ranks = list(range(world)) if accelerate_dispatch(dataset) else [rank]
    streams, tuned = open_pass(dataset, progress, world, ranks)
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
                steps = batch.epoch_steps or dataset._epoch_steps(world)
            if tuned:
                dataset._share.observe(batch)
            if dataset.model_input.active:
                step = sum(batches for _, batches in batch.position.segments) - 1
                key = (dataset.seed, batch.epoch, stream_rank, step)
                images, labels = to_model(images, labels, dataset.model_input, key)
            elif dataset.layout == "NCHW":
                images = images.permute(0, 3, 1, 2)
            progress.handed_out(batch.position)
            if sum(batches for _, batches in batch.position.segments) >= steps:
                progress.set_completed()
            if meter is not None:
                meter.received()
            if dataset.output == "tuple":
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
