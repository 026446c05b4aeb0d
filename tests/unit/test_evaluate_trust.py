"""Evaluation equals trec_eval (pytrec_eval, its C code) or refuses in one line naming the file.

One test per fault found in the issue "Trust: evaluation never reports a wrong number".
"""

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytrec_eval

from logicrank.jobs.evaluate import evaluation_notes, run_evaluate
from logicrank.pipelines.config.settings import EvaluateConfig
from logicrank.pipelines.evaluation.core import EvaluationError, run_metrics
from logicrank.pipelines.evaluation.measures import parse_measures
from logicrank.pipelines.io import TopicsError, read_qrels, read_run, write_trec_run
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import AGGREGATE_QUERY_ID

# our measure -> pytrec_eval's name
TREC = {"nDCG@10": "ndcg_cut_10", "nDCG": "ndcg", "P@5": "P_5", "R@10": "recall_10", "MRR": "recip_rank", "MAP": "map"}
MEASURES = parse_measures(TREC)


def _run_table(rows, run_id="r"):
    """rows: (query_id, doc_id, rank, score)."""
    q, d, rank, score = zip(*rows, strict=True) if rows else ([], [], [], [])
    n = len(q)
    return pa.table(
        {
            "query_id": list(q), "doc_id": list(d), "rank": pa.array(rank, pa.int32()), "score": pa.array(score, pa.float64()),
            "method": ["m"] * n, "run_id": [run_id] * n,
        }
    )


def _qrels_table(rows):
    q, d, r = zip(*rows, strict=True)
    return pa.table({"query_id": list(q), "doc_id": list(d), "relevance": pa.array(r, pa.int32())})


def _write_trec(path, rows, tag="r"):
    path.write_text("".join(f"{q} Q0 {d} {rank} {score} {tag}\n" for q, d, rank, score in rows))
    return path


def _ours(run, qrels):
    m = run_metrics(run, qrels, MEASURES).to_pandas()
    return m.set_index(["query_id", "measure"])["value"]


def _assert_equals_trec_eval(run, qrels, trec_rows, qrels_rows):
    """Our per-query values of ``run`` equal pytrec_eval's on the raw (query, doc, score) rows."""
    ref_qrels, ref_run = {}, {}
    for q, d, r in qrels_rows:
        ref_qrels.setdefault(q, {})[d] = r
    for q, d, _, s in trec_rows:
        ref_run.setdefault(q, {})[d] = float(s)
    res = pytrec_eval.RelevanceEvaluator(ref_qrels, {"ndcg_cut.10", "ndcg", "P.5", "recall.10", "recip_rank", "map"}).evaluate(ref_run)
    ours = _ours(run, qrels)
    for qid in ref_qrels:
        for m, t in TREC.items():
            expected = res[qid][t] if qid in res else 0.0  # trec_eval -c
            assert ours[qid, m] == pytest.approx(expected, abs=1e-9), (qid, m)


def _one_line(exc):
    assert isinstance(exc.value, UserError) and "\n" not in str(exc.value)
    return str(exc.value)


QRELS = [("q1", "d1", 1), ("q1", "d2", 2), ("q2", "d3", 1)]


def test_repeated_run_pairs_are_refused_or_deduped_only_when_asked(tmp_path):
    # old code: nDCG@10 1.48, R@10 2.0, MAP 2.0 (values above 1) for this run
    rows = [("q1", "d1", 1, 3), ("q1", "d1", 2, 2), ("q1", "d2", 3, 1), ("q1", "d2", 4, 0.5), ("q2", "d3", 1, 1), ("q2", "d3", 2, 0.5)]
    path = _write_trec(tmp_path / "dup.trec", rows)
    with pytest.raises(TopicsError) as exc:
        read_run(path)
    msg = _one_line(exc)
    assert "dup.trec" in msg and "3 row(s) repeat a (query, doc) pair" in msg and "('q1', 'd1')" in msg and "dedupe" in msg
    pq.write_table(_run_table(rows), tmp_path / "dup.parquet")
    with pytest.raises(TopicsError, match=r"dup\.parquet: 3 row\(s\) repeat"):
        read_run(tmp_path / "dup.parquet")
    with pytest.raises(TopicsError, match=r"run 'r': 3 row\(s\) repeat"):
        run_metrics(_run_table(rows), _qrels_table(QRELS), MEASURES)

    # dedupe keeps each pair's best-ranked row: the values are trec_eval's on the deduplicated run
    kept = read_run(path, duplicates="first")
    assert kept.num_rows == 3 and int(kept.schema.metadata[b"duplicates_removed"]) == 3
    best = [("q1", "d1", 1, 3), ("q1", "d2", 3, 1), ("q2", "d3", 1, 1)]
    _assert_equals_trec_eval(kept, _qrels_table(QRELS), best, QRELS)
    deduped = run_metrics(_run_table(rows), _qrels_table(QRELS), MEASURES, duplicates="first")
    assert deduped.equals(run_metrics(_run_table(best), _qrels_table(QRELS), MEASURES))

    qrels_path = tmp_path / "qrels.tsv"
    qrels_path.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, d, r in QRELS))
    metrics = run_evaluate(EvaluateConfig(qrels=str(qrels_path), runs=(str(path),), dedupe=True), tmp_path / "eval").to_pandas()
    assert metrics["value"].max() <= 1
    manifest = json.loads((tmp_path / "eval" / "manifest.json").read_text())
    assert manifest["duplicates_removed"] == {str(path): 3}
    assert "3 repeated (query, doc) rows dropped" in (tmp_path / "eval" / "report.md").read_text()


def test_trec_runs_are_ranked_by_score_like_trec_eval(tmp_path):
    # old code ranked by the rank column: nDCG@10 0.0 here, trec_eval 1.0
    rows = [("q1", f"d{i}", 20 - i, float(20 - i)) for i in range(1, 20)]  # d1 has the best score, the worst rank
    qrels = [("q1", "d1", 2), ("q1", "d2", 1)]
    run = read_run(_write_trec(tmp_path / "scrambled.trec", rows))
    _assert_equals_trec_eval(run, _qrels_table(qrels), rows, qrels)
    assert _ours(run, _qrels_table(qrels))["q1", "nDCG@10"] == 1.0

    # ties: equal scores are ordered by docno descending, as trec_eval does (old code: nDCG@10 0.88, MAP 0.75)
    ties = [("q1", "a", 1, 1.0), ("q1", "b", 2, 1.0), ("q1", "c", 3, 1.0), ("q1", "d", 4, 0.5)]
    tie_qrels = [("q1", "a", 1), ("q1", "d", 1)]
    run = read_run(_write_trec(tmp_path / "ties.trec", ties))
    assert run.column("doc_id").to_pylist() == ["c", "b", "a", "d"] and run.column("rank").to_pylist() == [1, 2, 3, 4]
    _assert_equals_trec_eval(run, _qrels_table(tie_qrels), ties, tie_qrels)

    # many ties, scrambled ranks, graded qrels: every measure equals trec_eval's
    rng = random.Random(7)
    rows, qrels_rows = [], []
    for q in range(8):
        docs = rng.sample([f"doc{j}" for j in range(40)], 25)
        rows += [(f"q{q}", d, rng.randint(1, 99), rng.choice([0.1, 0.5, 0.5, 1.0, 2.0])) for d in docs]
        qrels_rows += [(f"q{q}", d, rng.randint(0, 3)) for d in rng.sample([f"doc{j}" for j in range(40)], 10)]
    run = read_run(_write_trec(tmp_path / "random.trec", rows))
    _assert_equals_trec_eval(run, _qrels_table(qrels_rows), rows, qrels_rows)


