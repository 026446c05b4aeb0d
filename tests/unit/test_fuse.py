"""Fusion through ranx (pipelines/retrieval/methods/fuse.py, the `fuse` stage): the figures of a hand
computation for its normalisations and methods, rrf equal to the rrf stage's, weights
optimised on a qrels file, the stage in a pipeline over precomputed runs, and the refusals."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.retrieval.methods.fuse import fuse, optimize
from logicrank.pipelines.retrieval.methods.hybrid import rrf
from logicrank.pipelines.retrieval.pipeline import Pipeline, PipelineError
from logicrank.pipelines.retrieval.runner import Inputs
from logicrank.pipelines.retrieval.stages import Context
from logicrank.schemas.tables import RUN


def _run(rows: list[tuple[str, str, float]], run_id: str) -> pa.Table:
    ranks = {}
    out = []
    for q, d, s in rows:
        ranks[q] = ranks.get(q, 0) + 1
        out.append((q, d, ranks[q], s))
    return pa.table({"query_id": [r[0] for r in out], "doc_id": [r[1] for r in out], "rank": pa.array([r[2] for r in out], pa.int32()),
                     "score": [r[3] for r in out], "method": ["x"] * len(out), "run_id": [run_id] * len(out)}, schema=RUN)


A = _run([("q1", "d1", 10.0), ("q1", "d2", 6.0), ("q1", "d3", 2.0), ("q2", "d1", 5.0), ("q2", "d4", 5.0)], "a")
B = _run([("q1", "d3", 0.9), ("q1", "d4", 0.5), ("q1", "d1", 0.1)], "b")  # q2: B retrieves nothing


def _scores(run: pa.Table) -> dict[tuple[str, str], float]:
    return {(q, d): s for q, d, s in zip(*(run.column(c).to_pylist() for c in ("query_id", "doc_id", "score")), strict=True)}


def _order(run: pa.Table) -> list[tuple[str, str, int]]:
    return list(zip(*(run.column(c).to_pylist() for c in ("query_id", "doc_id", "rank")), strict=True))


@pytest.mark.slow  # the first ranx fusion in a process compiles ranx's numba functions (about 35 s here)
def test_combsum_combmnz_and_wsum_over_min_max_are_the_hand_computed_figures():
    # q1, min-max: a: d1 1, d2 0.5, d3 0; b: d3 1, d4 0.5, d1 0. q2: a's two scores are equal: each 0 (ranx's rule); b has no q2
    mnz = fuse([A, B], k=10, method="mnz")
    assert _scores(mnz) == pytest.approx({("q1", "d1"): 2.0, ("q1", "d2"): 0.5, ("q1", "d3"): 2.0, ("q1", "d4"): 0.5,
                                          ("q2", "d1"): 0.0, ("q2", "d4"): 0.0}, abs=1e-12)
    # ties at 2.0 (d1, d3), 0.5 (d2, d4) and 0 (q2) rank by doc_id descending (trec_eval's order)
    assert _order(mnz) == [("q1", "d3", 1), ("q1", "d1", 2), ("q1", "d4", 3), ("q1", "d2", 4), ("q2", "d4", 1), ("q2", "d1", 2)]
    assert mnz.column("method").unique().to_pylist() == ["fuse-mnz"]
    assert _scores(fuse([A, B], k=10, method="sum")) == pytest.approx(
        {("q1", "d1"): 1.0, ("q1", "d2"): 0.5, ("q1", "d3"): 1.0, ("q1", "d4"): 0.5, ("q2", "d1"): 0.0, ("q2", "d4"): 0.0}, abs=1e-12)
    wsum = _scores(fuse([A, B], k=10, method="wsum", weights=[0.8, 0.2]))
    assert wsum[("q1", "d1")] == pytest.approx(0.8) and wsum[("q1", "d2")] == pytest.approx(0.4)
    assert wsum[("q1", "d3")] == pytest.approx(0.2) and wsum[("q1", "d4")] == pytest.approx(0.1)
    assert fuse([A, B], k=1, method="mnz").num_rows == 2  # each query's top k


def test_zmuv_is_the_z_score_and_none_keeps_the_raw_scores():
    z = _scores(fuse([A, A], k=10, method="sum", norm="zmuv"))  # a run fused with itself: twice its z-scores
    sd = math.sqrt(((10 - 6) ** 2 + 0 + (2 - 6) ** 2) / 3)  # population standard deviation, as ranx
    assert z[("q1", "d1")] == pytest.approx(8 / sd) and z[("q1", "d2")] == pytest.approx(0.0) and z[("q1", "d3")] == pytest.approx(-8 / sd)
    assert _scores(fuse([A, B], k=10, method="wsum", norm="none", weights=[1.0, 0.0])) == pytest.approx(
        {**_scores(A), ("q1", "d4"): 0.0})
    with pytest.raises(ValueError, match="two runs or more"):
        fuse([A], k=10)
    empty = B.slice(0, 0)  # a sub-pipeline that found nothing: the other ranks as itself
    assert _order(fuse([A, empty], k=10, method="mnz")) == [("q1", "d1", 1), ("q1", "d2", 2), ("q1", "d3", 3),
                                                            ("q2", "d1", 1), ("q2", "d4", 2)]  # a's tie in a's own order
    assert fuse([empty, empty], k=10).num_rows == 0


@pytest.mark.parametrize("norm", ["zmuv", "min-max", "max", "sum", "rank", "borda", "none"])
def test_a_run_without_some_queries_loses_no_pair_of_the_others(norm):
    """Run b found nothing for three of forty queries (a BM25 query of stop words): every
    (query, document) of either run is in the fused run, and a query b holds is scored from
    both runs' normalised scores, whatever queries b lacks."""
    rows = [(f"q{i:02d}", f"d{(i + j) % 30}", 1.0 + ((i * 7 + j * 3) % 11)) for i in range(40) for j in range(5)]
    a = _run(sorted(rows, key=lambda r: (r[0], -r[2], r[1])), "a")
    b_rows = [(q, d, s / 2 + 0.25 * (d == "d0")) for q, d, s in rows if q not in ("q00", "q05", "q20")]
    b = _run(sorted(b_rows, key=lambda r: (r[0], -r[2], r[1])), "b")
    fused = fuse([a, b], k=1000, method="sum", norm=norm)
    assert set(_scores(fused)) == set(_scores(a)) | set(_scores(b))
    alone = fuse([a.filter(pa.compute.equal(a.column("query_id"), "q39")), b.filter(pa.compute.equal(b.column("query_id"), "q39"))],
                 k=1000, method="sum", norm=norm)  # a query both hold, fused alone
    assert {k: v for k, v in _scores(fused).items() if k[0] == "q39"} == pytest.approx(_scores(alone), abs=1e-12)


