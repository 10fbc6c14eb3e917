"""Where a ``ShardfeedDataset`` stands: the epoch its next pass streams, the
position of the last batch handed out (and, for a trainer that fetches
ahead, of the last one consumed), a mixed stream's weights and their
history, and the checkpoint state made of them.

No gRPC here; torch only for the DataLoader worker a copy may run in."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.utils.data import get_worker_info

from .._client import Source
from .._epochs import EpochPage, choose_epoch, pass_token
from .._wire import EpochPosition

_log = logging.getLogger("shardfeed")

STATE_VERSION = 1

# Batches handed out but not yet consumed that a DataModule-driven dataset
# keeps positions for: Lightning fetches one ahead; far more means the
# consumption hook is not being called.
MAX_FETCH_AHEAD = 64

# Epoch ``epoch``'s start at ``world`` ranks, after the copy's epoch.
NextEpochStart = Callable[[int, int], EpochPosition]


class Progress:
    """One dataset copy's epoch and position (``shardfeed._epochs`` says how
    copies in DataLoader workers agree on the epoch through ``shared``)."""

    def __init__(self) -> None:
        self.epoch = 0
        # Where the current epoch stands in this process: the position of the
        # last batch handed out (or the one loaded, before any).
        self.position = EpochPosition()
        # Set by load(), used by the next pass of its epoch.
        self.resume: EpochPosition | None = None
        # Counts explicit epoch choices (set_epoch, load): a pass completed
        # under the current count advances the epoch by itself.
        self.choice = 0
        # Passes this copy began (with the DataLoader's seed, the identity of
        # a pass that sibling workers share), and whether a worker's copy was
        # given a state to resume (StatefulDataLoader) that its next pass
        # must follow whatever passes the record shows.
        self._passes = 0
        self._worker_loaded = False
        self._repeat_logged = False
        self.shared = EpochPage()
        # The last pass this copy completed: (epoch, choice count).
        self._completed_here: tuple[int, int] | None = None
        # For a trainer that fetches ahead (Lightning): positions of batches
        # handed out but not yet consumed, and of the last one consumed.
        self._tracking = False
        self._pending: deque[EpochPosition] = deque()
        self._pass_start = EpochPosition()
        self._consumed: EpochPosition | None = None

    def next_epoch(self) -> int:
        """The epoch the next pass streams."""
        # As a new pass would choose: no pass shares the token -1.
        started = self.shared.started()
        return choose_epoch(self.epoch, self.choice, started, -1, self._worker_loaded)

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        self.choice += 1
        self._worker_loaded = False
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = EpochPosition()
            self.resume = None

    def completed_epoch(self) -> int:
        """The epoch a checkpoint taken now resumes: after a complete pass
        under the current choice (here or in a worker), the next one. A
        worker's copy counts only its own pass: its siblings stream other
        sub-ranks, and one that finished first says nothing of this one's
        batches still to come (StatefulDataLoader snapshots each worker)."""
        if get_worker_info() is not None:
            completed = self._completed_here
        else:
            completed = self.shared.completed()
        if completed is not None and completed[1] == self.choice and completed[0] >= self.epoch:
            return completed[0] + 1
        return self.epoch

    def mixed_epoch_start(self, epoch: int, world: int, steps: int) -> EpochPosition:
        """A mixed stream's epoch ``epoch``, after this copy's epoch of
        ``steps`` global steps: its history keeps the rest of this copy's
        epoch and any epochs between as run at ``world`` (the stream's
        global steps go on, so what a shortened epoch left out is not
        streamed later)."""
        done = sum(batches for _, batches in self.position.segments)
        rest = steps - done + steps * max(epoch - self.epoch - 1, 0)
        return EpochPosition(
            self.position.segments + ((world, rest),),
            before_epoch=self.position.before_epoch,
        ).next_epoch()

    def begin_pass(self, world: int, next_epoch_start: NextEpochStart) -> int:
        """Chooses the epoch this pass streams and returns the pass's token."""
        self._passes += 1
        worker = get_worker_info()
        # The DataLoader's base seed is drawn anew for each of its iterators
        # and shared by that iterator's workers.
        token = pass_token(
            None if worker is None else worker.seed - worker.id,
            self._passes,
            int.from_bytes(os.urandom(7), "little"),
        )
        started = self.shared.started()
        epoch = choose_epoch(self.epoch, self.choice, started, token, self._worker_loaded)
        self._worker_loaded = False
        if (
            started is not None
            and started.choice != self.choice
            and started.epoch == epoch
            and not self._repeat_logged
        ):
            self._repeat_logged = True
            _log.info(
                "streaming epoch %d again, as set_epoch chose (the same order and "
                "augmentation as its previous pass)",
                epoch,
            )
        if epoch != self.epoch:
            self.position = next_epoch_start(epoch, world)
            self.epoch = epoch
            self.resume = None
        return token

    def start(self, position: EpochPosition) -> None:
        """The pass streams from ``position``."""
        self.position = position
        self._pass_start, self._consumed = position, None
        self._pending.clear()

    def handed_out(self, position: EpochPosition) -> None:
        """A batch at ``position`` goes to the trainer."""
        self.resume = None
        self.position = position
        if not self._tracking:
            return
        if len(self._pending) >= MAX_FETCH_AHEAD:
            raise RuntimeError(
                f"{MAX_FETCH_AHEAD} batches were handed out that no training step "
                "consumed: ShardfeedDataModule marks a batch consumed as a step "
                "takes it (on_before_batch_transfer), so a loop fetching this far "
                "ahead, or one that skips that hook, cannot be checkpointed exactly"
            )
        self._pending.append(position)

    def set_completed(self) -> None:
        """This copy's pass is complete: here, and on the page the process
        that made the dataset reads."""
        self._completed_here = (self.epoch, self.choice)
        self.shared.set_completed(self.epoch, self.choice)

    def track_consumption(self) -> None:
        self._tracking = True

    def mark_consumed(self) -> None:
        if self._pending:
            self._consumed = self._pending.popleft()

    def checkpoint(self, next_epoch_start: NextEpochStart, world: int) -> tuple[int, EpochPosition]:
        """The epoch and position a checkpoint taken now resumes at."""
        if get_worker_info() is None and self.shared.worker_used():
            raise RuntimeError(
                "ShardfeedDataset was iterated in a DataLoader worker, whose progress this "
                "process cannot see: use num_workers=0, or torchdata's StatefulDataLoader "
                "(which asks each worker for its state), to checkpoint mid-epoch"
            )
        epoch = self.completed_epoch()
        if epoch != self.epoch:
            # The pass is complete: the next epoch, from its start.
            return epoch, next_epoch_start(epoch, world)
        return epoch, self.resume if self.resume is not None else self.position

    def consumed_checkpoint(self) -> tuple[int, EpochPosition] | None:
        """At the last batch consumed; None when none is pending (then the
        last handed out is the last consumed)."""
        if not self._pending:
            return None
        position = self._consumed if self._consumed is not None else self._pass_start
        return self.epoch, position

    def load(self, epoch: int, position: EpochPosition) -> None:
        if get_worker_info() is None:
            self.choice += 1
        else:
            # StatefulDataLoader restoring a worker's copy: its next pass
            # resumes this state. Its passes must still count for the
            # process that made the dataset (whose choice count this keeps).
            self._worker_loaded = True
        self.epoch = epoch
        self.position = position
        self.resume = position if position.segments else None
        self._completed_here = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # A mapping does not pickle: a spawned worker maps the owner's page
        # again.
        state["shared"] = self.shared.to_pickle()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        source = state.pop("shared")
        self.__dict__.update(state)
        self.shared = EpochPage(source)


