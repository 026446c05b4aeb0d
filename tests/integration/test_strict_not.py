"""Strict NOT on SciFact logical queries (the ``synthetic`` fixture: ITLR's synthetic benchmark
over SciFact text, one query per template): in process, no Ray. Under strict NOT no returned
document holds a negated term (``... AND NOT "term"``) with calibrated evidence at the threshold, over BM25, dense zscore
and hybrid evidence, in exact and ann mode; under fuzzy NOT some do (so the check can fail)."""

from __future__ import annotations

import pytest

import logicrank as lr
from logicrank.pipelines.retrieval.logic.fuzzy import negated_conjuncts
from logicrank.pipelines.retrieval.logic.query import Term
from logicrank.pipelines.retrieval.methods.itlr import parse_queries

pytestmark = [pytest.mark.integration]

SETTINGS = {"bm25": ({"scorer": "bm25"}, 0.3), "zscore": ({"calibration": "zscore"}, 0.4), "hybrid": ({"scorer": "hybrid"}, 0.5)}


def _negated_evidence(result, negated: dict[str, set[str]]):
    side = next(t for name, t in result.side.items() if name.startswith("term_scores/")).to_pandas()
    return side[[term in negated[q] for q, term in zip(side.query_id, side.term, strict=True)]]


@pytest.mark.parametrize("mode", ["exact", "ann"])
def test_no_returned_document_holds_a_negated_term_at_the_threshold(synthetic, mode):
    table = lr.open_table(synthetic / "db")
    queries = lr.read_queries(synthetic / "syn" / "queries.jsonl")
    # the negated terms: each NOT "term" among a query's top-level conjuncts (... AND NOT "term")
    negated = {q.query_id: {x.text for x in negated_conjuncts(q.ast) if isinstance(x, Term)} for q in parse_queries(queries)}
    assert sum(bool(v) for v in negated.values()) >= 5  # 7 of the 32 templates end in AND NOT "term"
    pipes = {}
    for name, (options, threshold) in SETTINGS.items():
        pipes[f"{name}-fuzzy"] = [lr.itlr(k=20, mode=mode, ann_k=20, **options)]
        pipes[f"{name}-strict"] = [lr.itlr(k=20, mode=mode, ann_k=20, strict_not=threshold, **options)]
    results = lr.retrieve(table, queries, pipes)
    for name, (_, threshold) in SETTINGS.items():
        strict, fuzzy = _negated_evidence(results[f"{name}-strict"], negated), _negated_evidence(results[f"{name}-fuzzy"], negated)
        assert len(strict) > 0 and (strict.calibrated < threshold).all(), (name, strict.calibrated.max())
        assert (fuzzy.calibrated >= threshold).any(), name  # fuzzy NOT returns such documents: demoted, not excluded
        pairs = {r: set(zip(*(results[r].run.column(c).to_pylist() for c in ("query_id", "doc_id")), strict=True))
                 for r in (f"{name}-strict", f"{name}-fuzzy")}
        assert pairs[f"{name}-fuzzy"] - pairs[f"{name}-strict"]  # the excluded documents are gone
