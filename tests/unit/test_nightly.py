"""Nightly operations without Ray: the comparison and its regression rule, the history that
never doubles a night, the alert receivers, the config's checks and the CLI's refusals."""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.jobs.nightly import NightlyLock, NightRun, run_nightly
from logicrank.pipelines.config.retrieval import AlertConfig, NightlyConfig
from logicrank.pipelines.evaluation.history import (
    Night,
    Rule,
    compare_nights,
    history_rows,
    merge_history,
    plot_file,
    plot_history,
)
from logicrank.pipelines.evaluation.significance import adjust, paired_p_value
from logicrank.pipelines.operations.alerts import deliver
from logicrank.pipelines.operations.nightly import NightlyError, NightState, claim_night, serve_message
from logicrank.schemas.tables import METRICS

QUERIES = [f"q{i}" for i in range(20)]


def _metrics(values: dict[str, np.ndarray], measure: str = "nDCG@10") -> pa.Table:
    rows = []
    for run_id, v in values.items():
        rows += [{"run_id": run_id, "query_id": q, "measure": measure, "value": float(x)} for q, x in zip(QUERIES, v, strict=True)]
        rows.append({"run_id": run_id, "query_id": "all", "measure": measure, "value": float(np.mean(v))})
    return pa.Table.from_pylist(rows, schema=METRICS)


def _night(date, version, values, hashes=None) -> Night:
    return Night(date, version, {"s": _metrics(values)}, hashes or {("s", r): "h" for r in values})


BASE = np.linspace(0.3, 0.9, 20)
NOISE = np.random.default_rng(0).normal(0, 0.02, 20)


def test_a_significant_drop_past_the_rule_is_a_regression_and_nothing_else_is():
    old = _night("2026-11-20", 5, {"big": BASE, "small": BASE, "noisy": BASE, "up": BASE})
    flip = np.where(np.arange(20) % 2 == 0, 0.1, -0.1)  # mean drop 0.02, but half the queries gain: not significant
    new = _night("2026-11-21", 6, {"big": BASE - 0.2 + NOISE, "small": BASE - 0.005 + NOISE / 10, "noisy": BASE - 0.02 + flip,
                                   "up": BASE + 0.2 + NOISE})
    t = compare_nights(old, new, {"nDCG@10": Rule(0.01)}).to_pandas().set_index("pipeline")
    assert t.loc["big", "regression"] and not t.loc["small", "regression"] and not t.loc["noisy", "regression"]
    assert not t.loc["up", "regression"]  # a gain never is
    assert t.loc["big", "delta"] == pytest.approx(np.mean(NOISE) - 0.2)
    assert t.loc["noisy", "p_adjusted"] > 0.05 and -t.loc["noisy", "delta"] > 0.01
    # the correction runs over the measure's family: Holm over the four pipelines
    raw = [paired_p_value(BASE, v) for v in (BASE - 0.2 + NOISE, BASE - 0.005 + NOISE / 10, BASE - 0.02 + flip, BASE + 0.2 + NOISE)]
    assert t["p_value"].tolist() == pytest.approx(raw)
    assert t["p_adjusted"].tolist() == pytest.approx(list(adjust(raw, "holm")))
    assert (t["old_table_version"].tolist(), t["new_table_version"].tolist()) == ([5] * 4, [6] * 4)
    # without the significance requirement, the noisy drop past 0.01 is a regression too
    loose = compare_nights(old, new, {"nDCG@10": Rule(0.01, significant=False)}).to_pandas().set_index("pipeline")
    assert loose.loc["noisy", "regression"] and not loose.loc["small", "regression"]
    # a measure without a rule is compared, never flagged
    none = compare_nights(old, new, {}).to_pandas()
    assert not none["regression"].any() and none["max_drop"].isna().all() and none["p_value"].notna().all()


def test_the_previous_and_the_baseline_night_are_one_family_per_measure():
    """With a baseline pinned, the correction runs over both references' tests of a measure,
    as over every pipeline's: each comparison alone would halve Bonferroni's factor."""
    baseline = _night("2026-11-19", 4, {"a": BASE})
    previous = _night("2026-11-20", 5, {"a": BASE + NOISE / 2})
    new = _night("2026-11-21", 6, {"a": BASE - 0.02 + NOISE})
    t = compare_nights(previous, new, {"nDCG@10": Rule(0.01)}, baseline, correction="bonferroni").to_pandas().set_index("against")
    raw = [paired_p_value(BASE + NOISE / 2, BASE - 0.02 + NOISE), paired_p_value(BASE, BASE - 0.02 + NOISE)]
    assert t.loc[["previous", "baseline"], "p_value"].tolist() == pytest.approx(raw)
    assert t.loc[["previous", "baseline"], "p_adjusted"].tolist() == pytest.approx(list(adjust(raw, "bonferroni")))
    assert t.loc[["previous", "baseline"], "p_adjusted"].tolist() == pytest.approx([min(1.0, 2 * p) for p in raw])


