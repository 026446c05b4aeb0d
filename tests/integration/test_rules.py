"""SIAR and R3 end to end on a small rule set (written here, in RuleBench's layout) through
logicrank's own prepare-rulebench, index and retrieve, with the tiny random LLM: outputs are
random, so the assertions are on structure (every row kept, every window a permutation, the
counts), never on content."""

import json
import re

import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.retrieval.methods import rules
from logicrank.pipelines.retrieval.methods.rules import INDUCED_RULES, RERANK_WINDOWS
from tests.integration.conftest import RAY

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kept_engines")]  # jobs join the session's cluster, LLM pools kept between them (conftest.py)

RULES = {
    "0": "If Person X owns Animal Y, then Person X can feed Animal Y.",
    "1": "If Person X works with Tool Y, then Person X needs to use Tool Y.",
    "2": "If Person X practised Technique Y of Artwork Z, then Person X can imitate Artwork Z.",
    "3": "If Person X is trained to rescue Animal Y, then Person X can rescue Animal Y.",
    "4": "If Person X owns Plant Y, then Person X can water Plant Y.",
    "5": "If Person X wants Game Y, then Person X can buy Game Y.",
    "6": "If Person X drives Vehicle Y, and Vehicle Y needs Fuel Z, then Person X buys Fuel Z.",
    "7": "If Person X studied Plant Y, then Person X can identify Plant Y.",
    "8": "If Person X is allergic to Food Y, then Person X avoids Food Y.",
    "9": "If Person X teaches Subject Y, then Person X knows Subject Y.",
    "10": "If Animal X lives in Habitat Y, then Animal X adapts to Habitat Y.",
    "11": "If Person X repairs Vehicle Y, then Person X has Tool Z.",
}
QUERIES = [
    ("Context:\nAlice owns a cat named Tom.\nQuestion:\nCan Alice feed Tom?", ["0"]),
    ("Context:\nSoftware engineer Bob works with his laptop.\nQuestion:\nDoes Bob need to use his laptop?", ["1"]),
    ("Context:\nSarah practised the brush strokes of 'Starry Night'.\nQuestion:\nCan Sarah imitate 'Starry Night'?", ["2"]),
    ("Context:\nJane drives a red car, and the red car needs petrol.\nQuestion:\nDoes Jane buy petrol?", ["6"]),
]
OUTPUTS = ["Alice can feed Tom.", "Bob needs to use his laptop.", "Sarah can imitate 'Starry Night'.", "Jane buys petrol."]


@pytest.fixture(scope="module")
def rulebase(tmp_path_factory):
    from logicrank.jobs.index import run_index
    from logicrank.pipelines.config.settings import IndexConfig
    from logicrank.pipelines.datasets.rulebench import to_beir

    root = tmp_path_factory.mktemp("rules")
    (root / "ulogic").mkdir()
    (root / "ulogic" / "rules.json").write_text(json.dumps({i: {"NL": t, "FOL": ""} for i, t in RULES.items()}))
    (root / "ulogic" / "test_data.json").write_text(json.dumps([{"input": q, "rule": g, "output": o} for (q, g), o in zip(QUERIES, OUTPUTS, strict=True)]))
    to_beir(root / "ulogic", root / "beir")
    run_index(IndexConfig(corpus=str(root / "beir"), db=str(root / "db")), root / "index")
    return root


