"""The raylet's disk warning on a disk Ray calls full. A CI machine's /tmp was 96% full
(9.6 GB free of 252 GB): past Ray's threshold (95%) the raylet logs an error soon after it
starts and every 10 s after, and Ray forwards each to the driver's terminal, so every job
printed lines that were not its own. Here the threshold is lowered to 1e-6 of the disk, so
any disk is "full"; the driver waits until the raylet has logged the warning twice (the
first comes before the driver listens), then 3 s for Ray to forward it, and prints the count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import time
from pathlib import Path
from jobs.raysession import ray_session
from schemas.config import RayConfig

with ray_session(RayConfig(num_cpus=1)):
    import ray
    err = Path(ray._private.worker._global_node.get_logs_dir_path()) / "raylet.err"
    deadline, seen = time.monotonic() + 90, 0
    while seen < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = err.read_text(errors="replace").count("file_system_monitor") if err.exists() else 0
    time.sleep(3)
print(f"warnings {seen}")
"""


def _driver(verbose: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LOGICRANK_VERBOSE"))}
    env["RAY_local_fs_capacity_threshold"] = "0.000001"
    if verbose:
        env["LOGICRANK_VERBOSE"] = "1"
    return subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)


def _warnings(run: subprocess.CompletedProcess) -> int:
    assert run.returncode == 0, run.stderr[-2000:]
    return int(run.stdout.split()[-1])


def test_the_raylets_disk_warning_reaches_the_terminal_only_with_verbose():
    loud = _driver(verbose=True)
    assert _warnings(loud) >= 2 and "% full" in loud.stderr, loud.stderr[-2000:]  # the warning fired and was forwarded
    quiet = _driver(verbose=False)
    assert _warnings(quiet) >= 2  # it fired here too
    assert quiet.stderr == "", quiet.stderr