def test_trec_run_scores_rank_as_trec_eval_stores_them_in_32_bits(tmp_path):
    # old code ranked the 64-bit scores: D1 first, nDCG@10 1.0, MAP 1.0, where trec_eval gives 0.6309 and 0.5
    rows = [("1", "D1", 1, "40.123401"), ("1", "D2", 2, "40.123400")]
    qrels = [("1", "D1", 1), ("1", "D2", 0)]
    run = read_run(_write_trec(tmp_path / "pyserini.trec", rows, tag="pyserini"))
    assert run.column("doc_id").to_pylist() == ["D2", "D1"]  # one float32 score: docno descending
    assert run.column("score").to_pylist() == [40.1234, 40.123401]  # the scores as written, 64 bits
    _assert_equals_trec_eval(run, _qrels_table(qrels), rows, qrels)
    ours = _ours(run, _qrels_table(qrels))
    assert ours["1", "nDCG@10"] == pytest.approx(0.6309, abs=1e-4)
    assert ours["1", "MAP"] == pytest.approx(0.5, abs=1e-4) and ours["1", "MRR"] == pytest.approx(0.5, abs=1e-4)

    # 64-bit order a, b, c, d; 32-bit: a and b one score (0.3), c above it, d below
    rows = [("q1", "a", 1, "0.30000005"), ("q1", "b", 2, "0.30000001"), ("q1", "c", 3, "0.3"), ("q1", "d", 4, "0.29999998")]
    assert np.float32(0.30000005) > np.float32(0.30000001) == np.float32(0.3) > np.float32(0.29999998)
    qrels = [("q1", "b", 1), ("q1", "d", 2)]
    run = read_run(_write_trec(tmp_path / "close.trec", rows))
    assert run.column("doc_id").to_pylist() == ["a", "c", "b", "d"] and run.column("rank").to_pylist() == [1, 2, 3, 4]
    _assert_equals_trec_eval(run, _qrels_table(qrels), rows, qrels)
    # the run as Parquet keeps these ranks: a better rank's lower 64-bit score is one 32-bit score
    pq.write_table(run, tmp_path / "close.parquet")
    assert read_run(tmp_path / "close.parquet").column("doc_id").to_pylist() == ["a", "c", "b", "d"]


def test_parquet_qrels_read_under_their_usual_column_names_or_are_refused_in_one_line(tmp_path):
    """MTEB publishes qrels as Parquet with BEIR's columns (query-id, corpus-id, score);
    logicrank's QRELS names and integer ids read too. A relevance that is not an integer, a
    null, a missing or doubled column, a repeated pair: refused in one line."""
    path = tmp_path / "test.parquet"
    pq.write_table(pa.table({"query-id": ["1", "1", "2"], "corpus-id": ["a", "b", "a"], "score": pa.array([1, 0, 2], pa.int64())}), path)
    assert read_qrels(path).to_pylist() == [{"query_id": "1", "doc_id": "a", "relevance": 1}, {"query_id": "1", "doc_id": "b", "relevance": 0},
                                            {"query_id": "2", "doc_id": "a", "relevance": 2}]
    pq.write_table(pa.table({"query_id": [301], "doc_id": ["FT911-1"], "relevance": pa.array([1], pa.int8())}), path)
    assert read_qrels(path).to_pylist() == [{"query_id": "301", "doc_id": "FT911-1", "relevance": 1}]
    for table, words in [
        (pa.table({"query_id": ["1"], "doc_id": ["a"], "relevance": [0.5]}), "column 'relevance' is double; relevance is an integer"),
        (pa.table({"query_id": ["1"], "doc_id": ["a"]}), "no relevance column (relevance or score or rel or label)"),
        (pa.table({"query_id": ["1"], "qid": ["1"], "doc_id": ["a"], "score": [1]}), "more than one query_id column"),
        (pa.table({"query_id": ["1", None], "doc_id": ["a", "b"], "score": [1, 1]}), "column 'query_id' has 1 null(s)"),
        (pa.table({"query_id": ["1"], "doc_id": ["a"], "score": [2**31]}), "values past 32 bits"),
        (pa.table({"query_id": ["1", "1"], "doc_id": ["a", "a"], "score": [1, 0]}), "repeat a (query, doc) pair"),
    ]:
        pq.write_table(table, path)
        with pytest.raises(TopicsError) as exc:
            read_qrels(path)
        assert words in _one_line(exc) and "test.parquet" in str(exc.value), str(exc.value)


def test_tags_that_split_a_trec_runs_queries_are_refused_and_several_runs_of_one_file_are_read(tmp_path):
    """trec_eval reads a file as one run whatever its sixth column says; logicrank reads each
    tag as a run. Tags that split the queries between them (a tool writing one per query) would
    be scored as partial runs, each with the other queries missing: refused in one line. Runs
    that share queries (files joined with cat) are several runs, each ranked on its own."""
    path = tmp_path / "per_query.trec"
    path.write_text("301 Q0 a 1 2.0 run-301\n301 Q0 b 2 1.0 run-301\n302 Q0 a 1 2.0 run-302\n303 Q0 c 1 1.0 run-302\n")
    with pytest.raises(TopicsError) as exc:
        read_run(path)
    msg = _one_line(exc)
    assert "per_query.trec: its 2 tags split its queries" in msg and "'301' only under 'run-301'" in msg and "one tag" in msg
    path.write_text("301 Q0 a 1 2.0 x\n302 Q0 a 1 2.0 x\n301 Q0 b 1 3.0 y\n301 Q0 a 2 1.0 y\n")
    run = read_run(path)
    got = list(zip(*(run.column(c).to_pylist() for c in ("run_id", "query_id", "doc_id", "rank")), strict=True))
    assert got == [("x", "301", "a", 1), ("x", "302", "a", 1), ("y", "301", "b", 1), ("y", "301", "a", 2)]


