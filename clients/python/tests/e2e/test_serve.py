"""shardfeed.serve(): a local sidecar from Python, and nothing left behind."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

import shardfeed
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


def test_the_metrics_url_serves_the_servers_metrics(s3: S3, dataset: str) -> None:
    with Server(binary=binary(), env=_env(s3)) as server:
        list(Client(server.target).batches(dataset, batch_size=8, image_size=16))
        url = server.metrics_url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), url
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    assert "shardfeed_batches_total" in text, text[:500]


def test_pack_reports_classes_and_every_skipped_file(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    for label, count in (("cat", 5), ("dog", 3), ("empty", 0)):
        (folder / label).mkdir(parents=True)
        for i in range(count):
            (folder / label / f"{i}.jpg").write_bytes(noise_jpeg(40 + i, 24, 32))
    (folder / "cat" / "notes.txt").write_text("not an image")
    (folder / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 truncated")

    report = shardfeed.pack(folder, tmp_path / "packed", binary=binary(), progress=False)
    assert report.dataset == (tmp_path / "packed").resolve().as_uri() + "/"
    assert str(report) == report.dataset
    assert (report.samples, report.shards) == (8, 1)
    assert report.classes == ("cat", "dog", "empty")
    reasons = {Path(s.path).name: s.reason for s in report.skipped}
    assert set(reasons) == {"notes.txt", "broken.jpg", "empty"}, reasons
    assert all(reasons.values())

    # The server names the labels, and so does a fresh index of the shards.
    with serve(binary=binary()) as target:
        client = Client(target)
        assert client.describe(report.dataset, world_size=1, batch_size=1).classes == report.classes
        subprocess.run([str(binary()), "index", report.dataset], check=True, capture_output=True)
        info = Client(target).describe(report.dataset, world_size=1, batch_size=1)
    assert info.classes == report.classes
    assert info.class_to_idx == {"cat": 0, "dog": 1, "empty": 2}


def test_the_cli_draws_no_progress_into_a_pipe(tmp_path: Path) -> None:
    folder = tmp_path / "photos" / "only"
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"{i}.jpg").write_bytes(noise_jpeg(i, 24, 32))
    done = subprocess.run(
        [str(binary()), "pack", str(tmp_path / "photos"), (tmp_path / "out").as_uri() + "/"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "packing" not in done.stderr and "\r" not in done.stderr, done.stderr
    assert done.stdout.startswith("packed 3 samples into 1 shards"), done.stdout


def test_the_python_demo_streams_from_loopback_s3() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shardfeed.demo", "--binary", str(binary()), "--epochs", "1"]
        + ["--shards", "2", "--samples-per-shard", "32", "--batch-size", "16"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "images uint8 (16, 224, 224, 3)" in done.stdout, done.stdout
    assert "epoch 0: 64 samples" in done.stdout, done.stdout
