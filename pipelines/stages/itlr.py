"""ITLR: each query's logical form over text terms; every term embedded once; cosine scores
composed with fuzzy operators (exact over every document, over ANN candidates, or over the
candidates a file lists for each query)."""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from logicrank.pipelines.logic.fuzzy import Operators
from logicrank.pipelines.logic.grammar import BLANK
from logicrank.pipelines.logic.query import UnparsedQueryError, unparsed_message
from logicrank.pipelines.methods.evidence import calibrate_evidence, check_calibration, describe, make_evidence, raw_lookup
from logicrank.pipelines.methods.itlr import (
    TERM_SCORES,
    Calibration,
    ann_candidates,
    labelled_scores,
    merge_exact,
    parse_queries,
    positive_terms,
    score_candidates,
    score_exact,
    score_listed,
    term_scores,
    term_scores_from,
    unique_terms,
)
from logicrank.pipelines.methods.ranking import rank_pairs
from logicrank.pipelines.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from logicrank.pipelines.stages.registry import register


class ITLROptions(StageOptions):
    stage: Literal["itlr"] = "itlr"
    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query.")
    mode: Literal["exact", "ann", "listed"] = Field(
        "exact", description="Score every document, ANN candidates, or the documents a pairs file lists for each query."
    )
    operators: str = Field("and=product,or=sum,not=complement", description="Fuzzy operator families.")
    scorer: Literal["dense", "bm25", "hybrid"] = Field(
        "dense", description="Term evidence: dense cosines, BM25 scores, or hybrid (their calibrated mix, hybrid_weight x bm25)."
    )
    calibration: Literal["none", "zscore", "sigmoid", "max", "saturation"] | None = Field(
        None, description="Term-score calibration to [0, 1] (None: the scorer's default, dense none, bm25 max): none, zscore (corpus "
        "sample statistics), sigmoid (fit on labels), max (over the table), saturation (BM25's largest possible score); bm25 only for the last two."
    )
    hybrid_weight: float = Field(0.5, ge=0.0, le=1.0, description="hybrid: the share of calibrated BM25 evidence (the rest dense).")
    calibration_sample: int = Field(10_000, ge=10, description="zscore (and hybrid's dense part): corpus sample size for term statistics.")
    labels: str | None = Field(None, description="sigmoid: JSONL of {doc_id, present: [terms]} to fit on.")
    ann_k: int = Field(100, ge=1, description="ann: neighbours per positive term.")
    ann_nprobes: int | None = Field(None, ge=1, description="ann: IVF partitions probed (None: LanceDB's default).")
    block_rows: int = Field(32768, ge=1, description="exact: document vectors per block.")
    pairs: str | None = Field(None, description="listed: a qrels file (BEIR TSV or TREC qrels, any relevance) of each query's candidates.")
    on_parse_error: Literal["refuse", "fallback"] = Field(
        "refuse", description="A logical query that does not parse (a query's own or a decomposition's): refuse the run in one line "
        "naming the query, or score its whole text as one term (the job names those queries on the terminal)."
    )

    @field_validator("operators")
    @classmethod
    def _ops(cls, v: str) -> str:
        return str(Operators.parse(v))

    @model_validator(mode="after")
    def _files(self):
        check_calibration(self.scorer, self.calibration, "itlr")
        if self.calibration == "sigmoid" and not self.labels:
            raise ValueError("itlr calibration 'sigmoid' is supervised: give labels (JSONL of doc_id and present terms).")
        if (self.mode == "listed") != (self.pairs is not None):
            raise ValueError("itlr: mode 'listed' reads its candidates from pairs, and only it does: give both or neither.")
        return self


def exact_shard(queries, terms, term_vectors, k, ops, calibration, block_rows, store, rows: tuple[int, int]) -> pd.DataFrame:
    """ITLR exact over one shard of the table's rows (a search actor's part of ``Context.shards``):
    its top k with their table rows, which :func:`merge_exact` merges exactly."""
    blocks = store.vector_blocks(block_rows, rows=rows)
    return score_exact(queries, terms, term_vectors, blocks, k, [ops], calibration, first_row=rows[0], with_rows=True)[ops]