@pytest.mark.parametrize(("measure", "over"), [("gm_map", lambda v: float(np.exp(np.mean(v)))), ("NumRelRet", np.sum)])
def test_a_comparison_reads_the_value_over_queries_as_the_report_does(measure, over):
    """gm_map's per-query values are logs (its value over queries their geometric mean) and a
    count's value is their sum: the comparison's values and its drop are those, not plain means."""
    logs_old, logs_new = np.log(BASE), np.log(BASE / 2)
    values = (logs_old, logs_new) if measure == "gm_map" else (np.full(20, 3.0), np.full(20, 2.0))
    old = Night("2026-11-20", 5, {"s": _metrics({"a": values[0]}, measure)}, {("s", "a"): "h"})
    new = Night("2026-11-21", 6, {"s": _metrics({"a": values[1]}, measure)}, {("s", "a"): "h"})
    row = compare_nights(old, new, {measure: Rule(0.01, significant=False)}).to_pylist()[0]
    assert row["old_value"] == pytest.approx(over(values[0]), rel=1e-9) and row["new_value"] == pytest.approx(over(values[1]), rel=1e-9)
    assert row["delta"] == pytest.approx(over(values[1]) - over(values[0]), rel=1e-9) and row["regression"]


@pytest.mark.parametrize("measure", ["unj_10", "rbp_resid", "num_nonrel_judged_ret"])
def test_a_measure_where_lower_is_better_regresses_when_it_rises(measure):
    """More unjudged documents in the top 10 (unj_10 up) is the regression, fewer is a gain:
    the rule reads the change for the worse, not a drop."""
    values = {"rises": BASE / 2 + 0.2 + NOISE, "falls": BASE / 2 - 0.1 + NOISE}
    old = Night("2026-11-20", 5, {"s": _metrics({r: BASE / 2 for r in values}, measure)}, {("s", r): "h" for r in values})
    new = Night("2026-11-21", 6, {"s": _metrics(values, measure)}, {("s", r): "h" for r in values})
    t = compare_nights(old, new, {measure: Rule(0.01)}).to_pandas().set_index("pipeline")
    assert t.loc["rises", "delta"] > 0.01 and t.loc["rises", "regression"], t
    assert t.loc["falls", "delta"] < -0.01 and not t.loc["falls", "regression"], t


def test_a_regression_smaller_than_four_decimals_prints_values_that_differ():
    """max_drop 0 and one query 0.0008 lower (the mean 0.00004 lower): its line printed
    "0.5000 -> 0.5000 (-0.0000)"."""
    from logicrank.pipelines.operations.nightly import comparison_lines, regression_reason

    new_values = np.full(20, 0.5)
    new_values[0] -= 0.0008
    old = _night("2026-11-20", 5, {"a": np.full(20, 0.5)})
    t = compare_nights(old, _night("2026-11-21", 6, {"a": new_values}), {"nDCG@10": Rule(0.0, significant=False)})
    (line,) = comparison_lines(t)
    assert "nDCG@10: 0.50000 -> 0.49996 (-0.00004," in line, line
    assert "nDCG@10 0.50000 -> 0.49996 (p " in regression_reason(t.filter(pa.compute.field("regression"))), line


def test_a_changed_pipeline_or_a_new_one_is_not_compared():
    old = _night("2026-11-20", 5, {"a": BASE, "b": BASE}, {("s", "a"): "h1", ("s", "b"): "h1"})
    new = _night("2026-11-21", 6, {"a": BASE - 0.3 + NOISE, "b": BASE - 0.3 + NOISE, "c": BASE}, {("s", "a"): "h1", ("s", "b"): "h2", ("s", "c"): "h1"})
    t = compare_nights(old, new, {"nDCG@10": Rule(0.01)}).to_pandas().set_index("pipeline")
    assert t.loc["a", "regression"]
    assert not t.loc["b", "regression"] and np.isnan(t.loc["b", "delta"]) and "changed since 2026-11-20" in t.loc["b", "note"]
    assert not t.loc["c", "regression"] and "not in the previous night" in t.loc["c", "note"]


def test_a_pipelines_hash_holds_the_content_of_the_files_its_stages_read_and_its_code(tmp_path, monkeypatch):
    """Two nights are compared only where a pipeline's hash is equal: a run (or a decompositions
    file) regenerated at the same path, or its stage's code changed, is another pipeline, never
    a night-to-night change blamed on the corpus (the hash held the path alone, so a
    regenerated file read as a regression, or hid one)."""
    from logicrank.pipelines.operations.nightly import pipeline_hashes
    from logicrank.pipelines.retrieval.stages.base import Stage

    (tmp_path / "q.jsonl").write_text('{"_id": "q1", "text": "a"}\n')
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 3.0 x\n")
    cfg = NightlyConfig(out=str(tmp_path / "out"), index={"corpus": str(tmp_path / "q.jsonl"), "db": str(tmp_path / "db")},
                        query_sets={"s": {"queries": str(tmp_path / "q.jsonl"), "qrels": str(tmp_path / "qrels.tsv")}},
                        pipelines={"fromfile": [{"run_file": {"path": str(run)}}], "bm25": ["bm25"]})
    first = pipeline_hashes(cfg)
    assert pipeline_hashes(cfg) == first
    run.write_text("q1 Q0 d2 1 3.0 x\n")  # the same path, another run
    second = pipeline_hashes(cfg)
    assert second["s/fromfile"] != first["s/fromfile"] and second["s/bm25"] == first["s/bm25"]
    monkeypatch.setattr(Stage, "code", classmethod(lambda cls: "edited"))  # as an edit of the stages' code changes its digest
    assert all(pipeline_hashes(cfg)[k] != second[k] for k in second)


