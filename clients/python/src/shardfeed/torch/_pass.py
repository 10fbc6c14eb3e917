"""One pass of a ``ShardfeedDataset``: the streams it opens (one per rank it
streams: its own, or every rank's under accelerate's dispatch), from where
its progress stands, and the batches they deliver in step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from .._wire import EpochPosition
from ._delivery import stream_options
from ._device import on_device
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
