"""OrLog's pure steps: prompts, calibration, posterior."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from logicrank.pipelines.retrieval.logic.query import parse
from logicrank.pipelines.retrieval.methods.orlog import OrlogQuery, calibrate, content_free_prompts, posteriors, truth_prompts

Q = OrlogQuery("q1", "books set in Paris, not French", (("a1", "{x} is set in Paris"), ("a2", "{x} is French")), parse('"a1" AND NOT "a2"'), "ok")


def test_truth_prompts_put_a_candidates_atoms_together_after_its_context():
    cands = pd.DataFrame({"query_id": ["q1", "q1"], "doc_id": ["d1", "d2"], "base_rank": [1, 2]})
    p = truth_prompts([Q], cands, {"d1": "Les Misérables", "d2": "Ulysses"}, {"d1": "Document: a novel\n"})
    assert list(p["statement"]) == ["Les Misérables is set in Paris", "Les Misérables is French", "Ulysses is set in Paris", "Ulysses is French"]
    assert list(p["context"]) == ["Document: a novel\n"] * 2 + [""] * 2 and p["prompt_id"].is_unique
    assert list(content_free_prompts([Q])["statement"]) == ["N/A is set in Paris", "N/A is French"]


def test_calibrations():
    scored = pd.DataFrame({"query_id": ["q1"] * 4, "atom_id": ["a1", "a2", "a1", "a2"], "logit_true": [2.0, 0.0, 1.0, 1.0], "logit_false": [0.0, 0.0, 0.0, 2.0]})
    sig = lambda d: 1 / (1 + np.exp(-np.asarray(d, dtype=float)))  # noqa: E731
    np.testing.assert_allclose(calibrate(scored, "none"), sig([2, 0, 1, -1]))
    np.testing.assert_allclose(calibrate(scored, "pool-mean"), sig([0.5, 0.5, -0.5, -0.5]))
    cf = pd.DataFrame({"query_id": ["q1", "q1"], "atom_id": ["a1", "a2"], "logit_true": [1.0, 0.0], "logit_false": [0.0, 1.0]})
    np.testing.assert_allclose(calibrate(scored, "content-free", cf), sig([1, 1, 0, 0]))
    with pytest.raises(ValueError, match="valid: none, content-free, pool-mean"):
        calibrate(scored, "platt")


def test_an_infinite_logit_gap_is_certain_and_does_not_move_the_pools_mean():
    """One candidate with its False label masked (-inf): its gap is +inf and its P(True) 1.
    The pool's mean was +inf, so every other candidate's P(True) became 0, and that
    candidate's NaN. The mean is now the finite gaps'. A content-free gap that is infinite
    calibrates nothing: refused in one line."""
    from logicrank.schemas.errors import JobFailed

    scored = pd.DataFrame({"query_id": ["q1"] * 3, "atom_id": ["a1"] * 3,
                           "logit_true": [-1.0, -5.0, 0.0], "logit_false": [-2.0, -1.0, -np.inf]})
    sig = lambda d: 1 / (1 + np.exp(-np.asarray(d, dtype=float)))  # noqa: E731
    np.testing.assert_allclose(calibrate(scored, "pool-mean"), sig([1 - (-1.5), -4 - (-1.5), np.inf]), rtol=1e-12, atol=0)
    masked = pd.DataFrame({"query_id": ["q1"], "atom_id": ["a1"], "logit_true": [0.0], "logit_false": [-np.inf]})
    with pytest.raises(JobFailed, match=r"^orlog: calibration content-free: the atom 'a1' of query 'q1' .* use calibration pool-mean or none\.$"):
        calibrate(scored, "content-free", masked)


def test_the_reasoner_asks_about_the_question_as_asked_not_a_rewritten_text():
    """After siar (its rule the text) or an expansion (its reasoning the text), the reasoner
    asked whether a candidate "is an answer to the question: If a person is a father, then
    ...". It asks about the question the user asked (``original_text``)."""
    import pyarrow as pa

    from logicrank.pipelines.retrieval.methods.orlog import reasoner_prompts

    cands = pd.DataFrame({"query_id": ["q1"], "doc_id": ["d1"], "base_rank": [1]})
    rewritten = pa.table({"query_id": ["q1"], "text": ["If a person is a father, then they are a parent."],
                          "original_text": ["Who is Tom's parent?"]})
    assert reasoner_prompts(rewritten, cands, {"d1": "Tom"}, {})["statement"].tolist() == ["Tom is an answer to the question: Who is Tom's parent?"]
    plain = rewritten.drop_columns(["original_text"])
    assert reasoner_prompts(plain, cands, {"d1": "Tom"}, {})["statement"].tolist() == [
        "Tom is an answer to the question: If a person is a father, then they are a parent."]


