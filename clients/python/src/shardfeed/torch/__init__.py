"""PyTorch adapter: a shardfeed stream as a resumable ``IterableDataset``.

shardfeed already shuffles, decodes, augments and batches in the sidecar, so
the dataset yields whole batches: use ``DataLoader(ds, batch_size=None)``
with ``num_workers=0`` (the default). See :class:`ShardfeedDataset`.

The package's parts: ``_dataset`` (the ``IterableDataset`` surface),
``_arguments`` (its arguments, checked when it is made), ``_progress``
(its epoch and position, a mix's weights, and the checkpoint state made of
them), ``_ranks`` (its rank and an epoch's steps), ``shardfeed._epochs``
(which epoch each pass streams, and the page DataLoader workers agree
through: pure, tested without torch), ``_output`` (what it yields),
``_delivery`` (its streams' delivery options), ``_device`` (the tensors
where training wants them: decoded here for encoded deliveries, copied on a
side stream on CUDA), ``_model_input`` (the batch as a model takes it:
normalized, of its dtype, mixed), and ``_frameworks`` (what the dataset
must know of how frameworks iterate it).
"""

from ._dataset import MAX_FETCH_AHEAD, BatchDict, ShardfeedDataset
from ._model_input import Mixing, ModelInput, draw_mixing, model_batch, to_model

__all__ = [
    "MAX_FETCH_AHEAD",
    "BatchDict",
    "Mixing",
    "ModelInput",
    "ShardfeedDataset",
    "draw_mixing",
    "model_batch",
    "to_model",
]
