"""Every measure of trec_eval's own test suite (test/out.test.a: ``trec_eval -a``), through our
evaluate path, equals trec_eval's C code (pytrec_eval) given trec_eval's names, to 1e-4.

trec_eval's test inputs (test/qrels.test, test/results.test) are not here: the qrels and run
are written below (graded and unjudged documents, tied scores, a short run, a qrels query the
run misses, a query judged without any relevant document, a run query without qrels).
"""

import math
import random
import re

import pyarrow as pa
import pytest
import pytrec_eval

from logicrank.pipelines.evaluate.core import evaluate_run
from logicrank.pipelines.evaluate.measures import MeasureError, parse_measure, parse_measures
from logicrank.pipelines.io import read_qrels, read_run
from logicrank.schemas.tables import AGGREGATE_QUERY_ID

# The measures trec_eval's test/out.test.a prints (usnistgov/trec_eval), in its order; runid is not a measure.
OUT_TEST_A = [
    "num_q", "num_ret", "num_rel", "num_rel_ret", "map", "gm_map", "Rprec", "bpref", "recip_rank",
    *(f"iprec_at_recall_{r / 10:.2f}" for r in range(11)),
    *(f"P_{k}" for k in (5, 10, 15, 20, 30, 100, 200, 500, 1000)),
    *(f"recall_{k}" for k in (5, 10, 15, 20, 30, 100, 200, 500, 1000)),
    "infAP", "gm_bpref", *(f"Rprec_mult_{m / 10:.2f}" for m in range(2, 22, 2)), "utility", "11pt_avg", "binG", "G",
    "ndcg", "ndcg_rel", "Rndcg", *(f"ndcg_cut_{k}" for k in (5, 10, 15, 20, 30, 100, 200, 500, 1000)),
    *(f"map_cut_{k}" for k in (5, 10, 15, 20, 30, 100, 200, 500, 1000)),
    *(f"relative_P_{k}" for k in (5, 10, 15, 20, 30, 100, 200, 500, 1000)),
    "success_1", "success_5", "success_10", "set_P", "set_relative_P", "set_recall", "set_map", "set_F",
    "num_nonrel_judged_ret", "rbp", "rbp_resid", "unj_5", "unj_10", "unj_20",
]
_NOT_IN_PYTREC = "not in ir_measures nor in pytrec_eval's trec_eval (a newer trec_eval's measure)"
# The names the project cannot compute, and why. trec_eval's names that ir_measures does not map
# (gm_map, Rprec_mult_0.20, relative_P_5, utility, ...) are computed by pytrec_eval directly.
EXCLUDED = {"rbp": _NOT_IN_PYTREC, "rbp_resid": _NOT_IN_PYTREC, "unj_5": _NOT_IN_PYTREC, "unj_10": _NOT_IN_PYTREC, "unj_20": _NOT_IN_PYTREC}
COMPUTED = [n for n in OUT_TEST_A if n not in EXCLUDED]


def _family(name: str) -> str:
    """trec_eval's measure of a printed name (P_5 -> P, Rprec_mult_0.20 -> Rprec_mult), for its aggregation."""
    return re.sub(r"_[0-9]+(\.[0-9]+)?$", "", name)


