"""Every sample exactly once, in the idioms users write: the delivery ledger's
matrix (idioms x features x faults), each row against the real sidecar.

The rows and what each feature asks are in ledger_matrix.py, the datasets
in ledger_data.py. Rows marked ``full_only`` run only with
``SHARDFEED_LEDGER=full`` (the whole matrix:
``SHARDFEED_LEDGER=full pytest tests/e2e/test_ledger.py -s``); the rest run
in every test run. Each row prints its verdict.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.utils.data import DataLoader

from shardfeed import Client
from shardfeed.torch import ShardfeedDataset

from ..conftest import S3, SAFE_START, free_port, run_ranks, scrape, start_s3, stop
from .ledger import Expected, Ledger, check, read, same_batches
from .ledger_data import (
    CORRUPT,
    Data,
    Sidecar,
    publish,
    publish_corrupt,
    publish_loose,
    publish_parquet,
)
from .ledger_matrix import (
    FEATURE_OPTIONS,
    FULL,
    MATRIX,
    MIXED,
    POOLED,
    REPEATS,
    Row,
    row_id,
)

WORLD, BATCH = 2, 4
# Every idiom's stream: the same batches whatever loop consumes them.
STREAM: dict[str, Any] = dict(batch_size=BATCH, image_size=24, seed=7)


@pytest.fixture(scope="module")
def data(s3: S3) -> Data:
    return publish(s3)


@pytest.fixture(scope="module")
def corrupt_data(s3: S3) -> Data:
    return publish_corrupt(s3)


@pytest.fixture(scope="module")
def loose_data(s3: S3) -> Data:
    return publish_loose(s3)


@pytest.fixture(scope="module")
def parquet_data(s3: S3) -> Data:
    return publish_parquet(s3)


@pytest.fixture(scope="module")
def unlisted_s3() -> Iterator[S3]:
    """An S3-compatible server whose listings carry no ETags (HEAD does)."""
    server, process = start_s3("--list-without-etags")
    yield server
    stop(process)


@pytest.fixture(scope="module")
def unlisted_data(unlisted_s3: S3) -> Data:
    return publish(unlisted_s3)


@pytest.fixture(scope="module")
def paced_s3() -> Iterator[S3]:
    """An S3-compatible server sending each GET's body at 2 MiB/s, so a
    reader's ranged GETs are in flight, each as a task, when a kill or a
    break lands."""
    server, process = start_s3("--get-mib-per-second", "2")
    yield server
    stop(process)


@pytest.fixture(scope="module")
def paced_data(paced_s3: S3) -> Data:
    # ~40 KB photos: a shard is several 64 KiB parts.
    return publish(paced_s3, side=(160, 200))


@dataclass(frozen=True)
class Case:
    """One run of an idiom: where to stream from and record to, and the fault."""

    target: str
    data: Data
    # "one" dataset, a "mix" of two, one dataset delivered "encoded" (the
    # client decodes), one through the decoded-source "tier", or one
    # decoded by the sidecar's decode "pool"; "tier_unlisted": the tier
    # over an S3 whose listings name no ETags (versions from HEAD);
    # "tier_stored": the tier with every epoch from the stored source;
    # "encoded_auto": encoded, the sidecar's share sought as it streams
    # (it moves mid-stream, and a resumed stream starts where it settled);
    # "loose": one image object per sample, read with GETs in flight the
    # stream sizes as it runs; "paced_reads": shards read from an S3 that
    # sends slowly, each ranged GET a task in flight; "corrupt",
    # "encoded_corrupt", "tier_corrupt": one dataset with corrupt scans
    # (CORRUPT), decoded, encoded (share 0), through the tier; "parquet",
    # "parquet_mix": source 0 as Parquet files, alone and mixed with tar;
    # "parquet_recipe", "parquet_encoded", "parquet_tier", "parquet_pool":
    # those files through the recipe's ops, the trainer's decoder, the
    # tier and the pool; "bicubic*", "single_ops*": one dataset through
    # those ops (FEATURE_OPTIONS), plain, encoded and pooled.
    feature: str
    ledger_dir: str
    run: str
    epochs: int = 2
    kill_at: int = 0  # rank 0's batch after which the sidecar is SIGKILLed
    kill_pid: int = 0
    break_at: int = 0  # rank 0's batch after which the loop breaks and resumes

    def dataset(
        self, rank: int | None, *, output: str = "dict", **options: Any
    ) -> ShardfeedDataset:
        common: dict[str, Any] = dict(
            client=Client(self.target),
            **STREAM,
            augment="train",
            output=output,
            rank=rank,
            world_size=None if rank is None else WORLD,
        )
        common.update(FEATURE_OPTIONS.get(self.feature, {}))
        common.update(options)
        if self.feature in MIXED:
            return ShardfeedDataset(
                sources=[(self.data.uris[0], 1), (self.data.uris[1], 1)], **common
            )
        return ShardfeedDataset(self.data.uris[0], **common)

    def ledger(self, rank: int) -> Ledger:
        kill = self.kill_at if rank == 0 else 0
        return Ledger(self.ledger_dir, self.run, kill_at=kill, kill_pid=self.kill_pid)


def _reweight(ds: ShardfeedDataset, case: Case, epoch: int) -> None:
    """The mix's weight change: 3:1 from epoch 1 on."""
    if case.feature in MIXED and epoch == 1:
        ds.set_weights([3, 1])


