"""Receiving batches through the server's shared-memory ring.

The server decodes each batch into a slot of a memfd; this module fetches the
descriptor once per stream over ``<socket>.fds`` (``SCM_RIGHTS``), maps it
read-only, and hands out numpy views of slots. When the last view of a batch
is garbage-collected its slot index is written back on the same connection
(a credit), and the server may decode into that slot again. Nothing here has
a name in the file system: the mapping dies with the last view, and closing
the connection (or the process dying) returns every slot at once.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import threading
import time
import weakref
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

_CONNECT_TIMEOUT = 10.0


class HostPinning(Protocol):
    """Registers host memory with a device runtime (page-locks it) so that
    copies from it run asynchronously, and releases it again."""

    def register(self, address: int, size: int) -> bool: ...

    def unregister(self, address: int) -> None: ...


def socket_path(target: str) -> str | None:
    """The Unix socket path of a ``unix:`` gRPC target, else None."""
    for prefix in ("unix://", "unix:"):
        if target.startswith(prefix):
            return target[len(prefix) :]
    return None


def _connect_unix(path: str, timeout: float) -> socket.socket:
    """A connection to the Unix socket at ``path``. A full accept backlog
    answers a connect with EAGAIN at once (the server is busy, not gone):
    that is retried, backing off, until ``timeout``."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:
            sock.close()
            if time.monotonic() + pause > deadline:
                raise TimeoutError(
                    f"{path}: the server's accept backlog stayed full for {timeout:.0f} s"
                ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        except BaseException:
            sock.close()
            raise


class SharedRing:
    """One stream's mapping of the server's ring and its credit connection."""

    def __init__(self, grpc_socket: str, token: bytes, size: int) -> None:
        sock = _connect_unix(grpc_socket + ".fds", _CONNECT_TIMEOUT)
        try:
            sock.sendall(token)
            _, fds, _, _ = socket.recv_fds(sock, 1, 1)
            if len(fds) != 1:
                raise ConnectionError(
                    "the server sent no shared-memory descriptor (it turns clients away past "
                    "its connection limit; the stream then ends with RESOURCE_EXHAUSTED)"
                )
            try:
                self._map = mmap.mmap(fds[0], size, prot=mmap.PROT_READ)
            finally:
                for fd in fds:
                    os.close(fd)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._held = 0
        self._size = size
        # (pinning, address) while the mapping is registered with it.
        self._pinned: tuple[HostPinning, int] | None = None

    def pin(self, pinning: HostPinning) -> bool:
        """Registers the whole mapping with ``pinning`` once (the ring is
        written by the server, never reallocated, so one registration serves
        every batch of the stream). Released when the ring is closed and the
        last view is gone, before the mapping can be unmapped."""
        with self._lock:
            if self._pinned is not None:
                return True
            if self._sock is None:
                return False
            probe = np.frombuffer(self._map, dtype=np.uint8, count=1)
            address = int(probe.ctypes.data)
            del probe
            if not pinning.register(address, self._size):
                return False
            self._pinned = (pinning, address)
            return True

    @property
    def pinned(self) -> bool:
        return self._pinned is not None

    def _unpin_when_unused(self) -> None:
        """Called with the lock held: unregisters once nothing can read the
        mapping through this ring any more."""
        if self._pinned is not None and self._sock is None and self._held == 0:
            pinning, address = self._pinned
            self._pinned = None
            pinning.unregister(address)

    @property
    def held(self) -> int:
        """Batches whose views are alive (slots not yet returned)."""
        return self._held

    def view(
        self, slot: int, offset: int, length: int, *, copy: bool = False
    ) -> npt.NDArray[np.uint8]:
        """The slot's bytes as a read-only array; the slot returns to the
        server when the array (and every view of it) is gone. ``copy``: a
        private copy instead, and the slot returns at once."""
        shared = np.frombuffer(self._map, dtype=np.uint8, count=length, offset=offset)
        if copy:
            private = shared.copy()
            del shared
            self._credit(slot)
            return private
        with self._lock:
            self._held += 1
        weakref.finalize(shared, self._release, slot)
        return shared

    def _release(self, slot: int) -> None:
        with self._lock:
            self._held -= 1
            self._unpin_when_unused()
        self._credit(slot)

    def _credit(self, slot: int) -> None:
        # A forked child shares the connection: only the process that mapped
        # the ring speaks for it.
        if os.getpid() != self._pid:
            return
        with self._lock:
            if self._sock is None:
                return
            try:
                self._sock.sendall(struct.pack("<I", slot))
            except OSError:
                # The stream is over; its slots were returned with the connection.
                pass

    def close(self) -> None:
        """Returns every slot (the stream is over or abandoned). Views stay
        valid: the mapping lives until the last one is gone."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._unpin_when_unused()


def attach(
    rings: dict[bytes, SharedRing],
    grpc_socket: str,
    shared: Any,
    pinning: HostPinning | None = None,
) -> SharedRing:
    """The stream's ring for ``shared`` (a ``SharedImages``), mapped (and
    registered with ``pinning``) on first use."""
    ring = rings.get(shared.ring_token)
    if ring is None:
        ring = SharedRing(grpc_socket, shared.ring_token, shared.ring_bytes)
        rings[shared.ring_token] = ring
        if pinning is not None:
            ring.pin(pinning)
    return ring
