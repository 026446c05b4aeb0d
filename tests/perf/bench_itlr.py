"""ITLR scoring benchmark: ratios measured side by side in one run (not a test).

    make bench-itlr          # 100,000 generated vectors, 200 queries of 3 terms

On one LanceDB table of generated, clustered unit vectors (dim 384) with an ANN index:
  matmul   one numpy product (unique terms x N) on the same vectors, already in memory;
  exact    ITLR exact mode: vectors streamed from LanceDB in blocks, composed, top-k kept;
  ann      ITLR ann mode: union of positive terms' ANN top-k, exact re-scoring.
Goals (issue 3): exact / matmul <= 2; ann recall@10 against exact >= 0.95.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logicrank.pipelines.engines.embed import to_fixed_size_list  # noqa: E402
from logicrank.pipelines.engines.store import DocStore  # noqa: E402
from logicrank.pipelines.markdown import table  # noqa: E402
from logicrank.pipelines.retrieval.logic.fuzzy import Operators  # noqa: E402
from logicrank.pipelines.retrieval.methods.itlr import Calibration, ann_candidates, parse_queries, score_candidates, score_exact  # noqa: E402
from tests.perf.report import write_report  # noqa: E402


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--ann-k", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved repeats of matmul / exact / scan")
    ap.add_argument("--nprobes", type=int, default=None, help="IVF partitions probed (LanceDB default if unset)")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    # documents mix 1-3 of 2,000 topics (as generated documents concatenate topic sentences)
    n_topics = 2000
    centers = _unit(rng.normal(size=(n_topics, args.dim)))
    mix = np.zeros((args.docs, n_topics), dtype=np.float32)
    for j in range(3):
        present = rng.random(args.docs) < (1.0 if j == 0 else 0.5)
        mix[np.flatnonzero(present), rng.integers(0, n_topics, present.sum())] = 1.0
    V = _unit(mix @ centers + 0.5 * rng.normal(size=(args.docs, args.dim)).astype(np.float32) / np.sqrt(args.dim))
    ids = np.array([f"d{i}" for i in range(args.docs)], dtype=object)
    del mix

    work = Path(tempfile.mkdtemp(prefix="logicrank-bench-itlr-"))
    store = DocStore(str(work / "db"))
    store.open_or_create(args.dim, "generated")
    n = args.docs
    t = time.perf_counter()
    for s in range(0, n, 20_000):
        e = min(n, s + 20_000)
        store.upsert(pa.table({
            "doc_id": ids[s:e].tolist(), "title": [None] * (e - s), "text": ["x"] * (e - s), "metadata": [None] * (e - s),
            "content_hash": ["h"] * (e - s), "vector": to_fixed_size_list(V[s:e]),
        }))
    write_s = time.perf_counter() - t
    t = time.perf_counter()
    indexes = store.build_indexes(ann_threshold=1)
    index_s = time.perf_counter() - t

    # queries: three terms near random clusters, random templates
    templates = ['"{0}" AND "{1}" AND NOT "{2}"', '"{0}" OR "{1}" AND "{2}"', '("{0}" OR "{1}") AND NOT "{2}"', '"{0}" AND "{1}" OR "{2}"']
    term_texts, rows = [], []
    for q in range(args.queries):
        names = [f"t{q}-{j}" for j in range(3)]
        term_texts += names
        rows.append({"query_id": f"q{q}", "text": "x", "logical_query": templates[q % len(templates)].format(*names)})
    T = _unit(centers[rng.integers(0, n_topics, len(term_texts))] + 0.3 * rng.normal(size=(len(term_texts), args.dim)) / np.sqrt(args.dim))
    parsed = parse_queries(pa.Table.from_pylist(rows))
    ops, cal = Operators(), Calibration()

    def run_matmul():
        t = time.perf_counter()
        _ = V @ T.T
        return time.perf_counter() - t, None

    def run_exact():
        t = time.perf_counter()
        blocks = store.vector_blocks(32768)
        result = score_exact(parsed, term_texts, T, blocks, args.k, [ops], cal)[ops]
        return time.perf_counter() - t, result

    def run_scan():
        t = time.perf_counter()
        for b in store.scan(["doc_id", "vector"], 32768):
            b.column("doc_id").to_numpy(zero_copy_only=False), b.column("vector").flatten().to_numpy()
        return time.perf_counter() - t, None

    # interleaved repeats; medians reported (this machine's timings vary run to run)
    times: dict[str, list[float]] = {"matmul": [], "exact": [], "scan": []}
    for _ in range(args.repeat):
        for name, fn in (("matmul", run_matmul), ("exact", run_exact), ("scan", run_scan)):
            dt, res = fn()
            times[name].append(dt)
            if name == "exact":
                exact = res
    matmul_s, exact_s, scan_s = (float(np.median(times[k])) for k in ("matmul", "exact", "scan"))
    ratios = [e / m for e, m in zip(times["exact"], times["matmul"], strict=True)]

    t = time.perf_counter()
    cands, no_pos = ann_candidates(parsed, term_texts, T, lambda v, k: store.vector_search(v, k, with_vectors=True, nprobes=args.nprobes), args.ann_k)
    ann = score_candidates(parsed, term_texts, T, cands, args.k, ops, cal)
    ann_s = time.perf_counter() - t
    assert not no_pos

    # the same candidate generation with exact neighbour search: what the ANN index costs
    cands_x, _ = ann_candidates(parsed, term_texts, T, lambda v, k: store.vector_search(v, k, exact=True, with_vectors=True), args.ann_k)
    ann_x = score_candidates(parsed, term_texts, T, cands_x, args.k, ops, cal)

    truth = exact.groupby("query_id")["doc_id"].apply(set)

    def recall_of(run) -> float:
        found = run.groupby("query_id")["doc_id"].apply(set)
        return float(np.mean([len(truth[q] & found.get(q, set())) / len(truth[q]) for q in truth.index]))

    recall, recall_x = recall_of(ann), recall_of(ann_x)
    result = {
        "docs": n, "dim": args.dim, "queries": args.queries, "unique_terms": len(term_texts), "k": args.k, "ann_k": args.ann_k, "nprobes": args.nprobes,
        "ann_index": indexes.get("vector"), "write_s": write_s, "index_build_s": index_s,
        "matmul_s": matmul_s, "scan_s": scan_s, "exact_s": exact_s, "ratio_exact_vs_matmul": exact_s / matmul_s,
        "candidate_recall_exact_neighbours": recall_x, "repeats": args.repeat,
        "ratio_exact_vs_matmul_range": [min(ratios), max(ratios)], "times_s": times,
        "ann_s": ann_s, "speedup_ann_vs_exact": exact_s / ann_s, "ann_recall_at_k": recall,
        "mean_ann_candidates": float(np.mean([len(c[0]) for c in cands.values()])),
    }
    lines = [
        f"# ITLR scoring benchmark ({n} generated vectors, dim {args.dim}, {args.queries} queries x 3 terms, one run; "
        f"medians of {args.repeat} interleaved repeats, exact/matmul ranged {min(ratios):.2f}-{max(ratios):.2f})",
        "",
        *table(["matmul s", "LanceDB scan alone s", "exact s (scan overlapped)", "exact / matmul (goal <= 2)", "ann s", "exact / ann",
                "ann recall@10 (goal >= 0.95)", "same, exact neighbours", "mean candidates"],
               [[f"{matmul_s:.3f}", f"{scan_s:.3f}", f"{exact_s:.3f}", f"{exact_s / matmul_s:.2f}",
                 f"{ann_s:.3f}", f"{exact_s / ann_s:.2f}", f"{recall:.3f}", f"{recall_x:.3f}", f"{result['mean_ann_candidates']:.0f}"]],
               align="rrrrrrrrr"),
    ]
    write_report(args.out, "bench_itlr", result, lines)


if __name__ == "__main__":
    main()
