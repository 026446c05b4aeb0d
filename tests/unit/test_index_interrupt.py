"""An interrupted index run on the command line: one line saying what the table holds and how
to resume, exit 130 (Ctrl-C) or 143 (SIGTERM), never a silent 130; SIGTERM stops the run as
Ctrl-C does. The run itself (its manifest, the table's state, retrieve refusing or passing
over what it left) is tested on real Ray and LanceDB in tests/integration/test_index.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

import logicrank.jobs.index
from logicrank.cli import app
from logicrank.jobs.index import IndexInterrupted

LINE = ("index: interrupted after reading 4,352 rows (4,096 documents written); table 'docs' v3 is incomplete and will not be read "
        "(no index run has completed on this table, so retrieve refuses it); rerun the same command to resume (documents already "
        "written are kept and not embedded again).")


@pytest.mark.parametrize("code", [130, 143])
def test_an_interrupted_run_prints_its_one_line(tmp_path, monkeypatch, code):
    def interrupted(cfg, out, progress=False):
        raise IndexInterrupted(LINE, code)

    monkeypatch.setattr(logicrank.jobs.index, "run_index", interrupted)
    (tmp_path / "c.jsonl").write_text('{"_id": "a", "text": "x"}\n')
    res = CliRunner().invoke(app, ["--stall-timeout", "0", "index", str(tmp_path / "c.jsonl"), "--db", str(tmp_path / "db"),
                                   "--out", str(tmp_path / "r")])
    assert res.exit_code == code
    assert res.stderr == f"error: {LINE}\n"


def test_an_interrupt_before_the_run_started_says_nothing_was_written(tmp_path, monkeypatch):
    def interrupted(cfg, out, progress=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(logicrank.jobs.index, "run_index", interrupted)
    (tmp_path / "c.jsonl").write_text('{"_id": "a", "text": "x"}\n')
    res = CliRunner().invoke(app, ["--stall-timeout", "0", "index", str(tmp_path / "c.jsonl"), "--db", str(tmp_path / "db")])
    assert res.exit_code == 130
    assert res.stderr == "error: index: interrupted before writing anything; table 'docs' is unchanged.\n"


# In a process of its own: a SIGTERM sent to the test runner's process would end it wherever
# the handler is not in place (a runner's worker, a thread), taking every later test with it.
_SIGTERM_CHILD = """
import os, signal, sys
from logicrank.jobs.index import Terminated, sigterm_interrupts
before = signal.getsignal(signal.SIGTERM)
try:
    with sigterm_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in the main thread at its next bytecode
        for _ in range(10**6):
            pass
except KeyboardInterrupt as exc:
    print(type(exc).__name__, isinstance(exc, Terminated), signal.getsignal(signal.SIGTERM) is before)
"""


def test_sigterm_stops_an_index_run_as_ctrl_c_does():
    done = subprocess.run([sys.executable, "-c", _SIGTERM_CHILD], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "Terminated True True\n"), done.stderr
