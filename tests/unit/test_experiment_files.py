"""The experiment files that ship (jobs/experiments/) load and validate, and a sample from
the command line (`logicrank experiment FILE --sample N`) replaces the file's own."""

from __future__ import annotations

import re

import pytest

from logicrank.pipelines.config.settings import EmbedConfig
from logicrank.pipelines.evaluation.experiment import EXPERIMENTS, ExperimentError, load, override, with_encoder, with_sample


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_file_loads(path):
    exp = load(path)
    assert exp.name == path.stem  # the name a report and `logicrank experiment NAME` use


def test_a_sample_replaces_the_files_and_drops_its_references():
    exp = load("rulebench-siar")
    assert exp.references and exp.dataset.sample is None
    got = with_sample(exp, 25, 1)
    assert (got.dataset.sample, got.dataset.seed, got.dataset.rulebench) == (25, 1, exp.dataset.rulebench)
    assert got.references == () and "not checked on this run" in got.caveats[-1]
    assert got.pipelines == exp.pipelines and got.measures == exp.measures
    assert with_sample(exp, None, None) == exp  # nothing given: the file as it is
    with pytest.raises(ExperimentError, match="greater than or equal to 1"):
        with_sample(exp, 0, None)


def test_qa_measures_are_checked_before_any_work():
    from logicrank.pipelines.evaluation.experiment import Experiment

    lag = load("lag").model_dump(exclude_none=True)
    ok = Experiment.model_validate(lag | {"references": [{"run": "lag", "measure": "em", "value": 0.1, "tolerance": 0.1, "source": "x"}]})
    assert ok.references[0].measure == "em"  # a QA measure may carry a reference
    cases = {
        "unknown QA measure(s) 'Exact'": lag | {"qa_measures": ["Exact"]},
        "qa_measures need gold answers": lag | {"dataset": {"bundled": "scifact"}},
        "gold is only read for qa_measures": lag | {"qa_measures": [], "gold": "answers.jsonl"},
        "not among the measures": lag | {"references": [{"run": "lag", "measure": "Judge", "value": 0.1, "tolerance": 0.1, "source": "x"}]},
    }
    for why, spec in cases.items():
        with pytest.raises(ValueError, match=re.escape(why)):
            Experiment.model_validate(spec)


def test_override_sets_stage_options_by_name_and_drops_only_the_references_it_moves():
    exp = load("lag-oracle")
    got = override(exp, {"question/cut.times": 3})
    assert got.set == {"question/cut.times": 3} and got.pipelines == exp.pipelines  # the file's pipelines, as written
    run = got.pipelines_to_run()
    assert run["question"][1].times == 3 and exp.pipelines_to_run()["question"][1].times == 5
    assert run["gold-chain"] == exp.pipelines_to_run()["gold-chain"]
    assert [r.run for r in got.references] == ["gold-chain", "gold-no-answer"]  # the question row moved
    assert "1 of the file's references" in got.caveats[-1]
    indexed = override(exp, {"index.ann_threshold": 1000})
    assert indexed.index == {"ann_threshold": 1000} and indexed.references == ()  # another index: every figure may move
    assert override(exp, {"pipelines": {"gold-chain": exp.pipelines["gold-chain"]}, "baseline": None, "references": []}).pipelines.keys() == {"gold-chain"}
    assert override(exp, {}) == exp
    assert override(exp, ["question/cut.times=3"]) == got  # --set items, read as YAML
    # what every figure is measured on: the rows measured (BEIR's rule for a query's own id), the QA measures' gold answers
    assert override(exp, {"qa_measures": ["EM"]}).references == exp.references
    for changed in ({"ignore_identical_ids": True}, {"qa_measures": ["EM"], "gold": "other-answers.jsonl"}):
        moved = override(exp, changed)
        assert moved.references == () and "not checked on this run" in moved.caveats[-1], changed


def test_a_stage_key_for_every_run_beats_the_files_key_for_one_run():
    """`--set cut.times=2` over a file whose `set:` holds `question/cut.times: 3`: the file's
    run-scoped key won (RUN/STAGE.OPTION wins whatever the order), so the command line was
    silently ignored for that run. The command line beats the file."""
    exp = override(load("lag-oracle"), {"question/cut.times": 3})
    got = override(exp, ["cut.times=2"])
    assert got.set == {"cut.times": 2}
    assert all(o.times == 2 for stages in got.pipelines_to_run().values() for o in stages if o.stage == "cut")
    assert override(exp, ["question/cut.times=5"]).set == {"question/cut.times": 5}


