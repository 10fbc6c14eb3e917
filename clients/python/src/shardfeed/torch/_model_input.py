"""The batch as a model takes it: normalized, of the model's dtype, NCHW,
and mixed (MixUp or CutMix) with float targets.

torchvision v2's semantics: one λ ~ Beta(α, α) per batch, each sample
mixed with the one before it (``roll(1)``: sample i with i - 1), CutMix's
box centred uniformly with sides ``W·sqrt(1 - λ)`` and ``H·sqrt(1 - λ)``
clipped to the image and λ recomputed from the clipped area; a choice
between the two with probability ``switch_prob`` of CutMix (timm's
``mixup_switch_prob``); label smoothing spreads ``ε`` over the classes
before mixing. Every draw comes from (seed, epoch, rank, batch index), so
a resumed run mixes the same batches the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._wire import Batch
from ._device import materialize

# Separates the mixing draws from every other use of the same numbers.
_PURPOSE_MIX = 0x6D6978


@dataclass(frozen=True)
class Mixing:
    """MixUp (``mixup_alpha``) and/or CutMix (``cutmix_alpha``) over a
    batch, with ``num_classes`` float targets; 0 turns either off."""

    num_classes: int
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    switch_prob: float = 0.5
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, not {self.num_classes}")
        for name in ("mixup_alpha", "cutmix_alpha"):
            alpha = getattr(self, name)
            if not (alpha >= 0 and math.isfinite(alpha)):
                raise ValueError(f"{name} must be >= 0, not {alpha}")
        if self.mixup_alpha == 0 and self.cutmix_alpha == 0:
            raise ValueError("mixup_alpha or cutmix_alpha must be > 0")
        if not 0 <= self.switch_prob <= 1:
            raise ValueError(f"switch_prob must be a probability, not {self.switch_prob}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), not {self.label_smoothing}")


@dataclass(frozen=True)
class ModelInput:
    """What happens to a batch between the sidecar and the model."""

    normalize: tuple[Sequence[float], Sequence[float]] | None = None
    dtype: torch.dtype | None = None
    mixing: Mixing | None = None
    # Whether the float conversion divides by 255 (torchvision's
    # ToDtype(scale=True), ToTensor); False: the levels stay 0 to 255
    # (ToDtype(float32) alone). None: divided where normalized (normalize
    # is in [0, 1] units), levels otherwise.
    to_unit_range: bool | None = None

    def __post_init__(self) -> None:
        if self.normalize is not None:
            mean, std = self.normalize
            if len(mean) != 3 or len(std) != 3:
                raise ValueError(f"normalize takes three means and three stds, not {mean}, {std}")
            if any(not s > 0 for s in std):
                raise ValueError(f"normalize's std must be positive, not {std}")
        if self.dtype is not None and self.dtype not in (
            torch.float32,
            torch.float16,
            torch.bfloat16,
        ):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, not {self.dtype}")

    @classmethod
    def of(
        cls,
        augment: Any,
        mixing: Mixing | None = None,
        *,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        dtype: torch.dtype | None = None,
    ) -> ModelInput:
        """What ``augment`` (from :func:`shardfeed.from_torchvision`) has
        the trainer make of a batch: its Normalize, dtype and scaling,
        ``normalize`` and ``dtype`` taking their place where given; any
        other ``augment`` brings nothing."""
        return cls(
            normalize if normalize is not None else getattr(augment, "normalize", None),
            dtype if dtype is not None else getattr(augment, "dtype", None),
            mixing,
            to_unit_range=getattr(augment, "to_unit_range", None),
        )

    @property
    def active(self) -> bool:
        return self.normalize is not None or self.dtype is not None or self.mixing is not None


def to_model(
    images: torch.Tensor,
    labels: torch.Tensor,
    spec: ModelInput,
    key: tuple[int, int, int, int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``images`` (uint8 ``(N, H, W, 3)``) as NCHW of the spec's dtype, in
    one pass where normalized (``x / 255 - mean) / std`` as
    ``x · scale + bias``; without the 255 where ``to_unit_range`` is
    False), then mixed; ``labels`` as float targets when mixed. ``key``:
    (seed, epoch, rank, batch index)."""
    dtype = spec.dtype or torch.float32
    nchw = images.permute(0, 3, 1, 2)
    out = torch.empty(nchw.shape, dtype=dtype, device=images.device)
    scaled = spec.to_unit_range
    if scaled is None:
        scaled = spec.normalize is not None
    unit = 255.0 if scaled else 1.0
    if spec.normalize is not None:
        mean, std = (
            torch.tensor(v, dtype=torch.float32, device=images.device) for v in spec.normalize
        )
        scale = (1.0 / (unit * std)).view(1, 3, 1, 1)
        bias = (-mean / std).view(1, 3, 1, 1)
        # One read of the uint8 pixels, one write of the output.
        torch.addcmul(bias, nchw, scale, out=out)
    elif scaled:
        # As ToDtype(scale=True): the levels times 1/255, rounded once.
        torch.mul(nchw, 1.0 / unit, out=out)
    else:
        out.copy_(nchw)
    if spec.mixing is None:
        return out, labels
    return mix(out, labels, spec.mixing, key)


