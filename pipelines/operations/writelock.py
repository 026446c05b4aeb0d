"""One writer per LanceDB table: a lock taken before an index run touches the table.

LanceDB commits are optimistic: two writers interleave their commits and the table ends
up matching neither snapshot (and Lance's ``mode="create"`` is not an atomic
create-if-absent: two concurrent creators both succeed in 2 of 6 races, measured).
So the index job holds a lock named after the table for its whole run, and a second run
is refused at start with the holder's host, pid and start time.

Two kinds, chosen by the database location:

- a local or mounted path: ``fcntl.flock`` on ``<db>/_locks/<table>.lock``. The kernel
  releases it when the holder dies, so a killed run never leaves a stale lock behind.
- an object-store URI (``s3://``, ``gs://``, ...): a lease file ``<db>/_locks/<table>.lease``
  written, then read back after ``settle_s``; the writer whose token is read back holds it
  (the store's last write wins, and every contender reads the winner). The holder renews it
  every ``ttl_s / 3``; an expired lease may be taken over.

The lease's guarantee, on a store with read-after-write consistency (S3, GCS, a local or
mounted file system): **never two holders**, however slow a contender is. A contender claims
the lease only if its own cycle (read "free", write its lease) took less than ``settle_s``;
two holders X and Y (X's write first) would need Y to read "free" before X's write and to
write after X's read-back, a cycle longer than ``settle_s``. A contender that was slower (a
pause, a loaded machine) gives up without claiming and removes its lease if it is still
there. What is not guaranteed is a winner: a race between contenders can end with none of
them holding it (each is refused, "run again"), never with two.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow.fs as pafs

from logicrank.schemas.errors import UserError


class TableLockedError(UserError, RuntimeError):
    """Another run holds the table's write lock."""


@dataclass(frozen=True)
class Holder:
    token: str
    host: str
    pid: int
    job: str
    since: str  # ISO time the lock was taken
    expires: float | None = None  # lease only: unix time

    @classmethod
    def me(cls, job: str, expires: float | None = None) -> Holder:
        return cls(uuid.uuid4().hex, socket.gethostname(), os.getpid(), job, datetime.now(UTC).isoformat(timespec="seconds"), expires)

    def describe(self) -> str:
        return f"{self.job} on host {self.host}, pid {self.pid}, since {self.since}"

    def to_bytes(self) -> bytes:
        """The holder as the lock file or lease stores it (JSON), read back by :meth:`from_bytes`."""
        return json.dumps(self.__dict__).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Holder | None:
        """The holder stored in ``raw`` (:meth:`to_bytes`); None when it is not one (empty or torn)."""
        try:
            return cls(**json.loads(raw.decode()))
        except (ValueError, TypeError):
            return None


class Clock:
    """The time the lease reads and waits on: real time. A test injects one it advances by
    hand (tests/unit/test_writelock.py), so expiry and renewal are checked without sleeping."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait ``seconds`` or until ``event`` is set; whether it was set."""
        return event.wait(seconds)


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


