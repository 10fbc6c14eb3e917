"""The shared-memory socket's connect: a full accept backlog (EAGAIN at
once on a Unix socket) is a busy server, retried until it accepts."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from shardfeed._shm import SharedRing, _connect_unix

SIZE = 4096


def _full_listener(path: str) -> tuple[socket.socket, list[socket.socket]]:
    """A listener whose backlog is full: one more connect gets EAGAIN."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    waiting = []
    for _ in range(64):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.setblocking(False)
        try:
            probe.connect(path)
        except BlockingIOError:
            probe.close()
            return server, waiting
        waiting.append(probe)
    pytest.skip("this kernel never refused a connect on a full backlog")


def test_a_full_backlog_is_waited_out(tmp_path: Path) -> None:
    path = str(tmp_path / "grpc.sock")
    server, waiting = _full_listener(path + ".fds")

    def serve() -> None:
        time.sleep(0.3)  # the client meets a full backlog meanwhile
        for _ in waiting:
            server.accept()[0].close()
        connection, _ = server.accept()
        connection.recv(16)
        memory = os.memfd_create("ring")
        os.ftruncate(memory, SIZE)
        socket.send_fds(connection, [b"x"], [memory])
        os.close(memory)
        time.sleep(0.2)
        connection.close()

    thread = threading.Thread(target=serve)
    thread.start()
    started = time.monotonic()
    ring = SharedRing(path, b"token", SIZE)
    assert time.monotonic() - started >= 0.25, "connected only once the backlog drained"
    thread.join()
    del ring
    for probe in waiting:
        probe.close()
    server.close()


def test_a_backlog_that_stays_full_ends_in_a_timeout_naming_it(tmp_path: Path) -> None:
    path = str(tmp_path / "grpc.sock.fds")
    server, waiting = _full_listener(path)
    with pytest.raises(TimeoutError, match="accept backlog"):
        _connect_unix(path, 0.3)
    for probe in waiting:
        probe.close()
    server.close()
