"""Decoding encoded deliveries in the trainer's process, on CPU or GPU.

With ``delivery="encoded"`` the server still reads, shuffles, partitions,
checks every image's headers and decides its crop box and flip; baseline
JPEGs arrive compressed. :class:`BatchDecoder` finishes them as the server
would have: each sample decoded by its form's decoder (``_modes.py``; a
JPEG by torchvision's ``decode_jpeg``, batched: nvJPEG with
``device="cuda"``, libjpeg-turbo on CPU), then the box cropped and resized
with the server's filter and the flip applied, on the same device; then
the ops the server decided after the flip (``shardfeed.torch.ops``: the
auto-augment policies, ColorJitter, RandomGrayscale, RandomErasing), over
the whole batch with each sample's arguments.

The resize is the server's to the arithmetic: a separable triangle
(bilinear) filter whose support widens with the downscale factor, so it
antialiases, with pixels just outside the box feeding its edges (Pillow's
``resize(box=...)``, fast_image_resize's convolution). On a GPU it runs
per batch: the weights of every image built on the device in one go, the
windows the filter reads padded into one tensor, one pair of batched
matrix products in Pillow's fixed point, exact in float64, so an image's
pixels do not depend on its batch (``_resize.py`` states why, and the
memory bound). On CPU, where a dense product costs far more than the
filter's taps, Pillow applies the same filter image by image. Outputs
differ from the server's by a level or two where rounding does. What
differs more is the IDCT: a server built with libjpeg-turbo decodes large
images at a reduced DCT scale, and nvJPEG's IDCT is its own.
The stated tolerance is PSNR >= 35 dB per sample against the server's
decode of the same request (tests/e2e/test_encoded.py checks it).

A JPEG the decoder refuses is substituted by the server's rule (a copy of
the batch's sample picked by a hash of the failed key among those that
decoded), counted, and reported to the server with
:meth:`shardfeed.Client.report_client_decodes` so its metrics stay whole.
"""

from ._resize import crop_resize
from .torch._decode import BatchDecoder, ClientDecoded, substitute_source

__all__ = ["BatchDecoder", "ClientDecoded", "crop_resize", "substitute_source"]