def model_batch(
    batch: Batch,
    spec: ModelInput,
    *,
    seed: int,
    rank: int,
    device: str | torch.device | None = None,
    decoder: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A :class:`shardfeed.Client` batch as the model takes it, on
    ``device``: what :class:`ShardfeedDataset` yields for ``spec``, with
    the same mixing draws (keyed by ``seed``, the batch's epoch, ``rank``
    and its step in the epoch), so a loop over ``Client.batches`` and the
    dataset train on the same inputs. An encoded batch
    (``delivery="encoded"``) is decoded by ``decoder``, a
    :class:`shardfeed.decode.BatchDecoder` on the device wanted."""
    if batch.views:
        raise ValueError(
            "model_batch takes a batch of one output; a batch of views is one tensor per "
            "group (ShardfeedDataset(views=...) makes each as its group's transforms say)"
        )
    if batch.encoded is not None and decoder is None:
        raise ValueError(
            "the batch was delivered encoded: pass decoder=BatchDecoder(device) to decode it"
        )
    delivered = materialize(batch, decoder)
    images, labels = delivered.images, delivered.labels
    assert isinstance(images, torch.Tensor)  # a batch of one output (checked above)
    if device is not None:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
    step = sum(batches for _, batches in batch.position.segments) - 1
    return to_model(images, labels, spec, (seed, batch.epoch, rank, step))


def _generator(key: tuple[int, int, int, int]) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([*key, _PURPOSE_MIX])))


def draw_mixing(
    mixing: Mixing, key: tuple[int, int, int, int], size: tuple[int, int]
) -> tuple[str, float, tuple[int, int, int, int] | None]:
    """What a batch of ``(H, W)`` images at ``key`` is mixed with:
    ("cutmix", λ of the clipped box, (x1, y1, x2, y2)) or ("mixup", λ,
    None)."""
    rng = _generator(key)
    use_cutmix = mixing.cutmix_alpha > 0 and (
        mixing.mixup_alpha == 0 or rng.random() < mixing.switch_prob
    )
    alpha = mixing.cutmix_alpha if use_cutmix else mixing.mixup_alpha
    lam = float(rng.beta(alpha, alpha))
    if not use_cutmix:
        return "mixup", lam, None
    height, width = size
    center_x, center_y = int(rng.integers(0, width)), int(rng.integers(0, height))
    ratio = math.sqrt(1.0 - lam)
    half_w, half_h = int(ratio * width / 2), int(ratio * height / 2)
    box = (
        max(center_x - half_w, 0),
        max(center_y - half_h, 0),
        min(center_x + half_w, width),
        min(center_y + half_h, height),
    )
    area = (box[2] - box[0]) * (box[3] - box[1])
    return "cutmix", 1.0 - area / (width * height), box


def mix(
    images: torch.Tensor, labels: torch.Tensor, mixing: Mixing, key: tuple[int, int, int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """MixUp or CutMix of a float NCHW batch, in place; float targets."""
    kind, lam, box = draw_mixing(mixing, key, (images.shape[-2], images.shape[-1]))
    smooth = mixing.label_smoothing
    targets = torch.nn.functional.one_hot(labels.long(), mixing.num_classes).to(torch.float32)
    targets = targets * (1.0 - smooth) + smooth / mixing.num_classes
    partner = images.roll(1, 0)
    if box is not None:
        x1, y1, x2, y2 = box
        images[..., y1:y2, x1:x2] = partner[..., y1:y2, x1:x2]
    else:
        images.mul_(lam).add_(partner, alpha=1.0 - lam)
    targets = targets * lam + targets.roll(1, 0) * (1.0 - lam)
    return images, targets.to(images.device)
