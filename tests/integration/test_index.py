"""Index job on real Ray, real LanceDB and the real packaged MiniLM model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from jobs.index import IndexJobError, run_index
from pipelines.corpus import content_hash
from pipelines.store import DocStore
from schemas.config import IndexConfig, RayConfig
from tests.conftest import write_jsonl

pytestmark = pytest.mark.integration
RAY = RayConfig(num_cpus=2, batch_rows=64)


def _cfg(corpus: Path, db: Path, **kw) -> IndexConfig:
    return IndexConfig(corpus=str(corpus), db=str(db), ray=RAY, write_batch_rows=kw.pop("write_batch_rows", 128), **kw)


def _table(db: Path) -> pa.Table:
    t = DocStore(str(db)).table.to_arrow()
    return t.sort_by("doc_id")


def _expected(rows: list[dict]) -> dict[str, tuple]:
    return {r["_id"]: (r.get("title"), r["text"], content_hash(r.get("title"), r["text"], None)) for r in rows}


def _contents(t: pa.Table) -> dict[str, tuple]:
    return {
        d: (ti, tx, h)
        for d, ti, tx, h in zip(*(t.column(c).to_pylist() for c in ("doc_id", "title", "text", "content_hash")), strict=True)
    }


def test_index_reindex_and_incremental_changes(tmp_path, docs300):
    corpus, db = tmp_path / "c.jsonl", tmp_path / "db"
    write_jsonl(corpus, docs300)
    s = run_index(_cfg(corpus, db), tmp_path / "run1")
    assert (s.inserted, s.updated, s.unchanged, s.deleted, s.rejected) == (300, 0, 0, 0, 0)
    first = _table(db)
    assert _contents(first) == _expected(docs300)
    vecs = np.stack(first.column("vector").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    store = DocStore(str(db))
    assert {"doc_id", "title", "text"} <= {c for i in store.table.list_indices() for c in i.columns}
    assert s.tag in store.table.tags.list()
    assert (tmp_path / "run1" / "manifest.json").exists()

    # unchanged snapshot: nothing embedded, nothing written, no new version
    s2 = run_index(_cfg(corpus, db), tmp_path / "run2")
    assert (s2.embedded, s2.unchanged, s2.deleted, s2.table_version) == (0, 300, 0, s.table_version)

    # change 3, delete 2, add 4
    snapshot = [dict(r) for r in docs300]
    for r in snapshot[:3]:
        r["text"] = r["text"] + " (revised)"
    deleted = {snapshot[3]["_id"], snapshot[4]["_id"]}
    snapshot = snapshot[:3] + snapshot[5:]
    added = [{"_id": f"new-{i}", "title": f"New {i}", "text": f"a new abstract number {i} about proteins"} for i in range(4)]
    snapshot += added
    write_jsonl(corpus, snapshot)
    s3 = run_index(_cfg(corpus, db), tmp_path / "run3")
    assert (s3.inserted, s3.updated, s3.deleted, s3.unchanged, s3.embedded) == (4, 3, 2, 295, 7)
    third = _table(db)
    assert third.num_rows == 302 and _contents(third) == _expected(snapshot)
    assert not deleted & set(third.column("doc_id").to_pylist())
    # untouched documents keep their vectors; revised ones got new ones
    before = dict(zip(first.column("doc_id").to_pylist(), first.column("vector").to_pylist(), strict=True))
    after = dict(zip(third.column("doc_id").to_pylist(), third.column("vector").to_pylist(), strict=True))
    assert after[snapshot[10]["_id"]] == before[snapshot[10]["_id"]]
    assert after[snapshot[0]["_id"]] != before[snapshot[0]["_id"]]


def test_bad_rows_are_rejected_exactly_and_good_rows_all_land(tmp_path, docs300):
    good = docs300[:40]
    bad = [
        b'{"_id": "broken", "text": "unterminated',
        b'{"text": "no id at all"}',
        b'{"_id": "", "text": "empty id"}',
        b'{"_id": "blank", "text": ""}',
        b'{"_id": "latin1", "text": "caf\xe9"}',
        b'{"_id": "huge", "text": "' + b"w" * 5000 + b'"}',
        json.dumps(good[0]).encode(),  # a second row with the first row's id
    ]
    lines = [json.dumps(r).encode() for r in good[:20]] + bad + [json.dumps(r).encode() for r in good[20:]]
    corpus = tmp_path / "bad.jsonl"
    corpus.write_bytes(b"\n".join(lines) + b"\n")

    cfg = _cfg(corpus, tmp_path / "db", max_doc_bytes=4000, max_reject_fraction=0.5)
    s = run_index(cfg, tmp_path / "run")
    assert s.inserted == 40 and s.rejected == 7
    assert s.rejects_by_reason == {
        "malformed_json": 1, "missing_id": 2, "empty_text": 1, "invalid_utf8": 1, "oversized": 1, "duplicate_id": 1,
    }
    rejects = pa.parquet.read_table(tmp_path / "run" / "rejects.parquet").to_pylist()
    assert [(r["location"], r["reason"]) for r in rejects] == [
        (21, "malformed_json"), (22, "missing_id"), (23, "missing_id"), (24, "empty_text"),
        (25, "invalid_utf8"), (26, "oversized"), (27, "duplicate_id"),
    ]
    assert all(r["source"].endswith("bad.jsonl") for r in rejects)
    assert _contents(_table(tmp_path / "db")) == _expected(good)

    # over the threshold: good rows written, the job fails and says where to look
    with pytest.raises(IndexJobError, match=r"7 of 47 rows rejected .*rejects.parquet"):
        run_index(cfg.model_copy(update={"max_reject_fraction": 0.1}), tmp_path / "run2")


_CHILD = """
import sys
from jobs.index import run_index
from schemas.config import IndexConfig, RayConfig
cfg = IndexConfig(corpus=sys.argv[1], db=sys.argv[2], write_batch_rows=4, ray=RayConfig(num_cpus=2, batch_rows=8))
run_index(cfg, sys.argv[3])
"""


def test_killed_mid_write_then_rerun_equals_a_clean_run(tmp_path, docs300):
    corpus = write_jsonl(tmp_path / "c.jsonl", docs300)
    db = tmp_path / "db"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(corpus), str(db), str(tmp_path / "r")], env=env, start_new_session=True)
    killed_at = None
    versions = db / "docs.lance" / "_versions"
    deadline = time.time() + 240
    while time.time() < deadline and child.poll() is None:
        # each commit adds a manifest: kill after the create and a few upserts
        if versions.is_dir() and len(list(versions.glob("*.manifest"))) >= 4:
            os.killpg(child.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    child.wait(timeout=60)
    killed_at = DocStore(str(db)).count()
    child.wait(timeout=60)
    assert 0 < killed_at < 300, f"the child must die mid-write for this test to mean anything (rows: {killed_at})"

    s = run_index(_cfg(corpus, db), tmp_path / "resume")
    assert s.unchanged >= killed_at and s.inserted == 300 - s.unchanged
    resumed = _table(db)
    clean_db = tmp_path / "clean"
    run_index(_cfg(corpus, clean_db), tmp_path / "clean_run")
    clean = _table(clean_db)
    assert resumed.num_rows == 300 and len(set(resumed.column("doc_id").to_pylist())) == 300
    assert _contents(resumed) == _contents(clean)
    np.testing.assert_allclose(
        np.stack(resumed.column("vector").to_numpy(zero_copy_only=False)),
        np.stack(clean.column("vector").to_numpy(zero_copy_only=False)),
        atol=1e-5,
    )


def test_a_table_from_another_model_is_refused(tmp_path, docs300):
    corpus = write_jsonl(tmp_path / "c.jsonl", docs300[:5])
    db = tmp_path / "db"
    run_index(_cfg(corpus, db), tmp_path / "r")
    other = _cfg(corpus, db).model_copy(update={"embed": _cfg(corpus, db).embed.model_copy(update={"max_seq_length": 128})})
    with pytest.raises(IndexJobError, match="holds vectors from 'all-MiniLM-L6-v2'"):
        run_index(other, tmp_path / "r2")
