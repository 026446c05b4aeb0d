"""MMR: maximal marginal relevance (Carbonell and Goldstein, SIGIR 1998) over the incoming run.

The small method a newcomer would add, as a model of what one costs: this module, one import
line in pipelines/retrieval/stages/__init__.py, its tests, and its line in docs/pipelines.md.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field

from logicrank.pipelines.retrieval.methods.ranking import rank_pairs
from logicrank.pipelines.retrieval.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from logicrank.pipelines.retrieval.stages.registry import register


class MMROptions(StageOptions):
    stage: Literal["mmr"] = "mmr"
    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query.")
    depth: int = Field(20, ge=2, le=1_000, description="Rerank the incoming run's top depth; deeper documents keep their order after them.")
    relevance: float = Field(0.7, ge=0, le=1, description="lambda: the weight of relevance against novelty (1: by cosine to the query alone).")


@register
class MMR(Stage):
    """Maximal marginal relevance: from the incoming run's top ``depth``, repeatedly take the
    document with the highest lambda * cos(query, d) - (1 - lambda) * max cos(d, taken),
    so near-duplicates of what is already taken move down. Cosines from the table's vectors
    and the query's embedding; ties by the incoming rank. A document of the top ``depth`` the
    table has no vector for follows the reranked ones in its incoming order (counted)."""

    name = "mmr"
    kind = Kind.RERANKER
    Options = MMROptions

    def needs(self) -> Needs:
        return Needs(encoder=True)

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        o = self.options
        run = runs[0].select(["query_id", "doc_id", "rank"]).to_pandas().sort_values(["query_id", "rank"], kind="stable")
        top = run[run["rank"] <= o.depth]
        vectors = ctx.store.vectors_for(top["doc_id"].unique().tolist())
        texts = dict(zip(queries.column("query_id").to_pylist(), queries.column("text").to_pylist(), strict=True))
        asked = [q for q in dict.fromkeys(run["query_id"]) if q in texts]
        query_vectors = dict(zip(asked, ctx.embedder().encode([texts[q] for q in asked]), strict=True)) if asked else {}
        rows, unknown = [], set()
        for qid, group in run.groupby("query_id", sort=False):
            head = group[group["rank"] <= o.depth]["doc_id"].tolist()
            # a document the table has no vector for (a run_file's or qrels' first stage naming one outside this version)
            # keeps its incoming order after the reranked head, before the deeper documents
            absent = [d for d in head if d not in vectors]
            unknown.update(absent)
            head = [d for d in head if d in vectors]
            order = select(query_vectors[qid], np.stack([vectors[d] for d in head]), o.relevance) if head and qid in query_vectors else range(len(head))
            ranked = [head[i] for i in order] + absent + group[group["rank"] > o.depth]["doc_id"].tolist()
            rows += [(qid, d, 1.0 / (i + 1), i) for i, d in enumerate(ranked[: o.k])]  # score: the reciprocal of the new rank
        pairs = pd.DataFrame(rows, columns=["query_id", "doc_id", "score", "tiebreak"])
        return Output(run=rank_pairs(pairs, o.k, "mmr", "mmr"),
                      counts={"queries": len(asked), "docs_without_vector": len(unknown), "docs_without_vector_ids": sorted(unknown)[:100]})


def select(query: np.ndarray, docs: np.ndarray, relevance: float) -> list[int]:
    """The MMR order of ``docs`` (rows, any norm) for ``query``; ties go to the earlier row."""
    unit = docs / np.maximum(np.linalg.norm(docs, axis=1, keepdims=True), 1e-12)
    to_query = unit @ (query / max(float(np.linalg.norm(query)), 1e-12))
    pairwise = unit @ unit.T
    taken: list[int] = []
    closest = np.full(len(docs), -np.inf)  # max cosine to a taken document
    left = np.ones(len(docs), dtype=bool)
    for _ in range(len(docs)):
        novelty = np.where(np.isfinite(closest), closest, 0.0)
        value = np.where(left, relevance * to_query - (1 - relevance) * novelty, -np.inf)
        i = int(np.argmax(value))  # the first of equal values: the earlier rank
        taken.append(i)
        left[i] = False
        closest = np.maximum(closest, pairwise[i])
    return taken
