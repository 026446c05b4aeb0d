"""The dense batch engine (pipelines/retrieval/methods/dense.py) against LanceDB's vector search: the
exact blocked product equals LanceDB's exact search (ids and ranks exactly, scores within
1e-6), ties at the cut go by doc id as runs rank them, and past the ANN threshold the
refined ANN search keeps recall@10 against exact. Real LanceDB tables, generated vectors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from logicrank.pipelines.engines.embed import to_fixed_size_list
from logicrank.pipelines.engines.store import DocStore
from logicrank.pipelines.retrieval.methods.dense import dense, exact_top_k
from logicrank.pipelines.retrieval.methods.ranking import rank_pairs
from tests.compare import assert_runs_close

DIM = 64


def _store(path, vectors: np.ndarray) -> DocStore:
    n = len(vectors)
    s = DocStore(str(path))
    s.open_or_create(DIM, "gen")
    s.upsert(pa.table({"doc_id": [f"d{i:05d}" for i in range(n)], "title": [None] * n, "text": ["x"] * n, "metadata": [None] * n,
                       "content_hash": ["h"] * n, "vector": to_fixed_size_list(vectors.astype(np.float32))}))
    return s


class _Encoder:
    """Query 'i' -> the i-th given vector (the encoder's place, without a model)."""

    def __init__(self, vectors):
        self.vectors = vectors

    def encode(self, texts):
        return self.vectors[[int(t) for t in texts]]


def _unit(m):
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def test_exact_engine_equals_lancedb_exact_search(tmp_path):
    rng = np.random.default_rng(0)
    docs = _unit(rng.normal(size=(3000, DIM)))
    store = _store(tmp_path / "db", docs)
    queries = _unit(docs[rng.integers(0, 3000, 200)] + 0.5 * rng.normal(size=(200, DIM)))
    qids = [f"q{i}" for i in range(200)]
    mine = exact_top_k(qids, queries, store, 100)
    hits = store.vector_search(queries, 100, exact=True).to_pandas()
    hits["query_id"] = [qids[i] for i in hits["query_index"]]
    assert_runs_close(mine, rank_pairs(hits, 100, "dense", "dense"), "exact engine vs LanceDB", rtol=1e-6, atol=1e-6)
    assert mine.column("rank").to_pylist()[:101] == list(range(1, 101)) + [1]
    # the vectors are mapped from their saved files: nothing of its own in this process, the whole file mapped
    assert store.held_bytes() == 0 and store.mapped_bytes() >= 3000 * DIM * 4
    assert store.vectors().path is not None and store.vectors().matrix.filename is not None
    store.release()
    assert store.mapped_bytes() == 0


def test_ties_at_the_cut_go_by_doc_id_descending(tmp_path):
    rng = np.random.default_rng(1)
    docs = _unit(rng.normal(size=(500, DIM)))
    docs[0] = np.eye(DIM)[0]  # (a basis vector: its cosine with itself is exactly 1 whatever the summation order)
    docs[100:120] = docs[0]  # 21 documents with one vector: d00000 and d00100..d00119
    store = _store(tmp_path / "db", docs)
    run = exact_top_k(["q"], docs[[0]], store, 5)
    assert run.column("doc_id").to_pylist() == ["d00119", "d00118", "d00117", "d00116", "d00115"]
    assert run.column("score").to_pylist() == [1.0] * 5
    # and through the method, with more documents asked for than the table holds
    small = _store(tmp_path / "small", docs[:3])
    run = dense(pa.table({"query_id": ["a"], "text": ["0"]}), small, _Encoder(docs), 10)
    cos = docs[:3] @ docs[0]
    assert run.column("doc_id").to_pylist() == [f"d{i:05d}" for i in np.argsort(-cos)]
    assert run.column("rank").to_pylist() == [1, 2, 3]


def test_the_refined_ann_search_as_an_option_keeps_recall(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    centers = rng.normal(size=(50, DIM))
    docs = _unit(centers[rng.integers(0, 50, 6000)] + 0.6 * rng.normal(size=(6000, DIM)))
    store = _store(tmp_path / "db", docs)
    store.build_indexes(ann_threshold=1000)
    assert store.has_ann_index()
    queries = _unit(docs[rng.integers(0, 6000, 100)] + 0.3 * rng.normal(size=(100, DIM)))
    qids = [str(i) for i in range(100)]
    import logicrank.pipelines.retrieval.methods.dense as engine

    calls, search = [], store.vector_search
    monkeypatch.setattr(store, "vector_search", lambda *a, **kw: calls.append(kw) or search(*a, **kw))
    # exact by default, whether or not the table has an ANN index
    assert dense(pa.table({"query_id": qids, "text": qids}), store, _Encoder(queries), 10).equals(exact_top_k(qids, queries, store, 10))
    assert calls == []
    run = dense(pa.table({"query_id": qids, "text": qids}), store, _Encoder(queries), 10, search="ann").to_pandas()
    exact = exact_top_k(qids, queries, store, 10).to_pandas()
    recall = np.mean([len(set(run[run.query_id == q].doc_id) & set(exact[exact.query_id == q].doc_id)) / 10 for q in qids])
    assert calls == [{"refine_factor": engine.REFINE_FACTOR}] and recall >= 0.95, (calls, recall)


def test_tiles_of_documents_give_the_single_pass_answer(tmp_path, monkeypatch):
    """Many document tiles (merged top k per tile) against one pass: the same run, ties
    across tiles broken by doc id too."""
    import logicrank.pipelines.engines.exact as engine

    rng = np.random.default_rng(3)
    docs = _unit(rng.normal(size=(2000, DIM)))
    docs[0] = np.eye(DIM)[0]
    docs[[7, 300, 301, 1500, 1999]] = docs[0]  # a tie spread over tiles
    store = _store(tmp_path / "db", docs)
    queries = np.vstack([docs[[0]], _unit(docs[rng.integers(0, 2000, 50)] + 0.4 * rng.normal(size=(50, DIM)))])
    qids = [f"q{i}" for i in range(51)]
    whole = exact_top_k(qids, queries, store, 20)
    monkeypatch.setattr(engine, "_TILE", 64)  # 8 queries x 64 documents per tile: 32 tiles
    monkeypatch.setattr(engine, "_QUERY_BLOCK", 8)
    tiled = exact_top_k(qids, queries, store, 20)
    assert tiled.select(["query_id", "doc_id", "rank"]).equals(whole.select(["query_id", "doc_id", "rank"]))
    np.testing.assert_allclose(tiled.column("score").to_numpy(), whole.column("score").to_numpy(), rtol=1e-6, atol=1e-6)
    assert tiled.column("doc_id").to_pylist()[:6] == ["d01999", "d01500", "d00301", "d00300", "d00007", "d00000"]


def test_ann_asked_of_a_table_without_an_ann_index_is_refused_in_one_line(tmp_path):
    from logicrank.pipelines.retrieval.methods.dense import DenseError

    store = _store(tmp_path / "db", _unit(np.random.default_rng(4).normal(size=(50, DIM))))
    with pytest.raises(DenseError, match=r"needs an ANN index .*logicrank index --ann"):
        dense(pa.table({"query_id": ["a"], "text": ["0"]}), store, _Encoder(np.ones((1, DIM))), 5, search="ann")


@pytest.mark.parametrize("product", ["numpy", "torch"])
def test_shards_merge_into_exactly_the_unsharded_run_on_either_product(tmp_path, monkeypatch, product):
    """Shards of rows searched apart and merged: the unsharded top k, ids and
    ranks exactly, scores within 1e-6, a tie spread over shards included; the torch product
    (run here on the CPU, on a GPU where one is visible) gives the numpy product's run."""
    import logicrank.pipelines.engines.exact as engine
    from logicrank.pipelines.retrieval.methods.dense import merge_top, shard_bounds, top_k

    monkeypatch.setattr(engine, "_TILE", 128)
    rng = np.random.default_rng(5)
    docs = _unit(rng.normal(size=(1000, DIM)))
    docs[0] = np.eye(DIM)[0]
    docs[[5, 130, 400, 777, 999]] = docs[0]  # a tie across shards
    store = _store(tmp_path / "db", docs)
    queries = np.vstack([docs[[0]], _unit(docs[rng.integers(0, 1000, 40)] + 0.4 * rng.normal(size=(40, DIM)))]).astype(np.float32)
    v = store.vectors()
    whole_rows, whole_scores = top_k(queries, v, 30, product="numpy")
    for shards in (2, 3, 8, 12):  # 12: more shards than blocks of rows, some empty
        bounds = shard_bounds(len(v), shards)
        assert bounds[0][0] == 0 and bounds[-1][1] == len(v) and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        assert all(lo % engine._ALIGN == 0 for lo, _ in bounds)
        rows, scores = merge_top([top_k(queries, v, 30, shard=b, product=product) for b in bounds], v.tiebreak, 30)
        assert rows.tolist() == whole_rows.tolist(), shards
        np.testing.assert_allclose(scores, whole_scores, rtol=1e-6, atol=1e-6)
    assert v.ids.take(whole_rows[0, :6]).to_pylist() == ["d00999", "d00777", "d00400", "d00130", "d00005", "d00000"]


@pytest.mark.parametrize("product", ["numpy", "torch"])
def test_identical_vectors_tie_and_rank_by_doc_id_wherever_they_sit(tmp_path, monkeypatch, product):
    """Copies of one vector (duplicate passages) anywhere in the table: a BLAS product scored
    them a few float32 units apart by their place in the tile, so which copies made the top k,
    and in what order, moved with the tiles and the shards (10 of 64 queries' top 10 changed
    between one shard and two, at 300 vectors copied 30 times each). Each candidate is scored
    as one float64 sum: copies tie, rank by doc id descending, and every layout and product
    gives the definition's run, its scores bit for bit alike; a group of copies wider than the
    candidates a tile keeps (k + 8) at the cut included."""
    import logicrank.pipelines.engines.exact as engine
    from logicrank.pipelines.retrieval.methods.dense import merge_top, shard_bounds, top_k

    monkeypatch.setattr(engine, "_TILE", 256)
    rng = np.random.default_rng(7)
    distinct = _unit(rng.normal(size=(40, DIM)))
    docs = distinct[rng.integers(0, 40, 3000)]  # about 75 copies of each vector, spread over tiles and shards
    store = _store(tmp_path / "db", docs)
    v = store.vectors()
    queries = _unit(rng.normal(size=(32, DIM)) + distinct[rng.integers(0, 40, 32)]).astype(np.float32)
    k = 20
    exact = (queries.astype(np.float64) @ v.matrix.astype(np.float64).T).astype(np.float32)
    want = np.lexsort((np.broadcast_to(v.tiebreak, exact.shape), -exact), axis=1)[:, :k]  # score, then doc id descending
    whole_rows, whole_scores = top_k(queries, v, k, product=product)
    assert whole_rows.tolist() == want.tolist()
    np.testing.assert_allclose(whole_scores, np.take_along_axis(exact, want, axis=1), rtol=0, atol=1e-6)  # (another float64 sum)
    for shards in (2, 3, 7):
        rows, scores = merge_top([top_k(queries, v, k, shard=b, product=product) for b in shard_bounds(len(v), shards)], v.tiebreak, k)
        assert rows.tolist() == want.tolist() and np.array_equal(scores, whole_scores), shards


def test_nan_vectors_never_hide_the_others_and_a_query_of_zeros_takes_the_first_by_doc_id():
    """A tile holding NaN vectors (a small corpus, or a shard): a NaN at the cut made every
    candidate fall below it, and the query's whole run came back as -inf in doc id order (the
    first version of the exact scoring). A query of zeros scores every document 0: its k best
    are the first by doc id descending, found without scoring each tile exactly."""
    from logicrank.pipelines.engines.exact import top_k
    from logicrank.pipelines.engines.vectors import Vectors, tiebreak_ranks

    rng = np.random.default_rng(3)
    m = _unit(rng.normal(size=(14, DIM)))
    m[[1, 4, 6, 9, 12]] = np.nan
    ids = pa.array([f"d{i:02d}" for i in range(14)])
    v = Vectors(ids, m, tiebreak_ranks(ids))
    q = _unit(rng.normal(size=(3, DIM))).astype(np.float32)
    q[2] = 0
    rows, scores = top_k(q, v, 10, product="numpy")
    finite = [i for i in range(14) if i not in (1, 4, 6, 9, 12)]
    for r in range(2):
        cos = (m[finite].astype(np.float64) @ q[r].astype(np.float64)).astype(np.float32)
        assert rows[r, :9].tolist() == [finite[i] for i in np.argsort(-cos, kind="stable")], r  # every finite vector, ranked
        np.testing.assert_allclose(scores[r, :9], np.sort(cos)[::-1], rtol=0, atol=1e-6)
    assert rows[2].tolist() == list(range(13, 3, -1)) and scores[2].tolist() == [0.0] * 10  # d13, d12, ...: doc id descending


def test_float16_vectors_keep_recall(tmp_path):
    """The float16 copy of the vectors (half the bytes): recall@10 against float32's exact run."""
    rng = np.random.default_rng(6)
    docs = _unit(rng.normal(size=(3000, DIM)))
    store = _store(tmp_path / "db", docs)
    queries = _unit(docs[rng.integers(0, 3000, 100)] + 0.5 * rng.normal(size=(100, DIM)))
    qids = [f"q{i}" for i in range(100)]
    full = exact_top_k(qids, queries, store, 10).to_pandas()
    half = exact_top_k(qids, queries, store, 10, precision="float16").to_pandas()
    assert store.vectors("float16").matrix.dtype == np.float16 and store.vectors("float16").matrix.nbytes == 3000 * DIM * 2
    recall = np.mean([len(set(half[half.query_id == q].doc_id) & set(full[full.query_id == q].doc_id)) / 10 for q in qids])
    assert recall >= 0.99, recall
    np.testing.assert_allclose(half.groupby("query_id").score.max(), full.groupby("query_id").score.max(), atol=2e-3)


def test_vectors_saved_by_other_code_are_written_again_not_mapped(tmp_path, monkeypatch):
    """The saved vectors record the digest of the code that made them (the unit vectors, the
    tie-break ranks, the layout): an edit there wrote nothing new before, and every later search
    mapped what the earlier code had saved, cached under the new code's stage key."""
    from logicrank.pipelines.engines import vectors

    store = _store(tmp_path / "db", _unit(np.random.default_rng(3).normal(size=(50, DIM))))
    first = store.vectors()
    assert json.loads((first.path / "meta.json").read_text())["code"] == vectors.code_digest()
    store.release()
    del first
    monkeypatch.setattr(vectors, "tiebreak_ranks", lambda ids: np.arange(len(ids), dtype=np.int64))  # another rule ...
    monkeypatch.setattr(vectors, "code_digest", lambda: "edited")  # ... in another release of the code
    again = DocStore(str(tmp_path / "db")).vectors()
    assert np.array_equal(np.asarray(again.tiebreak), np.arange(50)), "the vectors the earlier code saved were mapped"
    for name in vectors.CODE:  # each definition the digest names exists
        assert callable(getattr(vectors, name))


def test_damaged_saved_vectors_are_written_again_and_a_recreated_table_gets_its_own(tmp_path):
    """The mapped vectors are checked when opened (shape, ids, save id, the table version's
    time): a cut-off file is written again, and a table dropped and made again, whose versions
    reuse the same numbers, never maps its predecessor's vectors."""
    from logicrank.pipelines.engines import vectors

    rng = np.random.default_rng(7)
    first = _unit(rng.normal(size=(300, DIM)))
    store = _store(tmp_path / "db", first)
    saved = store.vectors()
    path, before, save_id = saved.path / "vectors.npy", np.array(saved.matrix), saved.save_id  # (a copy: the file is cut below)
    whole = path.read_bytes()
    store.release()
    del saved
    path.write_bytes(whole[: len(whole) // 2])  # cut off in place (a mapping of it would now fault: saves never write in place)
    again = DocStore(str(tmp_path / "db")).vectors()
    assert again.save_id != save_id and np.array_equal(np.asarray(again.matrix), before)
    version = store.version
    store.db.drop_table(store.name)  # dropped behind logicrank's back: the saved vectors stay on disk
    second = _unit(rng.normal(size=(300, DIM)))
    other = _store(tmp_path / "db", second)
    assert other.version == version and vectors.root(other) == vectors.root(store)
    np.testing.assert_allclose(np.asarray(other.vectors().matrix), second.astype(np.float32), rtol=0, atol=1e-6)


_SEARCH = ("import sys, numpy as np, pyarrow as pa\n"
           "from logicrank.pipelines.engines.vectors import Vectors, tiebreak_ranks\n"
           "from logicrank.pipelines.retrieval.methods.dense import top_k\n"
           "ids = pa.array([f'd{i}' for i in range(50)])\n"
           "m = np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32)\n"
           "m /= np.linalg.norm(m, axis=1, keepdims=True)\n"
           "rows, _ = top_k(m[:3], Vectors(ids, m, tiebreak_ranks(ids)), 5)\n"
           "assert rows[:, 0].tolist() == [0, 1, 2]\n"
           "print('torch' in sys.modules)\n")


@pytest.mark.parametrize(("version", "imports"), [("cuda = None\nhip = None\n", True), ("cuda = '12.4'\nhip = None\n", True),
                                                  ("cuda = None\nhip = '6.2'\n", True), (None, True), ("cuda = '12.4'\n", False)])
def test_a_search_asks_torch_for_a_gpu_only_where_its_build_may_have_one(tmp_path, version, imports):
    """``product="auto"`` uses torch where it sees a GPU. A torch whose version file names no
    CUDA and no ROCm build sees none: a fresh process's search does not import it to ask. A
    CUDA or ROCm build, or one without a readable version file, is imported and asked (here a
    stand-in torch that sees no GPU, so the search runs on numpy either way). A torch that does
    not import sees no GPU: the search runs on numpy."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("class cuda:\n    @staticmethod\n    def is_available():\n        return False\n" if imports
                                      else "raise ImportError('a torch that does not import')\n")
    if version is not None:
        (fake / "version.py").write_text(version)
    path = os.pathsep.join(p for p in [str(tmp_path), os.environ.get("PYTHONPATH", "")] if p)
    done = subprocess.run([sys.executable, "-c", _SEARCH], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(imports and version != "cuda = None\nhip = None\n"), (version, done.stdout)  # imported and asked?


def test_a_search_on_this_machines_torch_imports_it_only_where_its_build_may_have_a_gpu():
    """The same on the torch installed here (a CPU build on these machines: not imported)."""
    import subprocess
    import sys
    from importlib.util import find_spec
    from pathlib import Path

    version = (Path(find_spec("torch").origin).parent / "version.py").read_text()
    gpu_build = any(line.startswith(("cuda", "hip")) and not line.rstrip().endswith("= None") for line in version.splitlines())
    done = subprocess.run([sys.executable, "-c", _SEARCH], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(gpu_build), (done.stdout, gpu_build)


def test_dense_over_a_runs_candidates_ranks_and_scores_them_as_the_full_dense_run(tmp_path):
    """`a >> dense` ranks a's candidates "as dense ranks, its full ranking restricted to the
    candidates". It scored each pair with a float32 product of the raw query vector, where the
    full search scores with the query of unit length and one float64 sum rounded to float32:
    near-duplicate passages swapped places. Fed dense's own top 200, it gives that run back:
    ids and ranks exactly, scores within 1e-7."""
    from logicrank.pipelines.retrieval.methods.dense import dense_candidates

    rng = np.random.default_rng(7)
    bases = _unit(rng.normal(size=(60, DIM)))
    docs = _unit(bases[rng.integers(0, 60, 3000)] + 1e-4 * rng.normal(size=(3000, DIM)))  # near-duplicates around 60 passages
    store = _store(tmp_path / "db", docs)
    raw = (3.0 * (bases[rng.integers(0, 60, 20)] + 0.05 * rng.normal(size=(20, DIM)))).astype(np.float32)  # not of unit length
    queries = pa.table({"query_id": [f"q{i}" for i in range(20)], "text": [str(i) for i in range(20)]})
    full = exact_top_k(queries.column("query_id").to_pylist(), raw, store, 200)
    again, counts = dense_candidates(queries, full, store, _Encoder(raw), 200)
    assert counts == {"candidates": 4000, "candidates_not_in_table": 0}
    again, full = (t.sort_by([("query_id", "ascending"), ("rank", "ascending")]) for t in (again, full))
    for col in ("query_id", "doc_id", "rank"):
        assert again.column(col).to_pylist() == full.column(col).to_pylist(), col
    np.testing.assert_allclose(again.column("score").to_numpy(), full.column("score").to_numpy(), rtol=1e-7, atol=0)
