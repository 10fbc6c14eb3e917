"""The client's batched ops (``shardfeed.torch.ops``, what ``BatchDecoder``
applies after its resize) against the server: every golden vector the
Rust suite writes (``src/decode/augment/golden.rs``: an input, the
server's decisions and its output) is applied here, the cases of one op
and one augmentation together as one batch (so arguments differ from
sample to sample within a call, fast paths beside sampled ones), and each
output held to 35 dB of the server's. The table printed is the per-op
agreement the docs quote."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from shardfeed._ops import CLIENT_OPS
from shardfeed._torchvision import SERVER_ROWS
from shardfeed._wire import _batch_from_wire

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from shardfeed.torch.ops import ROWS, apply_decisions  # noqa: E402

from .test_ops_golden import _cases  # noqa: E402

TOLERANCE_DB = 35.0


def _psnr(ours: np.ndarray, theirs: np.ndarray) -> float:
    mse = float(np.mean((ours.astype(np.float64) - theirs.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _batches() -> dict[tuple[str, tuple[int, ...], bytes], list[Path]]:
    """Golden cases grouped by op category, size and the stream's
    augmentation: each group is one batch to the client's ops."""
    grouped: dict[tuple[str, tuple[int, ...], bytes], list[Path]] = defaultdict(list)
    for case in _cases():
        batch = _batch_from_wire(case.read_bytes())
        _, augmentation = batch.decisions or ((), None)
        settings = b"" if augmentation is None else augmentation.SerializeToString()
        category = case.stem.split("-", 1)[1]
        if augmentation is not None and not _client_mirrors(augmentation):
            continue  # a stream the sidecar decodes whatever the delivery
        grouped[(category, batch.images.shape[1:], settings)].append(case)
    return grouped


def _client_mirrors(augmentation: object) -> bool:
    """Whether the client's decoder applies every op the stream runs (else
    the server decodes all of its samples: ``Ops::client_replays``)."""
    rows = set(SERVER_ROWS.values())
    running = {field.name for field, _ in augmentation.ListFields()} & rows  # type: ignore[attr-defined]
    return running <= set(CLIENT_OPS)


def test_the_client_applies_every_op_within_35_db_of_the_server() -> None:
    table: dict[str, list[float]] = defaultdict(list)
    failures = []
    for (category, shape, _), cases in _batches().items():
        height, width = shape[:2]
        batches = [_batch_from_wire(case.read_bytes()) for case in cases]
        inputs = np.stack(
            [
                np.fromfile(case.with_suffix(".input"), dtype=np.uint8).reshape(height, width, 3)
                for case in cases
            ]
        )
        images = torch.from_numpy(inputs.copy())
        crops = [b.decisions[0][0] for b in batches]  # type: ignore[index]
        # The flip is the resize's: these cases draw none.
        assert not any(crop.flipped for crop in crops)
        apply_decisions(images, range(len(cases)), crops, batches[0].decisions[1])  # type: ignore[index]
        for case, batch, ours in zip(cases, batches, images.numpy()):
            quality = _psnr(ours, batch.images[0])
            table[category].append(quality)
            if quality < TOLERANCE_DB:
                failures.append(f"{case.name}: {quality:.1f} dB")
    print("\nclient ops against the server (batched, min over cases):")
    print(f"{'op':40} {'cases':>5} {'PSNR dB':>8}")
    for category, rows in sorted(table.items()):
        print(f"{category:40} {len(rows):5} {min(rows):8.1f}")
    assert not failures, "\n".join(failures)


def test_a_batch_gives_each_sample_what_it_gives_it_alone() -> None:
    """Batching is only a grouping: the recipes' samples applied one at a
    time come out as they do together."""
    for (category, shape, _), cases in _batches().items():
        if not category.startswith("Recipe"):
            continue
        height, width = shape[:2]
        batches = [_batch_from_wire(case.read_bytes()) for case in cases]
        inputs = torch.from_numpy(
            np.stack(
                [
                    np.fromfile(c.with_suffix(".input"), dtype=np.uint8).reshape(height, width, 3)
                    for c in cases
                ]
            )
        )
        crops = [b.decisions[0][0] for b in batches]  # type: ignore[index]
        augmentation = batches[0].decisions[1]  # type: ignore[index]
        together = inputs.clone()
        apply_decisions(together, range(len(cases)), crops, augmentation)
        for slot in range(len(cases)):
            alone = inputs[slot : slot + 1].clone()
            apply_decisions(alone, [0], [crops[slot]], augmentation)
            assert torch.equal(alone[0], together[slot]), (category, slot)


def test_the_client_names_the_rows_it_applies() -> None:
    assert {row.NAME for row in ROWS} | {"horizontal_flip"} == set(CLIENT_OPS)


def test_only_the_named_slots_change() -> None:
    cases = [c for c in _cases() if "RecipeTrivialAugment" in c.name][:4]
    batches = [_batch_from_wire(c.read_bytes()) for c in cases]
    images = torch.zeros((6, 224, 224, 3), dtype=torch.uint8) + 77
    crops = [batches[0].decisions[0][0]] * 6  # type: ignore[index]
    apply_decisions(images, [1, 4], crops, batches[0].decisions[1])  # type: ignore[index]
    for slot in (0, 2, 3, 5):
        assert bool((images[slot] == 77).all())
