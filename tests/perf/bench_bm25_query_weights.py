"""What a saved BM25 index of term counts would cost the search (not a test): the design
question of a re-index that rewrites only what changed (issue 53's 1% re-index at 10M).

Today's saved index holds each posting's BM25 weight, computed with the collection's
statistics (the idf and the average length). A 1% re-index changes both, so every weight
changes and a patch rewrites the whole index (docs/bulk-retrieval.md, where a patch's time
goes). Lucene's way keeps each posting's term count and each document's length, applies the
length normalisation at query time, and masks deleted documents: a patch then writes only
the new documents' postings, the mask and the statistics, but the search loop divides once
per posting.

This bench measures that division, side by side in one process, on one synthetic collection
(documents of Poisson(60) tokens over a Zipf(1.1) vocabulary of 200,000 terms; queries of 4
terms drawn from the 300 most frequent, as the bench corpus's queries are common: about
half of the documents score): the engine's search loop (``top_k`` over saved weights,
k=10), and two accumulation loops that differ only in where a posting's weight comes from:
read (float32), or computed from its count (uint16) and its document's norm (float64), bit
for bit the weight the index saves (checked). Both accumulate in blocks of the search loop's
size. Reported: queries per second of each, and the search loop's speed with the
difference added, an estimate of a counts index's search.

    python tests/perf/bench_bm25_query_weights.py --docs 1000000 --out runs/bench
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from logicrank.pipelines.engines.bm25 import index as bm25_index  # noqa: E402
from logicrank.pipelines.engines.bm25 import kernels, loading  # noqa: E402
from tests.perf.report import write_report  # noqa: E402

K = 10


@numba.njit(nogil=True)
def accumulate(q_indptr, q_indices, q_data, seg_indptr, docs, weights, counts, idf, k1, norm, from_counts, block, acc, check):
    """Every query's postings summed into the accumulator, block by block of documents (the
    search loop's order), each weight read or computed from its count. With ``check``, per query
    the sum of its accumulators (else only their first: the timed runs)."""
    out = np.zeros(len(q_indptr) - 1, np.float64)
    for r in range(len(q_indptr) - 1):
        for seg in range(seg_indptr.shape[0]):
            base = seg * block
            for i in range(q_indptr[r], q_indptr[r + 1]):
                t, qv = q_indices[i], q_data[i]
                if from_counts:
                    c1 = idf[t] * (k1 + 1)  # as kernels.weight_postings computes it: idf * (k1 + 1) * f / (f + norm)
                    for j in range(seg_indptr[seg, t], seg_indptr[seg, t + 1]):
                        d = docs[j]
                        x = np.float64(counts[j])
                        acc[d - base] += qv * np.float32(c1 * x / (x + norm[d]))
                else:
                    for j in range(seg_indptr[seg, t], seg_indptr[seg, t + 1]):
                        acc[docs[j] - base] += qv * weights[j]
            out[r] += acc.sum() if check else acc[0]
            acc[:] = 0
    return out


def collection(docs: int, seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    lengths = rng.poisson(60, docs)
    terms = (rng.zipf(1.1, int(lengths.sum())) - 1) % 200_000
    counts = sp.csr_matrix((np.ones(len(terms), np.int32), (np.repeat(np.arange(docs), lengths), terms)), shape=(docs, 200_000))
    counts.sum_duplicates()
    return counts


def best_rate(fn, queries: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return queries / min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    counts = collection(args.docs)
    none = sp.csr_matrix(counts.shape, dtype=np.int32)  # the title field: empty
    df = np.bincount(counts.indices, minlength=counts.shape[1])
    idf = bm25_index.idf_of(args.docs, df)
    lengths = bm25_index.row_sums(counts).astype(np.float64)
    norm = bm25_index.K1 * (1 - bm25_index.B + bm25_index.B * lengths / lengths.mean())
    weights = bm25_index.weigh(none, counts, idf, float(lengths.mean()))  # terms x documents, as the index saves them
    by_term = counts.T.tocsr()
    by_term.sort_indices()
    assert np.array_equal(by_term.indices, weights.indices)
    block = 1 << 17  # the search loop's (index.py's _BLOCK)
    n_seg = -(-args.docs // block)
    starts = kernels.segment_starts(np.asarray(weights.indptr, np.int64), weights.indices, block, n_seg)
    seg_docs, seg_weights, seg_counts = np.empty_like(weights.indices), np.empty_like(weights.data), np.empty(weights.nnz, np.uint16)
    rows, offset = [], 0
    for s in range(n_seg):
        rows.append(kernels.segment_copy(weights.indices, weights.data, starts, s, seg_docs, seg_weights, offset))
        kernels.segment_copy(weights.indices, by_term.data.astype(np.uint16), starts, s, np.empty_like(seg_docs), seg_counts, offset)
        offset = int(rows[-1][-1])
    seg_indptr = np.stack(rows)
    rng = np.random.default_rng(1)
    terms = rng.integers(0, 300, (args.queries, 4))
    q = sp.csr_matrix((np.ones(terms.size, np.float32), terms.ravel(), np.arange(0, terms.size + 1, 4)), shape=(args.queries, counts.shape[1]))
    q.sum_duplicates()
    acc = np.zeros(block, np.float32)
    args_of = lambda flag: (q.indptr, q.indices, q.data, seg_indptr, seg_docs, seg_weights, seg_counts, idf, bm25_index.K1, norm, flag, block, acc)  # noqa: E731
    assert np.array_equal(accumulate(*args_of(False), True), accumulate(*args_of(True), True)), "the weights from the counts differ from the saved"
    run = {flag: (lambda flag=flag: accumulate(*args_of(flag), False)) for flag in (False, True)}
    whole = np.asarray(weights.indptr, np.int64)[None, :]
    ties = np.arange(args.docs, dtype=np.int64)[::-1].copy()
    cand = np.empty(block + 2 * K, np.int64)
    search = lambda: loading.kernels().top_k(q.indptr, q.indices, q.data, whole, weights.indices, weights.data, args.docs, ties, K,  # noqa: E731
                                             np.zeros(block, np.float32), cand, 0, args.docs)
    search()
    rates = {"search loop, saved weights": best_rate(search, args.queries, args.repeat),
             "accumulate, saved weights": best_rate(run[False], args.queries, args.repeat),
             "accumulate, weights from counts": best_rate(run[True], args.queries, args.repeat)}
    added = 1 / rates["accumulate, weights from counts"] - 1 / rates["accumulate, saved weights"]
    rates["search loop, weights from counts (estimate)"] = 1 / (1 / rates["search loop, saved weights"] + added)
    postings = float(np.diff(weights.indptr)[q.indices].sum() / args.queries)
    result = {"docs": args.docs, "queries": args.queries, "postings_per_query": round(postings), "q_per_s": {k: round(v, 1) for k, v in rates.items()},
              "counts_over_weights": round(rates["search loop, weights from counts (estimate)"] / rates["search loop, saved weights"], 3)}
    lines = [f"BM25 search over {args.docs:,} documents, {args.queries} queries of 4 common terms ({postings:,.0f} postings a query), best of {args.repeat}",
             "", "| loop | q/s |", "|:--|--:|", *(f"| {k} | {v:,.1f} |" for k, v in rates.items())]
    write_report(args.out, "bm25_query_weights", result, lines)


if __name__ == "__main__":
    main()
