"""Index job on real Ray, real LanceDB and the real packaged MiniLM model."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from logicrank.jobs.index import IndexJobError, run_index
from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig, RayConfig
from logicrank.pipelines.corpus import content_hash
from logicrank.pipelines.engines.store import DocStore, StoreError
from logicrank.pipelines.operations.writelock import TableLockedError
from tests.conftest import write_jsonl
from tests.integration.children import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]  # jobs join the session's cluster (conftest.py)
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
    # the BM25 index of the version the run ends at, beside the table
    saved = store.bm25_index()
    assert saved.version == s.table_version and len(saved) == 300 and len(saved.vocab) > 1000
    built = dict(s.maintenance["bm25_index"])
    assert set(built.pop("seconds")) == {"analyze_segment", "merge_segments", "weigh_segment", "assemble"}  # each step's wall time
    assert built == {"how": "built", "analyzed": 300, "version": s.table_version, "docs": 300, "terms": len(saved.vocab),
                     "segments": 1, "segment_rows": 524288}
    assert (db / "_bm25" / "docs" / f"v{s.table_version}" / "meta.json").is_file()

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
    # and one stored document whose only row is rejected (neither title nor text): kept as stored, not deleted
    write_jsonl(corpus, snapshot[:3] + [{"_id": snapshot[3]["_id"], "title": "", "text": ""}] + snapshot[4:])
    versions_before = len(DocStore(str(db)).table.list_versions())
    s3 = run_index(_cfg(corpus, db, prune_after_hours=0, write_batch_rows=2), tmp_path / "run3")
    assert (s3.inserted, s3.updated, s3.deleted, s3.unchanged, s3.embedded) == (4, 3, 2, 294, 7)
    assert (s3.rejected, s3.rejects_by_reason, s3.held) == (1, {"empty_text": 1}, 1)
    assert s3.writes["merges"] == 1  # the 3 updates wait for one keyed merge, whatever the chunks of new rows
    # maintenance: fragments compacted, every index covers every row, untagged versions pruned, tags kept
    store = DocStore(str(db))
    coverage = store.index_coverage()
    assert set(coverage) == {"doc_id_idx", "title_idx", "text_idx"} and set(coverage.values()) == {0}
    assert s.maintenance["fragments_removed"] >= 2  # the first run's chunk commits were compacted
    assert s3.maintenance["versions_pruned"] > 0
    bm = s3.maintenance["bm25_index"]  # patched from the first run's: only the 7 new or changed documents analyzed
    assert (bm["how"], bm["from_version"], bm["analyzed"], bm["dropped"], bm["kept"], bm["version"]) == ("patched", s.table_version, 7, 5, 295, s3.table_version)
    assert s2.maintenance["bm25_index"]["how"] == "current"
    assert len(store.table.list_versions()) < versions_before
    assert {s.tag, s2.tag, s3.tag} <= set(store.table.tags.list())
    store.table.checkout(s.tag)  # the first run's version is still readable
    assert store.table.count_rows() == 300
    store.table.checkout_latest()
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
from logicrank.jobs.index import run_index
from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig, RayConfig
cfg = IndexConfig(corpus=sys.argv[1], db=sys.argv[2], write_batch_rows=4, ray=RayConfig(num_cpus=2, batch_rows=8))
run_index(cfg, sys.argv[3])
"""


@pytest.mark.faults
def test_killed_mid_write_then_rerun_equals_a_clean_run(tmp_path, docs300):
    corpus = write_jsonl(tmp_path / "c.jsonl", docs300)
    db = tmp_path / "db"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(corpus), str(db), str(tmp_path / "r")], env=env, start_new_session=True)
    versions = db / "docs.lance" / "_versions"
    other = write_jsonl(tmp_path / "other.jsonl", [dict(r, text="another snapshot") for r in docs300[:50]])
    try:  # each commit adds a manifest: kill after the create and a few upserts
        wait_until(lambda: versions.is_dir() and len(list(versions.glob("*.manifest"))) >= 4, child, "its fourth commit")
        # a second writer while the first one writes: refused at start, naming the holder
        with pytest.raises(TableLockedError) as refused:
            run_index(_cfg(other, db), tmp_path / "second")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert f"pid {child.pid}" in str(refused.value)
    # the killed run's directory says it did not finish (it said nothing, or an earlier run's `ok`)
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["status"] == "running"
    killed_at = DocStore(str(db)).count()
    assert 0 < killed_at < 300, f"the child must die mid-write for this test to mean anything (rows: {killed_at})"

    # the kernel dropped the dead writer's lock; the rerun embeds exactly what is missing
    left = DocStore(str(db)).version
    s = run_index(_cfg(corpus, db), tmp_path / "resume")
    # embedded: what was missing; inserted: what readers see new (no run had completed: all of it)
    assert (s.unchanged, s.embedded, s.inserted, s.since_version, s.resumed["from_version"]) == (0, 300 - killed_at, 300, None, left)
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
    with pytest.raises(StoreError, match="holds vectors from 'all-MiniLM-L6-v2'"):
        run_index(other, tmp_path / "r2")