@pytest.mark.parametrize("score", ["1_0", "1_000.5", "1e1_0", "\u0661", "\uff15"])
def test_a_trec_run_score_trec_eval_reads_otherwise_is_refused(tmp_path, score):
    # old code: Python's float read '1_0' as 10.0 and '\u0661' as 1.0; trec_eval's atof reads 1 and 0
    path = tmp_path / "us.trec"
    path.write_text(f"1 Q0 b 1 5 t\n1 Q0 a 2 {score} t\n", encoding="utf-8")
    with pytest.raises(TopicsError) as exc:
        read_run(path)
    msg = _one_line(exc)
    assert "us.trec: line 2: score" in msg and repr(score) in msg

    # the spellings atof and Python read alike are read; the rank column is ignored, as trec_eval ignores it
    path.write_text("1 Q0 a 1_0 1e-3 t\n1 Q0 b x +.5 t\n1 Q0 c 3 -2. t\n1 Q0 d 4 1E+2 t\n1 Q0 e 5 7 t\n")
    run = read_run(path)
    assert run.column("doc_id").to_pylist() == ["d", "e", "b", "a", "c"]
    assert run.column("score").to_pylist() == pytest.approx([100.0, 7.0, 0.5, 1e-3, -2.0], abs=1e-12)


# a Parquet run's ranks that old code evaluated silently by their rank column: file -> rows, what the error says
BAD_RANKS = {
    "rises.parquet": ([("q1", "d1", 1, 0.5), ("q1", "d2", 2, 0.9)], "puts doc 'd2' (score 0.9) at rank 2, after doc 'd1'"),
    "tie.parquet": ([("q1", "d1", 1, 0.9), ("q1", "d2", 1, 0.5)], "ranks within a query must be distinct positive"),
    "zero.parquet": ([("q1", "d1", 0, 0.9), ("q1", "d2", 1, 0.5)], "has rank 0 for doc 'd1'"),
}


def test_parquet_ranks_are_kept_but_checked(tmp_path):
    # ties in score may take any rank order (a stage's own tie-break)
    ok = _run_table([("q1", "d2", 1, 1.0), ("q1", "d1", 2, 1.0), ("q1", "d3", 3, 0.5)])
    pq.write_table(ok, tmp_path / "ok.parquet")
    assert read_run(tmp_path / "ok.parquet").column("rank").to_pylist() == [1, 2, 3]
    with pytest.raises(TopicsError, match="run 'r': query 'q1' puts doc 'd2'"):
        run_metrics(_run_table(BAD_RANKS["rises.parquet"][0]), _qrels_table(QRELS), MEASURES)


@pytest.mark.parametrize("name", sorted(BAD_RANKS))
def test_a_parquet_run_with_bad_ranks_is_refused(tmp_path, name):
    rows, match = BAD_RANKS[name]
    pq.write_table(_run_table(rows), tmp_path / name)
    with pytest.raises(TopicsError) as exc:
        read_run(tmp_path / name)
    msg = _one_line(exc)
    assert name in msg and "query 'q1'" in msg and match in msg