@pytest.mark.parametrize("norm", ["min-max", "max", "sum", "zmuv"])
def test_a_normalisation_keeps_ties_in_the_order_the_raw_scores_give_them(norm):
    """A rank-based fusion reads each run's ranks: a normalisation, which keeps the scores'
    order, must keep the order of tied documents too, so rrf over normalised scores equals rrf
    over the raw ones."""
    tied = _run([("q1", f"d{i:02d}", 1.0) for i in range(20)] + [("q2", "d00", 1.0)], "a")
    ranked = _run([("q1", f"d{i:02d}", float(20 - i)) for i in range(0, 20, 2)], "b")
    assert _scores(fuse([tied, ranked], k=100, method="rrf", norm=norm)) == pytest.approx(
        _scores(fuse([tied, ranked], k=100, method="rrf", norm="none")), abs=1e-12)


@pytest.mark.parametrize(("method", "norm"), [(m, "none") for m in ("rrf", "isr", "log_isr", "logn_isr", "rbc", "bordafuse", "condorcet")]
                         + [("w_bordafuse", "none"), ("w_condorcet", "none"), ("sum", "rank"), ("sum", "borda")])
def test_a_fusion_of_ranks_reads_tied_documents_in_the_runs_own_order(method, norm):
    """ranx orders each query's documents by a sort of their scores that leaves ties in any
    order past 15 documents; a fusion or normalisation of ranks reads the run's ranks instead,
    so a run of tied scores fuses as the same ranks with distinct scores do, and rrf as the
    rrf stage."""
    rows = [("q1", f"d{i:02d}") for i in range(19, -1, -1)] + [("q2", "d00")]  # ranked as trec_eval ranks ties: doc id descending
    tied = _run([(q, d, 1.0) for q, d in rows], "a")
    distinct = _run([(q, d, 100.0 - i) for i, (q, d) in enumerate(rows)], "a")
    other = _run([("q1", f"d{i:02d}", float(20 - i)) for i in range(0, 20, 3)] + [("q1", "zz", 0.5)], "b")
    parameter = 0.8 if method == "rbc" else None
    got = _order(fuse([tied, other], k=100, method=method, norm=norm, parameter=parameter))
    assert got == _order(fuse([distinct, other], k=100, method=method, norm=norm, parameter=parameter))
    if method == "rrf":
        assert got == _order(rrf([tied, other], k=100))


