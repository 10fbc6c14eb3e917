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
import weakref
from typing import Any

import numpy as np
import numpy.typing as npt

_CONNECT_TIMEOUT = 10.0


def socket_path(target: str) -> str | None:
    """The Unix socket path of a ``unix:`` gRPC target, else None."""
    for prefix in ("unix://", "unix:"):
        if target.startswith(prefix):
            return target[len(prefix) :]
    return None


class SharedRing:
    """One stream's mapping of the server's ring and its credit connection."""

    def __init__(self, grpc_socket: str, token: bytes, size: int) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(_CONNECT_TIMEOUT)
            sock.connect(grpc_socket + ".fds")
            sock.sendall(token)
            _, fds, _, _ = socket.recv_fds(sock, 1, 1)
            if len(fds) != 1:
                raise ConnectionError("the server sent no shared-memory descriptor")
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


def attach(rings: dict[bytes, SharedRing], grpc_socket: str, shared: Any) -> SharedRing:
    """The stream's ring for ``shared`` (a ``SharedImages``), mapped on first use."""
    ring = rings.get(shared.ring_token)
    if ring is None:
        ring = SharedRing(grpc_socket, shared.ring_token, shared.ring_bytes)
        rings[shared.ring_token] = ring
    return ring