def test_a_pipelines_hash_holds_a_local_encoders_files_and_the_bm25_analyzer(tmp_path, monkeypatch):
    """A fine-tune saved over the encoder's directory (the index job embeds again) or another
    PyStemmer (the BM25 index is rebuilt) scores the same corpus otherwise: another pipeline,
    not a night-to-night change blamed on the corpus (the hash held the encoder's path alone,
    and no analyzer). Each changes only the pipelines that read it."""
    from logicrank.pipelines.engines.bm25 import analyzer
    from logicrank.pipelines.operations.nightly import pipeline_hashes

    (tmp_path / "q.jsonl").write_text('{"_id": "q1", "text": "a"}\n')
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    model = tmp_path / "encoder"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert"}')
    (model / "model.safetensors").write_bytes(b"weights 1")
    cfg = NightlyConfig(out=str(tmp_path / "out"), index={"corpus": str(tmp_path / "q.jsonl"), "db": str(tmp_path / "db"), "embed": {"model": str(model)}},
                        query_sets={"s": {"queries": str(tmp_path / "q.jsonl"), "qrels": str(tmp_path / "qrels.tsv")}},
                        pipelines={"dense": ["dense"], "bm25": ["bm25"]})
    first = pipeline_hashes(cfg)
    (model / "model.safetensors").write_bytes(b"weights 2")  # saved over: the same path, other weights
    second = pipeline_hashes(cfg)
    assert second["s/dense"] != first["s/dense"] and second["s/bm25"] == first["s/bm25"]
    monkeypatch.setattr(analyzer, "analyzer_digest", lambda: "another PyStemmer")
    third = pipeline_hashes(cfg)
    assert third["s/bm25"] != second["s/bm25"] and third["s/dense"] == second["s/dense"]


def test_the_history_replaces_a_night_written_twice():
    n1 = _night("2026-11-20", 5, {"a": BASE})
    n2 = _night("2026-11-21", 6, {"a": BASE - 0.3 + NOISE})
    comparisons = compare_nights(n1, n2, {"nDCG@10": Rule(0.01)})
    h = merge_history(None, history_rows(n1, "nightly-2026-11-20", None))
    h = merge_history(h, history_rows(n2, "nightly-2026-11-21", comparisons))
    again = merge_history(h, history_rows(n2, "nightly-2026-11-21", comparisons))
    assert again.equals(h) and h.num_rows == 2
    rows = h.to_pylist()
    assert [r["date"] for r in rows] == ["2026-11-20", "2026-11-21"] and [r["regression"] for r in rows] == [False, True]
    assert rows[1]["value"] == pytest.approx(np.mean(BASE - 0.3 + NOISE)) and rows[1]["queries"] == 20 and rows[1]["table_version"] == 6
    earlier = merge_history(h, history_rows(_night("2026-11-19", 4, {"a": BASE}), "nightly-2026-11-19", None))
    assert earlier.column("date").to_pylist() == ["2026-11-19", "2026-11-20", "2026-11-21"]
    with pytest.raises(ValueError, match="one night at a time"):
        merge_history(h, pa.concat_tables([history_rows(n1, "t", None), history_rows(n2, "t", None)]))


def test_the_plot_marks_regressions(tmp_path):
    n1, n2 = _night("2026-11-20", 5, {"a": BASE}), _night("2026-11-21", 6, {"a": BASE - 0.3 + NOISE})
    h = merge_history(merge_history(None, history_rows(n1, "t1", None)),
                      history_rows(n2, "t2", compare_nights(n1, n2, {"nDCG@10": Rule(0.01)})))
    path = plot_history(h, "nDCG@10", tmp_path / plot_file("nDCG@10"))
    assert path.name == "nDCG_10.png" and path.stat().st_size > 5_000


def test_the_nightly_report_states_each_runs_depth_as_evaluate_recorded_it(tmp_path):
    import re

    from logicrank.pipelines.operations.nightly import history_markdown, night_depths
    from logicrank.schemas.tables import NIGHTLY_COMPARISONS

    cfg = NightlyConfig.model_validate(_config(tmp_path, measures=["nDCG@10"], pipelines={"bm25": [{"stage": "bm25", "k": 10}],
                                                                                          "dense": [{"stage": "dense", "k": 10}]}))
    root, day = tmp_path / "nightly", "2026-11-21"
    evaluated = root / "nights" / day / "sets" / "s" / "evaluate"
    evaluated.mkdir(parents=True)
    (evaluated / "manifest.json").write_text(json.dumps({"depths": {"bm25": 10, "dense": 7}}))  # (dense: a query set with 7 documents)
    h = merge_history(None, history_rows(_night(day, 6, {"bm25": BASE, "dense": BASE}), "nightly-2026-11-21", None))
    plot = plot_history(h, "nDCG@10", root / "plots" / plot_file("nDCG@10"))
    depths = night_depths(root, day, cfg.query_sets)
    assert depths == {"s": {"bm25": 10, "dense": 7}}
    text = history_markdown(cfg, h, NIGHTLY_COMPARISONS.empty_table(), day, [plot], root, depths)
    assert re.search(r"^\| query set +\| pipeline +\| +depth \|$", text, re.M), text
    assert re.search(r"^\| s +\| bm25 +\| +10 \|$", text, re.M) and re.search(r"^\| s +\| dense +\| +7 \|$", text, re.M), text
    assert "depth: the most documents the run holds for a query" in text


