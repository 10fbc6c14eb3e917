"""Which epoch a ``ShardfeedDataset`` pass streams, and the page of shared
memory its copies in DataLoader workers agree through.

Pure: no torch, no gRPC. The dataset (``shardfeed.torch``) holds the
current epoch, its *choice count* (bumped by every ``set_epoch`` and
``load_state_dict`` in the process that made it) and an :class:`EpochPage`;
:func:`choose_epoch` decides what each new pass streams:

- a state loaded into a worker's copy (torchdata's ``StatefulDataLoader``)
  is followed whatever the page says;
- otherwise, a pass already begun under the current choice (here, or in a
  worker of an earlier pass) makes this one the next epoch; sibling workers
  of one pass share its token (the DataLoader's base seed), so they stream
  the same epoch;
- a choice made since (``set_epoch``, ``load_state_dict``) streams the
  epoch chosen.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import struct
import weakref
from collections.abc import Iterator
from typing import NamedTuple

_log = logging.getLogger("shardfeed")


def choose_epoch(
    epoch: int, choice: int, started: Started | None, token: int, worker_loaded: bool
) -> int:
    """The epoch a new pass streams (see the module's rules): ``epoch`` and
    ``choice`` are the dataset copy's, ``started`` the page's last pass
    begun, ``token`` this pass's."""
    if worker_loaded or started is None or started.choice != choice:
        return epoch
    if started.token == token:
        return started.epoch
    return max(started.epoch + 1, epoch)


def pass_token(loader_seed: int | None, passes: int, fresh: int) -> int:
    """A pass's token: in a DataLoader worker, of its loader's iterator
    (``loader_seed``: the worker's seed less its id, shared by the
    iterator's workers) and of how many passes this copy began (a
    persistent worker's copy begins one per epoch); elsewhere ``fresh``."""
    if loader_seed is None:
        return fresh
    return (loader_seed * 1_000_003 + passes) % (1 << 62)


class EpochPage:
    """A page of shared memory that DataLoader workers write and the process
    that made the dataset reads: whether a worker iterated; the last epoch a
    pass began, with the epoch choice count it ran under and the pass's
    token; and the last epoch a pass completed, with its choice count.

    The page is a memfd the owner keeps open: a forked worker inherits the
    mapping, a spawned one (``forkserver``, ``spawn``) maps it again through
    ``/proc/<owner>/fd/<fd>``, checking that the number still names this
    page (a worker unpickles its dataset when it gets to run, by which time
    the owner may have dropped the dataset and reused the number for another
    dataset's page). Every access holds the page's record lock (POSIX: a
    forked worker shares the owner's descriptor, and must still exclude
    it): a pass's record is several fields, and two workers update it at
    once. Where
    mapping fails (no memfd, another PID namespace), a worker gets a private
    copy, its passes stay unseen, and it says so."""

    # Worker used; completed epoch + 1 (0: none), its choice; started epoch
    # + 1 (0: none), its choice, its pass token.
    _FORMAT = "<Bxxxxxxxqqqqq"

    def __init__(self, source: tuple[int, int, int, bytes] | None = None) -> None:
        self._owner: tuple[int, int, int] | None = None
        # The descriptor whose file lock guards the page (None: private).
        self._lock_fd: int | None = None
        if source is not None and source[0] != os.getpid():
            mapped = map_owner_page(source[0], source[1], source[2])
            if mapped is not None:
                self._page, self._lock_fd = mapped
                self._owner = (source[0], source[1], source[2])
                weakref.finalize(self, os.close, self._lock_fd)
                return
            if source[0] >= 0:
                _log.warning(
                    "a DataLoader worker could not map its dataset's epoch page (process %d): "
                    "the epochs its passes stream are not seen by the process that made the "
                    "dataset; call set_epoch(e) before each epoch",
                    source[0],
                )
        # The owner (a copy made in this process owns a page of its own).
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create(_PAGE_NAME, os.MFD_CLOEXEC)
            os.ftruncate(fd, mmap.PAGESIZE)
            self._page = mmap.mmap(fd, mmap.PAGESIZE)
            self._owner = (os.getpid(), fd, os.fstat(fd).st_ino)
            self._lock_fd = fd
            weakref.finalize(self, os.close, fd)
        else:
            self._page = mmap.mmap(-1, mmap.PAGESIZE)
        if source is not None:
            self._page[: len(source[3])] = source[3]

    def to_pickle(self) -> tuple[int, int, int, bytes]:
        owner_pid, fd, inode = self._owner if self._owner is not None else (-1, -1, -1)
        with self._locked():
            record = bytes(self._page[: struct.calcsize(self._FORMAT)])
        return owner_pid, fd, inode, record

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._lock_fd is None:
            yield
            return
        fcntl.lockf(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_UN)

    def _read(self) -> list[int]:
        with self._locked():
            return list(struct.unpack_from(self._FORMAT, self._page))

    def _write(self, **fields: int) -> None:
        with self._locked():
            values = list(struct.unpack_from(self._FORMAT, self._page))
            for name, value in fields.items():
                values[self._FIELDS.index(name)] = value
            struct.pack_into(self._FORMAT, self._page, 0, *values)

    _FIELDS = ("used", "completed", "completed_choice", "started", "started_choice", "token")

    def set_worker_used(self) -> None:
        self._write(used=1)

    def worker_used(self) -> bool:
        return self._read()[0] == 1

    def set_completed(self, epoch: int, choice: int) -> None:
        self._write(completed=epoch + 1, completed_choice=choice)

    def completed(self) -> tuple[int, int] | None:
        _, epoch, recorded, *_ = self._read()
        return None if epoch == 0 else (epoch - 1, recorded)

    def set_started(self, epoch: int, choice: int, token: int) -> None:
        self._write(started=epoch + 1, started_choice=choice, token=token)

    def started(self) -> Started | None:
        *_, epoch, choice, token = self._read()
        return None if epoch == 0 else Started(epoch - 1, choice, token)


class Started(NamedTuple):
    """The last pass begun: its epoch, choice count and token."""

    epoch: int
    choice: int
    token: int


_PAGE_NAME = "shardfeed-dataset-state"


def map_owner_page(owner_pid: int, fd: int, inode: int) -> tuple[mmap.mmap, int] | None:
    """The owner's page mapped here, and a descriptor of it for its lock;
    None unless ``/proc/<owner_pid>/fd/<fd>`` is still that page (``inode``):
    the owner may have closed it and reused the number for another file (a
    checkpoint) or another dataset's page."""
    if owner_pid < 0:
        return None
    path = f"/proc/{owner_pid}/fd/{fd}"
    try:
        if not os.readlink(path).startswith(f"/memfd:{_PAGE_NAME}"):
            return None
        opened = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(opened).st_ino != inode:
            os.close(opened)
            return None
        return mmap.mmap(opened, mmap.PAGESIZE), opened
    except (OSError, ValueError):
        os.close(opened)
        return None
