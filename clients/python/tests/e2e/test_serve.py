"""shardfeed.serve(): a local sidecar from Python, and nothing left behind."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shardfeed import Client, Server, serve

from ..conftest import ACCESS_KEY, S3, SECRET_KEY, binary, noise_jpeg, upload, write_tar


def _env(s3: S3) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": "us-east-1",
        "SHARDFEED_S3_ENDPOINT": s3.endpoint,
        "SHARDFEED_S3_FORCE_PATH_STYLE": "true",
    }


@pytest.fixture(scope="module")
def dataset(s3: S3) -> str:
    shard = write_tar(
        [(f"s{i:03d}", {"jpg": noise_jpeg(700 + i, 32, 40), "cls": b"%d" % i}) for i in range(24)]
    )
    return upload(s3, "serve", "", [shard])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is gone for our purpose.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_serve_streams_logs_and_cleans_up(
    s3: S3, dataset: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="shardfeed.server"):
        with serve(binary=binary(), env=_env(s3)) as target:
            assert target.startswith("unix://")
            socket = Path(target[len("unix://") :])
            assert socket.exists()
            batches = list(Client(target).batches(dataset, batch_size=8, image_size=16))
            assert [len(b.keys) for b in batches] == [8, 8, 8]
    assert not socket.parent.exists(), "the private socket directory is removed"
    messages = [r.getMessage() for r in caplog.records if r.name == "shardfeed.server"]
    assert any("ready: SERVING" in m for m in messages), messages
    assert any("stream started" in m for m in messages)


def test_a_server_that_cannot_start_says_why(s3: S3) -> None:
    with pytest.raises(RuntimeError, match="exited with") as raised:
        Server("--cache-size", "lots", binary=binary(), env=_env(s3)).start()
    assert "lots" in str(raised.value), "its log is in the error"


def test_a_killed_parent_leaves_no_server(s3: S3, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from shardfeed import Server
        server = Server(binary={str(binary())!r})
        server.start()
        print(server._process.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the server exits with the process that started it"


def test_a_server_started_from_a_thread_that_ends_keeps_serving(s3: S3, dataset: str) -> None:
    import threading

    servers: list[Server] = []
    starter = threading.Thread(
        target=lambda: servers.append(_started(Server(binary=binary(), env=_env(s3))))
    )
    starter.start()
    starter.join()
    (server,) = servers
    try:
        time.sleep(1.0)  # the starting thread is gone; the server must not be
        assert server._process is not None and server._process.poll() is None
        batches = list(Client(server.target).batches(dataset, batch_size=8, image_size=16))
        assert len(batches) == 3
    finally:
        server.stop()


def _started(server: Server) -> Server:
    server.start()
    return server
