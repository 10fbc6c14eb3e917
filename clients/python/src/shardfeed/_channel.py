"""One target's gRPC channel: where the target came from, the channel opened
lazily once per process (fork-safe), and whether anything answers there."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import grpc

from ._proto import shardfeed_pb2 as pb
from ._proto import shardfeed_pb2_grpc as pb_grpc
from ._wire import ShardfeedError, _message_from_wire

# Batches are tens of MB: lift gRPC's 4 MB default and let HTTP/2 flow control
# grow its windows for large messages.
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.http2.bdp_probe", 1),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
]

_SERVICE = pb.DESCRIPTOR.services_by_name["Shardfeed"].full_name

TARGET_ENV = "SHARDFEED_TARGET"
DEFAULT_TARGET = "127.0.0.1:50051"
# A target no call has reached yet is given this long to answer before the
# client says it is wrong: long enough for a sidecar restarting beside a
# trainer that starts again, short enough that a typo costs seconds.
DEFAULT_CONNECT_TIMEOUT = 5.0
_HEALTH_SERVING = b"\x08\x01"
# The process that first opened a channel: gRPC's core then runs threads whose
# locks a fork() copies mid-use, so a forked child that opens a channel of its
# own can hang for good (grpc/grpc#31885). Children check it and refuse.
_grpc_started_in: int | None = None
_FORK_SUPPORT_ENV = "GRPC_ENABLE_FORK_SUPPORT"


def _refuse_after_unsafe_fork() -> None:
    """Fails fast, instead of hanging at random, in a process forked after its
    parent started gRPC (a DataLoader worker under the default ``fork``)."""
    if _grpc_started_in is None or _grpc_started_in == os.getpid():
        return
    if os.environ.get(_FORK_SUPPORT_ENV, "").lower() in ("1", "true", "yes"):
        return  # gRPC's own fork handlers were asked for: the user's choice.
    raise RuntimeError(
        f"this process was forked from process {_grpc_started_in} after it had opened a "
        "gRPC channel, and gRPC is not fork-safe: a channel opened here can hang for good. "
        "Give the DataLoader multiprocessing_context='forkserver' (or 'spawn'), or use "
        "num_workers=0 (the sidecar already decodes and batches in parallel)."
    )


class Channel:
    """``target`` (else ``$SHARDFEED_TARGET``, else the default), its
    channel and stub made on first use in each process, and whether a server
    has answered there yet: until one has, ``UNAVAILABLE`` more likely means
    a wrong target than a restart (see :meth:`check_reachable`)."""

    def __init__(self, target: str | None, connect_timeout: float) -> None:
        if target:
            self.target, self.source = target, "the target passed"
        elif os.environ.get(TARGET_ENV):
            self.target, self.source = os.environ[TARGET_ENV], f"${TARGET_ENV}"
        else:
            self.target = DEFAULT_TARGET
            self.source = f"the default: ${TARGET_ENV} is not set"
        self.connect_timeout = connect_timeout
        self.reached = False
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._stream_batches: Any = None

    def stub(self) -> Any:
        """The generated stub, on this process's channel."""
        with self._lock:
            if self._pid != os.getpid() or self._stub is None:
                _refuse_after_unsafe_fork()
                # No authority override over a Unix socket: the server takes
                # the socket path grpcio sends, as any client's.
                self._channel = grpc.insecure_channel(self.target, options=list(_CHANNEL_OPTIONS))
                self._stub = pb_grpc.ShardfeedStub(self._channel)  # type: ignore[no-untyped-call]
                # Batches skip the generated parser: see _split_images.
                self._stream_batches = self._channel.unary_stream(
                    f"/{_SERVICE}/StreamBatches",
                    request_serializer=pb.StreamBatchesRequest.SerializeToString,
                    response_deserializer=_message_from_wire,
                )
                self._pid = os.getpid()
                global _grpc_started_in
                if _grpc_started_in is None:
                    _grpc_started_in = self._pid
            return self._stub

    def stream_batches(self, request: Any) -> Any:
        """Opens ``StreamBatches``; each item is ``(message, flat images)``."""
        self.stub()
        assert self._stream_batches is not None
        return self._stream_batches(request)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None and self._pid == os.getpid():
                self._channel.close()
            self._channel = None
            self._stub = None

    def unreachable(self, error: ShardfeedError) -> ShardfeedError:
        """Names the target in an UNAVAILABLE error, and where it came from."""
        if error.code != "UNAVAILABLE" or self.target in error.message:
            return error
        return error.with_message(f"{error.message} (target {self.target}, {self.source})")

    def check_reachable(self, error: ShardfeedError) -> None:
        """After ``error`` (UNAVAILABLE) on a target nothing has answered at
        yet: returns if a server answers within ``connect_timeout`` (one
        starting or restarting: the caller waits for it as for any outage),
        else raises, naming the target and ``$SHARDFEED_TARGET``."""
        if self.reached or error.code != "UNAVAILABLE":
            return
        if self._answers(self.connect_timeout):
            self.reached = True
            return
        raise ShardfeedError(
            "UNAVAILABLE",
            f"no shardfeed server answers at {self.target} ({self.source}) "
            f"within connect_timeout={self.connect_timeout:g}s: {error.message}. Start one "
            "(shardfeed.serve() on this host, or the chart's sidecar), or point the client "
            f"at it: target=... or ${TARGET_ENV}",
        )

    def _health_check(self) -> Any:
        """gRPC health's Check on this channel, bytes in and out:
        ``HealthCheckRequest{service: ""}`` is empty on the wire, and the
        answer ``HealthCheckResponse{status}`` is compared as bytes."""
        self.stub()
        assert self._channel is not None
        return self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda service: service,
            response_deserializer=lambda response: response,
        )

    def _answers(self, timeout: float) -> bool:
        """Whether any gRPC server answers the health check at the target
        within ``timeout`` (waiting for a listener to appear meanwhile)."""
        check = self._health_check()
        try:
            check(b"", timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            # Any answer, even UNIMPLEMENTED, came from a server.
            return exc.code() not in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
        return True

    def wait_until_serving(self, timeout: float) -> None:
        """See :meth:`shardfeed.Client.wait_until_serving`."""
        check = self._health_check()
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            try:
                status = check(b"", timeout=max(0.05, min(1.0, deadline - time.monotonic())))
                if status == _HEALTH_SERVING:
                    return
                last = "NOT_SERVING"
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            if time.monotonic() >= deadline:
                raise ShardfeedError(
                    "DEADLINE_EXCEEDED",
                    f"{self.target} was not SERVING after {timeout:g}s (last: {last})",
                )
            time.sleep(0.05)