class TableLock:
    """``with TableLock(db, table, "index"):`` holds the table's write lock, or raises
    :class:`TableLockedError` at once."""

    def __init__(self, db: str, table: str, job: str, ttl_s: float = 600.0, settle_s: float = 2.0, kind: str | None = None,
                 clock: Clock | None = None):
        self.db, self.table, self.job = os.path.expanduser(db) if "://" not in db else db, table, job  # ("~" as LanceDB reads it)
        self.ttl_s, self.settle_s, self.clock = ttl_s, settle_s, clock or Clock()
        self.kind = kind or ("flock" if _is_local(db) else "lease")
        self._fd: int | None = None
        self._holder: Holder | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lost: str | None = None  # lease only: why it is no longer ours
        self.renewals = 0  # lease only: renewals written

    # -- the public face ----------------------------------------------------------
    def __enter__(self) -> TableLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False

    def acquire(self) -> None:
        (self._flock if self.kind == "flock" else self._lease)()

    def ensure_held(self) -> None:
        """Raise :class:`TableLockedError` if the lease was lost (renewal failed, or another run
        took it over); the writer calls this before every commit. A kernel lock cannot be lost."""
        expires = self._holder.expires if self._holder is not None else None
        if not self._lost and expires is not None and self.clock.time() >= expires - self.settle_s:
            self._lost = "it expired before it was renewed (a long pause?)"
        if self._lost:
            raise TableLockedError(
                f"{self.job}: lost the write lease on table {self.table!r} in {self.db!r} ({self._lost}); stopped before "
                "writing more. Nothing written is lost: rerun to finish (each write is a keyed upsert)."
            )

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._renewer is not None:
            self._stop.set()
            self._renewer.join()
            self._renewer = None
            fs, path = self._lease_path()
            current = self._read(fs, path)
            if current is not None and self._holder is not None and current.token == self._holder.token:
                fs.delete_file(path)

    def _refuse(self, holder: Holder | None) -> TableLockedError:
        who = holder.describe() if holder else "another process"
        return TableLockedError(
            f"{self.job}: table {self.table!r} in {self.db!r} is being written by {who}; one writer per table. "
            "Wait for that run to finish, then run again."
        )

    def _slow(self) -> TableLockedError:
        return TableLockedError(
            f"{self.job}: could not take the write lease of table {self.table!r} in {self.db!r} within {self.settle_s:g} s "
            "(another run contending for it, or a slow store); nothing was written. Run again."
        )

    # -- a local path: the kernel's lock ----------------------------------------------
    def _flock(self) -> None:
        import fcntl

        root = self.db[len("file://"):] if self.db.startswith("file://") else self.db
        path = os.path.join(root, "_locks", f"{self.table}.lock")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Holder.from_bytes(os.pread(fd, 4096, 0))
            os.close(fd)
            raise self._refuse(holder) from None
        try:
            self._holder = Holder.me(self.job)
            os.ftruncate(fd, 0)
            os.pwrite(fd, self._holder.to_bytes(), 0)
        except BaseException:
            os.close(fd)  # closing drops the lock too
            raise
        self._fd = fd

    # -- an object store: a verified lease ------------------------------------------------
    def _lease_path(self) -> tuple[pafs.FileSystem, str]:
        fs, root = pafs.FileSystem.from_uri(self.db)
        return fs, f"{root.rstrip('/')}/_locks/{self.table}.lease"

    @staticmethod
    def _read(fs: pafs.FileSystem, path: str) -> Holder | None:
        """The lease's holder, or None when there is no lease file. Any other failure to read
        raises: it must never pass for "free"."""
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with fs.open_input_stream(path) as f:
            return Holder.from_bytes(f.read())

    def _write(self, fs: pafs.FileSystem, path: str, holder: Holder) -> None:
        """Whole or not at all: written beside the lease, then renamed over it. Two
        contenders writing the lease file itself at once could interleave their bytes (each
        truncates on open, writes on close) into a file that names neither of them."""
        tmp = f"{path}.{holder.token}.tmp"
        with fs.open_output_stream(tmp) as f:
            f.write(holder.to_bytes())
        fs.move(tmp, path)

    def _lease(self) -> None:
        fs, path = self._lease_path()
        try:
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            self._take_lease(fs, path)
        except OSError as exc:
            raise TableLockedError(
                f"{self.job}: cannot read or write the lease {path!r} of table {self.table!r} ({exc}); refusing to write "
                "without it. Check access to the database location and run again."
            ) from exc

    def _take_lease(self, fs: pafs.FileSystem, path: str) -> None:
        start = self.clock.monotonic()
        current = self._read(fs, path)
        if current is not None and (current.expires or 0) > self.clock.time():
            raise self._refuse(current)
        me = Holder.me(self.job, self.clock.time() + self.ttl_s)
        if self.clock.monotonic() - start >= self.settle_s:  # too slow to write safely: another may have claimed it meanwhile
            raise self._slow()
        self._write(fs, path, me)
        if self.clock.monotonic() - start >= self.settle_s:  # written too late: a contender may already hold it; never claim
            with contextlib.suppress(OSError):
                if self._read(fs, path) == me:
                    fs.delete_file(path)
            raise self._slow()
        self.clock.sleep(self.settle_s)  # every contender's write has landed; the last one won
        if self._read(fs, path) != me:
            raise self._refuse(self._read(fs, path))
        self._holder, self._lost = me, None
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, args=(fs, path), daemon=True, name=f"lease-{self.table}")
        self._renewer.start()

    def _renew(self, fs: pafs.FileSystem, path: str) -> None:
        """Every ttl/3: extend the lease if it is still ours; otherwise, or on any error, record
        the loss (:meth:`ensure_held` then stops the writer) and stop renewing."""
        while not self.clock.wait(self._stop, self.ttl_s / 3):
            try:
                current = self._read(fs, path)
                if current is None or self._holder is None or current.token != self._holder.token:
                    self._lost = f"taken over by {current.describe()}" if current else "the lease file disappeared"
                    return
                # a lease that may have expired may be another's by now: never extend it
                deadline = (self._holder.expires or 0) - self.settle_s
                if self.clock.time() >= deadline:
                    self._lost = "it expired before it was renewed (a long pause?)"
                    return
                renewed = Holder(**{**self._holder.__dict__, "expires": self.clock.time() + self.ttl_s})
                self._write(fs, path, renewed)
                if self.clock.time() >= deadline:
                    self._lost = "its renewal was written too late (a long pause?)"
                    return
                self._holder = renewed
                self.renewals += 1
            except Exception as exc:  # noqa: BLE001 - any failure to renew means the lease may lapse
                self._lost = f"renewal failed: {exc}"
                return
