"""PyTorch Lightning: shardfeed streams as a ``LightningDataModule``.

Needs ``lightning`` (or the older ``pytorch_lightning``) beside torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.utils.data import DataLoader

try:
    import lightning.pytorch as pl
except ImportError:  # the package's older name
    import pytorch_lightning as pl

from ._augment import AugmentSpec, ImageSize
from ._client import Client
from ._stats import InputStats
from .torch import ShardfeedDataset
from .torch._dataset import Output

__all__ = ["InputStatsCallback", "ShardfeedDataModule"]


# Lightning is not type-checked here (an optional, heavy dependency).
class ShardfeedDataModule(pl.LightningDataModule):  # type: ignore[misc]
    """Training and validation streams for a Lightning ``Trainer``.

    ``train`` and ``val`` name datasets (either may be ``None``). Each rank
    streams its own share: the rank and world size come from
    ``torch.distributed``, which Lightning initializes before iterating.

    - Training batches are ``(images, labels)`` (``train_output="dict"`` for
      everything a batch carries), shuffled and augmented (``train_augment``).
      Epochs advance by themselves. The stream's position goes into
      Lightning's checkpoints (``state_dict``): a checkpoint taken mid-epoch
      resumes right after the last batch a training step received, although
      Lightning fetches a batch ahead.
    - Validation batches are dicts (see :class:`ShardfeedDataset`),
      unshuffled, center-cropped (``val_augment``) and padded so that every
      rank has as many batches; ``batch["padded"]`` marks the repeats, to
      leave out of metrics so that each sample counts once.

    Other keyword arguments (``transport``, ``fields``, ``layout`` ...) go to
    both streams.
    """

    def __init__(
        self,
        train: str | None = None,
        val: str | None = None,
        *,
        target: str | None = None,
        batch_size: int = 128,
        val_batch_size: int | None = None,
        image_size: ImageSize | None = None,
        seed: int = 0,
        train_augment: AugmentSpec = "train",
        val_augment: AugmentSpec = "eval",
        train_output: Output = "tuple",
        **options: Any,
    ) -> None:
        super().__init__()
        if train is None and val is None:
            raise ValueError("name a train dataset, a val dataset or both")
        self.client = Client(target)
        self.train_dataset: ShardfeedDataset | None = None
        self.val_dataset: ShardfeedDataset | None = None
        common = dict(client=self.client, image_size=image_size, seed=seed, **options)
        if train is not None:
            self.train_dataset = ShardfeedDataset(
                train, batch_size=batch_size, augment=train_augment, output=train_output, **common
            )
            self.train_dataset.track_consumption()
        if val is not None:
            self.val_dataset = ShardfeedDataset(
                val,
                batch_size=val_batch_size or batch_size,
                augment=val_augment,
                output="dict",
                shuffle=False,
                partition="pad",
                **common,
            )

    def train_dataloader(self) -> DataLoader[Any]:
        if self.train_dataset is None:
            raise ValueError("this ShardfeedDataModule has no train dataset")
        # The sidecar decodes and batches: no workers, no collation.
        return self.train_dataset.dataloader()

    def val_dataloader(self) -> DataLoader[Any]:
        if self.val_dataset is None:
            raise ValueError("this ShardfeedDataModule has no val dataset")
        return self.val_dataset.dataloader()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Called as a step takes its batch, after the loop fetched ahead.
        trainer = getattr(self, "trainer", None)
        if self.train_dataset is not None and trainer is not None and trainer.training:
            self.train_dataset.mark_consumed()
        return batch

    def state_dict(self) -> dict[str, Any]:
        if self.train_dataset is None:
            return {}
        return {"train": self.train_dataset.consumed_state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if self.train_dataset is not None and "train" in state_dict:
            self.train_dataset.load_state_dict(state_dict["train"])


class InputStatsCallback(pl.Callback):  # type: ignore[misc]
    """Logs whether training waits for data: every ``every_n_steps``
    training steps, the training dataset's :meth:`ShardfeedDataset.stats`
    over those steps, as ``shardfeed/waiting_fraction``,
    ``shardfeed/wait_p50_ms``, ``shardfeed/wait_p99_ms`` and
    ``shardfeed/step_p50_ms`` to the Trainer's loggers (and the progress
    bar's ``callback_metrics``). Finds the dataset in a
    :class:`ShardfeedDataModule` or in the train DataLoader."""

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps <= 0:
            raise ValueError(f"every_n_steps must be positive, not {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.last: InputStats | None = None

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % self.every_n_steps:
            return
        dataset = _train_dataset(trainer)
        if dataset is None:
            return
        stats = dataset.stats(last=self.every_n_steps)
        if stats.steps == 0:
            return
        self.last = stats
        pl_module.log_dict(
            {
                "shardfeed/waiting_fraction": stats.waiting_fraction,
                "shardfeed/wait_p50_ms": 1e3 * stats.wait_p50,
                "shardfeed/wait_p99_ms": 1e3 * stats.wait_p99,
                "shardfeed/step_p50_ms": 1e3 * stats.step_p50,
            },
            on_step=True,
            on_epoch=False,
        )


def _train_dataset(trainer: Any) -> ShardfeedDataset | None:
    module = getattr(trainer, "datamodule", None)
    if isinstance(module, ShardfeedDataModule) and module.train_dataset is not None:
        return module.train_dataset
    loader = getattr(trainer, "train_dataloader", None)
    dataset = getattr(loader, "dataset", None)
    return dataset if isinstance(dataset, ShardfeedDataset) else None
