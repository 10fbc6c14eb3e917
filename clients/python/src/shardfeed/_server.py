"""A local sidecar started from Python, for single-host jobs without Kubernetes."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ._client import Client
from ._wire import ShardfeedError

# The server exits with the *thread* that forked it (PR_SET_PDEATHSIG is
# per thread, --exit-with-parent): servers are forked from one thread that
# lives as long as this process, not from whichever thread called start().
_spawner: concurrent.futures.ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _spawn(command: list[str], **options: Any) -> subprocess.Popen[bytes]:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="shardfeed-spawner"
            )

    def popen() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, **options)

    return _spawner.submit(popen).result()


__all__ = ["PackReport", "Server", "SkippedFile", "pack", "serve"]

_server_log = logging.getLogger("shardfeed.server")
_log = logging.getLogger("shardfeed")
_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
}
# Log lines kept to explain a server that failed to start.
_KEPT_LINES = 20


def find_binary(binary: str | os.PathLike[str] | None = None) -> Path:
    """The sidecar executable: ``binary``, else ``$SHARDFEED_BIN``, else the
    one the ``shardfeed-server`` wheel installed, else ``shardfeed`` on PATH."""
    if binary is not None:
        return Path(binary)
    if os.environ.get("SHARDFEED_BIN"):
        return Path(os.environ["SHARDFEED_BIN"])
    try:
        import shardfeed_server

        return shardfeed_server.binary()
    except (ImportError, FileNotFoundError):
        pass
    found = shutil.which("shardfeed")
    if found is None:
        raise FileNotFoundError(
            "no shardfeed binary: the shardfeed-server wheel is not installed, no shardfeed "
            "is on PATH and $SHARDFEED_BIN is not set. From a checkout of the repository, "
            "`bash clients/python/install.sh` builds both wheels (needs Rust: "
            "https://rustup.rs) and installs them into this Python; or set SHARDFEED_BIN "
            "to a shardfeed binary you built (cargo build --release)"
        )
    return Path(found)


class Server:
    """A ``shardfeed serve`` child process on a private Unix socket.

    ``start()`` returns once the server's health says SERVING (the target to
    pass to :class:`Client` or ``ShardfeedDataset``); its log lines go to
    the ``shardfeed.server`` logger at their own levels. ``stop()`` (or
    leaving the ``with`` block) drains it (SIGTERM) and waits. The server
    also shuts itself down when this process exits, however it exits (the
    kernel signals it: ``--exit-with-parent``), so no server is left behind.
    ``args`` are more ``shardfeed serve`` flags (``--cache-dir``,
    ``--s3-endpoint`` ...); the environment (AWS credentials) is inherited,
    with ``env`` added.
    """

    def __init__(
        self,
        *args: str,
        binary: str | os.PathLike[str] | None = None,
        metrics_listen: str = "127.0.0.1:0",
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 120.0,
        stop_timeout: float = 60.0,
    ) -> None:
        self.binary = find_binary(binary)
        self.args = args
        self.metrics_listen = metrics_listen
        self.env = dict(os.environ, **(env or {}))
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.target = ""
        self._metrics_address: str | None = None
        self._metrics_known = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._directory: str | None = None
        self._logger: threading.Thread | None = None
        self._recent: deque[str] = deque(maxlen=_KEPT_LINES)

    def start(self) -> str:
        if self._process is not None:
            raise RuntimeError("this Server is already started")
        # Unix socket paths are limited to 108 bytes: a short directory.
        self._directory = tempfile.mkdtemp(prefix="shardfeed-")
        self.target = f"unix://{self._directory}/shardfeed.sock"
        command = [
            str(self.binary),
            "serve",
            "--listen",
            f"unix:{self._directory}/shardfeed.sock",
            "--metrics-listen",
            self.metrics_listen,
            "--log-format",
            "json",
            "--exit-with-parent",
            str(os.getpid()),
            *self.args,
        ]
        self._process = _spawn(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        assert self._process.stdout is not None
        self._logger = threading.Thread(
            target=self._forward_logs, args=(self._process.stdout,), daemon=True
        )
        self._logger.start()
        deadline = time.monotonic() + self.startup_timeout
        client = Client(self.target, reconnect_timeout=0)
        while True:
            try:
                # In short waits, to notice a server that exited at once.
                client.wait_until_serving(min(1.0, max(0.05, deadline - time.monotonic())))
                client.close()
                return self.target
            except ShardfeedError as error:
                code = self._process.poll()
                if code is None and time.monotonic() < deadline:
                    continue
                client.close()
                self.stop()
                said = "\n".join(self._recent)
                state = f"exited with {code}" if code is not None else "did not become SERVING"
                raise RuntimeError(
                    f"shardfeed serve {state} ({error.message}); its log:\n{said}"
                ) from None

    @property
    def pid(self) -> int:
        """The server's process id (to pin it to cores, or read its CPU time)."""
        if self._process is None:
            raise RuntimeError("this Server is not started")
        return self._process.pid

    @property
    def metrics_url(self) -> str:
        """The server's Prometheus endpoint, ``http://host:port/metrics``
        (``metrics_listen`` port 0, the default, is a free port it chose)."""
        if self._process is None:
            raise RuntimeError("this Server is not started")
        # Said in its start-up line, which the log thread may still be reading.
        if not self._metrics_known.wait(10.0) or self._metrics_address is None:
            raise RuntimeError("the server's start-up log did not say its metrics address")
        return f"http://{self._metrics_address}/metrics"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(self.stop_timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if self._logger is not None:
                self._logger.join(timeout=5)
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _forward_logs(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            self._recent.append(line)
            try:
                record = json.loads(line)
                fields = dict(record.get("fields", {}))
                message = str(fields.pop("message", ""))
                level = _LEVELS.get(str(record.get("level", "")), logging.INFO)
                if message == "shardfeed serving" and "metrics" in fields:
                    self._metrics_address = str(fields["metrics"])
                    self._metrics_known.set()
                extra = " ".join(f"{k}={v}" for k, v in fields.items())
                _server_log.log(level, "%s%s", message, f" {extra}" if extra else "")
            except (ValueError, AttributeError):
                _server_log.info("%s", line)


@contextlib.contextmanager
def serve(*args: str, **options: Any) -> Iterator[str]:
    """``with shardfeed.serve() as target:`` a local sidecar (see :class:`Server`)."""
    with Server(*args, **options) as server:
        yield server.target


@dataclass(frozen=True)
class SkippedFile:
    """A file ``pack`` left out, and why (not an image, unreadable, an
    empty class folder...)."""

    path: str
    reason: str


@dataclass(frozen=True)
class PackReport:
    """What :func:`pack` wrote: ``dataset`` is the URI to stream
    (``file://`` for a local directory); ``classes[i]`` names label ``i``
    (empty where the labels were integers); ``skipped`` lists every file
    left out with its reason."""

    dataset: str
    samples: int
    shards: int
    bytes: int
    seconds: float
    classes: tuple[str, ...]
    skipped: tuple[SkippedFile, ...]

    def __str__(self) -> str:
        return self.dataset


def pack(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *args: str,
    binary: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> PackReport:
    """``shardfeed pack``: an image folder (one directory per class, or with
    ``--manifest``) into tar shards and their index at ``dest``, a local
    directory or an ``s3://`` prefix; ``args`` are more ``shardfeed pack``
    flags (``--shard-size``, ``--manifest`` ...).

    Returns a :class:`PackReport`; ``report.dataset`` is the URI to
    stream. ``progress``: draw the
    progress bar on stderr (default: when stderr is a terminal; in a pipe or
    a notebook's captured output, nothing until the end). Skipped files are
    logged on the ``shardfeed`` logger as warnings. Raises ``RuntimeError``
    with the command's error if it fails."""
    target = str(dest)
    if "://" not in target:
        target = Path(target).resolve().as_uri() + "/"
    if progress is None:
        progress = sys.stderr.isatty()
    with tempfile.TemporaryDirectory(prefix="shardfeed-pack-") as directory:
        report_path = Path(directory, "report.json")
        command = [str(find_binary(binary)), "pack", str(source), target, *args]
        command += ["--report", str(report_path)]
        # With the progress bar, stderr is the terminal's: the bar draws
        # there, and so does an error (the exception says where to look).
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=None if progress else subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            said = done.stderr if not progress else "(its error is printed above)"
            raise RuntimeError(f"shardfeed pack failed ({done.returncode}):\n{said}")
        written = json.loads(report_path.read_text())
    report = PackReport(
        dataset=target,
        samples=int(written["samples"]),
        shards=int(written["shards"]),
        bytes=int(written["bytes"]),
        seconds=float(written["seconds"]),
        classes=tuple(written["classes"]),
        skipped=tuple(SkippedFile(s["path"], s["reason"]) for s in written["skipped"]),
    )
    for skipped in report.skipped:
        _log.warning("pack skipped %s: %s", skipped.path, skipped.reason)
    return report
