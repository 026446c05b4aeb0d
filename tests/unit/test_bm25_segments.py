"""The BM25 index built in segments (pipelines/engines/bm25/segments.py) saves the same files,
array for array, as the build in one scan: on a real LanceDB table, with segments of a few
documents, tasks run in any order, and documents with no title, no text or only stop words."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from logicrank.pipelines.engines import bm25
from logicrank.pipelines.engines.bm25 import index, segments, storage
from logicrank.pipelines.engines.embed import to_fixed_size_list
from logicrank.pipelines.engines.store import DocStore
from tests.conftest import scifact_docs


def _table(path, docs: list[dict]) -> DocStore:
    store = DocStore(str(path))
    store.open_or_create(4, "gen")
    n = len(docs)
    store.upsert(pa.table({
        "doc_id": [d["_id"] for d in docs], "title": [d.get("title") for d in docs], "text": [d.get("text") for d in docs],
        "metadata": [None] * n, "content_hash": [f"h{i}" for i in range(n)],
        "vector": to_fixed_size_list(np.random.default_rng(0).normal(size=(n, 4)).astype(np.float32)),
    }))
    return store


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    out = scifact_docs(70, text_chars=200)
    out[3]["title"] = None  # no title
    out[10]["text"] = ""  # no text
    out[11] = {"_id": "stop", "title": "the of and", "text": "a an the"}  # only stop words: no tokens at all
    out[40]["text"] = out[40]["text"] + " zyxwvut"  # a term first seen in a later segment
    return out


def _saved(path) -> dict:
    """Every array and table of a saved index, by file."""
    out = {name: np.load(path / "search" / f"{name}.npy") for name in ("indptr", "indices", "data", "idf", "tiebreak", "rows_by_rank")}
    out["doc_ids"] = pa.ipc.open_file(pa.memory_map(str(path / "search" / "doc_ids.arrow"))).read_all().column("doc_id").to_pylist()
    for name in ("docs", "vocab"):
        out[name] = pq.read_table(path / f"{name}.parquet").replace_schema_metadata(None).to_pydict()
    for name in ("title", "text"):
        with np.load(path / f"{name}.npz") as z:  # the archive's arrays as saved, dtypes included
            out[name] = {k: z[k] for k in z.files}
    with np.load(path / "stats.npz") as z:
        assert str(z["save_id"]) == json.loads((path / "meta.json").read_text())["save_id"]
        out["stats"] = {k: z[k] for k in z.files if k != "save_id"}
    meta = json.loads((path / "meta.json").read_text())
    out["meta"] = {k: v for k, v in meta.items() if k != "save_id"}
    return out


def _assert_same(a: dict, b: dict) -> None:
    assert a["meta"] == b["meta"]
    for name in ("indptr", "indices", "data", "idf", "tiebreak", "rows_by_rank"):
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert np.array_equal(a[name], b[name]), name  # bit for bit: the same arithmetic on the same numbers
    for name in ("doc_ids", "docs", "vocab"):
        assert a[name] == b[name], name
    for name in ("title", "text", "stats"):
        assert sorted(a[name]) == sorted(b[name]), name
        for k in a[name]:
            assert a[name][k].dtype == b[name][k].dtype and np.array_equal(a[name][k], b[name][k]), (name, k)


@pytest.mark.parametrize("segment_rows", [16, 7, 1000])
def test_a_build_in_segments_saves_the_arrays_of_a_build_in_one_scan(tmp_path, docs, monkeypatch, segment_rows):
    store = _table(tmp_path / "db", docs)
    monkeypatch.setattr(storage, "SEGMENT_ROWS", segment_rows)
    whole = bm25.BM25Index.build(store.scan(bm25.SOURCE_COLUMNS, batch_rows=5), store.version, stamp=store.version_stamp())
    whole.save(tmp_path / "whole")

    def backwards(step, args):  # the tasks of each step in reverse order: each writes only its own files
        return list(reversed([step(*a) for a in reversed(args)]))

    done = segments.build(store, tmp_path / "segmented", run=backwards)
    assert done["segments"] == -(-len(docs) // segment_rows) and done["analyzed"] == len(docs) and done["terms"] == len(whole.vocab)
    _assert_same(_saved(tmp_path / "segmented"), _saved(tmp_path / "whole"))
    assert not list(tmp_path.glob(".segmented-*"))  # the work directory is removed

    queries = ["vitamin D deficiency", "zyxwvut", "the of and", "cancer cells"]
    mapped = bm25.MappedBM25.open(tmp_path / "segmented", store.version_stamp())
    for (rows_a, scores_a), (rows_b, scores_b) in zip(mapped.search(queries, 10), whole.search(queries, 10), strict=True):
        assert rows_a.tolist() == rows_b.tolist() and scores_a.tolist() == scores_b.tolist()


def test_a_step_run_twice_saves_the_same_index(tmp_path, docs, monkeypatch):
    """Ray runs a task again when its worker dies: every step, run twice over its own output
    (each task, then all of them once more), gives the index of a single run."""
    store = _table(tmp_path / "db", docs)
    monkeypatch.setattr(storage, "SEGMENT_ROWS", 16)
    segments.build(store, tmp_path / "once")

    def twice(step, args):
        [step(*a) for a in args]
        return [step(*a) for a in args]

    segments.build(store, tmp_path / "twice", run=twice)
    _assert_same(_saved(tmp_path / "twice"), _saved(tmp_path / "once"))


def test_term_ids_follow_the_documents_order_whatever_the_batches(tmp_path, docs):
    store = _table(tmp_path / "db", docs)
    a, b = (bm25.BM25Index.build(store.scan(bm25.SOURCE_COLUMNS, batch_rows=n), store.version) for n in (3, 8192))
    assert a.vocab.terms == b.vocab.terms and (a.title != b.title).nnz == 0 and (a.text != b.text).nnz == 0


def test_field_counts_number_terms_by_first_appearance_and_count_them_per_document():
    """Ids by first appearance, document by document and title before text, after the terms the
    vocabulary already holds; each row's terms sorted by id with their counts; documents with
    no title, an empty text or only stop words and tokens too long give empty rows."""
    vocab = bm25.Vocabulary(["cell"])
    titles = ["Zebra cells", None, "the of " + "x" * 40, "zebra"]  # (a token of 40 bytes or more is dropped)
    texts = ["apple zebra apple cell", "mango", "", "apple apple mango kiwi"]
    title, text = index.field_counts([titles, texts], vocab, bm25.default_analyzer())
    assert vocab.terms == ["cell", "zebra", "appl", "mango", "kiwi"]
    expected_title = [{1: 1, 0: 1}, {}, {}, {1: 1}]
    expected_text = [{2: 2, 1: 1, 0: 1}, {3: 1}, {}, {2: 2, 3: 1, 4: 1}]
    for m, expected in ((title, expected_title), (text, expected_text)):
        assert m.shape == (4, 5) and m.indices.dtype == np.int32 and m.data.dtype == np.int32
        for row, want in enumerate(expected):
            got = m.indices[m.indptr[row] : m.indptr[row + 1]]
            assert got.tolist() == sorted(want)  # sorted by id
            assert m.data[m.indptr[row] : m.indptr[row + 1]].tolist() == [want[t] for t in sorted(want)]
    empty = index.field_counts([[], []], bm25.Vocabulary(), bm25.default_analyzer())
    assert [m.shape for m in empty] == [(0, 0), (0, 0)]


def test_codes_in_order_of_first_appearance_whichever_way_they_are_numbered():
    """Arrow's dictionary numbers entries as met (one pass checks it); codes numbered otherwise
    are ordered by a sort."""
    assert index.first_appearance(np.array([0, 1, 0, 2, 1, 3])).tolist() == [0, 1, 2, 3]
    assert index.first_appearance(np.array([2, 0, 2, 3, 1, 0])).tolist() == [2, 0, 3, 1]
    assert index.first_appearance(np.array([1, 1, 0])).tolist() == [1, 0]
    assert index.first_appearance(np.array([], np.int32)).tolist() == []


def test_update_index_builds_in_segments_then_patches(tmp_path, docs, monkeypatch):
    monkeypatch.setattr(storage, "SEGMENT_ROWS", 16)
    store = _table(tmp_path / "db", docs)
    calls = []

    def run(step, args):
        calls.append((step.__name__, len(args)))
        return [step(*a) for a in args]

    first = bm25.update_index(store, run=run)
    assert first["how"] == "built" and first["segments"] == 5 and first["docs"] == 70
    assert calls == [("analyze_segment", 5), ("merge_segments", 1), ("weigh_segment", 5), ("assemble", 4)]
    store.upsert(pa.table({"doc_id": ["new"], "title": ["t"], "text": ["a brand new zyxwvut document"], "metadata": [None],
                           "content_hash": ["hn"], "vector": to_fixed_size_list(np.ones((1, 4), np.float32))}))
    calls.clear()
    second = bm25.update_index(store, run=run)
    assert second["how"] == "patched" and second["analyzed"] == 1 and second["kept"] == 70 and second["segments"] == 5
    assert calls == [("plan_patch", 1), ("count_dropped", 1), ("analyze_segment", 1), ("merge_segments", 1), ("weigh_segment", 5), ("assemble", 4)]


def test_segment_ranges():
    assert segments.ranges(0, 4) == [(0, 0)]
    assert segments.ranges(9, 4) == [(0, 4), (4, 8), (8, 9)]
    assert segments.ranges(8, 4) == [(0, 4), (4, 8)]


def _edit(store: DocStore, docs: list[dict], changed: int, added: int, deleted: int, at: Sequence[int] | None = None,
          deleted_at: Sequence[int] = ()) -> None:
    """``changed`` documents given another text (the first of them a term no document had; the
    ten after the tenth, or those at ``at``), ``added`` new ones, ``deleted`` of the rest removed
    (from the thirtieth on) and those at ``deleted_at``: one upsert, one delete, as a re-index."""
    n = changed + added
    edited = [docs[i] for i in at] if at is not None else docs[10 : 10 + changed]
    assert len(edited) == changed
    rows = [dict(d, text=f"{d.get('text') or ''} revised{' brandnewterm' if i == 0 else ''}") for i, d in enumerate(edited)]
    rows += [{"_id": f"added{i}", "title": f"Added {i}", "text": f"an added document about vitamin {i} and brandnewterm"} for i in range(added)]
    store.upsert(pa.table({
        "doc_id": [d["_id"] for d in rows], "title": [d.get("title") for d in rows], "text": [d.get("text") for d in rows],
        "metadata": [None] * n, "content_hash": [f"e{i}" for i in range(n)],
        "vector": to_fixed_size_list(np.ones((n, 4), np.float32)),
    }))
    gone = {d["_id"] for d in docs[30 : 30 + deleted]} | {docs[i]["_id"] for i in deleted_at}
    store.delete_absent(pa.array([d["_id"] for d in docs if d["_id"] not in gone] + [d["_id"] for d in rows[changed:]]))


def _backwards(step, args):  # the tasks of each step in reverse order
    return list(reversed([step(*a) for a in reversed(args)]))


def _twice(step, args):  # every task run twice, as Ray reruns a task whose worker died
    [step(*a) for a in args]
    return [step(*a) for a in args]


RUNS_OF_EDITS = {"changed": 3, "added": 20, "deleted": 6}, (61, 9, 23, 84)  # edits, then (kept, dropped, analyzed, docs)
SPREAD_EDITS = {"changed": 3, "added": 20, "deleted": 0, "at": [2, 35, 68]}, (67, 3, 23, 90)  # few dropped rows far apart: gathered
# 42 of rows 16 to 63 dropped, every eighth kept: at 4 rows a segment, some segments' kept rows are
# few among those between them (their counts gathered, row by row, into the new index)
SPARSE_KEPT = {"changed": 3, "added": 2, "deleted": 0, "at": [2, 3, 4], "deleted_at": [i for i in range(16, 64) if i % 8]}, (25, 45, 5, 30)


@pytest.mark.parametrize(("segment_rows", "run", "statistics", "edits"), [
    (16, _backwards, "saved", RUNS_OF_EDITS), (7, _backwards, "saved", RUNS_OF_EDITS), (7, _twice, "saved", RUNS_OF_EDITS),
    (7, _backwards, "absent", RUNS_OF_EDITS), (16, _backwards, "saved", SPREAD_EDITS), (4, _backwards, "saved", SPARSE_KEPT),
], ids=["16-backwards", "7-backwards", "7-twice", "7-backwards-counted", "16-backwards-spread", "4-backwards-sparse-kept"])
def test_a_patch_saves_the_arrays_of_a_build_over_the_same_rows(tmp_path, docs, monkeypatch, segment_rows, run, statistics, edits):
    """The patch keeps the earlier index's rows whose document is unchanged, in their order, then
    the table's new and changed ones in its order, and its vocabulary's ids: its saved arrays
    equal those of a build over those rows whose vocabulary starts from the saved one. Tasks in
    reverse order, or each run twice; at 7 rows a segment mixes kept and new rows, and new rows
    from two analyzed segments (of 7 // 8 = 1 row each: every new row its own task). The kept
    rows' statistics: the saved ones less the dropped rows', or (an index saved without them)
    counted from the kept rows; dropped rows in runs, or few and far apart."""
    monkeypatch.setattr(storage, "SEGMENT_ROWS", segment_rows)
    store = _table(tmp_path / "db", docs)
    assert bm25.update_index(store)["how"] == "built"
    before = bm25.index_root(store) / f"v{store.version}"
    if statistics == "absent":
        (before / "stats.npz").unlink()
    old = pq.read_table(before / "docs.parquet").to_pydict()
    old_terms = pq.read_table(before / "vocab.parquet").column("term").to_pylist()
    _edit(store, docs, **edits[0])
    store = DocStore(str(tmp_path / "db"), version=store.table.version)

    done = bm25.update_index(store, run=run)
    assert (done["how"], done["kept"], done["dropped"], done["analyzed"], done["docs"]) == ("patched", *edits[1])
    assert done["kept_statistics"] == {"saved": "saved less dropped", "absent": "counted"}[statistics]

    pairs = set(zip(*store.hashes().to_pydict().values(), strict=True))
    kept = [d for d, h in zip(old["doc_id"], old["content_hash"], strict=True) if (d, h) in pairs]
    fresh = [d for d, h in zip(*store.hashes().to_pydict().values(), strict=True) if (d, h) not in set(zip(old["doc_id"], old["content_hash"], strict=True))]
    assert (len(kept), len(fresh)) == (edits[1][0], edits[1][2])
    rows = store.rows_for(kept + fresh, bm25.SOURCE_COLUMNS[1:]).select(bm25.SOURCE_COLUMNS)
    order = pa.compute.index_in(pa.array(kept + fresh), value_set=rows.column("doc_id"))
    whole = bm25.BM25Index.build(rows.take(order).to_batches(max_chunksize=5), store.version, stamp=store.version_stamp(),
                                 vocab=bm25.Vocabulary(old_terms))
    whole.save(tmp_path / "whole")
    patched = bm25.index_root(store) / f"v{store.version}"
    _assert_same(_saved(patched), _saved(tmp_path / "whole"))
    assert "brandnewterm" in whole.vocab.ids and len(whole.vocab) > len(old_terms)
    assert not list(patched.parent.glob(".*"))  # the work directory is removed


def test_a_patched_index_bounds_scores_as_a_build_of_the_same_table(tmp_path, docs, monkeypatch):
    """A patch keeps the terms of the documents it removed (their ids stay), with no document
    and the largest idf. ITLR's saturation calibration divides a term's score by the text's
    largest possible score (``score_bounds``): counting such a term there scaled a re-indexed
    table's scores down by orders of magnitude. A patched index bounds every text as a build
    of the same table does, and scores it the same."""
    monkeypatch.setattr(storage, "SEGMENT_ROWS", 16)
    store = _table(tmp_path / "db", docs)
    assert bm25.update_index(store)["how"] == "built"
    gone = docs[40]  # the one document with "zyxwvut"
    store.delete_absent(pa.array([d["_id"] for d in docs if d["_id"] != gone["_id"]]))
    store = DocStore(str(tmp_path / "db"), version=store.table.version)
    assert bm25.update_index(store)["how"] == "patched"
    patched = store.bm25_index()
    built = bm25.BM25Index.build(store.scan(bm25.SOURCE_COLUMNS), store.version)
    assert "zyxwvut" in patched.vocab.ids and "zyxwvut" not in built.vocab.ids
    texts = ["zyxwvut", "vitamin zyxwvut", "vitamin", "the of"]
    np.testing.assert_allclose(patched.score_bounds(texts), built.score_bounds(texts), rtol=1e-12, atol=0)
    assert patched.score_bounds(["zyxwvut"])[0] == 0
    np.testing.assert_allclose(patched.term_scores(texts).toarray(), built.term_scores(texts).toarray(), rtol=1e-6, atol=1e-7)


def test_a_patch_gives_way_to_a_build_when_most_documents_changed(tmp_path, docs, monkeypatch):
    monkeypatch.setattr(storage, "SEGMENT_ROWS", 16)
    store = _table(tmp_path / "db", docs)
    bm25.update_index(store)
    _edit(store, docs, changed=40, added=0, deleted=0)  # 40 of 70: over the patch's limit
    assert bm25.update_index(DocStore(str(tmp_path / "db"), version=store.table.version))["how"] == "built"


def _cut_short(archive, member: str) -> None:
    """Rewrite a saved counts archive with one member's data cut short, its header and the
    archive's directory whole (a file a crash cut and something else rewrote)."""
    import zipfile

    with zipfile.ZipFile(archive) as z:
        members = {name: z.read(name) for name in z.namelist()}
    members[member] = members[member][:-8]
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)