def test_an_atom_over_bm25_that_no_candidate_holds_does_not_make_the_query_unsatisfiable():
    """"zebras" is in one document, outside zscore's sample: its mean 0 and spread 1e-6 gave
    every candidate without it P = 0.5, read as holding the negated atom, so the query was
    counted unsatisfiable (and named as needing a deeper first stage). A BM25 miss holds
    nothing, as in ITLR's count; the posteriors are unchanged."""
    import pyarrow as pa

    from logicrank.pipelines.engines.bm25 import BM25Index
    from logicrank.pipelines.retrieval.methods.orlog import negated_everywhere, retrieval_truth

    rng = np.random.default_rng(1)
    docs = {f"d{i:02d}": f"Person {i} likes apples " + " ".join(rng.choice(["tea", "kites", "chess", "tango"], size=1 + i % 5))
            for i in range(40)}
    sample = set(np.random.default_rng(0).choice(40, 10, replace=False).tolist())  # zscore's sample of 10 (evidence.sample)
    docs[f"d{[i for i in range(40) if i not in sample][5]:02d}"] += " and zebras"

    class Store:
        index = BM25Index.build([pa.record_batch({"doc_id": list(docs), "content_hash": [f"h{i}" for i in range(40)],
                                                  "title": [""] * 40, "text": list(docs.values())})], version=1)

        def bm25_index(self):
            return self.index

    q = OrlogQuery("q1", "who likes apples but not zebras", (("a1", "{x} apples"), ("a2", "{x} zebras")), parse('"a1" AND NOT "a2"'), "ok")
    cands = pd.DataFrame({"query_id": "q1", "doc_id": [f"d{i:02d}" for i in range(8)], "base_rank": range(1, 9)})
    assert not any("zebras" in docs[d] for d in cands["doc_id"])
    res = retrieval_truth([q], cands, "bm25", "zscore", Store(), sample=10)
    assert (res[res["atom_id"] == "a2"]["p_true"] == 0.5).all()  # the calibration as it is: undecided
    assert negated_everywhere([q], res) == []
    assert negated_everywhere([q], res.drop(columns="missed")) == ["q1"]  # the count as it was


def test_a_negative_atom_query_falls_back_to_the_question_as_asked():
    """After siar or an expansion, a query with a negative atom ("{x} is not a comedy", for a
    retrieval scorer) fell back to the rewritten text as its one atom; it is the question the
    user asked (``original_text``)."""
    import pyarrow as pa

    from logicrank.pipelines.retrieval.methods.orlog import negative_atoms_as_questions, orlog_queries

    queries = pa.table({"query_id": ["q1"], "text": ["EXPANSION: an answer is a film shot in France"],
                        "original_text": ["Which French films are not comedies?"],
                        "atoms": [[{"id": "a1", "text": "{x} is not a comedy"}]], "logical_query": ['"a1"'],
                        "decomposition_status": ["ok"]})
    qs, fell = negative_atoms_as_questions(orlog_queries(queries))
    assert fell == ["q1"] and qs[0].atoms[0][1] == "{x} answers the question: Which French films are not comedies?", qs[0].atoms


def test_posteriors_per_candidate():
    scored = pd.DataFrame({
        "query_id": ["q1"] * 4, "doc_id": ["d1", "d1", "d2", "d2"], "base_rank": [1, 1, 2, 2],
        "atom_id": ["a1", "a2", "a1", "a2"], "p_calibrated": [0.9, 0.5, 0.6, 0.1],
    })
    post = posteriors([Q], scored).set_index("doc_id")["score"]
    np.testing.assert_allclose(post[["d1", "d2"]], [0.9 * 0.5, 0.6 * 0.9])
    reference = posteriors([Q], scored, reasoner="problog").set_index("doc_id")["score"]
    np.testing.assert_allclose(reference[["d1", "d2"]], post[["d1", "d2"]], atol=1e-12)