def test_nightly_at_prints_each_runs_depth(tmp_path, monkeypatch):
    import re

    import yaml

    from logicrank.jobs import nightly

    def run_at(cfg, version, echo=None, progress=False):  # the evaluations run_at writes, without Ray
        evaluated = tmp_path / "nightly" / "at" / version / "sets" / "s" / "evaluate"
        evaluated.mkdir(parents=True)
        (evaluated / "manifest.json").write_text(json.dumps({"depths": {"bm25": 10}}))
        return {"s": _metrics({"bm25": BASE})}

    monkeypatch.setattr(nightly, "run_at", run_at)
    path = tmp_path / "n.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path)))
    res = CliRunner().invoke(app, ["nightly", str(path), "--at", "nightly-2026-11-21"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0] == "s at table version nightly-2026-11-21:"
    assert re.search(r"^measure +depth +nDCG@10$", res.stdout, re.M) and re.search(r"^bm25 +10 +0\.6000$", res.stdout, re.M), res.stdout


def test_nightly_at_a_tag_reads_one_version_for_every_query_set(tmp_path, monkeypatch):
    """`nightly --at served` resolved the tag once per query set: a night (or an index run)
    moving it between two sets had them read two versions, presented as one. Resolved once."""
    import contextlib

    import numpy as np
    import pyarrow as pa

    from logicrank.jobs import evaluate, raysession, retrieve
    from logicrank.jobs.nightly import run_at
    from logicrank.pipelines.engines.embed import to_fixed_size_list
    from logicrank.pipelines.engines.store import DocStore

    store = DocStore(str(tmp_path / "db"))
    store.open_or_create(4, "gen")
    rows = lambda ids: pa.table({"doc_id": ids, "title": [None] * len(ids), "text": ["t"] * len(ids), "metadata": [None] * len(ids),  # noqa: E731
                                 "content_hash": ids, "vector": to_fixed_size_list(np.ones((len(ids), 4), np.float32))})
    store.upsert(rows(["d1"]))
    store.tag("served")
    first = store.version
    store.upsert(rows(["d2"]))
    cfg = NightlyConfig.model_validate(_config(tmp_path, query_sets={n: {"queries": str(tmp_path / "q.jsonl"), "qrels": str(tmp_path / "qrels.tsv")}
                                                                     for n in ("a", "b")}))
    asked = []

    def fake_retrieve(rc, out, **kw):
        asked.append(rc.table_version)
        DocStore(str(tmp_path / "db")).tag("served", store.version)  # the night moves the tag meanwhile
        return {"bm25": out / "bm25.parquet"}

    monkeypatch.setattr(retrieve, "run_retrieve", fake_retrieve)
    monkeypatch.setattr(evaluate, "run_evaluate", lambda *a, **kw: None)
    monkeypatch.setattr(raysession, "ray_session", lambda *a, **kw: contextlib.nullcontext())
    run_at(cfg, "served")
    assert asked == [first, first]


class _Recorder(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802
        type(self).bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_receivers_get_the_alert_json_and_failures_are_reported_not_raised(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sink = tmp_path / "alert.json"
        script = f"import sys, pathlib; pathlib.Path({str(sink)!r}).write_bytes(sys.stdin.buffer.read())"
        cfg = AlertConfig(webhook=f"http://127.0.0.1:{server.server_port}/hook", command=(sys.executable, "-c", script))
        alert = {"date": "2026-11-21", "status": "regression", "regressions": [{"measure": "nDCG@10", "old_value": 0.7}]}
        assert deliver(alert, cfg) == {"webhook": "ok: HTTP 200", "command": "ok: exit 0"}
        assert _Recorder.bodies == [alert] and json.loads(sink.read_text()) == alert
        assert deliver(alert, cfg, skip=frozenset({"webhook", "command"})) == {}
        assert len(_Recorder.bodies) == 1
    finally:
        server.shutdown()
        server.server_close()  # refused from here: the failure below comes at once, not at a timeout
    closed = AlertConfig(webhook=f"http://127.0.0.1:{server.server_port}/hook", command=(sys.executable, "-c", "import sys; sys.exit(5)"))
    results = deliver({"status": "regression"}, closed)
    assert results["webhook"].startswith("failed: ") and results["command"].startswith("failed: ") and "exited 5" in results["command"]


def _config(tmp_path, **over) -> dict:
    (tmp_path / "q.jsonl").write_text('{"_id": "1", "text": "x"}\n')
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n")
    base = {"out": str(tmp_path / "nightly"), "index": {"corpus": str(tmp_path / "corpus.jsonl"), "db": str(tmp_path / "db")},
            "query_sets": {"s": {"queries": str(tmp_path / "q.jsonl"), "qrels": str(tmp_path / "qrels.tsv")}},
            "pipelines": {"bm25": [{"stage": "bm25", "k": 10}]}}
    return base | over


@pytest.mark.parametrize(("over", "message"), [
    ({"regressions": {"MAP": {}}}, "not among the measures"),
    ({"measures": ["nDCG@10", "Bogus@3"]}, "Bogus@3"),
    ({"query_sets": {"a b": {"queries": "q", "qrels": "r"}}}, "directory names"),
    ({"baseline": "2026-13-01"}, "not a date YYYY-MM-DD"),
    ({"served_tag": "nightly-x"}, "served_tag"),
    ({"alert": {"webhook": "ftp://x"}}, r"not an http\(s\) URL"),
    ({"pipelines": {"p": [{"stage": "orlog", "k": 5}]}}, "pipeline 'p'"),
])
def test_bad_configs_are_refused_with_the_reason(tmp_path, over, message):
    with pytest.raises(ValidationError, match=message):
        NightlyConfig.model_validate(_config(tmp_path, **over))


def test_regression_rules_take_any_spelling_of_a_measure(tmp_path):
    cfg = NightlyConfig.model_validate(_config(tmp_path, measures=["ndcg@10", "p@1"], regressions={"NDCG@10": {"max_drop": 0.02}}))
    assert cfg.measures == ("nDCG@10", "P@1") and set(cfg.regressions) == {"nDCG@10"}
    # two spellings of one measure: the last one's rule was kept, which of the two decided by the keys' order
    with pytest.raises(ValueError, match=r"regressions name measure nDCG@10 twice \('nDCG@10' and 'ndcg_cut_10'\)"):
        NightlyConfig.model_validate(_config(tmp_path, measures=["ndcg@10"], regressions={"nDCG@10": {"max_drop": 0.01},
                                                                                        "ndcg_cut_10": {"max_drop": 0.5}}))
    import datetime

    assert NightlyConfig.model_validate(_config(tmp_path, baseline=datetime.date(2026, 11, 20))).baseline == "2026-11-20"  # unquoted in YAML
    # placement and receivers do not change what a night means; the pipelines do
    same = cfg.model_copy(update={"alert": AlertConfig(webhook="http://127.0.0.1:1/x"), "keep_nightly_tags": 3})
    assert same.night_digest() == cfg.night_digest()
    other = NightlyConfig.model_validate(_config(tmp_path, pipelines={"bm25": [{"stage": "bm25", "k": 20}]}))
    assert other.night_digest() != cfg.night_digest()


def _state(cfg: NightlyConfig, day: str, steps: dict, config_hash: str | None = None) -> None:
    night = cfg.out + f"/nights/{day}"
    import pathlib

    pathlib.Path(night).mkdir(parents=True, exist_ok=True)
    pathlib.Path(night, "state.json").write_text(json.dumps({"config_hash": config_hash or cfg.night_digest(), "steps": steps}))


def test_nights_run_in_order_keep_their_config_and_one_at_a_time(tmp_path):
    cfg = NightlyConfig.model_validate(_config(tmp_path))
    _state(cfg, "2026-11-21", {"index": {"version": 3}})
    with pytest.raises(NightlyError, match="night 2026-11-21 already ran; nights run in date order"):
        run_nightly(cfg, "2026-11-20")
    with pytest.raises(NightlyError, match="finished its evaluate step with another config"):
        _state(cfg, "2026-11-22", {"index": {"version": 4}, "evaluate": {"version": 4}}, config_hash="another")
        run_nightly(cfg, "2026-11-22")
    # before the evaluation only the index section is pinned: corrected pipelines may finish the night
    other = NightlyConfig.model_validate(_config(tmp_path, pipelines={"bm25": [{"stage": "bm25", "k": 20}]}))
    state = NightState(tmp_path / "nightly" / "nights" / "2026-11-22")
    state.data["steps"].pop("evaluate")
    claim_night(other, tmp_path / "nightly", "2026-11-22", state)
    assert state.data["config_hash"] == other.night_digest()
    moved = NightlyConfig.model_validate(_config(tmp_path, index={"corpus": "elsewhere", "db": str(tmp_path / "db")}))
    with pytest.raises(NightlyError, match="finished its index step with another index section"):
        claim_night(moved, tmp_path / "nightly", "2026-11-22", state)
    with NightlyLock(tmp_path / "nightly"), pytest.raises(NightlyError, match="in use by another nightly run"):
        run_nightly(cfg, "2026-11-23")
    with pytest.raises(NightlyError, match="not a date"):
        run_nightly(cfg, "23-11-2026")
    with pytest.raises(NightlyError, match="baseline night 2026-11-01 is not in"):  # no history yet
        run_nightly(cfg.model_copy(update={"baseline": "2026-11-01"}), "2026-11-23")
    pq.write_table(pa.table({"date": ["2026-11-21"]}), tmp_path / "nightly" / "history.parquet")
    with pytest.raises(NightlyError, match="baseline night 2026-11-01 is not in"):
        run_nightly(cfg.model_copy(update={"baseline": "2026-11-01"}), "2026-11-23")


def test_cli_refusals_are_one_line_exit_2(tmp_path):
    import yaml

    runner = CliRunner()
    result = runner.invoke(app, ["nightly", str(tmp_path / "absent.yaml")])
    assert result.exit_code == 2 and "No such file" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("out: [unclosed\n")
    assert "not valid YAML" in runner.invoke(app, ["nightly", str(bad)]).output
    missing = tmp_path / "missing.yaml"
    missing.write_text(yaml.safe_dump(_config(tmp_path, query_sets={"s": {"queries": str(tmp_path / "nope.jsonl"), "qrels": "x"}})))
    result = runner.invoke(app, ["nightly", str(missing)])
    assert result.exit_code == 2 and "query set 's': no queries at" in result.output
    both = runner.invoke(app, ["nightly", str(missing), "--at", "nightly-2026-11-20", "--date", "2026-11-21"])
    assert both.exit_code == 2 and "give one of them" in both.output
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump(_config(tmp_path, extra_field=1)))
    result = runner.invoke(app, ["nightly", str(unknown)])
    assert result.exit_code == 2 and f"config {unknown}: extra_field 1: no such option; options: out, index, query_sets" in result.output
    deep = tmp_path / "deep.yaml"
    deep.write_text(yaml.safe_dump(_config(tmp_path, index={"corpus": "c", "db": "d", "embed": {"batch_size": 0}})))
    assert "index.embed.batch_size 0: must be greater than or equal to 1" in runner.invoke(app, ["nightly", str(deep)]).output
    # --ray-address over an ``index:`` left empty, or ``ray: null``: the config's own refusal (before: a traceback)
    for name, index in (("empty", None), ("ray-null", {"corpus": "c", "db": str(tmp_path / "db"), "ray": None, "embed": {"batch_size": 0}})):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(_config(tmp_path, index=index)))
        result = runner.invoke(app, ["nightly", str(path), "--ray-address", "auto"])
        assert result.exit_code == 2 and result.stderr.count("\n") == 1 and f"config {path}: index." in result.stderr, result.output


def _serving_night(tmp_path, regressed: bool, **over):
    """A night at its serve step: the table's v1 served, tonight's v2 indexed, and tonight's
    comparison with night 1 (v1) written, a regression or not."""
    import lancedb

    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = NightlyConfig.model_validate(_config(tmp_path, **over))
    table = lancedb.connect(cfg.index.db).create_table(cfg.index.table, data=pa.table({"doc_id": ["a"]}))
    table.add(pa.table({"doc_id": ["b"]}))
    table.tags.create(cfg.served_tag, 1)
    n1, n2 = _night("2026-11-20", 1, {"dense": BASE}), _night("2026-11-21", 2, {"dense": BASE - (0.2 if regressed else 0) + NOISE})
    root = tmp_path / "nightly"
    (root / "nights" / "2026-11-21").mkdir(parents=True)
    pq.write_table(history_rows(n1, "nightly-2026-11-20", None), root / "history.parquet")
    comparisons = compare_nights(n1, n2, {"nDCG@10": Rule(0.01)})
    pq.write_table(comparisons, root / "nights" / "2026-11-21" / "comparisons.parquet")
    state = NightState(root / "nights" / "2026-11-21")
    state.record("index", {"version": 2, "tag": "nightly-2026-11-21"})
    lines: list[str] = []
    night = NightRun(cfg, root, "2026-11-21", state, lines.append, False)
    return night, table, comparisons, lines


def test_a_regression_holds_the_served_tag_on_the_last_good_version_and_the_alert_says_so(tmp_path):
    night, table, comparisons, lines = _serving_night(tmp_path, regressed=True)
    night._serve()
    assert table.tags.get_version("served") == 1  # before: moved to v2, the regressed version
    served = night.state.done("serve")
    assert served["held"] and (served["version"], served["tonight"], served["last_good_night"]) == (1, 2, "2026-11-20")
    assert served["reason"].startswith("1 regression(s): dense / s nDCG@10")
    assert lines[-1].startswith("nightly 2026-11-21: serve: HELD: tag 'served' stays on v1 (the last good version, night 2026-11-20); "
                                "tonight's v2 is not served: 1 regression(s): dense / s nDCG@10 0.6000 -> 0.")
    # the rerun of a held night skips the step: its record is final
    assert NightState(night.night).done("serve") == served
    alert, _ = night._alert("regression", 3, regressions=comparisons.filter(comparisons.column("regression")), served=served,
                            message=serve_message(served))
    doc = json.loads(alert.read_text())
    assert (doc["status"], doc["exit_code"]) == ("regression", 3)
    assert doc["served"]["held"] and doc["served"]["version"] == 1 and doc["served"]["tonight"] == 2
    assert "was held on v1 (the last good version, night 2026-11-20)" in doc["message"]
    md = (night.night / "alert.md").read_text()
    assert "was held on v1" in md and "- served tag `served`: **held on v1** (the last good version; tonight's v2 is not served)" in md


def test_promote_on_regression_moves_the_tag_as_before_and_a_clean_night_moves_it(tmp_path):
    night, table, _, lines = _serving_night(tmp_path / "promote", regressed=True, promote_on_regression=True)
    night._serve()
    assert table.tags.get_version("served") == 2
    assert night.state.done("serve") == {"tag": "served", "version": 2, "held": False, "tonight": 2, "promoted_on_regression": True}
    assert lines[-1].endswith("serve: tag 'served' now v2 (promote_on_regression: moved despite the regression)")
    clean, table, _, lines = _serving_night(tmp_path / "clean", regressed=False)
    clean._serve()
    assert table.tags.get_version("served") == 2 and not clean.state.done("serve")["held"]
    assert lines[-1] == "nightly 2026-11-21: serve: tag 'served' now v2"
    # the option does not change what a night's numbers are: a rerun may flip it
    cfg = NightlyConfig.model_validate(_config(tmp_path))
    assert cfg.model_copy(update={"promote_on_regression": True}).night_digest() == cfg.night_digest()


def test_the_cli_option_overrides_the_config_file(tmp_path, monkeypatch):
    import yaml

    from logicrank.jobs import nightly

    seen = []
    monkeypatch.setattr(nightly, "run_nightly", lambda cfg, *a, **k: seen.append(cfg.promote_on_regression) or (_ for _ in ()).throw(
        NightlyError("stop here")))
    path = tmp_path / "n.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path, promote_on_regression=True)))
    runner = CliRunner()
    for args in ([], ["--hold-on-regression"], ["--promote-on-regression"]):
        assert runner.invoke(app, ["nightly", str(path), *args]).exit_code == 2
    path.write_text(yaml.safe_dump(_config(tmp_path)))
    assert runner.invoke(app, ["nightly", str(path)]).exit_code == 2
    assert seen == [True, False, True, False]


@pytest.mark.parametrize("kept", [1, 2])
def test_a_held_night_whose_version_is_served_by_hand_is_the_next_nights_reference(tmp_path, kept):
    """Night 21 was held on an accepted drop, the tag kept on v1; the operator moved the served
    tag to its v2 by hand (docs/operations.md). Night 22, at night 21's level, is compared with
    night 21: no regression, and the tag moves on to v3 (before: compared with night 20 again,
    alerted and held, every night). A night held with the tag on its own version (a snapshot
    that changed nothing, ``kept`` 2) was not served by hand: it stays held."""
    import lancedb

    cfg = NightlyConfig.model_validate(_config(tmp_path))
    table = lancedb.connect(cfg.index.db).create_table(cfg.index.table, data=pa.table({"doc_id": ["a"]}))
    table.add(pa.table({"doc_id": ["b"]}))
    table.add(pa.table({"doc_id": ["c"]}))
    table.tags.create(cfg.served_tag, 2)  # moved by hand to the held night's version
    root, history = tmp_path / "nightly", None
    for day, version, values, serve in [("2026-11-20", 1, BASE, {"version": 1, "held": False}),
                                        ("2026-11-21", 2, BASE - 0.1, {"version": kept, "held": True}),
                                        ("2026-11-22", 3, BASE - 0.1 + NOISE / 10, None)]:
        night = _night(day, version, {"bm25": values})
        (root / "nights" / day / "sets" / "s" / "evaluate").mkdir(parents=True)
        pq.write_table(night.metrics["s"], root / "nights" / day / "sets" / "s" / "evaluate" / "metrics.parquet")
        state = NightState(root / "nights" / day)
        state.record("index", {"version": version, "tag": f"nightly-{day}"})
        state.record("evaluate", {"version": version, "hashes": {"s/bm25": "h"}})
        if serve:
            state.record("serve", {"tag": "served", "tonight": version, **serve})
            history = merge_history(history, history_rows(night, f"nightly-{day}", None))
    pq.write_table(history, root / "history.parquet")
    lines: list[str] = []
    tonight = NightRun(cfg, root, "2026-11-22", state, lines.append, False)
    tonight._compare()
    if kept == 2:
        assert state.done("compare")["previous"] == "2026-11-20" and state.done("compare")["regressions"] == 1, lines
        return
    assert state.done("compare")["previous"] == "2026-11-21" and state.done("compare")["regressions"] == 0, lines
    tonight._serve()
    assert table.tags.get_version("served") == 3 and not state.done("serve")["held"]


def test_a_pipeline_changed_on_a_held_night_is_compared_with_that_night_until_one_is_served(tmp_path):
    """Night 21 was held on pipeline a's regression; pipeline b changed that night (another
    hash: not compared, "the new reference"). A held night is never served, so night 22 was
    compared with night 20 alone, which ran b otherwise: b's drop on night 22 went unseen, and
    the first night a recovered, b's drop was served (a helper's audit). b is compared with the
    first night that ran it as tonight does, night 21."""
    import lancedb

    cfg = NightlyConfig.model_validate(_config(tmp_path))
    table = lancedb.connect(cfg.index.db).create_table(cfg.index.table, data=pa.table({"doc_id": ["a"]}))
    table.add(pa.table({"doc_id": ["b"]}))
    table.tags.create(cfg.served_tag, 1)  # held on night 20's version
    root, history = tmp_path / "nightly", None
    for day, version, values, hashes, serve in [
            ("2026-11-20", 1, {"a": BASE, "b": BASE}, {"a": "h", "b": "h1"}, {"version": 1, "held": False}),
            ("2026-11-21", 2, {"a": BASE - 0.1, "b": BASE}, {"a": "h", "b": "h2"}, {"version": 1, "held": True}),
            ("2026-11-22", 2, {"a": BASE - 0.1, "b": BASE - 0.3 + NOISE}, {"a": "h", "b": "h2"}, None)]:
        night = _night(day, version, values, {("s", p): h for p, h in hashes.items()})
        (root / "nights" / day / "sets" / "s" / "evaluate").mkdir(parents=True)
        pq.write_table(night.metrics["s"], root / "nights" / day / "sets" / "s" / "evaluate" / "metrics.parquet")
        state = NightState(root / "nights" / day)
        state.record("index", {"version": version, "tag": f"nightly-{day}"})
        state.record("evaluate", {"version": version, "hashes": {f"s/{p}": h for p, h in hashes.items()}})
        if serve:
            state.record("serve", {"tag": "served", "tonight": version, **serve})
            history = merge_history(history, history_rows(night, f"nightly-{day}", None))
    pq.write_table(history, root / "history.parquet")
    lines: list[str] = []
    NightRun(cfg, root, "2026-11-22", state, lines.append, False)._compare()
    assert state.done("compare")["previous"] == "2026-11-20" and state.done("compare")["regressions"] == 2, lines
    rows = pq.read_table(root / "nights" / "2026-11-22" / "comparisons.parquet").to_pandas().set_index("pipeline")
    assert rows.loc["a", "old_date"] == "2026-11-20" and rows.loc["a", "regression"]
    assert rows.loc["b", "old_date"] == "2026-11-21" and rows.loc["b", "regression"] and "held since" in rows.loc["b", "note"]


def test_a_failed_night_over_a_corrupt_history_still_alerts_its_receivers(tmp_path):
    """The history unreadable (a truncated file: the night fails at compare) was filed as the
    alert's ``compared_with``, whose rendering then raised before any receiver was called: the
    failed night that most needs an alert sent none. It goes out, and says why it compares with
    no night."""
    import types

    from logicrank.pipelines.operations.nightly import NightBook

    root, day = tmp_path / "nightly", "2026-01-02"
    night = root / "nights" / day
    night.mkdir(parents=True)
    (root / "history.parquet").write_bytes(b"not a parquet file")
    sink = tmp_path / "received.json"
    script = f"import sys, pathlib; pathlib.Path({str(sink)!r}).write_bytes(sys.stdin.buffer.read())"
    cfg = types.SimpleNamespace(index=types.SimpleNamespace(db="db", table="t"), alert=AlertConfig(command=(sys.executable, "-c", script)))
    book = NightBook(cfg, root, day, NightState(night), lambda m: None, False)
    path, receivers = book._alert("failed", 1, step="compare", message="ArrowInvalid: history.parquet", served={"tag": "served", "version": 2})
    assert receivers == {"command": "ok: exit 0"}
    sent = json.loads(sink.read_text())
    assert sent["status"] == "failed" and sent["compared_with"] == {} and sent["history_error"].startswith("the history could not be read: ")
    assert "- the history could not be read: " in (night / "alert.md").read_text()


def test_a_measure_added_since_the_reference_night_is_named_as_not_evaluated_then():
    """A measure added to the config tonight: the previous night has no value of it, which the
    note called "no query in common"."""
    old = _night("2026-11-20", 5, {"a": BASE})
    new = Night("2026-11-21", 6, {"s": pa.concat_tables([_metrics({"a": BASE}), _metrics({"a": BASE}, "R@100")])}, {("s", "a"): "h"})
    rows = {r["measure"]: r for r in compare_nights(old, new, {"nDCG@10": Rule(0.01)}).to_pylist()}
    assert rows["R@100"]["note"] == "R@100 was not evaluated on 2026-11-20: not compared" and rows["R@100"]["delta"] is None
    assert rows["nDCG@10"]["note"] == "" and rows["nDCG@10"]["delta"] == pytest.approx(0.0, abs=1e-12)


def test_a_night_with_nothing_compared_does_not_say_no_regression():
    """Every pair changed since the last night (a new encoder, a qrels edit): the terminal said
    "compare: no regression (0 comparison(s) ...)", read as a checked night. It says nothing
    was compared; a night with some pairs compared says how many were not."""
    from logicrank.pipelines.operations.nightly import comparison_lines
    from logicrank.schemas.tables import NIGHTLY_COMPARISONS

    def row(delta, note=""):
        return {"query_set": "test", "pipeline": "bm25", "measure": "nDCG@10", "against": "previous", "old_date": "2026-11-20",
                "new_date": "2026-11-21", "old_table_version": 2, "new_table_version": 3, "old_value": None if delta is None else 0.5,
                "new_value": None if delta is None else 0.5 + delta, "delta": delta, "queries": 10, "p_value": None, "p_adjusted": None,
                "max_drop": 0.02, "regression": False, "note": note}

    changed = pa.Table.from_pylist([row(None, "pipeline, encoder, LLM or query set changed since 2026-11-20: not compared")] * 2,
                                   schema=NIGHTLY_COMPARISONS)
    assert comparison_lines(changed) == ["compare: nothing compared with 2026-11-20: each pipeline and query set changed since, or is "
                                         "new (2 comparison(s) not made; report.md's notes say why); this night is their new reference"]
    some = pa.Table.from_pylist([row(0.01), row(None, "changed")], schema=NIGHTLY_COMPARISONS)
    assert comparison_lines(some) == ["compare: no regression (1 comparison(s) with 2026-11-20; 1 not compared, report.md's "
                                      "notes say why)"]
    assert comparison_lines(pa.Table.from_pylist([row(0.01)], schema=NIGHTLY_COMPARISONS)) == [
        "compare: no regression (1 comparison(s) with 2026-11-20)"]


def test_time_travel_says_which_pipelines_ran_otherwise_on_the_night_it_names():
    """`nightly --at nightly-D` runs today's config on night D's table: a pipeline whose config
    changed since gives other numbers than night D's history, said in one line each (before:
    nothing said, and a bisect blamed the corpus)."""
    from logicrank.pipelines.operations.nightly import at_config_notes
    from logicrank.schemas.tables import NIGHTLY_HISTORY

    def row(day, version, pipeline, digest):
        return {"date": day, "table_version": version, "tag": f"nightly-{day}", "query_set": "judged", "pipeline": pipeline,
                "measure": "nDCG@10", "value": 0.5, "queries": 10, "config_hash": digest, "regression": False}

    history = pa.Table.from_pylist([row("2026-11-20", 4, "bm25", "a"), row("2026-11-20", 4, "dense", "b"),
                                    row("2026-11-21", 7, "dense", "c")], schema=NIGHTLY_HISTORY)
    today = {"judged/bm25": "a", "judged/dense": "c", "judged/hybrid": "z"}
    assert at_config_notes(today, history, "nightly-2026-11-20") == [
        "nightly --at nightly-2026-11-20: judged/dense ran otherwise on night 2026-11-20 (its pipeline, encoder, LLM, queries or qrels "
        "changed since): its numbers here are today's config on that table, not that night's"]
    assert at_config_notes(today, history, "7") == [] and at_config_notes(today, None, "4") == []
    assert len(at_config_notes({"judged/dense": "c"}, history, "4")) == 1  # by table version too
