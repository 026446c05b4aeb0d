"""Dense retrieval: embed each query, cosine top-k from the LanceDB table."""

from __future__ import annotations

import pyarrow as pa

from pipelines.embed import Embedder
from pipelines.methods.ranking import rank_pairs
from pipelines.store import DocStore
from schemas.tables import QUERIES, require_columns


def dense(queries: pa.Table, store: DocStore, embedder: Embedder, k: int, run_id: str = "dense") -> pa.Table:
    require_columns(queries, QUERIES.names[:2], "dense")
    qids = queries.column("query_id").to_pylist()
    vectors = embedder.encode(queries.column("text").to_pylist())
    hits = store.vector_search(vectors, k).to_pandas()
    hits["query_id"] = [qids[i] for i in hits["query_index"]]
    return rank_pairs(hits, k, "dense", run_id)

