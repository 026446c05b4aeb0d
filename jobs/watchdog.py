"""A stall watchdog for long jobs: no progress for too long ends the job, loudly.

A job that waits forever (a lock never released, an engine that stopped answering, a Ray
task that never returns) is worse than one that fails: an unattended nightly or generation
run holds its cluster and reports nothing. Inside :func:`watch`, the job's loops call
:func:`beat` whenever work finishes (a batch written, prompts answered, a stage done). When
no beat comes for ``timeout_s`` seconds, the watchdog

1. writes every thread's stack (``faulthandler``) and the last progress it saw into
   ``<run dir>/stalled-<UTC time>.txt``;
2. raises :class:`Stalled` in the job's main thread (a signal interrupts the wait it is stuck
   in; whatever that wait raises becomes :class:`Stalled`), so the job's cleanup runs and the
   command line prints one line and exits 1;
3. if the main thread is still stuck ``grace_s`` seconds later, prints that line itself and
   ends the process (exit 1).

Every job resumes on a rerun (finished stages, shards and chunks are kept), so the fix for a
stall is to look at the stacks and run the same command again.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from logicrank.jobs.raysession import write_to_terminal
from logicrank.schemas.errors import JobFailed

DEFAULT_TIMEOUT_S = 1800.0  # the longest step without progress seen on a GPU cluster is a large model's start (minutes)
_SIGNAL = signal.SIGUSR2


class Stalled(JobFailed):
    """The job made no progress for longer than its stall timeout."""


class _Watch:
    def __init__(self, job: str, rundir: Path, timeout_s: float, grace_s: float):
        self.job, self.rundir, self.timeout_s, self.grace_s = job, Path(rundir), timeout_s, grace_s
        self.last = time.monotonic()
        self.what = "started"
        self.message: str | None = None
        self.done = threading.Event()

    def beat(self, what: str | None) -> None:
        self.last = time.monotonic()
        if what:
            self.what = what

    def run(self, main_thread: int, signalled: bool) -> None:
        while not self.done.wait(min(5.0, self.timeout_s / 4)):
            idle = time.monotonic() - self.last
            if idle < self.timeout_s:
                continue
            stacks = self._dump(idle)
            self.message = (f"{self.job}: no progress for {idle:.0f} s (--stall-timeout {self.timeout_s:g}); last progress: {self.what}. "
                            f"Every thread's stack is in {stacks}; what finished is kept: run the same command again to resume.")
            for _ in range(2 if signalled else 0):  # a second signal halfway, should the job have caught the first one
                signal.pthread_kill(main_thread, _SIGNAL)  # raises Stalled in the main thread, wherever it waits
                if self.done.wait(self.grace_s / 2):
                    return
            if signalled or not self.done.wait(self.grace_s):  # the main thread did not come back: end the process ourselves
                try:
                    write_to_terminal(f"error: {self.message}\n")  # (past the stderr filter, whose thread os._exit stops)
                finally:
                    os._exit(1)  # whatever the write did
            return

    def _dump(self, idle: float) -> Path:
        self.rundir.mkdir(parents=True, exist_ok=True)
        path = self.rundir / f"stalled-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.txt"
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"{self.job}: no progress for {idle:.0f} s; last progress: {self.what}; pid {os.getpid()}\n\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        return path


_current: _Watch | None = None


def beat(what: str | None = None) -> None:
    """Report progress (``what``: a few words, shown if the job stalls later). Free outside :func:`watch`."""
    w = _current
    if w is not None:
        w.beat(what)


def cpu_seconds() -> float:
    """The CPU time of this process and of every process below it: the step a child process
    does for it (the table maintained or the BM25 index made apart, pipelines/engines/store/),
    or Ray's workers on the cluster it started. A child gone since the last look takes its
    seconds with it (the sum falls: no progress counted for that look). Cheap, as the busy
    thread looks every few seconds on a loaded machine: on Linux the kernel's list of each
    process's children and their ``stat`` lines, a few reads; elsewhere psutil's scan of every
    process."""
    total = time.process_time()
    try:
        return total + sum(_proc_cpu(pid) for pid in _proc_descendants(os.getpid()))
    except OSError:  # no /proc/PID/task/TID/children here
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                t = child.cpu_times()
            except psutil.Error:  # (ended between the listing and the look)
                continue
            total += t.user + t.system
        return total


def _proc_descendants(pid: int) -> list[int]:
    """The processes below ``pid``, from /proc (OSError where the kernel does not list children)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:  # (ended meanwhile)
            continue
        for tid in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{tid}/children").read_text().split()
            except FileNotFoundError:
                if parent == pid and tid == str(pid):
                    raise OSError("no /proc children lists") from None
                continue
            found += map(int, children)
            todo += map(int, children)
    return found


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(pid: int) -> float:
    """User and system seconds of ``pid`` (0 once it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15 of stat)


def working(cpu_before: float, cpu_now: float, seconds: float, share: float = 0.05) -> bool:
    """Whether CPU seconds that went from ``cpu_before`` to ``cpu_now`` over ``seconds`` of
    wall time show work: at least ``share`` of one core. Ray's own daemons, idle, use about
    2% (an engine actor whose engine core is paused, about 3%); a process that waits on
    nothing (a lock, a dead peer) uses little more."""
    return cpu_now - cpu_before >= share * seconds


@contextmanager
def busy(what: str, every_s: float = 5.0) -> Iterator[None]:
    """Around one long call that reports nothing itself (an index build over millions of rows,
    here or in a child process): progress is reported every ``every_s`` seconds as long as the
    process or one below it keeps using CPU time (:func:`cpu_seconds`), so a working step is
    never taken for a stall while one that waits on nothing (a lock, a dead peer) still is
    (:func:`working`)."""
    if _current is None:
        yield
        return
    stop = threading.Event()

    def pulse():
        used = cpu_seconds()
        while not stop.wait(every_s):
            now = cpu_seconds()
            if working(used, now, every_s):
                beat(what)
            used = now

    thread = threading.Thread(target=pulse, daemon=True, name="stall-watchdog-busy")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def watch(job: str, rundir: str | Path, timeout_s: float | None, grace_s: float = 60.0) -> Iterator[None]:
    """Run the block under the stall watchdog (module docstring); ``timeout_s`` None or 0: no watchdog."""
    global _current
    if not timeout_s:
        yield
        return
    if _current is not None:  # a job inside a job (nightly -> index): the outer watch covers both
        yield
        return
    w = _Watch(job, Path(rundir), timeout_s, grace_s)
    main = threading.current_thread() is threading.main_thread()
    previous = None
    if main:
        def _raise(signum, frame):
            if w.message and not w.done.is_set():
                raise Stalled(w.message)

        previous = signal.signal(_SIGNAL, _raise)
    thread = threading.Thread(target=w.run, args=(threading.main_thread().ident, main), daemon=True, name="stall-watchdog")
    _current = w
    thread.start()
    try:
        yield
    except BaseException as exc:
        # Once the watchdog fired, whatever escapes the block is the interrupted wait unwinding
        # (a C extension such as Ray's may wrap the signal's exception in a SystemError).
        if w.message and not isinstance(exc, Stalled):
            raise Stalled(w.message) from exc
        raise
    finally:
        w.done.set()
        _current = None
        if main:
            signal.signal(_SIGNAL, previous)
