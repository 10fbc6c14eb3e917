"""The client's pure-Python surface: no server needed."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from shardfeed import Client, EpochPosition, ShardfeedError, distributed_rank_and_world
from shardfeed._augment import _image_size
from shardfeed._request import _partition


def test_rank_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed_rank_and_world() == (0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert distributed_rank_and_world() == (3, 8)


def test_image_size_and_partition_parsing() -> None:
    assert _image_size(224) == (224, 224)
    assert _image_size((120, 160)) == (120, 160)
    assert _partition("pad") == 1
    with pytest.raises(ValueError, match="partition must be one of"):
        _partition("nope")


def test_position_round_trips_through_a_checkpoint() -> None:
    position = EpochPosition(((8, 100), (4, 20)))
    assert EpochPosition.from_dict(position.to_dict()) == position


def test_errors_and_clients_pickle() -> None:
    error = ShardfeedError("NOT_FOUND", "s3://b not found")
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, ShardfeedError)
    assert (again.code, again.message) == ("NOT_FOUND", "s3://b not found")
    detailed = ShardfeedError(
        "UNAVAILABLE", "draining", "SERVER_DRAINING", {"position": "8:3,4:2", "dataset": "d"}, 1.0
    )
    again = pickle.loads(pickle.dumps(detailed))
    assert (again.reason, again.metadata, again.retry_delay) == (
        "SERVER_DRAINING",
        {"position": "8:3,4:2", "dataset": "d"},
        1.0,
    )
    assert again.resume_position() == EpochPosition(((8, 3), (4, 2)), "d")
    assert error.resume_position() is None
    client = pickle.loads(
        pickle.dumps(Client("unix:///tmp/x.sock", call_timeout=3.0, batch_timeout=None))
    )
    assert client.target == "unix:///tmp/x.sock"
    assert (client._call_timeout, client._batch_timeout) == (3.0, None)
    # The former name of call_timeout still works.
    assert Client("127.0.0.1:1", timeout=7.0)._call_timeout == 7.0


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_timeout must be positive"):
        Client("127.0.0.1:1", batch_timeout=0)


def test_bad_resize_is_rejected_before_any_rpc() -> None:
    with pytest.raises(ValueError, match="resize must be one of"):
        Client("127.0.0.1:1").batches("s3://b/", resize="squash")


def test_waiting_for_a_server_that_is_not_there_names_it(tmp_path: Path) -> None:
    target = f"unix:{tmp_path}/absent.sock"
    with Client(target) as client, pytest.raises(ShardfeedError) as raised:
        client.wait_until_serving(timeout=0.3)
    assert raised.value.code == "DEADLINE_EXCEEDED"
    assert target in str(raised.value)


def test_the_target_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDFEED_TARGET", "unix:///run/shardfeed/sf.sock")
    assert Client().target == "unix:///run/shardfeed/sf.sock"
    assert Client("10.0.0.1:5").target == "10.0.0.1:5"
    monkeypatch.delenv("SHARDFEED_TARGET")
    assert Client().target == "127.0.0.1:50051"
    with pytest.raises(ValueError, match="reconnect_timeout"):
        Client(reconnect_timeout=-1)
    again = pickle.loads(pickle.dumps(Client(reconnect_timeout=7)))
    assert again._reconnect_timeout == 7


def test_declared_floors_are_the_versions_ci_tests() -> None:
    """pyproject's lower bounds and requirements-min.txt's pins are one list."""
    tomllib = pytest.importorskip("tomllib")
    here = Path(__file__).resolve().parents[2]
    declared = tomllib.loads((here / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = dict(spec.split(">=") for spec in declared)
    pins = dict(
        line.split("==")
        for line in (here / "requirements-min.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert floors == {name: pins[name] for name in floors}, "keep the two files together"


SIDECAR_CHART = "helm/shardfeed/charts/shardfeed-sidecar"


def test_one_version_for_the_crate_the_package_and_the_chart() -> None:
    """The server wheel takes Cargo.toml's version by construction."""
    import re

    import shardfeed

    repo = Path(__file__).resolve().parents[4]
    if not (repo / "Cargo.toml").exists():
        pytest.skip("not in a checkout of the repository")

    def field(path: str, pattern: str) -> str:
        found = re.search(pattern, (repo / path).read_text(), re.M)
        assert found is not None, f"no version in {path}"
        return found.group(1)

    versions = {
        "Cargo.toml": field("Cargo.toml", r'^version = "([^"]+)"'),
        "clients/python/pyproject.toml": field(
            "clients/python/pyproject.toml", r'^version = "([^"]+)"'
        ),
        "server extra": field("clients/python/pyproject.toml", r'"shardfeed-server==([^"]+)"'),
        "shardfeed.__version__": shardfeed.__version__,
        "helm appVersion": field("helm/shardfeed/Chart.yaml", r'^appVersion: "([^"]+)"'),
        "helm version": field("helm/shardfeed/Chart.yaml", r"^version: (\S+)"),
        "the chart's library": field(
            "helm/shardfeed/Chart.yaml", r"name: shardfeed-sidecar\n\s+version: (\S+)"
        ),
        "library version": field(SIDECAR_CHART + "/Chart.yaml", r"^version: (\S+)"),
        "library appVersion": field(SIDECAR_CHART + "/Chart.yaml", r'^appVersion: "([^"]+)"'),
        "the image's default tag": field(SIDECAR_CHART + "/values.yaml", r'^  tag: "([^"]+)"'),
        "the Kustomize component's image": field(
            "helm/kustomize/shardfeed-sidecar/sidecar.yaml", r"image: \S+:([0-9][^\s\"]*)"
        ),
    }
    assert len(set(versions.values())) == 1, versions
