"""How a dataset's streams ask for their images: decoded or encoded, the
server's decode share, and the share's search carried from one stream (an
epoch's) to the next."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from .._modes import CLIENT_DEFAULT
from .._options import StreamOptions
from .._stats import WaitMeter
from .._wire import Batch, ShareSearch
from ._device import CudaHostPinning

_log = logging.getLogger("shardfeed")

# Batches between the loop's reports to its stream's search: the search
# times windows of 6, so every other batch keeps a window's start and end
# within a batch or two of its own.
LOOP_REPORT_EVERY = 2


class ShareCarry:
    """With ``server_decode_fraction="auto"``: the share the last stream's
    search held best (``share``) and where that search stood (``search``,
    None from a sidecar before the field), where the next stream goes on."""

    def __init__(self) -> None:
        self.share: float | None = None
        self.search: ShareSearch | None = None
        # Whether the loop tells the search its waits (False: the search
        # goes by the rate alone, as a benchmark's baseline).
        self.tells_loop = True
        self._batches = 0

    def observe(self, batch: Batch) -> None:
        """Each batch of a tuned stream: its search so far."""
        encoded = batch.encoded
        if encoded is None or not len(batch.keys):
            return
        settled = encoded.server_settled
        self.share = settled if settled is not None else float(encoded.decoded.mean())
        self.search = encoded.server_search

    def tell_loop(self, client: Any, meter: WaitMeter) -> None:
        """After each batch the loop received: every other one, its
        running waits to the stream's search (best effort: a server before
        the field, or one that is gone, costs the search its signal, not
        the training)."""
        self._batches += 1
        loop_id = self.search.loop_id if self.search is not None else 0
        if not self.tells_loop or loop_id == 0 or self._batches % LOOP_REPORT_EVERY:
            return
        try:
            client.report_loop_waits(loop_id, *meter.totals())
        except Exception as exc:
            _log.debug("could not tell the share search the loop's waits: %s", exc)

    def start(self, decode: str) -> float:
        """Where the next stream's search starts: where the last settled,
        or for a first stream, at the side that decodes faster. Where the
        trainer decodes on its own CPU, that is the server: the trainer's
        full-size decode costs several times the server's region decode,
        so the search gives it a share only where its cores are idle (from
        the middle, the first epoch ran at 0.54x the best share's). On a
        GPU it is the GPU: nvJPEG decodes ~7x what 2 sidecar cores do
        (from the middle, an H200's first epoch ran at 0.26x, from 0 at
        0.96x)."""
        if self.share is not None:
            return self.share
        return 1.0 if decode == "client" else 0.0


def stream_options(
    options: StreamOptions, decode: str, device: torch.device | None, carry: ShareCarry
) -> StreamOptions:
    """``options`` for the next stream of a dataset that decodes with
    ``decode`` onto ``device``."""
    if decode != "server":
        delivery = options.delivery
        if delivery.mode == "decoded":
            delivery = dataclasses.replace(delivery, mode=CLIENT_DEFAULT)
        if decode == "gpu" and delivery.server_fraction is None:
            # How much of a batch the GPU should take depends on both sides'
            # speed and on the model's step (on an H200, share 0 was best
            # with 2 sidecar cores and 0.25 with 8 when nothing trained, and
            # higher under ResNet-50's steps): the share is sought.
            delivery = dataclasses.replace(delivery, server_fraction="auto")
        options = dataclasses.replace(options, delivery=delivery)
    if device is not None and device.type == "cuda":
        options = dataclasses.replace(options, host_pinning=CudaHostPinning(device))
    delivery = options.delivery
    if delivery.tuned and delivery.server_start is None:
        # Going on with the last stream's search, not only its share: a
        # stream that starts from a share holds it 32 batches before it
        # probes, so epochs of a few dozen batches never moved it.
        delivery = dataclasses.replace(
            delivery,
            server_start=carry.start(decode),
            server_search=delivery.server_search or carry.search,
        )
        options = dataclasses.replace(options, delivery=delivery)
    return options
