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
    sizes, rows, scores = index.search_flat(queries.column("text").to_pylist(), k)
    total = len(rows)
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    label = lambda value: pa.array([value], pa.string()).take(np.zeros(total, np.int32))  # noqa: E731
    return pa.table({
        "query_id": queries.column("query_id").combine_chunks().take(np.repeat(np.arange(len(sizes)), sizes)),
        "doc_id": index.doc_id_array().take(rows),
        "rank": pa.array((np.arange(total) - starts + 1).astype(np.int32), pa.int32()),
        "score": pa.array(scores, pa.float64()),
        "method": label("bm25"),
        "run_id": label(run_id),
    }, schema=RUN)