@pytest.mark.parametrize("method", ["sum", "rrf"])
def test_one_run_with_rows_beside_empty_ones_ranks_as_itself_ties_in_its_own_order(method):
    """With one run that found anything, the fused run ranks as that run: old code re-ranked
    it by score alone, so its tied documents went doc id descending (d3, d2, d1) and, cut at
    k, its first document was lost. ranx is not asked (no second run): no compile."""
    qrels_like = _run([("q1", "d1", 1.0), ("q1", "d2", 1.0), ("q1", "d3", 1.0)], "a")  # a qrels run: one score, ranked by the file
    empty = _run([], "b")
    assert _order(fuse([qrels_like, empty], k=3, method=method)) == [("q1", "d1", 1), ("q1", "d2", 2), ("q1", "d3", 3)]
    assert _order(fuse([empty, qrels_like], k=2, method=method)) == [("q1", "d1", 1), ("q1", "d2", 2)]


def test_max_refuses_a_query_whose_scores_are_none_above_zero():
    """ranx's max divides by max(largest, 1e-9): a run of log-probabilities (all below 0) was
    multiplied by 1e9 and ranked the fusion alone, the other run counting for nothing. Refused
    in one line; a run with its largest score above 0 is divided by it."""
    loglik = _run([("q1", "d1", -1.0), ("q1", "d2", -2.0), ("q1", "d3", -3.0)], "a")
    other = _run([("q1", "d3", 0.9), ("q1", "d2", 0.5), ("q1", "d1", 0.1)], "b")
    with pytest.raises(ValueError, match="norm max divides each query's scores by its largest, and query 'q1' has none above 0") as info:
        fuse([loglik, other], 10, method="sum", norm="max")
    assert "\n" not in str(info.value)
    assert _scores(fuse([A, B], 10, method="sum", norm="max")) == pytest.approx(
        {("q1", "d1"): 1.0 + 0.1 / 0.9, ("q1", "d2"): 0.6, ("q1", "d3"): 0.2 + 1.0, ("q1", "d4"): 0.5 / 0.9, ("q2", "d1"): 1.0, ("q2", "d4"): 1.0})
    with pytest.raises(ValueError, match="rrf's k is a whole number"):
        fuse([A, B], 10, method="rrf", parameter=60.7)
    zeros = _run([("q1", "d1", 0.0), ("q1", "d2", 0.0)], "z")  # scores all 0 stay 0 (ranx's 0 / 1e-9): fused, not refused
    assert _scores(fuse([zeros, other], 10, method="sum", norm="max")) == pytest.approx(
        {("q1", "d1"): 0.1 / 0.9, ("q1", "d2"): 0.5 / 0.9, ("q1", "d3"): 1.0})


def test_ranx_rrf_equals_the_rrf_stage():
    assert _scores(fuse([A, B], k=10, method="rrf", norm="none")) == pytest.approx(_scores(rrf([A, B], k=10)), abs=1e-12)
    assert _scores(fuse([A, B], k=10, method="rrf", norm="none", parameter=10)) == pytest.approx(_scores(rrf([A, B], k=10, rrf_k=10)))


def test_fused_scores_equal_in_arithmetic_tie_as_trec_eval_reads_them_so_the_trec_file_agrees(tmp_path):
    """RRF sums equal in arithmetic (1/66 + 1/99 = 1/72 + 1/88 = 5/198) differ in their last
    64-bit bits (0.025252525252525256 and ...252), and the run ranked them by those bits, while
    trec_eval, reading the run's TREC file as 32-bit floats, ties them and ranks by doc id
    descending: the Parquet run and its TREC file gave two MRRs (a helper's audit). A run is
    ranked by the score as trec_eval stores it; scores tied so are written as that 32-bit
    value, so no reader (ranx sorts by the 64 bits) ranks a later one first."""
    from logicrank.pipelines.io import read_run, write_trec_run

    def ranked(places: dict[str, int], run_id: str) -> pa.Table:
        at = {r: d for d, r in places.items()}
        return _run([("q1", at.get(r, f"f{run_id}{r:02d}"), 1.0 / r) for r in range(1, 41)], run_id)

    fused = rrf([ranked({"d00": 6, "d39": 12}, "a"), ranked({"d00": 39, "d39": 28}, "b")], k=100)
    scores = _scores(fused)
    assert scores[("q1", "d00")] == scores[("q1", "d39")] == pytest.approx(5 / 198, abs=1e-8)
    order = [d for _, d, _ in _order(fused)]
    assert order.index("d39") == order.index("d00") - 1  # one score: the larger doc id first
    back = read_run(write_trec_run(fused, tmp_path / "run.trec"))
    assert _order(back) == _order(fused)