@pytest.mark.parametrize(("key", "value", "why"), [
    ("pipelines.question.1.cut.times", 3, "address a stage's option by its name"),
    ("references.7.value", 3, "no such place in the experiment"),
    ("question/cut.kk", 3, "experiment lag-oracle: --set question/cut.kk: stage 'cut' has no option 'kk'; its options: k, depths"),
    ("mmr.k", 3, "no stage 'mmr' in the pipelines; their stages: cut, dense"),
    ("dataset.qa", "nq", "dataset.qa 'nq': must be"),
    ("question/cut.times", 0, "must be greater than or equal to 1"),
    ("titel", "x", "titel 'x': no such option; options: name, title, dataset"),
])
def test_a_bad_override_is_one_line(key, value, why):
    with pytest.raises(ExperimentError, match=re.escape(why)) as info:
        override(load("lag-oracle"), {key: value})
    assert "\n" not in str(info.value)


def test_a_reference_is_reproduced_within_its_tolerance_and_never_without_a_figure():
    from logicrank.pipelines.evaluation.experiment import Reference, ReferenceCheck

    ref = Reference(run="question", measure="R@100", value=0.697, tolerance=0.01, source="x")
    assert ReferenceCheck(ref, 0.6875).ok and ReferenceCheck(ref, 0.7065).ok
    assert not ReferenceCheck(ref, 0.6865).ok and not ReferenceCheck(ref, 0.7075).ok and not ReferenceCheck(ref, None).ok
    edge = Reference(run="question", measure="R@100", value=0.645, tolerance=0.005, source="x")
    assert ReferenceCheck(edge, 0.65).ok and ReferenceCheck(edge, 0.64).ok  # at the edge, 4e-18 past it in floats
    assert not ReferenceCheck(edge, 0.6500001).ok


def test_set_items_are_yaml_values_and_a_stage_name_reaches_every_such_stage():
    from logicrank.pipelines.retrieval.overrides import OverrideError, parse_sets

    assert parse_sets(["dataset.sample=25", "measures=[R@1, MRR]", "orlog/bm25.k=5", "title=a=b", "itlr.ann_nprobes=none"]) == {
        "dataset.sample": 25, "measures": ["R@1", "MRR"], "orlog/bm25.k": 5, "title": "a=b", "itlr.ann_nprobes": "none"}
    for bad in ("dataset.sample", "=3", "x=[1"):
        with pytest.raises(OverrideError, match=re.escape(f"--set {bad!r}")):
            parse_sets([bad])
    exp = load("setlogic").model_copy(update={"pipelines": {**load("setlogic").pipelines, "spelled": [{"stage": "bm25", "k": 7}], "bare": ["bm25"]}})
    got = override(exp, {"bm25.k": 9}).pipelines_to_run()
    assert all(got[rid][0].k == 9 for rid in ("bm25", "orlog", "orlog-bm25", "spelled", "bare"))
    assert got["dense"] == exp.pipelines_to_run()["dense"]
    one = override(exp, {"orlog/bm25.k": 9}).pipelines_to_run()
    assert one["orlog"][0].k == 9 and one["bm25"][0].k == 100 and one["orlog-bm25"][0].k == 20


def test_references_stay_for_the_same_data_and_go_when_the_queries_or_the_encoder_change(tmp_path, monkeypatch):
    exp = load("rulebench-siar")  # dataset.rulebench: ${LOGICRANK_RULEBENCH}
    monkeypatch.setenv("LOGICRANK_RULEBENCH", str(tmp_path))
    assert override(exp, {"dataset.rulebench": str(tmp_path)}).references == exp.references  # the directory the variable names
    assert override(exp, {"dataset.rulebench": str(tmp_path / "other")}).references == ()
    assert override(exp, {"embed.model": "some/other-model"}).references == ()
    assert override(exp, {"measures": [*exp.measures, "R@2"]}).references == exp.references
    assert with_sample(exp, None, 5) == exp  # a seed alone draws nothing
    assert with_sample(override(exp, {"dataset.sample": 10}), None, 5).dataset.seed == 5


