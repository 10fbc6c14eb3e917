"""The batch as a model takes it: one-pass normalize to the model's dtype,
and torchvision v2's MixUp / CutMix with draws keyed by the batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from shardfeed.torch import Mixing, ModelInput, draw_mixing, to_model  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _batch(n: int = 8, size: int = 16) -> Any:
    rng = np.random.default_rng(3)
    return torch.from_numpy(rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_normalize_matches_torchvision_in_the_models_dtype(dtype: Any) -> None:
    from torchvision.transforms.v2 import functional as F

    images = _batch()
    out, labels = to_model(images, torch.arange(8), ModelInput((MEAN, STD), dtype), (0, 0, 0, 0))
    reference = F.normalize(
        F.to_dtype(images.permute(0, 3, 1, 2), torch.float32, scale=True), MEAN, STD
    )
    assert out.dtype == dtype and out.is_contiguous() and out.shape == (8, 3, 16, 16)
    tolerance = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    assert (out.float() - reference).abs().max() <= tolerance
    assert torch.equal(labels, torch.arange(8))


def test_mixup_and_cutmix_follow_torchvision_v2() -> None:
    images = _batch().permute(0, 3, 1, 2).float()
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    seen = set()
    for step in range(40):
        key = (7, 1, 0, step)
        mixing = Mixing(num_classes=4, mixup_alpha=0.2, cutmix_alpha=1.0, label_smoothing=0.1)
        kind, lam, box = draw_mixing(mixing, key, (16, 16))
        seen.add(kind)
        out, targets = to_model(
            images.permute(0, 2, 3, 1).to(torch.uint8), labels, ModelInput(mixing=mixing), key
        )
        source = images.to(torch.uint8).float()
        partner = source.roll(1, 0)
        if kind == "mixup":
            expected = lam * source + (1 - lam) * partner
        else:
            x1, y1, x2, y2 = box
            expected = source.clone()
            expected[..., y1:y2, x1:x2] = partner[..., y1:y2, x1:x2]
            assert lam == pytest.approx(1 - (x2 - x1) * (y2 - y1) / 256)
        assert torch.allclose(out, expected, atol=1e-4)
        smooth = torch.nn.functional.one_hot(labels, 4).float() * 0.9 + 0.025
        assert torch.allclose(targets, lam * smooth + (1 - lam) * smooth.roll(1, 0))
        assert torch.allclose(targets.sum(1), torch.ones(8))
        # The same key draws the same again (a resumed run mixes alike).
        assert draw_mixing(mixing, key, (16, 16)) == (kind, lam, box)
    assert seen == {"mixup", "cutmix"}


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="mixup_alpha or cutmix_alpha"):
        Mixing(10)
    with pytest.raises(ValueError, match="switch_prob"):
        Mixing(10, 0.2, switch_prob=2.0)
    with pytest.raises(ValueError, match="std"):
        ModelInput(normalize=(MEAN, (0.2, 0.0, 0.2)))
    with pytest.raises(ValueError, match="dtype"):
        ModelInput(dtype=torch.int32)
