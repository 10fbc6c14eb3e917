"""ShardfeedDataset's state handling and checks: no server needed."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from shardfeed import Batch, Client, DatasetInfo, EpochPosition
from shardfeed.torch import MAX_FETCH_AHEAD, ShardfeedDataset

URI = "s3://bucket/train/"


class _CountingClient(Client):
    def __init__(self) -> None:
        super().__init__("127.0.0.1:1")
        self.describes = 0

    def describe(self, dataset: str, **_: Any) -> DatasetInfo:
        self.describes += 1
        return DatasetInfo(2, 100, 12, 4, 0, 1000)


def _state(**overrides: Any) -> dict[str, Any]:
    state: dict[str, Any] = {
        "version": 1,
        "dataset": URI,
        "seed": 0,
        "epoch": 2,
        "global_batch": 16,
        "position": {"segments": [[2, 5]], "dataset": "samples=80 shards=2 digest=0123"},
    }
    state.update(overrides)
    return state


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="layout must be one of"):
        ShardfeedDataset(URI, layout="CHW")
    with pytest.raises(ValueError, match="target or client"):
        ShardfeedDataset(URI, target="127.0.0.1:1", client=Client("127.0.0.1:1"))
    with pytest.raises(ValueError, match="batch_size must be positive"):
        ShardfeedDataset(URI, batch_size=0)
    # Stream options are checked when the dataset is made, not in a worker.
    with pytest.raises(TypeError, match=r"unknown option shufle \(did you mean shuffle\?\)"):
        ShardfeedDataset(URI, shufle=False)
    # The dataset's own keywords are among those a misspelt one is matched to.
    with pytest.raises(TypeError, match=r"batchsize \(did you mean batch_size\?\).*known: aug"):
        ShardfeedDataset(URI, batchsize=8)
    with pytest.raises(ValueError, match="delivery must be one of"):
        ShardfeedDataset(URI, delivery="zipped")


def test_target_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDFEED_TARGET", "unix:///run/shardfeed/sf.sock")
    assert ShardfeedDataset(URI).client.target == "unix:///run/shardfeed/sf.sock"
    monkeypatch.delenv("SHARDFEED_TARGET")
    assert ShardfeedDataset(URI).client.target == "127.0.0.1:50051"


def test_len_asks_the_server_once_per_world_size() -> None:
    client = _CountingClient()
    ds = ShardfeedDataset(URI, client=client, world_size=2, batch_size=8)
    assert [len(ds) for _ in range(5)] == [12] * 5
    assert client.describes == 1
    ds.world_size = 4
    len(ds)
    assert client.describes == 2


def test_state_round_trips_and_set_epoch_keeps_or_drops_it() -> None:
    ds = ShardfeedDataset(URI, world_size=2, batch_size=8)
    assert ds.state_dict()["position"] == {"segments": [], "dataset": ""}
    ds.load_state_dict(_state())
    assert ds.epoch == 2
    assert ds.state_dict() == _state()
    ds.set_epoch(2)
    assert ds.state_dict() == _state(), "the loaded epoch keeps its position"
    ds.set_epoch(3)
    assert ds.state_dict() == _state(epoch=3, position={"segments": [], "dataset": ""})
    # A state saved before positions named their dataset index still loads.
    ds.load_state_dict(_state(position={"segments": [[2, 5]]}))
    assert ds.state_dict()["position"] == {"segments": [[2, 5]], "dataset": ""}


def test_state_from_another_run_is_refused() -> None:
    ds = ShardfeedDataset(URI, world_size=2, batch_size=8)
    with pytest.raises(ValueError, match="seed=7"):
        ds.load_state_dict(_state(seed=7))
    with pytest.raises(ValueError, match="dataset="):
        ds.load_state_dict(_state(dataset="s3://other/"))
    with pytest.raises(ValueError, match="global batch .* of 32; this job's is 16"):
        ds.load_state_dict(_state(global_batch=32))
    with pytest.raises(ValueError, match="state version"):
        ds.load_state_dict(_state(version=9))
    # At an epoch boundary the global batch may change.
    ds.load_state_dict(_state(global_batch=32, position={"segments": []}))
    assert ds.epoch == 2


def test_the_dataset_pickles_for_spawned_workers() -> None:
    ds = ShardfeedDataset(URI, world_size=2, batch_size=8, layout="NCHW", augment="train")
    ds.load_state_dict(_state())
    again = pickle.loads(pickle.dumps(ds))
    assert again.state_dict() == _state()
    assert (again.layout, again.augment, again.client.target) == ("NCHW", "train", ds.client.target)


class _StreamingClient(_CountingClient):
    """Answers StreamBatches with tiny batches, one position further each."""

    def __init__(self, batches: int = 100, epoch_steps: int = 0) -> None:
        super().__init__()
        self.count, self.epoch_steps = batches, epoch_steps

    def batches(self, dataset: str, **_: Any) -> Any:
        for index in range(self.count):
            yield Batch(
                epoch=0,
                index=index,
                images=np.zeros((1, 2, 2, 3), np.uint8),
                labels=np.zeros(1, np.int64),
                keys=[f"k{index}"],
                shards=["s"],
                substituted=[],
                substitution_reasons=[],
                substitute_sources=[],
                position=EpochPosition(((1, index + 1),)),
                global_samples=index + 1,
                crop_boxes=np.zeros((1, 4), np.float32),
                flipped=np.zeros(1, np.bool_),
                epoch_steps=self.epoch_steps,
            )


def test_positions_kept_for_unconsumed_batches_are_bounded() -> None:
    ds = ShardfeedDataset(URI, client=_StreamingClient(), world_size=1, batch_size=1)
    ds.track_consumption()
    stream = iter(ds)
    for _ in range(MAX_FETCH_AHEAD):
        next(stream)
    with pytest.raises(RuntimeError, match="no training step consumed"):
        next(stream)
    # Consumed as they are handed out, the stream goes on as long as it lasts.
    ds = ShardfeedDataset(URI, client=_StreamingClient(), world_size=1, batch_size=1)
    ds.track_consumption()
    taken = 0
    for _ in ds:
        ds.mark_consumed()
        taken += 1
    assert taken == 100


def test_each_batch_says_when_the_epoch_is_complete() -> None:
    """The pass completes with the batch that reaches the epoch's steps,
    without a Describe (a trainer that knows len() asks for no more)."""
    client = _StreamingClient(batches=5, epoch_steps=5)
    ds = ShardfeedDataset(URI, client=client, world_size=1, batch_size=1)
    stream = iter(ds)
    for _ in range(5):
        next(stream)
    assert client.describes == 0
    assert ds.state_dict()["epoch"] == 1
    # A server without the field: the dataset asks Describe (12 steps).
    client = _StreamingClient(batches=5)
    ds = ShardfeedDataset(URI, client=client, world_size=1, batch_size=1)
    list(ds)
    assert client.describes == 1


def test_a_worker_maps_the_epoch_page_only_while_the_descriptor_is_the_page(
    tmp_path: Any,
) -> None:
    import os

    from shardfeed._epochs import EpochPage, map_owner_page

    owner = EpochPage()
    assert owner._owner is not None
    pid, fd, inode = owner._owner
    mapped = map_owner_page(pid, fd, inode)
    assert mapped is not None, "the owner's page, mapped again"
    mapped[0].close()
    os.close(mapped[1])
    # The number names another dataset's page (the owner dropped the first
    # and reused its number before a worker got to unpickle): left alone.
    other_page = EpochPage()
    assert other_page._owner is not None
    assert map_owner_page(pid, other_page._owner[1], inode) is None
    # The number now names another file (a checkpoint): it is left alone.
    checkpoint = tmp_path / "ckpt.pt"
    checkpoint.write_bytes(b"checkpoint bytes, not a page")
    other = os.open(checkpoint, os.O_RDWR)
    try:
        assert map_owner_page(os.getpid(), other, inode) is None
    finally:
        os.close(other)
    assert checkpoint.read_bytes() == b"checkpoint bytes, not a page"