@pytest.mark.parametrize("member", ["data.npy", "indices.npy"])
def test_a_patch_gives_way_to_a_build_when_the_saved_counts_are_short(tmp_path, docs, monkeypatch, member):
    monkeypatch.setattr(storage, "SEGMENT_ROWS", 16)
    store = _table(tmp_path / "db", docs)
    bm25.update_index(store)
    first = bm25.index_root(store) / f"v{store.version}"
    assert storage.counts_meta(first) is not None
    _cut_short(first / "text.npz", member)
    assert storage.counts_meta(first) is None  # the member's size against its header's shape
    _edit(store, docs, changed=1, added=0, deleted=0)  # within the limit: a patch, were the counts whole
    done = bm25.update_index(DocStore(str(tmp_path / "db"), version=store.table.version))
    assert done["how"] == "built" and "patch_failed" not in done


def test_a_patch_that_fails_gives_way_to_a_build_and_says_why(tmp_path, docs, monkeypatch):
    monkeypatch.setattr(storage, "SEGMENT_ROWS", 16)
    store = _table(tmp_path / "db", docs)
    bm25.update_index(store)
    _edit(store, docs, changed=1, added=0, deleted=0)

    def broken(*args):
        raise OSError("disk gone")

    monkeypatch.setattr(segments, "count_dropped", broken)
    done = bm25.update_index(DocStore(str(tmp_path / "db"), version=store.table.version))
    assert done["how"] == "built" and done["patch_failed"] == "OSError: disk gone"
    assert not list(bm25.index_root(store).glob(".*"))  # the patch's work directory removed