@pytest.mark.parametrize("name", ["run.trec", "run.parquet"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_scores_are_refused(tmp_path, value, name):
    # old code: accepted silently (a run of NaN scores, ranked by its rank column, got nDCG@10 0.93)
    rows = [("q1", "d1", 1, 1.0), ("q1", "d2", 2, float(value)), ("q2", "d3", 1, float(value))]
    _write_trec(tmp_path / "run.trec", rows)
    pq.write_table(_run_table(rows), tmp_path / "run.parquet")
    with pytest.raises(TopicsError) as exc:
        read_run(tmp_path / name)
    msg = _one_line(exc)
    assert name in msg and "2 score(s) are NaN or infinite" in msg and "doc 'd" in msg


@pytest.mark.parametrize(("col", "value"), [("doc_id", "d 1"), ("doc_id", "d\t1"), ("query_id", "q\n1"), ("doc_id", ""), ("run_id", "my run")])
def test_ids_a_trec_line_cannot_carry(tmp_path, col, value):
    ok = _run_table([("q1", "d1", 1, 1.0)])
    run = ok.set_column(ok.schema.get_field_index(col), col, pa.array([value]))
    with pytest.raises(TopicsError) as exc:
        write_trec_run(run, tmp_path / "r.trec")
    msg = _one_line(exc)
    assert f"{col} {value!r}" in msg and "use the Parquet run instead" in msg
    assert not (tmp_path / "r.trec").exists()


def test_trec_runs_keep_full_precision_and_qrels_split_as_their_format_does(tmp_path):
    # full-precision scores: a TREC file read back keeps the Parquet ranking (0.10000003 and 0.1,
    # one score at 6 decimals, are two in trec_eval's 32 bits) and the scores themselves
    close = _run_table([("q1", "a", 1, 0.1 + 3e-8), ("q1", "b", 2, 0.1)])
    back = read_run(write_trec_run(close, tmp_path / "c.trec"))
    assert back.column("doc_id").to_pylist() == ["a", "b"] and back.column("score").to_pylist() == [0.1 + 3e-8, 0.1]

    # BEIR qrels split on tabs only: ids with spaces survive; TREC qrels split on whitespace
    (tmp_path / "beir.tsv").write_text("query-id\tcorpus-id\tscore\nq 1\td 1\t1\nq2\td2\t0\n")
    assert read_qrels(tmp_path / "beir.tsv").to_pylist()[0] == {"query_id": "q 1", "doc_id": "d 1", "relevance": 1}
    (tmp_path / "bad.tsv").write_text("QUERY_ID\tcorpus-id\tscore\nq1\td1\t1\nq1 d2 1\n")
    with pytest.raises(TopicsError) as exc:
        read_qrels(tmp_path / "bad.tsv")
    assert "bad.tsv: line 3 has 1 tab-separated field(s)" in _one_line(exc)
    (tmp_path / "trec.txt").write_text("q1 0 d1 1\nq1\t0\td2   0\n")
    assert read_qrels(tmp_path / "trec.txt").column("doc_id").to_pylist() == ["d1", "d2"]


@pytest.mark.parametrize(("name", "text"), [("header.tsv", "query-id\tcorpus-id\tscore\n"), ("zero.tsv", "")])
def test_qrels_without_judgements_are_one_line_errors(tmp_path, name, text):
    run = _write_trec(tmp_path / "run.trec", [("q1", "d1", 1, 1.0)])
    (tmp_path / name).write_text(text)  # old code: KeyError 'r' from the report
    with pytest.raises(TopicsError) as exc:
        run_evaluate(EvaluateConfig(qrels=str(tmp_path / name), runs=(str(run),)), tmp_path / "eval")
    assert name in _one_line(exc) and "no judgements" in str(exc.value)
    assert not (tmp_path / "eval" / "metrics.parquet").exists()


@pytest.mark.parametrize("what", ["qrels", "run"])
def test_a_missing_qrels_or_run_file_is_a_one_line_error(tmp_path, what):
    run = _write_trec(tmp_path / "run.trec", [("q1", "d1", 1, 1.0)])
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("q1 0 d1 1\n")
    q, r = (tmp_path / "nope.tsv", run) if what == "qrels" else (qrels, tmp_path / "nope.trec")
    with pytest.raises(EvaluationError) as exc:  # old code: FileNotFoundError from the fingerprint
        run_evaluate(EvaluateConfig(qrels=str(q), runs=(str(r),)), tmp_path / "eval")
    assert f"no {what} file at" in _one_line(exc) and "nope." in str(exc.value)
    assert not (tmp_path / "eval" / "metrics.parquet").exists()


@pytest.mark.parametrize("name", ["empty.trec", "empty.parquet"])
def test_an_empty_run_is_a_one_line_error(tmp_path, name):
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("q1 0 d1 1\n")
    (tmp_path / "empty.trec").write_text("\n")
    pq.write_table(_run_table([]), tmp_path / "empty.parquet")
    with pytest.raises(TopicsError) as exc:  # old code: ArrowInvalid "Must pass at least one table"
        run_evaluate(EvaluateConfig(qrels=str(qrels), runs=(str(tmp_path / name),)), tmp_path / "eval")
    assert name in _one_line(exc) and "no rows" in str(exc.value)
    assert not (tmp_path / "eval" / "metrics.parquet").exists()


def test_repeated_qrels_pairs_are_refused(tmp_path):
    # old code: nDCG@10 0.61 for a run ranking the only relevant document first (trec_eval refuses)
    (tmp_path / "dup.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t1\n")
    with pytest.raises(TopicsError) as exc:
        read_qrels(tmp_path / "dup.tsv")
    assert "dup.tsv: 1 row(s) repeat a (query, doc) pair, e.g. ('q1', 'd1')" in _one_line(exc)
    with pytest.raises(TopicsError, match=r"qrels: 1 row\(s\) repeat"):
        run_metrics(_run_table([("q1", "d1", 1, 1.0)]), _qrels_table([("q1", "d1", 1), ("q1", "d1", 2)]), MEASURES)


def test_queries_missing_from_a_run_are_counted_and_reported(tmp_path):
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(4)))
    full = _write_trec(tmp_path / "full.trec", [(f"q{i}", f"d{i}", 1, 1.0) for i in range(4)], tag="full")
    part = _write_trec(tmp_path / "part.trec", [("q0", "d0", 1, 1.0), ("q9", "d9", 1, 1.0), ("q8", "d0", 1, 1.0)], tag="part")
    out = tmp_path / "eval"
    metrics = run_evaluate(EvaluateConfig(qrels=str(qrels), runs=(str(full), str(part)), measures=("P@1",)), out).to_pandas()
    agg = metrics[metrics["query_id"] == AGGREGATE_QUERY_ID].set_index("run_id")["value"]
    assert agg["full"] == 1.0 and agg["part"] == 0.25  # the 3 missing queries score 0 (trec_eval -c)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["missing_queries"] == {"full": 0, "part": 3} and manifest["queries_without_qrels"] == {"full": 0, "part": 2}
    assert json.loads((out / "manifest.json").read_text())["missing_queries"] == {"full": 0, "part": 3}
    notes = evaluation_notes(out)
    assert notes == [
        "run part has no results for 3 of 4 qrels queries; they score 0 (trec_eval -c).",
        "run part has results for 2 queries absent from the qrels; they are not evaluated (as trec_eval).",
    ]
    report = (out / "report.md").read_text()
    assert all(n in report for n in notes) and "run full" not in report
    # a rerun is skipped and the counts stay readable
    said = []
    run_evaluate(EvaluateConfig(qrels=str(qrels), runs=(str(full), str(part)), measures=("P@1",)), out, echo=said.append)
    assert json.loads((out / "manifest.json").read_text())["missing_queries"] == {"full": 0, "part": 3}
    assert any("skipped" in line for line in said)
    # another title is another report (its heading was left as the last run's)
    run_evaluate(EvaluateConfig(qrels=str(qrels), runs=(str(full), str(part)), measures=("P@1",)), out, title="Ablation")
    assert (out / "report.md").read_text().startswith("# Ablation")


def test_the_per_query_plot_has_a_column_per_measure_whose_panels_share_their_axis():
    import matplotlib.pyplot as plt

    from logicrank.pipelines.evaluation.report import per_query_figure

    rows = [(run, q, m, v) for run, scale in (("base", 0.5), ("a", 0.9), ("b", 0.1)) for m, k in (("nDCG@10", 1.0), ("P@1", 0.3))
            for q, v in (("q1", scale * k), ("q2", scale * k / 2))]
    metrics = pa.table({"run_id": [r[0] for r in rows], "query_id": [r[1] for r in rows], "measure": [r[2] for r in rows],
                        "value": [r[3] for r in rows]})
    fig = per_query_figure(metrics, ["nDCG@10", "P@1"], "base")
    axes = fig.axes
    assert len(axes) == 4  # runs a and b (rows) x nDCG@10 and P@1 (columns)
    assert [ax.get_title().split(":")[1].split("(")[0].strip() for ax in axes] == ["nDCG@10", "P@1", "nDCG@10", "P@1"]
    assert axes[0].get_ylim() == axes[2].get_ylim() and axes[1].get_ylim() == axes[3].get_ylim()  # one axis per measure
    assert axes[0].get_ylim() != axes[1].get_ylim()
    plt.close(fig)


def test_the_per_query_plot_leaves_a_panel_empty_for_a_run_without_the_measure():
    """A QA measure only the runs that answer have (EM of run a, none of run b): b's panel says so."""
    import matplotlib.pyplot as plt

    from logicrank.pipelines.evaluation.report import per_query_figure

    rows = [("base", "q1", "nDCG@10", 0.5), ("a", "q1", "nDCG@10", 0.7), ("b", "q1", "nDCG@10", 0.1),
            ("base", "q1", "EM", 1.0), ("a", "q1", "EM", 0.0)]
    metrics = pa.table({k: [r[i] for r in rows] for i, k in enumerate(("run_id", "query_id", "measure", "value"))})
    fig = per_query_figure(metrics, ["nDCG@10", "EM"], "base")
    assert [ax.get_title() for ax in fig.axes][3] == "b: no EM"
    plt.close(fig)


def test_the_per_query_plot_counts_a_fall_of_a_measure_where_lower_is_better_as_better():
    """unj_2 (unjudged documents in the top 2) rising is worse: run a adds one on q1."""
    import matplotlib.pyplot as plt

    from logicrank.pipelines.evaluation.report import per_query_figure

    rows = [("base", "q1", "unj_2", 0.0), ("a", "q1", "unj_2", 0.5), ("base", "q2", "unj_2", 0.5), ("a", "q2", "unj_2", 0.5),
            ("base", "q1", "P@1", 0.0), ("a", "q1", "P@1", 1.0)]
    metrics = pa.table({k: [r[i] for r in rows] for i, k in enumerate(("run_id", "query_id", "measure", "value"))})
    fig = per_query_figure(metrics, ["unj_2", "P@1"], "base")
    assert [ax.get_title() for ax in fig.axes] == ["a - base: unj_2 (0 better, 1 worse)", "a - base: P@1 (1 better, 0 worse)"]
    plt.close(fig)


