"""How frameworks iterate a ``ShardfeedDataset``, where the dataset must
know: accelerate's dispatch, which iterates the loader on process 0 only
and hands each process its slice of what that yields."""

from __future__ import annotations

import sys
from collections.abc import Iterator

from ._device import Delivered


def in_step(streams: list[Iterator[Delivered]]) -> Iterator[list[Delivered]]:
    """Each stream's next batch together: the ranks' streams have equal
    batch counts, so one ending early is a broken invariant, not a tail."""
    while True:
        group = [next(stream, None) for stream in streams]
        if all(item is None for item in group):
            return
        if any(item is None for item in group):
            raise RuntimeError("the ranks' streams ended at different batches")
        yield group  # type: ignore[misc]


def accelerate_dispatch(dataset: object) -> bool:
    """Whether accelerate's ``DataLoaderDispatcher`` is iterating ``dataset``
    (on process 0, handing each process its slice of what it yields)."""
    state = sys.modules.get("accelerate.state")
    gradient_state = getattr(state, "GradientState", None)
    if gradient_state is None or not getattr(gradient_state, "_shared_state", None):
        return False
    try:
        active = gradient_state().active_dataloader
    except Exception:  # accelerate's internals moved: behave as without it
        return False
    if type(active).__name__ != "DataLoaderDispatcher":
        return False
    if getattr(active, "dataset", None) is not dataset:
        return False
    if getattr(active, "split_batches", False):
        raise ValueError(
            "accelerate's split_batches=True cuts one batch into per-process slices; "
            "ShardfeedDataset already streams each rank its own batches of batch_size: "
            "leave split_batches at its default (False)"
        )
    return True
