"""BM25 over a batch of queries: one sparse product against the table version's BM25 index
(pipelines/sparse.py), the same scores as LanceDB's full-text search over title and text."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from pipelines.methods.ranking import rank_pairs
from pipelines.store import DocStore
from schemas.tables import QUERIES, require_columns


def bm25(queries: pa.Table, store: DocStore, k: int, run_id: str = "bm25") -> pa.Table:
    require_columns(queries, QUERIES.names[:2], "bm25")
    index = store.bm25_index()
    qids = queries.column("query_id").to_pylist()
    hits = index.search(queries.column("text").to_pylist(), k)
    sizes = [len(rows) for rows, _ in hits]
    pairs = pd.DataFrame({
        "query_id": np.repeat(np.asarray(qids, dtype=object), sizes),
        "doc_id": index.doc_ids[np.concatenate([rows for rows, _ in hits])] if hits else np.empty(0, object),
        "score": np.concatenate([scores for _, scores in hits]) if hits else np.empty(0),
    })
    return rank_pairs(pairs, k, "bm25", run_id)
