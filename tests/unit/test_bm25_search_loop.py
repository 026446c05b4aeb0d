"""The BM25 search loop (pipelines/engines/bm25/kernels.py, ``top_k``), compiled ahead of time
(pipelines/engines/bm25/compiled.py) and by numba's JIT alike, against the definition it computes, on sparse matrices made to hit each of its paths: per query, the float32 sum of its
terms' weight rows, every document that scores, the best ``k`` by score then tiebreak rank.
The loop estimates its cut from a strided sample of the scores and falls back to lower
thresholds when fewer than ``k`` documents reach the estimate; the cases below put the scoring
documents only where the sample looks, only where it does not, in exact ties, and in fewer than
``k`` documents. Ids, ranks and scores are compared exactly (the same float32 additions in the
same order)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from logicrank.pipelines.engines import bm25
from logicrank.pipelines.engines.bm25 import compiled as bm25_compiled
from logicrank.pipelines.engines.bm25 import loading, storage


@pytest.fixture(autouse=True, params=["compiled", "jit"])
def loop(request, monkeypatch):
    """Every test below runs on the loop compiled ahead of time and on numba's JIT loop."""
    if request.param == "jit":
        monkeypatch.setenv(bm25_compiled.ENV, "0")
    else:
        monkeypatch.delenv(bm25_compiled.ENV, raising=False)
        failed = bm25_compiled.directory() / "failed.txt"
        assert bm25_compiled.compiled_top_k() is not None, (
            f"the search loop could not be compiled ahead of time on this machine (a C compiler and Python's headers are needed): "
            f"{failed.read_text()[:2000] if failed.is_file() else 'see the log'}")
    return request.param


def _reference(q: sp.csr_matrix, w: sp.csr_matrix, tiebreak: np.ndarray, k: int) -> list[tuple[list[int], list[float]]]:
    out = []
    for r in range(q.shape[0]):
        acc = np.zeros(w.shape[1], np.float32)
        for p in range(q.indptr[r], q.indptr[r + 1]):
            t, qv = q.indices[p], q.data[p]
            lo, hi = w.indptr[t], w.indptr[t + 1]
            np.add.at(acc, w.indices[lo:hi], np.float32(qv) * w.data[lo:hi])
        hit = np.flatnonzero(acc > 0)
        best = sorted(hit.tolist(), key=lambda d: (-acc[d], tiebreak[d]))[:k]
        out.append((best, acc[best].tolist()))
    return out


def _keys(q: sp.csr_matrix, w: sp.csr_matrix, tiebreak: np.ndarray, k: int, lo: int = 0, hi: int | None = None, block: int | None = None,
          seg_rows: int | None = None):
    """The loop over documents [lo, hi) (a shard; all of them by default), ``block`` rows at a
    time (all of them at once by default), over the weights laid out in segments of
    ``seg_rows`` documents (one segment by default)."""
    n = w.shape[1]
    hi = n if hi is None else hi
    block = max(1, hi - lo) if block is None else block
    if seg_rows is None:
        indptr, indices, data, seg_rows = w.indptr[None, :].astype(np.int64), w.indices, w.data, max(1, n)
    else:
        indices, data = np.empty_like(w.indices), np.empty_like(w.data)
        indptr = bm25.segmented(w.indptr, w.indices, w.data, n, seg_rows, indices, data)
    return loading.kernels().top_k(q.indptr, q.indices, q.data, indptr, indices, data, seg_rows, tiebreak, k,
                                   np.zeros(block, np.float32), np.empty(block + 2 * k, np.int64), lo, hi)


def _search(q: sp.csr_matrix, w: sp.csr_matrix, tiebreak: np.ndarray, k: int, shards: int = 1,
            block: int | None = None, seg_rows: int | None = None) -> list[tuple[list[int], list[float]]]:
    n = w.shape[1]
    bounds = np.linspace(0, n, shards + 1).astype(int)
    keys, found = bm25.merge_keys([_keys(q, w, tiebreak, k, lo, hi, block, seg_rows)
                                   for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)], k)
    row_of_rank = np.argsort(tiebreak)
    out = []
    for r in range(q.shape[0]):
        ranks, scores = bm25.decode_keys(keys[r, : found[r]])
        out.append((row_of_rank[ranks].tolist(), scores.tolist()))
    return out