# Idioms: each consumes `case.epochs` epochs on every rank and records them.


def _consume(
    case: Case,
    rank: int,
    start: Callable[[], tuple[ShardfeedDataset, Any]],
    resume: Callable[[ShardfeedDataset, Any], tuple[ShardfeedDataset, Any]],
) -> None:
    """Consumes ``case.epochs`` epochs on one rank from what ``start()``
    returns (a dataset and what the loop iterates); at rank 0's
    ``break_at``-th batch the loop breaks and ``resume`` checkpoints and
    continues the epoch from a new dataset, as a new process would."""
    ledger = case.ledger(rank)
    ds, batches = start()
    epoch = 0
    while epoch < case.epochs:
        _reweight(ds, case, epoch)
        for batch in batches:
            ledger.record(batch, rank=rank)
            if rank == 0 and ledger.recorded == case.break_at:
                ds, batches = resume(ds, batches)
                break
        else:
            epoch += 1


def plain(case: Case) -> None:
    for rank in range(WORLD):

        def start(rank: int = rank) -> tuple[ShardfeedDataset, Any]:
            ds = case.dataset(rank)
            return ds, ds

        def resume(ds: ShardfeedDataset, _: Any, rank: int = rank) -> tuple[ShardfeedDataset, Any]:
            state = ds.state_dict()
            again = case.dataset(rank)
            again.load_state_dict(state)
            return again, again

        _consume(case, rank, start, resume)