def test_snapshots_that_would_empty_the_table_are_refused_and_restorable(tmp_path, docs300):
    docs = docs300[:60]
    corpus, db = write_jsonl(tmp_path / "c.jsonl", docs), tmp_path / "db"
    first = run_index(_cfg(corpus, db, ann=True, ann_threshold=50), tmp_path / "r1")
    v1 = first.table_version

    # while another run holds the table, a run is refused at start and the table is untouched
    from logicrank.pipelines.operations.writelock import TableLock

    with TableLock(str(db), "docs", "index"), pytest.raises(TableLockedError, match="one writer per table"):
        run_index(_cfg(write_jsonl(tmp_path / "other.jsonl", docs[:5]), db), tmp_path / "r0")
    assert DocStore(str(db)).version == v1 and _contents(_table(db)) == _expected(docs)

    # an empty snapshot (before: "deleted 60", status ok) never deletes anything
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(IndexJobError, match="holds no valid document .*never deletes anything, so the table is unchanged"):
        run_index(_cfg(empty, db, allow_mass_delete=True), tmp_path / "r2")
    assert DocStore(str(db)).count() == 60 and DocStore(str(db)).version == v1

    # every row bad (before: an Arrow array_take traceback and no rejects file): rejects written, table untouched
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "a"}\n{"text": "no id"}\nnot json\n')
    with pytest.raises(IndexJobError, match=r"3 of 3 rows rejected .* The table is unchanged"):
        run_index(_cfg(bad, db), tmp_path / "r3")
    assert [r["reason"] for r in pa.parquet.read_table(tmp_path / "r3" / "rejects.parquet").to_pylist()] == [
        "empty_text", "missing_id", "malformed_json"]
    assert json.loads((tmp_path / "r3" / "manifest.json").read_text())["status"] == "failed"
    assert DocStore(str(db)).version == v1

    # a snapshot that drops 10 of 60 (17% > 10%), revises one and adds 50: refused before any delete,
    # and the message gives the command that brings the table back
    shrunk = [dict(docs[0], text="revised")] + docs[1:50] + docs300[60:110]
    write_jsonl(corpus, shrunk)
    with pytest.raises(IndexJobError, match=r"would delete 10 of the 60 documents .*--allow-mass-delete") as exc:
        run_index(_cfg(corpus, db), tmp_path / "r4")
    assert DocStore(str(db)).count() == 110  # (the refused run's new documents are written, in a version readers do not read)
    # the same command again is refused again: the share is of what readers read (60), not of the refused run's version
    # (110, its inserts included, where 10 deletes are 9% and passed)
    with pytest.raises(IndexJobError, match=r"would delete 10 of the 60 documents .*--allow-mass-delete"):
        run_index(_cfg(corpus, db), tmp_path / "r4")
    assert DocStore(str(db)).count() == 110 and DocStore(str(db)).complete_version() == v1
    command = str(exc.value).split("before this run: ")[1]
    assert command == f"logicrank restore --db {db} --table docs --version {v1}"
    from typer.testing import CliRunner

    from logicrank.cli import app

    res = CliRunner().invoke(app, command.split()[1:])
    assert res.exit_code == 0, res.output
    assert _contents(_table(db)) == _expected(docs)

    # the same snapshot with the explicit override deletes them
    s = run_index(_cfg(corpus, db, allow_mass_delete=True, ann=True, ann_threshold=50), tmp_path / "r5")
    assert (s.deleted, s.updated) == (10, 1) and _contents(_table(db)) == _expected(shrunk)
    # the ANN index too covers every row after maintenance
    coverage = DocStore(str(db)).index_coverage()
    assert "vector_idx" in coverage and set(coverage.values()) == {0}, coverage


