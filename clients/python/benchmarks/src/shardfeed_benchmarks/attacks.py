"""A hostile-client run anyone can repeat: the attacks of both hardening
reviews, each against a fresh sidecar or pool worker of the binary given.

    python -m shardfeed_benchmarks.attacks --binary target/release/shardfeed
    bash tests/hostile_run.sh            # builds the release binary first

For each attack: what the attacker was answered, the process's peak RSS
(``VmHWM``) against the bound its memory formula states (the sidecar's
``--memory-limit``; the worker's ``memory_bound_mib``, which it logs), and
whether an honest client was served while the attack ran (probes with a
fresh connection every half second: the share answered) and after it. One
JSON line an attack, then the Markdown table docs/operating.md quotes.
Exits 1 if a process died, went past its bound, or left an honest client
unserved after the attack.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from . import _h2, parquet_attacks
from ._attack_kit import (
    ATTACKER,
    DATASET,
    DECODE,
    HEALTH_CHECK,
    STREAM_BATCHES,
    Outcome,
    Probes,
    Process,
    Setup,
    _healthy,
    _outcome,
    _scraped,
    held_places,
    sidecar,
    worker,
)
from .delivered import start_dev_s3

# ---- the sidecar -----------------------------------------------------------


def hpack_bomb(setup: Setup) -> Outcome:
    """Round 1: a 4 KB table entry referenced 60,000 times (4.8 GB if
    expanded) on the Unix socket."""
    with sidecar(setup.binary, setup.endpoint) as process:
        with Probes(lambda: _healthy(process)) as probes:
            started = time.monotonic()
            sock = _h2.connect(process.target)
            blocks = _h2.frame(
                _h2.HEADERS, _h2.END_HEADERS, 1, _h2.literal(b"x-big", b"v" * 4000, 0x40)
            )
            references = bytes([0x80 | 62]) * 60_000
            for at, stream in zip(range(0, len(references), 16_000), range(3, 100, 2)):
                blocks += _h2.frame(
                    _h2.HEADERS, _h2.END_HEADERS, stream, references[at : at + 16_000]
                )
            sock.sendall(blocks)
            _, closed = _h2.drain(sock, 10)
            sock.close()
        answer = "connection closed" if closed else "connection left open"
        return _outcome("HPACK bomb", "unix", process, answer, probes, started)


def stream_flood(setup: Setup) -> Outcome:
    """Round 1: 10,000 header-only streams on one TCP connection."""
    with sidecar(setup.binary, setup.endpoint, tcp=True) as process:
        with Probes(lambda: _healthy(process)) as probes:
            started = time.monotonic()
            connection = _h2.Connection(_h2.connect(process.target))
            burst = b"".join(
                _h2.open_call(stream, STREAM_BATCHES) for stream in range(1, 20_001, 2)
            )
            try:
                connection.send(burst)
            except OSError:
                pass
            time.sleep(2)
            answer = (
                f"{len(connection.reset)} streams refused, "
                + ("GOAWAY" if connection.goaway else "no GOAWAY")
                + (", closed" if connection.closed else "")
            )
            connection.close()
        return _outcome("10,000 streams", "tcp", process, answer, probes, started)


def unfinished_bodies(setup: Setup) -> Outcome:
    """D5: 3 connections x 64 streams, each sending all but the last byte
    of a request at the size cap (1 MiB): 192 MiB held if buffered."""
    with sidecar(setup.binary, setup.endpoint, tcp=True) as process:
        with Probes(lambda: _healthy(process)) as probes:
            started = time.monotonic()
            body = _h2.grpc_prefix((1 << 20) - 5) + bytes((1 << 20) - 6)
            connections = [_h2.Connection(_h2.connect(process.target)) for _ in range(3)]
            sent = 0
            for connection in connections:
                for stream in range(1, 129, 2):
                    connection.send(_h2.open_call(stream, STREAM_BATCHES))
                for stream in range(1, 129, 2):
                    sent += connection.send_body(stream, body, wait=0.5)
            # The request deadline (10 s) ends every call.
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and sum(len(c.reset) for c in connections) < 192:
                time.sleep(0.25)
            ended = sum(len(c.reset) for c in connections)
            for connection in connections:
                connection.close()
        answer = f"{sent >> 20} MiB sent; {ended} of 192 calls ended by the server"
        return _outcome("unfinished request bodies (D5)", "tcp", process, answer, probes, started)


def _held_call(target: str, path: str, source: str | None = None) -> socket.socket:
    """A connection holding one call whose request never comes."""
    sock = _h2.connect(target, source=source)
    sock.sendall(_h2.open_call(1, path))
    return sock


def held_calls(setup: Setup) -> Outcome:
    """D7: 1,024 connections on the Unix socket (the listener's every
    place), each holding one call whose body never comes, each reopened at
    once when the server closes it, for 45 s."""
    with sidecar(setup.binary, setup.endpoint) as process:
        return held_places(
            "calls held open (D7)",
            "unix",
            process,
            1_024,
            "1,024 held calls",
            lambda _: _held_call(process.target, STREAM_BATCHES),
            lambda: _healthy(process),
        )


def _attacker(index: int) -> str:
    """One of 8 loopback addresses, 8 connections each."""
    return f"127.0.0.{2 + index % 8}"


def metrics_refill(setup: Setup) -> Outcome:
    """L1: 8 addresses x 8 connections on /metrics, each sending an
    unfinished request head, reopened at once when closed, for 45 s."""
    with sidecar(setup.binary, setup.endpoint) as process:
        address = process.metrics.removeprefix("http://").split("/")[0]
        host, port = address.split(":")

        def slow_head(index: int) -> socket.socket:
            sock = socket.create_connection(
                (host, int(port)), timeout=2, source_address=(_attacker(index), 0)
            )
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100)
            return sock

        return held_places(
            "refilled slow /metrics heads (L1)",
            "metrics",
            process,
            64,
            "64 unfinished heads from 8 addresses",
            slow_head,
            lambda: _scraped(process),
        )


def metrics_hold(setup: Setup) -> Outcome:
    """D4: 2,000 idle connections and 300 unfinished request heads on
    /metrics."""
    with sidecar(setup.binary, setup.endpoint) as process:
        address = process.metrics.removeprefix("http://").split("/")[0]
        host, port = address.split(":")
        with Probes(lambda: _scraped(process)) as probes:
            started = time.monotonic()
            held = []
            for index in range(2_300):
                try:
                    sock = socket.create_connection(
                        (host, int(port)), timeout=2, source_address=(ATTACKER, 0)
                    )
                except OSError:
                    continue
                if index >= 2_000:
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000)
                held.append(sock)
            time.sleep(12)  # past the 10 s head deadline
            closed = sum(_h2.drain(sock, 0.01)[1] for sock in held)
            for sock in held:
                sock.close()
        answer = f"{closed} of {len(held)} held connections closed by the server within 12 s"
        return _outcome(
            "idle and slow /metrics (D4)",
            "metrics",
            process,
            answer,
            probes,
            started,
            lambda: _scraped(process),
        )


def epoch_bomb(setup: Setup) -> Outcome:
    """Round 1: a mixed stream at epoch 10^15 (10^16 steps to plan)."""
    from shardfeed import Client, ShardfeedError

    with sidecar(setup.binary, setup.endpoint) as process:
        target = "unix://" + process.target.removeprefix("unix:")
        with Probes(lambda: _healthy(process)) as probes:
            started = time.monotonic()
            try:
                stream = Client(target).batches(
                    sources=[(DATASET, 1), (DATASET.rstrip("/"), 1)],
                    epoch=10**15,
                    batch_size=8,
                    image_size=32,
                )
                next(iter(stream))
                answer = "streamed"
            except ShardfeedError as error:
                answer = f"{error.code} after {time.monotonic() - started:.2f} s"
        return _outcome("epoch 10^15", "unix", process, answer, probes, started)


def _file_dataset(folder: Path, make: Callable[[Path], None]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    make(folder)
    return f"file://{folder}/"


def sparse_index(setup: Setup) -> Outcome:
    """D2: a sparse 1 TiB summary index in an allowed folder."""
    from shardfeed import Client, ShardfeedError

    def make(folder: Path) -> None:
        (folder / "_shardfeed").mkdir(exist_ok=True)
        with open(folder / "_shardfeed" / "index.json", "wb") as index:
            index.truncate(1 << 40)

    uri = _file_dataset(setup.work / "sparse", make)
    with sidecar(setup.binary, setup.endpoint, "--allow", f"file://{setup.work}/") as process:
        target = "unix://" + process.target.removeprefix("unix:")
        with Probes(lambda: _healthy(process)) as probes:
            started = time.monotonic()
            try:
                Client(target).describe(uri, world_size=1)
                answer = "described"
            except ShardfeedError as error:
                answer = f"{error.code} after {time.monotonic() - started:.2f} s"
        return _outcome("1 TiB sparse index (D2)", "unix", process, answer, probes, started)


def rgba16_png(width: int, height: int) -> bytes:
    """A 16-bit RGBA PNG, written by hand (PIL saves no 16-bit RGBA): a
    flat image, so it is small on disk and huge decoded."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    row = b"\x00" + bytes([0x80, 0x00, 0x40, 0x00, 0x20, 0x00, 0xFF, 0xFF]) * width
    header = struct.pack(">IIBBBBB", width, height, 16, 6, 0, 0, 0)
    pixels = zlib.compress(row * height, 6)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def png_16bit(setup: Setup) -> Outcome:
    """D9: four 6500^2 RGBA 16-bit PNGs (the decoder's 8 bytes a pixel
    plus the RGB copy: 443 MiB each) on four decode threads."""
    import io
    import tarfile

    from shardfeed import Client

    def make(folder: Path) -> None:
        data = rgba16_png(6500, 6500)
        with tarfile.open(folder / "shard-00000.tar", "w") as tar:
            for index in range(4):
                for suffix, payload in ((".png", data), (".cls", b"0")):
                    member = tarfile.TarInfo(f"s{index}{suffix}")
                    member.size = len(payload)
                    tar.addfile(member, io.BytesIO(payload))

    uri = _file_dataset(setup.work / "png16", make)
    flags = ("--allow", f"file://{setup.work}/", "--decode-threads", "4")
    # A limit whose decode scratch (an eighth, 512 MiB) fits one such image
    # at a time: the four decode one after another, within the formula.
    with sidecar(setup.binary, setup.endpoint, *flags, limit=4 << 30) as process:
        target = "unix://" + process.target.removeprefix("unix:")
        with Probes(lambda: _healthy(process)) as probes:
            started = time.monotonic()
            batches = list(
                Client(target).batches(
                    uri, batch_size=4, image_size=64, shuffle_buffer=4, interleave=1
                )
            )
            samples = sum(len(b.keys) for b in batches)
            reasons = sorted({r for b in batches for r in b.substitution_reasons})
            substituted = sum(len(b.substituted) for b in batches)
            answer = f"{samples} samples, {substituted} substituted" + (
                f" ({', '.join(reasons)})" if reasons else ""
            )
        return _outcome("6500² RGBA16 PNGs (D9)", "unix", process, answer, probes, started)


