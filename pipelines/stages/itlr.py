"""ITLR: each query's logical form over text terms; every term embedded once; cosine scores
composed with fuzzy operators (exact over every document, over ANN candidates, or over the
candidates a file lists for each query)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from pipelines.logic.fuzzy import Operators
from pipelines.methods.itlr import (
    TERM_SCORES,
    Calibration,
    ann_candidates,
    labelled_scores,
    parse_queries,
    score_candidates,
    score_exact,
    term_scores,
    unique_terms,
)
from pipelines.methods.ranking import rank_pairs
from pipelines.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from pipelines.stages.registry import preset, register


class ITLROptions(StageOptions):
    stage: Literal["itlr"] = "itlr"
    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query.")
    mode: Literal["exact", "ann", "listed"] = Field(
        "exact", description="Score every document, ANN candidates, or the documents a pairs file lists for each query."
    )
    operators: str = Field("and=product,or=sum,not=complement", description="Fuzzy operator families.")
    calibration: Literal["none", "zscore", "sigmoid"] = Field(
        "none", description="Term-score calibration: none, zscore (corpus sample statistics), sigmoid (fit on labels)."
    )
    calibration_sample: int = Field(10_000, ge=10, description="zscore: corpus sample size for term statistics.")
    labels: str | None = Field(None, description="sigmoid: JSONL of {doc_id, present: [terms]} to fit on.")
    ann_k: int = Field(100, ge=1, description="ann: neighbours per positive term.")
    ann_nprobes: int | None = Field(None, ge=1, description="ann: IVF partitions probed (None: LanceDB's default).")
    block_rows: int = Field(32768, ge=1, description="exact: document vectors per block.")
    pairs: str | None = Field(None, description="listed: a qrels file (BEIR TSV or TREC qrels, any relevance) of each query's candidates.")

    @field_validator("operators")
    @classmethod
    def _ops(cls, v: str) -> str:
        return str(Operators.parse(v))

    @model_validator(mode="after")
    def _files(self):
        if self.calibration == "sigmoid" and not self.labels:
            raise ValueError("itlr calibration 'sigmoid' is supervised: give labels (JSONL of doc_id and present terms).")
        if (self.mode == "listed") != (self.pairs is not None):
            raise ValueError("itlr: mode 'listed' reads its candidates from pairs, and only it does: give both or neither.")
        return self


@register
class ITLR(Stage):
    """ITLR: the query's logical form over text terms (its ``logical_query``; the raw text as
    one term when it has none or it does not parse), every distinct term embedded once, cosine
    scores composed with fuzzy operators. Side table ``term_scores``: each (query, document,
    term) score behind the run."""

    name = "itlr"
    side_tables = {"term_scores": TERM_SCORES}
    kind = Kind.RETRIEVER
    Options = ITLROptions
    reads = ("text", "logical_query")  # a blank-text query still runs when it carries its logical form

    def needs(self) -> Needs:
        return Needs(encoder=True, files=tuple(f for f in (self.options.labels, self.options.pairs) if f))

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        o = self.options
        store, embedder = ctx.store, ctx.embedder()
        parsed = parse_queries(queries)
        terms = unique_terms(parsed)
        term_vectors = embedder.encode(terms)  # each distinct term once, in one batch
        ops = Operators.parse(o.operators)
        calibration = self._calibration(store, terms, term_vectors)
        candidates, listed = {}, {}
        if o.mode == "ann":
            candidates, exact_queries = ann_candidates(
                parsed, terms, term_vectors, lambda v, k: store.vector_search(v, k, with_vectors=True, nprobes=o.ann_nprobes), o.ann_k
            )
            frames = [score_candidates(parsed, terms, term_vectors, candidates, o.k, ops, calibration)]
        elif o.mode == "listed":
            candidates, absent = listed_candidates(o.pairs, {q.query_id for q in parsed}, store)
            listed = {"listed_pairs_not_in_table": absent, "queries_without_pairs": sum(q.query_id not in candidates for q in parsed)}
            exact_queries, frames = [], [score_candidates(parsed, terms, term_vectors, candidates, o.k, ops, calibration)]
        else:
            exact_queries, frames = parsed, []
        if exact_queries:
            blocks = store.vector_blocks(o.block_rows)
            frames.append(score_exact(exact_queries, terms, term_vectors, blocks, o.k, [ops], calibration)[ops])
        pairs = pd.concat(frames, ignore_index=True)
        vectors = store.vectors_for(pairs["doc_id"].unique().tolist())
        scores = term_scores(pairs, parsed, terms, term_vectors, vectors, calibration)
        fallback = [q.query_id for q in parsed if q.status == "fallback"]
        counts = {
            "queries": len(parsed),
            "fallback": len(fallback),
            "fallback_query_ids": fallback[:100],
            "unique_terms": len(terms),
            "mode": o.mode,
            "operators": str(ops),
            "calibration": calibration.name,
            "mean_candidates": float(np.mean([len(c[0]) for c in candidates.values()])) if candidates else None,
            **listed,
        }
        return Output(run=rank_pairs(pairs, o.k, "itlr", "itlr"), side={"term_scores": scores}, counts=counts)

    def _calibration(self, store, terms: list[str], term_vectors) -> Calibration:
        o = self.options
        if o.calibration == "none":
            return Calibration()
        if o.calibration == "zscore":
            sample = store.sample_vectors(o.calibration_sample)
            return Calibration.zscore(terms, sample @ term_vectors.T)
        labels = [json.loads(line) for line in Path(o.labels).read_text(encoding="utf-8").splitlines() if line.strip()]
        vectors = store.vectors_for(sorted({r["doc_id"] for r in labels}))
        return Calibration.fit_sigmoid(labelled_scores(labels, terms, term_vectors, vectors))


def listed_candidates(path: str, query_ids: set[str], store) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
    """query id -> (doc ids, vectors) of the documents a qrels-format file lists for it (those
    in the table), and how many listed pairs name a document the table does not hold."""
    from pipelines.topics import read_qrels

    pairs = read_qrels(path).to_pandas()
    pairs = pairs[pairs["query_id"].isin(query_ids)]
    vectors = store.vectors_for(pairs["doc_id"].unique().tolist())
    out = {}
    for qid, group in pairs.groupby("query_id", sort=False):
        ids = np.array([d for d in group["doc_id"] if d in vectors], dtype=object)
        out[qid] = (ids, np.stack([vectors[d] for d in ids]) if len(ids) else np.zeros((0, 0), np.float32))
    return out, int((~pairs["doc_id"].isin(list(vectors))).sum())


@preset("itlr")
def _itlr(m) -> list[StageOptions]:
    from pipelines.stages.rewriters import DecompositionOptions

    itlr = ITLROptions(
        k=m.k, mode=m.itlr_mode, operators=m.operators, calibration=m.calibration, calibration_sample=m.calibration_sample,
        labels=m.labels, ann_k=m.ann_k, ann_nprobes=m.ann_nprobes, block_rows=m.block_rows,
    )
    # with a decompositions table, the LLM's logical queries replace the queries' own
    return [DecompositionOptions(target="itlr", decompositions=m.decompositions), itlr] if m.decompositions else [itlr]
