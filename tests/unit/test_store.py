"""DocStore on a real LanceDB table (no Ray, no model: generated vectors)."""

import json
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pytest

from logicrank.pipelines.engines.embed import to_fixed_size_list
from logicrank.pipelines.engines.store import DocStore, StoreError


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    v = rng.normal(size=(50, 8)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    s = DocStore(str(tmp_path / "db"))
    s.open_or_create(8, "gen")
    s.upsert(pa.table({
        "doc_id": [f"d{i}" for i in range(50)], "title": [None] * 50,
        "text": [f"apple banana {i}" if i % 2 else f"cherry {i}" for i in range(50)],
        "metadata": [None] * 50, "content_hash": ["h"] * 50, "vector": to_fixed_size_list(v),
    }))
    s.build_indexes(ann_threshold=10**9)
    return s, v


def test_scan_read_ahead_and_vectors_by_id(store):
    s, v = store
    plain = pa.Table.from_batches(list(s.scan(["doc_id", "vector"], 7)))
    ahead = pa.Table.from_batches(list(s.scan(["doc_id", "vector"], 7, read_ahead=True)))
    assert plain.equals(ahead) and plain.num_rows == 50
    got = s.vectors_for(["d3", "d40", "missing"])
    assert set(got) == {"d3", "d40"}
    np.testing.assert_allclose(got["d40"], v[40])


def test_delete_absent_commits_only_when_something_goes(store):
    s, _ = store
    version = s.version
    assert s.delete_absent(pa.array([f"d{i}" for i in range(50)])) == 0 and s.version == version
    assert s.delete_absent(pa.array([f"d{i}" for i in range(45)])) == 5 and s.count() == 45


@pytest.mark.parametrize("text", ["apple's \"pie\"", "AND OR NOT ( ) : *", "'; drop table docs; --", "banana\n\\"])
def test_text_search_never_parses_user_text(store, text):
    s, _ = store
    hits = s.text_search(text, 5)  # must not raise, whatever the syntax in it
    assert hits.num_rows <= 5
    assert s.count() == 50


def test_open_with_another_model_is_refused(store):
    s, _ = store
    with pytest.raises(StoreError, match="holds vectors from 'gen'"):
        DocStore(s.uri).open_or_create(8, "other")


def test_the_table_keeps_its_title_separator_and_refuses_another(store, tmp_path):
    s, _ = store
    assert s.title_sep() == " "  # the default; also what a table written before the key existed reads as
    with pytest.raises(StoreError, match=r"embedded its documents as title \+ ' ' \+ text, not '\. '; index with --title-sep ' '"):
        DocStore(s.uri).open_or_create(8, "gen", ". ")
    other = DocStore(str(tmp_path / "db2"))
    other.open_or_create(8, "gen", ". ")
    assert other.title_sep() == ". " and other.model_id() == "gen"  # the query side's model id does not change
    assert s.rows_for([], ["title"]).num_rows == 0  # no ids: no rows (not a filter error)


def test_rows_by_id_never_parse_the_ids(tmp_path):
    ids = ["it's", "a\"b", "x') OR ('1'='1", "'; drop table docs; --", "line\nbreak", "back\\slash", "plain"]
    v = np.eye(len(ids), 8, dtype=np.float32)
    s = DocStore(str(tmp_path / "db"))
    s.open_or_create(8, "gen")
    s.upsert(pa.table({
        "doc_id": ids, "title": ids, "text": ["t"] * len(ids), "metadata": [None] * len(ids),
        "content_hash": ["h"] * len(ids), "vector": to_fixed_size_list(v),
    }))
    for i, doc_id in enumerate(ids):
        got = s.rows_for([doc_id], ["title"]).to_pylist()
        assert got == [{"doc_id": doc_id, "title": doc_id}]
        np.testing.assert_array_equal(s.vectors_for([doc_id])[doc_id], v[i])
    assert s.rows_for(["x"], ["title"]).num_rows == 0 and s.count() == len(ids)


def test_only_the_jobs_own_tags_expire(store):
    import re

    s, _ = store
    for name in ("index-baseline", "index-0-golden", "index-20260101T000000000000Z", "index-20260102T000000000000Z", "nightly-1"):
        s.tag(name)
    dropped = s.drop_old_tags(re.compile(r"index-\d{8}T\d{12}Z"), keep=1)
    assert dropped == ["index-20260101T000000000000Z"]
    assert set(s.table.tags.list()) == {"index-baseline", "index-0-golden", "index-20260102T000000000000Z", "nightly-1"}


def test_a_version_is_read_by_number_digit_string_or_tag(store, tmp_path):
    s, _ = store
    s.tag("nightly-2026-11-20")
    old, rows = s.version, s.count()
    s.delete_absent(pa.array([f"d{i}" for i in range(40)]))
    assert s.count() == 40
    for version in (old, str(old), "nightly-2026-11-20"):  # `--table-version` arrives as text
        past = DocStore(s.uri, s.name, version=version)
        assert past.version == old and past.count() == rows
        assert past.text_search("cherry", 50).num_rows == 25  # full-text search reads that version too
    with pytest.raises(StoreError, match="no version or tag 'nightly-1999-01-01'; versions kept: .*tags: \\['nightly-2026-11-20'\\]"):
        _ = DocStore(s.uri, s.name, version="nightly-1999-01-01").table


def _more(s: DocStore, ids: list[str]) -> None:
    n = len(ids)
    v = np.ones((n, 8), np.float32) / np.sqrt(8)
    s.upsert(pa.table({"doc_id": ids, "title": [None] * n, "text": ["more"] * n, "metadata": [None] * n,
                       "content_hash": ["h2"] * n, "vector": to_fixed_size_list(v)}))


def test_readers_read_the_last_version_a_completed_run_finished(store):
    """The completion mark (pipelines/engines/store/versions.py): none yet is refused in one line; a
    newer version left by a run that did not finish is passed over, and the line says so;
    `--table-version` (readable's version) reads any version on purpose."""
    from logicrank.pipelines.engines.store.versions import COMPLETE_TAG

    def open_readable(uri, name, version, job):
        return DocStore(uri, name).readable(version, job)

    s, _ = store
    first = s.version
    with pytest.raises(StoreError) as refused:  # a first index that never completed
        open_readable(s.uri, "docs", None, "retrieve")
    message = str(refused.value)
    assert "\n" not in message and "table 'docs'" in message and "has no version that an index run completed" in message
    assert "rerun logicrank index to finish it" in message and f"--table-version {first}" in message
    assert open_readable(s.uri, "docs", first, "retrieve")[0].version == first  # on purpose: read, no line

    s.mark_complete()
    assert s.complete_version() == first and open_readable(s.uri, "docs", None, "retrieve")[1] is None
    _more(s, ["x1", "x2"])  # a re-index that stops half way
    partial = s.version
    read, note = open_readable(s.uri, "docs", None, "retrieve")
    assert read.version == first and read.count() == 50
    assert note == (f"retrieve: table 'docs': reading v{first}, the last version a completed index run finished (v{partial} is not "
                    f"marked complete: left by an index run that did not finish, interrupted, failed or still running, or restored "
                    f"from such a version; rerun logicrank index to finish it, or read v{partial} on purpose with --table-version {partial})")
    assert open_readable(s.uri, "docs", partial, "retrieve")[0].count() == 52

    # maintenance changes no document: the mark follows it to the version it makes
    s.mark_complete()
    s.maintain(10**9, timedelta(hours=1), changed=True)
    assert s.version > partial and s.complete_version() == s.version
    # a restore of a complete (tagged) version is complete; of another one, not
    s.tag("index-20261127T000000000000Z", first)
    restored = s.restore(first)
    assert s.complete_version() == restored and s.count() == 50
    _more(s, ["y1"])
    unmarked = s.version
    s.restore(unmarked)
    assert s.complete_version() == restored < s.version

    # a table from before the mark: its newest tagged version, said so
    s.table.tags.delete(COMPLETE_TAG)
    tagged = max(int(v["version"]) for v in s.table.tags.list().values())
    read, note = open_readable(s.uri, "docs", None, "retrieve")
    assert read.version == tagged and note.startswith("retrieve: table 'docs' has no completion mark") and f"reading v{tagged}" in note


def _docs(ids: list[str], seed: int, text: str = "apple banana") -> pa.Table:
    v = np.random.default_rng(seed).normal(size=(len(ids), 8)).astype(np.float32)
    return pa.table({"doc_id": ids, "title": [None] * len(ids), "text": [f"{text} {d}" for d in ids], "metadata": [None] * len(ids),
                     "content_hash": [f"{text}-{seed}"] * len(ids), "vector": to_fixed_size_list(v / np.linalg.norm(v, axis=1, keepdims=True))})


def test_stored_hashes_are_looked_up_per_batch_in_the_version_a_run_started_from(store):
    """The index job's change detection: a batch's ids -> their stored hashes, read from the
    pinned version (the run's own writes are not seen), through a picklable handle an embedding
    actor opens itself; every stored id in batches, for the anti-join."""
    import pickle

    from logicrank.pipelines.operations.indexing import StoredHashes

    s, _ = store
    lookup = StoredHashes(s.uri, s.name, s.version)
    _ = lookup(pa.array(["d1"]))  # opened; a pickled copy opens its own
    s.upsert(_docs(["d3", "new"], seed=1, text="edited"))  # what the run writes after it started
    got = pickle.loads(pickle.dumps(lookup))(pa.array(["d3", "d3", "new", None, "d7"]))
    assert sorted(got.to_pylist(), key=lambda r: r["doc_id"]) == [{"doc_id": "d3", "content_hash": "h"}, {"doc_id": "d7", "content_hash": "h"}]
    lookup.reembed = True  # the embedding code changed: every stored document reads as changed
    assert set(lookup(pa.array(["d3", "new"])).column("content_hash").to_pylist()) == {""}
    assert lookup.count() == 50 and sum(len(b) for b in lookup.ids(batch_rows=16)) == 50
    none = StoredHashes(s.uri, s.name, None)  # no table when the run started
    assert none(pa.array(["d3"])).num_rows == 0 and none.count() == 0 and list(none.ids()) == []


def test_ids_are_deleted_a_batch_at_a_time_by_expression(store):
    s, _ = store
    v = s.version
    assert s.delete_ids([pa.array([], pa.string())]) == 0 and s.version == v  # nothing to delete: no commit
    assert s.delete_ids([pa.array(["d1", "d2", "nope"]), pa.array(["d3' OR '1'='1"]), pa.array(["d4"])]) == 3
    assert s.count() == 47 and s.version == v + 3  # one commit per batch; an id is never read as SQL


@pytest.fixture
def ann_store(tmp_path):
    s = DocStore(str(tmp_path / "ann"))
    s.open_or_create(8, "gen")
    s.upsert(_docs([f"d{i}" for i in range(300)], seed=0))
    return s


def _ann_parts(s: DocStore) -> int:
    return int(s.table.index_stats(next(i.name for i in s.table.list_indices() if "vector" in i.columns)).num_indices)


def test_the_ann_index_is_built_only_when_asked_and_then_updated_in_place(ann_store, monkeypatch):
    """Re-index without rebuilding: no ANN index unless asked (None); once built, changed
    rows become a small delta index (never a rebuild), the deltas are merged past
    MAX_DELTAS (never into the first index), a missing index is built alone, and a
    rebuild happens when asked."""
    from logicrank.pipelines.engines.store import writing

    s = ann_store
    first = s.maintain(None, timedelta(days=1))
    assert first["indexes_rebuilt"] == ["doc_id", "text", "title"] and not s.has_ann_index() and first["deltas"] == {"text": 0, "title": 0}
    built = s.maintain(100, timedelta(days=1), changed=False)  # asked for: built alone
    assert built["indexes_rebuilt"] == ["vector"] and _ann_parts(s) == 1

    monkeypatch.setattr(writing, "MAX_DELTAS", 2)
    parts = []
    for night in range(1, 4):
        s.upsert(_docs([f"d{night}", f"n{night}"], seed=night, text="changed"))
        m = s.maintain(100, timedelta(days=1))
        assert m["indexes_rebuilt"] == [] and m["indexes_updated"] == ["doc_id", "text", "title", "vector"], m
        assert set(m["unindexed_rows"].values()) == {0} and {"doc_id", "text", "title", "vector"} <= set(m["seconds"])
        parts.append(_ann_parts(s))
    assert parts == [2, 3, 2]  # a delta each night; the third merged the two deltas with its own, the first index kept
    assert m["deltas"] == {"text": 1, "title": 1, "vector": 1}  # the full-text indexes too

    s.upsert(_docs(["n9"], seed=9))  # with ann off, an existing ANN index is still kept up to date
    assert s.maintain(None, timedelta(days=1))["indexes_updated"] == ["doc_id", "text", "title", "vector"]
    s.table.drop_index("text_idx")
    assert s.maintain(None, timedelta(days=1), changed=False)["indexes_rebuilt"] == ["text"]
    again = s.maintain(None, timedelta(days=1), changed=False, rebuild=True)
    assert again["indexes_rebuilt"] == ["doc_id", "text", "title", "vector"] and _ann_parts(s) == 1
    assert s.vector_search(np.ones((1, 8), np.float32), 5).num_rows == 5


def test_compaction_merges_the_small_fragments_and_leaves_a_big_one_that_lost_a_row(ann_store, monkeypatch):
    """A re-index replaces rows of the big fragment: at Lance's default target (1M rows) that
    fragment fell under it, and once it shared its indexes with a small one (after a
    rebuild), the next run rewrote it whole with them; now only small fragments merge."""
    from logicrank.pipelines.engines.store import writing

    monkeypatch.setattr(writing, "COMPACT_TARGET_ROWS", 100)
    s = ann_store
    s.upsert(_docs(["m0", "m1"], seed=1))
    s.maintain(None, timedelta(days=1), rebuild=True)  # every fragment under the same indexes
    frags = s.table.to_lance().get_fragments()
    assert [f.count_rows() for f in frags] == [300, 2]
    s.upsert(_docs(["d5", "m0", "m2"], seed=2, text="changed"))  # a row of each replaced, one new
    m = s.maintain(None, timedelta(days=1))
    after = s.table.to_lance().get_fragments()
    assert after[0].fragment_id == frags[0].fragment_id and after[0].count_rows() == 299, m  # not rewritten
    assert sum(f.count_rows() for f in after) == 303 and set(m["unindexed_rows"].values()) == {0}


def test_the_bm25_index_is_saved_in_a_child_process_only_for_a_large_table(tmp_path, monkeypatch):
    """``update_index_apart``: a table below ``apart_from_rows`` is patched in the caller (no
    child's start-up for a small table), one at or above it in a child process; both save the
    same index and report it as the same plain JSON values."""
    import subprocess

    from logicrank.pipelines.engines.store import update_index_apart

    children = []
    run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: children.append(a[0]) or run(*a, **k))
    done = {}
    for name, apart_from_rows in (("here", 51), ("child", 50)):
        s = DocStore(str(tmp_path / name))
        s.open_or_create(8, "gen")
        s.upsert(pa.table({"doc_id": [f"d{i}" for i in range(50)], "title": [None] * 50,
                           "text": [f"apple banana {i}" if i % 2 else f"cherry {i}" for i in range(50)], "metadata": [None] * 50,
                           "content_hash": ["h"] * 50, "vector": to_fixed_size_list(np.eye(50, 8, dtype=np.float32))}))
        done[name] = update_index_apart(s, apart_from_rows=apart_from_rows)
        assert set(done[name].pop("seconds")) == {"analyze_segment", "merge_segments", "weigh_segment", "assemble"}  # each step's time
        assert len(children) == (name == "child")
        assert update_index_apart(s, apart_from_rows=10**9) == {"how": "current", "version": s.version}  # saved: found by a later run
        assert len(children) == (name == "child")
    assert children[0][1:3] == ["-m", "logicrank.pipelines.engines.store.apart"]
    assert done["here"] == done["child"] and done["here"]["docs"] == 50 and isinstance(done["here"]["terms"], int)


