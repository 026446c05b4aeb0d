"""Every miss named, nothing padded (pipelines/retrieval/stages/itlr.py over BM25 evidence): a term no
document holds (a misspelling, a stop word, no word at all) is named in the step's counts and on
the terminal and holds for no document whatever the calibration; a document whose score carries
no evidence (no positive term of its query in it, and 0 with the terms it misses counted 0) is
no result unless ``pad``, whatever the calibration and the mode; a NOT over such a term is
refused. Ties at the cut follow the run order (score, then doc id descending). The table is
test_evidence's six documents."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pytest

from logicrank.jobs.retrieve_notes import fallback_notes
from logicrank.pipelines.retrieval.logic.fuzzy import Operators
from logicrank.pipelines.retrieval.logic.query import parse
from logicrank.pipelines.retrieval.methods.evidence import calibrate_evidence, make_evidence
from logicrank.pipelines.retrieval.methods.itlr import Calibration, EmptyNotError, LogicalQuery, score_exact, score_listed
from logicrank.pipelines.retrieval.pipeline import Pipeline
from logicrank.pipelines.retrieval.runner import Inputs
from logicrank.pipelines.retrieval.stages import Context
from logicrank.schemas.errors import UserError
from tests.unit.test_evidence import LIKES, TableStore

IDS = list(LIKES)  # table order: ada, bo, cy, di, ed, fay


def _run(rows, before=(), files=None, **options):
    """The itlr stage over BM25 evidence, after the stages ``before`` (e.g. a bm25 run whose
    candidates it scores): (its run as (doc_id, rank) per query, its step)."""
    queries = pa.table({"query_id": [r[0] for r in rows], "text": [r[1] for r in rows],
                        "logical_query": pa.array([r[2] for r in rows], pa.string())})
    stage = {"itlr": {"scorer": "bm25", "k": 6, **options}}
    result = Pipeline.parse("p", [*before, stage]).run(Context(store=TableStore(LIKES), encoder=lambda: _Encoder()), queries,
                                                       inputs=Inputs("b", encoder="e", files=files or {}))
    run = result.run.to_pandas()
    return {q: list(zip(g["doc_id"], g["rank"], strict=True)) for q, g in run.groupby("query_id")}, result.steps[-1:]


def _encode(texts):
    """A seeded unit vector per text (dense and hybrid evidence need an encoder)."""
    vectors = np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=16) for t in texts])
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


class _Encoder:
    config, model_id = None, "seeded"

    def encode(self, texts):
        return _encode(texts)


@pytest.mark.parametrize(("term", "why"), [("Aples", "in no document"), ("the", "only stop words"), ("🙂", "no word"),
                                           ("x" * 45, "words too long to index"), ("the " + "x" * 45, "only stop words and words too long to index")])
def test_a_term_no_document_holds_returns_nothing_and_is_named(term, why):
    rows = [("q1", "t", f'"{term}"'), ("q2", "t", '"Tea"')]
    runs, (step,) = _run(rows)
    assert "q1" not in runs  # was: the table's first 6 documents, each at score 0
    assert runs["q2"] == [("ed", 1), ("cy", 2)]  # the documents that hold Tea, and only them
    assert (step["empty_terms"], step["empty_term_queries"], step["empty_term_query_ids"]) == ({term: why}, 1, ["q1"])
    assert fallback_notes("p", [step]) == [
        f"retrieve: pipeline 'p', stage itlr: 1 term with no evidence in the table ({term!r}: {why}) holds for no document; "
        "1 query uses it: q1."]
    padded, (step,) = _run(rows, pad=True)  # asked for: the zeros fill k in table order, still named
    assert [d for d, _ in padded["q1"]] == sorted(IDS, reverse=True) and step["empty_term_query_ids"] == ["q1"]


@pytest.mark.parametrize("calibration", ["max", "saturation", "zscore", "none"])
def test_no_calibration_gives_an_empty_term_evidence(calibration):
    """zscore maps a term every document scores 0 on to Phi(0) = 0.5 for all: such a term is 0."""
    runs, (step,) = _run([("q1", "t", '"Aples" OR "Tea"')], calibration=calibration)
    assert [d for d, _ in runs["q1"]][:2] in (["cy", "ed"], ["ed", "cy"]) and step["empty_terms"] == {"Aples": "in no document"}
    if calibration != "zscore":  # zscore grades a document without Tea below the mean, not at 0: it stays ranked
        assert sorted(d for d, _ in runs["q1"]) == ["cy", "ed"]


def test_a_zero_is_dropped_only_without_evidence_for_a_positive_term():
    runs, _ = _run([("q1", "t", '"Tea" AND NOT "Apples"'), ("q2", "t", '"Apples" AND NOT "Pears"'), ("q3", "t", 'NOT "Fay"')])
    assert runs["q1"] == [("ed", 1), ("cy", 2)]  # bo (Apples, no Tea: 0 x 0) is no result; was ranked 3rd
    # ada holds Apples and the strongest Pears (1 - 1 = 0): evidence for the positive term, kept last
    assert [d for d, _ in runs["q2"]][-1] == "ada" and sorted(d for d, _ in runs["q2"]) == ["ada", "bo", "di", "fay"]
    assert sorted(d for d, _ in runs["q3"]) == ["ada", "bo", "cy", "di", "ed"]  # NOT "Fay" holds for them (1); for fay it is 0


EVIDENCE_FREE = {  # query -> the documents it returns (any calibration): each holds a positive term or its NOT carries it
    "q1": ('"Tea" AND NOT "Apples"', {"cy", "ed"}),  # the others hold no Tea, its one positive term: no result
    "q2": ('"Chess" OR "Kites"', {"ada", "bo", "cy", "di"}),
    "q3": ('NOT "Tea"', {"ada", "bo", "di", "fay"}),  # cy and ed hold the most Tea: 0 under max, and no positive term
    "q4": ('"Kites" OR NOT "Apples"', {"ada", "bo", "cy", "di", "ed"}),  # ed: no Kites, no Apples, carried by its NOT; ada
    # and bo: less Apples than fay, so NOT "Apples" is above 0 for them; fay: the most Apples, 0 under max
}
CALIBRATIONS = {"max": "max", "zscore": "zscore", "sigmoid": None}  # sigmoid: fitted parameters given below


def _calibration(ev, name: str) -> Calibration:
    if name == "sigmoid":  # tau 0.5, lambda 4 for every term: a missed term (raw 0) is sigmoid(-2) = 0.12, not 0
        return Calibration("sigmoid", {t: (0.5, 4.0) for t in ev.terms})
    return calibrate_evidence(ev, name)


@pytest.mark.parametrize("calibration", sorted(CALIBRATIONS))
def test_exact_listed_and_after_a_run_drop_the_documents_without_evidence_whatever_the_calibration(calibration):
    """Before, only a composed score of exactly 0 was dropped: under zscore or sigmoid a document
    holding no term of the query scores above 0, so q1 and q2 returned all six documents."""
    store = TableStore(LIKES)
    qs = [LogicalQuery(q, parse(text), "ok") for q, (text, _) in EVIDENCE_FREE.items()]
    terms = ["Tea", "Apples", "Chess", "Kites"]
    ev = make_evidence("bm25", store, terms)
    cal = _calibration(ev, calibration)
    exact = score_exact(qs, terms, None, ev.blocks(4), 6, [Operators()], cal, threads=2, drop_unsupported=True)[Operators()]
    listed = score_listed(qs, terms, lambda ids, _p: ev.raw(ids), {q.query_id: (np.array(IDS, dtype=object), None) for q in qs},
                          6, Operators(), cal, drop_unsupported=True)
    for q, (_, want) in EVIDENCE_FREE.items():
        if calibration == "max" or q in ("q1", "q2"):  # under zscore and sigmoid a NOT over the most Tea or Apples is above 0
            assert set(exact[exact["query_id"] == q]["doc_id"]) == want
        assert set(exact[exact["query_id"] == q]["doc_id"]) == set(listed[listed["query_id"] == q]["doc_id"]) >= want
    padded = score_exact(qs, terms, None, ev.blocks(4), 6, [Operators()], cal, threads=2)[Operators()]
    assert (padded["query_id"] == "q1").sum() == 6  # without the rule (pad), the documents without Tea fill k


@pytest.mark.parametrize("calibration", ["max", "saturation", "zscore", "none"])
def test_the_stage_returns_no_document_without_evidence_exact_or_after_a_run(calibration):
    rows = [("q1", "likes", EVIDENCE_FREE["q1"][0]), ("q2", "likes", EVIDENCE_FREE["q2"][0])]
    for before in ([], [{"bm25": {"k": 6}}]):  # every document, or a bm25 run's six candidates ("likes": every document)
        runs, _ = _run(rows, before, calibration=calibration)
        assert runs["q1"] == [("ed", 1), ("cy", 2)]  # cy and ed tie (Tea alike, no Apples): doc id descending
        assert sorted(d for d, _ in runs["q2"]) == ["ada", "bo", "cy", "di"]
    padded, _ = _run(rows, calibration=calibration, pad=True)
    assert padded["q1"][:2] == [("ed", 1), ("cy", 2)] and len(padded["q1"]) == 6  # asked for: k filled


@pytest.mark.parametrize("mode", ["after a run", "listed"])
def test_ties_at_the_cut_are_kept_and_ordered_by_one_rule(tmp_path, mode):
    """NOT "Tea" scores 1 for the four documents without Tea: the k kept are the first k of the
    run's order (score descending, then doc id descending), whatever order the candidates came
    in (before: the first k in the incoming order, ada and bo, then reordered as bo, ada)."""
    pairs = tmp_path / "pairs.tsv"  # the candidates in table order, as bm25 "likes" need not give them
    pairs.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q1\t{d}\t1\n" for d in IDS))
    options = {"mode": "listed", "pairs": str(pairs)} if mode == "listed" else {}
    before = [{"bm25": {"k": 6}}] if mode == "after a run" else []
    files = {str(pairs): "pairs"}
    full, _ = _run([("q1", "likes", 'NOT "Tea"')], before, files, **options)
    assert full["q1"] == [("fay", 1), ("di", 2), ("bo", 3), ("ada", 4)]
    for k in (1, 2, 3):
        cut, _ = _run([("q1", "likes", 'NOT "Tea"')], before, files, k=k, **options)
        assert cut["q1"] == full["q1"][:k]


@pytest.mark.parametrize("logical", ['"Apples" AND NOT "the"', '"Apples" AND NOT ("Pears" OR "Aples")', 'NOT "🙂"'])
def test_a_not_over_a_term_no_document_holds_is_refused_in_one_line(logical):
    with pytest.raises(EmptyNotError) as exc:
        _run([("ok", "t", '"Tea"'), ("q7", "t", logical)])
    message = str(exc.value)
    term = next(t for t in ("the", "Aples", "🙂") if f'"{t}"' in logical)
    assert isinstance(exc.value, UserError) and "\n" not in message
    assert message.startswith(f'itlr: query q7\'s NOT "{term}" negates a term no document holds (')
    assert message.endswith("remove the NOT, or negate words the table's documents hold (the scorer's words: bm25 drops stop words), "
                            "or let such a NOT hold for every document (itlr's empty_not: hold).")
    with pytest.raises(EmptyNotError, match=r"^itlr: 2 queries negate terms no document holds \(q1, q2\); q1's NOT \"the\""):
        _run([("q1", "t", '"Apples" AND NOT "the"'), ("q2", "t", 'NOT "Aples"')])


def test_a_not_over_a_term_no_document_holds_may_be_let_hold_for_every_document():
    """``empty_not: hold`` (a benchmark whose terms are titles its documents only paraphrase):
    such a NOT holds for every document, as fuzzy logic reads NOT of no evidence, so the query
    ranks as its other terms do; the queries are counted, not refused."""
    held, step = _run([("q1", "t", '"Apples" AND NOT "Aples"'), ("q2", "t", '"Tea"')], empty_not="hold")
    alone, _ = _run([("q1", "t", '"Apples"')])
    assert held["q1"] == alone["q1"] and held["q2"]
    assert step[0]["empty_nots"] == 1 and step[0]["empty_not_query_ids"] == ["q1"]


def test_a_decomposed_form_negating_a_term_no_document_holds_is_scored_as_its_question():
    """An LLM's form (after a decomposition stage) that negates such a term is not the user's
    query to correct: that query is scored as its question, named and counted; the others keep
    their forms (Qwen on the set-logic dev split wrote `"Quokkas" AND NOT "other than"`)."""
    queries = pa.table({"query_id": ["q1", "q2"], "text": ["Who likes Apples?", "Who likes Tea?"],
                        "logical_query": pa.array(['"Apples" AND NOT "Aples"', '"Tea"'], pa.string()),
                        "decomposition_status": ["ok", "ok"]})
    said = []
    result = Pipeline.parse("p", [{"itlr": {"scorer": "bm25", "k": 6}}]).run(
        Context(store=TableStore(LIKES), encoder=lambda: _Encoder(), echo=said.append), queries, inputs=Inputs("b", encoder="e", files={}))
    step = result.steps[-1]
    assert step["empty_not_decompositions"] == 1 and step["empty_not_decomposition_query_ids"] == ["q1"]
    assert said == ["itlr: 1 decomposed query negates a term no document holds (e.g. q1): scored as their question instead"]
    as_question, _ = _run([("q1", "Who likes Apples?", None)])
    got = result.run.to_pandas()
    assert list(got[got["query_id"] == "q1"]["doc_id"]) == [d for d, _ in as_question["q1"]]
    tea, _ = _run([("q2", "Who likes Tea?", '"Tea"')])
    assert list(got[got["query_id"] == "q2"]["doc_id"]) == [d for d, _ in tea["q2"]]
    # after a rewriter (siar's rule, an expansion's reasoning in text), the question as asked, not the rewritten text
    rewritten = queries.set_column(1, "text", pa.array(["If a person likes fruit, then they like Tea.", "x"])).append_column(
        "original_text", pa.array(["Who likes Apples?", "Who likes Tea?"]))
    again = Pipeline.parse("p", [{"itlr": {"scorer": "bm25", "k": 6}}]).run(
        Context(store=TableStore(LIKES), encoder=lambda: _Encoder()), rewritten, inputs=Inputs("b", encoder="e", files={})).run.to_pandas()
    assert list(again[again["query_id"] == "q1"]["doc_id"]) == [d for d, _ in as_question["q1"]]


def test_dense_and_hybrid_evidence_have_no_empty_term():
    store = TableStore(LIKES)
    for scorer in ("dense", "hybrid"):
        ev = make_evidence(scorer, store, ["the", "Aples"], _encode)
        assert ev.empty_terms() == {} and not ev.sparse
    assert make_evidence("bm25", store, ["the", "Aples", "Apples"]).empty_terms() == {"the": "only stop words", "Aples": "in no document"}
