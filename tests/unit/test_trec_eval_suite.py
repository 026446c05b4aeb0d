"""Every measure of trec_eval's own test suite (test/out.test.a: ``trec_eval -a``), through our
evaluate path, equals trec_eval's output to 4 decimals, per query and over queries.

trec_eval's test inputs (test/qrels.test, test/results.test) are not here: the qrels, run and
trec_eval 10.0's output on them are in tests/data/trec_eval (make_data.py says what they hold
and how the output was made). The measures pytrec_eval computes also equal pytrec_eval's to
1e-9 (the same C code), except the two whose rounding trec_eval 10 changed.
"""

import math
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytrec_eval

from logicrank.pipelines.evaluation import trec10
from logicrank.pipelines.evaluation.core import run_metrics
from logicrank.pipelines.evaluation.measures import Measure, MeasureError, parse_measure, parse_measures
from logicrank.pipelines.io import read_qrels, read_run
from logicrank.schemas.tables import AGGREGATE_QUERY_ID
from tests.data.trec_eval.make_data import data

DATA = Path(__file__).resolve().parents[1] / "data" / "trec_eval"
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
# trec_eval prints 4 decimals: a value within half a unit of the last digit equals it.
PRINTED = 0.5e-4 + 1e-12
# Computed by trec10.py, not pytrec_eval: new in trec_eval 10, or rounded otherwise there.
TREC10 = [n for n in OUT_TEST_A if parse_measure(n).name in trec10.FAMILIES]
PYTREC = [n for n in OUT_TEST_A if n not in TREC10]


def _family(name: str) -> str:
    """trec_eval's measure of a printed name (P_5 -> P, Rprec_mult_0.20 -> Rprec_mult), for its aggregation."""
    return re.sub(r"_[0-9]+(\.[0-9]+)?$", "", name)


def _trec_eval_output(name: str) -> dict[tuple[str, str], float]:
    """(query, measure) -> value, from ``trec_eval -q -c`` output; runid and relstring are not measures."""
    out = {}
    for line in (DATA / name).read_text().splitlines():
        measure, qid, value = line.split()
        if measure not in ("runid", "relstring"):
            out[(qid, measure)] = float(value)
    return out


@pytest.fixture(scope="module")
def files():
    qrels, run = data()
    return DATA / "qrels.txt", DATA / "run.txt", qrels, run


def _ours(qrels_path, run_path, names) -> dict:
    ours = run_metrics(read_run(run_path), read_qrels(qrels_path), parse_measures(names)).to_pandas()
    return ours.set_index(["query_id", "measure"])["value"].to_dict()


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


def test_the_committed_inputs_are_make_datas():
    qrels, run = data()
    assert (DATA / "qrels.txt").read_text() == "".join(f"{q} 0 {d} {r}\n" for q, d, r in qrels)
    assert (DATA / "run.txt").read_text() == "".join(f"{q} Q0 {d} {i} {s} STANDARD\n" for i, (q, d, s) in enumerate(run))


def test_every_trec_eval_name_of_its_test_suite_equals_trec_eval(files):
    qrels_path, run_path, qrels_rows, run_rows = files
    ref = _trec_eval_output("trec_eval.out")
    assert sorted({m for _, m in ref}) == sorted(OUT_TEST_A) and len(OUT_TEST_A) == 98
    assert {q for q, _ in ref} == {"1", "2", "3", "4", "5", "6", AGGREGATE_QUERY_ID}
    ours = _ours(qrels_path, run_path, OUT_TEST_A)
    for (qid, name), value in ref.items():
        assert ours[(qid, str(parse_measure(name)))] == pytest.approx(value, abs=PRINTED), (name, qid)
    assert ("99", "MAP") not in ours
    # the data exercise what the names measure
    assert ref[("6", "num_rel")] > 0 and ref[("6", "map")] == 0 and ref[("4", "num_rel")] == 0
    assert ref[("2", "unj_5")] > 0 and ref[("3", "rbp_resid")] == 0 < ref[("2", "rbp_resid")] and 0 < ref[("all", "rbp")] < 1
    assert ref[(AGGREGATE_QUERY_ID, "num_ret")] == len([r for r in run_rows if r[0] != "99"])


