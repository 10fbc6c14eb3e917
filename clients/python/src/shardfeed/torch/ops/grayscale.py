"""RandomGrayscale: the samples whose coin came up, to three equal
channels of their ITU-R 601 grey (torchvision's ``rgb_to_grayscale``,
which takes a batch as it is)."""

from __future__ import annotations

from typing import Any

import torch
from torchvision.transforms.v2 import functional as F

NAME = "grayscale"


def apply(images: torch.Tensor, crops: Any, augmentation: Any) -> None:
    del augmentation
    rows = [row for row, crop in enumerate(crops) if crop.grayscale]
    if rows:
        index = torch.tensor(rows, dtype=torch.long, device=images.device)
        images[index] = F.rgb_to_grayscale(images[index], num_output_channels=3)
