"""Child processes of the integration tests that start Ray clusters of their own (several
nodes on this machine, ``ray.cluster_utils.Cluster``): run one and read what it reports."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_child_module(module: str, work: Path, argv: list[str], timeout: float) -> dict:
    """Run ``python -m module ARGV...``, a child that starts its own Ray cluster (its own Ray temp
    dir keeps ``ray.init()`` elsewhere on this machine off it), and return its ``WORK/result.json``."""
    ray_tmp = tempfile.mkdtemp(prefix="lrc", dir="/tmp")  # short: Ray's socket paths must stay under 107 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(ROOT), RAY_TMPDIR=ray_tmp)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "child.log"
    try:
        with open(log, "wb") as out:
            child = subprocess.Popen(
                [sys.executable, "-m", module, *argv],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
            try:
                rc = child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)  # the child and anything of its group left behind
                child.wait(timeout=30)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    tail = log.read_text(errors="replace")[-6000:]
    assert rc == 0, f"child {module} {argv[0]} {'timed out' if rc is None else f'exited {rc}'}; log tail:\n{tail}"
    return json.loads((work / "result.json").read_text())
