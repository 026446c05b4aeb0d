"""BM25 over a batch of queries: the table version's BM25 index searched by one compiled loop
(pipelines/sparse.py), the same scores as LanceDB's full-text search over title and text."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from logicrank.pipelines.store import DocStore
from logicrank.schemas.tables import QUERIES, RUN, repeated, require_columns


def bm25(queries: pa.Table, store: DocStore, k: int, run_id: str = "bm25") -> pa.Table:
    """Each query's top ``k`` (a RUN table), ranked as :func:`rank_pairs` ranks: score
    descending, ties by doc id descending."""
    require_columns(queries, QUERIES.names[:2], "bm25")
    index = store.bm25_index()
    return run_from_hits(queries.column("query_id"), index, *index.search_flat(queries.column("text").to_pylist(), k), run_id)


def run_from_hits(query_ids, index, sizes: np.ndarray, rows: np.ndarray, scores: np.ndarray, run_id: str = "bm25") -> pa.Table:
    """The search's flat arrays (hits per query, document rows, scores, in rank order) -> a RUN
    table, built with Arrow takes (no Python work per row)."""
    total = len(rows)
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    query_ids = query_ids.combine_chunks() if isinstance(query_ids, pa.ChunkedArray) else query_ids
    return pa.table({
        "query_id": query_ids.take(np.repeat(np.arange(len(sizes)), sizes)),
        "doc_id": index.doc_id_array().take(rows),
        "rank": pa.array((np.arange(total) - starts + 1).astype(np.int32), pa.int32()),
        "score": pa.array(scores, pa.float64()),
        "method": repeated("bm25", total),
        "run_id": repeated(run_id, total),
    }, schema=RUN)
