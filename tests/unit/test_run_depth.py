"""A run's depth, visible and settable: ``--k N`` (``--hits``) is the override grammar's
``RUN/STAGE.k=N`` for each pipeline's last stage that keeps a top k (pipelines/retrieval/overrides.py);
every report states each run's depth; a flag that was renamed says what replaced it."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from logicrank.cli import RENAMED, app
from logicrank.pipelines.evaluation.core import run_depth
from logicrank.pipelines.evaluation.experiment import ExperimentResult, load, override, render
from logicrank.pipelines.retrieval.overrides import OverrideError, depth_sets, parse_sets, with_depth
from logicrank.pipelines.retrieval.pipeline import read_pipelines, read_presets
from logicrank.schemas.tables import RUN


def _run(rid: str, per_query: dict[str, int]) -> pa.Table:
    """A RUN table holding ``per_query[q]`` documents for each query q, ranked 1..n."""
    rows = [(q, f"{q}-d{r}", r) for q, n in per_query.items() for r in range(1, n + 1)]
    return pa.table({"query_id": [q for q, _, _ in rows], "doc_id": [d for _, d, _ in rows], "rank": pa.array([r for *_, r in rows], pa.int32()),
                     "score": [1.0 / r for *_, r in rows], "method": [rid] * len(rows), "run_id": [rid] * len(rows)}, schema=RUN)


def _k(stages) -> list:
    """Each stage's k, a fusion's sub-pipelines' as nested lists."""
    return [[_k(sub) for sub in o.of] + [o.k] if hasattr(o, "of") else getattr(o, "k", None) for o in stages]


def test_k_is_the_depth_option_of_each_pipelines_last_stage_that_keeps_a_top_k():
    presets = read_presets(["dense", "bm25", "hybrid", "orlog", "reasoner", "itlr", "itlr-llm", "expansion"])
    assert depth_sets(presets, 1000) == {
        "dense/dense.k": 1000, "bm25/bm25.k": 1000, "hybrid/rrf.k": 1000, "hybrid/dense.k": 1000, "hybrid/bm25.k": 1000,
        "orlog/orlog.k": 1000, "reasoner/reasoner.k": 1000, "itlr/itlr.k": 1000, "itlr-llm/itlr.k": 1000, "expansion/dense.k": 1000}
    got = read_presets(["hybrid", "orlog", "bm25"], k=5)
    assert _k(got["hybrid"]) == [[[5], [5], 5]]  # the fused lists as deep as the fused run
    assert _k(got["orlog"]) == [20, None, 5]  # the reranker keeps 5; its candidates stay BM25's top 20
    assert _k(got["bm25"]) == [5]
    # a pipelines file: the last stage with a depth, not a cut's per-query depths file nor lag's passages per step
    piped = read_pipelines({"cut": [{"dense": {"k": 100}}, {"cut": {"k": 10}}],
                            "rules": [{"bm25": {"k": 50}}, {"r3": {"n": 20}}, {"reason": {}}]})
    assert depth_sets({n: p.stages for n, p in piped.items()}, 7) == {"cut/cut.k": 7, "rules/r3.k": 7}


def test_k_and_a_set_of_the_same_depth_is_refused_and_a_pipeline_without_a_depth_too():
    presets = read_presets(["hybrid", "orlog"])
    assert with_depth(parse_sets(["orlog/bm25.k=50"]), presets, 30) == {
        "orlog/bm25.k": 50, "hybrid/rrf.k": 30, "hybrid/dense.k": 30, "hybrid/bm25.k": 30, "orlog/orlog.k": 30}
    for given in (["rrf.k=10"], ["hybrid/bm25.k=10"], ["orlog/orlog.k=10"]):
        with pytest.raises(OverrideError, match=r"^--k 30 and --set \S+ both set \S+ \(--k is --set hybrid/|^--k 30 and --set orlog/orlog.k"):
            with_depth(parse_sets(given), presets, 30)
    assert with_depth(parse_sets(["bm25.k=10"]), read_presets(["orlog"]), None) == {"bm25.k": 10}  # no --k: the sets alone
    lag = {"lag": read_pipelines({"lag": [{"lag": {"plan": "question"}}]})["lag"].stages}
    with pytest.raises(OverrideError, match=r"^--k 5: pipeline 'lag' \(lag\) has no stage that keeps a top k; drop --k, or add a cut stage"):
        depth_sets(lag, 5)


