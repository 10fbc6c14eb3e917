"""The DataLoader a ``ShardfeedDataset`` wants (``ShardfeedDataset.dataloader``):
plain or torchdata's ``StatefulDataLoader``, and with workers one that times
the training loop's waits in the process running it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from .._stats import WaitMeter

_CLASSES: dict[tuple[bool, bool], type[Any]] = {}


def loader_class(stateful: bool, *, measured: bool) -> type[Any]:
    """DataLoader or torchdata's StatefulDataLoader; ``measured``: one that
    times the loop's waits for its dataset's ``ShardfeedDataset.stats``
    in this process (its workers cannot)."""
    key = (stateful, measured)
    if key in _CLASSES:
        return _CLASSES[key]
    base: type[Any] = DataLoader
    if stateful:
        try:
            from torchdata.stateful_dataloader import (  # type: ignore[import-untyped]
                StatefulDataLoader,
            )
        except ImportError:
            raise ImportError(
                "stateful=True needs torchdata's StatefulDataLoader: pip install torchdata"
            ) from None
        base = StatefulDataLoader
    if not measured:
        _CLASSES[key] = base
        return base

    def measured_iter(self: Any) -> Iterator[Any]:
        meter: WaitMeter = self.dataset._meter
        iterator = base.__iter__(self)
        meter.begin_pass()
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            meter.received()
            yield batch
            meter.asking()

    kind = type(f"Measured{base.__name__}", (base,), {"__iter__": measured_iter})
    _CLASSES[key] = kind
    return kind


def make_dataloader(
    dataset: IterableDataset[Any],
    own_batch_size: int,
    stateful: bool,
    num_workers: int,
    options: dict[str, Any],
) -> DataLoader[Any]:
    """``ShardfeedDataset.dataloader``: the checks, then the loader for
    ``dataset``, which yields whole batches of ``own_batch_size``."""
    if options.get("batch_size") is not None:
        raise ValueError(
            f"batch_size={options['batch_size']!r}: this dataset yields whole batches of "
            f"its own batch_size ({own_batch_size}); the loader must not batch again"
        )
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, not {num_workers}")
    options["batch_size"] = None
    if num_workers > 0:
        options.setdefault("multiprocessing_context", "forkserver")
    kind = loader_class(stateful, measured=num_workers > 0)
    loader: DataLoader[Any] = kind(dataset, num_workers=num_workers, **options)
    return loader
