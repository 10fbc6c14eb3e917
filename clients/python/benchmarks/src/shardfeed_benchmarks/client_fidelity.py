"""Where the trainer decodes, how close its pixels are to the sidecar's,
op by op: every sample of a stream delivered decoded (the reference) and
delivered encoded with the client decoding all it may (share 0), decoded
by ``BatchDecoder`` on the CPU, and the PSNR of each sample against the
reference, grouped by the ops it drew. Samples whose ops would take the
client past the tolerance are the sidecar's (``decoded_by_server``).

    python -m shardfeed_benchmarks.client_fidelity --binary target/release/shardfeed

Prints one JSON line per op (samples the client decoded, worst and 1st
percentile PSNR in dB, samples left to the sidecar) and one for all.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

import numpy as np

from .delivered import synthetic_setup


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _recipe() -> Any:
    from shardfeed import Augment, RandomErasing, TrivialAugmentWide

    return Augment.train(
        auto_augment=TrivialAugmentWide(interpolation="bilinear"),
        random_erasing=RandomErasing(0.1),
    )


def main(argv: list[str] | None = None) -> int:
    from shardfeed import Client
    from shardfeed.decode import BatchDecoder

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--samples-per-shard", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args(argv)
    socket = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"sf-fidelity-{os.getpid()}.sock")
    setup = synthetic_setup(args.binary, args.shards, args.samples_per_shard, 0, socket)
    by_op: dict[str, list[float]] = {}
    by_server: dict[str, int] = {}
    try:
        client = Client(setup["target"])
        common = dict(batch_size=64, image_size=args.image_size, augment=_recipe(), seed=1)
        reference = client.batches(setup["dataset"], **common)
        encoded = client.batches(
            setup["dataset"], delivery="encoded", server_decode_fraction=0.0, **common
        )
        decoder = BatchDecoder("cpu")
        for want, got in zip(reference, encoded):
            assert got.encoded is not None and got.keys == want.keys
            decoded = decoder.decode(got)
            for slot, ops in enumerate(want.ops):
                names = sorted({name for name, _ in ops} - {"horizontal_flip"}) or ["crop+flip"]
                if got.encoded.decoded[slot]:
                    for name in names:
                        by_server[name] = by_server.get(name, 0) + 1
                    continue
                quality = _psnr(decoded.images[slot].numpy(), want.images[slot])
                for name in [*names, "all"]:
                    by_op.setdefault(name, []).append(quality)
    finally:
        for process in setup["processes"]:
            process.terminate()
            process.wait(timeout=30)
    for name in sorted(set(by_op) | set(by_server)):
        values = np.array(by_op.get(name, []))
        finite = values[np.isfinite(values)]
        print(
            json.dumps(
                {
                    "op": name,
                    "client_decoded": int(values.size),
                    "worst_db": round(float(values.min()), 1) if values.size else None,
                    "p1_db": (round(float(np.percentile(finite, 1)), 1) if finite.size else None),
                    "decoded_by_server": by_server.get(name, 0),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
