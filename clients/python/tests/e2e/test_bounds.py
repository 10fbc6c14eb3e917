"""Every listener's bounds, read back from live processes: a sidecar on a
Unix socket (its gRPC, shared-memory and metrics listeners), one on TCP,
and a pool worker under TLS with its health listener. Each publishes its
bounds as ``shardfeed_listener_bound{listener, bound}``; each cell of
docs/operating.md's table of them must be what the process holds, and a
``—`` cell a bound the listener does not publish."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import (
    S3,
    PoolWorker,
    Server,
    free_port,
    make_pool_tls,
    scrape,
    start_pool_worker,
    stop,
)

REPO = Path(__file__).resolve().parents[4]
HEADING = "### Every listener's bounds, as the process publishes them"
GAUGE = "shardfeed_listener_bound"
UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "s": 1, "min": 60}
# The worker's flags the table's formulas name, as the test starts it.
WORKER_FLAGS = {"max_units": 3, "max_unit_bytes": 5 << 20}


def table() -> dict[str, dict[str, str]]:
    """The docs' table as {bound: {listener: cell}}."""
    lines = (REPO / "docs" / "operating.md").read_text().splitlines()
    start = lines.index(HEADING)
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    listeners = [cell.strip("`") for cell in rows[0][1:]]
    cells: dict[str, dict[str, str]] = {}
    for row in rows[2:]:
        found = re.search(r"\(`(\w+)`\)", row[0])
        assert found, f"a row without its bound's name: {row[0]}"
        cells[found.group(1)] = dict(zip(listeners, row[1:]))
    return cells


def expected(cell: str) -> float | None:
    """A cell's value in counts, bytes or seconds; None for ``—``."""
    if cell.startswith("—"):
        return None
    if cell.startswith("`"):
        formula = cell.strip("`").replace("×", "*")
        assert re.fullmatch(r"[\w\s()*+]+", formula), formula
        return float(eval(formula, {"__builtins__": {}}, dict(WORKER_FLAGS)))
    found = re.match(r"([\d,]+)\s*(B|KiB|MiB|GiB|s|min)?(?:\b|$|,)", cell)
    assert found, f"a cell that is neither a value, a formula nor a dash: {cell}"
    return float(found.group(1).replace(",", "")) * UNITS[found.group(2) or ""]


def published(metrics_url: str) -> dict[tuple[str, str], float]:
    """{(listener, bound): value} of one process."""
    bounds = {}
    for name, value in scrape(metrics_url).items():
        if name.startswith(GAUGE + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', name))
            bounds[(labels["listener"], labels["bound"])] = value
    return bounds


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PoolWorker, str, str]]:
    """The worker, its metrics URL and its health listener's address."""
    # The pool's certificates are issued by the benchmarks package's
    # helper, which the lowest-versions venv does not install.
    pytest.importorskip("shardfeed_benchmarks")
    directory = tmp_path_factory.mktemp("bounds")
    token = directory / "token"
    token.write_text(secrets.token_hex(16))
    tls = make_pool_tls(directory / "tls")
    health = free_port()
    started = start_pool_worker(
        "127.0.0.1",
        token,
        *tls.worker_flags,
        *("--health-listen", f"127.0.0.1:{health}"),
        *("--max-units", str(WORKER_FLAGS["max_units"])),
        *("--max-unit-bytes", str(WORKER_FLAGS["max_unit_bytes"])),
    )
    yield started, started.metrics, f"127.0.0.1:{health}"
    stop(started.process)


def test_every_listener_publishes_the_bounds_the_docs_state(
    s3: S3, unix_server: Server, server: Server, worker: tuple[PoolWorker, str, str]
) -> None:
    del s3
    processes = {
        "unix": unix_server.metrics_url,
        "shm": unix_server.metrics_url,
        "tcp": server.metrics_url,
        "metrics": server.metrics_url,
        "pool-worker": worker[1],
        "pool-worker-health": worker[1],
    }
    live = {url: published(url) for url in set(processes.values())}
    cells = table()
    assert set(next(iter(cells.values()))) == set(processes), "the table's listeners"
    checked, problems = 0, []
    for bound, row in cells.items():
        for listener, cell in row.items():
            want = expected(cell)
            got = live[processes[listener]].get((listener, bound))
            if got != want:
                problems.append(f"{listener} {bound}: docs say {cell!r}, the process holds {got}")
            checked += 1
    # And nothing published that the table leaves out.
    for bounds in live.values():
        for listener, bound in bounds:
            if listener in processes and bound not in cells:
                problems.append(f"{listener} publishes {bound}, which the table has no row for")
    assert not problems, "\n".join(problems)
    assert checked == len(cells) * len(processes) >= 90
    # The metrics listener of every process publishes alike.
    assert published(worker[1])[("metrics", "connections")] == 32


REQUEST_BYTES = "request_bytes"
CUT_FOR_SIZE = 'shardfeed_requests_cut_total{reason="size"}'


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _message_of(length: int) -> bytes:
    """A message of exactly ``length`` bytes that every request type
    decodes: one unknown length-delimited field (15), which protobuf skips."""
    for payload in range(length, -1, -1):
        field = b"\x7a" + _varint(payload) + bytes(payload)
        if len(field) == length:
            return field
    raise AssertionError(length)


def test_the_request_size_a_listener_publishes_is_the_size_it_takes(
    s3: S3, unix_server: Server, server: Server, worker: tuple[PoolWorker, str, str]
) -> None:
    """A body of exactly the published ``request_bytes`` (gRPC's 5-byte
    prefix and the message) is taken; one byte more is refused on its
    prefix, ``OUT_OF_RANGE``, and counted: the caps the process enforces
    (the listener's and tonic's decode cap) are the figure it publishes."""
    import grpc

    del s3
    cases = [
        ("unix", unix_server.target, unix_server.metrics_url, "/shardfeed.v1.Shardfeed/Describe"),
        ("tcp", server.target, server.metrics_url, "/shardfeed.v1.Shardfeed/Describe"),
        ("pool-worker-health", worker[2], worker[1], "/grpc.health.v1.Health/Check"),
    ]
    for listener, target, metrics_url, path in cases:
        bound = int(published(metrics_url)[(listener, REQUEST_BYTES)])
        options: list[tuple[str, object]] = [("grpc.use_local_subchannel_pool", 1)]
        if target.startswith("unix:"):
            options.append(("grpc.default_authority", "localhost"))
            address = "unix://" + target.removeprefix("unix:")
        else:
            address = target
        with grpc.insecure_channel(address, options=options) as channel:
            call = channel.unary_unary(path)
            before = scrape(metrics_url).get(CUT_FOR_SIZE, 0.0)
            try:
                call(_message_of(bound - 5), timeout=10)
            except grpc.RpcError as error:
                # Describe without a dataset: refused for what it says.
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (listener, error)
            assert scrape(metrics_url).get(CUT_FOR_SIZE, 0.0) == before, listener
            with pytest.raises(grpc.RpcError) as refused:
                call(_message_of(bound - 4), timeout=10)
            assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE, (listener, refused.value)
            assert f"at most {bound - 5}" in str(refused.value.details()), refused.value
            assert scrape(metrics_url).get(CUT_FOR_SIZE, 0.0) == before + 1, listener