@pytest.mark.parametrize("compressed", [False, True])
def test_saved_counts_are_mapped_as_scipy_wrote_them(tmp_path, compressed):
    m = sp.random(50, 30, density=0.2, format="csr", random_state=0, dtype=np.float64)
    m.data = np.rint(m.data * 10).astype(np.int32) + 1
    sp.save_npz(tmp_path / "title.npz", m, compressed=compressed)
    indptr, indices, data, shape = storage.map_counts(tmp_path, "title")
    assert shape == m.shape and isinstance(indices, np.memmap) != compressed
    assert np.array_equal(indptr, m.indptr) and np.array_equal(indices, m.indices) and np.array_equal(data, m.data)


def test_saved_statistics_are_read_only_whole_and_of_their_save(tmp_path):
    stats = {k: (np.arange(3, dtype=np.int64) if k.endswith("_df") else np.int64(2)) for k in storage.STATS_KEYS}
    storage.write_stats(tmp_path, stats, "save-a")
    got = storage.read_stats(tmp_path, {"terms": 3, "save_id": "save-a"})
    assert sorted(got) == sorted(storage.STATS_KEYS) and all(np.array_equal(got[k], stats[k]) for k in stats)
    assert storage.read_stats(tmp_path, {"terms": 3, "save_id": "save-b"}) is None  # another save's
    assert storage.read_stats(tmp_path, {"terms": 4, "save_id": "save-a"}) is None  # another vocabulary's
    (tmp_path / "stats.npz").write_bytes(b"damaged")
    assert storage.read_stats(tmp_path, {"terms": 3, "save_id": "save-a"}) is None


