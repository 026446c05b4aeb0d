"""Dense retrieval: the batch's queries encoded together, then each one's exact cosine top k
(pipelines/engines/exact.py) over the table version's unit vectors, saved beside the table and mapped
by each process that searches (pipelines/engines/vectors.py: the processes of a node share one copy),
in float32 or, as an option, float16 (half the bytes; its recall against float32 is measured in
docs/bulk-retrieval.md). A corpus past one process's memory is searched by shards of rows
whose top k merge exactly (jobs/retrieve.py, ``--shards``).

LanceDB's ANN index (IVF_HNSW_SQ) is an option (``search="ann"``): ``REFINE_FACTOR * k``
candidates per query re-ranked by their full vectors; the table must have been indexed with
one (``logicrank index --ann``).

After a stage that produced a run, dense scores only that run's candidates
(:func:`dense_candidates`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.engines.embed import Embedder
from logicrank.pipelines.engines.exact import merge_top, pair_scores, shard_bounds, top_k, unit_queries
from logicrank.pipelines.engines.vectors import Vectors
from logicrank.pipelines.retrieval.methods.ranking import candidate_pairs, rank_pairs
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import QUERIES, RUN, repeated, require_columns

if TYPE_CHECKING:  # (the store imports LanceDB: a second of the command line's start)
    from logicrank.pipelines.engines.store import DocStore

REFINE_FACTOR = 4
__all__ = ["DenseError", "dense", "dense_candidates", "exact_top_k", "merge_top", "run_table", "shard_bounds", "top_k"]


class DenseError(UserError, ValueError):
    """A dense search that cannot run as asked."""


def dense(queries: pa.Table, store: DocStore, embedder: Embedder, k: int, run_id: str = "dense", search: str = "exact",
          precision: str = "float32", product: str = "auto") -> pa.Table:
    require_columns(queries, QUERIES.names[:2], "dense")
    qids = queries.column("query_id").to_pylist()
    vectors = embedder.encode(queries.column("text").to_pylist())
    if search == "ann":
        if not store.has_ann_index():
            raise DenseError(f"dense: search 'ann' needs an ANN index on table {store.name!r}; run `logicrank index --ann`, or search 'exact'.")
        hits = store.vector_search(vectors, k, refine_factor=REFINE_FACTOR).to_pandas()
        hits["query_id"] = [qids[i] for i in hits["query_index"]]
        return rank_pairs(hits, k, "dense", run_id)
    v = store.vectors(precision)
    rows, scores = top_k(vectors, v, k, product=product)
    return run_table(qids, v, rows, scores, run_id)


def dense_candidates(queries: pa.Table, run: pa.Table, store: DocStore, embedder: Embedder, k: int, run_id: str = "dense",
                     precision: str = "float32") -> tuple[pa.Table, dict]:
    """Dense over the candidates ``run`` holds for each query (``a >> dense``): each candidate's
    cosine with the query, from the same saved vectors the exact search reads, ranked as
    :func:`dense` ranks (its full ranking restricted to the candidates), top ``k``; and counts
    (candidate pairs, those naming a document the table lacks: left out)."""
    require_columns(queries, QUERIES.names[:2], "dense")
    qids = queries.column("query_id").to_pylist()
    pairs = candidate_pairs(run, qids)
    v = store.vectors(precision)
    rows = pc.fill_null(pc.index_in(pa.array(pairs["doc_id"], pa.string()), value_set=v.ids), -1).to_numpy()
    held = rows >= 0
    pairs, rows = pairs[held], rows[held]
    # each pair scored as the exact search scores it (the query of unit length, one float64 sum rounded to float32), so
    # that the candidates rank as they do in dense's full ranking: a float32 product moved near-ties by a last bit
    Q = unit_queries(embedder.encode(queries.column("text").to_pylist()))
    at = pd.Index(qids).get_indexer(pairs["query_id"])
    scores = pair_scores(Q, at, v.matrix, rows)  # (a chunk of candidates' vectors at a time)
    ranked = rank_pairs(pairs.assign(score=scores), k, "dense", run_id)
    return ranked, {"candidates": int(len(held)), "candidates_not_in_table": int((~held).sum())}


def exact_top_k(qids: list[str], vectors: np.ndarray, store: DocStore, k: int, run_id: str = "dense", precision: str = "float32",
                product: str = "auto") -> pa.Table:
    """Each query's exact cosine top ``k`` (ties at the cut by doc id descending, as
    :func:`rank_pairs` orders them) as a RUN table."""
    v = store.vectors(precision)
    rows, scores = top_k(vectors, v, k, product=product)
    return run_table(qids, v, rows, scores, run_id)


def run_table(qids: list[str], v: Vectors, rows: np.ndarray, scores: np.ndarray, run_id: str = "dense") -> pa.Table:
    """(queries x kk) document rows and scores -> a RUN table, built from the arrays."""
    nq, kk = rows.shape if rows.ndim == 2 else (len(qids), 0)
    total = nq * kk
    return pa.table({
        "query_id": pa.array(qids, pa.string()).take(np.repeat(np.arange(nq), kk)),
        "doc_id": v.ids.take(rows.ravel()),
        "rank": pa.array(np.tile(np.arange(1, kk + 1, dtype=np.int32), nq), pa.int32()),
        "score": pa.array(scores.ravel().astype(np.float64), pa.float64()),
        "method": repeated("dense", total),
        "run_id": repeated(run_id, total),
    }, schema=RUN)
