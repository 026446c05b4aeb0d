"""The raylet's disk warning on a disk Ray calls full. A CI machine's /tmp was 96% full
(9.6 GB free of 252 GB): past Ray's threshold (95%) the raylet logs an error soon after it
starts and every 10 s after, and Ray forwards each to the driver's terminal, so every job
printed lines that were not its own. Here the threshold is lowered to 1e-6 of the disk, so
any disk is "full"; the driver waits until the raylet has logged the warning twice (the
first comes before the driver listens), then until a marker a Ray worker prints after that
has come through the same forwarding to its terminal (and, verbose, the warning itself): the
warnings logged before the marker were forwarded by then, so the quiet run's silence means
they were dropped, not that they were late. It prints the count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.cluster]
ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import os, sys, threading, time
from pathlib import Path
from logicrank.jobs.raysession import ray_session, verbose
from logicrank.pipelines.config.settings import RayConfig

class Seen:
    \"\"\"The driver's stderr, watched: Ray prints what it forwards there.\"\"\"
    def __init__(self, inner):
        self.inner, self.text, self.lock = inner, "", threading.Lock()
    def write(self, s):
        with self.lock:
            self.text += s
        return self.inner.write(s)
    def __getattr__(self, name):
        return getattr(self.inner, name)

def wait(what, event):
    parent = os.getppid()  # no deadline (tests/integration/children.py): the event, or the test that started this driver gone
    while not event():
        if os.getppid() != parent:
            sys.exit(f"the test went while this driver waited for {what}")
        time.sleep(0.05)

sys.stderr = seen = Seen(sys.stderr)
with ray_session(RayConfig(num_cpus=1)):
    import ray
    err = Path(ray._private.worker._global_node.get_logs_dir_path()) / "raylet.err"
    count = lambda: err.read_text(errors="replace").count("file_system_monitor") if err.exists() else 0
    wait("the raylet's warning, twice", lambda: count() >= 2)
    seen_then = count()

    @ray.remote
    def marker():
        print("logicrank-forwarding-marker", file=sys.stderr, flush=True)

    ray.get(marker.remote())
    wait("the worker's marker on the driver's terminal", lambda: "logicrank-forwarding-marker" in seen.text)
    if verbose():
        wait("the forwarded warning", lambda: "% full" in seen.text)
print(f"warnings {seen_then}")
"""


def _driver(verbose: bool) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LOGICRANK_VERBOSE"))}
    env["RAY_local_fs_capacity_threshold"] = "0.000001"
    if verbose:
        env["LOGICRANK_VERBOSE"] = "1"
    return subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _finished(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _warnings(run: subprocess.CompletedProcess) -> int:
    assert run.returncode == 0, run.stderr[-2000:]
    return int(run.stdout.split()[-1])


def test_the_raylets_disk_warning_reaches_the_terminal_only_with_verbose():
    # both drivers at once, each with its own cluster: most of each run is waiting for the raylet's
    # warning, logged every 10 s
    drivers = [_driver(verbose=True), _driver(verbose=False)]
    try:
        loud, quiet = (_finished(d) for d in drivers)
    finally:
        for d in drivers:  # (a driver left running when the test is interrupted)
            if d.poll() is None:
                d.kill()
                d.wait()
    assert _warnings(loud) >= 2 and "% full" in loud.stderr, loud.stderr[-2000:]  # the warning fired and was forwarded
    assert _warnings(quiet) >= 2  # it fired here too
    assert "% full" not in quiet.stderr, quiet.stderr
    # nothing else but the marker's forwarded line (Ray prefixes it with the worker's name and pid)
    assert [line for line in quiet.stderr.splitlines() if "logicrank-forwarding-marker" not in line] == [], quiet.stderr