def test_ablates_grid_puts_the_best_row_first_whichever_way_its_measure_is_better():
    """Operator choice i ranks i % 4 unjudged documents above the three relevant ones: by
    unj_3 (lower is better) the choices with none come first, by P@3 too."""
    import pandas as pd

    from logicrank.pipelines.evaluation.ablation import grid_table
    from logicrank.pipelines.evaluation.measures import parse_measure
    from logicrank.pipelines.retrieval.logic.fuzzy import Operators

    qrels = _qrels_table([("q1", f"d{j}", 1) for j in range(3)])
    pairs = {}
    for i, ops in enumerate(Operators.grid()):
        docs = [f"u{j}" for j in range(i % 4)] + [f"d{j}" for j in range(3)]
        pairs[ops] = pd.DataFrame({"query_id": "q1", "doc_id": docs, "score": [10.0 - j for j in range(len(docs))]})
    for measure in ("unj_3", "P@3"):
        table = grid_table(pairs, qrels, parse_measure(measure), 10)
        first = table["operators"].iloc[: len(table) // 4 + 1].tolist()
        assert table["value"].iloc[0] == (0.0 if measure == "unj_3" else 1.0), table
        assert first == [str(ops) for i, ops in enumerate(Operators.grid()) if i % 4 == 0], table


def test_an_empty_run_is_refused_or_in_an_experiment_a_row_of_zeros(tmp_path):
    """A run file with no rows is refused by `logicrank evaluate` (a file given by mistake); an
    experiment's own run that retrieved nothing (every LAG chain stopped before retrieving) is
    a row of zeros under its file's stem, the other runs evaluated as usual, and said."""
    import pyarrow.parquet as pq

    from logicrank.schemas.tables import RUN

    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(4)))
    full = _write_trec(tmp_path / "full.trec", [(f"q{i}", f"d{i}", 1, 1.0) for i in range(4)], tag="full")
    pq.write_table(RUN.empty_table(), tmp_path / "lag.parquet")
    runs = (str(full), str(tmp_path / "lag.parquet"))
    with pytest.raises(TopicsError, match="no rows; an empty run cannot be evaluated"):
        run_evaluate(EvaluateConfig(qrels=str(qrels), runs=runs, measures=("P@1",)), tmp_path / "refused")
    said = []
    metrics = run_evaluate(EvaluateConfig(qrels=str(qrels), runs=runs, measures=("P@1", "nDCG@10"), empty_runs="zero"), tmp_path / "eval",
                           echo=said.append).to_pandas()
    agg = metrics[metrics["query_id"] == AGGREGATE_QUERY_ID].set_index(["run_id", "measure"])["value"]
    assert agg[("full", "P@1")] == 1.0 and agg[("lag", "P@1")] == 0.0 and agg[("lag", "nDCG@10")] == 0.0
    per_query = metrics[(metrics["run_id"] == "lag") & (metrics["query_id"] != AGGREGATE_QUERY_ID)]
    assert sorted(per_query["query_id"].unique()) == ["q0", "q1", "q2", "q3"] and (per_query["value"] == 0).all()
    assert said == ["evaluate: 1 run retrieved nothing (lag): every query scores 0."]
    manifest = json.loads((tmp_path / "eval" / "manifest.json").read_text())
    assert manifest["empty_runs"] == ["lag"] and manifest["missing_queries"]["lag"] == 4
    # an empty run beside others changes no other rule: one run id in two files is still refused, the empty one's too
    twin = _write_trec(tmp_path / "twin.trec", [("q0", "d0", 1, 1.0)], tag="full")
    pq.write_table(RUN.empty_table(), tmp_path / "full.parquet")
    for given in ((str(full), str(twin), str(tmp_path / "lag.parquet")), (str(full), str(tmp_path / "full.parquet"))):
        with pytest.raises(EvaluationError, match="run ids repeat across the given runs"):
            run_evaluate(EvaluateConfig(qrels=str(qrels), runs=given, measures=("P@1",), empty_runs="zero"), tmp_path / "dup")


def test_gm_and_count_measures_aggregate_as_trec_eval_in_every_table(tmp_path):
    """gm_map's per-query values are logs (trec_eval's), the counts sum over queries: a run's
    table in the report, an experiment's groups and the significance means aggregate them as
    the summary does, never as a plain mean of the logs (-7.7 for a gm_map of 0.017)."""
    from logicrank.pipelines.evaluation.experiment.report import grouped
    from logicrank.pipelines.evaluation.report import markdown_report
    from logicrank.pipelines.evaluation.runs import evaluate_runs

    qrels = pa.table({"query_id": ["q1", "q2", "q3"], "doc_id": ["a", "b", "c"], "relevance": [1, 1, 1]})

    def run(rid, rows):
        return pa.table({"query_id": [q for q, _ in rows], "doc_id": [d for _, d in rows], "score": [-float(i) for i in range(len(rows))],
                         "rank": pa.array(range(1, len(rows) + 1), pa.int32()), "method": [rid] * len(rows), "run_id": [rid] * len(rows)})

    # r: AP 1, 0.5 and none (q3 missed); s: AP 1, 1, 1
    r = run("r", [("q1", "a"), ("q2", "x"), ("q2", "b")])
    s = run("s", [("q1", "a"), ("q2", "b"), ("q3", "c")])
    ev = evaluate_runs([r, s], qrels, ["gm_map", "NumRet", "MAP"], baseline="s")
    gm = (1.0 * 0.5 * 1e-5) ** (1 / 3)
    summary = {(x["run_id"], x["measure"]): x["value"] for x in ev.metrics.to_pylist() if x["query_id"] == AGGREGATE_QUERY_ID}
    assert summary[("r", "gm_map")] == pytest.approx(gm, rel=1e-6) and summary[("r", "NumRet")] == 3
    report = markdown_report(ev.metrics, ev.significance)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in report.split("## Run `r`")[1].split("## Run")[0].splitlines()
            if line.startswith("| ") and not line.startswith("| measure")}
    assert rows["gm_map"] == [f"{gm:.4f}", "0.5000", "-", "-"] and rows["NumRet"][0] == "3.0000" and rows["MAP"][0] == "0.5000"
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"_id": q, "kind": k}) + "\n" for q, k in [("q1", "A"), ("q2", "A"), ("q3", "B")]))
    by = grouped(ev.metrics, tmp_path / "q.jsonl", "kind")
    assert list(by.index) == [("r", "A"), ("r", "B"), ("s", "A"), ("s", "B")]
    assert by.loc[("r", "A"), "gm_map"] == pytest.approx(0.5 ** 0.5, rel=1e-6) and by.loc[("r", "B"), "gm_map"] == pytest.approx(1e-5, rel=1e-6)
    assert by.loc[("r", "A"), "NumRet"] == 3 and by.loc[("s", "A"), "NumRet"] == 2 and by.loc[("r", "A"), "MAP"] == pytest.approx(0.75)
    sig = {x["measure"]: x for x in ev.significance.to_pylist()}
    assert sig["gm_map"]["mean_run"] == pytest.approx(gm, rel=1e-6) and sig["gm_map"]["mean_baseline"] == pytest.approx(1.0)
    # a count's figure beside its test is its sum, the summary's (it was the mean: NumRet 1 against the summary's 3)
    assert (sig["NumRet"]["mean_run"], sig["NumRet"]["mean_baseline"]) == (3, 3)
    # of an even count of queries, gm_map's median query's AP is the two middle APs' mean (0.75), not their geometric mean
    qrels4 = pa.concat_tables([qrels, pa.table({"query_id": ["q4"], "doc_id": ["d"], "relevance": [1]})])
    even = evaluate_runs([run("r", [("q1", "a"), ("q2", "x"), ("q2", "b"), ("q4", "d")])], qrels4, ["gm_map"])
    line = next(x for x in markdown_report(even.metrics, None).split("## Run `r`")[1].splitlines() if x.startswith("| gm_map"))
    assert [c.strip() for c in line.split("|")[2:-1]][1] == "0.7500"