def test_siar_then_bm25_then_r3_keeps_every_row_and_every_window_is_a_permutation(rulebase, tiny_cfg, tmp_path):
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.retrieval.pipeline import parse_stages

    siar = {"siar": {"mode": "rule+query", "max_tokens": 48}}
    pipelines = {
        "siar-bm25": [siar, {"bm25": {"k": 8}}],
        "siar-bm25-r3": [siar, {"bm25": {"k": 8}}, {"r3": {"k": 8, "n": 6, "window": 4, "stride": 2}}],
        "rule-alone": [{"siar": {"mode": "rule", "max_tokens": 48}}, {"bm25": {"k": 8}}],
    }
    cfg = RetrieveConfig(
        queries=str(rulebase / "beir" / "queries.jsonl"), db=str(rulebase / "db"),
        pipelines={name: parse_stages(stages) for name, stages in pipelines.items()}, ray=RAY,
        llm=tiny_cfg.model_copy(update={"cache": str(tmp_path / "llm-cache.sqlite")}),
    )
    out = tmp_path / "r"
    runs = run_retrieve(cfg, out)
    qids = [f"ulogic-{i}" for i in range(len(QUERIES))]

    # SIAR: one induced rule row per query, whatever the model wrote; a rule only when it has the shape
    induced = pq.read_table(out / "induced_rules" / "siar-bm25.parquet")
    assert induced.schema == INDUCED_RULES and induced.column("query_id").to_pylist() == qids
    for row in induced.to_pylist():
        assert row["status"] in ("ok", "fallback") and row["model"] and row["prompt_tokens"] > 0
        assert (row["rule"] is not None) == (row["status"] == "ok")
        if row["rule"] is not None:
            assert rules.RULE.fullmatch(row["rule"])
    manifest = json.loads((out / "manifest.json").read_text())
    stages = manifest["pipelines"]["siar-bm25-r3"]["stages"]
    assert stages[0]["fallbacks"] == sum(s != "ok" for s in induced.column("status").to_pylist())
    # the rule-alone pipeline asks the same prompts: the engine is asked once per query, the
    # other mode is served by the LLM cache
    assert manifest["pipelines"]["rule-alone"]["stages"][0]["llm_cache_hits"] == len(QUERIES)
    # one engine for both (started, or taken over from the module's previous job), loaded at most once
    assert manifest["llm"]["actors_started"] + manifest["llm"]["actors_adopted"] == 1 and manifest["llm"]["engines_loaded"] <= 1

    # R3: windows [2, 6) then [0, 4) per query; each output read as a permutation of its window
    windows = pq.read_table(out / "rerank_windows" / "siar-bm25-r3.parquet")
    assert windows.schema == RERANK_WINDOWS
    for row in windows.to_pylist():
        size = row["end"] - row["start"]
        assert sorted(row["permutation"]) == list(range(1, size + 1)) and row["status"] in ("ok", "repaired")
        assert row["generated_tokens"] > 0 and row["finish_reason"] == "stop"  # the regex ends the output
        # what the random model wrote has the syntax (only repeats, and so missing ids, need repair)
        assert re.fullmatch(rules.permutation_regex(size), row["raw_output"]) and row["unknown"] == 0
        assert row["missing"] == row["duplicate"]
    base = pq.read_table(runs["siar-bm25"]).to_pandas()
    spans = {q: rules.windows(min(6, (base.query_id == q).sum()), 4, 2) for q in qids}  # [(2, 6), (0, 4)] for a full list
    assert any(s == [(2, 6), (0, 4)] for s in spans.values())
    got = {q: list(zip(g["start"], g["end"], strict=True)) for q, g in windows.to_pandas().groupby("query_id")}
    assert got == {q: s for q, s in spans.items() if s and s[0][1] >= 2}
    r3 = stages[-1]
    assert r3["windows"] == windows.num_rows == sum(map(len, got.values())) and r3["queries"] == len(QUERIES)
    assert r3["repaired_windows"] == sum(s == "repaired" for s in windows.column("status").to_pylist())

    # R3 reorders what it is given: the same documents per query, those below n in place
    after = pq.read_table(runs["siar-bm25-r3"]).to_pandas()
    for q in qids:
        b = base[base.query_id == q].sort_values("rank").doc_id.tolist()
        a = after[after.query_id == q].sort_values("rank").doc_id.tolist()
        assert sorted(a) == sorted(b) and a[6:] == b[6:]
    assert after.groupby("query_id")["rank"].apply(lambda r: sorted(r) == list(range(1, len(r) + 1))).all()

    # a changed R3 option reruns R3 alone: SIAR and BM25 come from the stage cache
    cfg2 = cfg.model_copy(update={"pipelines": {"siar-bm25-r3": parse_stages([siar, {"bm25": {"k": 8}}, {"r3": {"k": 8, "n": 6, "window": 6}}])}})
    run_retrieve(cfg2, out)
    again = json.loads((out / "manifest.json").read_text())["pipelines"]["siar-bm25-r3"]["stages"]
    assert [s["cached"] for s in again] == [True, True, False] and again[-1]["windows"] == len(got)  # one window of 6


