"""ShardfeedDataset under the frameworks trainers run it in, on CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from shardfeed import Client
from shardfeed.lightning import InputStatsCallback, ShardfeedDataModule
from shardfeed.torch import ShardfeedDataset

from ..conftest import S3, SAFE_START, Server, free_port, noise_jpeg, run_ranks, upload, write_tar

SHARDS, PER_SHARD = 3, 32


@pytest.fixture(scope="module")
def dataset(s3: S3) -> str:
    shards = [
        write_tar(
            [
                (f"f{s}{i:03d}", {"jpg": noise_jpeg(5000 + s * 100 + i, 40, 48), "cls": b"%d" % i})
                for i in range(PER_SHARD)
            ]
        )
        for s in range(SHARDS)
    ]
    return upload(s3, "frameworks", "", shards)


def _dataset_for(
    target: str, uri: str, rank: int | None = 0, world_size: int | None = 1
) -> ShardfeedDataset:
    return ShardfeedDataset(
        uri,
        client=Client(target),
        batch_size=4,
        image_size=24,
        seed=11,
        augment="train",
        rank=rank,
        world_size=world_size,
    )


def _dataset(server: Server, uri: str) -> ShardfeedDataset:
    return _dataset_for(server.target, uri)


def _arrays(batch: object) -> tuple[np.ndarray, np.ndarray]:
    images, labels = batch  # type: ignore[misc]
    return images.numpy().copy(), labels.numpy().copy()


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_stateful_dataloader_resumes_mid_epoch_with_the_remaining_batches(
    unix_server: Server, dataset: str, workers: int
) -> None:
    def loader(ds: ShardfeedDataset) -> StatefulDataLoader:
        return StatefulDataLoader(
            ds,
            batch_size=None,
            num_workers=workers,
            multiprocessing_context=SAFE_START if workers else None,
        )

    whole = [_arrays(b) for b in loader(_dataset(unix_server, dataset))]
    assert len(whole) == SHARDS * PER_SHARD // 4  # with 2 workers, 12 per sub-rank

    first = loader(_dataset(unix_server, dataset))
    head = []
    for batch in first:
        head.append(_arrays(batch))
        if len(head) == 7:
            state = first.state_dict()
            break
    del first

    again = loader(_dataset(unix_server, dataset))
    again.load_state_dict(state)
    rest = [_arrays(b) for b in again]
    assert len(head) + len(rest) == len(whole)
    for (images, labels), (want_images, want_labels) in zip(head + rest, whole):
        assert labels.tolist() == want_labels.tolist()
        assert (images == want_images).all(), "byte-identical after the resume"

    # The pass completed (in workers too): the next one is the next epoch.
    following = [_arrays(b) for b in again]
    assert [labels.tolist() for _, labels in following] != [labels.tolist() for _, labels in whole]


def _accelerate_rank(rank: int, port: int, target: str, uri: str, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2 and accelerator.process_index == rank
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # The recipe: prepare the model and optimizer, not the loader. shardfeed
    # already gives each rank its own share; accelerate's prepare(loader)
    # would split that share again (or send rank 0's to everyone).
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = DataLoader(_dataset_for(target, uri, rank=None, world_size=None), batch_size=None)
    labels = []
    for images, batch_labels in loader:
        features = images.to(accelerator.device).float().mean(dim=(1, 2))
        loss = model(features).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        labels.append(batch_labels.tolist())
    Path(out, f"{rank}.json").write_text(json.dumps(labels))
    accelerator.end_training()


def test_accelerate_recipe_gives_each_rank_its_plain_batches(
    server: Server, dataset: str, tmp_path: Path
) -> None:
    port = free_port()
    results = run_ranks(
        _accelerate_rank, 2, lambda _: (port, server.target, dataset, str(tmp_path)), tmp_path
    )
    for rank, got in enumerate(results):
        plain = _dataset_for(server.target, dataset, rank=rank, world_size=2)
        assert got == [labels.tolist() for _, labels in plain], f"rank {rank}"
        assert len(got) == SHARDS * PER_SHARD // 8


class _Recorder(pl.LightningModule):
    """A model that records what each training and validation step got."""

    def __init__(self, stop_at: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)
        self.stop_at = stop_at
        self.trained: list[tuple[int, list[int], bytes]] = []
        self.validated: list[tuple[list[str], list[bool]]] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        if (self.current_epoch, index) == self.stop_at:
            raise _Stop
        images, labels = batch
        self.trained.append((self.current_epoch, labels.tolist(), images.numpy().tobytes()))
        return self.layer(images.float().mean(dim=(1, 2))).square().mean()

    def validation_step(self, batch: dict[str, object], index: int) -> None:
        self.validated.append((batch["keys"], batch["padded"].tolist()))  # type: ignore[attr-defined]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Stop(Exception):
    pass


def _trainer(tmp_path: Path, **options: object) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **options,  # type: ignore[arg-type]
    )


def _module(server: Server, uri: str) -> ShardfeedDataModule:
    return ShardfeedDataModule(
        uri, uri, target=server.target, batch_size=4, val_batch_size=7, image_size=24, seed=11
    )


def test_lightning_trains_epochs_and_resumes_a_mid_epoch_checkpoint(
    unix_server: Server, dataset: str, tmp_path: Path
) -> None:
    whole = _Recorder()
    _trainer(tmp_path / "whole", enable_checkpointing=False, num_sanity_val_steps=0).fit(
        whole, datamodule=_module(unix_server, dataset)
    )
    per_epoch = SHARDS * PER_SHARD // 4
    assert [epoch for epoch, _, _ in whole.trained] == [0] * per_epoch + [1] * per_epoch
    first = [labels for epoch, labels, _ in whole.trained if epoch == 0]
    second = [labels for epoch, labels, _ in whole.trained if epoch == 1]
    assert first != second, "epoch 1 has its own order"
    assert sorted(sum(first, [])) == sorted(sum(second, []))
    crops = {e: [pixels for epoch, _, pixels in whole.trained if epoch == e] for e in (0, 1)}
    assert crops[0] != crops[1], "and its own crops"
    # Validation: unshuffled, padded to whole batches, the repeats marked.
    per_validation = -(-SHARDS * PER_SHARD // 7)
    assert len(whole.validated) == 2 * per_validation
    slots = [
        (key, padded)
        for batch_keys, batch_padded in whole.validated[:per_validation]
        for key, padded in zip(batch_keys, batch_padded)
    ]
    kept = [key for key, padded in slots if not padded]
    assert len(slots) - len(kept) == per_validation * 7 - SHARDS * PER_SHARD
    assert len(kept) == len(set(kept)) == SHARDS * PER_SHARD, "each sample counted once"
    assert kept == sorted(kept), "unshuffled"

    # Stopped mid-epoch 0 after a checkpoint at step 9; resumed from it.
    checkpoints = tmp_path / "ckpt"
    saver = ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=9, save_top_k=-1)
    cut = _Recorder(stop_at=(0, 11))
    with pytest.raises(_Stop):
        _trainer(tmp_path / "cut", callbacks=[saver], num_sanity_val_steps=0).fit(
            cut, datamodule=_module(unix_server, dataset)
        )
    (checkpoint,) = checkpoints.glob("*step=9.ckpt")
    resumed = _Recorder()
    _trainer(tmp_path / "resumed", enable_checkpointing=False, num_sanity_val_steps=0).fit(
        resumed, datamodule=_module(unix_server, dataset), ckpt_path=str(checkpoint)
    )
    got = cut.trained[:9] + resumed.trained
    assert [labels for _, labels, _ in got] == [labels for _, labels, _ in whole.trained]
    assert [pixels for _, _, pixels in got] == [pixels for _, _, pixels in whole.trained]


def test_the_stats_callback_logs_the_loops_waits(
    unix_server: Server, dataset: str, tmp_path: Path
) -> None:
    stats = InputStatsCallback(every_n_steps=5)
    trainer = _trainer(tmp_path, callbacks=[stats], enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(_Recorder(), datamodule=_module(unix_server, dataset))
    assert stats.last is not None and stats.last.steps == 5, stats.last
    logged = trainer.callback_metrics
    assert 0.0 <= float(logged["shardfeed/waiting_fraction"]) <= 1.0
    assert float(logged["shardfeed/step_p50_ms"]) > 0
    assert float(logged["shardfeed/wait_p99_ms"]) >= float(logged["shardfeed/wait_p50_ms"])