def _p_at_1(metrics, run_id: str = "r") -> float:
    """A run's P@1 over the queries, from an evaluation's metrics."""
    return {m["run_id"]: m["value"] for m in metrics.to_pylist() if m["query_id"] == AGGREGATE_QUERY_ID}[run_id]


def test_an_evaluate_stopped_after_writing_never_lets_a_rerun_of_the_earlier_inputs_skip(tmp_path, monkeypatch):
    """A run killed between its outputs and its manifest left the new metrics beside the earlier
    run's manifest ("ok", the earlier inputs): a rerun of those inputs was skipped and handed back
    the killed run's metrics. The manifest is marked running before any output is written."""
    from logicrank.jobs.rundir import RunDir

    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\td1\t1\n")
    run = _write_trec(tmp_path / "r.trec", [("q0", "d0", 1, 1.0), ("q1", "d1", 1, 1.0)], tag="r")
    cfg, out = EvaluateConfig(qrels=str(qrels), runs=(str(run),), measures=("P@1",)), tmp_path / "eval"

    assert _p_at_1(run_evaluate(cfg, out)) == 1.0
    original = run.read_bytes()
    _write_trec(run, [("q0", "dx", 1, 1.0), ("q1", "d1", 1, 1.0)], tag="r")  # P@1 0.5

    def killed(*args, **kwargs):
        raise RuntimeError("killed before its manifest")

    monkeypatch.setattr(RunDir, "write_manifest", killed)
    with pytest.raises(RuntimeError, match="killed"):
        run_evaluate(cfg, out)
    monkeypatch.undo()
    assert json.loads((out / "manifest.json").read_text())["status"] == "running"
    run.write_bytes(original)
    assert _p_at_1(run_evaluate(cfg, out)) == 1.0  # evaluated again, not the killed run's 0.5


def test_a_qrels_directory_edited_in_place_is_evaluated_again(tmp_path):
    """A BEIR directory given as qrels: a grade changed in place, the file's size and time kept
    (`touch -r`), is seen (its files are fingerprinted by content), not skipped as unchanged."""
    import os

    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    tsv = beir / "qrels" / "test.tsv"
    tsv.write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\td1\t1\n")
    run = _write_trec(tmp_path / "r.trec", [("q0", "d0", 1, 1.0), ("q1", "d1", 1, 1.0)], tag="r")
    cfg, out = EvaluateConfig(qrels=str(beir), runs=(str(run),), measures=("P@1",)), tmp_path / "eval"

    assert _p_at_1(run_evaluate(cfg, out)) == 1.0
    stat = tsv.stat()
    tsv.write_text("query-id\tcorpus-id\tscore\nq0\td0\t0\nq1\td1\t1\n")  # q0's grade 1 -> 0, same size
    os.utime(tsv, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert tsv.stat().st_size == stat.st_size and tsv.stat().st_mtime_ns == stat.st_mtime_ns
    assert _p_at_1(run_evaluate(cfg, out)) == 0.5


@pytest.mark.parametrize("status", ["running", "interrupted", "failed"])
def test_a_run_file_of_a_retrieve_run_that_has_not_finished_is_refused(tmp_path, status, monkeypatch):
    """A retrieve run killed after writing one method's file leaves the run before it's other
    files beside it (another table version, another config): evaluating one of those as the
    new run's would print the old run's figures. A finished run's file is evaluated."""
    out = tmp_path / "retrieve"
    (out / "runs").mkdir(parents=True)
    rows = [("q1", "d1", 1, 2.0), ("q1", "d2", 2, 1.0)]
    pq.write_table(_run_table(rows), out / "runs" / "bm25.parquet")
    qrels = pq.write_table(_qrels_table([("q1", "d2", 1)]), tmp_path / "qrels.parquet") or tmp_path / "qrels.parquet"
    manifest = {"stage": "retrieve", "status": status, "outputs": ["runs/bm25.parquet"]}
    (out / "manifest.json").write_text(json.dumps(manifest))
    cfg = EvaluateConfig(qrels=str(qrels), runs=(str(out / "runs" / "bm25.parquet"),))
    with pytest.raises(EvaluationError, match=f"has not finished .*says '{status}'") as err:
        run_evaluate(cfg, tmp_path / "eval")
    assert "\n" not in str(err.value)
    with pytest.raises(EvaluationError, match="has not finished"):  # named from inside the folder, as a bare file name
        monkeypatch.chdir(out / "runs")
        run_evaluate(EvaluateConfig(qrels=str(qrels), runs=("bm25.parquet",)), tmp_path / "eval")
    (out / "answers").mkdir()
    (out / "answers" / "lag.jsonl").write_text('{"query_id": "q1", "answer": "x"}\n')
    with pytest.raises(EvaluationError, match="has not finished"):  # a LAG pipeline's answers, as its runs
        run_evaluate(EvaluateConfig(answers=(str(out / "answers" / "lag.jsonl"),), gold=str(tmp_path / "gold.jsonl")), tmp_path / "eval")
    (out / "manifest.json").write_text(json.dumps({**manifest, "status": "ok"}))
    metrics = run_evaluate(cfg, tmp_path / "eval").to_pandas()
    assert metrics.set_index(["query_id", "measure"]).loc[("q1", "MRR"), "value"] == pytest.approx(0.5, abs=1e-12)


def test_runs_retrieved_from_two_table_versions_are_said_so_and_recorded(tmp_path):
    """Runs of two retrieve runs over two table versions were compared, significance tests
    included, without a word: their figures are of other documents. A note says so, and the
    manifest records each run's table (from its retrieve run's manifest)."""
    qrels = pq.write_table(_qrels_table([("q1", "d2", 1)]), tmp_path / "qrels.parquet") or tmp_path / "qrels.parquet"
    paths = []
    for name, version in (("a", 3), ("b", 5)):
        out = tmp_path / name
        (out / "runs").mkdir(parents=True)
        pq.write_table(_run_table([("q1", "d1", 1, 2.0), ("q1", "d2", 2, 1.0)]).set_column(5, "run_id", pa.array([name] * 2)),
                       out / "runs" / f"{name}.parquet")
        table = {"db": "db", "name": "docs", "version": version, "made": f"2026-12-0{version} 10:00:00.000000Z"}
        (out / "manifest.json").write_text(json.dumps({"stage": "retrieve", "status": "ok", "inputs": {"table": table}}))
        paths.append(str(out / "runs" / f"{name}.parquet"))
    said = []
    run_evaluate(EvaluateConfig(qrels=str(qrels), runs=tuple(paths)), tmp_path / "eval", echo=said.append)
    notes = [line for line in said if "table versions" in line]
    assert notes == ["evaluate: the runs were retrieved from 2 table versions (docs v3 (made 2026-12-03 10:00:00.000000Z): a.parquet; "
                     "docs v5 (made 2026-12-05 10:00:00.000000Z): b.parquet): their figures are of other documents, and the "
                     "significance tests pair them as if of one collection."]
    manifest = json.loads((tmp_path / "eval" / "manifest.json").read_text())
    assert [manifest["retrieved_from"][p]["version"] for p in paths] == [3, 5]
    # one table version named by two spellings of its db's path: nothing to say
    b = json.loads((tmp_path / "b" / "manifest.json").read_text())
    b["inputs"]["table"] = dict(json.loads((tmp_path / "a" / "manifest.json").read_text())["inputs"]["table"], db="./db")
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(b))
    said.clear()
    run_evaluate(EvaluateConfig(qrels=str(qrels), runs=tuple(paths)), tmp_path / "eval2", echo=said.append)
    assert not [line for line in said if "table versions" in line]