def test_k_is_refused_where_its_key_would_also_deepen_a_rerankers_candidates():
    # the reasoner reranks BM25's top 20; RUN/bm25.k would set that bm25 as well as the fused one
    shared = {n: p.stages for n, p in read_pipelines({"f": [{"rrf": {"of": [[{"bm25": {"k": 20}}, {"reasoner": {"k": 100}}],
                                                                          [{"bm25": {"k": 100}}]]}}]}).items()}
    with pytest.raises(OverrideError, match=r"^--k 1000: pipeline 'f' holds stage 'bm25' as a run's last stage and also before another "
                                            r"stage \(its candidates\); f/bm25\.k would set both, so give each depth in the pipeline file instead$"):
        depth_sets(shared, 1000)
    twice = {n: p.stages for n, p in read_pipelines({"b": [{"rrf": {"of": [[{"bm25": {"k": 100}}], [{"bm25": {"k": 50}}]]}}]}).items()}
    assert depth_sets(twice, 1000) == {"b/rrf.k": 1000, "b/bm25.k": 1000}  # both bm25s are the fused runs: one key sets both rightly


def test_experiment_k_sets_every_runs_depth_and_drops_the_references_it_moves():
    exp = load("scifact")
    got = override(exp, with_depth({}, exp.pipelines_to_run(), 1000))
    runs = got.pipelines_to_run()
    assert _k(runs["dense"]) == [1000] and _k(runs["bm25"]) == [1000] and _k(runs["hybrid"]) == [[[1000], [1000], 1000]]
    assert exp.references and got.references == ()  # the file's figures are 100-deep runs' figures


def test_a_k_that_a_stage_refuses_is_named_alike_in_retrieve_and_experiment(tmp_path):
    import yaml

    pipelines = {"c": [{"dense": {"k": 100}}, {"cut": {"depths": "d.jsonl"}}]}  # a cut by a depths file takes no k
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pipelines))
    (tmp_path / "e.yaml").write_text(yaml.safe_dump({"name": "x", "title": "x", "dataset": {"bundled": "scifact"}, "pipelines": pipelines}))
    line = "error: --k 5: --set c/cut.k=5: cut: give k or depths (one of them)"
    for args in (["retrieve", "q.jsonl", "--db", str(tmp_path / "db"), "--pipelines", str(tmp_path / "p.yaml")],
                 ["experiment", str(tmp_path / "e.yaml")]):
        res = CliRunner().invoke(app, [*args, "--k", "5", "--out", str(tmp_path / "o")])
        assert res.exit_code == 2 and res.output.strip() == line, (args[0], res.output)


def test_run_depth_is_the_most_documents_of_one_query():
    assert run_depth(_run("a", {"q1": 3, "q2": 5, "q3": 1})) == 5
    assert run_depth(RUN.empty_table()) == 0


