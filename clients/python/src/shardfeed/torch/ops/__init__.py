"""The ops after the crop, applied where the trainer decodes
(``decode="client"``/``"gpu"``): the server's decisions, reported per
sample in ``Batch.crops``, replayed on the decoder's device over the
whole batch at once, each op a kernel with an argument per sample.

One file per row of the server's op table (``src/decode/augment/ops/``),
named by the row (``auto_augment``, ``color_jitter``, ``grayscale``,
``gaussian_blur``, ``solarize``, ``random_erasing``) and applied in the
order ``shardfeed._ops.CLIENT_OPS`` names them, the table's; the flip, its
first row, is part of the resize (``shardfeed._resize``, which also makes
the bicubic resize the client names in ``CLIENT_RESIZES``). A new op's
mirror is its file here and its name in ``CLIENT_OPS``. ``_colour`` and
``_geometry`` hold the kernels the rows share, ``_batched`` the grouping.
Each kernel follows torchvision's tensor kernel on ``uint8``, so the
output is the server's within a level or two where they round apart
(``tests/unit/test_client_ops.py`` holds every op to 35 dB against the
server's golden vectors).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch

from ..._ops import CLIENT_OPS

__all__ = ["ROWS", "apply_decisions"]

# The flip is the resize's; every other row is the module of its name.
ROWS = tuple(
    importlib.import_module(f".{name}", __name__)
    for name in CLIENT_OPS
    if name != "horizontal_flip"
)


def apply_decisions(
    images: torch.Tensor, slots: Sequence[int], crops: Any, augmentation: Any
) -> None:
    """Applies the reported ops to ``images[slots]`` in place: ``images``
    ``uint8`` ``(N, H, W, 3)``, ``crops`` the batch's ``CropBox`` messages
    and ``augmentation`` its ``Augmentation`` (None: no ops past the flip,
    which the resize applied)."""
    if augmentation is None or not slots:
        return
    index = torch.tensor(list(slots), dtype=torch.long, device=images.device)
    planar = images[index].permute(0, 3, 1, 2).contiguous()
    chosen = [crops[slot] for slot in slots]
    for row in ROWS:
        row.apply(planar, chosen, augmentation)
    images[index] = planar.permute(0, 2, 3, 1)