# ---- the pool worker -------------------------------------------------------


def unauthenticated_units(setup: Setup) -> Outcome:
    """Round 1: 100 calls without the token, each declaring a 32 MiB unit."""
    with worker(setup.binary, None) as process:
        with Probes(lambda: _healthy(process)) as probes:
            started = time.monotonic()
            connection = _h2.Connection(_h2.connect(process.target))
            body = _h2.grpc_prefix(32 << 20) + bytes(1 << 20)
            sent = 0
            try:
                for stream in range(1, 201, 2):
                    connection.send(_h2.open_call(stream, DECODE))
                    connection.send_body(stream, body, wait=0.2)
                    sent += 1
                time.sleep(1)
                closed = ""
            except (BrokenPipeError, ConnectionResetError):
                # The worker may close the whole connection on a flood of
                # refused calls (a loaded machine lets them pile up): a
                # defence, reported, not a failure of the run.
                closed = f", connection closed by the worker after {sent} calls"
            answer = f"{len(connection.reset)} of {max(sent, 1)} refused at once{closed}"
            connection.close()
        return _outcome(
            "100 units without the token", "pool-worker", process, answer, probes, started
        )


def huge_headers_frame(setup: Setup) -> Outcome:
    """D6: 8 connections each sending one 16 MiB HEADERS frame, no token."""
    with worker(setup.binary, None) as process:
        with Probes(lambda: _healthy(process)) as probes:
            started = time.monotonic()
            closed = 0
            for _ in range(8):
                sock = _h2.connect(process.target)
                header = ((1 << 24) - 1).to_bytes(3, "big") + bytes([_h2.HEADERS, _h2.END_HEADERS])
                try:
                    sock.sendall(header + (1).to_bytes(4, "big") + bytes(1 << 20))
                except OSError:
                    pass
                closed += _h2.drain(sock, 2)[1]
                sock.close()
        answer = f"{closed} of 8 connections closed on the frame's header"
        return _outcome(
            "16 MiB HEADERS frames (D6)", "pool-worker", process, answer, probes, started
        )


