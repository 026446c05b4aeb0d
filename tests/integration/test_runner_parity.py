"""A pipeline run in process (pipelines/retrieval/runner.py, as a notebook runs it, and through the
Python API ``import logicrank``) writes what the retrieve job writes: the same runs (ids and
ranks exactly, scores within tests/compare.py's tolerance) and the same side tables, from the
same stage code without Ray or a job."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.jobs.retrieve import run_retrieve
from logicrank.pipelines.config.retrieval import RetrieveConfig
from logicrank.pipelines.config.settings import EmbedConfig
from logicrank.pipelines.engines.embed import Embedder
from logicrank.pipelines.engines.store import DocStore
from logicrank.pipelines.evaluation.core import run_metrics
from logicrank.pipelines.evaluation.measures import parse_measures
from logicrank.pipelines.io import read_qrels, read_queries
from logicrank.pipelines.retrieval.pipeline import Pipeline
from logicrank.pipelines.retrieval.runner import StageCache
from logicrank.pipelines.retrieval.stages import Context
from logicrank.schemas.tables import METRICS, RUN
from tests.compare import assert_runs_close, assert_tables_close
from tests.integration.conftest import RAY

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]  # jobs join the session's cluster (conftest.py)
DEC = Path(__file__).parents[1] / "data" / "parity" / "reference" / "synthetic" / "decompositions.parquet"
SETS = {"dense.k": 10, "bm25.k": 10, "rrf.k": 10, "itlr.k": 10, "decomposition.decompositions": str(DEC)}  # each preset at k 10, ITLR over the LLM's logical queries


@pytest.fixture(scope="module")
def job(synthetic, tmp_path_factory):
    """The retrieve job's runs of four presets on the synthetic table."""
    queries, db = synthetic / "syn" / "queries.jsonl", str(synthetic / "db")
    cfg = RetrieveConfig.preset(("dense", "bm25", "hybrid", "itlr-llm"), queries=str(queries), db=db, set=SETS, ray=RAY)
    out = tmp_path_factory.mktemp("job")
    return cfg, run_retrieve(cfg, out), out


def test_pipelines_run_in_process_equal_the_retrieve_jobs_runs_and_side_tables(synthetic, job):
    queries, db = synthetic / "syn" / "queries.jsonl", str(synthetic / "db")
    cfg, runs, out = job

    encoder = Embedder(EmbedConfig())
    ctx = Context(DocStore(db), encoder=lambda: encoder)
    cache = StageCache()
    table = read_queries(queries)
    for rid, stages in cfg.pipelines.items():
        result = Pipeline(rid, stages).run(ctx, table, cache)
        at_cut = assert_runs_close(result.run, pq.read_table(runs[rid]), f"{rid}: in process vs the job")
        assert result.run.num_rows > 0
        if rid == "itlr-llm":
            assert set(result.side) == {"term_scores/itlr-llm"} and result.side["term_scores/itlr-llm"].num_rows > 0
            assert_tables_close(result.side["term_scores/itlr-llm"], pq.read_table(out / "term_scores" / "itlr-llm.parquet"),
                                ["query_id", "doc_id", "term_id"], "term_scores", may_differ=at_cut)
    again = Pipeline("hybrid", cfg.pipelines["hybrid"]).run(ctx, table, cache)  # every stage from the shared cache
    assert [s["sub"][0]["cached"] for s in again.steps[:2]] == [True, True] and again.steps[2]["cached"]


def test_a_notebook_run_after_the_job_reuses_every_stage_output_the_job_cached(synthetic, job):
    """One key scheme (pipelines.retrieval.runner.Inputs.of): the job's stage cache answers the Python
    API's run of the same pipelines on the same queries and table, every stage of it."""
    import logicrank as lr

    cfg, runs, out = job
    pipes = lr.preset("dense", "bm25", "hybrid", "itlr-llm", set=SETS)
    results = lr.retrieve(lr.open_table(synthetic / "db"), synthetic / "syn" / "queries.jsonl", pipes, cache=out / "stages")

    def flat(steps):
        return [t for s in steps for t in (flat(s["sub"]) if "sub" in s else [s])]

    assert set(results) == set(runs)
    for rid, result in results.items():
        assert [(s["stage"], s["cached"]) for s in flat(result.steps)] == [(s["stage"], True) for s in flat(result.steps)], rid
        assert result.run.equals(pq.read_table(runs[rid])), rid  # the job's run, read back from its cache


