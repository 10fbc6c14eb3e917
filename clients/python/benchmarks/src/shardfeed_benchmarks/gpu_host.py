"""The GPU host: correctness and speed of feeding CUDA tensors, in one run.

    bash clients/python/benchmarks/gpu_host.sh --binary shardfeed.xz --out gpu-host.json

On a machine with CUDA it measures what issue 48 asks of a GPU host; on one
without, the same code runs end to end with ``decode="client"`` (torchvision
on CPU) in ``--small`` mode, which CI runs so that the script cannot rot.

It synthesizes photo-like JPEGs (~100 KB, ~500x375; ``--photos DIR`` takes
an ImageFolder of real ones instead), packs them with ``shardfeed.pack()``
as ``file://`` shards, starts the sidecar pinned to its first N cores with
``taskset`` for each N of ``--cores`` (the trainer, this process, on the
cores past the largest N, the same for every N) and writes one JSON file:

- ``check``: decoded delivery to the device equals CPU delivery byte for
  byte; the trainer's decode (share 0) against the sidecar's pixels (PSNR
  per sample, keys, boxes, flips); corrupt scans substituted by the sidecar
  in both deliveries and never decoded by the trainer; at a fixed share the
  pixels at world size 1 and 2 byte-identical. A failed check makes the run
  exit 1.
- ``resize``: the batched crop/resize against the per-image one on the
  device (and Pillow's on CPU), images/s.
- ``sweep``: samples/s into device tensors (training recipe) for decoded
  delivery, each fixed ``server_decode_fraction``, and the default
  ``decode="gpu"`` (``"auto"``: first epoch and settled), with the
  sidecar's CPU-ms per sample, per sidecar core count.
- ``resnet``: ResNet-50 (``--small``: ResNet-18 at 96 px) images/s and the
  loop's waiting fraction, for synthetic input already on the device,
  decoded delivery and the default ``decode="gpu"``, per core count; the
  default twice: its search told the loop's waits (what the dataset does)
  and by the rate alone (the search before the loop told it), each with
  the share it settled at and the device's mean utilisation while timed
  (``nvidia-smi``; None without it).
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .delivered import _process_cpu

CLASSES = 10


def scan_corrupted(jpeg: bytes, count: int = 4000, seed: int = 0) -> bytes:
    """``jpeg`` with ``count`` random bytes written over the middle of its
    entropy-coded data, its headers and end marker intact (a flipped disk
    block, a bad copy): libjpeg refuses it, nvJPEG decodes garbage from it
    without an error. The bytes include a stray marker (checked)."""
    scan = jpeg.index(b"\xff\xda")
    data_start = scan + 2 + int.from_bytes(jpeg[scan + 2 : scan + 4], "big")
    data_len = len(jpeg) - 2 - data_start
    count = min(count, data_len // 2)
    start = data_start + (data_len - count) // 2
    noise = np.random.default_rng(seed).integers(0, 256, count, dtype=np.uint8).tobytes()
    out = jpeg[:start] + noise + jpeg[start + count :]
    # Stuffing, fill, restarts, the end and the segments between scans.
    legal = {0x00, 0xFF, *range(0xD0, 0xDA), 0xC4, 0xDA, 0xDB, 0xDD, 0xFE, *range(0xE0, 0xF0)}
    assert any(out[i] == 0xFF and out[i + 1] not in legal for i in range(start, start + count)), (
        "no stray marker: pick another seed"
    )
    return out


def photo(seed: int, width: int, height: int) -> bytes:
    """A photo-like JPEG (q90): smooth colour fields at three scales under
    sensor-like noise, about as large and as slow to decode as a photo."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = np.full((height, width, 3), 128.0, dtype=np.float32)
    for cells, amplitude in ((4, 90), (16, 45), (64, 25)):
        grid = (rng.random((max(2, cells * height // width), cells, 3)) * 255).astype(np.uint8)
        field = Image.fromarray(grid).resize((width, height), Image.Resampling.BICUBIC)
        pixels += (np.asarray(field, dtype=np.float32) - 128) * amplitude / 128
    pixels += rng.normal(0, 14, pixels.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def _write_photo(task: tuple[str, int, int, int, bool]) -> None:
    path, seed, width, height, corrupt = task
    data = photo(seed, width, height)
    Path(path).write_bytes(scan_corrupted(data, seed=seed) if corrupt else data)


def synthesize(folder: Path, count: int, corrupt: int, side: int) -> list[str]:
    """``count`` photos in ``CLASSES`` class folders, ``corrupt`` of them
    with corrupt scans; returns the corrupt ones' sample keys."""
    import multiprocessing

    tasks, corrupt_keys = [], []
    every = count // corrupt if corrupt else 0
    for n in range(count):
        label = n % CLASSES
        (folder / f"c{label:02d}").mkdir(parents=True, exist_ok=True)
        width = side + (n % 5) * side // 25
        height = side * 3 // 4 + (n % 3) * side // 33
        bad = bool(every) and n % every == every // 2
        tasks.append((str(folder / f"c{label:02d}" / f"p{n:06d}.jpg"), n, width, height, bad))
        if bad:
            corrupt_keys.append(f"p{n:06d}")
    with multiprocessing.get_context("spawn").Pool(min(16, os.cpu_count() or 1)) as pool:
        pool.map(_write_photo, tasks, chunksize=16)
    return corrupt_keys


def unpack_binary(path: str, into: Path) -> Path:
    """The sidecar binary, decompressed first when it is ``.xz`` (a stripped
    release binary is ~8 MB compressed)."""
    if not path.endswith(".xz"):
        return Path(path).resolve()
    binary = into / "shardfeed"
    with lzma.open(path) as source, binary.open("wb") as out:
        shutil.copyfileobj(source, out)
    binary.chmod(0o755)
    return binary


@contextmanager
def pinned_sidecar(binary: Path, cores: list[int], workdir: Path) -> Iterator[Any]:
    """``shardfeed serve`` on a Unix socket, run under ``taskset`` on
    ``cores`` (every thread it starts inherits them)."""
    from shardfeed import Server

    wrapper = workdir / f"shardfeed-on-{len(cores)}-cores"
    listed = ",".join(str(c) for c in cores)
    wrapper.write_text(f'#!/bin/sh\nexec taskset -c {listed} "{binary}" "$@"\n')
    wrapper.chmod(0o755)
    server = Server(binary=wrapper)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Run:
    """What every section needs: the device, the decode that runs on it, the
    stream's shape, where to record, and the packed datasets."""

    def __init__(self, args: argparse.Namespace, device: Any, datasets: dict[str, str]) -> None:
        self.args = args
        self.device = device
        self.cuda = device.type == "cuda"
        self.decode = "gpu" if self.cuda else "client"
        self.datasets = datasets

    def dataset(self, target: str, name: str, **options: Any) -> Any:
        from shardfeed.torch import ShardfeedDataset

        common: dict[str, Any] = dict(
            target=target,
            batch_size=self.args.batch_size,
            image_size=self.args.image_size,
            augment="train",
            rank=0,
            world_size=1,
            device=self.device,
        )
        common.update(options)
        return ShardfeedDataset(self.datasets[name], **common)

    def synchronize(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _by_key(ds: Any) -> dict[str, dict[str, Any]]:
    """Every sample of one pass of ``ds`` (dict output), by key."""
    out: dict[str, dict[str, Any]] = {}
    for batch in ds:
        images = batch["images"].cpu().numpy()
        for slot, key in enumerate(batch["keys"]):
            out[key] = {
                "pixels": images[slot],
                "box": tuple(float(v) for v in batch["crop_boxes"][slot]),
                "flipped": bool(batch["flipped"][slot]),
                "substituted": bool(batch["substituted"][slot]),
            }
    return out


def _scrape(url: str) -> dict[str, float]:
    values = {}
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def check(run: Run, target: str, metrics_url: str, corrupt_keys: list[str]) -> dict[str, Any]:
    """Correctness on the device; ``ok`` is False when anything is off."""
    import torch

    problems: list[str] = []
    result: dict[str, Any] = {}
    # Decoded delivery: the device's bytes are the CPU's.
    on_cpu = run.dataset(target, "check", output="dict", device=None)
    on_device = run.dataset(target, "check", output="dict")
    cpu_batches, device_batches = list(on_cpu), list(on_device)
    same = len(cpu_batches) == len(device_batches) and all(
        torch.equal(a["images"], b["images"].cpu()) for a, b in zip(cpu_batches, device_batches)
    )
    result["decoded_device_equals_cpu"] = same
    if not same:
        problems.append("decoded delivery to the device differs from CPU delivery")
    for recipe in ("train", "eval"):
        server = _by_key(run.dataset(target, "check", output="dict", augment=recipe))
        reported = _scrape(metrics_url).get("shardfeed_client_decoded_samples_total", 0.0)
        trainer = _by_key(
            run.dataset(
                target,
                "check",
                output="dict",
                augment=recipe,
                decode=run.decode,
                server_decode_fraction=0.0,
            )
        )
        if sorted(server) != sorted(trainer):
            problems.append(f"{recipe}: the keys differ")
        psnrs = [
            _psnr(server[k]["pixels"], trainer[k]["pixels"])
            for k in server
            if k in trainer and not server[k]["substituted"]
        ]
        boxes = all(server[k]["box"] == trainer[k]["box"] for k in server if k in trainer)
        flips = all(server[k]["flipped"] == trainer[k]["flipped"] for k in server if k in trainer)
        substituted = sorted(k.rpartition("/")[2] for k in server if server[k]["substituted"])
        trainer_substituted = sorted(
            k.rpartition("/")[2] for k in trainer if trainer[k]["substituted"]
        )
        decoded_here = (
            _scrape(metrics_url).get("shardfeed_client_decoded_samples_total", 0.0) - reported
        )
        if decoded_here < len(psnrs) // 2:
            problems.append(f"{recipe}: the trainer decoded {decoded_here:.0f} samples at share 0")
        result[recipe] = {
            "samples": len(psnrs),
            "decoded_by_trainer": decoded_here,
            "psnr_min_db": min(psnrs),
            "psnr_median_db": statistics.median(psnrs),
            "boxes_equal": boxes,
            "flips_equal": flips,
            "substituted_decoded": substituted,
            "substituted_encoded": trainer_substituted,
        }
        if min(psnrs) < 35:
            problems.append(f"{recipe}: a sample at {min(psnrs):.1f} dB, below 35")
        if not (boxes and flips):
            problems.append(f"{recipe}: boxes or flips differ")
        if substituted != sorted(corrupt_keys) or trainer_substituted != substituted:
            problems.append(
                f"{recipe}: substituted {substituted} / {trainer_substituted}, "
                f"corrupt {sorted(corrupt_keys)}"
            )
    by_trainer = _scrape(metrics_url).get(
        'shardfeed_substituted_samples_total{reason="client_decode"}', 0.0
    )
    result["trainer_decoder_failures"] = by_trainer
    if by_trainer:
        problems.append("a corrupt sample reached the trainer's decoder")
    # At a fixed share the side that decodes a sample is its own: the same
    # pixels at world size 1 and 2.
    # A quarter batch: world size 2 needs two batches of the check's set.
    fixed = dict(
        output="dict",
        decode=run.decode,
        server_decode_fraction=0.5,
        batch_size=run.args.batch_size // 4,
    )
    one = _by_key(run.dataset(target, "check", **fixed))
    two: dict[str, dict[str, Any]] = {}
    for rank in range(2):
        two.update(_by_key(run.dataset(target, "check", rank=rank, world_size=2, **fixed)))
    differing = [
        k
        for k in one
        if k in two
        and not one[k]["substituted"]
        and not np.array_equal(one[k]["pixels"], two[k]["pixels"])
    ]
    result["world_sizes_1_2_differing_samples"] = len(differing)
    result["world_sizes_1_2_differing_psnr_db"] = {
        k: _psnr(one[k]["pixels"], two[k]["pixels"]) for k in differing[:8]
    }
    result["world_sizes_1_2_compared"] = len([k for k in one if k in two])
    if differing:
        problems.append(f"{len(differing)} samples differ between world sizes 1 and 2")
    result["problems"] = problems
    result["ok"] = not problems
    return result


def resize(run: Run, photos: list[bytes], repeats: int) -> dict[str, Any]:
    """The batched crop/resize against the per-image one, on the device."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    from shardfeed._resize import crop_resize, crop_resize_batch

    rng = np.random.default_rng(0)
    tensors = [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in photos]
    images = decode_jpeg(tensors, mode=ImageReadMode.RGB, device=run.device)
    boxes = []
    for image in images:
        rows, cols = image.shape[1:]
        scale, ratio = rng.uniform(0.08, 1.0), np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        width = min(cols, np.sqrt(rows * cols * scale * ratio))
        height = min(rows, np.sqrt(rows * cols * scale / ratio))
        boxes.append((rng.uniform(0, cols - width), rng.uniform(0, rows - height), width, height))
    box_array = np.array(boxes, dtype=np.float32)
    flipped = rng.random(len(images)) < 0.5
    size = run.args.image_size

    def per_image() -> None:
        for image, box, flip in zip(images, box_array, flipped):
            crop_resize(image, box, bool(flip), size, size)

    methods = {"per_image": per_image}
    for kind in ("matmul", "pillow") if not run.cuda else ("matmul",):

        def batched(kind: Any = kind) -> None:
            crop_resize_batch(images, box_array, flipped, size, size, method=kind)

        methods[f"batched_{kind}"] = batched
    rates: dict[str, float] = {}
    for name, timed in methods.items():
        timed()  # warm: kernels, caches
        best = float("inf")
        for _ in range(repeats):
            run.synchronize()
            started = time.perf_counter()
            timed()
            run.synchronize()
            best = min(best, time.perf_counter() - started)
        rates[name] = len(images) / best
    return {
        "images": len(images),
        "images_per_second": rates,
        "batched_over_per_image": {
            name: rate / rates["per_image"] for name, rate in rates.items() if name != "per_image"
        },
        "batched_matmul_kernels": _kernel_breakdown(run, methods["batched_matmul"]),
    }


def _kernel_breakdown(run: Run, timed: Any, top: int = 8) -> dict[str, Any]:
    """Where one call's time goes: its busiest kernels (device time on
    CUDA, CPU time elsewhere) against the call's wall time, so a run shows
    whether launches or arithmetic bound the batched resize."""
    try:
        return _profiled(run, timed, top)
    except Exception as error:  # noqa: BLE001 -- the rates above stand without it
        return {"error": repr(error)}


def _profiled(run: Run, timed: Any, top: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.cuda else [])
    run.synchronize()
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        timed()
        run.synchronize()
    wall_ms = 1e3 * (time.perf_counter() - started)
    events = prof.key_averages()
    attribute = "self_device_time_total" if run.cuda else "self_cpu_time_total"
    ranked = sorted(events, key=lambda e: getattr(e, attribute, 0.0), reverse=True)
    busy_ms = sum(getattr(e, attribute, 0.0) for e in events) / 1e3
    return {
        "wall_ms": wall_ms,
        "busy_ms": busy_ms,
        "kernels": [
            {"name": e.key[:80], "calls": e.count, "ms": getattr(e, attribute, 0.0) / 1e3}
            for e in ranked[:top]
        ],
    }


def _pass(run: Run, ds: Any, server_pid: int) -> dict[str, Any]:
    server_before = _process_cpu(server_pid)
    started = time.perf_counter()
    samples = 0
    for _images, labels in ds:
        samples += len(labels)
    run.synchronize()
    seconds = time.perf_counter() - started
    return {
        "samples_per_second": samples / seconds,
        "server_cpu_ms_per_sample": 1e3 * (_process_cpu(server_pid) - server_before) / samples,
        "share": ds._share.share,
    }


def sweep(run: Run, server: Any, fractions: list[float], epochs: int) -> dict[str, Any]:
    """Samples/s into device tensors per setting, the sidecar's CPU-ms a
    sample, and the default's (auto's) first and settled epochs."""
    settings: list[tuple[str, dict[str, Any]]] = [("decoded", {})]
    for fraction in fractions:
        settings.append(
            (f"share {fraction:g}", {"decode": run.decode, "server_decode_fraction": fraction})
        )
    # decode="gpu" with default settings is "auto"; decode="client"'s
    # default is share 0, so it is asked for.
    auto = {"decode": run.decode}
    if run.decode == "client":
        auto["server_decode_fraction"] = "auto"
    settings.append(("default (auto)", auto))
    out: dict[str, Any] = {}
    for name, options in settings:
        ds = run.dataset(server.target, "photos", **options)
        passes = [_pass(run, ds, server.pid) for _ in range(epochs)]
        settled = passes[1:] or passes
        out[name] = {
            "samples_per_second": statistics.median(p["samples_per_second"] for p in settled),
            "first_epoch_samples_per_second": passes[0]["samples_per_second"],
            "server_cpu_ms_per_sample": statistics.median(
                p["server_cpu_ms_per_sample"] for p in settled
            ),
            "share_at_end": passes[-1]["share"],
        }
        print(f"  {name:<16} {out[name]}", file=sys.stderr)
    decoded = out["decoded"]["samples_per_second"]
    fixed = {n: v["samples_per_second"] for n, v in out.items() if n.startswith("share ")}
    best = max(fixed, key=lambda n: fixed[n])
    default = out["default (auto)"]
    out["summary"] = {
        "best_fixed": best,
        "default_over_decoded": default["samples_per_second"] / decoded,
        "default_over_best_fixed": default["samples_per_second"] / fixed[best],
        "default_first_epoch_over_best_fixed": default["first_epoch_samples_per_second"]
        / fixed[best],
    }
    return out


def _model(run: Run) -> tuple[Any, Any, Any]:
    import torch
    import torchvision

    small = run.args.small
    model = (torchvision.models.resnet18 if small else torchvision.models.resnet50)()
    model = model.to(run.device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mean = torch.tensor([0.485, 0.456, 0.406], device=run.device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=run.device).view(1, 3, 1, 1) * 255

    def step(images: Any, labels: Any) -> None:
        x = images.permute(0, 3, 1, 2).float().sub_(mean).div_(std)
        x = x.contiguous(memory_format=torch.channels_last)
        autocast = torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.cuda)
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(x), labels % 1000)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return model, optimizer, step


class DeviceUtilisation:
    """The GPU's mean utilisation (percent) between ``start`` and ``stop``,
    polled from ``nvidia-smi`` twice a second on a thread; None on CPU or
    without ``nvidia-smi``."""

    def __init__(self, cuda: bool) -> None:
        self._command = shutil.which("nvidia-smi") if cuda else None
        self._samples: list[float] = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        assert self._command is not None
        query = [self._command, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        while not self._done.wait(0.5):
            try:
                line = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout
                self._samples.append(float(line.split()[0]))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                continue

    def start(self) -> None:
        if self._command is not None:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()

    def stop(self) -> float | None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(10)
        return statistics.fmean(self._samples) if self._samples else None


def resnet(run: Run, server: Any | None, steps: int, warmup: int) -> dict[str, Any]:
    """Images/s and the loop's waiting fraction: synthetic input (``server``
    None) or fed by decoded delivery and by the default ``decode="gpu"``."""
    import torch

    _, _, step = _model(run)
    size, batch = run.args.image_size, run.args.batch_size
    if server is None:
        images = torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8, device=run.device)
        labels = torch.randint(0, 1000, (batch,), device=run.device)
        for _ in range(warmup):
            step(images, labels)
        run.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            step(images, labels)
        run.synchronize()
        return {"images_per_second": steps * batch / (time.perf_counter() - started)}
    out: dict[str, Any] = {}
    settings: list[tuple[str, dict[str, Any], bool]] = [
        ("decoded", {}, True),
        ("default decode=gpu", {"decode": run.decode}, True),
        ("default, rate alone", {"decode": run.decode}, False),
    ]
    for name, options, tells_loop in settings:
        if options and run.decode == "client":
            options = dict(options, server_decode_fraction="auto")
        ds = run.dataset(server.target, "photos", **options)
        ds._share.tells_loop = tells_loop
        # Timed once "auto" settled: after the first epoch (its figure is
        # the sweep's), as in a run of thousands of steps an epoch.
        untimed = warmup + len(ds)
        done, started, epoch = 0, 0.0, 0
        utilisation = DeviceUtilisation(run.cuda)
        while done < untimed + steps:
            ds.set_epoch(epoch)
            for images, labels in ds:
                step(images, labels)
                done += 1
                if done == untimed:
                    run.synchronize()
                    started = time.perf_counter()
                    utilisation.start()
                if done == untimed + steps:
                    break
            epoch += 1
        run.synchronize()
        stats = ds.stats(last=steps)
        out[name] = {
            "images_per_second": steps * batch / (time.perf_counter() - started),
            "waiting_fraction": stats.waiting_fraction,
            "share_at_end": ds._share.share,
            "device_utilisation": utilisation.stop(),
        }
        print(f"  resnet {name:<20} {out[name]}", file=sys.stderr)
    return out


def versions(binary: Path, device: Any) -> dict[str, Any]:
    import torch
    import torchvision

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "numpy": np.__version__,
        "cpus": len(os.sched_getaffinity(0)),
        "sidecar": subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, check=False
        ).stdout.strip(),
    }
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        smi = shutil.which("nvidia-smi")
        if smi:
            info["driver"] = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
    else:
        info["device"] = "cpu"
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="shardfeed, or shardfeed.xz")
    parser.add_argument("--out", required=True, help="where the JSON goes")
    parser.add_argument("--small", action="store_true", help="CI's size, on CPU")
    parser.add_argument("--photos", help="an ImageFolder of JPEGs (default: synthesized)")
    parser.add_argument("--samples", type=int, help="photos synthesized")
    parser.add_argument("--cores", help="sidecar core counts, e.g. 2,8")
    parser.add_argument("--fractions", default="0,0.25,0.5,0.75,1")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--sections", default="check,resize,sweep,resnet")
    args = parser.parse_args(argv)
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = args.small
    args.batch_size = 32 if small else 128
    # A JPEG goes compressed only when it is no longer than its decoded
    # pixels: small mode's ~8 KB photos against 96x96x3 = 27 KB.
    args.image_size = 96 if small else 224
    side = 160 if small else 500
    samples = args.samples or (256 if small else 7680)
    available = sorted(os.sched_getaffinity(0))
    counts = [int(c) for c in (args.cores or ("1" if small else "2,8")).split(",")]
    counts = [c for c in counts if c < len(available)] or [max(1, len(available) // 2)]
    sections = set(args.sections.split(","))
    report: dict[str, Any] = {"small": small, "batch_size": args.batch_size}
    report["image_size"] = args.image_size
    out = Path(args.out)
    failed: list[str] = []

    @contextmanager
    def section(name: str) -> Iterator[None]:
        """One section's figures land in the JSON as soon as it ends, and a
        section that raises is recorded there and the run goes on: a lent
        device's minutes are too few to lose a whole run to one error."""
        try:
            yield
        except Exception as error:  # noqa: BLE001 -- recorded and reported below
            failed.append(name)
            report.setdefault("errors", {})[name] = traceback.format_exc()
            print(f"{name} failed: {error!r}", file=sys.stderr)
        finally:
            out.write_text(json.dumps(report, indent=2, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="shardfeed-gpu-host-") as tmp:
        work = Path(tmp)
        binary = unpack_binary(args.binary, work)
        report["versions"] = versions(binary, device)
        print(f"gpu host: {report['versions']}", file=sys.stderr)
        from shardfeed import pack

        photos = Path(args.photos) if args.photos else work / "photos"
        if not args.photos:
            synthesize(photos, samples, 0, side)
        # Whole batches: a sample past the last one is not delivered.
        corrupt_keys = synthesize(work / "check", 3 * args.batch_size, 4, side)
        datasets = {
            "photos": pack(photos, work / "packed", binary=binary).dataset,
            "check": pack(work / "check", work / "packed-check", binary=binary).dataset,
        }
        report["samples"] = sum(1 for _ in photos.rglob("*.jpg"))
        run = Run(args, device, datasets)
        trainer_cores = available[max(counts) :] or available[-1:]
        os.sched_setaffinity(0, trainer_cores)
        torch.set_num_threads(len(trainer_cores))
        steps, warmup = (4, 1) if small else (60, 10)
        if "resize" in sections:
            with section("resize"):
                jpegs = [p.read_bytes() for p in sorted(photos.rglob("*.jpg"))[: args.batch_size]]
                report["resize"] = resize(run, jpegs, repeats=3)
                print(f"resize: {report['resize']}", file=sys.stderr)
        if "resnet" in sections:
            with section("resnet_synthetic"):
                report["resnet_synthetic"] = resnet(run, None, steps, warmup)
        for count in counts:
            cores = available[:count]
            print(f"sidecar on cores {cores}, trainer on {trainer_cores}", file=sys.stderr)
            with pinned_sidecar(binary, cores, work) as server:
                at = report.setdefault("sidecar_cores", {}).setdefault(str(count), {})
                if "check" in sections and count == counts[0]:
                    report["check_ok"] = False
                    with section("check"):
                        at["check"] = check(run, server.target, server.metrics_url, corrupt_keys)
                        report["check_ok"] = at["check"]["ok"]
                        print(f"check: {at['check']}", file=sys.stderr)
                if "sweep" in sections:
                    with section(f"sweep {count}"):
                        fractions = [float(f) for f in args.fractions.split(",")]
                        at["sweep"] = sweep(run, server, fractions, args.epochs)
                if "resnet" in sections:
                    with section(f"resnet {count}"):
                        at["resnet"] = resnet(run, server, steps, warmup)
                        synthetic = report["resnet_synthetic"]["images_per_second"]
                        for fed in at["resnet"].values():
                            fed["over_synthetic"] = fed["images_per_second"] / synthetic
    print(f"wrote {args.out}", file=sys.stderr)
    if failed:
        print(f"sections that raised: {failed}", file=sys.stderr)
        return 1
    return 0 if report.get("check_ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