def test_the_bench_commands_options_land_where_the_files_hold_them(tmp_path, monkeypatch):
    from logicrank.pipelines.evaluation import benchmarks

    ulogic = tmp_path / "ulogic"  # (the reference figures are ULogic's: kept on a set of that name alone)
    ulogic.mkdir()
    monkeypatch.setenv("LOGICRANK_RULEBENCH", str(ulogic))
    full = benchmarks.rules(ulogic)
    assert len(full.references) == 2 and full.dataset.sample is None  # the whole set: the references are checked
    deep = benchmarks.rules(ulogic, sample=5, r3_n=30)
    assert deep.dataset.sample == 5 and deep.references == () and "R@30" in deep.measures
    run = deep.pipelines_to_run()
    for rid in ("sparse-siar-r3", "dense-siar-r3"):
        assert run[rid][1].k == 30 and (run[rid][2].k, run[rid][2].n) == (30, 30)
    assert run["sparse"][0].k == 30  # R3's ceiling is the retrievers' depth
    r3 = benchmarks.rules(ulogic, r3_n=10).pipelines_to_run()["dense-siar-r3"][2]
    assert (r3.k, r3.n) == (20, 10)

    s = benchmarks.setlogic(per_template=3, seed=2, k=10, sets=["orlog/bm25.k=5", "orlog/orlog.k=5", "orlog-bm25/bm25.k=5"])
    assert s.dataset.setlogic.per_template == 3 and s.dataset.setlogic.seed == 2 and s.measures == ("P@1", "R@10", "F1@10", "nDCG@10")
    run = s.pipelines_to_run()
    assert run["orlog"][0].k == 5 and run["orlog"][2].k == 5 and run["bm25"][0].k == 100
    assert run["orlog-bm25"][0].k == 5 and (run["orlog-bm25"][2].k, run["orlog-bm25"][2].scorer) == (20, "bm25")
    assert list(benchmarks.setlogic(orlog=False).pipelines) == ["dense", "bm25", "itlr", "itlr-bm25", "itlr-hybrid", "orlog-bm25"]

    oracle, rows = benchmarks.lag("musique", sample=4, seed=7, runs=("rag", "lag-random-order"))
    assert oracle == load("lag-oracle") and rows.dataset.sample == 4 and rows.dataset.seed == 7
    assert list(rows.pipelines) == ["rag", "lag-random-order"] and rows.pipelines_to_run()["lag-random-order"][0].seed == 7
    assert [e.name for e in benchmarks.lag("musique", llm_rows=False)] == ["lag-oracle"]


def test_bench_itlr_runs_both_settings_and_refuses_a_set_past_dense_depth():
    from logicrank.pipelines.evaluation import benchmarks

    pooled, own = benchmarks.itlr(per_template=3, seed=1, operators=False)
    assert (pooled.name, own.name) == ("itlr-synthetic", "itlr-synthetic-own")
    assert (pooled.dataset.qrels, own.dataset.qrels, own.dataset.synthetic.per_template, own.dataset.synthetic.seed) == ("qrels/pooled.tsv", "qrels/test.tsv", 3, 1)
    assert list(pooled.pipelines) == list(own.pipelines) == ["base", "itlr", "itlr-zscore", "itlr-sigmoid"]
    assert len(benchmarks.itlr()[0].pipelines) == 4 + 18  # and every operator family
    assert all(p[-1] == {"restrict": {"pairs": "{dataset}/qrels/own.tsv"}} or p[0]["itlr"]["mode"] == "listed" for p in own.pipelines.values())
    with pytest.raises(ExperimentError, match="between 1 and 52"):
        benchmarks.itlr(per_template=53)


def test_query_ids_cut_queries_and_qrels_to_those_queries_in_file_order(tmp_path):
    from logicrank.pipelines.evaluation.experiment import Experiment, sample_queries

    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "queries.jsonl").write_text("".join(f'{{"_id": "q{i}", "text": "t{i}"}}\n' for i in range(5)))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\nq{i}\te{i}\t1\n" for i in range(4)))
    queries, qrels = sample_queries(beir, None, 0, tmp_path / "s", ids=("q3", "q1"))
    assert [line.split('"')[3] for line in queries.read_text().splitlines()] == ["q1", "q3"]
    assert qrels.read_text().splitlines()[1:] == ["q1\td1\t1", "q1\te1\t1", "q3\td3\t1", "q3\te3\t1"]
    with pytest.raises(ExperimentError, match=r"\['q4', 'q9'\] not among the queries the qrels judge \(2 of 3\)"):
        sample_queries(beir, None, 0, tmp_path / "s", ids=("q1", "q4", "q9"))  # q4 has no qrels, q9 does not exist
    exp = load("itlr-llm")
    assert exp.dataset.query_ids == ("syn-00-000", "syn-09-000", "syn-19-000", "syn-31-000")
    with pytest.raises(ValueError, match="give sample or query_ids, not both"):
        Experiment.model_validate(exp.model_dump(exclude_none=True) | {"dataset": {**exp.dataset.model_dump(exclude_none=True), "sample": 2}})
    numeric = Experiment.model_validate(exp.model_dump(exclude_none=True) | {"dataset": {**exp.dataset.model_dump(exclude_none=True), "query_ids": [1, 3]}})
    assert numeric.dataset.query_ids == ("1", "3")  # YAML reads [1, 3] as numbers; BEIR ids are strings
    with pytest.raises(ValueError, match="query id 1.1: YAML read it as a number"):  # `1.10` in the file: its text is not "1.10"
        Experiment.model_validate(exp.model_dump(exclude_none=True) | {"dataset": {**exp.dataset.model_dump(exclude_none=True), "query_ids": [1.10]}})
    sampled = with_sample(exp, 2, 5)  # --sample on the command line replaces the file's queries
    assert (sampled.dataset.sample, sampled.dataset.seed, sampled.dataset.query_ids) == (2, 5, None)


