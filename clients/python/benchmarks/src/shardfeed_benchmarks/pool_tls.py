"""What TLS costs the decode pool, against plain text, in one run.

``python -m shardfeed_benchmarks.pool_tls`` issues a throwaway pool CA and
certificate (the openssl command line, as the chart's Secret would hold
them) and starts two ``shardfeed pool-worker`` processes on loopback, one
with TLS and one in plain text. Then, alternating between the two so a
machine that gets busier between runs skews neither:

- ``handshake``: ``--connections`` fresh gRPC channels each (grpcio, a
  health check on each): the time per connection, and TLS's extra cost;
- ``throughput``: ``shardfeed pool-bench`` against each worker (every
  sample sent to the pool): samples per second, and the TLS/plain ratio.

Each figure is one JSON line; the last line sums them up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from .delivered import _free_port

NAME = "shardfeed-pool"
TOKEN = "pool-tls-benchmark"


def issue_certificates(directory: Path, name: str = NAME) -> dict[str, Path]:
    """A CA and one certificate it signed (server and client use, naming
    ``name``), with the openssl command line; the tests use it too."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=pool-ca")
    openssl("req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={name}")
    (directory / "leaf.cnf").write_text(
        f"subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth,clientAuth\n"
        "basicConstraints=CA:FALSE\n"
    )
    openssl(
        *("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
        *("-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "leaf.cnf"),
    )
    return {name: directory / f"{name}" for name in ("ca.crt", "tls.crt", "tls.key")}


def start_worker(binary: str, token: Path, threads: int, *flags: str) -> tuple[str, Any]:
    port = _free_port()
    process = subprocess.Popen(
        [
            binary,
            "pool-worker",
            *("--listen", f"127.0.0.1:{port}", "--metrics-listen", "127.0.0.1:0"),
            *("--token-file", str(token), "--decode-threads", str(threads), *flags),
        ],
        env={**os.environ, "SHARDFEED_LOG": "warn"},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket_connect(port):
                return f"127.0.0.1:{port}", process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the pool worker did not listen")


def socket_connect(port: int) -> Any:
    import socket

    return socket.create_connection(("127.0.0.1", port), timeout=0.5)


def connect_once(address: str, credentials: grpc.ChannelCredentials | None) -> float:
    """Seconds for a fresh channel's first health check (TCP, HTTP/2 and,
    with credentials, the TLS handshake)."""
    started = time.perf_counter()
    if credentials is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(
            address, credentials, options=[("grpc.ssl_target_name_override", NAME)]
        )
    with channel:
        # HealthCheckRequest{service: ""} is empty on the wire.
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda request: request,
            response_deserializer=lambda response: response,
        )
        check(b"", timeout=10)
    return time.perf_counter() - started


def pool_bench(binary: str, address: str, token: Path, flags: list[str], args: Any) -> float:
    """Samples per second with every sample decoded by the pool."""
    result = subprocess.run(
        [
            binary,
            "pool-bench",
            *("--pool", address, "--pool-token-file", str(token), "--pool-share", "1"),
            *("--shards", str(args.shards), "--samples-per-shard", str(args.samples_per_shard)),
            *("--rounds", "1", "--decode-threads", "1", "--log-format", "json", *flags),
        ],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "SHARDFEED_LOG": "warn"},
    )
    for line in result.stdout.splitlines():
        if line.startswith("{") and '"pool_summary"' in line:
            return float(json.loads(line)["pooled_samples_per_second"])
    raise RuntimeError(f"pool-bench printed no summary:\n{result.stdout}\n{result.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.environ.get("SHARDFEED_BIN", "shardfeed"))
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker-threads", type=int, default=1)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--samples-per-shard", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sf-tls-") as work:
        directory = Path(work)
        files = issue_certificates(directory)
        token = directory / "token"
        token.write_text(TOKEN)
        tls_flags = [
            *("--tls-ca", str(files["ca.crt"]), "--tls-cert", str(files["tls.crt"])),
            *("--tls-key", str(files["tls.key"])),
        ]
        sidecar_flags = [
            *("--pool-tls-ca", str(files["ca.crt"]), "--pool-tls-cert", str(files["tls.crt"])),
            *("--pool-tls-key", str(files["tls.key"]), "--pool-tls-server-name", NAME),
        ]
        plain_address, plain = start_worker(args.binary, token, args.worker_threads)
        tls_address, secured = start_worker(args.binary, token, args.worker_threads, *tls_flags)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=files["ca.crt"].read_bytes(),
            private_key=files["tls.key"].read_bytes(),
            certificate_chain=files["tls.crt"].read_bytes(),
        )
        try:
            times: dict[str, list[float]] = {"plain": [], "tls": []}
            for _ in range(args.connections):
                times["plain"].append(connect_once(plain_address, None))
                times["tls"].append(connect_once(tls_address, credentials))
            handshake = {arm: statistics.median(values) * 1e3 for arm, values in times.items()}
            print(json.dumps({"benchmark": "pool_tls_connect", "median_ms": handshake}))
            rates: dict[str, list[float]] = {"plain": [], "tls": []}
            for round_ in range(args.rounds):
                for arm, address, flags in (
                    ("plain", plain_address, []),
                    ("tls", tls_address, sidecar_flags),
                ):
                    rate = pool_bench(args.binary, address, token, flags, args)
                    rates[arm].append(rate)
                    print(
                        json.dumps(
                            {
                                "benchmark": "pool_tls",
                                "arm": arm,
                                "round": round_,
                                "samples_per_second": rate,
                            }
                        )
                    )
            plain_rate = statistics.median(rates["plain"])
            tls_rate = statistics.median(rates["tls"])
            print(
                json.dumps(
                    {
                        "benchmark": "pool_tls_summary",
                        "connect_ms_plain": round(handshake["plain"], 3),
                        "connect_ms_tls": round(handshake["tls"], 3),
                        "tls_handshake_ms": round(handshake["tls"] - handshake["plain"], 3),
                        "pooled_samples_per_second_plain": round(plain_rate, 1),
                        "pooled_samples_per_second_tls": round(tls_rate, 1),
                        "tls_over_plain": round(tls_rate / plain_rate, 3),
                    }
                )
            )
        finally:
            for process in (plain, secured):
                process.kill()
                process.wait()


if __name__ == "__main__":
    main()