def test_weights_optimised_on_qrels_favour_the_run_that_finds_the_relevant_document():
    qrels = pa.table({"query_id": ["q1"], "doc_id": ["d4"], "relevance": pa.array([1], pa.int32())})
    best, n = optimize([A, B], qrels, "wsum", "min-max", "nDCG@10", step=0.1)  # the project's spelling of ranx's ndcg@10
    w_a, w_b = best["weights"]
    assert n == 1 and w_a < 0.5 * w_b  # d4 (only b retrieves it, at 0.5) ranks second only when a weighs under half of b
    top = fuse([A, B], k=10, method="wsum", weights=best["weights"])
    assert [d for q, d, _ in _order(top) if q == "q1"].index("d4") == 1
    with pytest.raises(ValueError, match="nothing to optimise on"):
        optimize([A, B], qrels.slice(0, 0), "wsum", "min-max")


def test_the_fuse_stage_fuses_its_sub_pipelines_and_optimises_on_a_qrels_file(tmp_path):
    pq.write_table(A, tmp_path / "a.parquet")
    pq.write_table(B, tmp_path / "b.parquet")
    (tmp_path / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td4\t1\n")
    queries = pa.table({"query_id": ["q1", "q2"], "text": ["x", "y"]})
    of = [[{"run_file": {"path": str(tmp_path / "a.parquet")}}], [{"run_file": {"path": str(tmp_path / "b.parquet")}}]]
    files = {str(tmp_path / f): {"sha256": f} for f in ("a.parquet", "b.parquet", "train.tsv")}
    inputs = Inputs("t", encoder="e", files=files)
    out = Pipeline.parse("fused", [{"fuse": {"k": 3, "method": "mnz", "of": of}}]).run(Context(store=None), queries, inputs=inputs)
    assert out.run.column("run_id").unique().to_pylist() == ["fused"]
    assert out.run.filter(pa.compute.equal(out.run.column("query_id"), "q1")).column("doc_id").to_pylist() == ["d3", "d1", "d4"]
    tuned = Pipeline.parse("tuned", [{"fuse": {"method": "wsum", "optimize": str(tmp_path / "train.tsv"), "of": of}}])
    result = tuned.run(Context(store=None), queries, inputs=inputs)
    counts = result.steps[-1]
    assert counts["optimized_on_queries"] == 1 and counts["weights"][0] < 0.5 * counts["weights"][1]


@pytest.mark.parametrize(("options", "message"), [
    ({"of": []}, "give at least one sub-pipeline to fuse"),
    ({"of": [["dense"]]}, "fuses two sub-pipelines or more"),
    ({"method": "bayesfuse", "of": [["dense"], ["bm25"]]}, "'sum', 'mnz'"),
    ({"norm": "softmax", "of": [["dense"], ["bm25"]]}, "'min-max'"),
    ({"method": "sum", "weights": [1, 2], "of": [["dense"], ["bm25"]]}, "method sum takes no weights"),
    ({"method": "wsum", "weights": [1], "of": [["dense"], ["bm25"]]}, "1 weights for 2 sub-pipelines"),
    ({"method": "wsum", "weights": [1, 1], "optimize": "q.tsv", "of": [["dense"], ["bm25"]]}, "weights or optimize, not both"),
    ({"method": "mnz", "parameter": 3, "of": [["dense"], ["bm25"]]}, "method mnz takes no parameter"),
    ({"method": "mnz", "optimize": "q.tsv", "of": [["dense"], ["bm25"]]}, "method mnz has nothing to optimise"),
    ({"method": "rbc", "of": [["dense"], ["bm25"]]}, "method rbc has no default phi: give its parameter"),
    ({"k": 0, "of": [["dense"], ["bm25"]]}, "greater than or equal to 1"),
    ({"method": "rrf", "parameter": 60.7, "of": [["dense"], ["bm25"]]}, "rrf's k is a whole number of 1 or more"),
    ({"method": "rrf", "parameter": 0.5, "of": [["dense"], ["bm25"]]}, "rrf's k is a whole number of 1 or more"),
    ({"method": "wsum", "optimize": "q.tsv", "metric": "ndcgg@10", "of": [["dense"], ["bm25"]]}, "metric 'ndcgg@10': give one of ndcg"),
    ({"method": "wsum", "optimize": "q.tsv", "metric": "ndcg@x", "of": [["dense"], ["bm25"]]}, "metric 'ndcg@x'"),
])
def test_a_bad_fuse_stage_is_refused_in_one_line(options, message):
    with pytest.raises(PipelineError, match=message) as info:
        Pipeline.parse("x", [{"fuse": options}])
    assert "\n" not in str(info.value)


def test_rbc_without_its_phi_is_refused_in_one_line_and_runs_with_it():
    """ranx's rbc has no default phi (a TypeError from inside ranx before): the API refuses it
    in one line; given, or with the stage optimising it, it runs."""
    a = _run([("q1", "d1", 3.0), ("q1", "d2", 1.0)], "a")
    b = _run([("q1", "d2", 2.0), ("q1", "d3", 1.0)], "b")
    with pytest.raises(ValueError, match="method rbc has no default phi") as info:
        fuse([a, b], 10, method="rbc")
    assert "\n" not in str(info.value)
    assert fuse([a, b], 10, method="rbc", parameter=0.8).column("doc_id").to_pylist() == ["d2", "d1", "d3"]
    Pipeline.parse("x", [{"fuse": {"method": "rbc", "optimize": "q.tsv", "of": [["dense"], ["bm25"]]}}])
    with pytest.raises(ValueError, match="method gmnz has no default gamma"):  # ranx's gmnz has none either
        fuse([a, b], 10, method="gmnz")
    assert fuse([a, b], 10, method="gmnz", parameter=1.0).num_rows == 3


def test_ranx_is_imported_with_its_functions_cached_by_content_under_its_version(tmp_path):
    """ranx's numba functions are cached by the content of ranx's files
    (pipelines/numba_cache.py), so a new virtual environment with the same ranx loads them: the
    fusion imports ranx so, in a fresh interpreter, here with nothing compiled."""
    import importlib.metadata
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    child = ("import json\n"
             "from logicrank.pipelines.retrieval.methods.fuse import fuse\n"
             "try:\n    fuse([], 1)\nexcept ValueError:\n    pass\n"  # ranx imported, nothing fused
             "from ranx.fusion.comb_sum import _comb_sum\n"
             "print(json.dumps(_comb_sum.stats.cache_path))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")} | {"NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", child], cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    path = Path(json.loads(done.stdout.strip().splitlines()[-1]))
    top, *below = path.relative_to(tmp_path).parts
    assert top.startswith(f"ranx-{importlib.metadata.version('ranx')}-") and below == ["fusion"], path


