"""The stall watchdog, in child processes (it signals and may end its process): a job stuck
on a lock is stopped with its stacks on disk; one whose main thread cannot be interrupted is
ended after the grace period; one that reports progress is left alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import sys, threading, time
from pathlib import Path
from logicrank.jobs.watchdog import Stalled, beat, watch
out = Path(sys.argv[1])
"""


def _child(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRELUDE + body, str(tmp_path)], cwd=ROOT, capture_output=True, text=True)


def test_a_job_waiting_on_a_lock_forever_is_stopped_with_every_threads_stack(tmp_path):
    res = _child("""
lock = threading.Lock()
lock.acquire()
def holder():  # a second thread, so the dump shows more than one
    time.sleep(60)
threading.Thread(target=holder, name="holder", daemon=True).start()
try:
    with watch("demo", out, timeout_s=1.0, grace_s=20):
        beat("step 1 of 2 done")
        lock.acquire()  # never released: the main thread waits forever
except Stalled as exc:
    print("STALLED", exc)
    sys.exit(1)
""", tmp_path)
    assert res.returncode == 1, res.stderr
    line = res.stdout.strip()
    assert line.startswith("STALLED demo: no progress for ") and "last progress: step 1 of 2 done" in line, line
    dumps = list(tmp_path.glob("stalled-*.txt"))
    assert len(dumps) == 1 and str(dumps[0]) in line
    text = dumps[0].read_text()
    assert "last progress: step 1 of 2 done" in text
    assert text.count("hread 0x") >= 3  # the main thread, the holder and the watchdog itself ("Current thread")
    assert "lock.acquire()" in text or 'File "<string>"' in text


def test_a_main_thread_that_cannot_be_interrupted_is_ended_after_the_grace_period(tmp_path):
    res = _child("""
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])  # the watchdog's signal never arrives
with watch("demo", out, timeout_s=1.0, grace_s=1.0):
    time.sleep(60)
print("not reached")
""", tmp_path)
    assert res.returncode == 1 and "not reached" not in res.stdout
    assert res.stderr.strip().splitlines()[-1].startswith("error: demo: no progress for "), res.stderr
    assert len(list(tmp_path.glob("stalled-*.txt"))) == 1


def test_the_last_line_of_a_process_the_watchdog_ends_passes_the_stderr_filter(tmp_path):
    """A job's fd 2 is a pipe read by a thread (jobs/raysession.py, drop_native_noise) that
    os._exit stops: the watchdog writes its line past it, to the real stderr. The pump is held
    back here (as on a busy machine), so a line left to it is lost every time, not sometimes."""
    res = _child("""
import signal, threading
import logicrank.jobs.raysession as raysession
from logicrank.jobs.raysession import drop_native_noise
forward = raysession._write_all
def held_back(fd, data):
    if threading.current_thread().name == "stderr-filter":
        threading.Event().wait()  # held back until the process ends: only os._exit ends it
    forward(fd, data)
raysession._write_all = held_back
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
with drop_native_noise(), watch("demo", out, timeout_s=1.0, grace_s=1.0):
    time.sleep(60)
""", tmp_path)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1].startswith("error: demo: no progress for "), res.stderr


def test_progress_keeps_a_slow_job_alive_and_no_timeout_means_no_watchdog(tmp_path):
    res = _child("""
with watch("demo", out, timeout_s=2.5, grace_s=1.0):  # (beats 0.2 s apart: a loaded machine's pauses stay inside 2.5 s)
    for i in range(30):
        time.sleep(0.2)
        beat(f"item {i}")
with watch("demo", out, timeout_s=0):
    time.sleep(2)
print("finished")
""", tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "finished", res.stderr
    assert not list(tmp_path.glob("stalled-*.txt"))


def test_a_long_call_that_works_is_not_a_stall_but_one_that_waits_is(tmp_path):
    res = _child("""
from logicrank.jobs.watchdog import busy
with watch("demo", out, timeout_s=2.5, grace_s=5):
    with busy("building an index", every_s=0.2):
        t = time.time()
        while time.time() - t < 5:  # CPU work, no progress reported: busy reports it
            sum(range(10000))
print("worked")
try:
    with watch("demo", out, timeout_s=1.0, grace_s=5):
        with busy("waiting", every_s=0.2):
            time.sleep(30)  # no CPU used: a stall, busy or not
except Stalled as exc:
    print("STALLED", exc)
""", tmp_path)
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "worked" and lines[1].startswith("STALLED demo: no progress for "), res.stdout + res.stderr
    assert len(list(tmp_path.glob("stalled-*.txt"))) == 1


def test_a_long_call_whose_work_a_child_process_does_is_not_a_stall(tmp_path):
    """The index job maintains a large table in a child process and waits for it, using no CPU
    itself: the child's CPU time counts as the step's progress; a child that waits on nothing
    is still a stall."""
    res = _child("""
import subprocess
from logicrank.jobs.watchdog import busy
spin = "import time\\nt = time.time()\\nwhile time.time() - t < 5: sum(range(10000))"
with watch("demo", out, timeout_s=2.5, grace_s=5):
    with busy("maintaining in a child", every_s=0.2):
        subprocess.run([sys.executable, "-c", spin], check=True)
print("worked")
try:
    with watch("demo", out, timeout_s=1.0, grace_s=5):
        with busy("waiting on a child", every_s=0.2):
            subprocess.run([sys.executable, "-c", "import time; time.sleep(30)"])
except Stalled as exc:
    print("STALLED", exc)
""", tmp_path)
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "worked" and lines[1].startswith("STALLED demo: no progress for "), res.stdout + res.stderr


def test_a_job_that_cannot_finish_ends_the_command_in_one_line_with_exit_1(tmp_path, capsys):
    import pytest
    import typer

    from logicrank.cli import run_job
    from logicrank.jobs.llm_service import LLMEngineFailed

    def job():
        raise LLMEngineFailed("llm: the engine of m@1 keeps dying (4 deaths, ...); last engine error: EngineDeadError: gone")

    with pytest.raises(typer.Exit) as exit_:
        run_job("generate", tmp_path, job)
    assert exit_.value.exit_code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: llm: the engine of m@1 keeps dying (4 deaths, ...); last engine error: EngineDeadError: gone"]
