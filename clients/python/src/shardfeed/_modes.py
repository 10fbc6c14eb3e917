"""The client's side of each delivery: a mode's name and wire value, and for
each form a sample's bytes can take, the decoder that turns it into source
pixels.

A delivery where the client decodes sends some samples in a client form
(``EncodedSample.form``); whatever the form, the client then crops to the
sample's box, resizes and flips alike (``decode.py``), and substitutes and
reports its failures alike. So a new mode touches this file (its name, and
its form's decoder if its bytes are a new form), its server side
(``src/pipeline/encoded/modes/``) and its values in ``shardfeed.proto``.

This module imports without torch: the options name the modes; the
decoders import torchvision when a decoder is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from ._proto import shardfeed_pb2 as pb

if TYPE_CHECKING:
    import torch

DeliveryMode = Literal["decoded", "encoded"]

# Each mode by the name ``delivery=`` takes.
DELIVERY_VALUES: dict[str, int] = {
    "decoded": pb.DELIVERY_DECODED,
    # Baseline JPEGs as their compressed bytes.
    "encoded": pb.DELIVERY_ENCODED,
}

# The mode a dataset that decodes here (``decode="client"`` or ``"gpu"``)
# asks for when its options leave delivery decoded.
CLIENT_DEFAULT: DeliveryMode = "encoded"

# Decodes a batch's samples of one form on a device: each its source pixels
# (uint8, channels first, RGB) or None with what the decoder said.
FormDecoder = Callable[
    [list[npt.NDArray[np.uint8]]], tuple[list["torch.Tensor | None"], list["str | None"]]
]


def _jpeg_decoder(device: torch.device) -> FormDecoder:
    """torchvision's ``decode_jpeg``: nvJPEG on a CUDA device, libjpeg-turbo
    on CPU; batched, and one by one to find which failed when the batched
    call does."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(
        datas: list[npt.NDArray[np.uint8]],
    ) -> tuple[list[torch.Tensor | None], list[str | None]]:
        if not datas:
            return [], []
        tensors = [torch.from_numpy(data) for data in datas]
        try:
            images = decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)
            return list(images), [None] * len(tensors)
        except RuntimeError:
            pass
        results: list[torch.Tensor | None] = []
        errors: list[str | None] = []
        for tensor in tensors:
            try:
                results.append(decode_jpeg(tensor, mode=ImageReadMode.RGB, device=device))
                errors.append(None)
            except RuntimeError as exc:
                results.append(None)
                errors.append(str(exc).splitlines()[0][:200] or type(exc).__name__)
        return results, errors

    return decode


# Each client form's decoder, built once per BatchDecoder for its device.
FORM_DECODERS: dict[int, Callable[[torch.device], FormDecoder]] = {
    pb.SAMPLE_FORM_JPEG: _jpeg_decoder,
}


def form_name(form: int) -> str:
    """A form's wire name, or its number when this client does not know it."""
    try:
        return str(pb.SampleForm.Name(form))
    except ValueError:
        return f"form {form}"


def decode_forms(
    decoders: Mapping[int, FormDecoder], forms: list[int], datas: list[npt.NDArray[np.uint8]]
) -> tuple[list[torch.Tensor | None], list[str | None]]:
    """Decodes each sample (``datas[i]``, in form ``forms[i]``) with its
    form's decoder, one batched call per form; a form with no decoder here
    fails its samples (they are substituted and reported like any failure)."""
    images: list[torch.Tensor | None] = [None] * len(datas)
    errors: list[str | None] = [None] * len(datas)
    by_form: dict[int, list[int]] = {}
    for index, form in enumerate(forms):
        by_form.setdefault(form, []).append(index)
    for form, indices in by_form.items():
        decoder = decoders.get(form)
        if decoder is None:
            for index in indices:
                errors[index] = f"{form_name(form)}: this client has no decoder for it"
            continue
        got, why = decoder([datas[index] for index in indices])
        for index, image, error in zip(indices, got, why):
            images[index], errors[index] = image, error
    return images, errors
