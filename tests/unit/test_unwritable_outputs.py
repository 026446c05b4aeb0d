"""An output path a job cannot write is refused before any work: one line on stderr, exit 2,
and nothing left behind (no run directory, no table lock). Before: a traceback of 100-245
lines, retrieve only after 30 s of work, and index left its lock directory.

Tests run as root, where permission bits stop no write: the unwritable path is one under a
regular file (its parent cannot be made), and a directory whose writes fail (a read-only
mount) is a probe that raises."""

from __future__ import annotations

import errno
import json
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.pipelines.files import require_writable
from logicrank.schemas.errors import UserError


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def work(tmp_path):
    """A corpus, queries, qrels, a run, configs, and ``blocker``: a regular file, so any path under it cannot be made."""
    (tmp_path / "c.jsonl").write_text('{"_id": "a", "text": "x"}\n')
    (tmp_path / "q.jsonl").write_text('{"_id": "q1", "text": "x"}\n')
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\ta\t1\n")
    (tmp_path / "run.tsv").write_text("q1 Q0 a 1 1.0 bm25\n")
    (tmp_path / "blocker").write_text("a file, not a directory\n")
    return tmp_path


def _nightly(work: Path, out: Path, db: Path) -> Path:
    cfg = work / "nightly.yaml"
    cfg.write_text(json.dumps({
        "out": str(out), "index": {"corpus": str(work / "c.jsonl"), "db": str(db)},
        "query_sets": {"s": {"queries": str(work / "q.jsonl"), "qrels": str(work / "qrels.tsv")}},
        "pipelines": {"bm25": [{"bm25": {"k": 10}}]},
    }))
    return cfg


def _commands(work: Path) -> dict[str, tuple[list[str], str]]:
    """Each command with one unwritable output, and the start of its one line."""
    bad = work / "blocker" / "out"
    db = ["--db", str(work / "db")]
    return {
        "index --out": (["index", str(work / "c.jsonl"), *db, "--out", str(bad)], f"index: --out {bad} cannot be made"),
        "index --db": (["index", str(work / "c.jsonl"), "--db", str(bad), "--out", str(work / "r")], f"index: --db {bad} cannot be made"),
        "retrieve": (["retrieve", str(work / "q.jsonl"), *db, "--out", str(bad)], f"retrieve: --out {bad} cannot be made"),
        "evaluate": (["evaluate", str(work / "qrels.tsv"), str(work / "run.tsv"), "--out", str(bad)], f"evaluate: --out {bad} cannot be made"),
        "experiment": (["experiment", "scifact", "--out", str(bad)], f"experiment: --out {bad} cannot be made"),
        "generate itlr": (["generate", "itlr", "--out", str(bad), *db], f"generate: --out {bad} cannot be made"),
        "generate setlogic": (["generate", "setlogic", "--out", str(bad)], f"generate setlogic: --out {bad} cannot be made"),
        "nightly out": (["nightly", str(_nightly(work, bad, work / "db"))], f"nightly: out (in {work / 'nightly.yaml'}) {bad} cannot be made"),
        "prepare-rulebench": (["prepare-rulebench", str(work), "--out", str(bad)], f"prepare-rulebench: --out {bad} cannot be made"),
        "prepare-qa": (["prepare-qa", "musique", "--out", str(bad)], f"prepare-qa: --out {bad} cannot be made"),
    }


@pytest.mark.parametrize("name", ["index --out", "index --db", "retrieve", "evaluate", "experiment", "generate itlr", "generate setlogic",
                                  "nightly out", "prepare-rulebench", "prepare-qa"])
def test_an_unwritable_output_is_one_line_before_any_work(work, name):
    args, start = _commands(work)[name]
    before = _files(work)
    res = CliRunner().invoke(app, ["--stall-timeout", "0", *args])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"error: {start}: {work / 'blocker'} is a file, not a directory; give "), res.stderr
    assert res.stderr.count("\n") == 1 and res.stdout == ""
    assert _files(work) == before  # no run directory, no table, no lock directory


def test_nightly_refuses_an_unwritable_table_directory(work):
    cfg = _nightly(work, work / "nightly-out", work / "blocker" / "db")
    before = _files(work)
    res = CliRunner().invoke(app, ["--stall-timeout", "0", "nightly", str(cfg)])
    assert (res.exit_code, res.stderr.count("\n")) == (2, 1), res.output
    assert res.stderr.startswith(f"error: nightly: index.db (in {cfg}) {work / 'blocker' / 'db'} cannot be made: ")
    assert _files(work) == before


def test_the_python_index_job_refuses_before_locking(work):
    from logicrank.jobs.index import IndexJobError, run_index
    from logicrank.pipelines.config.settings import IndexConfig

    before = _files(work)
    with pytest.raises(IndexJobError, match=r"^index: --db .*blocker/db cannot be made: .*blocker is a file, not a directory; give --db a "):
        run_index(IndexConfig(corpus=str(work / "c.jsonl"), db=str(work / "blocker" / "db")), work / "r")
    assert _files(work) == before


def test_require_writable_probes_and_leaves_nothing(tmp_path, monkeypatch):
    require_writable(tmp_path, "job", "--out")  # an existing directory
    require_writable(tmp_path / "a" / "b", "job", "--out")  # made later, under one that exists
    require_writable("s3://bucket/db", "job", "--db")  # a URI: its store says at the first write
    assert list(tmp_path.iterdir()) == []  # neither a probe nor a directory left
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match=r"^job: --out .*/f is a file, not a directory; give --out a directory this user can write\.$"):
        require_writable(tmp_path / "f", "job", "--out")

    def read_only(*args, **kwargs):  # what a read-only mount answers, whoever the user
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(UserError) as refused:
        require_writable(tmp_path / "new" / "out", "job", "--out")
    assert str(refused.value) == (f"job: --out {tmp_path / 'new' / 'out'} cannot be written (in {tmp_path}, where it would be made): "
                                  "read-only file system; give --out a directory this user can write.")
