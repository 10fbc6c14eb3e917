"""Peak server memory per stream, measured against docs/reference/memory.md's formula.

``python -m shardfeed_benchmarks.memory`` starts ``shardfeed dev-s3`` with the
demo's photo dataset, then for each setting a fresh ``shardfeed serve`` with
that setting's flags. It opens the setting's streams, reads each one epoch
with a consumer slower than the server (so every queue and buffer fills, the
peak the formula describes), and prints the server's peak RSS growth
(``VmHWM`` minus the RSS after start-up and indexing) next to the formula,
per setting, as a table and JSON lines.

``--cancel-cycles N`` instead opens N shared-memory streams one after another
against a server with ``--memory-limit`` (default 2G), reads one batch of
each and cancels it without ever collecting its ring (a client that opens and
cancels in a loop), and prints the server's peak RSS against the limit, the
memory still reserved afterwards, and whether a later stream is admitted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardfeed import Client

from .delivered import _free_port, _s3_client, _shardfeed_env, start_dev_s3

MIB = 1 << 20


@dataclass
class Setting:
    name: str
    streams: int = 1
    interleave: int = 4
    shuffle_buffer: int = 2000
    part_size: int = 8 * MIB
    parts_in_flight: int = 2
    batch_size: int = 128
    image_size: int = 224
    prefetch_shards: int = 2
    reader_queue: int = 64
    ready_batches: int = 2
    decode_ahead: int = 2
    # "shared_memory" serves on a Unix socket; the ring's slots replace the
    # batch buffers (same count), and its pages are charged to the server.
    transport: str = "inline"
    flags: list[str] = field(default_factory=list)
    # Loose objects (one per image): each reader holds whole objects in
    # flight instead of parts.
    loose: bool = False
    object_requests_in_flight: int = 16
    # Hub-layout Parquet files with row groups of this many rows (0: tar);
    # a reader holds its row group: ``row_group_cost`` bytes at most.
    parquet_rows: int = 0
    row_group_cost: int = 0

    @property
    def dataset(self) -> str:
        if self.parquet_rows:
            return f"s3://demo/hub{self.parquet_rows}/"
        return "s3://demo/loose/" if self.loose else "s3://demo/photos/"

    def formula(self, mean_sample: float) -> dict[str, float]:
        """The per-stream formula (docs/reference/memory.md), in bytes, by term."""
        readers = self.interleave + self.prefetch_shards
        batch = self.batch_size * self.image_size * self.image_size * 3
        if self.loose:
            reader_bytes = readers * (self.object_requests_in_flight + 1) * mean_sample
        else:
            parts = (self.parts_in_flight + 2) * self.part_size
            reader_bytes = readers * max(parts, self.row_group_cost)
        return {
            "readers": reader_bytes,
            "reader_queues": readers * self.reader_queue * mean_sample,
            "shuffle_buffer": self.shuffle_buffer * mean_sample,
            "batches": (self.decode_ahead + self.ready_batches + 3) * batch,
        }

    def serve_flags(self) -> list[str]:
        return [
            "--interleave",
            str(self.interleave),
            "--shuffle-buffer",
            str(self.shuffle_buffer),
            "--part-size",
            str(self.part_size),
            "--parts-in-flight",
            str(self.parts_in_flight),
            *self.flags,
        ]


SETTINGS = [
    Setting("defaults"),
    Setting("shuffle_buffer 500", shuffle_buffer=500),
    Setting("part_size 16 MiB x 4", part_size=16 * MIB, parts_in_flight=4),
    Setting("batch 256", batch_size=256),
    Setting("interleave 8", interleave=8),
    Setting("4 streams (ranks of world 4)", streams=4),
    Setting("shared memory", transport="shared_memory"),
    Setting("shared memory, 4 streams", streams=4, transport="shared_memory"),
    Setting("loose objects", loose=True),
    Setting("loose objects, 4 streams", streams=4, loose=True),
    Setting("parquet, 100-row groups", parquet_rows=100),
    Setting("parquet, 1000-row groups", parquet_rows=1000),
]


def publish_parquet(endpoint: str, setting: Setting) -> None:
    """The demo's photos as Hub-layout Parquet files under the setting's
    prefix; the setting learns its largest row group's cost."""
    from .parquet import hub_files, largest_row_group_cost
    from .training import _shard_keys

    bucket, keys = _shard_keys(endpoint, "s3://demo/photos/")
    client = _s3_client(endpoint)
    with tempfile.TemporaryDirectory() as directory:
        files = hub_files(
            endpoint, bucket, keys, 4, Path(directory), rows_per_group=setting.parquet_rows
        )
        setting.row_group_cost = max(largest_row_group_cost(f) for f in files)
        for path in files:
            key = f"hub{setting.parquet_rows}/data/{path.name}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


def _status_kib(pid: int, field_name: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field_name} for {pid}")


def _consume(target: str, dataset: str, setting: Setting, rank: int, pause: float) -> int:
    client = Client(target)
    count = 0
    for _ in client.batches(
        dataset,
        rank=rank,
        world_size=setting.streams,
        batch_size=setting.batch_size,
        image_size=setting.image_size,
        transport=setting.transport,
    ):
        count += 1
        time.sleep(pause)
    client.close()
    return count