def test_an_evaluate_into_the_retrieves_out_is_refused_and_a_first_run_says_it_is_running(tmp_path):
    """`evaluate --out R` over the runs of `retrieve --out R` replaced the retrieve's manifest
    with its own, so a retrieve later killed in R (its new bm25 beside the old dense) left no
    unfinished retrieve's manifest, and evaluate read the two as one run set. A job now refuses
    a directory holding another job's manifest; and a first run, with no manifest yet, writes
    one saying `running` before its first output, so a first run killed mid-write is refused too."""
    from logicrank.jobs.rundir import RunDir, RunDirOfAnotherJob

    out = tmp_path / "R"
    (out / "runs").mkdir(parents=True)
    pq.write_table(_run_table([("q1", "d1", 1, 2.0), ("q1", "d2", 2, 1.0)]), out / "runs" / "bm25.parquet")
    (out / "manifest.json").write_text(json.dumps({"stage": "retrieve", "status": "ok", "outputs": ["runs/bm25.parquet"]}))
    qrels = tmp_path / "qrels.parquet"
    pq.write_table(_qrels_table([("q1", "d2", 1)]), qrels)
    cfg = EvaluateConfig(qrels=str(qrels), runs=(str(out / "runs" / "bm25.parquet"),))
    with pytest.raises(RunDirOfAnotherJob, match="holds the retrieve job's manifest; give this run another --out") as err:
        run_evaluate(cfg, out)
    assert "\n" not in str(err.value) and json.loads((out / "manifest.json").read_text())["stage"] == "retrieve"
    run_evaluate(cfg, tmp_path / "eval")
    with pytest.raises(RunDirOfAnotherJob, match="holds the evaluate job's manifest"), RunDir(tmp_path / "eval", "retrieve").held():
        pass

    first = RunDir(tmp_path / "first", "retrieve")  # a first retrieve, killed after begin() and one file
    with first.held():
        first.begin()
    (first.path / "runs").mkdir()
    pq.write_table(_run_table([("q1", "d2", 1, 1.0)]), first.path / "runs" / "bm25.parquet")
    assert json.loads(first.manifest_path.read_text())["status"] == "running"
    with pytest.raises(EvaluationError, match="has not finished"):
        run_evaluate(EvaluateConfig(qrels=str(qrels), runs=(str(first.path / "runs" / "bm25.parquet"),)), tmp_path / "eval2")


def test_a_query_ranking_its_own_id_is_noted_and_dropped_as_beir_drops_it_when_asked(tmp_path):
    """BEIR's ArguAna and Quora hold each query in the corpus, so a run ranks the query itself
    first. trec_eval scores that row (the default here, with a note); BEIR's evaluation drops
    it (``--ignore-identical-ids``): nDCG@10 0.6309 (the relevant document second) against 1.0."""
    from typer.testing import CliRunner

    from logicrank.cli import app

    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\ntest-env-pro02b\ttest-env-con01a\t1\nq2\td2\t1\n")
    run = tmp_path / "bm25.trec"
    run.write_text("test-env-pro02b Q0 test-env-pro02b 1 9.0 bm25\ntest-env-pro02b Q0 test-env-con01a 2 8.0 bm25\n"
                   "q2 Q0 d2 1 5.0 bm25\n")
    for flag, want in (([], (0.63093, 1.0)), (["--ignore-identical-ids"], (1.0, 1.0))):
        out = tmp_path / f"ev{len(flag)}"
        res = CliRunner().invoke(app, ["evaluate", str(qrels), str(run), "--measure", "nDCG@10", "--out", str(out), *flag])
        assert res.exit_code == 0, res.output
        metrics = {(m["query_id"]): m["value"] for m in pq.read_table(out / "metrics.parquet").to_pylist()}
        assert (metrics["test-env-pro02b"], metrics["q2"]) == pytest.approx(want, abs=1e-5), flag
        said = " ".join(res.output.split())
        assert f"1 row(s) have a document id equal to their query's id ({run} (1))" in said
        assert ("dropped before measuring" in said) == bool(flag) and ("scored as trec_eval scores them" in said) != bool(flag)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["identical_ids"] == {"rows": {str(run): 1}, "dropped": bool(flag)}


