"""BM25 over a batch of queries: the table version's BM25 index searched by one compiled loop
(pipelines/sparse.py), the same scores as LanceDB's full-text search over title and text."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipelines.store import DocStore
from schemas.tables import QUERIES, RUN, require_columns


def bm25(queries: pa.Table, store: DocStore, k: int, run_id: str = "bm25") -> pa.Table:
    """Each query's top ``k`` (a RUN table), ranked as :func:`rank_pairs` ranks: score
    descending, ties by doc id descending."""
    require_columns(queries, QUERIES.names[:2], "bm25")
    index = store.bm25_index()
    hits = index.search(queries.column("text").to_pylist(), k)
    sizes = np.fromiter((len(rows) for rows, _ in hits), np.int64, len(hits))
    total = int(sizes.sum())
    rows = np.concatenate([r for r, _ in hits]) if total else np.empty(0, np.int64)
    scores = np.concatenate([s for _, s in hits]) if total else np.empty(0)
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    return pa.table({
        "query_id": pa.array(np.repeat(np.asarray(queries.column("query_id").to_pylist(), dtype=object), sizes), pa.string()),
        "doc_id": pa.array(index.doc_ids[rows], pa.string()),
        "rank": pa.array((np.arange(total) - starts + 1).astype(np.int32), pa.int32()),
        "score": pa.array(scores, pa.float64()),
        "method": pa.array(["bm25"] * total, pa.string()),
        "run_id": pa.array([run_id] * total, pa.string()),
    }, schema=RUN)