def test_bench_rules_is_rulebench_siar_yaml_with_its_options(rulebase, tiny_cfg, tmp_path):
    """`logicrank bench-rules` (pipelines/evaluation/benchmarks.py) runs jobs/experiments/rulebench-siar.yaml on
    the given set and sample, R3 over the top r3_n: its vanilla rows equal
    rulebench-vanilla.yaml's on the same sample, and R3 only reorders what SIAR retrieved (the
    same R@20 as its first stage)."""
    from typer.testing import CliRunner

    from logicrank.cli import app
    from logicrank.jobs.experiment import run_experiment
    from logicrank.pipelines.evaluation import benchmarks
    from logicrank.pipelines.evaluation.experiment import load, override

    exp = benchmarks.rules(rulebase / "ulogic", sample=3, seed=1, r3_n=4)
    assert exp.references == () and (exp.dataset.sample, exp.dataset.seed) == (3, 1)
    assert [s.n for rid in ("sparse-siar-r3", "dense-siar-r3") for s in exp.pipelines_to_run()[rid] if s.stage == "r3"] == [4, 4]
    res = run_experiment(exp, tmp_path / "bench", llm=tiny_cfg, ray=RAY, progress=False)
    table = res.summary
    assert list(table.index) == list(load("rulebench-siar").pipelines)
    assert len((tmp_path / "bench" / "sample" / "queries.jsonl").read_text().splitlines()) == 3
    for rid, first in (("sparse-siar-r3", "sparse-siar-rule+query"), ("dense-siar-r3", "dense-siar-rule")):
        assert table.loc[rid, "R@20"] == pytest.approx(table.loc[first, "R@20"], abs=1e-12), rid
    report = res.report.read_text()
    assert "Qwen2.5-72B" in report and "- `sparse-siar-r3`: siar" in report and "r3 (" in report  # the paper's figures, R3's counts

    vanilla = override(load("rulebench-vanilla"), {"dataset.rulebench": str(rulebase / "ulogic"), "dataset.sample": 3, "dataset.seed": 1})
    got = run_experiment(vanilla, tmp_path / "vanilla", ray=RAY, progress=False).summary
    for run in ("sparse", "dense"):
        for measure in ("R@1", "R@5", "R@10", "R@20", "MRR"):
            assert got.loc[run, measure] == pytest.approx(table.loc[run, measure], abs=1e-12), (run, measure)

    bad = CliRunner().invoke(app, ["bench-rules", str(rulebase / "ulogic"), "--r3-n", "1"])
    assert bad.exit_code == 2 and "--r3-n" in bad.output


def test_the_reasoning_table_answers_with_no_rule_the_gold_rule_and_each_runs_top_rule(rulebase, tiny_cfg, tmp_path):
    """rulebench-reasoning.yaml (bench-rules --reasoning) end to end: every row answers every
    query once, with the rules its row promises (none; the gold rule; the top 1 of its run),
    and the EM the report prints is the exact match of those answers with the set's outputs."""
    from logicrank.jobs.experiment import run_experiment
    from logicrank.pipelines.evaluation import benchmarks
    from logicrank.pipelines.evaluation.qa import exact_match

    res = run_experiment(benchmarks.reasoning(rulebase / "ulogic"), tmp_path / "reason", llm=tiny_cfg, ray=RAY, progress=False)
    assert list(res.summary.index) == ["no-rule", "gold-rule", "vanilla-top1", "siar-top1", "siar-r3-top1"]
    gold = {f"ulogic-{i}": (g, o) for i, ((_, g), o) in enumerate(zip(QUERIES, OUTPUTS, strict=True))}
    for rid in res.summary.index:
        answers = pq.read_table(tmp_path / "reason" / "retrieve" / "answers" / f"{rid}.parquet").to_pylist()
        assert sorted(a["query_id"] for a in answers) == sorted(gold), rid
        run = pq.read_table(res.runs[rid]).to_pandas()
        for a in answers:
            top = run[run["query_id"] == a["query_id"]].sort_values("rank")["doc_id"].tolist()
            shown = {"no-rule": [], "gold-rule": gold[a["query_id"]][0]}.get(rid, top[:1])
            assert a["rule_ids"] == shown, (rid, a)
        em = sum(exact_match(a["answer"], [gold[a["query_id"]][1]]) for a in answers) / len(gold)
        assert res.summary.loc[rid, "EM"] == pytest.approx(em, abs=1e-12), rid
    assert res.summary.loc["gold-rule", "R@1"] == 1.0
