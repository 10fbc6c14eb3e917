"""Operators' view: the metrics endpoint of the real binary during streams."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest

from shardfeed import Client, ShardfeedError, _channel

from ..conftest import (
    REPO,
    S3,
    Server,
    free_port,
    scrape,
    start_s3,
    start_server,
    stop,
    upload,
    write_tar,
)
from .test_client import COLORS, jpeg


def documented_metrics() -> list[str]:
    table = (REPO / "docs" / "METRICS.md").read_text()
    return re.findall(r"^\| `(shardfeed_[a-z0-9_]+)`", table, flags=re.M)


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    found = 0.0
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            found += value
    return found


@pytest.fixture(scope="module")
def throttled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3, Server]]:
    """A server with a disk cache whose S3 throttles every other GET."""
    s3, s3_process = start_s3("--slow-down-every", "2")
    cache = tmp_path_factory.mktemp("cache")
    # The free-space floor is the cache's own test; a full shared disk must
    # not turn this one off.
    server = start_server(
        s3,
        f"127.0.0.1:{_port()}",
        "--cache-dir",
        str(cache),
        "--cache-min-free-percent",
        "0",
        "--decoded-cache-dir",
        str(tmp_path_factory.mktemp("decoded")),
        # Only the stream that asks uses the tier: the counts below are of
        # its records alone (a default tier fills in the background).
        "--decoded-default-side",
        "0",
    )
    yield s3, server
    stop(server.process)
    stop(s3_process)


def _port() -> int:
    return free_port()


def test_documented_metrics_exist_and_move(throttled: tuple[S3, Server]) -> None:
    s3, server = throttled
    samples = []
    for i in range(40):
        members = {"jpg": jpeg(COLORS[i % 5], (64, 48)), "cls": str(i % 5).encode()}
        if i == 3:
            members["jpg"] = b"corrupt"
        if i == 4:
            members["cls"] = b"cat"
        samples.append((f"m{i:03d}", members))
    # No index: the server builds one (counted) on first use.
    uri = upload(s3, "ops", "", [write_tar(samples[:20]), write_tar(samples[20:])])
    before = scrape(server.metrics_url)
    client = Client(server.target)
    stream = client.batches(uri, batch_size=4, image_size=32)
    next(stream)
    during = scrape(server.metrics_url)
    assert total(during, "shardfeed_batches_total") >= total(before, "shardfeed_batches_total") + 1
    rest = list(stream)
    assert len(rest) == 9
    # A mixed stream counts its samples per source.
    mix_a = upload(s3, "opsa", "", [write_tar(samples[5:15])])
    mix_b = upload(s3, "opsb", "", [write_tar(samples[15:25])])
    mixed = list(client.batches(sources=[(mix_a, 1), (mix_b, 1)], batch_size=4, image_size=32))
    assert len(mixed) == 5 and all(b.sources == [0, 0, 1, 1] for b in mixed)
    # The decoded-source tier: a first pass stores each source and (no
    # randomness in a center crop) each output; the second copies outputs.
    for _ in range(2):
        tiered = list(
            client.batches(
                mix_a, batch_size=5, image_size=32, decoded_source=64, decoded_source_from_epoch=0
            )
        )
        assert len(tiered) == 2
    # Encoded delivery: the server decodes its share, the client the rest
    # (and reports what it decoded).
    encoded = list(
        client.batches(
            mix_a, batch_size=5, image_size=32, delivery="encoded", server_decode_fraction=0.4
        )
    )
    assert len(encoded) == 2
    client.report_client_decodes(6, rank=0)
    with pytest.raises(ShardfeedError):
        client.describe("s3://ops/absent/", world_size=1)
    after = scrape(server.metrics_url)
    assert total(after, "shardfeed_streams_active") == 0

    # The decode pool's metrics come from a sidecar with a pool and from its
    # workers: test_pool.py checks them there.
    names = [n for n in documented_metrics() if not n.startswith("shardfeed_pool_")]
    assert len(names) >= 15
    present = {
        key.partition("{")[0].removesuffix("_sum").removesuffix("_count").removesuffix("_bucket")
        for key in after
    }
    missing = [n for n in names if n not in present]
    assert not missing, f"documented but not exported: {missing}"

    def moved(name: str, suffix: str = "", **labels: str) -> float:
        return total(after, name + suffix, **labels) - total(before, name + suffix, **labels)

    assert moved("shardfeed_batches_total") == 21
    assert moved("shardfeed_samples_total") == 90
    assert moved("shardfeed_delivered_samples_total", decoded_by="server") == 4
    assert moved("shardfeed_delivered_samples_total", decoded_by="client") == 6
    assert moved("shardfeed_client_decoded_samples_total") == 6
    assert moved("shardfeed_decoded_tier_total", event="fill") == 20
    assert moved("shardfeed_decoded_tier_total", event="hit") == 10
    assert total(after, "shardfeed_decoded_tier_bytes") > 10 * 32 * 32 * 3
    assert moved("shardfeed_mixed_source_samples_total", dataset=mix_a) == 10
    assert moved("shardfeed_mixed_source_samples_total", dataset=mix_b) == 10
    # gRPC's names of the codes, as clients and exporters spell them.
    assert moved("shardfeed_requests_total", rpc="StreamBatches", code="OK") == 5
    assert moved("shardfeed_requests_total", rpc="ReportClientDecodes", code="OK") == 1
    assert moved("shardfeed_requests_total", rpc="Describe", code="NOT_FOUND") == 1
    assert moved("shardfeed_substituted_samples_total", reason="corrupt") == 1
    assert moved("shardfeed_invalid_labels_total") == 1
    assert moved("shardfeed_index_builds_total") == 3
    assert moved("shardfeed_store_retries_total") >= 1
    # The fixture's S3 answers every other GET with 503 SlowDown: throttling,
    # which also lowers the host's limit of requests in flight.
    assert moved("shardfeed_s3_requests_total", op="get", outcome="throttled") >= 1
    assert 2 <= total(after, "shardfeed_s3_request_limit") < 128
    assert moved("shardfeed_s3_requests_total", op="get", outcome="ok") >= 2
    assert moved("shardfeed_s3_received_bytes_total") > 0
    # Every sample the server decoded: not the 6 sent compressed.
    assert moved("shardfeed_decode_seconds", "_count") == 84
    assert moved("shardfeed_s3_request_seconds", "_count", op="get") >= 3
    assert moved("shardfeed_cache_misses_total") >= 2
    assert moved("shardfeed_cache_read_bytes_total", source="origin") > 0
    assert total(after, "shardfeed_cache_bytes") > 0


def consume(client: Client, uri: str, rank: int, pause: float, metrics_url: str = "") -> None:
    # 32 x 224 x 224 x 3 = 4.8 MB batches, 77 MB per stream: far more than
    # the client's HTTP/2 window and buffers hold, so a slow consumer's
    # back-pressure reaches the server.
    for batch in client.batches(uri, batch_size=32, image_size=224, rank=rank, world_size=2):
        if metrics_url and batch.index == 0:
            # Mid-stream. Checked at the first batch, before the consumer's
            # first pause: with BDP-grown HTTP/2 windows the transport may
            # buffer much of the epoch during a pause, letting the server finish.
            assert total(scrape(metrics_url), "shardfeed_streams_active") == 1
        time.sleep(pause)


def stall(url: str, rank: str) -> tuple[float, float]:
    samples = scrape(url)
    return (
        total(samples, "shardfeed_consumer_wait_seconds_sum", rank=rank),
        total(samples, "shardfeed_ready_batch_wait_seconds_sum", rank=rank),
    )


def test_stall_metrics_attribute_the_bottleneck(s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    # The client lets HTTP/2 windows grow with the measured bandwidth-delay
    # product; on loopback they can grow past the whole epoch, so the server
    # never sees a slow consumer. Fixed 64 KiB windows make back-pressure certain.
    fixed_windows = [
        (name, 0 if name == "grpc.http2.bdp_probe" else value)
        for name, value in _channel._CHANNEL_OPTIONS
    ]
    monkeypatch.setattr(_channel, "_CHANNEL_OPTIONS", fixed_windows)
    samples = [(f"st{i:04d}", {"jpg": jpeg(COLORS[i % 5], (48, 48))}) for i in range(1024)]
    shards = [write_tar(samples[:512]), write_tar(samples[512:])]
    uri = upload(s3, "stall", "", shards)

    # Compute-bound: the trainer (consumer) is slow, batches wait for it.
    server = start_server(s3, f"127.0.0.1:{_port()}")
    try:
        consume(Client(server.target), uri, rank=1, pause=0.2, metrics_url=server.metrics_url)
        data_wait, ready_wait = stall(server.metrics_url, "1")
    finally:
        stop(server.process)
    # 16 batches, 0.2 s apart (slower than even a debug build decodes); those
    # beyond what the transport buffers wait for the consumer.
    assert ready_wait > 0.6, (data_wait, ready_wait)
    assert data_wait < ready_wait, (data_wait, ready_wait)

    # Data-bound: S3 answers slowly, the trainer waits for batches (two
    # parts in flight a reader: the sized count, 16 of these small parts,
    # would hide most of the delay).
    slow_s3, slow_process = start_s3("--get-delay-ms", "400")
    slow_server = start_server(
        slow_s3, f"127.0.0.1:{_port()}", "--part-size", "65536", "--parts-in-flight", "2"
    )
    try:
        slow_uri = upload(slow_s3, "stall", "", shards)
        thread = threading.Thread(
            target=consume, args=(Client(slow_server.target), slow_uri, 1, 0.0)
        )
        thread.start()
        thread.join(timeout=60)
        data_wait, ready_wait = stall(slow_server.metrics_url, "1")
        assert data_wait > 0.3, (data_wait, ready_wait)
        assert ready_wait < data_wait / 2, (data_wait, ready_wait)
    finally:
        stop(slow_server.process)
        stop(slow_process)


def test_batch_timeout_bounds_the_wait_for_a_batch_not_the_epoch(s3: S3) -> None:
    samples = [(f"bt{i:04d}", {"jpg": jpeg(COLORS[i % 5], (32, 32))}) for i in range(64)]
    shards = [write_tar(samples)]

    # A slow consumer: 0.6 s per step, longer than batch_timeout, is fine.
    uri = upload(s3, "patient", "", shards)
    server = start_server(s3, f"127.0.0.1:{_port()}")
    try:
        client = Client(server.target, batch_timeout=0.5)
        got = 0
        for batch in client.batches(uri, batch_size=16, image_size=16, world_size=1, rank=0):
            got += len(batch.labels)
            time.sleep(0.6)
        assert got == 64
    finally:
        stop(server.process)

    # A server whose every GET waits 2 s: the caller waits at most ~batch_timeout.
    slow_s3, slow_process = start_s3("--get-delay-ms", "2000")
    slow_server = start_server(slow_s3, f"127.0.0.1:{_port()}")
    try:
        slow_uri = upload(slow_s3, "impatient", "", shards)
        # Describe first: the index is built (slowly) before the timed stream.
        Client(slow_server.target, call_timeout=60).describe(slow_uri, world_size=1, batch_size=16)
        client = Client(slow_server.target, batch_timeout=0.5)
        started = time.monotonic()
        with pytest.raises(ShardfeedError) as raised:
            for _ in client.batches(slow_uri, batch_size=16, image_size=16, world_size=1, rank=0):
                pass
        assert raised.value.code == "DEADLINE_EXCEEDED", raised.value
        assert time.monotonic() - started < 1.9
    finally:
        stop(slow_server.process)
        stop(slow_process)


def _filtered_label_values() -> set[tuple[str, str, str]]:
    """(metric, label, value) for every exact label value the dashboard's
    panels and the PrometheusRule's alerts filter on (``=`` or ``!=``)."""
    texts = [
        (REPO / "helm/shardfeed/dashboards/shardfeed.json").read_text().replace('\\"', '"'),
        (REPO / "helm/shardfeed/templates/prometheusrule.yaml").read_text(),
    ]
    found = set()
    for text in texts:
        for metric, selector in re.findall(r"(shardfeed_[a-z0-9_]+)\{([^}]*)\}", text):
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            for label, value in re.findall(r'(\w+)!?="([^"$.*|]+)"', selector):
                found.add((base, label, value))
    return found


def test_every_label_value_the_chart_filters_on_is_exported_from_the_start(s3: S3) -> None:
    # A fresh server, before any request: a rule over `increase()` sees the
    # first event only where its series already exists at 0.
    server = start_server(s3, f"127.0.0.1:{_port()}")
    try:
        samples = scrape(server.metrics_url)
    finally:
        stop(server.process)
    filtered = _filtered_label_values()
    assert ("shardfeed_requests_total", "code", "OK") in filtered
    missing = [
        f"{metric}{{{label}={value!r}}}"
        for metric, label, value in sorted(filtered)
        if not any(
            key.partition("{")[0].startswith(metric) and f'{label}="{value}"' in key
            for key in samples
        )
    ]
    assert not missing, f"the chart filters on series the exporter does not write: {missing}"
    assert total(samples, "shardfeed_requests_total", code="RESOURCE_EXHAUSTED") == 0
    assert any("shardfeed_decoded_tier_total" in key and "hit" in key for key in samples)