def test_the_driver_and_a_pool_of_one_write_the_same_table(tmp_path, docs300):
    """On one CPU node the default encodes in the driver; `--actors 1` still runs the Ray Data
    pool (what a cluster of several nodes or GPUs runs), whose worker writes the new rows for
    the driver to commit, or sends them to the driver to write (``writes: driver``). Same rows,
    same hashes, the same vectors within the tolerance, the same counts; each manifest says
    where it encoded."""
    from logicrank.pipelines.engines.placement import IN_DRIVER
    from tests.compare import ATOL, RTOL

    corpus = write_jsonl(tmp_path / "c.jsonl", docs300[:120])
    here = run_index(_cfg(corpus, tmp_path / "db-driver"), tmp_path / "driver")
    # (and the pool's run builds its BM25 index in segments, with two Ray tasks at once: --bm25-workers 2)
    pool = run_index(_cfg(corpus, tmp_path / "db-pool", bm25_workers=2).model_copy(update={"ray": RAY.model_copy(update={"embed_actors": 1})}),
                     tmp_path / "pool")
    import ray

    if ray.cluster_resources().get("GPU"):  # torch on the GPU: an actor holds it, even on one node
        assert here.placement["how"] == "one per GPU" and here.placement["actors"] >= 1
    else:
        assert here.placement["how"] == IN_DRIVER and here.placement["actors"] == 0
    assert pool.placement["how"] == "given" and pool.placement["actors"] == 1
    sent = run_index(_cfg(corpus, tmp_path / "db-sent", writes="driver").model_copy(update={"ray": RAY.model_copy(update={"embed_actors": 1})}),
                     tmp_path / "sent")
    assert (here.inserted, here.rejected, here.rows_read) == (pool.inserted, pool.rejected, pool.rows_read) == (120, 0, 120)
    assert (sent.inserted, sent.rows_read) == (120, 120)
    a, b, c = _table(tmp_path / "db-driver"), _table(tmp_path / "db-pool"), _table(tmp_path / "db-sent")
    assert _contents(a) == _contents(b) == _contents(c) == _expected(docs300[:120])
    va, vb, vc = (np.stack(t.column("vector").to_numpy(zero_copy_only=False)) for t in (a, b, c))
    np.testing.assert_allclose(va, vb, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(vc, vb, rtol=RTOL, atol=ATOL)
    assert sent.writes["files_committed"] == here.writes["files_committed"] == 0, (sent.writes, here.writes)  # every row came to the driver
    assert all(s.writes["seconds"] > 0 for s in (here, pool, sent)), [s.writes for s in (here, pool, sent)]  # the table's writes timed
    assert json.loads((tmp_path / "driver" / "manifest.json").read_text())["counts"]["placement"] == here.placement
    built = pool.maintenance["bm25_index"]
    assert (built["how"], built["workers"], built["docs"], built["nodes"]) == ("built", 2, 120, 1), built  # the session cluster: one node
    queries = [d["text"][:60] for d in docs300[:20]]
    indexes = [DocStore(str(tmp_path / db)).bm25_index() for db in ("db-driver", "db-pool")]
    for (rows_a, scores_a), (rows_b, scores_b) in zip(*(ix.search(queries, 10) for ix in indexes), strict=True):
        assert indexes[0].doc_id_array().take(rows_a).to_pylist() == indexes[1].doc_id_array().take(rows_b).to_pylist()  # rows may differ in order
        np.testing.assert_allclose(scores_b, scores_a, rtol=RTOL, atol=ATOL)

    # a re-index through the pool: each actor looks up its batches' stored hashes in the table (no
    # actor holds them all); past ann_threshold with ann off (the default), no ANN index is built
    snapshot = [dict(r) for r in docs300[:120]]
    snapshot[0]["text"] += " (revised)"
    snapshot = snapshot[:100] + docs300[120:125]
    again = run_index(_cfg(write_jsonl(tmp_path / "c2.jsonl", snapshot), tmp_path / "db-pool", allow_mass_delete=True, ann_threshold=50)
                      .model_copy(update={"ray": RAY.model_copy(update={"embed_actors": 1})}), tmp_path / "pool2")
    assert (again.inserted, again.updated, again.unchanged, again.deleted, again.absent) == (5, 1, 99, 20, 20)
    assert again.writes["files_committed"] == 1, again.writes  # the 5 new rows: written by the worker, committed by the driver
    assert _contents(_table(tmp_path / "db-pool")) == _expected(snapshot) and not DocStore(str(tmp_path / "db-pool")).has_ann_index()
    assert not list((tmp_path / "pool2").glob(".*ids*"))  # the run's scratch files (ids seen, ids absent) are gone


def _interrupt_at(monkeypatch, rows: int) -> None:
    """Ctrl-C in the index job once it has read ``rows`` rows: raised from its progress beat
    (``index: N rows read``, after each batch is written or queued), no sleep."""
    import logicrank.jobs.index

    def beat(message: str) -> None:
        if int(message.split()[1]) >= rows:
            raise KeyboardInterrupt

    monkeypatch.setattr(logicrank.jobs.index, "beat", beat)


def test_only_complete_index_runs_are_read(tmp_path, docs300, monkeypatch):
    """Ctrl-C in a first index: one line (what the table holds, how to resume), exit 130, an
    `interrupted` manifest, and retrieve refuses the table in one line (before: exit 130 with
    no word, no manifest, and retrieve read the partial table); `--table-version` reads it on
    purpose. After the rerun completes, an interrupted or failed re-index leaves the complete
    version the one retrieve reads, and it says so."""
    from typer.testing import CliRunner

    from logicrank.cli import app
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig

    corpus, db = write_jsonl(tmp_path / "c.jsonl", docs300[:200]), tmp_path / "db"
    config = tmp_path / "index.yaml"
    config.write_text(f"corpus: {corpus}\ndb: {db}\nwrite_batch_rows: 64\nray: {{num_cpus: 2, batch_rows: 64}}\n")
    queries = write_jsonl(tmp_path / "q.jsonl", [{"_id": "q1", "text": docs300[150]["text"][:200]}, {"_id": "q2", "text": "cell biology"}])
    index = ["index", "--config", str(config), "--no-progress", "--out"]
    retrieve = ["retrieve", str(queries), "--db", str(db), "--method", "dense", "--out"]

    _interrupt_at(monkeypatch, 128)
    res = CliRunner().invoke(app, [*index, str(tmp_path / "i1")])
    assert res.exit_code == 130, res.output
    line = res.stderr.strip()
    partial = DocStore(str(db)).version
    assert "\n" not in line and line == (
        f"error: index: interrupted after reading 128 rows (128 documents written); table 'docs' v{partial} is incomplete and will not "
        "be read (no index run has completed on this table, so retrieve refuses it); rerun the same command to resume (documents "
        "already written are kept and not embedded again).")
    manifest = json.loads((tmp_path / "i1" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["counts"]["written"] == 128 and manifest["table"]["complete"] is False
    res = CliRunner().invoke(app, [*retrieve, str(tmp_path / "r1")])
    assert res.exit_code == 2 and res.stderr.strip().count("\n") == 0, res.output
    assert res.stderr.startswith("error: retrieve: table 'docs' in ") and "has no version that an index run completed" in res.stderr
    assert f"--table-version {partial}." in res.stderr and not (tmp_path / "r1" / "runs").exists()
    # on purpose: the incomplete version is read
    res = CliRunner().invoke(app, [*retrieve, str(tmp_path / "r2"), "--table-version", str(partial)])
    assert res.exit_code == 0, res.output
    run = pa.parquet.read_table(tmp_path / "r2" / "runs" / "dense.parquet")
    assert set(run.column("doc_id").to_pylist()) <= {d["_id"] for d in docs300[:128]}

    # the same command resumes: only the missing documents are embedded, and the table is read again
    monkeypatch.undo()
    res = CliRunner().invoke(app, [*index, str(tmp_path / "i2")])
    assert res.exit_code == 0, res.output
    store = DocStore(str(db))
    complete = store.version
    assert store.complete_version() == complete and store.count() == 200
    counts = json.loads((tmp_path / "i2" / "manifest.json").read_text())["counts"]
    assert (counts["embedded"], counts["inserted"], counts["unchanged"]) == (72, 200, 0)  # 200 new to readers, 72 embedded now
    lines: list[str] = []
    cfg = RetrieveConfig.preset(("dense",), queries=str(queries), db=str(db), set={"dense.k": 10}, ray=RAY)
    run_retrieve(cfg, tmp_path / "r3", echo=lines.append)
    assert not any("table 'docs'" in x for x in lines)

    # a re-index with revised documents, interrupted: retrieve reads the complete version and says so
    revised = [dict(r, text=r["text"] + " (revised)") for r in docs300[:200]]
    write_jsonl(corpus, revised)
    _interrupt_at(monkeypatch, 64)
    with pytest.raises(KeyboardInterrupt, match=r"index: interrupted after reading 64 rows \(64 documents written\); table 'docs' "
                       rf"v\d+ is incomplete and will not be read \(readers keep reading v{complete}, the last version"):
        run_index(_cfg(corpus, db, write_batch_rows=64), tmp_path / "i3")
    monkeypatch.undo()
    left = DocStore(str(db)).version
    assert left > complete and json.loads((tmp_path / "i3" / "manifest.json").read_text())["status"] == "interrupted"
    lines = []
    run_retrieve(cfg, tmp_path / "r4", echo=lines.append)
    note = f"retrieve: table 'docs': reading v{complete}, the last version a completed index run finished (v{left} is not marked complete: left by an index run"
    assert [x for x in lines if "table 'docs'" in x][0].startswith(note)
    assert json.loads((tmp_path / "r4" / "manifest.json").read_text())["inputs"]["table"]["version"] == complete
    res = CliRunner().invoke(app, [*retrieve, str(tmp_path / "r5")])
    assert res.exit_code == 0 and note in res.stdout, res.output
    import logicrank as lr

    table = lr.open_table(db)  # the notebook API follows the same default
    assert table.version == complete and table.note.startswith(note.replace("retrieve:", "open_table:", 1))
    assert lr.open_table(db, version=left).version == left and lr.open_table(db, version=left).note is None
    # so does ablate (generate opens its table the same way): the revised texts of the partial version are not scored
    from logicrank.jobs.ablate import run_ablate

    logical = write_jsonl(tmp_path / "lq.jsonl", [{"_id": "q1", "text": "revised", "logical_query": '"revised"'}])
    (tmp_path / "lq.tsv").write_text(f"query-id\tcorpus-id\tscore\nq1\t{docs300[0]['_id']}\t1\n")
    lines = []
    ablation = run_ablate(str(logical), str(tmp_path / "lq.tsv"), str(db), tmp_path / "ab", EmbedConfig(), scorer="bm25", echo=lines.append)
    assert len(lines) == 1 and lines[0].startswith(note.replace("retrieve:", "ablate:", 1)), lines
    assert set(ablation["value"]) == {0.0}  # "revised" is in no document of the complete version

    # one that stops on too many rejects: the same
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(dict(r, text="again")) + "\n" for r in revised[:20]) + '{"_id": "x"}\n' * 5)
    with pytest.raises(IndexJobError, match=rf"is incomplete and will not be read \(readers keep reading v{complete}, the last version"):
        run_index(_cfg(bad, db, delete_missing=False), tmp_path / "i4")
    assert json.loads((tmp_path / "i4" / "manifest.json").read_text())["status"] == "failed"
    assert DocStore(str(db)).complete_version() == complete


def test_a_resumed_run_counts_what_changed_since_the_last_complete_version(tmp_path, docs300, monkeypatch):
    """A re-index of revised texts interrupted after writing all of them (Ctrl-C in the
    maintenance): the same command resumes, and its summary counts what readers now see
    changed since the last complete version, not since the interrupted run's partial commits
    (before: "unchanged 100 ... (nothing changed)" while readers moved to 100 revised texts);
    the interrupted run's manifest is kept beside the new one; `logicrank versions` marks the
    versions."""
    from typer.testing import CliRunner

    from logicrank.cli import app

    corpus, db = write_jsonl(tmp_path / "c.jsonl", docs300[:150]), tmp_path / "db"
    config = tmp_path / "index.yaml"
    config.write_text(f"corpus: {corpus}\ndb: {db}\nwrite_batch_rows: 64\nray: {{num_cpus: 2, batch_rows: 64}}\n")
    index = ["--stall-timeout", "0", "index", "--config", str(config), "--no-progress", "--out", str(tmp_path / "run")]
    assert CliRunner().invoke(app, index).exit_code == 0
    complete = DocStore(str(db)).version
    # 100 texts revised, 40 kept, 10 dropped (deleted) and 5 new
    snapshot = [dict(r, text=r["text"] + " (revised)") for r in docs300[:100]] + docs300[100:140] + docs300[150:155]
    write_jsonl(corpus, snapshot)

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(DocStore, "maintain", interrupted)
    res = CliRunner().invoke(app, index)
    assert res.exit_code == 130, res.output
    monkeypatch.undo()
    left = DocStore(str(db)).version
    assert left > complete and DocStore(str(db)).complete_version() == complete
    stopped = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["table"]["version"] == left  # how the next run knows it resumes this one

    res = CliRunner().invoke(app, index)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    kept = sorted(p.name for p in (tmp_path / "run").glob("manifest.interrupted-*.json"))
    assert len(kept) == 1 and json.loads((tmp_path / "run" / kept[0]).read_text()) == stopped
    assert lines[0] == (f"index: finished the run that stopped at v{left} (0 documents embedded now); its manifest kept as "
                        f"{tmp_path / 'run' / kept[0]}; the counts below are of what changed since v{complete}, the last version a "
                        "completed index run finished.")
    assert lines[1].startswith("inserted 5, updated 100, unchanged 40, deleted 10, rejected 0 ;"), lines[1]
    assert "nothing changed" not in res.stdout
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["counts"]["resumed"] == {"from_version": left, "kept_manifest": kept[0]}
    assert (manifest["counts"]["since_version"], manifest["counts"]["embedded"]) == (complete, 0)
    store = DocStore(str(db))
    assert store.complete_version() == store.version and store.count() == 145

    res = CliRunner().invoke(app, ["versions", "--db", str(db)])
    assert res.exit_code == 0, res.output
    state = {int(line.split()[0]): line.split()[-2] for line in res.stdout.splitlines()[1:]}
    # the stopped run's version is older than the mark now and untagged: the table cannot tell it from a completed run's whose
    # tag expired, so it says neither (docs/failures.md)
    assert state[store.version] == "read" and state[left] == "unrecorded", res.stdout
    assert {int(line.split()[0]) for line in res.stdout.splitlines()[1:] if ", read" in line} == {store.version}


@pytest.mark.parametrize("bm25_workers", [0, 2])
def test_sigterm_to_an_index_run_with_its_own_ray_stops_it_as_interrupted(tmp_path, docs300, bm25_workers):
    """`logicrank index` in its own process, which starts its own Ray: ray.init installs its own
    SIGTERM handler (sys.exit), which the run takes back, so a SIGTERM once the table has
    commits ends it as interrupted: exit 143, one line, an `interrupted` manifest (before the
    handler was taken back: exit 15 and a `failed` manifest). With `--bm25-workers` the Ray
    session started for the stream is held until the BM25 index is made: the same stop, and
    the rerun finishes the table with the index made by the workers."""
    corpus, db = write_jsonl(tmp_path / "c.jsonl", docs300), tmp_path / "db"
    config = tmp_path / "index.yaml"
    config.write_text(f"corpus: {corpus}\ndb: {db}\nwrite_batch_rows: 32\nbm25_workers: {bm25_workers}\nray: {{num_cpus: 2, batch_rows: 32}}\n")
    cmd = [sys.executable, "-c", "from logicrank.cli import app; app()", "--stall-timeout", "0", "index", "--config", str(config),
           "--out", str(tmp_path / "run"), "--no-progress"]
    child = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    versions = db / "docs.lance" / "_versions"
    try:
        wait_until(lambda: versions.is_dir() and len(list(versions.glob("*.manifest"))) >= 3, child, "its third commit")
        child.send_signal(signal.SIGTERM)  # the CLI process only: its Ray is its own business
        _, err = child.communicate()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    rows = DocStore(str(db)).count()
    assert 0 < rows < 300, f"the run must be stopped mid-write for this test to mean anything (rows: {rows})"
    lines = [line for line in err.strip().splitlines() if line]
    assert child.returncode == 143, err[-2000:]
    assert lines[-1].startswith("error: index: interrupted after reading ") and "rerun the same command to resume" in lines[-1], err[-2000:]
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["status"] == "interrupted"
    if bm25_workers:
        rerun = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
        assert manifest["status"] == "ok" and manifest["table"]["complete"] and manifest["table"]["rows"] == 300
        bm25 = manifest["counts"]["maintenance"]["bm25_index"]
        assert (bm25["how"], bm25["workers"], bm25["docs"]) == ("built", 2, 300), bm25


def test_vectors_made_by_other_embedding_code_are_made_again(tmp_path, docs300, monkeypatch):
    """The index job follows the cache rule: a stored vector is reused only if the code that
    makes vectors (pipelines/engines/embed.py and what it imports) is the code that made it. Here its
    digest is changed as an edit of that code would change it. The record holds the registered
    model's package and version after the code (``embedding_code``)."""
    import logicrank.jobs.index
    from logicrank.pipelines.codedigest import code_digest
    from logicrank.pipelines.engines.vector_models import embedding_code, model_files_digest

    def record(code: str) -> str:
        return embedding_code(code, model_files_digest(_cfg(tmp_path, tmp_path).embed.model))

    corpus, db = write_jsonl(tmp_path / "c.jsonl", docs300[:40]), tmp_path / "db"
    first = run_index(_cfg(corpus, db), tmp_path / "i1")
    now = record(code_digest("logicrank.pipelines.engines.embed"))
    assert now.startswith(code_digest("logicrank.pipelines.engines.embed") + "+")
    assert (first.inserted, first.embedded_by) == (40, {"before": None, "now": now})
    assert DocStore(str(db)).embedded_by() == now
    assert run_index(_cfg(corpus, db), tmp_path / "i2").embedded == 0  # the same code: every vector reused
    monkeypatch.setattr(logicrank.jobs.index, "code_digest", lambda module: "edited" if module == "logicrank.pipelines.engines.embed" else code_digest(module))
    again = run_index(_cfg(corpus, db), tmp_path / "i3")
    assert (again.updated, again.unchanged, again.embedded) == (40, 0, 40)
    assert again.embedded_by == {"before": now, "now": record("edited"), "reembedded": 40}
    store = DocStore(str(db))
    assert store.embedded_by() == record("edited") and store.count() == 40
    assert run_index(_cfg(corpus, db), tmp_path / "i4").embedded == 0  # recorded: the next run reuses them
    # the first run's version restored holds the vectors the first code made, and says so: the "edited" code's next run
    # embeds every document again (the record was the table's, not the version's: the restored vectors were reused as
    # the edited code's, and queries encoded by it searched them)
    store.restore(first.tag)
    assert DocStore(str(db)).embedded_by() == now
    after = run_index(_cfg(corpus, db), tmp_path / "i5")
    assert (after.updated, after.embedded, after.embedded_by) == (40, 40, {"before": now, "now": record("edited"), "reembedded": 40})
    # a run of other code that stops before its end leaves vectors of two codes under the record of the first: the
    # next run of that first code took every stored vector as its own (a rolled-back deploy's nightly). The record
    # says "unknown" from the stopping run's first write, so the next run, of either code, embeds every document again
    monkeypatch.setattr(logicrank.jobs.index, "code_digest", lambda module: "other" if module == "logicrank.pipelines.engines.embed" else code_digest(module))

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(logicrank.jobs.index, "embed_left_behind", disk_full)  # after the stream wrote every row again
    with pytest.raises(OSError):
        run_index(_cfg(corpus, db), tmp_path / "i6")
    monkeypatch.undo()
    monkeypatch.setattr(logicrank.jobs.index, "code_digest", lambda module: "edited" if module == "logicrank.pipelines.engines.embed" else code_digest(module))
    back = run_index(_cfg(corpus, db), tmp_path / "i7")
    assert (back.embedded, back.embedded_by["reembedded"]) == (40, 40), back.embedded_by
    assert DocStore(str(db)).embedded_by() == record("edited")


def test_a_local_model_saved_over_is_another_encoder_to_the_index_job_and_to_queries(tmp_path, docs300):
    """A local model directory is named by its path, so a fine-tune saved over it kept the
    table's vectors as the new model's: the index job reused every stored vector and queries
    were encoded into another space than the documents'. Its files' content is part of the
    table's record of what made its vectors: the next index run embeds every document again,
    and until then a job that encodes queries refuses the table in one line."""
    import shutil

    from logicrank.pipelines.engines.embed import Embedder, ModelError, document_text, resolve_model
    from logicrank.pipelines.engines.vector_models import require_query_model

    model = tmp_path / "encoder"
    shutil.copytree(resolve_model("all-MiniLM-L6-v2"), model)
    corpus, db = write_jsonl(tmp_path / "c.jsonl", docs300[:40]), tmp_path / "db"
    embed = EmbedConfig(model=str(model))
    assert run_index(_cfg(corpus, db, embed=embed), tmp_path / "i1").inserted == 40
    assert run_index(_cfg(corpus, db, embed=embed), tmp_path / "i2").embedded == 0  # the same files: every vector reused
    require_query_model(DocStore(str(db)), str(model), "retrieve")
    (model / "README.md").write_text("notes")  # not the model: nothing changes
    require_query_model(DocStore(str(db)), str(model), "retrieve")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 1e-5}))  # as a model saved over it
    with pytest.raises(ModelError, match=r"^retrieve: table 'docs' in .* holds vectors the files of .* made as they were \(\w+\), "
                                         r"not as they are now \(\w+\): the model was saved over \(or its package upgraded\) since; index the table again"):
        require_query_model(DocStore(str(db)), str(model), "retrieve")
    again = run_index(_cfg(corpus, db, embed=embed), tmp_path / "i3")
    assert (again.updated, again.embedded, again.embedded_by["reembedded"]) == (40, 40, 40)
    require_query_model(DocStore(str(db)), str(model), "retrieve")
    # vectors made elsewhere by the directory's model (--vector-model DIR): its files are recorded alike
    vectors = Embedder(embed).encode([document_text(d["title"], d["text"]) for d in docs300[:40]])
    given = write_jsonl(tmp_path / "vec" / "c.jsonl", [{**d, "emb": v.tolist()} for d, v in zip(docs300[:40], vectors, strict=True)])
    db2 = tmp_path / "db-precomputed"
    assert run_index(_cfg(given, db2, vector_column="emb", vector_model=str(model)), tmp_path / "p1").precomputed == 40
    require_query_model(DocStore(str(db2)), str(model), "retrieve")
    (model / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 1e-6}))  # saved over again
    with pytest.raises(ModelError, match=r"^retrieve: table 'docs' in .* holds vectors the files of .* made as they were"):
        require_query_model(DocStore(str(db2)), str(model), "retrieve")