@register
class ITLR(Stage):
    """ITLR: the query's logical form over text terms (its ``logical_query``; the raw text as
    one term when it has none); a logical query that does not parse stops the run, naming the
    query (``on_parse_error: fallback``: its raw text as one term, the query named on the
    terminal); every distinct term scored once (dense:
    embedded, raw cosines by default; bm25: BM25 over the table; hybrid: both), BM25 and hybrid
    calibrated to [0, 1], composed with fuzzy operators. Side table ``term_scores``: each (query, document, term)
    score behind the run."""

    name = "itlr"
    version = 2  # 2: ties at the top k's cut go to the earliest table rows
    side_tables = {"term_scores": TERM_SCORES}
    kind = Kind.RETRIEVER
    Options = ITLROptions
    reads = ("text", "logical_query")  # a blank-text query still runs when it carries its logical form

    def needs(self) -> Needs:
        files = tuple(f for f in (self.options.labels, self.options.pairs) if f)
        return Needs(encoder=self.options.scorer != "bm25", fulltext=self.options.scorer != "dense", files=files)

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        if self.options.scorer != "dense":
            return self._run_evidence(ctx, queries)
        o = self.options
        store, embedder = ctx.store, ctx.embedder()
        parsed, fallbacks = self._parse(queries)
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
            task = functools.partial(exact_shard, exact_queries, terms, term_vectors, o.k, ops, calibration, o.block_rows)
            merge = functools.partial(merge_exact, k=o.k, query_order=[q.query_id for q in exact_queries])
            sharded = ctx.shards(task, merge) if ctx.shards is not None else None
            frames.append(sharded if sharded is not None else score_exact(exact_queries, terms, term_vectors, store.vector_blocks(o.block_rows), o.k,
                                                                          [ops], calibration)[ops])
        pairs = pd.concat(frames, ignore_index=True)
        vectors = store.vectors_for(pairs["doc_id"].unique().tolist())
        scores = term_scores(pairs, parsed, terms, term_vectors, vectors, calibration)
        counts = {
            "queries": len(parsed),
            **fallbacks,
            "unique_terms": len(terms),
            "mode": o.mode,
            "operators": str(ops),
            "scorer": "dense",
            "calibration": calibration.name,
            "mean_candidates": float(np.mean([len(c[0]) for c in candidates.values()])) if candidates else None,
            **listed,
        }
        return Output(run=rank_pairs(pairs, o.k, "itlr", "itlr"), side={"term_scores": scores}, counts=counts)

    def _run_evidence(self, ctx: Context, queries: pa.Table) -> Output:
        """ITLR over bm25 or hybrid evidence (pipelines/methods/evidence.py): the same modes,
        composition and side table as over dense cosines."""
        o = self.options
        parsed, fallbacks = self._parse(queries)
        terms = unique_terms(parsed)
        encode = (lambda texts: ctx.embedder().encode(texts)) if o.scorer == "hybrid" else None  # noqa: E731
        evidence = make_evidence(o.scorer, ctx.store, terms, encode, o.hybrid_weight, o.calibration_sample)
        name = check_calibration(o.scorer, o.calibration, "itlr")
        labels = _read_labels(o.labels) if o.labels else None
        calibration = calibrate_evidence(evidence, name, o.calibration_sample, labels)
        ops = Operators.parse(o.operators)
        candidates, listed, exact_queries = {}, {}, parsed
        if o.mode == "ann":
            candidates, exact_queries = _term_candidates(parsed, evidence, ctx.store, o)
            listed = {"queries_without_candidates": sum(q.query_id not in candidates for q in parsed) - len(exact_queries)}
        elif o.mode == "listed":
            candidates, absent = _listed_ids(o.pairs, {q.query_id for q in parsed}, evidence)
            listed = {"listed_pairs_not_in_table": absent, "queries_without_pairs": sum(q.query_id not in candidates for q in parsed)}
            exact_queries = []
        frames = []
        if candidates:  # every candidate's scores read once
            lookup = raw_lookup(evidence, [d for ids, _ in candidates.values() for d in ids])
            frames.append(score_listed(parsed, terms, lambda ids, _payload: lookup(ids), candidates, o.k, ops, calibration))
        if exact_queries:
            frames.append(score_exact(exact_queries, terms, None, evidence.blocks(o.block_rows), o.k, [ops], calibration)[ops])
        pairs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["query_id", "doc_id", "score"])
        ranked = raw_lookup(evidence, pairs["doc_id"].tolist())
        scores = term_scores_from(pairs, parsed, terms, lambda ids, idx, _qid: ranked(ids)[:, idx], calibration)
        counts = {
            "queries": len(parsed), **fallbacks, "unique_terms": len(terms),
            "mode": o.mode, "operators": str(ops), "scorer": o.scorer, "calibration": describe(evidence, calibration.name),
            "mean_candidates": float(np.mean([len(c[0]) for c in candidates.values()])) if candidates else None,
            **listed,
        }
        return Output(run=rank_pairs(pairs, o.k, "itlr", "itlr"), side={"term_scores": scores}, counts=counts)

    def _parse(self, queries: pa.Table) -> tuple[list, dict]:
        """Each query's logical form, refusing those that do not parse (``on_parse_error:
        refuse``), and the counts of the queries scored as their whole text: ``fallback`` (no
        logical query, or one that does not parse), ``unparsed`` (those that do not parse),
        ``fallback_decompositions`` (a decomposition's fallback: the LLM's output was unusable),
        each with its first 100 query ids."""
        parsed = parse_queries(queries)
        unparsed = unparsed_queries(queries, parsed)
        if unparsed and self.options.on_parse_error == "refuse":
            raise UnparsedQueryError(refusal(unparsed, "decomposition_status" in queries.column_names))
        fallback = [q.query_id for q in parsed if q.status == "fallback"]
        counts = {"fallback": len(fallback), "fallback_query_ids": fallback[:100],
                  "unparsed": len(unparsed), "unparsed_query_ids": [qid for qid, _, _ in unparsed[:100]]}
        if "decomposition_status" in queries.column_names:  # after a decomposition stage: its fallbacks are named too
            ids = queries.column("query_id").to_pylist()
            fell = [qid for qid, status in zip(ids, queries.column("decomposition_status").to_pylist(), strict=True) if status != "ok"]
            counts |= {"fallback_decompositions": len(fell), "fallback_decomposition_query_ids": fell[:100]}
        return parsed, counts

    def _calibration(self, store, terms: list[str], term_vectors) -> Calibration:
        o = self.options
        if o.calibration in (None, "none"):
            return Calibration()
        if o.calibration == "zscore":
            sample = store.sample_vectors(o.calibration_sample)
            return Calibration.zscore(terms, sample @ term_vectors.T)
        labels = _read_labels(o.labels)
        vectors = store.vectors_for(sorted({r["doc_id"] for r in labels}))
        return Calibration.fit_sigmoid(labelled_scores(labels, terms, term_vectors, vectors))


