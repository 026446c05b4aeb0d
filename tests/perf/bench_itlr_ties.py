"""ITLR exact mode where most of the table ties at the cut (not a test).

    python tests/perf/bench_itlr_ties.py                  # 400,000 documents, 40 queries, k 100
    python tests/perf/bench_itlr_ties.py --docs 2000000

Sparse evidence as BM25 gives it (each of 8 terms in 2% of the documents, seeded) and queries
with a NOT (`NOT "t1"`, `"t2" OR NOT "t3"`): nearly every document scores 1, so the running
top k of ``score_exact`` keeps the k largest doc ids among a tie that spans every block. The
best of ``--repeat`` in-process runs, blocks of 32,768 rows, the cores this process may use.
``make bench-itlr`` measures the common case (dense cosines, few ties).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logicrank.pipelines.retrieval.logic.fuzzy import Operators  # noqa: E402
from logicrank.pipelines.retrieval.methods.itlr import Calibration, parse_queries, score_exact  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=400_000)
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    terms = [f"t{i}" for i in range(8)]
    raw = (rng.random((a.docs, len(terms))) < 0.02).astype(np.float32)
    half = a.queries // 2
    rows = [(f"q{i}", f'NOT "t{i % 8}"') for i in range(half)] + [(f"r{i}", f'"t{i % 8}" OR NOT "t{(i + 1) % 8}"') for i in range(a.queries - half)]
    qs = parse_queries(pa.table({"query_id": [r[0] for r in rows], "text": ["x"] * len(rows), "logical_query": [r[1] for r in rows]}))
    ids = np.array([f"doc{i:08d}" for i in range(a.docs)], dtype=object)
    blocks = [(ids[i : i + 32768], raw[i : i + 32768]) for i in range(0, a.docs, 32768)]
    best = float("inf")
    for _ in range(a.repeat):
        start = time.perf_counter()
        run = score_exact(qs, terms, None, blocks, a.k, [Operators()], Calibration())[Operators()]
        best = min(best, time.perf_counter() - start)
    assert run.groupby("query_id").size().eq(a.k).all()
    print(f"{a.docs:,} documents, {a.queries} queries, k {a.k}: {best:.3f} s (best of {a.repeat})")


if __name__ == "__main__":
    main()