def test_a_new_encoder_embeds_again_the_stored_documents_no_valid_row_rewrote(tmp_path, docs300):
    """A run whose encoder is not the one that made the table's vectors embeds every stored
    document again, but it rewrote only those a valid row of the snapshot holds: a held
    document (its row rejected) and an absent one kept by --no-delete-missing kept the earlier
    encoder's vectors under the new encoder's record, and the next run took them as current
    (a query encoded by the new model searched them). They are embedded again from their stored
    title and text: every vector is the one a clean run with the new encoder gives."""
    import shutil

    from logicrank.pipelines.engines.embed import Embedder, document_text, resolve_model

    model = tmp_path / "encoder"
    shutil.copytree(resolve_model("all-MiniLM-L6-v2"), model)
    corpus, db = write_jsonl(tmp_path / "c.jsonl", docs300[:40]), tmp_path / "db"
    embed = EmbedConfig(model=str(model))
    assert run_index(_cfg(corpus, db, embed=embed), tmp_path / "i1").inserted == 40
    pooling = model / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({**config, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))  # another encoder
    held, gone = docs300[0]["_id"], docs300[1]["_id"]
    snapshot = [{**docs300[0], "title": "", "text": ""}, *docs300[2:40]]  # the first document's row rejected, the second absent
    again = run_index(_cfg(write_jsonl(tmp_path / "c2.jsonl", snapshot), db, embed=embed, delete_missing=False, max_reject_fraction=0.5),
                      tmp_path / "i2")
    assert (again.held, again.absent, again.updated, again.embedded, again.embedded_by["reembedded"]) == (1, 1, 38, 40, 40)
    table = _table(db)
    assert {held, gone} <= set(table.column("doc_id").to_pylist()) and table.num_rows == 40
    encoder = Embedder(EmbedConfig(model=str(model)))
    texts = [document_text(t, x, encoder.config.title_sep) for t, x in zip(table.column("title").to_pylist(), table.column("text").to_pylist(),
                                                                        strict=True)]
    np.testing.assert_allclose(np.stack(table.column("vector").to_numpy(zero_copy_only=False)), encoder.encode(texts), atol=1e-5)
    assert run_index(_cfg(corpus, db, embed=embed), tmp_path / "i3").embedded == 0  # every vector now the new encoder's: reused


