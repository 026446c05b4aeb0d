"""Strict NOT (ITLR's ``strict_not``): a document whose calibrated evidence for a negated term
reaches the threshold is excluded from the query's results, not demoted, in every path (the
compiled form, exact scoring in blocks, candidates re-scored); and the count of queries whose
every candidate holds a negated term or atom (ITLR's candidate modes, OrLog)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from logicrank.jobs.retrieve_notes import fallback_notes
from logicrank.pipelines.retrieval.logic.fuzzy import Operators, compile_query, negated_conjuncts
from logicrank.pipelines.retrieval.logic.query import Not, Or, Term, parse
from logicrank.pipelines.retrieval.methods.itlr import Calibration, excluded_everywhere, parse_queries, score_exact, score_listed
from logicrank.pipelines.retrieval.methods.orlog import OrlogQuery, negated_everywhere

TERMS = ["malaria", "children", "adults"]
# docs x terms calibrated evidence: d0 malaria only; d1 malaria and children (0.9); d2 malaria, a trace of children (0.2)
S = np.array([[0.9, 0.0, 0.1], [0.95, 0.9, 0.0], [0.8, 0.2, 0.7], [0.1, 0.0, 0.0]], dtype=np.float32)
IDS = np.array(["d0", "d1", "d2", "d3"], dtype=object)
QUERIES = parse_queries(pa.table({"query_id": ["q1", "q2"], "text": ["", ""],
                                  "logical_query": ['"malaria" AND NOT "children"', '"malaria" AND NOT ("children" OR NOT "adults")']}))


def test_a_query_excludes_only_its_negated_conjuncts():
    assert negated_conjuncts(parse('"a" AND NOT ("b" OR NOT "c") AND NOT (NOT "d")')) == [
        Or((Term("b"), Not(Term("c")))), Not(Term("d"))]
    assert negated_conjuncts(parse('NOT "x"')) == [Term("x")]
    assert negated_conjuncts(parse('"a" OR NOT "b"')) == []  # the other side may satisfy it
    assert negated_conjuncts(parse('"a" OR "b"')) == []


@pytest.mark.parametrize(("query", "row", "excluded"), [
    ('"a" AND NOT ("b" AND "c")', [0.9, 0.9, 0.1], False),  # holds a and b, not c: satisfies the query
    ('"a" AND NOT ("b" AND "c")', [0.9, 0.9, 0.9], True),
    ('"a" AND NOT ("b" OR "c")', [0.9, 0.1, 0.9], True),
    ('"a" OR NOT "b"', [0.9, 0.9, 0.0], False),  # satisfies the OR by a
    ('"a" OR NOT "b"', [0.0, 0.9, 0.0], False),  # a NOT inside an OR stays fuzzy
])
def test_strict_not_excludes_what_violates_a_negated_conjunct_in_boolean_logic(query, row, excluded):
    got = compile_query(parse(query), ["a", "b", "c"], Operators(strict_not=0.5))(np.array([row], np.float32))[0]
    assert np.isneginf(got) == excluded


def test_a_document_holding_a_negated_term_is_excluded_and_the_others_keep_their_fuzzy_scores():
    fuzzy, strict = Operators(), Operators(strict_not=0.5)
    q = QUERIES[0].ast
    got, want = compile_query(q, TERMS, strict)(S), compile_query(q, TERMS, fuzzy)(S)
    assert np.isneginf(got[1]) and np.isfinite(got[[0, 2, 3]]).all()
    np.testing.assert_allclose(got[[0, 2, 3]], want[[0, 2, 3]])  # 0.2 of children is under the threshold: demoted only
    assert str(strict) == "and=product,or=sum,not=complement,strict_not=0.5" and str(fuzzy) == "and=product,or=sum,not=complement"
    assert np.isneginf(compile_query(q, TERMS, Operators(strict_not=0.2))(S)[2])  # the threshold is inclusive


@pytest.mark.parametrize("path", ["exact", "listed"])
def test_no_returned_document_holds_a_negated_term_at_the_threshold(path):
    ops = Operators(strict_not=0.5)
    if path == "exact":
        run = score_exact(QUERIES, TERMS, None, [(IDS[:2], S[:2]), (IDS[2:], S[2:])], 10, [ops], Calibration())[ops]
    else:
        candidates = {q.query_id: (IDS, None) for q in QUERIES}
        run = score_listed(QUERIES, TERMS, lambda ids, _: S[[list(IDS).index(d) for d in ids]], candidates, 10, ops, Calibration())
    got = {q: list(g["doc_id"]) for q, g in run.groupby("query_id")}
    assert "d1" not in got["q1"] and set(got["q1"]) == {"d0", "d2", "d3"}
    # q2 excludes "children" OR NOT "adults": d1 (children), d0 and d3 (no adults) are out; d2 (children 0.2, adults 0.7) stays
    assert got["q2"] == ["d2"]
    assert np.isfinite(run["score"]).all()


def test_queries_whose_every_candidate_holds_a_negated_term_are_counted_and_named_on_the_terminal():
    candidates = {"q1": (np.array(["d1"], dtype=object), None), "q2": (IDS, None)}
    raw = lambda ids, _: S[[list(IDS).index(d) for d in ids]]  # noqa: E731
    assert excluded_everywhere(QUERIES, TERMS, raw, candidates, Calibration(), 0.5) == ["q1"]
    assert excluded_everywhere(QUERIES, TERMS, raw, candidates, Calibration(), None) == []
    step = {"stage": "itlr", "unsatisfiable": 1, "unsatisfiable_query_ids": ["q1"]}
    assert fallback_notes("itlr-ann", [step]) == [
        "retrieve: pipeline 'itlr-ann', stage itlr: 1 query whose every candidate holds a negated term or atom, so none satisfies its NOT "
        "(give the stage a deeper or another first stage, or use itlr's exact mode): q1."]


def test_over_bm25_evidence_a_document_without_a_negated_term_does_not_hold_it_in_the_count():
    """BM25's evidence is sparse: a raw 0 is a term the document misses. zscore calibrates it to
    about 0.5 (exactly 0.5 for a term its sample lacks), so the count at 0.5 named a query whose
    candidates all lack the negated term as unsatisfiable. Counted over the missed terms at 0."""
    terms = ["a", "b"]
    queries = parse_queries(pa.table({"query_id": ["q"], "text": [""], "logical_query": ['"a" AND NOT "b"']}))
    raw = np.array([[3.0, 0.0]] * 5 + [[3.0, 4.0]], np.float32)  # d5 alone holds b
    ids = np.array([f"d{i}" for i in range(6)], dtype=object)
    zscore = Calibration.zscore(terms, np.array([[1.0, 0.0], [3.0, 0.0]], np.float32))  # b in none of the sample: 0.5 where missed
    assert zscore.apply(raw, terms)[0, 1] == pytest.approx(0.5)
    looked = lambda want, _: raw[[list(ids).index(d) for d in want]]  # noqa: E731
    assert excluded_everywhere(queries, terms, looked, {"q": (ids, None)}, zscore, 0.5, sparse=True) == []
    assert excluded_everywhere(queries, terms, looked, {"q": (ids[5:], None)}, zscore, 0.5, sparse=True) == ["q"]  # d5 holds b


def test_orlog_counts_the_queries_whose_every_candidate_holds_a_negated_atom():
    qs = [OrlogQuery("q1", "cancer but not breast or lung", (("a1", "{x} is about cancer"), ("a2", "{x} is about breast cancer")),
                     parse('"a1" AND NOT "a2"'), "ok"),
          OrlogQuery("q2", "cancer", (("a1", "{x} is about cancer"),), parse('"a1"'), "ok")]
    scored = pd.DataFrame({"query_id": ["q1"] * 4 + ["q2"] * 2, "doc_id": ["d1", "d1", "d2", "d2", "d1", "d2"],
                           "atom_id": ["a1", "a2", "a1", "a2", "a1", "a1"], "p_calibrated": [0.9, 0.8, 0.9, 0.6, 0.9, 0.1]})
    assert negated_everywhere(qs, scored) == ["q1"]
    scored.loc[3, "p_calibrated"] = 0.4  # d2 no longer holds the negated atom
    assert negated_everywhere(qs, scored) == []


@pytest.mark.parametrize(("options", "message"), [
    ({"strict_not": 0.5}, "with scorer dense give a calibration \\(zscore or sigmoid\\)"),  # raw cosines are not calibrated
    ({"strict_not": 0.5, "scorer": "bm25", "calibration": "none"}, "with scorer bm25 give a calibration \\(max or saturation\\)"),
    # a document without the term scores 0, which zscore and sigmoid calibrate to about 0.5: the threshold excluded them all
    ({"strict_not": 0.5, "scorer": "bm25", "calibration": "zscore"}, "needs a calibration that keeps a missed term at 0"),
    ({"strict_not": 0.3, "scorer": "bm25", "calibration": "sigmoid", "labels": "l.jsonl"}, "needs a calibration that keeps a missed term at 0"),
    ({"strict_not": 0, "scorer": "bm25"}, "greater than 0"),
    ({"strict_not": 1.5, "scorer": "bm25"}, "less than or equal to 1"),
])
def test_strict_not_needs_calibrated_evidence_and_a_threshold_in_0_1(options, message):
    from logicrank.pipelines.retrieval.pipeline import Pipeline, PipelineError

    with pytest.raises(PipelineError, match=message):
        Pipeline.parse("x", [{"itlr": options}])
    Pipeline.parse("ok", [{"itlr": {"strict_not": 0.5, "calibration": "zscore"}}])
    Pipeline.parse("ok", [{"itlr": {"strict_not": 0.5, "scorer": "hybrid"}}])  # hybrid's evidence is calibrated already


def test_strict_not_keeps_the_sum_ors_values_past_one_as_docs_itlr_says():
    """docs/itlr.md said strict NOT keeps every value in [0, 1]; it drops documents at or above
    its threshold only, and negated terms each just under it sum past 1 under the sum OR. The
    page's figures, computed: 0.548 above 0.144 for a document holding the negated terms less."""
    f = compile_query(parse('"x" AND NOT ("a" OR "b") AND NOT ("c" OR "d")'), ["x", "a", "b", "c", "d"], Operators(strict_not=0.9))
    np.testing.assert_allclose(f(np.array([[0.9, 0.89, 0.89, 0.89, 0.89], [0.9, 0.3, 0.3, 0.3, 0.3]])), [0.548, 0.144], atol=5e-4)
    g = compile_query(parse('"x" AND NOT ("a" OR "b") AND NOT ("c" OR "d")'), ["x", "a", "b", "c", "d"], Operators())
    np.testing.assert_allclose(g(np.array([[1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 0.1, 0.1, 0.1, 0.1]])), [1.0, 0.64], atol=1e-12)