def test_the_python_api_retrieves_what_the_job_does_and_evaluates_and_compares_the_runs(synthetic, job):
    import logicrank as lr

    cfg, runs, _ = job
    table = lr.open_table(synthetic / "db")
    assert table.version == DocStore(str(synthetic / "db")).version and len(table) > 100
    pipes = lr.preset("dense", "bm25", "hybrid", "itlr-llm", set=SETS)
    assert {rid: p.stages for rid, p in pipes.items()} == dict(cfg.pipelines)  # presets as the CLI builds them
    results = lr.retrieve(table, synthetic / "syn" / "queries.jsonl", pipes)
    assert list(results) == list(pipes)
    for rid, path in runs.items():
        assert_runs_close(results[rid].run, pq.read_table(path), f"{rid}: the Python API vs the job")
    assert set(results["itlr-llm"].side) == {"term_scores/itlr-llm"}
    got = results.run  # every run as one RUN table
    frame = lr.retrieve(table, lr.read_queries(synthetic / "syn" / "queries.jsonl"), [pipes["bm25"]])["bm25"].to_pandas()
    assert list(frame.columns) == RUN.names and len(frame) == sum(r == "bm25" for r in got.column("run_id").to_pylist())

    qrels = synthetic / "syn" / "qrels" / "test.tsv"
    metrics = lr.evaluate(got, qrels, ["nDCG@10", "R@100"]).metrics
    assert metrics.schema.equals(METRICS)
    assert lr.evaluate(results, qrels, ["nDCG@10", "R@100"]).metrics.equals(metrics)  # the mapping as retrieve gives it
    for rid, path in runs.items():  # the same figures as each job run evaluated alone
        want = run_metrics(pq.read_table(path), read_qrels(qrels), parse_measures(["nDCG@10", "R@100"]))
        mine = metrics.filter(pa.compute.equal(metrics.column("run_id"), rid))
        assert_tables_close(mine, want, ["run_id", "query_id", "measure"], f"{rid} metrics")
    empty = lr.evaluate(got, qrels, ["nDCG@10"], run_ids=["bm25", "nothing"]).metrics  # a run with no rows is named, and scores 0
    nothing = empty.filter(pa.compute.equal(empty.column("run_id"), "nothing"))
    assert nothing.num_rows == metrics.filter(pa.compute.equal(metrics.column("run_id"), "bm25")).num_rows // 2
    assert set(nothing.column("value").to_pylist()) == {0.0}
    with pytest.raises(lr.UserError, match="duplicate query ids"):
        lr.retrieve(table, pa.table({"query_id": [1, 1], "text": ["a", "b"]}), [pipes["bm25"]])
    sig = lr.compare(metrics, baseline="bm25")
    assert sorted(set(sig.column("run_id").to_pylist())) == ["dense", "hybrid", "itlr-llm"] and set(sig.column("measure").to_pylist()) == {"nDCG@10", "R@100"}

    with pytest.raises(lr.PipelineError, match=r"no table 'nope' in .* \(it holds 'docs'\)"):
        lr.open_table(synthetic / "db", "nope")
    with pytest.raises(lr.PipelineError, match="give open_table\\(llm=LLMConfig"):
        lr.retrieve(table, synthetic / "syn" / "queries.jsonl", lr.read_pipelines({"o": [{"decomposition": {"target": "orlog"}}, "bm25", "orlog"]}))
    with pytest.raises(lr.PipelineError, match="pipeline 'x'.*unknown stage 'bm52'"):
        lr.read_pipelines({"x": ["bm52"]})
