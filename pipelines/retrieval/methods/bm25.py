"""BM25 over a batch of queries: the table version's BM25 index searched by one compiled loop
(pipelines/engines/bm25/), LanceDB's full-text scores over title and text (a query term counted as
often as the query repeats it, where LanceDB counts it once: docs/bulk-retrieval.md); after
a stage that produced a run, only that run's candidates (:func:`bm25_candidates`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.retrieval.methods.ranking import candidate_pairs, rank_pairs
from logicrank.schemas.tables import QUERIES, RUN, repeated, require_columns

if TYPE_CHECKING:  # (the store imports LanceDB: a second of the command line's start)
    from logicrank.pipelines.engines.store import DocStore


def bm25(queries: pa.Table, store: DocStore, k: int, run_id: str = "bm25") -> pa.Table:
    """Each query's top ``k`` (a RUN table), ranked as :func:`rank_pairs` ranks: score
    descending, ties by doc id descending."""
    require_columns(queries, QUERIES.names[:2], "bm25")
    index = store.bm25_index()
    return run_from_hits(queries.column("query_id"), index, *index.search_flat(queries.column("text").to_pylist(), k), run_id)


def bm25_candidates(queries: pa.Table, run: pa.Table, store: DocStore, k: int, run_id: str = "bm25", block: int = 256) -> tuple[pa.Table, dict]:
    """BM25 over the candidates ``run`` holds for each query (``a >> bm25``): each candidate's
    score as :func:`bm25`'s search gives it (the index's ``term_scores``, computed over the
    candidates alone, so memory follows the run's size, not the table's), ranked as it ranks
    (its full ranking restricted to the candidates: a candidate that shares no term with the
    query scores 0 and is not returned), top ``k``; and counts (candidate pairs, those naming a
    document the table lacks, those sharing no term)."""
    require_columns(queries, QUERIES.names[:2], "bm25")
    index = store.bm25_index()
    qids, texts = queries.column("query_id").to_pylist(), queries.column("text").to_pylist()
    pairs = candidate_pairs(run, qids)
    rows = pc.fill_null(pc.index_in(pa.array(pairs["doc_id"], pa.string()), value_set=index.doc_id_array()), -1).to_numpy()
    at = pd.Index(qids).get_indexer(pairs["query_id"])
    scores = np.zeros(len(rows), np.float64)
    for lo in range(0, len(qids), block):  # a block of queries' scores over its candidates at a time
        these = np.flatnonzero((at >= lo) & (at < lo + block) & (rows >= 0))
        if len(these):
            docs = np.unique(rows[these])
            S = index.term_scores(texts[lo : lo + block], rows=docs)  # block x its candidates, never x every document
            scores[these] = np.asarray(S[at[these] - lo, np.searchsorted(docs, rows[these])], dtype=np.float64).ravel()
    found = scores > 0
    ranked = rank_pairs(pairs.assign(score=scores)[found], k, "bm25", run_id)
    return ranked, {"candidates": len(rows), "candidates_not_in_table": int((rows < 0).sum()),
                    "candidates_without_query_terms": int(((rows >= 0) & ~found).sum())}


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
