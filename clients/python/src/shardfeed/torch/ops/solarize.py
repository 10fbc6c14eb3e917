"""RandomSolarize: the samples whose coin came up, every level at or above
the threshold inverted (torchvision's ``solarize``). The server sends a
sample it solarized only at a threshold that keeps levels a level apart
(128, the recipes'); at any other it decodes the sample itself, since a
level's difference between two decoders would there become up to 255
(``OutputSpec::decoded_by_server_alone``)."""

from __future__ import annotations

from typing import Any

import torch
from torchvision.transforms.v2 import functional as F

NAME = "solarize"


def apply(images: torch.Tensor, crops: Any, augmentation: Any) -> None:
    rows = [row for row, crop in enumerate(crops) if crop.solarized]
    if rows:
        index = torch.tensor(rows, dtype=torch.long, device=images.device)
        threshold = float(augmentation.solarize.threshold)
        images[index] = F.solarize(images[index], threshold=threshold)
