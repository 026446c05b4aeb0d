"""Every miss named, nothing padded (pipelines/stages/itlr.py over BM25 evidence): a term no
document holds (a misspelling, a stop word, no word at all) is named in the step's counts and on
the terminal and holds for no document whatever the calibration; a document whose composed
score carries no evidence (0, and no positive term of its query in it) is no result unless
``pad``; a NOT over such a term is refused. The table is test_evidence's six documents."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pytest

from logicrank.pipelines.logic.fuzzy import Operators
from logicrank.pipelines.logic.query import parse
from logicrank.pipelines.methods.evidence import calibrate_evidence, make_evidence
from logicrank.pipelines.methods.itlr import EmptyNotError, LogicalQuery, compose, score_exact, score_listed, unsupported
from logicrank.pipelines.notes import fallback_notes
from logicrank.pipelines.pipeline import Pipeline
from logicrank.pipelines.runner import Inputs
from logicrank.pipelines.stages import Context
from logicrank.schemas.errors import UserError
from tests.unit.test_evidence import LIKES, TableStore

IDS = list(LIKES)  # table order: ada, bo, cy, di, ed, fay


def _run(rows, **options):
    """The itlr stage over BM25 evidence: (its run as (doc_id, rank) per query, its step)."""
    queries = pa.table({"query_id": [r[0] for r in rows], "text": [r[1] for r in rows],
                        "logical_query": pa.array([r[2] for r in rows], pa.string())})
    stage = {"itlr": {"scorer": "bm25", "k": 6, **options}}
    result = Pipeline.parse("p", [stage]).run(Context(store=TableStore(LIKES), encoder=lambda: _Encoder()), queries,
                                              inputs=Inputs("b", encoder="e", files={}))
    run = result.run.to_pandas()
    return {q: list(zip(g["doc_id"], g["rank"], strict=True)) for q, g in run.groupby("query_id")}, result.steps


def _encode(texts):
    """A seeded unit vector per text (dense and hybrid evidence need an encoder)."""
    vectors = np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=16) for t in texts])
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


class _Encoder:
    config, model_id = None, "seeded"

    def encode(self, texts):
        return _encode(texts)


@pytest.mark.parametrize(("term", "why"), [("Aples", "in no document"), ("the", "only stop words"), ("🙂", "no word")])
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


def test_exact_and_listed_drop_the_same_documents():
    store = TableStore(LIKES)
    qs = [LogicalQuery("q1", parse('"Tea" AND NOT "Apples"'), "ok"), LogicalQuery("q2", parse('"Chess" OR "Kites"'), "ok"),
          LogicalQuery("q3", parse('NOT "Apples"'), "ok")]
    terms = ["Tea", "Apples", "Chess", "Kites"]
    ev = make_evidence("bm25", store, terms)
    cal = calibrate_evidence(ev, "max")
    raw = ev.raw(IDS)
    full = compose(qs, terms, raw, Operators(), cal)
    exact = score_exact(qs, terms, None, ev.blocks(4), 6, [Operators()], cal, threads=2, drop_unsupported=True)[Operators()]
    listed = score_listed(qs, terms, lambda ids, _p: ev.raw(ids), {q.query_id: (np.array(IDS, dtype=object), None) for q in qs},
                          6, Operators(), cal, drop_unsupported=True)
    for i, q in enumerate(qs):
        keep = {d for d, gone in zip(IDS, unsupported(q, terms, raw, full[i]), strict=True) if not gone}
        assert set(exact[exact["query_id"] == q.query_id]["doc_id"]) == keep == set(listed[listed["query_id"] == q.query_id]["doc_id"])
    assert set(exact[exact["query_id"] == "q3"]["doc_id"]) == {"ada", "bo", "cy", "di", "ed"}  # NOT "Apples" is 0 for fay's (the most)


@pytest.mark.parametrize("logical", ['"Apples" AND NOT "the"', '"Apples" AND NOT ("Pears" OR "Aples")', 'NOT "🙂"'])
def test_a_not_over_a_term_no_document_holds_is_refused_in_one_line(logical):
    with pytest.raises(EmptyNotError) as exc:
        _run([("ok", "t", '"Tea"'), ("q7", "t", logical)])
    message = str(exc.value)
    term = next(t for t in ("the", "Aples", "🙂") if f'"{t}"' in logical)
    assert isinstance(exc.value, UserError) and "\n" not in message
    assert message.startswith(f'itlr: query q7\'s NOT "{term}" negates a term no document holds (')
    assert message.endswith("remove the NOT, or negate words the table's documents hold (the scorer's words: bm25 drops stop words).")
    with pytest.raises(EmptyNotError, match=r"^itlr: 2 queries negate terms no document holds \(q1, q2\); q1's NOT \"the\""):
        _run([("q1", "t", '"Apples" AND NOT "the"'), ("q2", "t", 'NOT "Aples"')])


def test_dense_and_hybrid_evidence_have_no_empty_term():
    store = TableStore(LIKES)
    for scorer in ("dense", "hybrid"):
        ev = make_evidence(scorer, store, ["the", "Aples"], _encode)
        assert ev.empty_terms() == {} and not ev.sparse
    assert make_evidence("bm25", store, ["the", "Aples", "Apples"]).empty_terms() == {"the": "only stop words", "Aples": "in no document"}
