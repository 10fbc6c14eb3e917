"""What every attack of the hostile-client run (``attacks``) is given and
gives back: the process under attack (a fresh sidecar or pool worker), the
honest client probing it while the attack runs, the attacker's refilled
connections, and the row an attack reports."""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .delivered import _free_port, _shardfeed_env
from .memory import _status_kib

DATASET = "s3://demo/photos/"
SIDECAR_LIMIT = 512 << 20
STREAM_BATCHES = "/shardfeed.v1.Shardfeed/StreamBatches"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
DECODE = "/shardfeed.pool.v1.DecodePool/Decode"
# Attacks on TCP come from another loopback address than the honest
# client's, as they would from another host: bounds per address then tell
# the two apart.
ATTACKER = "127.0.0.2"


@dataclass(frozen=True)
class Setup:
    """What every attack is given: the binary, the S3 stand-in's endpoint,
    the pool's TLS files and a folder of the attack's own."""

    binary: str
    endpoint: str
    tls: Path
    work: Path


@dataclass
class Process:
    """A shardfeed process under attack."""

    popen: subprocess.Popen[bytes]
    target: str
    metrics: str
    bound_bytes: int
    health: str = ""
    tls: Path | None = None
    log: list[str] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return _status_kib(self.popen.pid, "VmHWM") * 1024

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Outcome:
    attack: str
    listener: str
    answer: str
    peak_rss_mib: float
    bound_mib: float
    honest_during: float
    honest_after: bool
    seconds: float
    alive: bool
    # The share of honest probes the attack must leave served while it runs
    # (0: not asked of it; the place-holding attacks ask 95%).
    during_floor: float = 0.0
    # False when the attacker was answered other than the attack expects
    # (a file served that must be refused, or the reverse).
    answer_as_expected: bool = True

    @property
    def held(self) -> bool:
        return (
            self.answer_as_expected
            and self.alive
            and self.honest_after
            and self.peak_rss_mib <= self.bound_mib
            and self.honest_during >= self.during_floor
        )


def _drain_log(process: Process) -> None:
    assert process.popen.stderr is not None
    for line in process.popen.stderr:
        process.log.append(line.decode(errors="replace"))


@contextmanager
def sidecar(
    binary: str, endpoint: str, *flags: str, tcp: bool = False, limit: int = SIDECAR_LIMIT
) -> Iterator[Process]:
    folder = tempfile.TemporaryDirectory(prefix="sf-")
    listen = f"127.0.0.1:{_free_port()}" if tcp else f"unix:{folder.name}/sf.sock"
    metrics = f"127.0.0.1:{_free_port()}"
    popen = subprocess.Popen(
        [binary, "serve", "--listen", listen, "--metrics-listen", metrics]
        + ["--memory-limit", str(limit), *flags],
        env=dict(_shardfeed_env(endpoint), SHARDFEED_LOG="warn"),
        stderr=subprocess.PIPE,
    )
    process = Process(popen, listen, f"http://{metrics}/metrics", limit)
    threading.Thread(target=_drain_log, args=(process,), daemon=True).start()
    try:
        _wait(lambda: _healthy(process), 60, "the sidecar", process)
        yield process
    finally:
        popen.terminate()
        popen.wait(timeout=60)
        folder.cleanup()


@contextmanager
def worker(binary: str, tls: Path | None, *flags: str) -> Iterator[Process]:
    folder = tempfile.TemporaryDirectory(prefix="sf-worker-")
    token = Path(folder.name, "token")
    token.write_text(secrets.token_hex(16))
    listen, health = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    metrics = f"127.0.0.1:{_free_port()}"
    tls_flags: list[str] = []
    if tls is not None:
        tls_flags = ["--tls-ca", f"{tls}/ca.crt", "--tls-cert", f"{tls}/tls.crt"]
        tls_flags += ["--tls-key", f"{tls}/tls.key"]
    popen = subprocess.Popen(
        [binary, "pool-worker", "--listen", listen, "--metrics-listen", metrics]
        + ["--health-listen", health, "--token-file", str(token), "--decode-threads", "1"]
        + ["--max-units", "8", *tls_flags, *flags],
        env=dict(os.environ, SHARDFEED_LOG="info"),
        stderr=subprocess.PIPE,
    )
    process = Process(popen, listen, f"http://{metrics}/metrics", 0, health, tls)
    threading.Thread(target=_drain_log, args=(process,), daemon=True).start()
    try:
        _wait(lambda: _healthy(process), 60, "the worker", process)
        # The log is coloured: the escapes go first.
        plain = re.sub(r"\x1b\[[0-9;]*m", "", "".join(process.log))
        found = re.search(r"memory_bound_mib=(\d+)", plain)
        assert found, "the worker logs its memory bound at start"
        process.bound_bytes = int(found.group(1)) << 20
        yield process
    finally:
        popen.terminate()
        popen.wait(timeout=60)
        folder.cleanup()


def _wait(ready: Callable[[], bool], seconds: float, what: str, process: Process) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline or not process.alive():
            time.sleep(0.2)
            raise RuntimeError(f"{what} did not come up: {''.join(process.log)[-2000:]}")
        time.sleep(0.1)


