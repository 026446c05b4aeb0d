"""Child processes of the integration tests: those that start Ray clusters of their own (several
nodes on this machine, ``ray.cluster_utils.Cluster``), run and read (:func:`run_child_module`),
and a wait on what a child does (:func:`wait_until`). No wait here has a deadline of its own: it
ends on the awaited event or on the child's exit, and a hang ends at pytest's per-test timeout
(pyproject.toml), the one wall-clock bound a test has, so a slow machine is no failure."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_child_module(module: str, work: Path, argv: list[str]) -> dict:
    """Run ``python -m module ARGV...`` to its end, a child that starts its own Ray cluster (its own
    Ray temp dir keeps ``ray.init()`` elsewhere on this machine off it), and return its
    ``WORK/result.json``."""
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
                rc = child.wait()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)  # the child and anything of its group left behind
                child.wait()
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    tail = log.read_text(errors="replace")[-6000:]
    assert rc == 0, f"child {module} {argv[0]} exited {rc}; log tail:\n{tail}"
    return json.loads((work / "result.json").read_text())


def wait_until(event: Callable[[], bool], child: subprocess.Popen, what: str) -> None:
    """Poll until ``event()`` holds (``what`` names it); if the child exits first, fail with the
    child's exit status and its output (what its pipes hold)."""
    while not event():
        if child.poll() is not None and not event():
            output = "".join(o if isinstance(o, str) else o.decode(errors="replace") for o in child.communicate() if o)
            pytest.fail(f"the child exited {child.returncode} before {what}; its output ends:\n{output[-6000:]}")
        time.sleep(0.05)