def workers(case: Case, stateful: bool = False, helper: bool = False) -> None:
    """Two DataLoader workers, as users write the loader (``helper``: as
    ``ShardfeedDataset.dataloader`` makes it)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(ds: ShardfeedDataset) -> Any:
        if helper:
            return ds.dataloader(stateful=stateful, num_workers=2)
        kind = StatefulDataLoader if stateful else DataLoader
        return kind(ds, batch_size=None, num_workers=2, multiprocessing_context=SAFE_START)

    for rank in range(WORLD):

        def start(rank: int = rank) -> tuple[ShardfeedDataset, Any]:
            ds = case.dataset(rank)
            return ds, loader(ds)

        def resume(_: ShardfeedDataset, batches: Any, rank: int = rank) -> tuple[Any, Any]:
            state = batches.state_dict()
            ds = case.dataset(rank)
            again = loader(ds)
            again.load_state_dict(state)
            return ds, again

        _consume(case, rank, start, resume)


def stateful(case: Case) -> None:
    workers(case, stateful=True)


def loader(case: Case) -> None:
    workers(case, helper=True)


def stateful_loader(case: Case) -> None:
    workers(case, stateful=True, helper=True)


def lightning(case: Case, **trainer_options: Any) -> None:
    import pytorch_lightning as pl

    from shardfeed.lightning import ShardfeedDataModule

    class Recorder(pl.LightningModule):  # type: ignore[misc]
        def __init__(self, ledger: Ledger, rank: int, stop_at: int = 0) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 2)
            self.ledger, self.rank, self.stop_at = ledger, rank, stop_at

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            if self.stop_at and self.ledger.recorded == self.stop_at:
                raise _Stop
            self.ledger.record(batch, rank=self.rank)
            images = batch["images"]
            return self.layer(images.float().mean(dim=(1, 2))).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def trainer(root: Path, **options: Any) -> pl.Trainer:
        merged = dict(max_epochs=case.epochs, enable_checkpointing=False)
        merged.update(trainer_options)
        merged.update(options)
        return pl.Trainer(
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=root,
            **merged,
        )

    root = Path(case.ledger_dir) / f"{case.run}-lightning"
    for rank in range(WORLD):
        ledger = case.ledger(rank)
        if not (rank == 0 and case.break_at):
            loader = DataLoader(case.dataset(rank), batch_size=None)
            trainer(root / str(rank)).fit(Recorder(ledger, rank), train_dataloaders=loader)
            continue
        # A checkpoint every step through the DataModule; stopped, resumed.
        from pytorch_lightning.callbacks import ModelCheckpoint

        def module(rank: int = rank) -> ShardfeedDataModule:
            return ShardfeedDataModule(
                case.data.uris[0],
                target=case.target,
                **STREAM,
                train_output="dict",
                rank=rank,
                world_size=WORLD,
            )

        saves = root / "checkpoints"
        saver = ModelCheckpoint(dirpath=saves, every_n_train_steps=1, save_top_k=-1)
        with pytest.raises(_Stop):
            trainer(root / "cut", callbacks=[saver], enable_checkpointing=True).fit(
                Recorder(ledger, rank, stop_at=case.break_at), datamodule=module()
            )
        (checkpoint,) = saves.glob(f"*step={case.break_at}.ckpt")
        trainer(root / "resumed").fit(
            Recorder(ledger, rank), datamodule=module(), ckpt_path=str(checkpoint)
        )


class _Stop(Exception):
    pass


def _accelerate_rank(rank: int, port: int, case: Case) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # accelerate's canonical call, the loader included; tuple output (its
    # dispatch concatenates tensors only).
    loader = DataLoader(case.dataset(None, output="tuple"), batch_size=None)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ledger = case.ledger(rank)
    for epoch in range(case.epochs):
        for images, labels in loader:
            ledger.record((images, labels), rank=rank, epoch=epoch)
            loss = model(images.float().mean(dim=(1, 2))).square().mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    # run_ranks reads what each rank says; the ledger holds the batches.
    Path(case.ledger_dir, f"{case.run}-ranks", f"{rank}.json").write_text("{}")
    accelerator.end_training()


def accelerate(case: Case) -> None:
    port = free_port()
    said = Path(case.ledger_dir) / f"{case.run}-ranks"
    said.mkdir()
    run_ranks(_accelerate_rank, WORLD, lambda _: (port, case), said)


IDIOMS: dict[str, Callable[..., None]] = {
    "plain": plain,
    "workers": workers,
    "stateful": stateful,
    "loader": loader,
    "stateful_loader": stateful_loader,
    "lightning": lightning,
    "accelerate": accelerate,
}


@pytest.fixture
def sidecar(s3: S3, request: pytest.FixtureRequest) -> Iterator[Sidecar]:
    row = request.node.callspec.params.get("row")
    extra: tuple[str, ...] = ()
    if row is not None and row.feature == "tier_unlisted":
        s3 = request.getfixturevalue("unlisted_s3")
    if row is not None and row.feature == "paced_reads":
        s3 = request.getfixturevalue("paced_s3")
        extra = ("--part-size", "65536")
    running = Sidecar(s3, pool=row is not None and row.feature in POOLED, extra=extra)
    yield running
    running.close()


def _expected(row: Row, data: Data) -> Expected:
    options = dict(row.trainer)
    corrupt = CORRUPT if row.feature.endswith("corrupt") else frozenset()
    sources = data.labels if row.feature in MIXED else data.labels[:1]
    epochs = 2
    whole = True
    batches = None
    if "limit_train_batches" in options:
        epochs, whole, batches = options["max_epochs"], False, options["limit_train_batches"]
    if "max_steps" in options:
        # 6 batches an epoch: epoch 0 whole, epoch 1's first 3.
        whole = False
    repeats = REPEATS if "repeats" in row.feature else 1
    return Expected(sources, WORLD, epochs, whole, batches, corrupt, repeats)


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(
            row,
            id=row_id(row),
            marks=[pytest.mark.skipif(row.full_only and not FULL, reason="SHARDFEED_LEDGER=full")],
        )
        for row in MATRIX
    ],
)
def test_every_sample_exactly_once(
    row: Row, data: Data, sidecar: Sidecar, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    idiom = IDIOMS[row.idiom]
    if row.feature == "tier_unlisted":
        data = request.getfixturevalue("unlisted_data")
    if row.feature == "loose":
        data = request.getfixturevalue("loose_data")
    if row.feature == "paced_reads":
        data = request.getfixturevalue("paced_data")
    if row.feature.endswith("corrupt"):
        data = request.getfixturevalue("corrupt_data")
    if row.feature.startswith("parquet"):
        data = request.getfixturevalue("parquet_data")
    options = dict(row.trainer)
    base = Case(sidecar.target, data, row.feature, str(tmp_path), "reference")
    if options.get("max_epochs", 0) > 0:
        base = replace(base, epochs=options["max_epochs"])

    def run(case: Case) -> None:
        if row.idiom == "lightning":
            idiom(case, **options)
        else:
            idiom(case)

    run(base)
    reference = read(tmp_path, "reference")
    expected = _expected(row, data)
    verdict = check(reference, expected)
    problems = list(verdict.problems)
    if row.fault != "none":
        fault = replace(base, run=row.fault)
        if row.fault == "kill":
            fault = replace(fault, kill_at=4, kill_pid=sidecar.pid)
        elif row.fault == "worker":
            fault = replace(fault, kill_at=4, kill_pid=sidecar.workers[0].process.pid)
        else:
            fault = replace(fault, break_at=3)
        run(fault)
        faulted = read(tmp_path, row.fault)
        fault_verdict = check(faulted, expected)
        verdict.samples += fault_verdict.samples
        verdict.duplicates += fault_verdict.duplicates
        verdict.losses += fault_verdict.losses
        problems += [f"{row.fault}: {p}" for p in fault_verdict.problems]
        # A tuned share moves with timing, and with it which decoder's
        # pixels a sample gets (within the tolerance): the samples must match.
        pixels = row.feature != "encoded_auto"
        problems += [f"{row.fault}: {p}" for p in same_batches(faulted, reference, pixels=pixels)]
        if row.fault == "kill":
            assert sidecar.restarts == 1, "the fault killed the sidecar once"
    if row.feature in POOLED:
        # The workers the fault left standing did decode (not local decode alone).
        decoded = sum(
            float(line.rpartition(" ")[2])
            for worker in sidecar.workers[1:]
            for line in urllib.request.urlopen(worker.metrics, timeout=5)
            .read()
            .decode()
            .splitlines()
            if line.startswith("shardfeed_pool_worker_samples_total")
        )
        assert decoded > 0, "the pool decoded nothing"
    if row.feature.startswith("tier") or row.feature in (
        "recipe_tier",
        "parquet_tier",
        "views_tier",
    ):
        # The tier did its work (in the sidecar now running: a kill resets
        # its counters, not its records): samples filled or served, none
        # left out for want of a version.
        events = scrape(sidecar.servers[-1].metrics_url)
        tier = {
            event: events.get(f'shardfeed_decoded_tier_total{{event="{event}"}}', 0.0)
            for event in ("fill", "hit", "unversioned")
        }
        assert tier["fill"] + tier["hit"] > 0 and tier["unversioned"] == 0, tier
    if row.feature in ("recipe_encoded", "bicubic_encoded", "views_encoded"):
        events = scrape(sidecar.servers[-1].metrics_url)
        by_client = events['shardfeed_delivered_samples_total{decoded_by="client"}']
        by_server = events['shardfeed_delivered_samples_total{decoded_by="server"}']
        # The client's decoder names every op and the bicubic resize: its
        # samples are its own.
        assert by_client > 0, (by_client, by_server)
    if row.feature == "single_ops_encoded":
        events = scrape(sidecar.servers[-1].metrics_url)
        by_client = events.get('shardfeed_delivered_samples_total{decoded_by="client"}', 0.0)
        # The client's decoder does not name the single-op transforms.
        assert by_client == 0, by_client
    if row.feature.endswith("corrupt"):
        # The sidecar substituted them (in the sidecar now running: a kill
        # resets its counters): the trainer's decoder never saw them.
        events = scrape(sidecar.servers[-1].metrics_url)
        by_trainer = events.get('shardfeed_substituted_samples_total{reason="client_decode"}', 0.0)
        assert by_trainer == 0, "a corrupt sample reached the trainer's decoder"
        assert sum(v for k, v in events.items() if "substituted_samples_total" in k) > 0
    print(f"\nledger {row_id(row)}: {verdict.summary()}")
    assert not problems, "\n".join(problems)