def test_parameterised_trec_eval_names_equal_trec_eval(files):
    qrels_path, run_path, _, _ = files
    ref = _trec_eval_output("trec_eval.params.out")
    assert sorted({m for _, m in ref}) == ["iprec_at_recall_0.33", "rbp_p=0.95", "unj_3", "unj_30"]
    ours = _ours(qrels_path, run_path, ["rbp_p=0.95", "unj_3", "unj_30", "iprec_at_recall_0.33"])
    for (qid, name), value in ref.items():
        assert ours[(qid, name)] == pytest.approx(value, abs=PRINTED), (name, qid)


def test_pytrec_eval_s_measures_equal_pytrec_eval(files):
    """The same C code: equal to 1e-9, per query and aggregated as trec_eval aggregates."""
    qrels_path, run_path, qrels_rows, run_rows = files
    ours = _ours(qrels_path, run_path, PYTREC)
    ref = _reference(qrels_rows, run_rows)
    for name in PYTREC:
        label = str(parse_measure(name))
        for qid, values in ref.items():
            assert ours[(qid, label)] == pytest.approx(values[name], abs=1e-9), (name, qid)
        total = pytrec_eval.compute_aggregated_measure(_family(name), [values[name] for values in ref.values()])
        assert ours[(AGGREGATE_QUERY_ID, label)] == pytest.approx(total, abs=1e-9), name


def test_trec_eval_10_rounds_recall_levels_where_ir_measures_iprec_keeps_trec_eval_9s(files):
    """iprec_at_recall_r is trec_eval 10's (round(r * R)); IPrec@r is ir_measures', from
    pytrec_eval's trec_eval 9 (int(r * R + 0.9)). On query 2 (R = 23) they differ at 0.10: 2 against 3 documents."""
    qrels_path, run_path, qrels_rows, run_rows = files
    ours = _ours(qrels_path, run_path, ["iprec_at_recall_0.10", "IPrec@0.1", "11pt_avg"])
    ref, old = _trec_eval_output("trec_eval.out"), _reference(qrels_rows, run_rows)
    assert ref[("2", "num_rel")] == 23
    assert ours[("2", "iprec_at_recall_0.10")] == pytest.approx(ref[("2", "iprec_at_recall_0.10")], abs=PRINTED)
    assert ours[("2", "IPrec@0.1")] == pytest.approx(old["2"]["iprec_at_recall_0.10"], abs=1e-9)
    assert abs(ours[("2", "iprec_at_recall_0.10")] - ours[("2", "IPrec@0.1")]) > 0.01
    assert abs(ref[("2", "11pt_avg")] - old["2"]["11pt_avg"]) > 1e-3


def test_a_parquet_run_is_ranked_by_its_rank_column_not_by_score(files, tmp_path):
    """Ties ranked by docno ascending (trec_eval would put them descending): every measure
    follows the ranks, as it follows the scores of a TREC file ranked the same way."""
    _, _, qrels_rows, run_rows = files
    rows = sorted(((q, d, s) for q, d, s in run_rows), key=lambda r: (r[0], -r[2], r[1]))
    rank, last = [], None
    for q, _, _ in rows:
        rank.append(1 if q != last else rank[-1] + 1)
        last = q
    run = pa.table({"query_id": [r[0] for r in rows], "doc_id": [r[1] for r in rows], "rank": pa.array(rank, pa.int32()),
                    "score": [r[2] for r in rows], "method": ["m"] * len(rows), "run_id": ["r"] * len(rows)})
    same_order = tmp_path / "by_rank.txt"  # the ranks as TREC scores, without ties
    same_order.write_text("".join(f"{q} Q0 {d} {k} {-k} r\n" for (q, d, _), k in zip(rows, rank, strict=True)))
    qrels = read_qrels(DATA / "qrels.txt")
    measures = parse_measures(OUT_TEST_A)

    def values(run_table):
        return run_metrics(run_table, qrels, measures).to_pandas().set_index(["query_id", "measure"])["value"]

    ours, by_rank, by_score = values(run), values(read_run(same_order)), values(read_run(DATA / "run.txt"))
    assert (ours - by_rank).abs().max() < 1e-12
    reference = _reference(qrels_rows, [(q, d, -float(k)) for (q, d, _), k in zip(rows, rank, strict=True)])
    for name in PYTREC:
        for qid, value in reference.items():
            assert ours[(qid, str(parse_measure(name)))] == pytest.approx(value[name], abs=1e-9), (name, qid)
    assert (ours - by_score).abs().max() > 1e-3  # the tie order matters on these data