def test_evaluate_states_each_runs_depth_in_its_report_its_summary_and_its_manifest(tmp_path):
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\tq{i}-d2\t1\n" for i in range(3)))
    pq.write_table(_run("deep", {"q0": 12, "q1": 7, "q2": 12}), tmp_path / "deep.parquet")
    pq.write_table(_run("shallow", {"q0": 3, "q1": 3}), tmp_path / "shallow.parquet")
    res = CliRunner().invoke(app, ["evaluate", str(tmp_path / "qrels.tsv"), str(tmp_path / "deep.parquet"), str(tmp_path / "shallow.parquet"),
                                   "--measure", "MAP", "--measure", "P@1", "--out", str(tmp_path / "e")])
    assert res.exit_code == 0, res.output
    assert re.search(r"^measure +depth +MAP +P@1$", res.output, re.M) and re.search(r"^deep +12 +0\.5000 +0\.0000$", res.output, re.M), res.output
    assert re.search(r"^shallow +3 +0\.3333 +0\.0000$", res.output, re.M), res.output
    report = (tmp_path / "e" / "report.md").read_text()
    assert re.search(r"^\| run +\| +depth \| +MAP \| +P@1 \|$", report, re.M), report
    assert re.search(r"^\| deep +\| +12 \| +0\.5000 \| +0\.0000 \|$", report, re.M), report
    assert re.search(r"^\| shallow +\| +3 \| +0\.3333 \| +0\.0000 \|$", report, re.M), report
    assert "depth: the most documents the run holds for a query" in report
    assert json.loads((tmp_path / "e" / "manifest.json").read_text())["depths"] == {"deep": 12, "shallow": 3}


def test_the_experiment_report_has_a_depth_column(tmp_path):
    import pandas as pd

    exp = load("scifact")
    result = ExperimentResult(exp, pa.table({}), pd.DataFrame({"nDCG@10": [0.6851, 0.6439]}, index=["bm25", "dense"]), None, {}, [],
                              tmp_path / "r.md", {}, 1, depths={"bm25": 100, "dense": 1000})
    text = render(result)
    assert re.search(r"^\| run +\| +depth \| +nDCG@10 \|$", text, re.M), text
    assert re.search(r"^\| bm25 +\| +100 \| +0\.6851 \|$", text, re.M) and re.search(r"^\| dense +\| +1000 \| +0\.6439 \|$", text, re.M), text


@pytest.mark.parametrize(("command", "flag"), [(c, f) for c, flags in RENAMED.items() for f in flags])
def test_a_renamed_flag_says_in_one_line_what_replaced_it(command, flag):
    res = CliRunner().invoke(app, [command, "x", flag, "5"] if command != "bench-setlogic" else [command, flag, "5"])
    assert res.exit_code == 2 and res.output.strip() == f"error: {command}: {flag} {RENAMED[command][flag]}", res.output


def test_an_unknown_flag_that_was_never_renamed_keeps_clicks_message():
    res = CliRunner().invoke(app, ["retrieve", "x", "--no-such-flag"])
    assert res.exit_code == 2 and "No such option: --no-such-flag" in res.output


def test_k_and_hits_are_one_option_checked_before_any_work():
    res = CliRunner().invoke(app, ["retrieve", "x", "--hits", "0"])
    assert res.exit_code == 2 and "'--k' / '--hits'" in res.output, res.output


def test_a_run_id_with_a_dot_takes_k_and_its_own_overrides():
    """Run ids may hold dots (`itlr-bm25-strict-0.1` in a shipped experiment, `--run-tag v1.2`);
    keys were split at the first dot, so `--k` and `RUN/STAGE.OPTION` were refused for them.
    Stage and option names hold no dots: a key splits at its last one."""
    got = read_presets(["bm25", "dense"], run_tag="v1.2", k=7)
    assert {run: _k(stages) for run, stages in got.items()} == {"v1.2-bm25": [7], "v1.2-dense": [7]}
    got = read_presets(["bm25", "dense"], run_tag="v1.2", sets=["v1.2-bm25/bm25.k=3"])
    assert _k(got["v1.2-bm25"]) == [3] and _k(got["v1.2-dense"]) == _k(read_presets(["dense"])["dense"])
    with pytest.raises(OverrideError, match=r"no stage 'bm25\.x' in pipeline 'v1\.2-bm25'"):
        read_presets(["bm25"], run_tag="v1.2", sets=["v1.2-bm25/bm25.x.k=3"])