def test_the_report_prints_counts_as_integers_and_stage_counts_as_words(tmp_path):
    """No Python reprs in a report: a group's query count is 40, not 40.0; a stage's counts
    read as words (none, not None or []; names with spaces; lists joined)."""
    import pandas as pd
    import pyarrow as pa

    from logicrank.pipelines.evaluation.experiment import EXPERIMENTS, ExperimentResult, render

    exp = load(EXPERIMENTS / "scifact.yaml")
    groups = {"negations": pd.DataFrame({"queries": [40.0, 120.0], "nDCG@10": [0.74451, 0.5]},
                                        index=pd.MultiIndex.from_tuples([("bm25", 0), ("bm25", 1)]))}
    stages = {"itlr": [{"stage": "itlr", "digest": "x", "queries": 4, "fallback_query_ids": [], "mean_candidates": None,
                        "by_status": {"ok": 3, "fallback": 1}, "fallback_decomposition_query_ids": ["q1", "q2"],
                        "forward_passes_per_pair": 2.0, "seconds_per_pair": 0.00012345, "cached": True}]}
    result = ExperimentResult(exp, pa.table({}), pd.DataFrame({"nDCG@10": [0.6851]}, index=["bm25"]), None, groups, [],
                              tmp_path / "r.md", {}, 1, stages=stages)
    text = render(result)
    assert re.search(r"^\| bm25 +\| 0 +\| +40 \| +0\.7445 \|$", text, re.M), text
    assert "40.0" not in text and "None" not in text and "[]" not in text and "{" not in text
    assert ("- `itlr`: itlr (cached) (queries 4, fallback query ids none, mean candidates none, by status (ok 3, fallback 1), "
            "fallback decomposition query ids q1, q2, forward passes per pair 2, seconds per pair 0.0001234)") in text


