"""The server's augmentation against torchvision's kernels: every golden
vector the Rust suite writes (``src/decode/augment/golden.rs``: an input,
the server's decisions and output as a one-sample ``Batch``) is parsed by
the client, its ``Batch.ops`` replayed with
``torchvision.transforms.v2.functional`` on the input (timm's RandAugment
ops with ``timm.data.auto_augment``'s functions on PIL images), and the two outputs
held to the bounds of the recipes issue: colour ops >= 99.9% of values
within one level; geometric ops >= 99% equal with nearest sampling and
>= 40 dB with bilinear; whole recipes (several ops chained) >= 99% within
one level and >= 40 dB."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from shardfeed._ops import replay
from shardfeed._wire import _batch_from_wire

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

REPO = Path(__file__).resolve().parents[4]
GOLDEN = Path(os.environ.get("SHARDFEED_AUGMENT_GOLDEN", REPO / "target" / "augment-golden"))

GEOMETRIC = (
    "TimmRotate",
    "TimmShearX",
    "TimmShearY",
    "TimmTranslateXRel",
    "TimmTranslateYRel",
    "TimmTranslateX",
    "TimmTranslateY",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "RandomRotation",
    "RandomAffine",
)


def _cases() -> list[Path]:
    cases = sorted(GOLDEN.glob("*.batch"))
    assert cases, (
        f"no golden vectors in {GOLDEN}: `cargo test --lib decode::augment` writes them "
        "(tests/run_all.sh runs it first)"
    )
    return cases


def _agreement(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, float, float]:
    """Fractions equal and within one level, and the PSNR in dB."""
    diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    mse = float(np.mean(diff.astype(np.float64) ** 2))
    psnr = math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
    return float(np.mean(diff == 0)), float(np.mean(diff <= 1)), psnr


def _replayed(case: Path) -> tuple[str, np.ndarray, np.ndarray, list[str]]:
    batch = _batch_from_wire(case.read_bytes())
    height, width = batch.images.shape[1:3]
    source = np.fromfile(case.with_suffix(".input"), dtype=np.uint8).reshape(height, width, 3)
    image = torch.from_numpy(source.copy()).permute(2, 0, 1).contiguous()
    ops = batch.ops[0]
    theirs = replay(image, ops).permute(1, 2, 0).numpy()
    category = case.stem.split("-", 1)[1]
    return category, batch.images[0], theirs, [name for name, _ in ops]


def test_every_golden_vector_replays_with_torchvision() -> None:
    table: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    failures = []
    for case in _cases():
        category, ours, theirs, names = _replayed(case)
        equal, within_one, psnr = _agreement(ours, theirs)
        table[category].append((equal, within_one, psnr))
        op = category.split("-")[0]
        if op.startswith("Recipe"):
            # Chained ops: a level one op rounds apart can grow in the next
            # (a contrast of 1.7 doubles it), so a chain is held to PSNR.
            ok = within_one >= 0.99 and psnr >= 40.0
        elif op in GEOMETRIC and "Bilinear" in category:
            ok = psnr >= 40.0
        elif op in GEOMETRIC:
            ok = equal >= 0.99
        else:
            ok = within_one >= 0.999
        if not ok:
            failures.append(
                f"{case.name} {names}: equal {equal:.4f}, <=1 {within_one:.4f}, {psnr:.1f} dB"
            )
    print("\nper-op agreement with torchvision (min over cases):")
    print(f"{'op':40} {'cases':>5} {'equal':>8} {'<=1 lvl':>8} {'PSNR dB':>8}")
    for category, rows in sorted(table.items()):
        equal = min(r[0] for r in rows)
        within = min(r[1] for r in rows)
        psnr = min(r[2] for r in rows)
        print(f"{category:40} {len(rows):5} {equal:8.4f} {within:8.4f} {psnr:8.1f}")
    assert not failures, "\n".join(failures)


def test_ops_name_torchvision_functions_in_table_order() -> None:
    from torchvision.transforms.v2 import functional as F

    seen = set()
    for case in _cases():
        batch = _batch_from_wire(case.read_bytes())
        for name, _ in batch.ops[0]:
            if name.startswith("timm."):
                from timm.data import auto_augment

                assert callable(getattr(auto_augment, name.removeprefix("timm."))), name
            else:
                assert hasattr(F, name), name
            seen.add(name)
    for name in (
        "affine",
        "rotate",
        "adjust_hue",
        "equalize",
        "erase",
        "rgb_to_grayscale",
        "timm.rotate",
        "timm.solarize_add",
    ):
        assert name in seen, name