def test_precomputed_vectors_are_indexed_as_given_and_queries_need_a_model_that_loads(tmp_path, docs300):
    """`--vector-column`: the corpus's own vectors, checked row by row (a wrong one is a reject
    with its reason), stored at unit length, nothing embedded. Vectors a registered model made
    give the table, and the dense run, that embedding the same documents gives; a table of
    external vectors answers BM25 and refuses a dense stage in one line."""
    import pyarrow.parquet as pq

    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.engines.embed import Embedder, ModelError, document_text
    from logicrank.pipelines.retrieval.stages import parse_stages
    from tests.compare import ATOL, RTOL

    docs = docs300[:40]
    vecs = Embedder(EmbedConfig()).encode([document_text(d["title"], d["text"]) for d in docs])
    rows = [{**d, "emb": (2.0 * v).tolist()} for d, v in zip(docs, vecs, strict=True)]  # not unit length: stored normalised
    corpus = write_jsonl(tmp_path / "vec" / "c.jsonl", rows + [{"_id": "short", "text": "a vector of three", "emb": [0.1, 0.2, 0.3]}])
    given = _cfg(corpus, tmp_path / "db-given", vector_column="emb", vector_model="all-MiniLM-L6-v2", max_reject_fraction=0.05)
    s = run_index(given, tmp_path / "given")
    assert (s.inserted, s.precomputed, s.embedded, s.rejected, s.rejects_by_reason) == (40, 40, 0, 1, {"vector_dim": 1})
    rejects = pq.read_table(tmp_path / "given" / "rejects.parquet").to_pylist()
    assert [(r["doc_id"], r["location"], r["detail"]) for r in rejects] == [("short", 41, "field 'emb': 3 numbers, expected 384")]
    embedded = run_index(_cfg(write_jsonl(tmp_path / "plain" / "c.jsonl", docs), tmp_path / "db-embedded"), tmp_path / "embedded")
    assert (embedded.inserted, embedded.embedded, embedded.precomputed) == (40, 40, 0)
    a, b = _table(tmp_path / "db-given"), _table(tmp_path / "db-embedded")
    assert a.column("doc_id").to_pylist() == b.column("doc_id").to_pylist()
    np.testing.assert_allclose(*(np.stack(t.column("vector").to_numpy(zero_copy_only=False)) for t in (a, b)), rtol=RTOL, atol=ATOL)
    # the record: the corpus's own vectors, not the registered model's package (which made none of them: its upgrade
    # would take every stored row as changed)
    assert DocStore(str(tmp_path / "db-given")).model_id() == "all-MiniLM-L6-v2" and DocStore(str(tmp_path / "db-given")).embedded_by() == "precomputed"
    again = run_index(given, tmp_path / "given2")  # the same vectors again: nothing changes
    assert (again.unchanged, again.precomputed, again.updated) == (40, 0, 0)
    pooled = run_index(given.model_copy(update={"db": str(tmp_path / "db-pool"), "ray": RAY.model_copy(update={"embed_actors": 1})}),
                       tmp_path / "pool")  # through the Ray Data pool, as on a cluster: the same table
    assert pooled.placement["actors"] == 1 and (pooled.precomputed, pooled.rejected) == (40, 1)
    pool = _table(tmp_path / "db-pool")
    assert _contents(pool) == _contents(a)
    np.testing.assert_array_equal(*(np.stack(t.column("vector").to_numpy(zero_copy_only=False)) for t in (pool, a)))

    queries = write_jsonl(tmp_path / "q.jsonl", [{"_id": f"q{i}", "text": d["title"]} for i, d in enumerate(docs[:6])])
    dense = {"dense": parse_stages([{"dense": {"k": 10}}])}
    runs = [pq.read_table(run_retrieve(RetrieveConfig(queries=str(queries), db=str(tmp_path / db), pipelines=dense, ray=RAY), tmp_path / out,
                                       progress=False)["dense"]).sort_by([("query_id", "ascending"), ("rank", "ascending")])
            for db, out in (("db-given", "r-given"), ("db-embedded", "r-embedded"))]
    for column in ("query_id", "doc_id", "rank"):
        assert runs[0].column(column).to_pylist() == runs[1].column(column).to_pylist()
    np.testing.assert_allclose(runs[0].column("score").to_numpy(), runs[1].column("score").to_numpy(), rtol=RTOL, atol=ATOL)

    # vectors from elsewhere: recorded as external; their dimension must be given for a new table
    external = _cfg(corpus, tmp_path / "db-ext", vector_column="emb", max_reject_fraction=0.05)
    with pytest.raises(IndexJobError, match=r"into a new table needs the vectors' dimension: give --vector-dim N"):
        run_index(external, tmp_path / "ext0")
    with pytest.raises(IndexJobError, match=r"dimension disagrees: table 'docs' 384, --vector-dim 3, model 'all-MiniLM-L6-v2' 384; nothing was read"):
        run_index(given.model_copy(update={"vector_dim": 3}), tmp_path / "ext1")
    assert run_index(external.model_copy(update={"vector_dim": 384}), tmp_path / "ext").precomputed == 40
    assert DocStore(str(tmp_path / "db-ext")).model_id() == "external"
    both = {"dense": parse_stages([{"dense": {"k": 10}}]), "bm25": parse_stages([{"bm25": {"k": 10}}])}
    with pytest.raises(ModelError, match=r"^retrieve: table 'docs' in .* holds precomputed vectors from 'external', a model logicrank cannot "
                                         r"load, so no query can be encoded for its dense stages; use stages that need no encoder \(bm25\)"):
        run_retrieve(RetrieveConfig(queries=str(queries), db=str(tmp_path / "db-ext"), pipelines=both, ray=RAY), tmp_path / "r-ext", progress=False)
    bm25 = run_retrieve(RetrieveConfig(queries=str(queries), db=str(tmp_path / "db-ext"), pipelines={"bm25": both["bm25"]}, ray=RAY),
                        tmp_path / "r-ext-bm25", progress=False)["bm25"]
    assert set(pq.read_table(bm25).column("query_id").to_pylist()) == {f"q{i}" for i in range(6)}

    # vectors from the corpus for the table whose vectors the job made: every stored document is written again, and one
    # whose row is rejected kept the job's vector under the corpus's record (queries trusted it): refused, nothing marked
    complete = DocStore(str(tmp_path / "db-embedded")).complete_version()
    switched = write_jsonl(tmp_path / "switch" / "c.jsonl", [dict(rows[0], emb=[float("nan")] * 384), *rows[1:]])
    with pytest.raises(IndexJobError, match=r"index: 1 stored document\(s\) no valid row of this snapshot rewrote .*e\.g\. "
                                            rf"'{docs[0]['_id']}', would keep vectors of the earlier code"):
        run_index(_cfg(switched, tmp_path / "db-embedded", vector_column="emb", vector_model="all-MiniLM-L6-v2", max_reject_fraction=0.05),
                  tmp_path / "switch-run")
    assert DocStore(str(tmp_path / "db-embedded")).complete_version() == complete
    manifest = json.loads((tmp_path / "switch-run" / "manifest.json").read_text())  # recorded as any refusal is, with how to restore
    assert manifest["status"] == "failed" and "would keep vectors" in manifest["error"] and "logicrank restore" in manifest["error"]
    assert not manifest["table"]["complete"] and not (tmp_path / "switch-run" / ".absent-ids.parquet").exists()


