"""What the ops here share: a stage's samples grouped by what they drew,
so that each kernel runs once a batch over the samples that drew it, with
each sample's own arguments, and no Python step runs per sample on the
device."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
import torch

Kernel = Callable[[torch.Tensor, npt.NDArray[np.float64]], torch.Tensor]


def groups(kinds: Sequence[Hashable | None]) -> Iterator[tuple[Hashable, list[int]]]:
    """The rows of each kind, in first-seen order; None (nothing drawn at
    this stage) is left out."""
    rows: dict[Hashable, list[int]] = {}
    for row, kind in enumerate(kinds):
        if kind is not None:
            rows.setdefault(kind, []).append(row)
    yield from rows.items()


# On CPU an op runs over this many of its samples a call: a sample's
# float32 working set is ~0.6 MB at 224x224, so a few stay in cache
# through the kernel's steps, where a whole group's would stream through
# memory at each (a whole batch of ColorJitter ran 1.5x slower than
# torchvision sample by sample). On a GPU each group is one launch.
CPU_CHUNK = 4


def chunks(rows: Sequence[int], device: torch.device) -> Iterator[list[int]]:
    """``rows`` whole on a GPU, a few at a time on CPU."""
    step = CPU_CHUNK if device.type == "cpu" else max(len(rows), 1)
    for start in range(0, len(rows), step):
        yield list(rows[start : start + step])


def run_stage(
    images: torch.Tensor,
    kinds: Sequence[Hashable | None],
    arguments: npt.NDArray[np.float64],
    kernels: dict[Hashable, Kernel],
) -> None:
    """Applies, in place on ``images`` ``(N, 3, H, W)``, each row's kernel
    (``kernels[kinds[row]]``; kinds without one are the identity) with its
    argument."""
    for kind, rows in groups(kinds):
        kernel = kernels.get(kind)
        if kernel is None:
            continue
        for part in chunks(rows, images.device):
            index = torch.tensor(part, dtype=torch.long, device=images.device)
            images[index] = kernel(images[index], arguments[part])


def per_sample(values: npt.NDArray[np.float64], like: torch.Tensor) -> torch.Tensor:
    """One float32 value per sample, shaped to broadcast over ``like``'s
    ``(N, C, H, W)``."""
    return torch.as_tensor(values, dtype=torch.float32, device=like.device).view(-1, 1, 1, 1)
