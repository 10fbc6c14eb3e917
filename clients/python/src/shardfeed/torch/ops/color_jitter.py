"""ColorJitter as the server reports it: per sample, the factors in the
order that sample drew (torchvision's random order), each step run over
the samples that drew that op at that step."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..._proto import shardfeed_pb2 as pb
from . import _colour
from ._batched import Kernel, run_stage

NAME = "color_jitter"

_KERNELS: dict[Any, Kernel] = {
    pb.JITTER_OP_BRIGHTNESS: _colour.brightness,
    pb.JITTER_OP_CONTRAST: _colour.contrast,
    pb.JITTER_OP_SATURATION: _colour.saturation,
    pb.JITTER_OP_HUE: _colour.hue,
}


def apply(images: torch.Tensor, crops: Any, augmentation: Any) -> None:
    del augmentation  # the factors are each sample's own
    for step in range(max((len(crop.jitter) for crop in crops), default=0)):
        drawn = [crop.jitter[step] if step < len(crop.jitter) else None for crop in crops]
        kinds = [None if d is None else d.op for d in drawn]
        factors = np.array([0.0 if d is None else d.factor for d in drawn])
        run_stage(images, kinds, factors, _KERNELS)