def stalled_handshakes(setup: Setup) -> Outcome:
    """D8: 4,200 TCP connections that never send a ClientHello."""
    with worker(setup.binary, setup.tls) as process:
        host, port = process.target.split(":")
        with Probes(lambda: _healthy(process)) as probes:
            started = time.monotonic()
            socks = []
            for _ in range(4_200):
                try:
                    socks.append(
                        socket.create_connection(
                            (host, int(port)), timeout=2, source_address=(ATTACKER, 0)
                        )
                    )
                except OSError:
                    break
            time.sleep(5)
            closed = sum(_h2.drain(sock, 0.01)[1] for sock in socks)
            for sock in socks:
                sock.close()
        answer = f"{len(socks)} opened, {closed} closed by the worker within 5 s"
        return _outcome(
            "4,200 stalled TLS handshakes (D8)", "pool-worker", process, answer, probes, started
        )


def health_hold(setup: Setup) -> Outcome:
    """D3: on the worker's health listener, 64 connections each holding a
    header-only Check, then 64 x 8 unfinished 4 MiB Check bodies."""
    with worker(setup.binary, setup.tls) as process:
        probe = Process(process.popen, process.health, process.metrics, process.bound_bytes)
        with Probes(lambda: _healthy(probe)) as probes:
            started = time.monotonic()
            connections, refused = [], 0
            for _ in range(64):
                try:
                    connection = _h2.Connection(_h2.connect(process.health, source=ATTACKER))
                    connection.send(_h2.open_call(1, HEALTH_CHECK))
                    for stream in range(3, 19, 2):
                        connection.send(_h2.open_call(stream, HEALTH_CHECK))
                        body = _h2.grpc_prefix(4 << 20) + bytes(1 << 20)
                        connection.send_body(stream, body, 0.1)
                except OSError:
                    refused += 1
                    continue
                connections.append(connection)
            time.sleep(7)  # past the probe's 5 s request deadline
            ended = sum(len(c.reset) for c in connections)
            for connection in connections:
                connection.close()
        answer = (
            f"{refused} of 64 connections refused (the address's share); "
            f"{ended} of {9 * len(connections)} held checks ended by the listener"
        )
        return _outcome(
            "held health checks (D3)",
            "pool-worker-health",
            process,
            answer,
            probes,
            started,
            lambda: _healthy(probe),
        )


