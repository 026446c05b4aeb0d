"""One writer per table: the kernel lock on local paths, the verified lease elsewhere."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from logicrank.pipelines.operations.writelock import Clock, TableLock, TableLockedError

pytestmark = pytest.mark.faults  # the lease is about time: held, expired, paused past the settle time


class ManualClock(Clock):
    """Time that moves only when a test advances it (or a contender's settle sleep does). A
    renewer waiting on it wakes when the time passes its wait; :meth:`advance` returns once
    every renewer has acted on the new time, so a test checks the lease without sleeping."""

    def __init__(self, start: float = 1_800_000_000.0):
        self.now = start
        self.cond = threading.Condition()
        self.waits = 0  # waits begun: a renewer back in its wait has finished its turn
        self.waiting: set[int] = set()  # the threads inside a wait now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.cond:
            self.now += seconds
            self.cond.notify_all()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        with self.cond:
            self.waits += 1
            self.waiting.add(threading.get_ident())
            self.cond.notify_all()
            end = self.now + seconds
            try:
                while not event.is_set() and self.now < end:
                    self.cond.wait(0.01)  # (a poll for the event, which does not notify the condition)
            finally:
                self.waiting.discard(threading.get_ident())
            return event.is_set()

    def advance(self, seconds: float, *locks: TableLock) -> None:
        """Move the time on, then wait until each lock's renewer has had its turn: it is
        waiting again, or it stopped (the lease lost). First each renewer must be inside its
        wait: one still starting (a loaded machine) would begin its wait after the move and
        take no turn for it."""
        with self.cond:
            for lock in locks:
                while lock._renewer is not None and lock._renewer.is_alive() and lock._renewer.ident not in self.waiting:
                    self.cond.wait(0.01)
            before = self.waits
            self.now += seconds
            self.cond.notify_all()
            for lock in locks:  # no deadline: a renewer that never takes its turn holds the test until pytest's timeout
                while not (self.waits > before or lock._renewer is None or not lock._renewer.is_alive()):
                    self.cond.wait(0.01)  # (a thread's end does not notify the condition: polled)


def _lease(uri: str, clock: Clock, ttl_s: float = 0.6, settle_s: float = 0.05) -> TableLock:
    return TableLock(uri, "docs", "index", ttl_s=ttl_s, settle_s=settle_s, kind="lease", clock=clock)


def test_a_second_writer_is_refused_naming_the_first_and_a_released_lock_is_free(tmp_path):
    first = TableLock(str(tmp_path), "docs", "index")
    first.acquire()
    with pytest.raises(TableLockedError, match=r"table 'docs' .* is being written by index on host .*, pid \d+, since"):
        TableLock(str(tmp_path), "docs", "index").acquire()
    with TableLock(str(tmp_path), "other", "index"):  # another table is another lock
        pass
    first.release()
    with TableLock(str(tmp_path), "docs", "restore"):
        pass


def test_a_dead_holder_leaves_no_stale_lock(tmp_path):
    # the kernel drops a flock with its process: a killed index run never blocks the next one
    code = f"from logicrank.pipelines.operations.writelock import TableLock; l = TableLock({str(tmp_path)!r}, 'docs', 'index'); l.acquire(); print('held', flush=True); import time; time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(TableLockedError, match=f"pid {child.pid}"):
            TableLock(str(tmp_path), "docs", "index").acquire()
    finally:
        child.kill()
        child.wait()
    with TableLock(str(tmp_path), "docs", "index"):
        pass


def test_the_lease_refuses_a_live_holder_and_takes_over_an_expired_one(tmp_path):
    uri, clock = f"file://{tmp_path}", ManualClock()
    first = _lease(uri, clock)
    first.acquire()
    with pytest.raises(TableLockedError, match="is being written by index"):
        _lease(uri, clock).acquire()
    for _ in range(3):  # renewed every ttl/3: still held past its first expiry
        clock.advance(0.2, first)
    assert first.renewals == 3
    with pytest.raises(TableLockedError):
        _lease(uri, clock).acquire()
    first._stop.set()  # the holder stops renewing (as if it died) ...
    first._renewer.join()
    clock.advance(0.7)  # ... and its lease expires
    with _lease(uri, clock):
        pass
    first._renewer = None


def test_racing_lease_contenders_never_both_hold(tmp_path):
    """The lease's guarantee (pipelines/operations/writelock.py): never two holders; a race may end with
    none (each refused, 'run again'), and then nothing is left behind: the next run takes it.
    A short settle time makes slow cycles likely on a loaded machine; the pauses that break
    the old protocol are forced in the next test."""
    import threading

    uri = f"file://{tmp_path}"
    for _ in range(15):
        won, gate = [], threading.Barrier(4)

        def contend(won=won, gate=gate):
            lock = TableLock(uri, "docs", "index", ttl_s=30, settle_s=0.02, kind="lease")
            gate.wait()
            try:
                lock.acquire()
                won.append(lock)
            except TableLockedError:
                pass

        threads = [threading.Thread(target=contend) for _ in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert len(won) <= 1, f"{len(won)} contenders hold the lease at once"
        for lock in won:
            lock.ensure_held()
            lock.release()
        with TableLock(uri, "docs", "index", ttl_s=30, settle_s=0.02, kind="lease"):  # a race leaves nothing stale
            pass


class _Paused(TableLock):
    """A contender that pauses (a GC pause, a loaded machine) after reading the lease free or
    while its write is in flight, until another has claimed the lease."""

    def __init__(self, *args, where: str, read: threading.Event, go: threading.Event, **kw):
        super().__init__(*args, **kw)
        self.where, self.read_done, self.go = where, read, go

    def _read(self, fs, path):
        current = super()._read(fs, path)
        if not self.read_done.is_set():
            self.read_done.set()
            if self.where == "after read":
                self.go.wait()
        return current

    def _write(self, fs, path, holder):
        if self.where == "in write" and not self.go.is_set():
            self.go.wait()
        super()._write(fs, path, holder)


@pytest.mark.parametrize("where", ["after read", "in write"])
def test_a_contender_paused_past_the_settle_time_never_claims_the_lease(tmp_path, where):
    """Y reads the lease free, then pauses; X takes the lease meanwhile. Before the fix, Y's
    late write won its read-back and both held the lease."""
    uri, read, go, refused, clock = f"file://{tmp_path}", threading.Event(), threading.Event(), [], ManualClock()
    y = _Paused(uri, "docs", "index", ttl_s=0.6, settle_s=0.1, kind="lease", where=where, read=read, go=go, clock=clock)

    def contend():
        try:
            y.acquire()
        except TableLockedError as exc:
            refused.append(str(exc))

    t = threading.Thread(target=contend, daemon=True)
    t.start()
    try:
        read.wait()
        x = TableLock(uri, "docs", "index", ttl_s=0.6, settle_s=0.1, kind="lease", clock=clock)
        x.acquire()  # Y read "free" before X's write
        clock.advance(0.15)  # Y's pause outlasts the settle time (X's renewer's first turn is later)
    finally:
        go.set()  # Y goes on, whatever happened
    t.join()
    assert refused and "could not take the write lease" in refused[0] and "nothing was written" in refused[0]
    clock.advance(0.2, x)  # X's renewer takes a turn
    if where == "after read":  # Y gave up before writing: X's lease is untouched
        assert x.renewals == 1
        x.ensure_held()
    else:  # Y's late write replaced X's lease (and Y removed it): X stops before its next commit, so still one writer
        with pytest.raises(TableLockedError, match="lost the write lease"):
            x.ensure_held()
    x.release()


def test_a_lease_taken_over_or_gone_stops_the_writer_before_its_next_commit(tmp_path):
    from logicrank.pipelines.operations.writelock import Holder

    uri, clock = f"file://{tmp_path}", ManualClock()
    lock = _lease(uri, clock, ttl_s=0.3)
    lock.acquire()
    lock.ensure_held()
    intruder = Holder.me("index", clock.time() + 60)
    (tmp_path / "_locks" / "docs.lease").write_bytes(intruder.to_bytes())  # e.g. after a long pause, another run took it
    clock.advance(0.1, lock)  # the renewer's turn: it finds the lease another's
    with pytest.raises(TableLockedError, match="lost the write lease .*taken over by index"):
        lock.ensure_held()
    lock.release()  # leaves the new holder's lease alone
    assert (tmp_path / "_locks" / "docs.lease").read_bytes() == intruder.to_bytes()


def test_a_lease_not_renewed_in_time_stops_the_writer(tmp_path):
    clock = ManualClock()
    lock = _lease(f"file://{tmp_path}", clock)
    lock.acquire()
    lock._stop.set()  # the renewer stalls (a long pause of the whole process, say)
    lock._renewer.join()
    clock.advance(0.6)
    with pytest.raises(TableLockedError, match="expired before it was renewed"):
        lock.ensure_held()
    lock._renewer = None


def test_an_unreadable_lease_is_never_taken_for_a_free_one(tmp_path):
    (tmp_path / "_locks" / "docs.lease").mkdir(parents=True)  # exists, but cannot be read as a file
    with pytest.raises(TableLockedError, match="cannot read or write the lease"):
        TableLock(f"file://{tmp_path}", "docs", "index", settle_s=0.05, kind="lease").acquire()


def test_a_path_under_home_written_with_a_tilde_is_the_same_table_and_the_same_lock(tmp_path, monkeypatch):
    """A config file's ``db: ~/x`` reaches no shell: LanceDB expands the ``~``, and so must the
    store's path checks and the write lock (two spellings of one table were two locks, and the
    ``~`` one a folder named ``~`` in the working directory)."""
    import lancedb
    import pyarrow as pa

    from logicrank.pipelines.engines.store import DocStore

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    lancedb.connect(str(tmp_path / "home" / "db")).create_table("docs", pa.table({"a": [1]}))
    assert DocStore("~/db", "docs").exists()
    with TableLock(str(tmp_path / "home" / "db"), "docs", "index"), pytest.raises(TableLockedError):
        TableLock("~/db", "docs", "index").acquire()
    assert not (tmp_path / "~").exists()