def test_a_full_disk_while_saving_the_bm25_index_is_an_oserror_for_the_index_job(store, monkeypatch):
    """In the caller as in the child (exit 3, pipelines/engines/store/apart.py), an OSError while
    saving the index reaches the index job as an OSError, which it records as a failed index
    (the table is done; readers build the index on first use)."""
    import logicrank.pipelines.engines.bm25 as bm25
    from logicrank.pipelines.engines.store import update_index_apart

    def full(_store):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bm25, "update_index", full)
    with pytest.raises(OSError, match="No space left on device") as info:
        update_index_apart(store[0])
    assert info.value.errno == 28


def test_the_table_is_maintained_in_a_child_process_only_when_large_and_the_caller_follows_it(tmp_path, monkeypatch):
    """``maintain_apart``: a table below ``apart_from_rows`` is maintained in the caller, one at
    or above it in a child process (LanceDB's compaction and index builds keep what they held
    in the process that ran them). Both give the same summary as plain JSON values; the
    caller's store then reads the version the child made, and the completion mark moved with
    it, as in-process maintenance moves it."""
    import subprocess

    from logicrank.pipelines.engines.store import maintain_apart

    children = []
    run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: children.append(a[0]) or run(*a, **k))
    done, versions = {}, {}
    for name, apart_from_rows in (("here", 61), ("child", 60)):
        s = DocStore(str(tmp_path / name))
        s.open_or_create(8, "gen")
        for part in range(3):  # three small fragments for compaction to merge
            ids = range(part * 20, part * 20 + 20)
            s.upsert(pa.table({"doc_id": [f"d{i}" for i in ids], "title": [None] * 20, "text": [f"apple {i}" for i in ids],
                               "metadata": [None] * 20, "content_hash": ["h"] * 20,
                               "vector": to_fixed_size_list(np.eye(20, 8, dtype=np.float32))}))
        s.mark_complete()
        before = s.version
        done[name] = maintain_apart(s, None, timedelta(0), apart_from_rows=apart_from_rows)  # every untagged older version pruned
        assert len(children) == (name == "child")
        assert s.version > before and s.version == DocStore(str(tmp_path / name)).version  # the caller follows the child's commits
        assert s.complete_version() == s.version and s.count() == 60
        versions[name] = s.version
        done[name].pop("seconds")
        assert done[name].pop("bytes_pruned") > 0  # (its manifests name the table's path: "here" and "child" differ in length)
        again = maintain_apart(s, None, timedelta(0), changed=False, apart_from_rows=apart_from_rows)  # the nightly's: nothing to do
        assert s.version == versions[name] and again["fragments_removed"] == 0 and again["indexes_rebuilt"] == [], again
    assert children[0][1:4] == ["-m", "logicrank.pipelines.engines.store.apart", "maintain"] and len(children) == 2
    assert done["here"] == done["child"] and versions["here"] == versions["child"]
    assert done["here"]["fragments_removed"] == 3 and done["here"]["indexes_rebuilt"] == ["doc_id", "text", "title"]
    assert done["here"]["versions_pruned"] > 0 and done["here"]["versions_left"] == 1  # the newest: the complete mark names it