def test_posteriors_of_a_batch_equal_each_query_alone():
    """A batch of queries with their own atom ids (some shared, some not), rows shuffled: each
    query's posteriors equal that query scored alone (row order is not part of the contract: the
    stage ranks by score, ties by base rank)."""
    rng = np.random.default_rng(3)
    queries = [
        Q,
        OrlogQuery("q2", "", (("a1", "{x} is red"), ("a3", "{x} is round")), parse('"a1" OR "a3"'), "ok"),
        OrlogQuery("q3", "", (("b1", "{x} is old"),), parse('NOT "b1"'), "ok"),
        OrlogQuery("q4", "", (("a1", "{x} is tall"),), parse('"a1"'), "ok"),  # no candidates: no rows
    ]
    rows = [{"query_id": q.query_id, "doc_id": f"d{c}", "base_rank": c + 1, "atom_id": a, "p_calibrated": rng.uniform()}
            for q in queries[:3] for c in range(5) for a, _ in q.atoms]
    scored = pd.DataFrame(rows).sample(frac=1.0, random_state=1).reset_index(drop=True)
    batch = posteriors(queries, scored)
    assert list(dict.fromkeys(batch["query_id"])) == ["q1", "q2", "q3"]
    for q in queries[:3]:
        alone = posteriors([q], scored[scored["query_id"] == q.query_id]).sort_values("doc_id", ignore_index=True)
        got = batch[batch["query_id"] == q.query_id].sort_values("doc_id", ignore_index=True)
        assert list(got["doc_id"]) == list(alone["doc_id"]) and list(got["base_rank"]) == list(alone["base_rank"])
        np.testing.assert_allclose(got["score"], alone["score"], rtol=0, atol=1e-12)
        p = scored[scored["query_id"] == q.query_id].pivot_table(index="doc_id", columns="atom_id", values="p_calibrated")
        if q.query_id == "q1":
            expect = p["a1"] * (1 - p["a2"])
        elif q.query_id == "q2":
            expect = 1 - (1 - p["a1"]) * (1 - p["a3"])
        else:
            expect = 1 - p["b1"]
        np.testing.assert_allclose(got.set_index("doc_id")["score"], expect[got["doc_id"]], atol=1e-12)


def test_posteriors_name_a_missing_atom():
    scored = pd.DataFrame({"query_id": ["q1"], "doc_id": ["d1"], "base_rank": [1], "atom_id": ["a1"], "p_calibrated": [0.5]})
    with pytest.raises(KeyError, match=r"query 'q1' has no P\(True\) for atom\(s\) \['a2'\]"):
        posteriors([Q], scored)
    other = OrlogQuery("q2", "", (("a2", "{x} is blue"),), parse('"a2"'), "ok")  # a2 is filled, but by q2 only
    both = pd.concat([scored, pd.DataFrame({"query_id": ["q2"], "doc_id": ["d1"], "base_rank": [1], "atom_id": ["a2"], "p_calibrated": [0.5]})])
    with pytest.raises(KeyError, match=r"query 'q1' has no P\(True\) for atom\(s\) \['a2'\]"):
        posteriors([Q, other], both)


def test_a_candidate_whose_every_p_true_is_nan_keeps_its_nan_posterior():
    """A NaN logit gives a NaN P(True), which the stage must refuse (runner.check_scores): a
    candidate whose every atom is NaN (a fallback decomposition has one atom) keeps its row
    with a NaN posterior, where pandas' pivot_table dropped it and the run came out a
    document short, unrefused. Both labels masked (-inf, -inf) is P(True) 0.5, as the engine
    says, in every calibration."""
    one = OrlogQuery("q1", "?", (("a1", "{x} answers the question: ?"),), parse('"a1"'), "fallback")
    scored = pd.DataFrame({"query_id": ["q1"] * 3, "doc_id": ["d1", "d2", "d3"], "base_rank": [1, 2, 3], "atom_id": ["a1"] * 3,
                           "logit_true": [2.0, np.nan, -np.inf], "logit_false": [0.0, 1.0, -np.inf]})
    scored["p_calibrated"] = calibrate(scored, "none")
    np.testing.assert_allclose(scored["p_calibrated"], [1 / (1 + np.exp(-2.0)), np.nan, 0.5])
    masked = pd.DataFrame({"query_id": ["q1"], "atom_id": ["a1"], "logit_true": [-np.inf], "logit_false": [-np.inf]})  # content-free too
    np.testing.assert_allclose(calibrate(scored, "content-free", masked), [1 / (1 + np.exp(-2.0)), np.nan, 0.5])
    post = posteriors([one], scored).set_index("doc_id")["score"]
    assert list(post.index) == ["d1", "d2", "d3"] and np.isnan(post["d2"])
    np.testing.assert_allclose(post[["d1", "d3"]], [1 / (1 + np.exp(-2.0)), 0.5])
