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


_SEEDED = """
import json, sys
import pyarrow as pa
from logicrank.pipelines.evaluation.core import run_metrics
from logicrank.pipelines.evaluation.measures import parse_measures
qrels = pa.table({"query_id": ["q1"] * 4 + ["q2"] * 2, "doc_id": ["d1", "d2", "d3", "d4", "d5", "d6"], "relevance": [1, 2, 0, -1, 2, 1]})
run = pa.table({"query_id": ["q1"] * 5 + ["q2"] * 2, "doc_id": ["dx", "d4", "d3", "d1", "d2", "d6", "d5"],
                "score": [9.0, 5.0, 4.0, 3.0, 2.0, 2.0, 1.0], "rank": [1, 2, 3, 4, 5, 1, 2]})
table = run_metrics(run, qrels, parse_measures(sys.argv[1:]), run_id="r")
print(json.dumps({f"{m}|{q}": v for m, q, v in zip(*(table.column(c).to_pylist() for c in ("measure", "query_id", "value")), strict=True)}))
"""


def test_measures_that_ir_measures_would_file_together_keep_their_own_values_under_any_hash_seed():
    """ir_measures 0.4 puts nDCG without gains and NumRet (and NumQ) in whichever trec_eval
    call its set of measures yields first, and files values by trec_eval's two-decimal name:
    by the hash seed, nDCG@10 took nDCG(gains=...)@10's gains (and that one printed 0), NumRet
    counted only judged documents beside a judged-only P, and IPrec@0.125 beside IPrec@0.12
    printed 0. Each value is trec_eval's (pytrec_eval) in processes of several seeds (1: the
    gains; 4: NumRet)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    asked = ["nDCG(gains={0:0,1:5,2:1})@10", "nDCG@10", "nDCG@5", "P(judged_only=True)@10", "NumRet", "IPrec@0.125", "IPrec@0.12"]
    q = {"q1": {"d1": 1, "d2": 2, "d3": 0, "d4": -1}, "q2": {"d5": 2, "d6": 1}}
    r = {"q1": {"dx": 9.0, "d4": 5.0, "d3": 4.0, "d1": 3.0, "d2": 2.0}, "q2": {"d6": 2.0, "d5": 1.0}}
    plain = pytrec_eval.RelevanceEvaluator(q, {"ndcg_cut.5,10", "num_ret", "iprec_at_recall.0.12"}).evaluate(r)
    gains = pytrec_eval.RelevanceEvaluator({k: {d: {0: 0, 1: 5, 2: 1}.get(v, v) for d, v in docs.items()} for k, docs in q.items()},
                                           {"ndcg_cut.10"}).evaluate(r)
    judged = pytrec_eval.RelevanceEvaluator(q, {"P.10"}, judged_docs_only_flag=True).evaluate(r)
    want = {}
    for qid in q:
        want |= {f"{parse_measure(asked[0])}|{qid}": gains[qid]["ndcg_cut_10"], f"nDCG@10|{qid}": plain[qid]["ndcg_cut_10"],
                 f"nDCG@5|{qid}": plain[qid]["ndcg_cut_5"], f"P(judged_only=True)@10|{qid}": judged[qid]["P_10"],
                 f"NumRet|{qid}": plain[qid]["num_ret"], f"IPrec@0.125|{qid}": plain[qid]["iprec_at_recall_0.12"],
                 f"IPrec@0.12|{qid}": plain[qid]["iprec_at_recall_0.12"]}  # (ir_measures' IPrec: trec_eval's level cut to 2 decimals)
    assert want[f"{parse_measure(asked[0])}|q1"] != want["nDCG@10|q1"] and want["NumRet|q1"] == 5  # the case: values that differ
    for seed in ("1", "4", "5"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", _SEEDED, *asked], capture_output=True, text=True, env=env,
                              cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        for key, value in want.items():
            assert got[key] == pytest.approx(value, abs=1e-9), (seed, key, got[key], value)


def test_a_query_named_as_the_means_row_is_refused_in_one_line():
    """trec_eval, and the metrics table, name the mean's row "all": a query of that id would be
    read as the mean (a pandas traceback before)."""
    from logicrank.pipelines.evaluation.core import EvaluationError

    qrels = pa.table({"query_id": [AGGREGATE_QUERY_ID, "q2"], "doc_id": ["d1", "d2"], "relevance": [1, 1]})
    run = pa.table({"query_id": [AGGREGATE_QUERY_ID, "q2"], "doc_id": ["d1", "d2"], "score": [1.0, 1.0], "rank": [1, 1]})
    with pytest.raises(EvaluationError, match=r"^evaluate: the qrels hold a query 'all', the name of the mean's row; rename"):
        run_metrics(run, qrels, parse_measures(["MRR"]), run_id="r")
