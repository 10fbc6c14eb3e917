"""How a dataset's streams ask for their images, and the share search one
stream hands the next (torch/_delivery.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from shardfeed._options import StreamOptions  # noqa: E402
from shardfeed._wire import ShareSearch  # noqa: E402
from shardfeed.torch._delivery import ShareCarry, stream_options  # noqa: E402


def _batch(settled: float | None, search: ShareSearch | None) -> SimpleNamespace:
    encoded = SimpleNamespace(
        server_settled=settled, server_search=search, decoded=np.array([True, False, False, False])
    )
    return SimpleNamespace(keys=["a", "b", "c", "d"], encoded=encoded)


def test_a_first_stream_starts_at_the_faster_decoder() -> None:
    gpu = stream_options(StreamOptions(), "gpu", None, ShareCarry()).delivery
    assert (gpu.mode, gpu.server_fraction, gpu.server_start, gpu.server_search) == (
        "encoded",
        "auto",
        0.0,
        None,
    )
    client = StreamOptions().with_keywords(server_decode_fraction="auto")
    on_cpu = stream_options(client, "client", None, ShareCarry()).delivery
    assert (on_cpu.server_start, on_cpu.server_search) == (1.0, None)
    # A fixed share is not sought, so nothing is started or carried.
    fixed = StreamOptions().with_keywords(server_decode_fraction=0.25)
    assert stream_options(fixed, "client", None, ShareCarry()).delivery.server_start is None
    served = stream_options(StreamOptions(), "server", None, ShareCarry()).delivery
    assert served.mode == "decoded"


def test_the_next_stream_goes_on_with_the_last_search() -> None:
    carry = ShareCarry()
    search = ShareSearch(center=0.375, step=0.125, hold=12, next_hold=64)
    carry.observe(_batch(0.375, search))  # type: ignore[arg-type]
    delivery = stream_options(StreamOptions(), "gpu", None, carry).delivery
    assert (delivery.server_start, delivery.server_search) == (0.375, search)
    # A sidecar before the search field: the share alone carries, and
    # without a settled share, the batch's own.
    older = ShareCarry()
    older.observe(_batch(None, None))  # type: ignore[arg-type]
    delivery = stream_options(StreamOptions(), "gpu", None, older).delivery
    assert (delivery.server_start, delivery.server_search) == (0.25, None)
    # A search the caller gave wins over the carried one.
    given = ShareSearch(center=0.9, step=0.0625, hold=0, next_hold=32)
    asked = StreamOptions().with_keywords(server_decode_fraction="auto", server_decode_search=given)
    assert stream_options(asked, "gpu", None, carry).delivery.server_search == given


def test_the_searchs_measured_noise_goes_back_with_it() -> None:
    from shardfeed._options import Delivery
    from shardfeed._proto import shardfeed_pb2 as pb

    for noise in (0.12, None):
        search = ShareSearch(center=0.5, step=0.0625, hold=3, next_hold=64, noise=noise)
        request = pb.StreamBatchesRequest()
        Delivery("encoded", "auto", server_search=search).apply(request)
        sent = request.server_decode_search
        assert (sent.center, sent.hold, sent.next_hold) == (0.5, 3, 64)
        # Unset, not 0: a search that has measured no noise yet.
        assert sent.HasField("noise") == (noise is not None)
        assert not sent.HasField("noise") or abs(sent.noise - 0.12) < 1e-12
