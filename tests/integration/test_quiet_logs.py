"""The raylet's disk warning on a disk Ray calls full. A CI machine's /tmp was 96% full
(9.6 GB free of 252 GB): past Ray's threshold (95%) the raylet logs an error one second after
it starts and every 10 s after, and Ray forwards each to the driver's terminal, so every job
printed lines that were not its own. Here the threshold is lowered to 1% to make any disk
"full"; a driver that stays 13 s sees at least the second warning forwarded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DRIVER = ("import time; from jobs.raysession import ray_session; from schemas.config import RayConfig\n"
          "with ray_session(RayConfig(num_cpus=1)):\n    time.sleep(13)\nprint('done')")


def _driver(verbose: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LOGICRANK_VERBOSE"))}
    env["RAY_local_fs_capacity_threshold"] = "0.01"
    if verbose:
        env["LOGICRANK_VERBOSE"] = "1"
    return subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def test_the_raylets_disk_warning_reaches_the_terminal_only_with_verbose():
    loud = _driver(verbose=True)
    assert loud.returncode == 0 and "is over 1% full" in loud.stderr, loud.stderr  # the warning fired and was forwarded
    quiet = _driver(verbose=False)
    assert quiet.returncode == 0 and quiet.stdout == "done\n", quiet.stdout
    assert quiet.stderr == "", quiet.stderr