def _healthy(process: Process, timeout: float = 2.0) -> bool:
    """A gRPC health check over a fresh connection: what an honest client
    (a trainer, or the kubelet's probe on the worker's health listener)
    needs answered."""
    import grpc

    target = process.target
    # A connection of its own each time: gRPC shares subchannels between
    # channels, and one refused while the listener was full would carry
    # its reconnect backoff into the next probe.
    options: list[tuple[str, Any]] = [("grpc.use_local_subchannel_pool", 1)]
    if target.startswith("unix:"):
        options.append(("grpc.default_authority", "localhost"))
        channel = grpc.insecure_channel("unix://" + target.removeprefix("unix:"), options=options)
    elif process.tls is not None:
        tls = process.tls
        credentials = grpc.ssl_channel_credentials(
            (tls / "ca.crt").read_bytes(),
            (tls / "tls.key").read_bytes(),
            (tls / "tls.crt").read_bytes(),
        )
        options.append(("grpc.ssl_target_name_override", "shardfeed-pool"))
        channel = grpc.secure_channel(target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    with channel:
        check = channel.unary_unary(HEALTH_CHECK)
        try:
            return bool(check(b"", timeout=timeout) == b"\x08\x01")
        except grpc.RpcError:
            return False


def _scraped(process: Process, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(process.metrics, timeout=timeout) as answer:
            return b"shardfeed_" in answer.read()
    except OSError:
        return False


class _Background:
    """Work a thread does, in ``_run`` until ``stop`` is set, for as long as
    the ``with`` block runs."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def _closed(self) -> None:
        """What is left to let go of once the thread has stopped."""

    def __enter__(self) -> Any:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()
        self._closed()


class Probes(_Background):
    """Honest requests every half second while an attack runs."""

    def __init__(self, probe: Callable[[], bool]) -> None:
        super().__init__()
        self.probe = probe
        self.results: list[bool] = []

    def _run(self) -> None:
        while not self.stop.is_set():
            self.results.append(self.probe())
            self.stop.wait(0.5)

    @property
    def share(self) -> float:
        return sum(self.results) / max(len(self.results), 1)


def _outcome(
    attack: str,
    listener: str,
    process: Process,
    answer: str,
    probes: Probes,
    started: float,
    after: Callable[[], bool] | None = None,
    during_floor: float = 0.0,
) -> Outcome:
    """The attack's row; ``after`` probes the honest client (default: a
    health check over a fresh connection) until it is served, 10 s at most."""
    after = after or (lambda: _healthy(process))
    seconds = time.monotonic() - started
    served_after = False
    for _ in range(20):
        if after():
            served_after = True
            break
        time.sleep(0.5)
    return Outcome(
        attack,
        listener,
        answer,
        round(process.peak_bytes / (1 << 20), 1),
        round(process.bound_bytes / (1 << 20), 1),
        round(probes.share, 2),
        served_after,
        round(seconds, 2),
        process.alive(),
        during_floor,
    )


# The place-holding attacks run this long, refilling every connection the
# server closes, with the honest client probing throughout.
HOLD_SECONDS = 45.0
# The share of those probes that must be served.
SERVED_WHILE_HELD = 0.95


class Refilled(_Background):
    """Connections that ``open_one(index)`` opens and that are opened again
    at once whenever the server closes one, for as long as the block runs:
    what an attacker who wants to keep a listener's places does."""

    def __init__(self, count: int, open_one: Callable[[int], socket.socket]) -> None:
        self.open_one = open_one
        self.count = count
        self.socks: dict[int, socket.socket] = {}
        self.failed_opens = 0
        self.refills = 0
        for index in range(count):
            self._open(index)
        super().__init__()

    def _open(self, index: int) -> None:
        try:
            self.socks[index] = self.open_one(index)
        except OSError:
            self.failed_opens += 1

    def _run(self) -> None:
        import selectors

        while not self.stop.is_set():
            with selectors.DefaultSelector() as selector:
                for index, sock in self.socks.items():
                    sock.setblocking(False)
                    selector.register(sock, selectors.EVENT_READ, index)
                closed = []
                for key, _ in selector.select(timeout=0.05):
                    try:
                        if not key.fileobj.recv(1 << 16):  # type: ignore[union-attr]
                            closed.append(key.data)
                    except BlockingIOError:
                        pass
                    except OSError:
                        closed.append(key.data)
            for index in closed:
                self.socks.pop(index).close()
            for index in range(self.count):
                if index not in self.socks and not self.stop.is_set():
                    self.refills += 1
                    self._open(index)

    def _closed(self) -> None:
        for sock in self.socks.values():
            sock.close()


def held_places(
    attack: str,
    listener: str,
    process: Process,
    count: int,
    what: str,
    open_one: Callable[[int], socket.socket],
    probe: Callable[[], bool],
) -> Outcome:
    """``count`` connections that ``open_one`` opens, each opened again at
    once when the server closes it, for ``HOLD_SECONDS``, while ``probe``
    (the honest client) must be served ``SERVED_WHILE_HELD`` of the time."""
    with Probes(probe) as probes:
        started = time.monotonic()
        refilled = Refilled(count, open_one)
        with refilled:
            time.sleep(HOLD_SECONDS)
    answer = (
        f"{what}, {refilled.refills} reopened after the server closed them "
        f"({refilled.failed_opens} opens failed) over {HOLD_SECONDS:.0f} s"
    )
    return _outcome(
        attack, listener, process, answer, probes, started, probe, during_floor=SERVED_WHILE_HELD
    )