def health_refill(setup: Setup) -> Outcome:
    """D3a: on the worker's health listener, 8 addresses x 8 connections
    (its every place) each holding a header-only Check, reopened at once
    when closed, for 45 s: the kubelet's probes must still be answered."""
    with worker(setup.binary, setup.tls) as process:
        probe = Process(process.popen, process.health, process.metrics, process.bound_bytes)
        return held_places(
            "refilled health checks (D3a)",
            "pool-worker-health",
            probe,
            64,
            "64 held checks from 8 addresses",
            lambda index: _held_call(process.health, HEALTH_CHECK, _attacker(index)),
            lambda: _healthy(probe),
        )


ATTACKS: dict[str, Callable[[Setup], Outcome]] = {
    "hpack": hpack_bomb,
    "streams": stream_flood,
    "bodies": unfinished_bodies,
    "held": held_calls,
    "metrics": metrics_hold,
    "epoch": epoch_bomb,
    "sparse": sparse_index,
    "png16": png_16bit,
    "unauthenticated": unauthenticated_units,
    "frame": huge_headers_frame,
    "handshakes": stalled_handshakes,
    "health": health_hold,
    "health-refill": health_refill,
    "metrics-refill": metrics_refill,
    **parquet_attacks.attacks(),
}


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| attack | listener | answer | peak RSS / bound (MiB) | honest client during / after |",
        "|---|---|---|---|---|",
    ]
    for o in outcomes:
        after = "served" if o.honest_after else "**not served**"
        lines.append(
            f"| {o.attack} | `{o.listener}` | {o.answer} | {o.peak_rss_mib:.0f} / "
            f"{o.bound_mib:.0f} | {o.honest_during:.0%} / {after} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import resource

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--only", choices=sorted(ATTACKS), action="append")
    args = parser.parse_args(argv)
    # The floods open thousands of sockets from this process.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 20_000)), hard))
    from .pool_tls import issue_certificates

    s3, endpoint = start_dev_s3(args.binary, 1, 32)
    outcomes = []
    try:
        with tempfile.TemporaryDirectory(prefix="sf-attacks-") as folder:
            work = Path(folder)
            (work / "tls").mkdir()
            issue_certificates(work / "tls", "shardfeed-pool")
            for name in args.only or list(ATTACKS):
                (work / name).mkdir()
                setup = Setup(args.binary, endpoint, work / "tls", work / name)
                outcome = ATTACKS[name](setup)
                outcomes.append(outcome)
                print(json.dumps({**asdict(outcome), "held": outcome.held}), flush=True)
    finally:
        s3.terminate()
        s3.wait(timeout=30)
    print()
    print(table(outcomes))
    return 0 if all(o.held for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