def test_measures_beyond_trec_eval_follow_their_definitions(files):
    """MRR@k (ir_measures' msmarco provider), Judged@k (its judged provider), F1@k (ours, of P@k and R@k)."""
    qrels_path, run_path, qrels_rows, run_rows = files
    run, qrels = read_run(run_path), read_qrels(qrels_path)
    ours = run_metrics(run, qrels, parse_measures(["MRR@10", "Judged@10", "F1@10", "P@10", "R@10"])).to_pandas()
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


@pytest.mark.parametrize(("name", "message"), [
    ("Rprec_mult", "takes a parameter, e.g. Rprec_mult_0.20"), ("relative_P", "takes a parameter, e.g. relative_P_10"),
    ("gm_map_5", "takes no parameter"), ("unj", "takes a parameter, e.g. unj_10"), ("unj_0", "positive integer"),
    ("unj_2.5", "positive integer"), ("rbp_5", "takes no parameter but its persistence, e.g. rbp_p=0.95"),
    ("rbp_p=1.5", r"persistence p must be in \(0, 1\)"), ("rbp_resid_p=0", r"must be in \(0, 1\)"),
    ("iprec_at_recall_1.5", r"recall level must be in \[0, 1\]")])
def test_trec_eval_only_names_parse_back_to_themselves_and_refuse_a_wrong_parameter(name, message):
    for good in ("gm_map", "Rprec_mult_0.20", "relative_P_5", "utility", "11pt_avg", "num_nonrel_judged_ret", "rbp", "rbp_p=0.95",
                 "rbp_resid", "rbp_resid_p=0.5", "unj_10", "iprec_at_recall_0.50"):
        assert str(parse_measure(good)) == good and parse_measure(str(parse_measure(good))) == parse_measure(good)
    with pytest.raises(MeasureError, match=message):
        parse_measure(name)


def test_trec_eval_10_measures_by_hand():
    """Five relevant documents; the run finds three of them at ranks 1, 3 and 6, around three unjudged ones."""
    judged = {f"d{i}": 1 for i in range(1, 6)}
    docs = {"d1": 6.0, "x1": 5.0, "d2": 4.0, "x2": 3.0, "x3": 2.0, "d3": 1.0}

    def value(family, params, docs, judged):
        return trec10.value(family, params, trec10.ranked_relevance(docs, judged), judged)

    # round(0.5 * 5) = 3 relevant (halves up, as C's lround; Python's round gives 2), first reached at rank 6
    assert value("iprec_at_recall", "0.50", docs, judged) == pytest.approx(3 / 6)
    assert value("iprec_at_recall", "0.40", docs, judged) == pytest.approx(2 / 3)  # 2 relevant: rank 3
    assert value("iprec_at_recall", "0.80", docs, judged) == 0.0  # 4 relevant: never reached
    assert value("unj", "3", docs, judged) == pytest.approx(1 / 3)
    assert value("unj", "10", docs, judged) == pytest.approx(3 / 10)  # a short ranking counts as judged below
    assert value("rbp", "", docs, judged) == pytest.approx(0.1 * (1 + 0.9**2 + 0.9**5))
    assert value("rbp_resid", "", docs, judged) == pytest.approx(0.9**6 + 0.1 * (0.9 + 0.9**3 + 0.9**4))
    graded = {"d1": 4, "d2": 2, "d3": 0}
    assert value("rbp", "p=0.5", docs, graded) == pytest.approx(0.5 * (4 / 4 + 2 / 4 * 0.5**2))  # gains over the top grade


