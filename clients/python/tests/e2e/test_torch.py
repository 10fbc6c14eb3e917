"""shardfeed.torch.ShardfeedDataset in a DataLoader, against the real binary."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardfeed import Client, ShardfeedError
from shardfeed.torch import ShardfeedDataset

from ..conftest import S3, SAFE_START, Server, noise_jpeg, run_ranks, upload, write_tar

SHARDS, PER_SHARD = 3, 30


@pytest.fixture(scope="module")
def dataset(s3: S3) -> str:
    shards = []
    for s in range(SHARDS):
        samples = []
        for i in range(PER_SHARD):
            n = s * PER_SHARD + i
            samples.append(
                (f"k{n:04d}", {"jpg": noise_jpeg(1000 + n, 48, 64), "cls": str(n).encode()})
            )
        shards.append(write_tar(samples))
    return upload(s3, "torchds", "train/", shards)


def _dataset(server: Server, uri: str, **overrides: object) -> ShardfeedDataset:
    options: dict[str, object] = dict(
        client=Client(server.target), batch_size=8, image_size=32, seed=3, rank=0, world_size=1
    )
    options.update(overrides)
    return ShardfeedDataset(uri, **options)  # type: ignore[arg-type]


def _copies(batches: object) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(images.numpy().copy(), labels.numpy().copy()) for images, labels in batches]  # type: ignore[attr-defined]


# On a machine without a GPU pinning is skipped with this warning; the
# loader's pinning path still runs.
@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
def test_two_epochs_through_a_dataloader(unix_server: Server, dataset: str) -> None:
    ds = _dataset(unix_server, dataset, augment="train")
    loader = DataLoader(ds, batch_size=None, pin_memory=True)
    assert len(ds) == len(loader) == SHARDS * PER_SHARD // 8
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        seen = []
        for images, labels in loader:
            assert images.dtype == torch.uint8 and images.shape == (8, 32, 32, 3)
            assert labels.dtype == torch.int64 and labels.shape == (8,)
            seen.extend(labels.tolist())
        assert len(seen) == len(ds) * 8
        assert len(set(seen)) == len(seen), "no sample twice in an epoch"
        epochs.append(seen)
    assert epochs[0] != epochs[1], "each epoch has its own order"


def test_nchw_is_the_same_memory_seen_channels_first(unix_server: Server, dataset: str) -> None:
    nhwc = _dataset(unix_server, dataset)
    nchw = _dataset(unix_server, dataset, layout="NCHW")
    for (a, labels_a), (b, labels_b) in zip(nhwc, nchw):
        assert b.shape == (8, 3, 32, 32)
        assert b.is_contiguous(memory_format=torch.channels_last), "a view, not a copy"
        assert torch.equal(a.permute(0, 3, 1, 2), b)
        assert torch.equal(labels_a, labels_b)


def test_shared_memory_and_inline_tensors_are_identical(unix_server: Server, dataset: str) -> None:
    shared = _copies(_dataset(unix_server, dataset, transport="shared_memory"))
    inline = _copies(_dataset(unix_server, dataset, transport="inline"))
    assert len(shared) == len(inline) == 11
    for (images, labels), (images_inline, labels_inline) in zip(shared, inline):
        assert (images == images_inline).all() and (labels == labels_inline).all()


def test_a_held_tensor_stays_unchanged(unix_server: Server, dataset: str) -> None:
    ds = _dataset(unix_server, dataset, transport="shared_memory")
    batches = iter(ds)
    held, _ = next(batches)
    saved = held.clone()
    later = [images for images, _ in batches]  # every later slot decoded meanwhile
    assert len(later) == 10
    assert torch.equal(held, saved), "a slot was reused under a live tensor"


def test_resume_from_state_dict_gives_the_remaining_batches(
    unix_server: Server, dataset: str
) -> None:
    ds = _dataset(unix_server, dataset)
    ds.set_epoch(1)
    full = _copies(ds)
    ds.set_epoch(1)
    state = None
    for step, _ in enumerate(ds):
        if step == 3:
            state = ds.state_dict()
            break
    assert state is not None and state["epoch"] == 1

    resumed = _dataset(unix_server, dataset)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    resumed.set_epoch(1)  # what a training loop does: keeps the resume position
    rest = _copies(DataLoader(resumed, batch_size=None))
    assert len(rest) == len(full) - 4
    for (images, labels), (expected_images, expected_labels) in zip(rest, full[4:]):
        assert (images == expected_images).all() and (labels == expected_labels).all()
    # Once consumed, the next pass is the next epoch, whole.
    assert resumed.epoch == 2
    assert len(_copies(resumed)) == len(full)


def test_a_failed_first_attempt_keeps_the_loaded_position(
    unix_server: Server, dataset: str, tmp_path: Path
) -> None:
    ds = _dataset(unix_server, dataset)
    full = _copies(ds)
    ds.set_epoch(0)
    for step, _ in enumerate(ds):
        if step == 2:
            state = ds.state_dict()
            break

    resumed = _dataset(unix_server, dataset)
    resumed.load_state_dict(state)
    real_client = resumed.client
    # The sidecar is not there yet: the first attempt fails before a batch.
    resumed.client = Client(f"unix:{tmp_path}/absent.sock", reconnect_timeout=None)
    with pytest.raises(ShardfeedError, match="UNAVAILABLE"):
        next(iter(resumed))
    resumed.client = real_client
    rest = _copies(resumed)
    assert len(rest) == len(full) - 3, "the retry resumed where the state said"
    for (images, labels), (expected_images, expected_labels) in zip(rest, full[3:]):
        assert (images == expected_images).all() and (labels == expected_labels).all()


def test_resume_at_another_world_size_loses_and_repeats_nothing(
    unix_server: Server, dataset: str
) -> None:
    ranks = [_dataset(unix_server, dataset, rank=r, world_size=2, batch_size=4) for r in (0, 1)]
    streams = [iter(r) for r in ranks]
    done: list[int] = []
    for _ in range(3):
        for stream in streams:
            done.extend(next(stream)[1].tolist())
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict(), "every rank records the same position"
    for stream in streams:
        stream.close()  # type: ignore[attr-defined]

    single = _dataset(unix_server, dataset, world_size=1, batch_size=8)
    single.load_state_dict(state)
    rest = [label for _, labels in single for label in labels.tolist()]
    # 90 samples, global batch 8: 88 per epoch, 24 of them before the checkpoint.
    assert len(done) == 24 and len(rest) == 64
    assert not set(done) & set(rest)

    with pytest.raises(ValueError, match="global batch"):
        _dataset(unix_server, dataset, world_size=1, batch_size=4).load_state_dict(state)


def test_a_dataset_made_before_the_workers_start_works_in_a_worker(
    unix_server: Server, dataset: str
) -> None:
    ds = _dataset(unix_server, dataset)
    assert len(ds) == 11  # the parent has used its channel before the workers start
    in_process = _copies(ds)
    ds.set_epoch(0)  # the same epoch again, on purpose
    in_worker = _copies(
        DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context=SAFE_START)
    )
    assert len(in_worker) == len(in_process)
    for (images, labels), (expected_images, expected_labels) in zip(in_worker, in_process):
        assert (images == expected_images).all() and (labels == expected_labels).all()
    with pytest.raises(RuntimeError, match="StatefulDataLoader"):
        ds.state_dict()


def test_a_worker_forked_after_grpc_started_refuses_at_once(
    unix_server: Server, dataset: str
) -> None:
    # gRPC's threads hold locks a fork copies mid-use: a channel opened in
    # the child could hang for good, at random. It must fail, and say why.
    ds = _dataset(unix_server, dataset)
    assert len(ds) == 11
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="multiprocessing_context='forkserver'"):
        _copies(DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork"))
    assert time.monotonic() - started < 60


def test_several_workers_split_the_rank_into_sub_ranks(unix_server: Server, dataset: str) -> None:
    # Rank 1 of 2, two workers: worker w streams sub-rank 2 + w of 4.
    ds = _dataset(unix_server, dataset, rank=1, world_size=2, batch_size=4)
    got = _copies(
        DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=SAFE_START)
    )
    subs = [
        _copies(_dataset(unix_server, dataset, rank=r, world_size=4, batch_size=4)) for r in (2, 3)
    ]
    assert len(subs[0]) == len(subs[1]) == SHARDS * PER_SHARD // 16
    # The DataLoader takes the workers' batches in turn.
    expected = [batch for pair in zip(*subs) for batch in pair]
    assert [labels.tolist() for _, labels in got] == [labels.tolist() for _, labels in expected]
    assert all((a == b).all() for (a, _), (b, _) in zip(got, expected))
    other = _dataset(unix_server, dataset, rank=0, world_size=2, batch_size=4)
    mine = {k for _, labels in got for k in labels.tolist()}
    theirs = {
        k
        for _, labels in _copies(
            DataLoader(other, batch_size=None, num_workers=2, multiprocessing_context=SAFE_START)
        )
        for k in labels.tolist()
    }
    assert len(mine) == len(theirs) == len(got) * 4 and not mine & theirs


def test_epochs_advance_by_themselves_as_under_lightning(
    unix_server: Server, dataset: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Lightning never calls set_epoch on a dataset: each pass must be the next epoch.
    ds = _dataset(unix_server, dataset, augment="train")
    passes = [_copies(ds) for _ in range(3)]
    assert ds.epoch == 3
    for epoch, batches in enumerate(passes):
        chosen = _dataset(unix_server, dataset, augment="train")
        chosen.set_epoch(epoch)
        expected = _copies(chosen)
        assert len(batches) == len(expected) == 11
        for (images, labels), (want_images, want_labels) in zip(batches, expected):
            assert (labels == want_labels).all(), f"pass {epoch} is epoch {epoch}"
            assert (images == want_images).all()
    orders = [np.concatenate([labels for _, labels in batches]).tolist() for batches in passes]
    assert orders[0] != orders[1] != orders[2]

    # A pass in a DataLoader worker counts too: the next pass is epoch 4.
    in_worker = _copies(
        DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context=SAFE_START)
    )
    assert ds.epoch == 4
    assert [labels.tolist() for _, labels in in_worker] != [
        labels.tolist() for _, labels in passes[2]
    ]

    # Choosing an epoch already streamed streams it again, said once.
    with caplog.at_level(logging.INFO, logger="shardfeed"):
        ds.set_epoch(1)
        again = _copies(ds)
        ds.set_epoch(1)
        _copies(ds)
    assert all((a[1] == b[1]).all() for a, b in zip(again, passes[1]))
    repeats = [r for r in caplog.records if "streaming epoch 1 again" in r.getMessage()]
    assert len(repeats) == 1

    # A checkpoint after a completed pass resumes at the next epoch's start.
    fresh = _dataset(unix_server, dataset)
    _copies(fresh)
    state = fresh.state_dict()
    assert state["epoch"] == 1 and state["position"]["segments"] == []


def _mesh_rank(rank: int, init_file: str, target: str, uri: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        ds = ShardfeedDataset(
            uri, client=Client(target), batch_size=8, image_size=32, device_mesh=mesh["dp"]
        )
        labels = [labels.tolist() for _, labels in ds]
        Path(out, f"{rank}.json").write_text(json.dumps(labels))
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_peers_get_identical_batches_on_a_device_mesh(
    server: Server, dataset: str, tmp_path: Path
) -> None:
    # Four processes on a 2 x 2 (dp, tp) gloo mesh, each its own rank.
    labels = run_ranks(
        _mesh_rank,
        4,
        lambda _: (str(tmp_path / "init"), server.target, dataset, str(tmp_path)),
        tmp_path,
    )
    # Ranks 0, 1 hold dp index 0; ranks 2, 3 dp index 1.
    assert labels[0] == labels[1] and labels[2] == labels[3], "tensor-parallel peers agree"
    first = {label for batch in labels[0] for label in batch}
    second = {label for batch in labels[2] for label in batch}
    assert len(labels[0]) == len(labels[2]) == 90 // 16
    assert not first & second, "data-parallel ranks are disjoint"


def test_one_way_of_naming_the_rank(unix_server: Server, dataset: str) -> None:
    with pytest.raises(ValueError, match="pass one of"):
        _dataset(unix_server, dataset, dp_rank=0, dp_size=2)  # beside rank / world_size
    ds = _dataset(unix_server, dataset, rank=None, world_size=None, dp_rank=1, dp_size=2)
    assert (ds.rank, ds.world_size) == (1, 2)