def unparsed_queries(queries: pa.Table, parsed: list) -> list[tuple[str, str, str]]:
    """(query id, logical query, parse error) of each query whose logical query is not blank
    and does not parse (a blank one is no logical query: the text is its one term)."""
    logical = queries.column("logical_query").to_pylist()
    return [(q.query_id, text, q.error) for q, text in zip(parsed, logical, strict=True)
            if q.status == "fallback" and text and text.strip(BLANK)]


def refusal(unparsed: list[tuple[str, str, str]], decomposed: bool = False) -> str:
    """The one line that refuses queries whose logical query does not parse."""
    what = ("decomposition's logical query", "decompositions' logical queries") if decomposed else ("logical query", "logical queries")
    return unparsed_message("itlr", unparsed, what=what, hint=(
        'Quote each term ("vitamin D" AND NOT "bone"), or pass --on-parse-error fallback (stage option on_parse_error: fallback) '
        "to score " + ("its" if len(unparsed) == 1 else "each one's") + " whole text as one term"))


def _read_labels(path: str) -> list[dict]:
    from logicrank.pipelines.files import read_jsonl
    from logicrank.schemas.errors import UserError

    return [obj for _, obj in read_jsonl(path, "itlr: labels", UserError)]


def _term_candidates(parsed, evidence, store, o: ITLROptions):
    """ann mode over bm25 or hybrid evidence: the union of each positive term's ``ann_k`` best
    documents by BM25 (and, for hybrid, by dense search too), per query; the queries without a
    positive term are scored exactly. A query whose positive terms find nothing (BM25 returns
    only documents that share a word) gets no candidates (counted)."""
    order = {t: i for i, t in enumerate(evidence.terms)}
    wanted = sorted({t for q in parsed for t in positive_terms(q.ast)}, key=order.__getitem__)
    bm25 = evidence if evidence.scorer == "bm25" else evidence.bm25
    found = dict(zip(wanted, bm25.top(wanted, o.ann_k), strict=True))
    if evidence.scorer == "hybrid" and wanted:
        T = evidence.dense.T[[order[t] for t in wanted]]
        hits = store.vector_search(T, o.ann_k, nprobes=o.ann_nprobes)
        for qi, doc in zip(hits.column("query_index").to_pylist(), hits.column("doc_id").to_pylist(), strict=True):
            found[wanted[qi]].append(doc)
    candidates, exact = {}, []
    for q in parsed:
        pos = sorted(positive_terms(q.ast), key=order.__getitem__)
        if not pos:
            exact.append(q)
            continue
        ids = list(dict.fromkeys(d for t in pos for d in found[t]))
        if ids:
            candidates[q.query_id] = (np.array(ids, dtype=object), None)
    return candidates, exact


def _listed_ids(path: str, query_ids: set[str], evidence) -> tuple[dict, int]:
    """listed mode over bm25 or hybrid evidence: each query's listed documents the table holds."""
    from logicrank.pipelines.io import read_qrels

    pairs = read_qrels(path).to_pandas()
    pairs = pairs[pairs["query_id"].isin(query_ids)]
    rows = (evidence if evidence.scorer == "bm25" else evidence.bm25).rows
    held = rows.get_indexer(pairs["doc_id"]) >= 0
    out = {qid: (group["doc_id"].to_numpy(dtype=object), None) for qid, group in pairs[held].groupby("query_id", sort=False)}
    return out, int((~held).sum())


def listed_candidates(path: str, query_ids: set[str], store) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
    """query id -> (doc ids, vectors) of the documents a qrels-format file lists for it (those
    in the table), and how many listed pairs name a document the table does not hold."""
    from logicrank.pipelines.io import read_qrels

    pairs = read_qrels(path).to_pandas()
    pairs = pairs[pairs["query_id"].isin(query_ids)]
    vectors = store.vectors_for(pairs["doc_id"].unique().tolist())
    out = {}
    for qid, group in pairs.groupby("query_id", sort=False):
        ids = np.array([d for d in group["doc_id"] if d in vectors], dtype=object)
        out[qid] = (ids, np.stack([vectors[d] for d in ids]) if len(ids) else np.zeros((0, 0), np.float32))
    return out, int((~pairs["doc_id"].isin(list(vectors))).sum())
