"""The delivery ledger: what every rank and worker received, checked.

Every process that consumes batches (a plain loop, a Lightning step, an
accelerate rank) appends one JSON line per batch to a file of its own in the
ledger's directory, so records cross process boundaries without locks. The
checks read them all back and assert, per epoch: each sample of the epoch
exactly once across ranks (per source-epoch for a mix), equal batches per
rank, an order of its own, and batches byte-identical to an uninterrupted
run after any resume or restart.

A sample's identity is its label (with ``repeats=k``, its label and its
copy index: each copy is delivered exactly once): the ledger's datasets give every sample a
label of its own (a source's labels in a range of their own), so tuple
output, which is all accelerate's dispatch can concatenate, still names it.
A substituted slot carries its stand-in's label: there the identity is read
from its key (the ledger's datasets name each sample ``k<label>``), and the
checks count it as delivered (substituted) once, never as its stand-in.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Labels of source k are SOURCE_LABELS * k + i.
SOURCE_LABELS = 1000


@dataclass(frozen=True)
class Delivery:
    """One batch as a consumer received it."""

    run: str
    rank: int
    epoch: int
    labels: tuple[int, ...]
    source_epochs: tuple[int, ...]
    digest: str
    # The samples the slots stand for (the labels, but for substituted
    # slots) and those of the substituted slots.
    samples: tuple[int, ...] = ()
    substituted: tuple[int, ...] = ()
    # Per slot, the sample's copy index (repeated augmentation; else 0).
    copies: tuple[int, ...] = ()


def label_of_key(key: str) -> int:
    """The label a ledger dataset's sample key names (``...k<label>``)."""
    found = re.search(r"k(\d+)(\.\w+)?$", key)
    assert found, f"not a ledger sample key: {key!r}"
    return int(found.group(1))


class Ledger:
    """Appends the batches one process receives to ``directory``."""

    def __init__(self, directory: str | Path, run: str, *, kill_at: int = 0, kill_pid: int = 0):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.run = run
        # A fault: SIGKILL `kill_pid` (the sidecar) once this process has
        # recorded `kill_at` batches; the test restarts it.
        self.kill_at = kill_at
        self.kill_pid = kill_pid
        self.recorded = 0
        self._file = self.directory / f"{run}-{os.getpid()}.jsonl"

    def record(self, batch: Any, *, rank: int, epoch: int | None = None) -> None:
        """Records a batch: a ShardfeedDataset dict, or ``(images, labels)``
        with ``epoch`` given by the loop."""
        substituted: list[int] = []
        copies: list[int] = []
        if isinstance(batch, Mapping):
            images, labels = batch["images"], batch["labels"]
            epoch = int(batch["epoch"]) if epoch is None else epoch
            source_epochs = tuple(int(e) for e in batch["source_epochs"].tolist())
            mask = batch["substituted"].tolist()
            substituted = [slot for slot, taken in enumerate(mask) if taken]
            copies = [int(c) for c in batch["copies"].tolist()]
        else:
            images, labels = batch
            source_epochs = ()
        assert epoch is not None, "a tuple batch's epoch comes from the loop"
        labels_list = [int(v) for v in labels.tolist()]
        samples = list(labels_list)
        for slot in substituted:
            samples[slot] = label_of_key(batch["keys"][slot])
        # A batch of views: every group's pixels, in order.
        pixels = b"".join(
            group.cpu().contiguous().numpy().tobytes()
            for group in (images if isinstance(images, list) else [images])
        )
        digest = hashlib.blake2b(
            pixels + bytes(json.dumps(labels_list), "ascii"),
            digest_size=12,
        ).hexdigest()
        line = {
            "run": self.run,
            "rank": rank,
            "epoch": epoch,
            "labels": labels_list,
            "source_epochs": list(source_epochs) or [epoch] * len(labels_list),
            "digest": digest,
            "samples": samples,
            "substituted": [samples[slot] for slot in substituted],
            "copies": copies or [0] * len(labels_list),
        }
        with self._file.open("a") as out:
            out.write(json.dumps(line) + "\n")
        self.recorded += 1
        if self.kill_at and self.recorded == self.kill_at:
            os.kill(self.kill_pid, signal.SIGKILL)


def read(directory: str | Path, run: str) -> list[Delivery]:
    """Every batch a run's processes recorded, in each process's order."""
    out = []
    for path in sorted(Path(directory).glob(f"{run}-*.jsonl")):
        for line in path.read_text().splitlines():
            value = json.loads(line)
            out.append(
                Delivery(
                    value["run"],
                    value["rank"],
                    value["epoch"],
                    tuple(value["labels"]),
                    tuple(value["source_epochs"]),
                    value["digest"],
                    tuple(value["samples"]),
                    tuple(value["substituted"]),
                    tuple(value["copies"]),
                )
            )
    return out


@dataclass
class Verdict:
    """What the checks found: all zero but `samples` for a correct run."""

    samples: int = 0
    duplicates: int = 0
    losses: int = 0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.samples} samples checked, {self.duplicates} duplicates, "
            f"{self.losses} losses, {len(self.problems)} problems"
        )