class MixWeights:
    """A mixed stream's sources with the weights in force, the global step
    they began at (None: at the next pass's first step), and the earlier
    weights with the steps they held from."""

    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = list(sources)
        self.weights_from: int | None = 0
        self.changes: list[tuple[int, list[float]]] = []

    def set(self, weights: Sequence[float]) -> None:
        if len(weights) != len(self.sources):
            raise ValueError(f"{len(weights)} weights for {len(self.sources)} sources")
        if self.weights_from is not None:
            self.changes.append((self.weights_from, [s.weight for s in self.sources]))
        self.weights_from = None
        self.sources = [
            dataclasses.replace(source, weight=float(weight))
            for source, weight in zip(self.sources, weights)
        ]

    def stream_keywords(self, begins_at: Callable[[], int]) -> dict[str, Any]:
        """What ``Client.batches`` is given; ``begins_at()`` is the pass's
        first global step, taken when the weights began with it."""
        if self.weights_from is None:
            self.weights_from = begins_at()
        return {
            "sources": self.sources,
            "weight_changes": self.changes,
            "weights_from": self.weights_from,
        }

    def names(self) -> list[str]:
        return [s.dataset for s in self.sources]

    def to_state(self) -> dict[str, Any]:
        return {
            "sources": self.names(),
            "weights": [s.weight for s in self.sources],
            "weights_from": self.weights_from,
            "weight_changes": [[step, list(w)] for step, w in self.changes],
        }

    def load(self, state: Mapping[str, Any]) -> None:
        self.changes = [(int(step), list(w)) for step, w in state["weight_changes"]]
        saved = [float(w) for w in state["weights"]]
        self.weights_from = state["weights_from"]
        if saved != [s.weight for s in self.sources]:
            # Reweighted at the resume: the saved weights become history.
            if self.weights_from is not None:
                self.changes.append((int(self.weights_from), saved))
            self.weights_from = None


def check_state(
    state: Mapping[str, Any],
    dataset: str | None,
    seed: int,
    sources: list[str] | None,
    global_batch: int,
) -> EpochPosition:
    """The position of a checkpoint ``state``, if a dataset of ``dataset``
    (or mixing ``sources``), ``seed`` and ``global_batch`` can resume it."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"unsupported ShardfeedDataset state version {state.get('version')!r}")
    for name, value in (("dataset", dataset), ("seed", seed)):
        if state[name] != value:
            raise ValueError(
                f"the state is of {name}={state[name]!r}, this dataset has "
                f"{name}={value!r}: its position means nothing here"
            )
    position = EpochPosition.from_dict(state["position"])
    if (sources is not None) != ("sources" in state) or (
        sources is not None and state["sources"] != sources
    ):
        raise ValueError(
            f"the state is of sources={state.get('sources')!r}, this dataset mixes {sources!r}"
        )
    if position.segments and state["global_batch"] != global_batch:
        raise ValueError(
            f"the state was saved mid-epoch with a global batch (world_size x batch_size) "
            f"of {state['global_batch']}; this job's is {global_batch}. Resume mid-epoch "
            "with the same global batch, or start the next epoch."
        )
    return position
