"""Our measures against pytrec_eval (trec_eval's C code) on real and random data."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import pytrec_eval
from hypothesis import given, settings
from hypothesis import strategies as st

from logicrank.pipelines.evaluation.core import run_metrics
from logicrank.pipelines.evaluation.measures import Measure, MeasureError, parse_measure, parse_measures
from logicrank.pipelines.io import read_qrels, read_queries
from logicrank.pipelines.retrieval.methods.ranking import rank_pairs
from logicrank.schemas.tables import AGGREGATE_QUERY_ID

# our measure -> how pytrec_eval names it (F1 is derived from P and R below)
TREC = {
    "nDCG@10": "ndcg_cut_10",
    "nDCG": "ndcg",
    "P@1": "P_1",
    "P@10": "P_10",
    "R@100": "recall_100",
    "R@10": "recall_10",
    "MRR": "recip_rank",
    "MAP": "map",
    "MAP@100": "map_cut_100",
}
OURS = [*TREC, "F1@10"]


def _trec_reference(run: pa.Table, qrels: pa.Table) -> dict[str, dict[str, float]]:
    q: dict[str, dict[str, int]] = {}
    for r in qrels.to_pylist():
        q.setdefault(r["query_id"], {})[r["doc_id"]] = r["relevance"]
    # trec_eval orders by score; give it scores that encode our rank order exactly.
    rr: dict[str, dict[str, float]] = {}
    for r in run.to_pylist():
        rr.setdefault(r["query_id"], {})[r["doc_id"]] = -float(r["rank"])
    for qid in q:  # trec_eval -c: a query with no results scores 0
        rr.setdefault(qid, {})
    ev = pytrec_eval.RelevanceEvaluator(q, {"ndcg_cut.10", "ndcg", "P.1,10", "recall.10,100", "recip_rank", "map", "map_cut.100"})
    res = ev.evaluate({k: v for k, v in rr.items() if v})
    out = {}
    for qid in q:
        vals = res.get(qid)
        row = {m: (vals[t] if vals else 0.0) for m, t in TREC.items()}
        p, r = row["P@10"], row["R@10"]
        row["F1@10"] = 2 * p * r / (p + r) if p + r else 0.0
        out[qid] = row
    return out


def _assert_matches(run: pa.Table, qrels: pa.Table):
    measures = parse_measures(OURS)
    ours = run_metrics(run, qrels, measures, "r").to_pandas()
    ref = _trec_reference(run, qrels)
    for m in OURS:
        got = ours[ours["measure"] == m].set_index("query_id")["value"]
        expected = pd.Series({qid: row[m] for qid, row in ref.items()})
        np.testing.assert_allclose(got.loc[expected.index].to_numpy(), expected.to_numpy(), atol=1e-6, err_msg=m)
        assert got[AGGREGATE_QUERY_ID] == pytest.approx(expected.mean(), abs=1e-9)


@pytest.fixture(scope="module")
def scifact_tfidf_run():
    """A real run on real qrels: TF-IDF cosine over bundled SciFact, top 100 per query."""
    import gzip
    import json

    from sklearn.feature_extraction.text import TfidfVectorizer

    from logicrank.pipelines.datasets import scifact

    data = scifact()
    with gzip.open(data.corpus, "rt") as f:
        docs = [json.loads(line) for line in f]
    queries = read_queries(data.queries)
    vec = TfidfVectorizer(sublinear_tf=True, stop_words="english")
    D = vec.fit_transform([d["title"] + " " + d["text"] for d in docs])
    Q = vec.transform(queries.column("text").to_pylist())
    S = (Q @ D.T).toarray()
    top = np.argsort(-S, axis=1, kind="stable")[:, :100]
    qids = queries.column("query_id").to_pylist()
    pairs = pd.DataFrame(
        {
            "query_id": np.repeat(qids, 100),
            "doc_id": [docs[j]["_id"] for row in top for j in row],
            "score": np.take_along_axis(S, top, axis=1).reshape(-1),
        }
    )
    return rank_pairs(pairs, 100, "tfidf", "tfidf"), read_qrels(data.qrels)


def test_every_measure_matches_trec_eval_on_scifact(scifact_tfidf_run):
    run, qrels = scifact_tfidf_run
    _assert_matches(run, qrels)
    # the run is real: TF-IDF is far from random on SciFact
    ndcg = run_metrics(run, qrels, [parse_measure("nDCG@10")], "r").to_pandas()
    assert ndcg[ndcg["query_id"] == "all"]["value"].item() > 0.4


@st.composite
def _graded(draw):
    n_q = draw(st.integers(1, 6))
    docs = [f"d{i}" for i in range(12)]
    qrels, run = [], []
    for q in range(n_q):
        judged = draw(st.lists(st.sampled_from(docs), unique=True, max_size=8))
        qrels += [(f"q{q}", d, draw(st.integers(0, 3))) for d in judged]
        ranked = draw(st.lists(st.sampled_from(docs), unique=True, max_size=12))
        run += [(f"q{q}", d, i + 1) for i, d in enumerate(ranked)]
    if not qrels:
        qrels = [("q0", "d0", 1)]
    return qrels, run


@settings(max_examples=150, deadline=None)
@given(_graded())
def test_random_graded_qrels_match_trec_eval(data):
    qrels_rows, run_rows = data
    qrels = pa.table(
        {
            "query_id": [r[0] for r in qrels_rows],
            "doc_id": [r[1] for r in qrels_rows],
            "relevance": pa.array([r[2] for r in qrels_rows], pa.int32()),
        }
    )
    run = pa.table(
        {
            "query_id": [r[0] for r in run_rows],
            "doc_id": [r[1] for r in run_rows],
            "rank": pa.array([r[2] for r in run_rows], pa.int32()),
            "score": [0.0] * len(run_rows),
            "method": ["x"] * len(run_rows),
            "run_id": ["r"] * len(run_rows),
        }
    )
    _assert_matches(run, qrels)


def test_names_parse_once_and_round_trip():
    for text in ["nDCG@10", "P@1", "R@100", "MRR", "MAP", "F1@10", "nDCG", "MRR@10"]:
        m = parse_measure(text)
        assert str(m) == text and parse_measure(str(m)) == m
        assert eval(repr(m).replace("Measure(", "parse_measure(")) == m
    assert parse_measure("ndcg@10") == Measure("nDCG", 10)
    assert len({parse_measure("ndcg@10"), parse_measure("nDCG@10")}) == 1
    assert parse_measures(["P@1", "p@1", "MRR"]) == [Measure("P", 1), Measure("MRR")]


@pytest.mark.parametrize(
    "bad, match",
    [("nDCG@1O", "unknown measure"), ("Recall@10", "unknown measure"), ("P", "needs a cutoff"), ("P@0", "cutoff must be >= 1")],
)
def test_bad_names_list_the_valid_ones(bad, match):
    with pytest.raises(MeasureError, match=match) as exc:
        parse_measures([bad])
    if "unknown" in match:
        assert "nDCG[@k]" in str(exc.value) and "F1@k" in str(exc.value)
