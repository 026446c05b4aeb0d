"""The BM25 index built in segments (pipelines/engines/bm25/segments.py) saves the same files,
array for array, as the build in one scan: on a real LanceDB table, with segments of a few
documents, tasks run in any order, and documents with no title, no text or only stop words."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.engines import bm25
from logicrank.pipelines.engines.bm25 import segments, storage
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
    for name in ("title", "text"):
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


def test_update_index_builds_in_segments_then_patches(tmp_path, docs, monkeypatch):
    monkeypatch.setattr(storage, "SEGMENT_ROWS", 16)
    store = _table(tmp_path / "db", docs)
    calls = []

    def run(step, args):
        calls.append((step.__name__, len(args)))
        return [step(*a) for a in args]

    first = bm25.update_index(store, run=run)
    assert first["how"] == "built" and first["segments"] == 5 and first["docs"] == 70
    assert calls == [("patch_saved", 1), ("analyze_segment", 5), ("merge_segments", 1), ("weigh_segment", 5), ("assemble", 1)]
    store.upsert(pa.table({"doc_id": ["new"], "title": ["t"], "text": ["a brand new zyxwvut document"], "metadata": [None],
                           "content_hash": ["hn"], "vector": to_fixed_size_list(np.ones((1, 4), np.float32))}))
    calls.clear()
    second = bm25.update_index(store, run=run)
    assert second["how"] == "patched" and second["analyzed"] == 1 and calls == [("patch_saved", 1)]


def test_segment_ranges():
    assert segments.ranges(0, 4) == [(0, 0)]
    assert segments.ranges(9, 4) == [(0, 4), (4, 8), (8, 9)]
    assert segments.ranges(8, 4) == [(0, 4), (4, 8)]
