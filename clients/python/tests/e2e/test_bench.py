"""The delivered-into-Python benchmark runs end to end (tiny sizes)."""

from __future__ import annotations

import json

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