def test_a_plan_refuses_a_saved_index_that_repeats_a_document(tmp_path, docs):
    """A saved index holding a document twice is no earlier version of the table: the plan writes
    nothing and its counts do not add up to the table's rows (the patch gives way to a build)."""
    store = _table(tmp_path / "db", docs[:10])
    base, work = tmp_path / "base", tmp_path / "work"
    base.mkdir()
    work.mkdir()
    pq.write_table(store.hashes().select(["doc_id", "content_hash"]).take([0, 1, 2, 2]), base / "docs.parquet")
    counts = segments.plan_patch(segments.opener(store), str(base), str(work), 16)
    assert counts == {"docs": 11, "kept": 4, "fresh": 7, "repeated": False}
    assert not list(work.iterdir())


def _rows(ids: list[str], texts: list[str], hashes: list[str]) -> pa.Table:
    n = len(ids)
    return pa.table({"doc_id": ids, "title": [None] * n, "text": texts, "metadata": [None] * n, "content_hash": hashes,
                     "vector": to_fixed_size_list(np.ones((n, 4), np.float32))})


@pytest.mark.parametrize("kept_one", [False, True], ids=["both new", "one kept"])
def test_a_table_that_holds_a_doc_id_twice_is_built_not_patched(tmp_path, docs, monkeypatch, kept_one):
    """A table that holds one doc id in two rows (a store's ``append`` does not check): both new,
    or one kept from the saved index and one new. The patch read the new rows by id, so that one
    row was analyzed twice and the other lost; it gives way to a build, which indexes both rows as
    a build of the table does."""
    monkeypatch.setattr(storage, "SEGMENT_ROWS", 16)
    store = _table(tmp_path / "db", docs[:30])
    if kept_one:
        store.append(_rows(["dup"], ["apple banana"], ["x1"]))
    bm25.update_index(store)
    store.append(_rows(["dup"] if kept_one else ["dup", "dup"], ["zebra giraffe"] if kept_one else ["apple banana", "zebra giraffe"],
                       ["x2"] if kept_one else ["x1", "x2"]))
    again = DocStore(str(tmp_path / "db"), version=store.table.version)
    done = bm25.update_index(again)
    assert done["how"] == "built" and "patch_failed" not in done  # given way to, not failed
    built = bm25.BM25Index.build(again.scan(bm25.SOURCE_COLUMNS), again.version)
    saved = bm25.open_index(again)
    for query in ("zebra", "apple"):
        (rows, scores), (want_rows, want_scores) = saved.search([query], 5)[0], built.search([query], 5)[0]
        assert saved.doc_id_array().take(rows).to_pylist() == [built.doc_ids[r] for r in want_rows] == ["dup"]
        np.testing.assert_allclose(scores, want_scores, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_row_postings_take_the_rows_postings_whichever_way_they_are_read(dtype):
    """The rows' CSR, taken from the whole one's arrays, equals scipy's row selection: no rows,
    few rows far apart (gathered), most rows of a span (the span less the others) and every row
    of a span (the span itself), with the arrays in either index dtype."""
    m = sp.random(200, 50, density=0.2, format="csr", random_state=np.random.default_rng(7), dtype=np.float64)
    m.data = np.arange(1, m.nnz + 1, dtype=np.float64)  # each posting its own value: a misplaced one shows
    indptr, indices, data = m.indptr.astype(dtype), m.indices.astype(dtype), m.data.astype(dtype)
    for rows in ([], [3, 90, 170], [r for r in range(20, 120) if r % 10], list(range(40, 60)), [199]):
        out_indptr, take = segments.row_postings(indptr, np.array(rows, np.int64))
        want = m[np.array(rows, np.int64)] if rows else m[:0]
        assert out_indptr.tolist() == want.indptr.tolist(), rows
        assert np.asarray(take(indices)).tolist() == want.indices.tolist(), rows
        assert np.asarray(take(data)).tolist() == want.data.astype(np.int64).tolist(), rows


def test_counts_archives_sum_offsets_past_2_to_the_31st(tmp_path):
    """A block's offsets follow the postings of the blocks before it in int64, whatever the
    block's own indptr dtype: past 2**31 postings the archive's indptr is int64 and exact. (The
    blocks here give no postings, so only the archive's indptr is read back.)"""
    big = 2**31 - 5
    blocks = [lambda: (np.array([0, big], np.int64), lambda name: np.zeros(0, np.int32)),
              lambda: (np.array([0, 4, 9], np.int32), lambda name: np.zeros(0, np.int32))]
    segments.write_counts(tmp_path / "c.npz", blocks, (3, 10))
    with np.load(tmp_path / "c.npz") as z:
        assert z["indptr"].dtype == np.int64
        assert z["indptr"].tolist() == [0, big, big + 4, big + 9]


def _weights_by_scipy(title, text, idf, avgdl):
    """BM25 weights as a whole-array numpy and scipy computation gives them: the fields summed,
    each weight in float64 rounded to float32, the matrix transposed (the reference)."""
    tf = (title + text).tocsr()
    tf.sort_indices()
    dl = np.asarray(tf.sum(axis=1), np.float64).ravel()
    norm = index.K1 * (1 - index.B + index.B * dl / avgdl)
    row = np.repeat(np.arange(tf.shape[0]), np.diff(tf.indptr))
    f = tf.data.astype(np.float64)
    w = (idf[tf.indices] * (index.K1 + 1) * f / (f + norm[row])).astype(np.float32)
    return sp.csr_matrix((w, tf.indices, tf.indptr), shape=tf.shape).T.tocsr()


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_weights_equal_a_whole_array_computation(index_dtype):
    """The compiled passes give, posting for posting, the float32 weights a whole-array float64
    computation gives: documents with a title only, a text only, neither, a term in both fields,
    an explicit zero count (no posting), rows not sorted by term (sorted first)."""
    rng = np.random.default_rng(3)
    docs, terms = 2000, 300

    def counts(density):
        return sp.random(docs, terms, density=density, format="csr", random_state=rng, data_rvs=lambda n: rng.integers(1, 9, n)).astype(np.int32)

    title, text = counts(0.05), counts(0.2)
    title.data[::17] = 0  # stored zeros: a count of 0 makes no posting (scipy's sum drops it)
    text.data[text.indptr[5] : text.indptr[6]] = 0  # a document with no text (and some with no title)
    text.eliminate_zeros()
    for m in (title, text):  # rows in descending term order
        for r in range(docs):
            a, b = m.indptr[r], m.indptr[r + 1]
            m.indices[a:b], m.data[a:b] = m.indices[a:b][::-1].copy(), m.data[a:b][::-1].copy()
        m.has_sorted_indices = False
    df = np.maximum(np.bincount(title.indices, minlength=terms), np.bincount(text.indices, minlength=terms))
    idf = index.idf_of(docs, df)
    avgdl = (title.sum() + text.sum()) / docs
    want = _weights_by_scipy(title.copy(), text.copy(), idf, avgdl)
    for m in (title, text):  # int64: as scipy holds counts past 2**31 postings
        m.indptr, m.indices = m.indptr.astype(index_dtype), m.indices.astype(index_dtype)
    got = index.weigh(title, text, idf, avgdl)
    assert got.shape == (terms, docs) and got.indptr.dtype == np.int64 and got.has_sorted_indices
    assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
    assert got.data.dtype == np.float32
    np.testing.assert_allclose(got.data, want.data, rtol=1e-7, atol=0)  # within float32's rounding of one float64 computation
    # a document with no counts at all makes no posting
    empty = sp.csr_matrix((1, terms), dtype=np.int32)
    assert index.weigh(empty, empty.copy(), idf, avgdl).nnz == 0


def test_an_index_saved_over_while_open_is_refused_not_searched_with_another_saves_terms(tmp_path, docs):
    """A mapped index reads its vocabulary on first use, and a shard actor maps the index on
    its own: where another save took the directory's place meanwhile (its terms numbered
    otherwise), each refuses instead of mixing two saves' term ids and rows."""
    import shutil

    from logicrank.jobs.retrieve import ShardSearch

    store = _table(tmp_path / "db", docs)
    path = bm25.open_index(store).path
    mapped = bm25.MappedBM25.open(path)
    shard = ShardSearch(store.uri, store.name, store.version, "bm25", 0, 10, "float32", "auto", mapped.save_id)  # the driver's save: searches
    assert shard.index.save_id == mapped.save_id
    other = bm25.BM25Index.build([pa.record_batch({"doc_id": ["x"], "content_hash": ["h"], "title": [None], "text": ["zyxwvut alone"]})],
                                 store.version, stamp=store.version_stamp())
    shutil.rmtree(path)
    other.save(path)
    with pytest.raises(RuntimeError, match="changed or was damaged while open"):
        _ = mapped.vocab
    with pytest.raises(ValueError, match="analyzed for another index"):
        mapped.search_keys(other.query_matrix(["zyxwvut"]), 3)
    with pytest.raises(RuntimeError, match=r"was replaced during the job \(save [0-9a-f]+, the driver's " + mapped.save_id):
        ShardSearch(store.uri, store.name, store.version, "bm25", 0, 10, "float32", "auto", mapped.save_id)


def test_an_actor_refuses_a_table_made_again_under_the_drivers_version(tmp_path, docs):
    """The table dropped and made again during a retrieve reaches the driver's version number
    again: each actor (a search shard, a shard task, a retrieval actor) opened it without a
    word, and the run mixed two tables. An actor checks when its version was made against the
    driver's."""
    from logicrank.jobs.retrieve import ShardSearch, pinned

    store = _table(tmp_path / "db", docs)
    version, stamp = store.version, store.version_stamp()
    store.drop()
    again = _table(tmp_path / "db", docs[:5])
    assert again.version == version
    with pytest.raises(RuntimeError, match=rf"^retrieve: table 'docs' v{version} was made again during the job \(made .*, the driver's {stamp}\)"):
        pinned(store.uri, store.name, version, stamp)
    with pytest.raises(RuntimeError, match="was made again during the job"):
        ShardSearch(store.uri, store.name, version, "dense", 0, 5, "float32", "auto", None, stamp)
    assert pinned(store.uri, store.name, version, again.version_stamp()).count() == 5


def test_an_index_another_analyzer_made_is_rebuilt_not_searched_or_patched(tmp_path, docs, monkeypatch):
    """A saved index records its analyzer's digest (stop words, longest token, PyStemmer's
    version, the terms of a probe text, the analyzer's code): one saved under another analyzer
    is neither mapped for search (its terms are not the queries') nor patched (its counts are
    not), but rebuilt."""
    from logicrank.pipelines.engines.bm25 import analyzer
    from logicrank.pipelines.engines.bm25.analyzer import ENGLISH_STOP_WORDS, Analyzer, analyzer_digest

    assert analyzer_digest(Analyzer([*ENGLISH_STOP_WORDS, "apple"])) != analyzer_digest() == analyzer_digest(Analyzer())
    # an edit of the analyzer's code the probe text does not show (a letter folded that it lacks: a patch kept the old
    # terms of every document it did not analyze again, and "ŋaro" found nothing a rebuild finds) is another analyzer
    with monkeypatch.context() as m:
        m.setattr(analyzer, "_code_digest", lambda: "edited")
        assert analyzer_digest(Analyzer()) != analyzer_digest()
    store = _table(tmp_path / "db", docs)
    path = bm25.open_index(store).path
    meta = json.loads((path / "meta.json").read_text())
    assert meta["analyzer"] == analyzer_digest()
    (path / "meta.json").write_text(json.dumps({**meta, "analyzer": "another"}))  # as another analyzer saved it
    assert bm25.MappedBM25.open(path) is None and storage.counts_meta(path) is None and not storage.is_saved(path, meta["stamp"])
    store.upsert(pa.table({"doc_id": ["new"], "title": ["t"], "text": ["a brand new zyxwvut document"], "metadata": [None],
                           "content_hash": ["hn"], "vector": to_fixed_size_list(np.ones((1, 4), np.float32))}))
    done = bm25.update_index(store)
    assert done["how"] == "built" and done["docs"] == 71 and "patch_failed" not in done
    # an index another analyzer built in process, saved: its digest, not the project's, so no job searches it
    own = bm25.BM25Index.build(store.scan(bm25.SOURCE_COLUMNS), store.version, analyze=Analyzer([*ENGLISH_STOP_WORDS, "apple"]),
                               stamp=store.version_stamp())
    saved = own.save(tmp_path / "own")
    assert json.loads((saved / "meta.json").read_text())["analyzer"] == analyzer_digest(Analyzer([*ENGLISH_STOP_WORDS, "apple"]))
    assert bm25.MappedBM25.open(saved) is None


def test_pruning_removes_a_save_nothing_wrote_in_for_an_hour_not_one_in_progress(tmp_path, docs):
    """A build or patch in progress writes into its segments' subdirectories, whose parent's
    time does not move: a leftover is judged by the newest file under it."""
    import os
    import time

    store = _table(tmp_path / "db", docs)
    root = bm25.open_index(store).path.parent
    hour_ago = time.time() - 2 * 3600
    for name, fresh in ((".v9-segments-busy", True), (".v9-patch-dead", False)):
        (root / name / "s00001").mkdir(parents=True)
        (root / name / "s00001" / "title.npz").write_bytes(b"x")
        for p in (root / name / "s00001" / "title.npz", root / name / "s00001", root / name):
            if not fresh or p.is_dir():
                os.utime(p, (hour_ago, hour_ago))
    bm25.prune_indexes(store, keep_versions=[store.version])
    assert (root / ".v9-segments-busy").is_dir() and not (root / ".v9-patch-dead").exists()
    assert (root / f"v{store.version}").is_dir()


def test_a_save_renamed_into_place_while_another_checks_is_not_deleted(tmp_path, monkeypatch):
    """Two processes save one version: the second's rename lands while the first looks at
    the place (here: inside the first's check). Whichever save reached the place first stands,
    whole, and is never moved aside and deleted under the readers that opened it."""
    batch = pa.record_batch({"doc_id": ["a", "b"], "content_hash": ["h", "h"], "title": [None, None], "text": ["dog runs", "cat sleeps"]})
    index = bm25.BM25Index.build([batch], 1, stamp="s")
    ours, theirs = (storage.write_index(index, tmp_path / name) for name in ("ours", "theirs"))  # two whole saves
    path = tmp_path / "v1"  # nothing at the place yet
    save = lambda p: json.loads((p / "meta.json").read_text())["save_id"]  # noqa: E731
    first, check = [], storage.is_whole

    def is_whole(p, stamp):  # the other process's rename lands during this process's check
        was = check(p, stamp)
        if not first and not p.exists():
            first.append(save(theirs))
            theirs.rename(p)
        return was

    monkeypatch.setattr(storage, "is_whole", is_whole)
    mine = save(ours)
    storage.place(ours, path, "s")
    assert save(path) == (first or [mine])[0] and storage.is_whole(path, "s")


def test_a_patched_index_ranks_as_a_build_when_its_terms_are_numbered_otherwise(tmp_path, monkeypatch):
    """A patch keeps the saved index's term ids; a build numbers terms by their first appearance.
    Once the documents that first held the query's words are deleted, the two number them in
    other orders. The search sums a document's terms in float32 in the query's term order, which
    was the ids' order: the same document's score was summed in two orders, its last bits
    differed, and close documents swapped ranks. The terms are now summed in their strings'
    order: the patched index ranks every query as the build does."""
    import itertools
    import random

    monkeypatch.setattr(storage, "SEGMENT_ROWS", 512)
    rng = random.Random(1)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    rows = [(f"a{i}", w) for i, w in enumerate(reversed(words))]  # the words' first appearances: theta first, alpha last
    rows += [(f"d{i:04d}", " ".join(rng.choice(words) for _ in range(rng.randint(2, 9)))) for i in range(400)]
    rows += [(f"x{i:05d}", f"filler text number {i}") for i in range(3000)]
    store = DocStore(str(tmp_path / "db"))
    store.open_or_create(4, "gen")
    store.upsert(_rows([r[0] for r in rows], [r[1] for r in rows], [f"h{i}" for i in range(len(rows))]))
    bm25.update_index(store)
    store.delete_absent(pa.array([r[0] for r in rows[8:]]))  # the documents that numbered the words
    store = DocStore(str(tmp_path / "db"), version=store.table.version)
    assert bm25.update_index(store)["how"] == "patched"
    patched, built = bm25.open_index(store), bm25.BM25Index.build(store.scan(bm25.SOURCE_COLUMNS), store.version)
    assert patched.vocab.terms[: len(words)] != built.vocab.terms[: len(words)]  # numbered otherwise
    queries = [" ".join(c) for n in (4, 6, 8) for c in itertools.combinations(words, n)]
    patched_ids = patched.doc_id_array().to_pylist()
    for text, (p_rows, p_scores), (b_rows, b_scores) in zip(queries, patched.search(queries, 100), built.search(queries, 100), strict=True):
        assert [patched_ids[r] for r in p_rows] == [built.doc_ids[r] for r in b_rows], text
        np.testing.assert_allclose(p_scores, b_scores, rtol=1e-6, atol=0, err_msg=text)