def _weights(rows: list[np.ndarray], values: list[np.ndarray], n: int) -> sp.csr_matrix:
    """terms x documents: term i scores documents ``rows[i]`` with ``values[i]``."""
    indptr = np.cumsum([0] + [len(r) for r in rows])
    order = [np.argsort(r, kind="stable") for r in rows]
    indices = np.concatenate([r[o] for r, o in zip(rows, order, strict=True)] or [np.empty(0, np.int64)]).astype(np.int32)
    data = np.concatenate([v[o] for v, o in zip(values, order, strict=True)] or [np.empty(0)]).astype(np.float32)
    return sp.csr_matrix((data, indices, indptr.astype(np.int32)), shape=(len(rows), n))


def _queries(rng, terms: int, nq: int) -> sp.csr_matrix:
    rows = [rng.choice(terms, size=rng.integers(1, 6), replace=True) for _ in range(nq)]
    q = sp.csr_matrix((np.ones(sum(map(len, rows)), np.float32), np.concatenate(rows).astype(np.int32),
                       np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)), shape=(nq, terms))
    q.sum_duplicates()
    return q


def _case(name: str, n: int, k: int, rng) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    stride = max(1, n // (8 * k))  # where the loop's sample looks
    sampled = np.arange(0, n, stride)
    unsampled = np.setdiff1d(np.arange(n), sampled)
    if name == "random":
        rows = [rng.choice(n, size=rng.integers(1, max(2, n // 3)), replace=False) for _ in range(12)]
        values = [rng.random(len(r)) + 0.01 for r in rows]
    elif name == "ties":  # two distinct weights: thousands of exact ties at any cut
        rows = [rng.choice(n, size=rng.integers(1, max(2, n // 2)), replace=False) for _ in range(12)]
        values = [rng.choice([1.0, 2.0], size=len(r)) for r in rows]
    elif name == "only-sampled-high":  # the sample sees a few high scores, far fewer than k documents reach them
        few = sampled[: max(1, min(len(sampled), 3))]
        rest = rng.choice(unsampled, size=min(len(unsampled), 2 * k), replace=False) if len(unsampled) else np.empty(0, np.int64)
        rows = [np.concatenate([few, rest]), sampled]
        values = [np.concatenate([np.full(len(few), 50.0), rng.random(len(rest)) + 0.01]), rng.random(len(sampled)) * 0.01 + 0.001]
    elif name == "only-unsampled":  # the sample sees no score at all
        pick = rng.choice(unsampled, size=min(len(unsampled), 3 * k), replace=False) if len(unsampled) else np.arange(min(n, 3))
        rows, values = [pick, pick[: len(pick) // 2]], [rng.random(len(pick)) + 0.01, rng.random(len(pick) // 2) + 0.01]
    elif name == "fewer-than-k":
        pick = rng.choice(n, size=min(n, max(1, k // 2)), replace=False)
        rows, values = [pick], [rng.random(len(pick)) + 0.01]
    else:
        raise AssertionError(name)
    w = _weights(rows, values, n)
    return _queries(rng, w.shape[0], 25), w


@pytest.mark.parametrize("name", ["random", "ties", "only-sampled-high", "only-unsampled", "fewer-than-k"])
@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 3), (7, 20), (1_000, 1), (1_000, 10), (5_000, 100), (20_000, 10), (20_000, 1_000)])
def test_the_search_loop_returns_the_exact_top_k_whatever_its_sample_sees(name, n, k):
    rng = np.random.default_rng(n * 1_000 + k)
    q, w = _case(name, n, k, rng)
    tiebreak = rng.permutation(n).astype(np.int64)  # doc ids descending, as a rank per row
    got, want = _search(q, w, tiebreak, k), _reference(q, w, tiebreak, k)
    for r, ((rows, scores), (want_rows, want_scores)) in enumerate(zip(got, want, strict=True)):
        assert rows == want_rows, (name, n, k, r)
        assert scores == want_scores, (name, n, k, r)  # the same float32 sums, in the same order


@pytest.mark.parametrize("name", ["random", "ties", "only-sampled-high", "only-unsampled", "fewer-than-k"])
@pytest.mark.parametrize(("n", "k", "shards"), [(7, 3, 2), (7, 20, 3), (1_000, 10, 2), (5_000, 100, 3), (20_000, 1_000, 4), (20_000, 10, 7)])
def test_shards_of_the_index_merge_into_exactly_the_unsharded_top_k(name, n, k, shards):
    """Each shard scores its range of documents with the whole index's weights (the
    collection's statistics stay whole); the merged keys are the unsharded search's: the same
    rows, the same ranks, the same float32 scores, exact ties at the cut included."""
    rng = np.random.default_rng(n * 7 + k + shards)
    q, w = _case(name, n, k, rng)
    tiebreak = rng.permutation(n).astype(np.int64)
    assert _search(q, w, tiebreak, k, shards) == _search(q, w, tiebreak, k) == _reference(q, w, tiebreak, k)


@pytest.mark.parametrize("name", ["random", "ties", "only-sampled-high", "only-unsampled", "fewer-than-k"])
@pytest.mark.parametrize(("n", "k", "block"), [(7, 3, 2), (7, 20, 3), (1_000, 10, 64), (1_000, 1, 999), (5_000, 100, 128),
                                               (20_000, 1_000, 1_500), (20_000, 10, 4_096), (20_000, 10, 1)])
def test_blocks_of_documents_scored_in_turn_give_exactly_the_top_k(name, n, k, block):
    """The documents scored one block at a time (the accumulator kept in cache at 10M
    documents): the first block's sample sets the threshold, later blocks raise it to the k-th
    key held; the run is the one-pass search's, exact ties at the cut and shards included."""
    rng = np.random.default_rng(n * 13 + k + block)
    q, w = _case(name, n, k, rng)
    tiebreak = rng.permutation(n).astype(np.int64)
    want = _reference(q, w, tiebreak, k)
    assert _search(q, w, tiebreak, k, block=block) == want
    assert _search(q, w, tiebreak, k, shards=3, block=block) == want


@pytest.mark.parametrize("name", ["random", "ties", "only-sampled-high", "fewer-than-k"])
@pytest.mark.parametrize(("n", "k", "seg_rows", "block"), [(7, 3, 2, 1), (1_000, 10, 300, 64), (5_000, 100, 1_024, 512),
                                                           (20_000, 10, 4_096, 4_096), (20_000, 1_000, 6_000, 1_500)])
def test_an_index_saved_in_segments_of_documents_gives_exactly_the_top_k(name, n, k, seg_rows, block):
    """The saved layout: each segment of documents holds its own postings, term by term
    (a shard's process then reads only its segments). Searched whole, in shards that cut
    segments, and in blocks, the run is the one-pass search's."""
    rng = np.random.default_rng(n * 17 + k + seg_rows)
    q, w = _case(name, n, k, rng)
    tiebreak = rng.permutation(n).astype(np.int64)
    want = _reference(q, w, tiebreak, k)
    assert _search(q, w, tiebreak, k, block=block, seg_rows=seg_rows) == want
    assert _search(q, w, tiebreak, k, shards=3, block=block, seg_rows=seg_rows) == want
    indices, data = np.empty_like(w.indices), np.empty_like(w.data)
    indptr = bm25.segmented(w.indptr, w.indices, w.data, n, seg_rows, indices, data)
    assert indptr.shape == (-(-n // seg_rows), w.shape[0] + 1)
    for s, row in enumerate(indptr):  # segment s: every term's postings of rows [s * seg_rows, (s + 1) * seg_rows), in order
        part = w[:, s * seg_rows : (s + 1) * seg_rows].tocsr()
        assert (np.diff(row) == np.diff(part.indptr)).all()
        assert (indices[row[0] : row[-1]] - s * seg_rows == part.indices).all() and (data[row[0] : row[-1]] == part.data).all()


def test_the_search_loop_over_an_empty_corpus_finds_nothing():
    w = sp.csr_matrix((2, 0), dtype=np.float32)
    q = sp.csr_matrix(np.array([[1.0, 1.0]], np.float32))
    keys, found = loading.kernels().top_k(q.indptr, q.indices, q.data, w.indptr[None, :].astype(np.int64), w.indices, w.data, 1,
                                          np.empty(0, np.int64), 5, np.zeros(0, np.float32), np.empty(10, np.int64), 0, 0)
    assert found.tolist() == [0]


def test_a_saved_index_in_segments_searches_and_scores_as_the_index_in_memory(monkeypatch, tmp_path):
    """Saved in segments of 7 documents and mapped back: the same runs (whole and in shards),
    the same term scores and weights as the index the build made in memory."""
    import pyarrow as pa

    rng = np.random.default_rng(5)
    words = ["dog", "cat", "owner", "feeds", "runs", "trained", "rescue", "laptop", "engineer", "codes"]
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 12))) for _ in range(50)]
    batch = pa.record_batch({"doc_id": [f"d{i:02d}" for i in range(50)], "content_hash": ["h"] * 50,
                             "title": [None if i % 3 else "Dog owner" for i in range(50)], "text": texts})
    built = bm25.BM25Index.build([batch], version=1)
    monkeypatch.setattr(storage, "SEGMENT_ROWS", 7)
    mapped = bm25.MappedBM25.open(built.save(tmp_path / "v1"))
    assert mapped is not None and mapped.segments()[0].shape == (8, len(built.vocab) + 1)
    queries = ["dog owner", "cat feeds cat", "laptop engineer codes", "rescue", "unknown words"]
    for k in (1, 5, 50):
        want = built.search_flat(queries, k)
        assert all((g == w).all() for g, w in zip(mapped.search_flat(queries, k), want, strict=True))
        q = mapped.query_matrix(queries)
        parts = [mapped.search_keys(q, k, (lo, hi)) for lo, hi in ((0, 10), (10, 11), (11, 50))]
        assert all((g == w).all() for g, w in zip(mapped.hits(*bm25.merge_keys(parts, k)), want, strict=True))
    assert (mapped.term_scores(queries) != built.term_scores(queries)).nnz == 0
    w_mapped, w_built = mapped.weights(), built.weights()
    assert (w_mapped.indptr == w_built.indptr).all() and (w_mapped.indices == w_built.indices).all() and (w_mapped.data == w_built.data).all()


def test_arguments_of_other_types_go_to_the_jit_loop_with_the_same_result(loop):
    """The compiled function reads its arguments as the types it was built for: an index of
    other dtypes or a strided array is never handed to it (which would read wrong memory) but to
    the JIT loop, and the queries' own arrays of other types are converted: one answer."""
    rng = np.random.default_rng(5)
    q, w = _case("random", 2_000, 10, rng)
    tiebreak = rng.permutation(2_000).astype(np.int64)
    compiled = bm25_compiled.compiled_top_k()
    calls = []
    if compiled is not None:  # which loop ran: the compiled one for the index's own types, never for the others
        bm25_compiled.loaded["top_k"] = lambda *a: calls.append(1) or compiled(*a)
    try:
        want = _keys(q, w, tiebreak, 10)
        assert len(calls) == (1 if loop == "compiled" else 0)
        odd = {"indices": w.indices.astype(np.int64), "data": w.data.astype(np.float64), "tiebreak": tiebreak.astype(np.int32),
               "strided": np.repeat(tiebreak, 2)[::2]}
        for name, value in odd.items():
            indices = value if name == "indices" else w.indices
            data = value if name == "data" else w.data
            ties = value if name in ("tiebreak", "strided") else tiebreak
            got = bm25_compiled.top_k(q.indptr.astype(np.int32), q.indices.astype(np.int64), q.data.astype(np.float64),
                                      w.indptr[None, :].astype(np.int64), indices, data, 2_000, ties, 10,
                                      np.zeros(2_000, np.float32), np.empty(2_020, np.int64), 0, 2_000)
            assert (got[0] == want[0]).all() and (got[1] == want[1]).all(), name
        assert len(calls) == (1 if loop == "compiled" else 0)  # none of the odd ones reached the compiled function
        readonly = np.zeros(2_000, np.float32)
        readonly.flags.writeable = False  # scratch it cannot write: the JIT loop's typing error, never a write through the compiled one
        from numba.core.errors import TypingError

        with pytest.raises(TypingError):
            bm25_compiled.top_k(q.indptr, q.indices, q.data, w.indptr[None, :].astype(np.int64), w.indices, w.data, 2_000, tiebreak, 10,
                                readonly, np.empty(2_020, np.int64), 0, 2_000)
        assert len(calls) == (1 if loop == "compiled" else 0)
    finally:
        if compiled is not None:
            bm25_compiled.loaded["top_k"] = compiled