def test_a_query_the_run_misses_scores_0_on_rbp_resid_with_any_persistence():
    """trec_eval -c clears rbp_resid there but leaves rbp_resid_p=... at 1 (upstream's clean-up matches the bare name only)."""
    run = pa.table({"query_id": ["1"], "doc_id": ["a"], "rank": pa.array([1], pa.int32()), "score": [1.0], "run_id": ["r"]})
    qrels = pa.table({"query_id": ["1", "2"], "doc_id": ["a", "b"], "relevance": pa.array([1, 1], pa.int32())})
    ours = run_metrics(run, qrels, parse_measures(["rbp_resid", "rbp_resid_p=0.5", "unj_5"])).to_pandas()
    missed = ours[ours["query_id"] == "2"].set_index("measure")["value"]
    assert missed.to_dict() == {"rbp_resid": 0.0, "rbp_resid_p=0.5": 0.0, "unj_5": 0.0}


def test_trec_eval_s_m_option_spelling_and_its_printed_one_are_one_measure():
    for taken, printed in [("iprec_at_recall.0.10", "iprec_at_recall_0.10"), ("iprec_at_recall_0.1", "iprec_at_recall_0.10"),
                           ("unj.10", "unj_10"), ("unj_010", "unj_10"), ("rbp.p=0.95", "rbp_p=0.95"), ("rbp_p=0.9", "rbp"),
                           ("rbp_resid.p=.5", "rbp_resid_p=0.5"), ("relative_P.5", "relative_P_5")]:
        assert str(parse_measure(taken)) == printed and parse_measure(printed) == parse_measure(taken)
    assert parse_measure("iprec_at_recall_0.10") != parse_measure("IPrec@0.1")  # trec_eval 10's and ir_measures'


@pytest.mark.parametrize(("typed", "printed"), [("Rprec_mult_0.2", "Rprec_mult_0.20"), ("Rprec_mult_2", "Rprec_mult_2.00"),
                                                ("Rprec_mult_2.0", "Rprec_mult_2.00"), ("Rprec_mult.1.2", "Rprec_mult_1.20"),
                                                ("relative_P_05", "relative_P_5"), ("relative_P.010", "relative_P_10")])
def test_a_trec_eval_parameter_spelled_otherwise_gives_the_number_of_its_printed_name(files, typed, printed):
    """pytrec_eval keys its result by trec_eval's printed name (a multiplier to 2 decimals, a
    cutoff as an integer); old code looked the value up under the name as typed and gave 0."""
    qrels_path, run_path, qrels_rows, run_rows = files
    ref = _reference(qrels_rows, run_rows)
    assert any(values[printed] > 0 for values in ref.values())
    ours, theirs = _ours(qrels_path, run_path, [typed]), _ours(qrels_path, run_path, [printed])
    label = str(parse_measure(typed))
    for qid, values in ref.items():
        assert ours[(qid, label)] == pytest.approx(values[printed], abs=1e-4), qid
    assert label == printed and ours == theirs


@pytest.mark.parametrize(("name", "message"), [
    ("Rprec_mult_0.125", "2 decimals"), ("Rprec_mult_0.001", "2 decimals"), ("Rprec_mult_100000", "below 100000"),
    ("relative_P_5.0", "positive integer"), ("relative_P_2.5", "positive integer"), ("relative_P_0", "positive integer")])
def test_a_trec_eval_parameter_its_printed_name_cannot_carry_is_refused(name, message):
    """trec_eval would compute Rprec_mult at 0.125 but print (and key) it as 0.12; a cutoff of 0 aborts pytrec_eval."""
    with pytest.raises(MeasureError, match=message) as exc:
        parse_measures([name])
    assert "\n" not in str(exc.value) and repr(name) in str(exc.value)