def test_a_number_written_with_a_leading_zero_is_the_text_the_user_typed(tmp_path):
    """PyYAML reads YAML 1.1, where an unquoted 010 is 8 (octal), 1_000 is 1000 and 12:30 is
    750: query ids 010 and 007 became "8" and "7", and orlog.k=010 was 8. Only YAML 1.2's
    numbers are numbers now, in experiment files and --set alike."""
    import yaml

    from logicrank.pipelines.files import load_yaml
    from logicrank.pipelines.retrieval.overrides import OverrideError, parse_sets

    assert load_yaml("[010, 007, 1_000, '12:30', 12:30, 12, -3, 0x1F, 1.5, .5, -2.5e+3, 0]") == [
        "010", "007", "1_000", "12:30", "12:30", 12, -3, 31, 1.5, 0.5, -2500.0, 0]
    assert load_yaml("{a: true, b: null, c: ~, d: .inf}") == {"a": True, "b": None, "c": None, "d": float("inf")}
    # a number is one to YAML 1.1 too, so a string yaml.safe_dump writes bare reads back a string (the dataset registry's
    # descriptions and names: 1e3 and 0o17 are strings to PyYAML, not numbers)
    for text in ("1e3", "2E5", "0o17", "-.5", ".5e1", "010", "12:30", "1_000", "0x1F", "yes"):
        assert load_yaml(yaml.safe_dump({"name": text})) == {"name": text}, text
    chain = "base: &base {k: 100, scorer: bm25}\npipelines:\n  a: [{itlr: &itlr {<<: *base, k: 50}}]\n  b: {<<: *itlr, scorer: dense}\n"
    assert load_yaml(chain) == yaml.safe_load(chain)  # a merged key given again is an override, not a key given twice
    assert load_yaml("a: 1\n=: 2\n") == yaml.safe_load("a: 1\n=: 2\n") == {"a": 1, "=": 2}  # a plain = key is the string "="
    with pytest.raises(yaml.YAMLError, match="the key 'k' is given twice"):
        load_yaml("x: &x {k: 1, k: 2}\ny: {<<: *x}\n")
    assert parse_sets(["orlog.k=010", "dataset.query_ids=[010, 7]"]) == {"orlog.k": "010", "dataset.query_ids": ["010", 7]}
    with pytest.raises(OverrideError, match=r"^--set orlog\.k: given twice; give each key once$"):  # PyYAML and a dict: the last won
        parse_sets(["orlog.k=10", "bm25.k=5", "orlog.k=20"])
    with pytest.raises(OverrideError, match=r"^set: orlog\.k given twice; give each key once$"):  # an experiment file's set: mapping
        parse_sets({"orlog.k": 10, "orlog.k ": 20})
    with pytest.raises(OverrideError, match=r"^--set 'itlr.weights=\{a: 1, a: 2\}': the value is not valid YAML \(the key 'a' is given twice"):
        parse_sets(["itlr.weights={a: 1, a: 2}"])
    (tmp_path / "twice.yaml").write_text((EXPERIMENTS / "itlr-llm.yaml").read_text() + "title: again\n")  # a second top-level title
    with pytest.raises(ExperimentError, match=r"not valid YAML: .*the key 'title' is given twice"):
        load(tmp_path / "twice.yaml")
    text = (EXPERIMENTS / "itlr-llm.yaml").read_text().replace("query_ids: [syn-00-000, syn-09-000, syn-19-000, syn-31-000]",
                                                                "query_ids: [010, 007, 12]")
    (tmp_path / "e.yaml").write_text(text)
    assert load(tmp_path / "e.yaml").dataset.query_ids == ("010", "007", "12")
    assert override(load("setlogic"), parse_sets(["orlog/bm25.k=010"])).pipelines_to_run()["orlog"][0].k == 10  # not 8


def test_another_encoder_than_the_files_leaves_its_references_unchecked(tmp_path):
    """scifact.yaml sets no ``embed``: its dense reference is all-MiniLM-L6-v2's published
    figure. Run with another encoder (``--model``, ``--config``, or ``lr.run_experiment`` on a
    table of another encoder) it was checked against that figure, "reproduced" or "MISSED"."""
    exp = load("scifact")
    assert not exp.embed and any(r.run == "dense" for r in exp.references)
    assert with_encoder(exp, EmbedConfig()) == exp  # the encoder it was written for
    assert with_encoder(exp, EmbedConfig(backend="torch", batch_size=8)) == exp  # the same vectors
    (tmp_path / "encoder").mkdir()
    got = with_encoder(exp, EmbedConfig(model=str(tmp_path / "encoder")))
    assert got.references == () and "not checked on this run" in got.caveats[-1] and got.embed["model"] == str(tmp_path / "encoder")
    assert with_encoder(exp, EmbedConfig(max_seq_length=128)).references == ()  # another token window: another vector space


def test_the_table_an_experiments_index_recipe_writes_is_the_one_its_pipelines_search(tmp_path, monkeypatch):
    """`index: {table: v2}` indexed the corpus into v2 while every pipeline searched the default
    table `docs`: in an index folder another experiment had filled, the wrong corpus scored."""
    import contextlib
    from pathlib import Path

    import logicrank.jobs.experiment as job
    import logicrank.jobs.index
    import logicrank.jobs.raysession
    import logicrank.jobs.retrieve

    class Stop(Exception):
        pass

    seen = {}

    def index(cfg, out, progress=True):
        seen["index"] = cfg.table
        return type("Summary", (), {"table_version": 1})()

    def retrieve(cfg, out, echo=None, progress=True):
        seen["retrieve"] = cfg.table
        raise Stop

    monkeypatch.setattr(job, "prepared", lambda exp, out: (Path("c"), Path("q.jsonl"), Path("qrels.tsv"), Path("."), exp.pipelines_to_run(), None))
    monkeypatch.setattr(logicrank.jobs.raysession, "ray_session", lambda ray: contextlib.nullcontext())
    monkeypatch.setattr(logicrank.jobs.index, "run_index", index)
    monkeypatch.setattr(logicrank.jobs.retrieve, "run_retrieve", retrieve)
    for sets, table in (([], "docs"), (["index.table=v2"], "v2")):
        with pytest.raises(Stop):
            job.run_experiment(override(load("scifact"), sets), tmp_path / "out", progress=False)
        assert seen == {"index": table, "retrieve": table}