@dataclass(frozen=True)
class Expected:
    """What a run should deliver: each source's labels, the ranks, the
    epochs, and whether each epoch is streamed whole (False where the idiom
    shortens epochs, e.g. ``limit_train_batches``)."""

    sources: Sequence[Sequence[int]]
    ranks: int
    epochs: int
    whole_epochs: bool = True
    batches_per_epoch: int | None = None
    # Samples whose images are corrupt: each substituted wherever it is
    # delivered, and no other sample substituted.
    corrupt: frozenset[int] = frozenset()
    # Copies of each sample an epoch (repeated augmentation): each
    # (sample, copy) exactly once.
    repeats: int = 1


def check(deliveries: Sequence[Delivery], expected: Expected) -> Verdict:
    verdict = Verdict()
    by_epoch: dict[int, list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        by_epoch[delivery.epoch].append(delivery)
        verdict.samples += len(delivery.labels)
    if sorted(by_epoch) != list(range(expected.epochs)):
        verdict.problems.append(f"epochs {sorted(by_epoch)}, expected 0..{expected.epochs - 1}")
    previous_order: list[int] | None = None
    for epoch in sorted(by_epoch):
        batches = by_epoch[epoch]
        per_rank = Counter(d.rank for d in batches)
        if sorted(per_rank) != list(range(expected.ranks)) or len(set(per_rank.values())) != 1:
            verdict.problems.append(f"epoch {epoch}: batches per rank {dict(per_rank)}")
        if expected.batches_per_epoch is not None and any(
            count != expected.batches_per_epoch for count in per_rank.values()
        ):
            verdict.problems.append(
                f"epoch {epoch}: {dict(per_rank)} batches, {expected.batches_per_epoch} expected"
            )
        order = [label for d in batches if d.rank == 0 for label in d.labels]
        if previous_order is not None and order == previous_order[: len(order)]:
            verdict.problems.append(f"epoch {epoch} replays the previous epoch's order")
        previous_order = order
    # Exactly once, per source and source-epoch (one dataset: the epoch).
    seen: dict[tuple[int, int], Counter[tuple[int, int]]] = defaultdict(Counter)
    substituted: dict[int, set[int]] = defaultdict(set)
    for delivery in deliveries:
        copies = delivery.copies or (0,) * len(delivery.samples)
        for label, source_epoch, copy in zip(delivery.samples, delivery.source_epochs, copies):
            if not 0 <= copy < expected.repeats:
                verdict.problems.append(f"sample {label}: copy {copy} of {expected.repeats}")
            seen[(label // SOURCE_LABELS, source_epoch)][(label, copy)] += 1
        substituted[delivery.epoch].update(delivery.substituted)
    for epoch in sorted(by_epoch):
        wrongly = substituted[epoch] - expected.corrupt
        if wrongly:
            verdict.problems.append(f"epoch {epoch}: sound samples substituted {sorted(wrongly)}")
        delivered = {label for d in by_epoch[epoch] for label in d.samples}
        unsubstituted = (expected.corrupt & delivered) - substituted[epoch]
        if unsubstituted:
            verdict.problems.append(
                f"epoch {epoch}: corrupt samples reached the model {sorted(unsubstituted)}"
            )
    for (source, source_epoch), counts in sorted(seen.items()):
        repeats = sum(count - 1 for count in counts.values())
        if repeats:
            verdict.duplicates += repeats
            verdict.problems.append(
                f"source {source} epoch {source_epoch}: {repeats} samples delivered twice"
            )
        # A source-epoch that a later one followed was streamed to its end.
        followed = (source, source_epoch + 1) in seen
        if expected.whole_epochs and (followed or len(expected.sources) == 1):
            every_copy = {
                (label, copy)
                for label in expected.sources[source]
                for copy in range(expected.repeats)
            }
            missing = every_copy - set(counts)
            if missing:
                verdict.losses += len(missing)
                verdict.problems.append(
                    f"source {source} epoch {source_epoch}: {len(missing)} samples never delivered"
                )
    return verdict


def same_batches(
    got: Iterable[Delivery], want: Iterable[Delivery], *, pixels: bool = True
) -> list[str]:
    """Where a run's batches differ from the uninterrupted run's, per rank:
    byte for byte, or (``pixels=False``, where which decoder a sample gets
    may move with timing, as under a tuned share) by the samples in them."""
    problems = []

    def per_rank(deliveries: Iterable[Delivery]) -> dict[int, list[tuple[int, Any]]]:
        out: dict[int, list[tuple[int, Any]]] = defaultdict(list)
        for d in deliveries:
            out[d.rank].append((d.epoch, d.digest if pixels else d.samples))
        return out

    got_ranks, want_ranks = per_rank(got), per_rank(want)
    for rank in sorted(set(got_ranks) | set(want_ranks)):
        a, b = got_ranks.get(rank, []), want_ranks.get(rank, [])
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            problems.append(
                f"rank {rank}: {len(a)} batches against {len(b)}, first difference at {first}"
            )
    return problems
