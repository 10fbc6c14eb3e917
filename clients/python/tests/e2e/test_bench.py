"""The delivered-into-Python benchmark runs end to end (tiny sizes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed_benchmarks import delivered

from ..conftest import binary


def test_benchmark_compares_both_loaders(capsys: pytest.CaptureFixture[str]) -> None:
    code = delivered.main(
        [
            "--synthetic",
            "--binary",
            str(binary()),
            "--shards",
            "2",
            "--samples-per-shard",
            "12",
            "--batch-size",
            "8",
            "--image-size",
            "32",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ours, baseline = result["shardfeed"], result["pillow_dataloader"]
    # 24 samples in batches of 8: shardfeed (drop_last) and the baseline's
    # two workers (12 each: one full batch each) deliver whole batches.
    assert ours["samples"] == 24
    assert baseline["samples"] == 16
    assert ours["samples_per_second"] > 0 and baseline["samples_per_second"] > 0
    assert result["speedup"] == pytest.approx(
        ours["samples_per_second"] / baseline["samples_per_second"]
    )
    # The same data through `shardfeed bench`, and the kernel it is held to.
    assert result["entitlement"]["samples"] == 24
    assert result["kernel_samples_per_second_per_thread"] > 0
    assert 0 < result["fraction_of_kernel_times_cores"]
    assert 0 <= result["cpu_share_beyond_kernel"] < 1


def test_the_gpu_host_script_runs_end_to_end_on_cpu(tmp_path: Path) -> None:
    """The device script's one command, in CI's small mode (decode="client"
    on CPU where no CUDA is): every section runs, its checks pass."""
    script = Path(__file__).parents[2] / "benchmarks" / "gpu_host.sh"
    out = tmp_path / "gpu-host.json"
    done = subprocess.run(
        ["bash", str(script), "--small", "--binary", str(binary()), "--out", str(out)],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["check_ok"] is True
    (cores,) = report["sidecar_cores"].values()
    check = cores["check"]
    assert check["decoded_device_equals_cpu"] and check["world_sizes_1_2_differing_samples"] == 0
    for recipe in ("train", "eval"):
        assert len(check[recipe]["substituted_decoded"]) == 4
        assert check[recipe]["substituted_encoded"] == check[recipe]["substituted_decoded"]
        assert check[recipe]["psnr_min_db"] >= 35
    assert check["trainer_decoder_failures"] == 0
    assert set(cores["sweep"]) >= {"decoded", "share 0", "share 1", "default (auto)", "summary"}
    assert cores["resnet"]["decoded"]["images_per_second"] > 0
    # The search told the loop's waits, and by the rate alone beside it.
    for told in ("default decode=gpu", "default, rate alone"):
        row = cores["resnet"][told]
        assert row["images_per_second"] > 0 and 0.0 <= row["share_at_end"] <= 1.0
        assert "device_utilisation" in row  # None on CPU
    assert report["resize"]["images_per_second"]["batched_matmul"] > 0


def test_the_pool_tls_benchmark_runs_end_to_end() -> None:
    """TLS against plain text for the decode pool, tiny sizes: both arms
    connect and decode, the summary names the handshake's cost."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardfeed_benchmarks.pool_tls",
            *("--binary", str(binary()), "--connections", "5", "--rounds", "1"),
            *("--shards", "2", "--samples-per-shard", "64"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "pool_tls_summary"
    assert summary["connect_ms_tls"] > 0 and summary["connect_ms_plain"] > 0
    assert summary["pooled_samples_per_second_tls"] > 0
    assert summary["pooled_samples_per_second_plain"] > 0