def test_a_run_of_only_identical_ids_dropped_still_scores_zero(tmp_path):
    """A run every row of which is its query's own id (ArguAna retrieved at depth 1) is, with
    the rows dropped, a run that retrieved nothing: every query 0, not a run gone from the table."""
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    (tmp_path / "a.trec").write_text("q1 Q0 q1 1 9.0 a\nq2 Q0 q2 1 9.0 a\n")
    (tmp_path / "b.trec").write_text("q1 Q0 d1 1 9.0 b\nq2 Q0 x 1 9.0 b\n")
    for runs in ((tmp_path / "a.trec", tmp_path / "b.trec"), (tmp_path / "a.trec",)):
        cfg = EvaluateConfig(qrels=str(qrels), runs=tuple(map(str, runs)), measures=("P@1",), ignore_identical_ids=True)
        metrics = run_evaluate(cfg, tmp_path / f"ev{len(runs)}").to_pylist()
        got = {(m["run_id"], m["query_id"]): m["value"] for m in metrics if m["measure"] == "P@1"}
        want = {("a", "q1"): 0.0, ("a", "q2"): 0.0, ("a", "all"): 0.0}
        if len(runs) == 2:
            want.update({("b", "q1"): 1.0, ("b", "q2"): 0.0, ("b", "all"): 0.5})
        assert got == pytest.approx(want), runs


def test_an_experiment_drops_identical_ids_when_its_file_says_so():
    """An experiment file's ``ignore_identical_ids`` (BEIR's ArguAna and Quora): the rows whose
    document is the query itself go before measuring, in the job and in a notebook alike."""
    from logicrank.pipelines.evaluation.experiment import Experiment
    from logicrank.pipelines.evaluation.runs import without_identical_ids

    exp = Experiment.model_validate({"name": "arguana", "title": "ArguAna", "dataset": {"beir": "x"}, "presets": ["bm25"], "ignore_identical_ids": True})
    assert exp.ignore_identical_ids and not Experiment.model_validate({"name": "a", "title": "A", "dataset": {"beir": "x"}, "presets": ["bm25"]}).ignore_identical_ids
    run = pa.table({"query_id": ["q1", "q1", "q2"], "doc_id": ["q1", "d1", "d2"], "rank": pa.array([1, 2, 1], pa.int32()),
                    "score": [3.0, 2.0, 1.0], "method": ["bm25"] * 3, "run_id": ["bm25"] * 3})
    kept, n = without_identical_ids(run)
    assert n == 1 and kept.column("doc_id").to_pylist() == ["d1", "d2"] and kept.column("rank").to_pylist() == [2, 1]
    assert without_identical_ids(kept) == (kept, 0)


def test_trec_comments_and_fields_after_the_tag_are_read_as_trec_eval_reads_them(tmp_path):
    """trec_eval skips a run line whose first field starts with ``#`` and ignores any field after
    the tag (a tool's extra column); a qrels line that starts with ``#`` is a comment too. Old
    code refused such a run (7 fields) and read a qrels comment as a judgement or refused it."""
    rows = [("q1", "d1", 1, 3.0), ("q1", "d2", 2, 2.0), ("q1", "d3", 3, 1.0), ("q2", "d1", 1, 1.0), ("q2", "d4", 2, 0.5)]
    qrels_rows = [("q1", "d2", 1), ("q1", "d3", 2), ("q2", "d4", 1)]
    path = tmp_path / "extra.trec"
    path.write_text("# run by a tool: qid Q0 docno rank score tag seconds\n"
                    + "".join(f"{q} Q0 {d} {rank} {score} r 0.{rank}\n" for q, d, rank, score in rows[:3])
                    + "   # indented comment\n"
                    + "".join(f"{q} Q0 {d} {rank} {score} r\n" for q, d, rank, score in rows[3:]))
    run = read_run(path)
    assert list(zip(*(run.column(c).to_pylist() for c in ("query_id", "doc_id", "rank", "run_id")), strict=True)) == [
        (q, d, rank, "r") for q, d, rank, _ in rows]
    (tmp_path / "qrels.txt").write_text("# judged by assessors; 4 fields: a b 1\n" + "".join(f"{q} 0 {d} {r}\n" for q, d, r in qrels_rows))
    qrels = read_qrels(tmp_path / "qrels.txt")
    assert list(zip(*(qrels.column(c).to_pylist() for c in ("query_id", "doc_id", "relevance")), strict=True)) == qrels_rows
    _assert_equals_trec_eval(run, qrels, rows, qrels_rows)
    path.write_text("q1 Q0 d1 1 3.0\n")  # fewer than six fields: still refused
    with pytest.raises(TopicsError, match=r"extra.trec: line 1 has 5 fields"):
        read_run(path)
    with pytest.raises(TopicsError, match=r"query_id '#1' .* starts a comment"):  # written, trec_eval would skip it
        write_trec_run(_run_table([("#1", "d1", 1, 1.0)]), tmp_path / "hash.trec")


def test_ablates_grid_is_refused_or_noted_as_evaluate_would():
    """``logicrank ablate`` measured its 18 runs without evaluate's checks: queries written
    ``051`` against qrels' ``51``, or sharing none with them, gave a table of zeros with no
    word; qrels queries absent from the queries file scored 0 unsaid; R@1000 over each
    choice's top 100 was printed as R@1000."""
    from logicrank.pipelines.evaluation.ablation import grid_markdown, grid_notes
    from logicrank.pipelines.evaluation.measures import parse_measure

    qrels = _qrels_table([("51", "d1", 1), ("52", "d2", 1), ("53", "d3", 1)])
    queries = lambda *ids: pa.table({"query_id": list(ids), "text": ["t"] * len(ids)})  # noqa: E731
    with pytest.raises(EvaluationError, match=r"ablate: the queries file's query '051' is the qrels' '51' with other leading zeros"):
        grid_notes(queries("051", "052"), qrels, parse_measure("nDCG@10"), 100)
    with pytest.raises(EvaluationError, match=r"ablate: the queries file has no query the qrels judge"):
        grid_notes(queries("q1", "q2"), qrels, parse_measure("nDCG@10"), 100)
    assert grid_notes(queries("51", "52", "53"), qrels, parse_measure("nDCG@10"), 100) == []
    notes = grid_notes(queries("51", "52", "x"), qrels, parse_measure("R@1000"), 100)
    assert notes == ["ablate: 1 of the qrels' 3 queries are not in the queries file; each scores 0 in every row, as trec_eval -c "
                     "scores a query a run misses.", "ablate: 1 queries of the queries file have no qrels; not evaluated.",
                     "ablate: each operator choice ranks its top 100 documents of a query, so R@1000 counts no deeper."]
    assert grid_notes(queries("51", "52", "53"), qrels, parse_measure("MAP"), 100)[-1].endswith("so MAP counts no deeper.")
    import pandas as pd

    md = grid_markdown(pd.DataFrame([{"operators": "and=product,or=sum,not=complement", "measure": "R@1000", "value": 0.5}]),
                       parse_measure("R@1000"), notes)
    assert md.endswith(f"- {notes[-1]}\n") and "0.5000" in md
