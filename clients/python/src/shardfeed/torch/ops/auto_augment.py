"""The auto-augment policies' ops (TrivialAugmentWide, RandAugment,
AutoAugment), as the server reports them: per sample, a list of steps,
each an op and its signed magnitude. Step ``k`` of every sample runs
before step ``k + 1`` of any, each op once over the samples that drew it,
with torchvision's arguments for it (``shardfeed._ops`` names the same
calls for a replay with torchvision itself)."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

from ..._proto import shardfeed_pb2 as pb
from . import _colour, _geometry
from ._batched import Kernel, run_stage

NAME = "auto_augment"


def _parameterless(function: Any) -> Kernel:
    return lambda images, _: function(images)


def _kernels(bilinear: bool, fill: list[float] | None) -> dict[Any, Kernel]:
    return {
        pb.POLICY_OP_SHEAR_X: partial(_geometry.shear, axis=0, bilinear=bilinear, fill=fill),
        pb.POLICY_OP_SHEAR_Y: partial(_geometry.shear, axis=1, bilinear=bilinear, fill=fill),
        pb.POLICY_OP_TRANSLATE_X: partial(
            _geometry.translate, axis=0, bilinear=bilinear, fill=fill
        ),
        pb.POLICY_OP_TRANSLATE_Y: partial(
            _geometry.translate, axis=1, bilinear=bilinear, fill=fill
        ),
        pb.POLICY_OP_ROTATE: partial(_geometry.rotate, bilinear=bilinear, fill=fill),
        pb.POLICY_OP_BRIGHTNESS: lambda images, m: _colour.brightness(images, 1.0 + m),
        pb.POLICY_OP_COLOR: lambda images, m: _colour.saturation(images, 1.0 + m),
        pb.POLICY_OP_CONTRAST: lambda images, m: _colour.contrast(images, 1.0 + m),
        pb.POLICY_OP_SHARPNESS: lambda images, m: _colour.sharpness(images, 1.0 + m),
        pb.POLICY_OP_POSTERIZE: _colour.posterize,
        pb.POLICY_OP_SOLARIZE: lambda images, m: _colour.solarize(images, 255.0 * m),
        pb.POLICY_OP_AUTO_CONTRAST: _parameterless(F.autocontrast),
        pb.POLICY_OP_EQUALIZE: _parameterless(F.equalize),
        pb.POLICY_OP_INVERT: _parameterless(F.invert),
    }


def apply(images: torch.Tensor, crops: Any, augmentation: Any) -> None:
    if not augmentation.HasField("auto_augment"):
        return
    settings = augmentation.auto_augment
    kernels = _kernels(
        settings.interpolation == pb.INTERPOLATION_BILINEAR,
        [float(level) for level in settings.fill] or None,
    )
    for step in range(max((len(crop.policy) for crop in crops), default=0)):
        drawn = [crop.policy[step] if step < len(crop.policy) else None for crop in crops]
        kinds = [None if d is None else d.op for d in drawn]
        magnitudes = np.array([0.0 if d is None else d.magnitude for d in drawn])
        run_stage(images, kinds, magnitudes, kernels)