def test_ray_tasks_keep_the_order_and_a_failed_task_stops_the_others(ray_cluster, tmp_path):
    """`--bm25-workers`' runner (jobs/raysession.py, RayTasks): results in the arguments' order;
    when a task fails, the tasks still running are cancelled and awaited before the error is
    raised (here they would run forever: the call returning at all shows it). The tasks ask for
    no CPU: the session's cluster may have its CPUs held by other tests' work, and the three
    must run at once."""
    from logicrank.jobs.raysession import RayTasks

    def square(x):
        return x * x

    tasks = RayTasks(ray_cluster, at_once=2, num_cpus=0)
    assert tasks(square, [(i,) for i in range(5)]) == [0, 1, 4, 9, 16] and len(tasks.nodes) == 1

    def run_or_fail(i, flags):
        import pathlib
        import time

        if i == 2:  # fails once the other two are running
            while len(list(pathlib.Path(flags).glob("started-*"))) < 2:
                time.sleep(0.01)
            raise ValueError("segment 2 failed")
        import signal

        signal.signal(signal.SIGINT, lambda *_: None)  # a handler of its own, as vLLM's or a job's: a polite cancel never raises here
        pathlib.Path(flags, f"started-{i}").touch()
        while True:  # until cancelled
            time.sleep(0.01)

    with pytest.raises(Exception, match="segment 2 failed"):
        RayTasks(ray_cluster, at_once=3, num_cpus=0)(run_or_fail, [(i, str(tmp_path)) for i in range(3)])
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-0", "started-1"]


