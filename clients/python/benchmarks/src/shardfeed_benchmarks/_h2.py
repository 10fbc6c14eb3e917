"""Just enough HTTP/2 to misbehave with: frames written by hand, so an
attack can send what no well-behaved client library would (a call that
never finishes its headers' body, a frame larger than the peer takes, a
header block that references one entry 60,000 times)."""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS = 0x0, 0x1, 0x4
END_STREAM, END_HEADERS = 0x1, 0x4


def integer(value: int, prefix: int) -> bytes:
    """HPACK's integer with a ``prefix``-bit first byte."""
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes([value])
    out, value = bytearray([limit]), value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes, first: int = 0x00) -> bytes:
    """A header field with a literal name and value (``first``: 0x00 not
    indexed, 0x40 added to the table)."""
    out = bytearray([first])
    for string in (name, value):
        out += integer(len(string), 7)
        out += string
    return bytes(out)


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    header = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
    return header + payload


def call_headers(path: str, *extra: tuple[str, str], authority: str = "localhost") -> bytes:
    """A gRPC call's header block."""
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]
    return b"".join(literal(name.encode(), value.encode()) for name, value in fields)


def open_call(stream: int, path: str, *extra: tuple[str, str]) -> bytes:
    """HEADERS of a call whose body is still to come."""
    return frame(HEADERS, END_HEADERS, stream, call_headers(path, *extra))


def grpc_prefix(length: int) -> bytes:
    """A gRPC message's 5-byte prefix declaring ``length`` bytes."""
    return b"\x00" + length.to_bytes(4, "big")


def connect(
    target: str,
    *,
    tls: Path | None = None,
    server_name: str = "",
    timeout: float = 5.0,
    source: str | None = None,
) -> socket.socket:
    """A connection that has sent the preface and an empty SETTINGS:
    ``unix:/path`` or ``host:port``; ``tls``: a folder with ``ca.crt``,
    ``tls.crt``, ``tls.key`` (the pool's files) for a TLS client."""
    if target.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(timeout)
        sock.connect(target.removeprefix("unix:").removeprefix("//"))
    else:
        host, _, port = target.rpartition(":")
        bind = (source, 0) if source else None
        sock = socket.create_connection((host, int(port)), timeout=timeout, source_address=bind)
    if tls is not None:
        context = ssl.create_default_context(cafile=str(tls / "ca.crt"))
        context.load_cert_chain(str(tls / "tls.crt"), str(tls / "tls.key"))
        context.set_alpn_protocols(["h2"])
        sock = context.wrap_socket(sock, server_hostname=server_name)
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))
    return sock


def drain(sock: socket.socket, seconds: float) -> tuple[int, bool]:
    """Reads what the peer sends for up to ``seconds``: (bytes read,
    whether it closed the connection)."""
    deadline = time.monotonic() + seconds
    read = 0
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(1 << 16)
        except (TimeoutError, socket.timeout):
            return read, False
        except OSError:
            return read, True
        if not chunk:
            return read, True
        read += len(chunk)
    return read, False


WINDOW_UPDATE, RST_STREAM, GOAWAY, PING = 0x8, 0x3, 0x7, 0x6


class Connection:
    """A raw connection that keeps HTTP/2's flow control, so an attack can
    send as much of a body as the peer lets it and no byte more: a reader
    thread takes the peer's SETTINGS (and acknowledges them), WINDOW_UPDATEs,
    PINGs, RST_STREAMs and GOAWAY."""

    def __init__(self, sock: socket.socket) -> None:
        import threading

        self.sock = sock
        self.initial_window = 65_535
        self.connection_window = 65_535
        self.windows: dict[int, int] = {}
        self.reset: set[int] = set()
        self.closed = False
        self.goaway = False
        self.changed = threading.Condition()
        self._writing = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, data: bytes) -> None:
        with self._writing:
            self.sock.sendall(data)

    def _read(self) -> None:
        buffer = b""
        try:
            self.sock.settimeout(None)
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= 9:
                    length = int.from_bytes(buffer[:3], "big")
                    if len(buffer) < 9 + length:
                        break
                    kind, flags = buffer[3], buffer[4]
                    stream = int.from_bytes(buffer[5:9], "big") & 0x7FFF_FFFF
                    payload, buffer = buffer[9 : 9 + length], buffer[9 + length :]
                    self._take(kind, flags, stream, payload)
        except OSError:
            pass
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    def _take(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        with self.changed:
            if kind == SETTINGS and not flags & 0x1:
                for at in range(0, len(payload) - 5, 6):
                    if int.from_bytes(payload[at : at + 2], "big") == 0x4:
                        value = int.from_bytes(payload[at + 2 : at + 6], "big")
                        delta = value - self.initial_window
                        self.initial_window = value
                        for key in self.windows:
                            self.windows[key] += delta
                self.send(frame(SETTINGS, 0x1, 0, b""))
            elif kind == WINDOW_UPDATE:
                increment = int.from_bytes(payload[:4], "big") & 0x7FFF_FFFF
                if stream == 0:
                    self.connection_window += increment
                else:
                    self.windows[stream] = self.windows.get(stream, self.initial_window) + increment
            elif kind == PING and not flags & 0x1:
                self.send(frame(PING, 0x1, 0, payload))
            elif kind == RST_STREAM:
                self.reset.add(stream)
            elif kind == GOAWAY:
                self.goaway = True
            self.changed.notify_all()

    def send_body(self, stream: int, body: bytes, wait: float = 2.0) -> int:
        """Sends as much of ``body`` on ``stream`` as the peer's windows
        allow within ``wait`` seconds of no new window; returns the bytes
        sent (the stream stays open)."""
        sent = 0
        while sent < len(body):
            with self.changed:
                self.windows.setdefault(stream, self.initial_window)
                deadline = time.monotonic() + wait
                while (
                    min(self.connection_window, self.windows[stream]) <= 0
                    and not self.closed
                    and stream not in self.reset
                ):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return sent
                    self.changed.wait(left)
                if self.closed or stream in self.reset:
                    return sent
                size = min(self.connection_window, self.windows[stream], 16_384, len(body) - sent)
                self.connection_window -= size
                self.windows[stream] -= size
            try:
                self.send(frame(DATA, 0, stream, body[sent : sent + size]))
            except OSError:
                return sent
            sent += size
        return sent

    def close(self) -> None:
        # shutdown first: a plain close leaves the reader thread's recv
        # holding the socket, and the peer never sees the connection end.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