def _data():
    """qrels rows (query, doc, relevance) and TREC run rows (query, doc, score); seeded."""
    rng = random.Random(7)
    pool = [f"D{i:03d}" for i in range(400)]
    qrels, run = [], []
    for q in range(1, 7):
        judged = rng.sample(pool, 60)
        qrels += [(f"{q}", d, rng.choice([0, 0, 0, 1, 1, 2, 3])) for d in judged]
        if q == 6:  # judged, but the run misses it: trec_eval -c
            continue
        n = {3: 4, 4: 120}.get(q, 300)  # a short run; a query judged without any relevant document
        docs = rng.sample(judged, min(40, n)) + rng.sample([d for d in pool if d not in judged], max(0, n - 40))
        rng.shuffle(docs)
        run += [(f"{q}", d, round(rng.random() * 4, 1)) for d in docs]  # one decimal: many tied scores
    qrels = [(q, d, 0 if q == "4" else r) for q, d, r in qrels]
    run += [("99", d, 1.0) for d in pool[:20]]  # a run query without qrels: not evaluated
    return qrels, run


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    qrels, run = _data()
    root = tmp_path_factory.mktemp("trec")
    (root / "qrels.test").write_text("".join(f"{q} 0 {d} {r}\n" for q, d, r in qrels))
    (root / "results.test").write_text("".join(f"{q} Q0 {d} {i} {s} STANDARD\n" for i, (q, d, s) in enumerate(run)))
    return root / "qrels.test", root / "results.test", qrels, run


def _reference(qrels_rows, run_rows) -> dict[str, dict[str, float]]:
    """pytrec_eval on the raw rows with trec_eval's names; a qrels query without results gets an
    empty ranking, as trec_eval -c evaluates it (there iprec_at_recall_0.00 and 11pt_avg are
    0/0, NaN: the project scores such a query 0 on them)."""
    q, r = {}, {}
    for qid, d, rel in qrels_rows:
        q.setdefault(qid, {})[d] = rel
    for qid, d, s in run_rows:
        r.setdefault(qid, {})[d] = s
    for qid in q:
        r.setdefault(qid, {})
    out = pytrec_eval.RelevanceEvaluator(q, {"all_trec"}).evaluate(r)
    for qid, values in out.items():
        if not r[qid]:
            undefined = sorted(k for k, v in values.items() if math.isnan(v))
            assert undefined == ["11pt_avg", "iprec_at_recall_0.00"], undefined
            values.update(dict.fromkeys(undefined, 0.0))
    return out


def test_the_excluded_names_are_refused_in_one_line():
    for name, reason in EXCLUDED.items():
        assert reason
        with pytest.raises(MeasureError) as exc:
            parse_measure(name)
        assert "\n" not in str(exc.value) and name in str(exc.value)
    assert len(COMPUTED) == 93 and len(EXCLUDED) == 5 and len(OUT_TEST_A) == 98


def test_every_computable_trec_eval_name_equals_trec_eval(files):
    qrels_path, run_path, qrels_rows, run_rows = files
    run, qrels = read_run(run_path), read_qrels(qrels_path)
    measures = parse_measures(COMPUTED)
    assert len(measures) == len(COMPUTED)  # 93 distinct measures
    ours = evaluate_run(run, qrels, measures).to_pandas().set_index(["query_id", "measure"])["value"]
    ref = _reference(qrels_rows, run_rows)
    assert set(ref) == {"1", "2", "3", "4", "5", "6"}
    worst = 0.0
    for name in COMPUTED:
        label = str(parse_measure(name))
        for qid, values in ref.items():
            assert ours[(qid, label)] == pytest.approx(values[name], abs=1e-4), (name, qid)
            worst = max(worst, abs(ours[(qid, label)] - values[name]))
        per_query = [values[name] for values in ref.values()]
        total = pytrec_eval.compute_aggregated_measure(_family(name), per_query)  # a sum, a geometric mean (gm_*) or a mean
        assert ours[(AGGREGATE_QUERY_ID, label)] == pytest.approx(total, abs=1e-4), name
        assert ("99", label) not in ours.index
    assert worst < 1e-9  # the same C code
    # the data exercise what the names measure
    assert ours[("6", "NumRel")] > 0 and ours[("6", "MAP")] == 0 and ours[("6", "NumQ")] == 1
    assert ours[("4", "NumRel")] == 0 and ours[(AGGREGATE_QUERY_ID, "NumRet")] == len([r for r in run_rows if r[0] != "99"])
    assert 0 < ours[(AGGREGATE_QUERY_ID, "nDCG@10")] < 1 and 0 < ours[(AGGREGATE_QUERY_ID, "Bpref")] < 1