@pytest.mark.slow  # two fresh interpreters, the first compiling ranx and numba's containers
def test_the_typed_containers_ranx_uses_are_compiled_once_for_every_later_process(tmp_path):
    """numba compiles the helpers of its typed dicts and lists (no cache of its own) on first
    use; the fusion caches them by the content of numba's files, so a second process fusing
    loads them (docs/bulk-retrieval.md) and gives the same fused run."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    child = ("import json, pyarrow as pa\n"
             "from logicrank.pipelines.retrieval.methods.fuse import fuse\n"
             "a = pa.table({'query_id': ['q1'] * 3, 'doc_id': ['d1', 'd2', 'd3'], 'score': [10.0, 6.0, 2.0], 'rank': [1, 2, 3]})\n"
             "b = pa.table({'query_id': ['q1'] * 2, 'doc_id': ['d3', 'd4'], 'score': [5.0, 1.0], 'rank': [1, 2]})\n"
             "fused = fuse([a, b], k=10, method='sum', norm='zmuv')\n"
             "from numba.typed import typeddict\n"
             "s = typeddict._make_dict.stats\n"
             "print(json.dumps([s.cache_path, sum(s.cache_hits.values()), sum(s.cache_misses.values()), fused.to_pylist()]))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")} | {"NUMBA_CACHE_DIR": str(tmp_path)}
    out = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", child], cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    (path, hits, misses, fused), (path2, hits2, misses2, fused2) = out
    assert Path(path).relative_to(tmp_path).parts[0].startswith("numba-typed-") and path2 == path
    assert (hits, misses) == (0, 1) and (hits2, misses2) == (1, 0)  # compiled by the first process, loaded by the second
    assert fused2 == fused