def test_a_rerun_of_a_first_build_that_never_completed_is_held_by_the_mass_delete_guard(tmp_path):
    """A first build that did not complete (here refused for its rejects; killed is the same)
    leaves its documents in a version no reader reads. Its rerun with a wrong snapshot (10 of
    its 60 documents) was weighed against the last complete version, which does not exist: 0
    deletes of 0, so it deleted 50 documents and marked 10 complete. The share is now of the
    documents the table holds, and refused; the right snapshot completes it."""
    rng = np.random.default_rng(0)
    docs = [{"_id": f"d{i}", "text": f"document {i}", "emb": rng.standard_normal(8).round(3).tolist()} for i in range(60)]
    cfg = lambda corpus: _cfg(corpus, tmp_path / "db", vector_column="emb", vector_dim=8)  # noqa: E731
    bad = write_jsonl(tmp_path / "first.jsonl", docs + [{"text": "no id"}] * 60)
    with pytest.raises(IndexJobError, match=r"60 of 120 rows rejected"):
        run_index(cfg(bad), tmp_path / "r1")
    assert DocStore(str(tmp_path / "db")).count() == 60 and DocStore(str(tmp_path / "db")).complete_version() is None
    with pytest.raises(IndexJobError, match=r"would delete 50 of the 60 documents in table 'docs' .*--allow-mass-delete"):
        run_index(cfg(write_jsonl(tmp_path / "wrong.jsonl", docs[:10])), tmp_path / "r2")
    assert DocStore(str(tmp_path / "db")).count() == 60
    s = run_index(cfg(write_jsonl(tmp_path / "right.jsonl", docs)), tmp_path / "r3")
    # (counted against what readers read, none: every document is new to them)
    assert (s.inserted, s.deleted, s.table_rows) == (60, 0, 60) and DocStore(str(tmp_path / "db")).complete_version() == s.table_version


