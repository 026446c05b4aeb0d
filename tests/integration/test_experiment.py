"""`logicrank experiment FILE` (jobs/experiment.py): a benchmark as a file. The runner gives
the table the jobs give when run by hand (the main job's retrieval section moved to
jobs/experiments/scifact.yaml), groups per-query figures, fails a missed reference after
writing its report, and refuses a bad file in one line."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from jobs.cli import app
from jobs.evaluate import run_evaluate
from jobs.experiment import EXPERIMENTS, ExperimentError, ReferenceMissed, load, run_experiment
from jobs.index import run_index
from jobs.retrieve import run_retrieve
from pipelines.config import RetrieveConfig
from pipelines.evaluate.report import summary_frame
from schemas.config import EvaluateConfig, IndexConfig
from tests.compare import assert_runs_close
from tests.conftest import write_jsonl
from tests.integration.conftest import RAY

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def beir(tmp_path_factory, docs300):
    """A BEIR directory: 300 SciFact documents, 40 title queries in two templates, their qrels."""
    root = tmp_path_factory.mktemp("beir")
    write_jsonl(root / "corpus.jsonl", docs300)
    picked = docs300[::7][:40]
    write_jsonl(root / "queries.jsonl", [{"_id": f"q{i}", "text": d["title"], "metadata": {"template": "AB"[i % 2]}} for i, d in enumerate(picked)])
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\t{d['_id']}\t1\n" for i, d in enumerate(picked)))
    return root


def _file(tmp_path, **over) -> dict:
    spec = {"name": "small", "title": "Small", "dataset": {"beir": str(over.pop("beir"))}, "presets": ["dense", "bm25", "hybrid"],
            "preset_options": {"k": 100}, "measures": ["nDCG@10", "P@1", "R@100", "MRR", "MAP", "F1@10"], "trec": True, **over}
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(spec))
    return spec


def test_an_experiment_gives_the_table_of_its_jobs_run_by_hand_groups_and_checks_references(beir, tmp_path):
    # by hand, as the main job ran its retrieval section before it became jobs/experiments/scifact.yaml
    db = str(tmp_path / "hand" / "lancedb")
    run_index(IndexConfig(corpus=str(beir), db=db, ray=RAY), tmp_path / "hand" / "index", progress=False)
    runs = run_retrieve(RetrieveConfig.preset(("dense", "bm25", "hybrid"), queries=str(beir / "queries.jsonl"), db=db, k=100, trec=True, ray=RAY),
                        tmp_path / "hand" / "retrieve")
    hand = summary_frame(run_evaluate(EvaluateConfig(qrels=str(beir / "qrels" / "test.tsv"), runs=tuple(map(str, runs.values()))),
                                      tmp_path / "hand" / "evaluate"))

    _file(tmp_path, beir=beir, group_by=["template"],
          references=[{"run": "bm25", "measure": "ndcg@10", "value": round(float(hand.loc["bm25", "nDCG@10"]), 4), "tolerance": 0.001,
                       "source": "the same jobs by hand"}], caveats=["A test corpus."])
    res = run_experiment(load(tmp_path / "e.yaml"), tmp_path / "exp", ray=RAY, progress=False)
    assert list(res.summary.index) == list(hand.index) and list(res.summary.columns) == list(hand.columns)
    np.testing.assert_allclose(res.summary.to_numpy(), hand.to_numpy(), rtol=1e-6, atol=1e-9)  # float kernels: same machine, same order
    for rid in runs:
        assert_runs_close(pq.read_table(res.runs[rid]), pq.read_table(runs[rid]), f"{rid}: experiment vs by hand")
        assert (tmp_path / "exp" / "retrieve" / "runs" / f"{rid}.trec").is_file()
    assert res.reproduced and res.checks[0].got == pytest.approx(hand.loc["bm25", "nDCG@10"], abs=1e-9)
    by = res.groups["template"]
    assert set(by.index) == {(r, t) for r in runs for t in "AB"} and set(by["queries"]) == {20}
    per_query = res.metrics.to_pandas()
    a = per_query[(per_query.run_id == "dense") & (per_query.measure == "P@1") & per_query.query_id.isin([f"q{i}" for i in range(0, 40, 2)])]
    assert by.loc[("dense", "A"), "P@1"] == pytest.approx(a.value.mean(), abs=1e-12)
    report = res.report.read_text()
    assert "| bm25 | nDCG@10 |" in report and "reproduced" in report and "By template:" in report and "**A test corpus.**" in report
    assert "- `bm25`: bm25" in report and "- `dense`: dense" in report  # each run's stages

    _file(tmp_path, beir=beir, references=[{"run": "dense", "measure": "nDCG@10", "value": 0.0, "tolerance": 0.01, "source": "wrong"}])
    with pytest.raises(ReferenceMissed, match=r"1 reference figure\(s\) missed: dense nDCG@10 \d\.\d{4} vs 0\.0 ± 0\.01"):
        run_experiment(load(tmp_path / "e.yaml"), tmp_path / "exp", ray=RAY, progress=False)  # a rerun: every job skipped, unchanged
    assert "**missed**" in (tmp_path / "exp" / "experiment.md").read_text()


def test_a_bad_experiment_file_is_one_line_and_the_shipped_ones_load(tmp_path, monkeypatch):
    for path in sorted(EXPERIMENTS.glob("*.yaml")):
        assert load(path) == load(path.stem)  # a shipped file also by its name
    assert len(list(EXPERIMENTS.glob("*.yaml"))) >= 5
    monkeypatch.delenv("NO_SUCH_DIR", raising=False)
    for spec, message in [({"name": "x", "title": "x", "dataset": {"bundled": "scifact"}}, "give pipelines or presets"),
                          ({"name": "x", "title": "x", "dataset": {}, "presets": ["dense"]}, "dataset: give exactly one of bundled, beir"),
                          ({"name": "x", "title": "x", "dataset": {"bundled": "scifact"}, "presets": ["dense"], "measure": ["P@1"]},
                           "measure: Extra inputs are not permitted"),
                          ({"name": "x", "title": "x", "dataset": {"bundled": "scifact"}, "pipelines": {"o": ["orlog"]}},
                           "pipeline 'o', stage 1 \\(orlog\\) reranks a run"),
                          ({"name": "x", "title": "x", "dataset": {"bundled": "scifact"}, "presets": ["bm25"], "measures": ["nDCG@ten"]}, "nDCG@ten"),
                          ({"name": "x", "title": "x", "dataset": {"bundled": "scifact"}, "presets": ["bm25"], "baseline": "dense"},
                           r"not among the pipelines \['bm25'\]: \['dense'\]"),
                          ({"name": "x", "title": "x", "dataset": {"bundled": "scifact"}, "presets": ["bm25"], "pipelines": {"bm25": ["bm25"]}},
                           r"both name \['bm25'\]"),
                          ({"name": "x", "title": "x", "dataset": {"bundled": "scifact"}, "presets": ["bm25"], "embed": {"titel_sep": ". "}},
                           "embed: titel_sep: Extra inputs are not permitted"),
                          ({"name": "x", "title": "x", "dataset": {"bundled": "scifact"}, "presets": ["bm25"], "index": {"corpus": "c"}},
                           r"index: \['corpus'\] come from the dataset"),
                          ({"name": "x", "title": "x", "dataset": {"bundled": "scifact"}, "presets": ["bm25"], "measures": ["P@1"],
                            "references": [{"run": "bm25", "measure": "nDCG@20", "value": 0.5, "tolerance": 0.1, "source": "s"}]},
                           r"references name measure\(s\) not among the measures \['P@1'\]: \['bm25 nDCG@20'\]")]:
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec))
        with pytest.raises(ExperimentError, match=message) as info:
            load(tmp_path / "bad.yaml")
        assert "\n" not in str(info.value)
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({"name": "x", "title": "x", "dataset": {"beir": "${NO_SUCH_DIR}/ulogic"}, "presets": ["bm25"]}))
    res = CliRunner().invoke(app, ["experiment", str(tmp_path / "env.yaml"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and res.output.strip() == "error: dataset path '${NO_SUCH_DIR}/ulogic': an environment variable in it is not set", res.output


def test_the_setlogic_experiment_gives_bench_setlogics_table_by_template(tmp_path, tiny_cfg):
    """jobs/experiments/setlogic.yaml (OrLog with the LLM included) against `bench-setlogic`'s
    job, the same LLM; setlogic-exact.yaml is its LLM-free rows, stage for stage."""
    from jobs.experiment import Experiment
    from jobs.setlogic_bench import run_setlogic_bench
    from schemas.config import EmbedConfig

    # one LLM cache: the experiment's OrLog must ask exactly the prompts the job asked (checked below), and
    # gets the job's P(True) back, so a rank is never decided by two engine runs' rounding
    llm = tiny_cfg.model_copy(update={"cache": str(tmp_path / "llm.sqlite")})
    bench = run_setlogic_bench(tmp_path / "bench", EmbedConfig(), RAY, llm, per_template=3, echo=lambda _: None)["table"]
    spec = yaml.safe_load((EXPERIMENTS / "setlogic.yaml").read_text())
    exact = yaml.safe_load((EXPERIMENTS / "setlogic-exact.yaml").read_text())
    assert exact["pipelines"] == {r: p for r, p in spec["pipelines"].items() if r != "orlog"}
    assert (exact["dataset"], exact["measures"], exact["group_by"]) == (spec["dataset"], spec["measures"], spec["group_by"])
    spec["dataset"]["setlogic"]["per_template"] = 3
    res = run_experiment(Experiment.model_validate(spec), tmp_path / "exp", llm=llm, ray=RAY, progress=False)
    orlog, job = (json.loads((tmp_path / d / "retrieve" / "manifest.json").read_text())["pipelines"]["orlog"]["stages"][-1] for d in ("exp", "bench"))
    assert orlog["llm_cache_hits"] == orlog["forward_passes"] > job["llm_cache_hits"], (job, orlog)  # every prompt asked before
    assert {k: orlog[k] for k in ("pairs", "forward_passes", "prompt_tokens")} == {k: job[k] for k in ("pairs", "forward_passes", "prompt_tokens")}
    grouped = res.groups["template"]
    measures = ["P@1", "R@5", "F1@5", "nDCG@10"]
    from pipelines.generate.setlogic import TEMPLATE_NAMES

    assert {(r, t) for r, t in bench.index if t != "all"} == set(grouped.index) and len(grouped) == 4 * len(TEMPLATE_NAMES)  # dense, bm25, itlr, orlog
    for (run, template), row in grouped.iterrows():
        np.testing.assert_allclose(row[measures].to_numpy(float), bench.loc[(run, template), measures].to_numpy(float), rtol=0, atol=1e-12)
    for run in ("dense", "bm25", "itlr", "orlog"):
        np.testing.assert_allclose(res.summary.loc[run, measures].to_numpy(float), bench.loc[(run, "all"), measures].to_numpy(float), rtol=0, atol=1e-12)


def test_the_lag_experiments_give_bench_lags_oracle_and_llm_rows(tmp_path, tiny_cfg):
    """lag-oracle.yaml gives bench-lag's oracle chain rows on every question, and lag.yaml its
    LLM rows (QA measures and chain recall) on the same sample, with the same LLM."""
    from jobs.lag_bench import run_lag_bench
    from schemas.config import EmbedConfig

    llm = tiny_cfg.model_copy(update={"cache": str(tmp_path / "llm.sqlite")})  # the experiment gets the job's answers back
    bench = run_lag_bench("musique", tmp_path / "bench", EmbedConfig(), RAY, llm, sample=2, seed=3, echo=lambda _: None)
    res = run_experiment(load(EXPERIMENTS / "lag-oracle.yaml"), tmp_path / "exp", ray=RAY, progress=False)
    assert list(res.summary.index) == list(bench["oracle"]) == ["question", "gold-chain", "gold-no-answer", "gold-random-order"]
    for run in res.summary.index:
        assert res.summary.loc[run, "R@100"] == pytest.approx(bench["oracle"][run], abs=1e-12), run
    assert res.reproduced and [c.reference.run for c in res.checks] == ["question", "gold-chain", "gold-no-answer"]

    from jobs.experiment import with_sample

    res = run_experiment(with_sample(load(EXPERIMENTS / "lag.yaml"), 2, 3), tmp_path / "exp-llm", llm=llm, ray=RAY, progress=False)
    table, measures = bench["table"], ["EM", "TokenF1", "Acc", "R@100"]
    assert list(res.summary.index) == list(table.index) == ["rag", "lag", "lag-no-answer", "lag-random-order"]
    np.testing.assert_allclose(res.summary[measures].to_numpy(float), table[measures].to_numpy(float), rtol=0, atol=1e-12)
    scored = pq.read_table(tmp_path / "exp-llm" / "evaluate" / "metrics.parquet").to_pandas()
    assert set(scored.loc[scored["measure"] == "EM", "query_id"]) - {"all"} == set(json.loads(x)["_id"] for x in (tmp_path / "exp-llm" / "sample" / "queries.jsonl").read_text().splitlines())
