"""The server's decode-share search told the training loop's waits, through
the real binary on CPU: a trainer that decodes ahead of its loop on a
thread (as the GPU path does), its model's step a sleep of a set length.

Under a model that caps the rate every share gives the same rate, and the
search by the rate alone goes where its noise takes it; told that the loop
does not wait, it raises the server's share to the top, sparing the
trainer's decoder. The faster and changing models are the search's own tests
(``src/pipeline/encoded/seek.rs``), where the curves are exact."""

from __future__ import annotations

import time
from typing import Any

import pytest

from shardfeed import Client, Delivery, StreamOptions
from shardfeed._ahead import run_ahead
from shardfeed._stats import WaitMeter

from ..conftest import S3, Server, upload, write_tar
from .test_augment import photo

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from shardfeed.decode import BatchDecoder  # noqa: E402

SHARDS, PER_SHARD = 4, 512
# Batches large enough that few are in flight: the search lets those
# through before it times a share.
BATCH = 16


@pytest.fixture(scope="module")
def many(s3: S3) -> str:
    # Smooth photos: their JPEGs are a fraction of the decoded output, so
    # the sidecar sends them compressed (noise would go decoded).
    shards = [
        write_tar(
            [
                (f"s{s}k{i:03d}", {"jpg": photo(s * PER_SHARD + i, (160, 120)), "cls": b"1"})
                for i in range(PER_SHARD)
            ]
        )
        for s in range(SHARDS)
    ]
    return upload(s3, "share-search", "", shards)


def _train(server: Server, uri: str, step: float, *, tell_loop: bool) -> dict[str, Any]:
    """One epoch through a loop that sleeps ``step`` a batch, the client
    decoding ahead of it; with ``tell_loop`` the loop's waits go to the
    stream's search every other batch."""
    client = Client(server.target)
    # No start: the middle, coarse steps.
    delivery = Delivery(mode="encoded", server_fraction="auto")
    stream = client.batches(
        uri,
        batch_size=BATCH,
        image_size=96,
        augment="train",
        seed=1,
        rank=0,
        world_size=1,
        options=StreamOptions(delivery=delivery),
    )
    decoder = BatchDecoder("cpu")
    ahead = run_ahead(((batch, decoder.decode(batch)) for batch in stream), 4, name="decode")
    meter = WaitMeter()
    meter.begin_pass()
    centers, server_shares = [], []
    started = time.perf_counter()
    for count, (batch, _) in enumerate(ahead):
        meter.received()
        search = batch.encoded.server_search
        assert search is not None and search.loop_id != 0
        centers.append(search.center)
        server_shares.append(float(batch.encoded.decoded.mean()))
        if tell_loop and count % 2 == 0:
            client.report_loop_waits(search.loop_id, *meter.totals())
        time.sleep(step)
        meter.asking()
    seconds = time.perf_counter() - started
    late = meter.stats(last=len(centers) // 2)
    return {
        "settled": centers[-1],
        "centers": centers,
        "late_server_share": sum(server_shares[len(centers) // 2 :]) / (len(centers) // 2),
        "late_waiting": late.waiting_fraction,
        "samples_per_second": BATCH * len(centers) / seconds,
    }


def test_a_fed_loop_moves_the_decodes_to_the_sidecar(server: Server, many: str) -> None:
    step = 0.06
    told = _train(server, many, step, tell_loop=True)
    blind = _train(server, many, step, tell_loop=False)
    header = ("loop", "step ms", "settled", "server share", "wait", "samples/s")
    print("\n{:>12} {:>8} {:>8} {:>13} {:>6} {:>10}".format(*header))
    for name, run in (("told", told), ("rate alone", blind)):
        print(
            f"{name:>12} {1e3 * step:8.0f} {run['settled']:8.4f} {run['late_server_share']:13.2f} "
            f"{100 * run['late_waiting']:5.1f}% {run['samples_per_second']:10.1f}"
        )
    # Told that its loop does not wait, the search climbs to the top: the
    # trainer decodes nothing once it settles (a probe a step below now
    # and then) and its loop stays fed.
    assert told["settled"] == 1.0, told["centers"]
    assert told["late_server_share"] >= 0.75
    assert told["late_waiting"] <= 0.02
    # By the rate alone (printed beside it) the curve is flat under the
    # model's cap: where the search goes is the noise's, and the handed-on
    # rate it times while the buffers fill.
