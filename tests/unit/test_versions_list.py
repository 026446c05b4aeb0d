"""`logicrank versions`: a table's versions with their rows, tags and completion marks, on a
real LanceDB table (generated vectors, no Ray, no model); the interrupted run's manifest kept
by the run that resumes it (jobs/rundir.py)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.jobs.rundir import RunDir
from logicrank.pipelines.engines.embed import to_fixed_size_list
from logicrank.pipelines.engines.store import DocStore


def _rows(ids: list[str], text: str) -> pa.Table:
    v = np.ones((len(ids), 4), dtype=np.float32) / 2
    n = len(ids)
    return pa.table({"doc_id": ids, "title": [None] * n, "text": [text] * n, "metadata": [None] * n,
                     "content_hash": [text] * n, "vector": to_fixed_size_list(v)})


def test_versions_lists_rows_tags_and_completion_marks(tmp_path):
    db = str(tmp_path / "db")
    s = DocStore(db)
    s.open_or_create(4, "gen")
    s.upsert(_rows(["a", "b", "c"], "one"))  # a completed run: marked and tagged
    s.mark_complete()
    s.tag("index-20261124T000000000000Z")
    complete = s.version
    s.upsert(_rows(["a", "d"], "two"))  # an interrupted run: neither
    left = s.version

    res = CliRunner().invoke(app, ["versions", "--db", db])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["version", "made", "rows", "state", "tags"]
    by_version = {int(line.split()[0]): line for line in lines[1:]}
    assert sorted(by_version) == [v for v in sorted(s.version_stamps())]
    assert by_version[complete].split()[-4:] == ["3", "complete,", "read", "index-20261124T000000000000Z"]
    assert by_version[left].split()[-3:] == ["4", "incomplete", "-"]
    assert "logicrank-complete" not in res.stdout and "embedded-by" not in res.stdout  # the reserved marks are the state column

    rows = s.version_rows()
    assert [(r["version"], r["rows"], r["state"], r["read"]) for r in rows if r["version"] in (complete, left)] == [
        (complete, 3, "complete", True), (left, 4, "incomplete", False)]


def test_a_completed_version_whose_tag_expired_is_unrecorded_not_incomplete(tmp_path):
    import re

    s = DocStore(str(tmp_path / "db"))
    s.open_or_create(4, "gen")
    finished = []
    for n, stamp in enumerate(["20261124T000000000000Z", "20261125T000000000000Z"]):  # two completed runs, tagged as the job does
        s.upsert(_rows(["a", f"b{n}"], f"text {n}"))
        s.mark_complete()
        s.tag(f"index-{stamp}")
        finished.append(s.version)
    assert s.drop_old_tags(re.compile(r"index-\d{8}T\d{12}Z"), keep=1) == ["index-20261124T000000000000Z"]
    s.upsert(_rows(["c"], "left"))  # then a run that stopped
    states = {r["version"]: r["state"] for r in s.version_rows()}
    # the first run's version lost its only record: the table cannot say it was complete, nor that it was not (before: "incomplete")
    assert (states[finished[0]], states[finished[1]], states[s.version]) == ("unrecorded", "complete", "incomplete")
    assert {states[v] for v in states if v < finished[0]} <= {"unrecorded"}  # the first run's own commits on its way


def test_a_restore_that_readers_will_not_read_says_so(tmp_path):
    """A version a completed run finished whose tag was dropped since is restored as a version
    with no mark: readers keep reading the last complete one. ``restore`` says so in a line,
    and how to read it (before: only "restored as vN", and default readers read the other)."""
    import re

    db = str(tmp_path / "db")
    s = DocStore(db)
    s.open_or_create(4, "gen")
    finished = []
    for n, stamp in enumerate(["20261124T000000000000Z", "20261125T000000000000Z"]):
        s.upsert(_rows(["a", f"b{n}"], f"text {n}"))
        s.mark_complete()
        s.tag(f"index-{stamp}")
        finished.append(s.version)
    s.drop_old_tags(re.compile(r"index-\d{8}T\d{12}Z"), keep=1)
    res = CliRunner().invoke(app, ["restore", "--db", db, "--version", str(finished[0])])
    assert res.exit_code == 0, res.output
    restored = DocStore(db).version
    assert res.stdout.splitlines() == [
        f"table 'docs' in {db!r}: version {finished[0]} restored as v{restored} (2 rows).",
        f"restore: v{restored} is not marked complete (version {finished[0]} holds no tag of a completed index run any more), so readers "
        f"still read v{finished[1]} by default; read it with --table-version {restored}, or run the index job to make a complete version."]
    res = CliRunner().invoke(app, ["restore", "--db", db, "--version", f"index-{'20261125T000000000000Z'}"])
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 1, res.output  # a tagged (complete) version: read by default


def test_versions_of_a_table_no_run_completed_says_readers_refuse_it(tmp_path):
    db = str(tmp_path / "db")
    s = DocStore(db)
    s.open_or_create(4, "gen")
    s.upsert(_rows(["a"], "one"))
    res = CliRunner().invoke(app, ["versions", "--db", db])
    assert res.exit_code == 0, res.output
    table = res.stdout.splitlines()[1:-1]
    assert table and all(line.split()[-2] == "incomplete" and "read" not in line for line in table), res.stdout
    assert res.stdout.splitlines()[-1] == ("no version of table 'docs' was finished by a completed index run: readers refuse it "
                                           "(rerun logicrank index).")


def test_versions_of_a_missing_table_is_one_line(tmp_path):
    res = CliRunner().invoke(app, ["versions", "--db", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith("error: versions: "), res.output


def test_a_db_that_is_a_file_is_one_line(tmp_path):
    """--db naming a file (a qrels file given by mistake): one line, exit 2, for every command
    that opens a table (before: lancedb.connect's FileExistsError, with its traceback)."""
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 d1 1\n")
    for args in (["versions"], ["restore", "--version", "1"]):
        res = CliRunner().invoke(app, [*args, "--db", str(qrels)])
        assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
        assert "qrels.txt' is a file, not a database" in res.stderr, res.stderr
    assert qrels.read_text() == "q1 0 d1 1\n"


def test_an_unfinished_runs_manifest_is_kept_by_the_run_that_resumes_it(tmp_path):
    run = RunDir(tmp_path / "r", "index")
    assert run.keep_unfinished() is None  # no manifest yet
    run.write_manifest({}, "h", {}, [], status="interrupted", counts={"written": 64})
    first = json.loads(run.manifest_path.read_text())
    name = run.keep_unfinished()
    stamp = "".join(c for c in first["finished_at"][:19] if c.isdigit() or c == "T")
    assert name == f"manifest.interrupted-{stamp}Z.json" and not run.manifest_path.exists()
    assert json.loads((run.path / name).read_text()) == first
    run.write_manifest({}, "h", {}, [], status="ok")
    assert run.keep_unfinished() is None and run.manifest_path.exists()  # a finished run's manifest is the one to replace


def _index(tmp_path, monkeypatch, written):
    """``logicrank index`` on the command line with the locked run's body (streaming, Ray) replaced by ``written``:
    what runs before it (the kept manifest, where the run starts from) and the lines printed after it are real."""
    import logicrank.jobs.index

    monkeypatch.setattr(logicrank.jobs.index, "_index_written", written)
    (tmp_path / "c.jsonl").write_text('{"_id": "a", "text": "x"}\n')
    return CliRunner().invoke(app, ["--stall-timeout", "0", "index", str(tmp_path / "c.jsonl"), "--db", str(tmp_path / "db"),
                                    "--out", str(tmp_path / "run"), "--no-progress"])


def _finished(cfg, rundir, sources, progress, start, lock, mid, store, summary, *rest):
    return summary


def test_a_stopped_runs_manifest_is_kept_though_it_wrote_nothing(tmp_path, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    assert _index(tmp_path, monkeypatch, interrupted).exit_code == 130
    stopped = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["table"]["version"] is None  # no table: nothing written
    res = _index(tmp_path, monkeypatch, _finished)
    assert res.exit_code == 0, res.output
    (kept,) = (tmp_path / "run").glob("manifest.interrupted-*.json")  # before: written over by the next run
    assert json.loads(kept.read_text()) == stopped
    assert res.stdout.splitlines()[0] == f"index: the manifest of the run that stopped before this one is kept as {kept}."


def test_a_run_after_a_restore_of_an_unfinished_version_says_so_not_that_it_resumed(tmp_path, monkeypatch):
    from logicrank.jobs.index import model_id
    from logicrank.pipelines.config.settings import IndexConfig

    s = DocStore(str(tmp_path / "db"))
    s.open_or_create(4, model_id(IndexConfig(corpus="c", db="d").embed))
    s.upsert(_rows(["a"], "one"))
    s.mark_complete()
    complete = s.version
    s.upsert(_rows(["b"], "two"))  # left by a run that stopped (elsewhere)
    unfinished = s.version
    s.upsert(_rows(["c"], "three"))
    restored = s.restore(unfinished)  # restoring an unfinished version: not marked complete
    assert s.complete_version() == complete
    res = _index(tmp_path, monkeypatch, _finished)
    assert res.exit_code == 0, res.output
    # before: "index: finished the run that stopped at v5 ...", though no run under this --out had stopped
    assert res.stdout.splitlines()[0] == (
        f"index: started from v{restored}, which the table does not mark complete (left by a run that stopped under another --out, "
        f"restored from such a version, or written before logicrank marked complete runs; 0 documents embedded now); the counts "
        f"below are of what changed since v{complete}, the last version a completed index run finished.")