@pytest.mark.parametrize("name", ["ndcg_cut_0", "P_0", "recall_0", "map_cut_0", "success_0", "P_00", "ndcg_cut.0"])
def test_a_cutoff_of_0_in_trec_eval_s_spelling_is_refused_as_at_0_is(name):
    # old code: parsed as nDCG@0, P@0..., and pytrec_eval aborted the process (SIGABRT, exit 134)
    with pytest.raises(MeasureError, match="the cutoff must be >= 1") as exc:
        parse_measures([name])
    assert "\n" not in str(exc.value) and repr(name) in str(exc.value)


def test_two_spellings_of_one_trec_eval_measure_are_one_measure():
    # old code: two measures, and pytrec_eval, asked for one twice, aborted the process (SIGABRT, exit 134)
    assert parse_measures(["Rprec_mult_0.20", "Rprec_mult_0.2", "Rprec_mult.0.20"]) == [parse_measure("Rprec_mult_0.20")]
    assert parse_measures(["relative_P_5", "relative_P_05", "P_5", "P_05"]) == [parse_measure("relative_P_5"), parse_measure("P@5")]


def test_evaluate_refuses_in_one_line_or_merges_what_aborted_it(tmp_path):
    """The command itself, in a child process: old code exited 134 (SIGABRT in pytrec_eval) on both."""
    (tmp_path / "qrels.txt").write_text("1 0 a 1\n1 0 b 0\n")
    (tmp_path / "run.txt").write_text("1 Q0 a 1 2 t\n1 Q0 b 2 1 t\n")

    def evaluate(*measures):
        args = [a for m in measures for a in ("--measure", m)]
        return subprocess.run([sys.executable, "-m", "logicrank.cli", "evaluate", "qrels.txt", "run.txt", *args, "--out", "ev"],
                              cwd=tmp_path, capture_output=True, text=True)

    done = evaluate("Rprec_mult_0.20", "Rprec_mult_0.2", "relative_P_5", "relative_P_05")
    assert done.returncode == 0, done.stderr
    assert sorted(set(pq.read_table(tmp_path / "ev" / "metrics.parquet").column("measure").to_pylist())) == [
        "Rprec_mult_0.20", "relative_P_5"]
    done = evaluate("ndcg_cut_0", "P@5")
    assert done.returncode == 2 and "'ndcg_cut_0': the cutoff must be >= 1" in done.stderr, (done.returncode, done.stderr)


def test_a_value_pytrec_eval_leaves_out_is_a_bug_never_a_0():
    """A trec_eval-only measure named otherwise than pytrec_eval keys its value (made by hand:
    parse_measure prints Rprec_mult_0.2 as Rprec_mult_0.20); old code scored every query 0."""
    run = pa.table({"query_id": ["1"], "doc_id": ["a"], "rank": pa.array([1], pa.int32()), "score": [1.0], "run_id": ["r"]})
    qrels = pa.table({"query_id": ["1", "2"], "doc_id": ["a", "b"], "relevance": pa.array([1, 1], pa.int32())})
    with pytest.raises(RuntimeError, match=r"pytrec_eval gave no 'Rprec_mult_0.2' \(asked 'Rprec_mult.0.2'\) for query '1' \(a bug\)"):
        run_metrics(run, qrels, [Measure("Rprec_mult", None, "0.2", trec=True)])


@pytest.mark.parametrize("name", ["P_9223372036854775808", "P@99999999999999999999", "relative_P_9223372036854775808"])
def test_a_cutoff_beyond_trec_eval_s_long_is_refused(name):
    # old code: trec_eval saturated it to 2**63 - 1 and keyed its value so: a KeyError, or a relative_P of 0
    with pytest.raises(MeasureError, match="at most 9223372036854775807") as exc:
        parse_measures([name])
    assert "\n" not in str(exc.value) and repr(name) in str(exc.value)
    assert parse_measures([name.replace("808", "807").replace("99999999999999999999", "9223372036854775807")])
