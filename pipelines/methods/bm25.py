"""BM25 through LanceDB's native full-text index over title and text."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from pipelines.methods.ranking import rank_pairs
from pipelines.store import DocStore
from schemas.tables import QUERIES, require_columns


def bm25(queries: pa.Table, store: DocStore, k: int, run_id: str = "bm25") -> pa.Table:
    require_columns(queries, QUERIES.names[:2], "bm25")
    frames = []
    for qid, text in zip(queries.column("query_id").to_pylist(), queries.column("text").to_pylist(), strict=True):
        hits = store.text_search(text, k).to_pandas()
        hits.insert(0, "query_id", qid)
        frames.append(hits)
    pairs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["query_id", "doc_id", "score"])
    return rank_pairs(pairs, k, "bm25", run_id)