def test_a_step_after_the_versions_tag_that_fails_leaves_a_manifest_that_says_what_readers_read(tmp_path, monkeypatch):
    """The run's tag is made before the completion mark: a tag that fails leaves the version
    unread, and its manifest says `complete: false` (the mark came first, so readers read a
    version whose run said failed and incomplete). A step after the mark that fails (the old
    tags' drop) records the version as complete, as readers read it. A tag LanceDB cannot make
    is refused before the run, in one line."""
    rng = np.random.default_rng(1)
    docs = [{"_id": f"d{i}", "text": f"document {i}", "emb": rng.standard_normal(8).round(3).tolist()} for i in range(20)]
    cfg = lambda n, **kw: _cfg(write_jsonl(tmp_path / f"c{n}.jsonl", docs[:n]), tmp_path / "db", vector_column="emb", vector_dim=8,  # noqa: E731
                               allow_mass_delete=True, **kw)
    first = run_index(cfg(20), tmp_path / "r1").table_version

    from logicrank.pipelines.engines.store.versions import COMPLETE_TAG

    real_tag = DocStore.tag

    def refuse(self, name, version=None):  # the run's own tag fails; the completion mark (a tag too) would not
        if name != COMPLETE_TAG:
            raise RuntimeError("lance error: Ref is invalid")
        real_tag(self, name, version)

    with monkeypatch.context() as m:
        m.setattr(DocStore, "tag", refuse)
        with pytest.raises(RuntimeError, match="Ref is invalid"):
            run_index(cfg(15), tmp_path / "r2")
    manifest = json.loads((tmp_path / "r2" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["table"]["complete"] is False
    assert DocStore(str(tmp_path / "db")).complete_version() == first and DocStore(str(tmp_path / "db")).version > first

    def drop_fails(self, *a, **kw):
        raise OSError("disk gone")

    with monkeypatch.context() as m:
        m.setattr(DocStore, "drop_old_tags", drop_fails)
        with pytest.raises(OSError, match="disk gone"):
            run_index(cfg(15), tmp_path / "r3")
    manifest = json.loads((tmp_path / "r3" / "manifest.json").read_text())
    store = DocStore(str(tmp_path / "db"))
    assert manifest["status"] == "failed" and manifest["table"]["complete"] is True
    assert store.complete_version() == store.version == manifest["table"]["version"] and store.count() == 15
    with pytest.raises(ValueError, match=r"'prod v2' cannot tag a version: a tag has only letters, digits"):
        cfg(15, tag="prod v2")
    with pytest.raises(ValueError, match=r"a tag of digits alone would read as a version number"):
        cfg(15, tag="3")
    # a tag already naming a version a completed run finished is not moved to this run's: what a manifest, a paper or
    # --table-version TAG names would read other documents, and the version, untagged, be pruned
    paper = run_index(cfg(15, tag="paper"), tmp_path / "r4")
    with pytest.raises(IndexJobError, match=r"tag 'paper' already names v\d+, which a completed run finished.*give this run another tag"):
        run_index(cfg(12, tag="paper"), tmp_path / "r5")
    store = DocStore(str(tmp_path / "db"))
    assert store.tagged_version("paper") == paper.table_version == store.complete_version() and store.count() == 15
    # the same run directory's run stopped after its tag and mark, before its record (a nightly's index step resumed):
    # its own tag, moved as before; and a finished run's rerun there is refused
    manifest = json.loads((tmp_path / "r4" / "manifest.json").read_text())
    (tmp_path / "r4" / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    again = run_index(cfg(12, tag="paper"), tmp_path / "r4")
    assert DocStore(str(tmp_path / "db")).tagged_version("paper") == again.table_version != paper.table_version
    with pytest.raises(IndexJobError, match="tag 'paper' already names"):
        run_index(cfg(10, tag="paper"), tmp_path / "r4")
    # an --out holding another job's manifest is refused before the table is touched
    from logicrank.jobs.rundir import RunDirOfAnotherJob

    (tmp_path / "ret").mkdir()
    (tmp_path / "ret" / "manifest.json").write_text(json.dumps({"stage": "retrieve", "status": "ok"}))
    with pytest.raises(RunDirOfAnotherJob, match=r"holds the retrieve job's manifest"):
        run_index(cfg(10), tmp_path / "ret")
    assert DocStore(str(tmp_path / "db")).count() == 12  # (the retried run's 12)
