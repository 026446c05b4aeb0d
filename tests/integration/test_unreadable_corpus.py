"""A corpus file that fails part-way through, on real Ray and LanceDB, through the command line:
one line naming the file and the fault, exit 2, and the table as it was (rows written before
the fault rolled back; a table the run created removed). Faults found in a file's first
bytes are refused before Ray starts: tests/unit/test_unreadable_input.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.pipelines.engines.store import DocStore
from tests import faults
from tests.conftest import scifact_docs, write_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]  # jobs join the session's cluster (conftest.py)


def _index(corpus, db, out, *extra) -> tuple[int, list[str]]:
    res = CliRunner().invoke(app, ["index", str(corpus), "--db", str(db), "--out", str(out), "--no-progress",
                                   "--write-batch-rows", "100", *extra])
    return res.exit_code, res.output.strip().splitlines()


def _state(db) -> tuple[int, dict, list]:
    store = DocStore(str(db))
    t = store.table.to_arrow()
    return store.version, dict(zip(t.column("doc_id").to_pylist(), t.column("content_hash").to_pylist(), strict=True)), sorted(store.table.tags.list())


def _notes(n: int, start: int = 0) -> list[dict]:
    """Short documents (fast to embed): thousands fit in the test's budget."""
    return [{"_id": f"n{i}", "title": f"Note {i}", "text": f"note number {i} about topic {i % 37}"} for i in range(start, start + n)]


@pytest.fixture(scope="module")
def table(tmp_path_factory, docs300):
    root = tmp_path_factory.mktemp("unreadable")
    code, lines = _index(write_jsonl(root / "first.jsonl", docs300[:150]), root / "db", root / "first")
    assert code == 0, lines
    return root


def test_a_gzip_cut_off_past_its_first_bytes_leaves_the_table_as_it_was(table):
    db, before = table / "db", _state(table / "db")
    data = "".join(json.dumps(d) + "\n" for d in scifact_docs(1200)).encode()  # 0.5 MB: the fault lies past what the start-up check reads
    for name, path, words in [
        ("truncated", faults.truncated_gzip(table / "cut.jsonl.gz", data, keep=0.8), "the file is truncated"),
        ("corrupt", faults.corrupt_gzip(table / "bad.jsonl.gz", data, at=0.9), "corrupt compressed data"),
    ]:
        code, lines = _index(path, db, table / name)
        assert code == 2 and len(lines) == 1, lines
        assert lines[0].startswith(f"error: index: corpus file {path}: unreadable") and words in lines[0], lines[0]
        assert "Nothing was deleted and no tag made" in lines[0]
        assert _state(db) == before
        manifest = json.loads((table / name / "manifest.json").read_text())
        assert manifest["status"] == "failed" and words in manifest["error"]


def test_rows_written_before_a_damaged_row_group_are_rolled_back(table):
    db, before = table / "db", _state(table / "db")
    bad = faults.corrupt_parquet_row_group(table / "notes.parquet", _notes(3000), row_group_rows=100, bad_group=25)
    code, lines = _index(bad, db, table / "rg", "--allow-mass-delete")
    assert code == 2 and len(lines) == 1, lines
    assert f"corpus file {bad}: unreadable after 2048 rows: corrupt compressed data" in lines[0], lines[0]
    version, rows, tags = _state(db)
    assert f"rolled back: the table is as it was at v{before[0]} (now v{version})" in lines[0], lines[0]
    assert version > before[0] + 1  # chunks of 100 rows were committed before the fault...
    assert (rows, tags) == before[1:]  # ...and none of them is left; nothing deleted, no tag made


def test_a_table_the_failed_run_created_is_removed(tmp_path):
    bad = faults.corrupt_parquet_row_group(tmp_path / "notes.parquet", _notes(3000), row_group_rows=100, bad_group=25)
    code, lines = _index(bad, tmp_path / "db", tmp_path / "run")
    assert code == 2 and "No table 'docs' was left: this run had created it." in lines[0], lines
    assert not DocStore(str(tmp_path / "db")).exists()
    # the same documents from a whole file index as usual
    good = tmp_path / "notes.jsonl"
    write_jsonl(good, _notes(3000))
    code, lines = _index(good, tmp_path / "db", tmp_path / "run2")
    assert code == 0 and DocStore(str(tmp_path / "db")).count() == 3000, lines