def test_a_parquet_run_is_ranked_by_its_rank_column_not_by_score(files):
    """Ties ranked by docno ascending (trec_eval would put them descending): every measure follows the ranks."""
    _, _, qrels_rows, run_rows = files
    rows = sorted(((q, d, s) for q, d, s in run_rows), key=lambda r: (r[0], -r[2], r[1]))
    rank, last = [], None
    for q, _, _ in rows:
        rank.append(1 if q != last else rank[-1] + 1)
        last = q
    run = pa.table({"query_id": [r[0] for r in rows], "doc_id": [r[1] for r in rows], "rank": pa.array(rank, pa.int32()),
                    "score": [r[2] for r in rows], "method": ["m"] * len(rows), "run_id": ["r"] * len(rows)})
    qrels = pa.table({"query_id": [r[0] for r in qrels_rows], "doc_id": [r[1] for r in qrels_rows],
                      "relevance": pa.array([r[2] for r in qrels_rows], pa.int32())})
    ours = evaluate_run(run, qrels, parse_measures(COMPUTED)).to_pandas().set_index(["query_id", "measure"])["value"]
    by_rank = _reference(qrels_rows, [(q, d, -float(k)) for (q, d, _), k in zip(rows, rank, strict=True)])
    by_score = _reference(qrels_rows, run_rows)
    differs = 0
    for name in COMPUTED:
        label = str(parse_measure(name))
        for qid, values in by_rank.items():
            assert ours[(qid, label)] == pytest.approx(values[name], abs=1e-4), (name, qid)
            differs += abs(by_score[qid][name] - values[name]) > 1e-9
    assert differs > 0  # the tie order matters on these data


def test_measures_beyond_trec_eval_follow_their_definitions(files):
    """MRR@k (ir_measures' msmarco provider), Judged@k (its judged provider), F1@k (ours, of P@k and R@k)."""
    qrels_path, run_path, qrels_rows, run_rows = files
    run, qrels = read_run(run_path), read_qrels(qrels_path)
    ours = evaluate_run(run, qrels, parse_measures(["MRR@10", "Judged@10", "F1@10", "P@10", "R@10"])).to_pandas()
    ours = ours.set_index(["query_id", "measure"])["value"]
    judged = {(q, d): r for q, d, r in qrels_rows}
    ranked = run.to_pandas().sort_values(["query_id", "rank"])
    for qid in ["1", "2", "3", "4", "5"]:
        top = ranked[ranked["query_id"] == qid]["doc_id"].tolist()[:10]
        first = next((i for i, d in enumerate(top) if judged.get((qid, d), 0) >= 1), None)
        assert ours[(qid, "MRR@10")] == pytest.approx(0.0 if first is None else 1 / (first + 1))
        assert ours[(qid, "Judged@10")] == pytest.approx(sum((qid, d) in judged for d in top) / len(top))
        p, r = ours[(qid, "P@10")], ours[(qid, "R@10")]
        assert ours[(qid, "F1@10")] == pytest.approx(2 * p * r / (p + r) if p + r else 0.0)
    assert ours[("6", "MRR@10")] == ours[("6", "Judged@10")] == ours[("6", "F1@10")] == 0


@pytest.mark.parametrize(("name", "message"), [("Rprec_mult", "takes a parameter, e.g. Rprec_mult_0.20"),
                                               ("relative_P", "takes a parameter, e.g. relative_P_10"), ("gm_map_5", "takes no parameter")])
def test_trec_eval_only_names_parse_back_to_themselves_and_refuse_a_wrong_parameter(name, message):
    for good in ("gm_map", "Rprec_mult_0.20", "relative_P_5", "utility", "11pt_avg", "num_nonrel_judged_ret"):
        assert str(parse_measure(good)) == good and parse_measure(str(parse_measure(good))) == parse_measure(good)
    with pytest.raises(MeasureError, match=message):
        parse_measure(name)