def test_a_user_error_in_the_maintaining_child_is_the_stores_one_line(store, monkeypatch):
    """A table the child cannot open (gone since the caller looked, here never there) is the
    store's StoreError in the caller, as in process, not a bare failure of the child."""
    from logicrank.pipelines.engines.store import maintain_apart

    s, _ = store
    gone = DocStore(s.uri, "missing")
    monkeypatch.setattr(DocStore, "count", lambda self: 10**9)  # large: maintained in the child
    with pytest.raises(StoreError, match="no table 'missing'"):
        maintain_apart(gone, None, timedelta(days=1))


def test_the_child_ends_when_its_caller_is_killed(tmp_path):
    """The child writes under its caller's table lock, which a killed caller lets go: it must
    not go on writing without it (pipelines/engines/store/apart.py, ``die_with_parent``)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    caller = ("import subprocess, sys; "
              "child = subprocess.Popen([sys.executable, '-c', 'import os, time; from logicrank.pipelines.engines.store.apart import "
              "die_with_parent; die_with_parent(os.getppid()); print(os.getpid(), flush=True); time.sleep(3600)'], stdout=subprocess.PIPE, text=True); "
              "print(child.stdout.readline().strip(), flush=True); child.wait()")
    proc = subprocess.Popen([sys.executable, "-c", caller], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(proc.stdout.readline()))  # the child is running, its parent-death signal asked for
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    def ended() -> bool:  # gone, or a zombie its new parent has not reaped yet
        try:
            return child.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    while not ended():  # (a child that outlives its caller sleeps past pytest's timeout, 1800 s: the test fails)
        time.sleep(0.05)


def test_upsert_commits_what_a_keyed_merge_commits_in_one_version(tmp_path):
    """``upsert`` (its own Update commit) against LanceDB's keyed merge (``merge_insert``) on a
    twin table, upsert after upsert: rows replaced across fragments, every row of one fragment
    (the fragment removed), a row replaced twice, new ids, only new ids; the same rows after each, one version
    per upsert, and the id index still finds every stored row. Ids repeated in one upsert are
    refused with nothing written."""
    import pyarrow.compute as pc

    from logicrank.schemas.tables import as_stored

    def dated(t: pa.Table) -> pa.Table:  # the same write time in both tables
        return t.append_column("indexed_at", pa.array([0] * t.num_rows, pa.timestamp("us", tz="UTC")))

    ours, twin = DocStore(str(tmp_path / "ours")), DocStore(str(tmp_path / "twin"))
    for s in (ours, twin):
        s.open_or_create(8, "gen")
        for lo in (0, 40, 80):  # three fragments of 40 rows
            s.append(dated(_docs([f"d{i}" for i in range(lo, lo + 40)], seed=lo)))
        s.build_indexes(ann_threshold=10**9)
    rounds = [
        [f"d{i}" for i in (1, 41, 42, 99)] + ["n0"],
        [f"d{i}" for i in range(40, 80)],  # the whole second fragment
        ["d1", "n0", "n1"],  # rows the first round wrote, replaced again
        ["n2", "n3"],  # only new ids
    ]
    for r, (ids, rows_after) in enumerate(zip(rounds, (121, 121, 122, 124), strict=True), start=1):
        rows = dated(_docs(ids, seed=100 + r, text=f"round {r}"))
        before = ours.version
        ours.upsert(rows)
        twin.table.merge_insert("doc_id").when_matched_update_all().when_not_matched_insert_all().execute(as_stored(rows, twin.table.schema))
        assert ours.version == before + 1
        got, want = (s.table.to_arrow().sort_by("doc_id") for s in (ours, twin))
        assert got.column_names == want.column_names and got.num_rows == want.num_rows == rows_after
        for name in got.column_names:
            assert got.column(name).equals(want.column(name)), (r, name)
    fragment_ids = [f.fragment_id for f in ours.table.to_lance().get_fragments()]
    assert 1 not in fragment_ids and 0 in fragment_ids and 2 in fragment_ids  # the second fragment, wholly replaced, removed
    found = ours.table.to_lance().to_table(columns=["doc_id", "text"], filter=pc.field("doc_id").isin(["d1", "d50", "d99", "n1", "d7"]))
    assert dict(zip(*(found.column(c).to_pylist() for c in ("doc_id", "text")), strict=True)) == {
        "d1": "round 3 d1", "d50": "round 2 d50", "d99": "round 1 d99", "n1": "round 3 n1", "d7": "apple banana d7"}
    version = ours.version
    with pytest.raises(ValueError, match="repeated"):
        ours.upsert(_docs(["d2", "d2"], seed=9))
    assert ours.version == version and ours.table.count_rows() == 124


def test_when_a_version_was_made_reads_the_same_in_every_time_zone(store, monkeypatch):
    store, _ = store
    """``version_made`` (a generate run's claim holds it) and the version's stamp (a saved
    index's and the stage cache's key) read the same in every zone: LanceDB's own time is local
    time, so a process in another zone took the BM25 index a UTC job saved for another table's,
    rebuilt it and replaced it under its readers."""
    import time

    from logicrank.pipelines.engines import bm25

    made, stamps, saves = {}, {}, {}
    for tz in ("UTC", "America/New_York"):
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        made[tz] = store.version_made()
        stamps[tz] = store.version_stamps()
        again = DocStore(store.uri, store.name)  # a new process's store: nothing memoised
        saves[tz] = json.loads((bm25.open_index(again).path / "meta.json").read_text())["save_id"]
    monkeypatch.undo()
    time.tzset()
    assert made["UTC"] > 0 and made["UTC"] == pytest.approx(made["America/New_York"], abs=1e-6)
    assert stamps["UTC"] == stamps["America/New_York"] and stamps["UTC"][store.version].endswith("Z")
    assert saves["UTC"] == saves["America/New_York"]  # opened, not rebuilt


def test_the_embedding_codes_record_is_the_versions_and_a_tables_older_tag_is_read_once(store):
    """The digest of the code that made a version's vectors lives in that version's schema (a
    restored version brings back its own); a table indexed before holds it as a tag, read
    until the next record replaces it. The record changes only the schema's own key."""
    from logicrank.pipelines.engines.store.versions import EMBEDDED_BY, UNKNOWN_EMBEDDED_BY

    s = DocStore(store[0].uri)
    assert s.embedded_by() is None  # (a table made with no record)
    before_records = s.version
    s.tag(EMBEDDED_BY + "old")
    assert DocStore(store[0].uri).embedded_by() == "old"
    s.mark_embedded_by("new")
    s = DocStore(store[0].uri)
    marked = s.version
    assert s.embedded_by() == "new" and not [t for t in s.table.tags.list() if t.startswith(EMBEDDED_BY)]
    assert s.model_id() == "gen" and s.count() == 50
    s.mark_embedded_by("new")
    assert DocStore(store[0].uri).version == marked  # the same record: no new version
    s.mark_embedded_by("newer")
    s.restore(marked)
    assert DocStore(store[0].uri).embedded_by() == "new"
    # a version from before the first record (its older tag dropped since): the making of its vectors
    # is unknown, never None (which would let the next run reuse them)
    s.restore(before_records)
    assert DocStore(store[0].uri).embedded_by() == UNKNOWN_EMBEDDED_BY and DocStore(store[0].uri).count() == 50


def test_a_store_that_writes_searches_its_new_version_not_the_index_it_opened_before(tmp_path):
    """A DocStore opens its BM25 index and its vectors once; an upsert or a delete through the
    same object moves it to a new version, and its search must be that version's (a notebook's
    store searched the old index after a write: the deleted document back, the new one missing,
    under the new version's stage keys)."""
    from logicrank.pipelines.retrieval.methods.bm25 import bm25

    store = DocStore(str(tmp_path / "db"))
    store.open_or_create(4, "gen")

    def put(ids, texts):
        store.upsert(pa.table({"doc_id": ids, "title": [None] * len(ids), "text": texts, "metadata": [None] * len(ids),
                               "content_hash": texts, "vector": to_fixed_size_list(np.eye(4, dtype=np.float32)[: len(ids)])}))

    put(["a", "b", "c"], ["apple pie", "banana bread", "cherry tart"])
    queries = pa.table({"query_id": ["q1", "q2"], "text": ["apple", "durian"]})
    assert bm25(queries, store, 10).column("doc_id").to_pylist() == ["a"]
    assert len(store.vectors()) == 3
    store.delete_ids([pa.array(["a"])])
    put(["d"], ["durian apple smoothie"])
    assert store.bm25_index().version == store.version
    assert bm25(queries, store, 10).select(["query_id", "doc_id"]).to_pylist() == [{"query_id": "q1", "doc_id": "d"}, {"query_id": "q2", "doc_id": "d"}]
    assert sorted(store.vectors().ids.to_pylist()) == ["b", "c", "d"]