def measure(
    binary: str, endpoint: str, dataset: str, setting: Setting, pause: float
) -> dict[str, Any]:
    socket_dir = tempfile.TemporaryDirectory(prefix="sf-")
    if setting.transport == "shared_memory":
        listen = f"unix:{socket_dir.name}/sf.sock"
        target = f"unix://{socket_dir.name}/sf.sock"
    else:
        listen = target = f"127.0.0.1:{_free_port()}"
    server = subprocess.Popen(
        [
            binary,
            "serve",
            "--listen",
            listen,
            "--metrics-listen",
            f"127.0.0.1:{_free_port()}",
            *setting.serve_flags(),
        ],
        env=dict(_shardfeed_env(endpoint), SHARDFEED_LOG="warn"),
    )
    try:
        import grpc

        options = [("grpc.default_authority", "localhost")] if listen.startswith("unix") else []
        channel = grpc.insecure_channel(target, options=options)
        grpc.channel_ready_future(channel).result(timeout=30)
        channel.close()
        client = Client(target)
        info = client.describe(dataset, world_size=setting.streams, batch_size=setting.batch_size)
        client.close()
        baseline = _status_kib(server.pid, "VmRSS") * 1024
        threads = [
            threading.Thread(target=_consume, args=(target, dataset, setting, rank, pause))
            for rank in range(setting.streams)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        peak = _status_kib(server.pid, "VmHWM") * 1024
    finally:
        server.terminate()
        server.wait(timeout=30)
        socket_dir.cleanup()
    mean_sample = info.total_bytes / info.samples
    terms = setting.formula(mean_sample)
    formula = sum(terms.values()) * setting.streams
    return {
        "setting": setting.name,
        "streams": setting.streams,
        "mean_sample_bytes": round(mean_sample),
        "formula_bytes": round(formula),
        "formula_terms_per_stream": {k: round(v) for k, v in terms.items()},
        "baseline_rss_bytes": baseline,
        "peak_growth_bytes": peak - baseline,
        "measured_over_formula": (peak - baseline) / formula,
    }


def _scrape_metric(url: str, name: str) -> float:
    """One unlabelled sample of the server's Prometheus text."""
    import urllib.request

    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def open_and_cancel(binary: str, endpoint: str, cycles: int, memory_limit: str) -> dict[str, Any]:
    """Shared-memory streams opened and cancelled before their rings are
    collected, one after another; the server's peak RSS against its limit."""
    import grpc

    from shardfeed._proto import shardfeed_pb2 as pb
    from shardfeed._proto import shardfeed_pb2_grpc as pb_grpc

    socket_dir = tempfile.TemporaryDirectory(prefix="sf-")
    metrics_port = _free_port()
    server = subprocess.Popen(
        [
            binary,
            "serve",
            "--listen",
            f"unix:{socket_dir.name}/sf.sock",
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            "--memory-limit",
            memory_limit,
        ],
        env=dict(_shardfeed_env(endpoint), SHARDFEED_LOG="warn"),
    )
    target = f"unix://{socket_dir.name}/sf.sock"
    try:
        channel = grpc.insecure_channel(target, options=[("grpc.default_authority", "localhost")])
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = pb_grpc.ShardfeedStub(channel)  # type: ignore[no-untyped-call]
        request = pb.StreamBatchesRequest(
            dataset="s3://demo/photos/",
            batch_size=128,
            height=224,
            width=224,
            world_size=1,
            transport=pb.TRANSPORT_SHARED_MEMORY,
        )
        refused = 0
        started = time.monotonic()
        for _ in range(cycles):
            call = stub.StreamBatches(request)
            try:
                next(call)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                refused += 1
            call.cancel()
        seconds = time.monotonic() - started
        peak = _status_kib(server.pid, "VmHWM") * 1024
        later = sum(1 for _ in Client(target).batches("s3://demo/photos/", batch_size=128))
        reserved = _scrape_metric(
            f"http://127.0.0.1:{metrics_port}/metrics", "shardfeed_stream_memory_reserved_bytes"
        )
        channel.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        socket_dir.cleanup()
    return {
        "cycles": cycles,
        "seconds": round(seconds, 1),
        "memory_limit": memory_limit,
        "peak_rss_bytes": peak,
        "refused_while_cycling": refused,
        "later_stream_batches": later,
        "reserved_bytes_after": reserved,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--samples-per-shard", type=int, default=256)
    parser.add_argument(
        "--pause", type=float, default=0.05, help="seconds the consumer sleeps per batch"
    )
    parser.add_argument("--only", help="run only the settings whose name contains this")
    parser.add_argument(
        "--cancel-cycles", type=int, default=0, help="measure open-and-cancel cycles instead"
    )
    parser.add_argument("--memory-limit", default="2G", help="the server's, with --cancel-cycles")
    args = parser.parse_args(argv)
    s3, endpoint = start_dev_s3(
        args.binary, args.shards, args.samples_per_shard, "--synthetic-loose"
    )
    if args.cancel_cycles:
        try:
            row = open_and_cancel(args.binary, endpoint, args.cancel_cycles, args.memory_limit)
            print(json.dumps(row), flush=True)
        finally:
            s3.terminate()
            s3.wait(timeout=30)
        return 0
    try:
        rows = []
        for setting in SETTINGS:
            if args.only and args.only not in setting.name:
                continue
            if setting.parquet_rows:
                publish_parquet(endpoint, setting)
            row = measure(args.binary, endpoint, setting.dataset, setting, args.pause)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        s3.terminate()
        s3.wait(timeout=30)
    print(f"\n{'setting':32} {'formula MiB':>12} {'peak growth MiB':>16} {'measured/formula':>17}")
    for row in rows:
        print(
            f"{row['setting']:32} {row['formula_bytes'] / MIB:12.0f} "
            f"{row['peak_growth_bytes'] / MIB:16.0f} {row['measured_over_formula']:17.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
