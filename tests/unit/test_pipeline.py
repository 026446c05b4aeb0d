"""Stages and pipelines as values: the registry, parsing, whole-pipeline validation, presets."""

from __future__ import annotations

import re
from typing import Literal

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.pipelines.config.retrieval import RetrieveConfig
from logicrank.pipelines.retrieval.overrides import OverrideError
from logicrank.pipelines.retrieval.pipeline import PipelineError, parse_stages, preset_names, read_presets, validate
from logicrank.pipelines.retrieval.stages import Kind, Stage, StageOptions, register, stages


def _cfg(pipelines) -> RetrieveConfig:
    return RetrieveConfig(queries="q.jsonl", db="db", pipelines=pipelines)


def test_every_stage_class_in_the_stages_package_is_registered_and_every_preset_builds():
    """Found by walking ``pipelines/retrieval/stages``, not from a list kept by hand: a stage written and
    not registered fails here."""
    import importlib
    import inspect
    import pkgutil

    import logicrank.pipelines.retrieval.stages as package

    registered = stages()  # what importing the package registers, before this test imports every module
    defined = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Stage) and cls.__module__ == module.__name__ and "name" in vars(cls):
                defined[cls.name] = cls
    assert defined == registered, set(defined) ^ set(registered)
    assert {"dense", "bm25", "rrf", "itlr", "orlog", "siar", "r3", "lag"} <= set(stages())  # the four methods and their retrievers
    for name, cls in stages().items():
        assert cls.name == name and cls.Options.model_config["extra"] == "forbid"
    for name in preset_names():  # every preset file holds one pipeline, named as the file, that validates
        (run_id, options), = read_presets([name]).items()
        assert run_id == name and validate(run_id, options) is not None


def test_stage_spellings_are_equivalent_and_unknown_ones_list_the_registry():
    a, b, c = parse_stages(["dense"]), parse_stages([{"dense": None}]), parse_stages([{"stage": "dense", "k": 100}])
    assert a == b == c
    with pytest.raises(ValueError, match=re.escape(f"unknown stage 'sparse'; registered stages: {', '.join(sorted(stages()))}")):
        parse_stages(["sparse"])
    with pytest.raises(ValidationError, match="extra_forbidden|Extra inputs"):
        _cfg({"x": [{"dense": {"k": 5, "depth": 3}}]})
    with pytest.raises(ValidationError, match="list of stages"):
        _cfg({"x": "dense"})


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ([], "has no stages"),
        (["orlog"], r"stage 1 \(orlog\) reranks a run, but no stage before it produces one"),
        (["bm25", "orlog"], r"stage 2 \(orlog\) needs query column\(s\) \['atoms'\]"),
        ([{"decomposition": {"target": "itlr"}}], "produces no run"),
        ([{"rrf": {"of": [["dense"], ["reasoner"]]}}], r"pipeline 'p/rrf\[2\]', stage 1 \(reasoner\) reranks a run"),
        # OrLog's decomposition makes logical_query a form over atom ids: itlr searched "a1", "a2" as words (old code: run, status ok)
        ([{"decomposition": {"target": "orlog", "decompositions": "d.jsonl"}}, "itlr"],
         r"stage 2 \(itlr\) cannot read queries that carry 'atoms'.*OrLog's atom ids"),
        ([{"decomposition": {"target": "orlog", "decompositions": "d.jsonl"}}, {"rrf": {"of": [["bm25"], ["itlr"]]}}],
         r"pipeline 'p/rrf\[2\]', stage 1 \(itlr\) cannot read queries that carry 'atoms'"),
    ],
)
def test_a_pipeline_is_validated_as_a_whole_before_any_work(pipeline, message):
    with pytest.raises(ValidationError, match=message):
        _cfg({"p": pipeline})


def test_stages_fit_when_their_inputs_are_produced_before_them():
    stages_ = parse_stages([{"decomposition": {"target": "orlog", "decompositions": "d.parquet"}}, "bm25", "orlog"])
    needs = validate("p", stages_)
    assert needs.llm == {"truth"} and needs.files == ("d.parquet",) and not needs.encoder
    needs = validate("p", parse_stages([{"rrf": {"of": [["dense"], ["bm25"]]}}, {"reasoner": {"depth": 5}}]))
    assert needs.encoder and needs.llm == {"truth"}
    # a decomposition for itlr after one for orlog: itlr reads its own logical query, over text terms (no misread), and an
    # orlog after it would read that form as one over the atoms: refused
    validate("p", parse_stages([{"decomposition": {"target": "orlog", "decompositions": "d.jsonl"}},
                                {"rrf": {"of": [["bm25", "orlog"], [{"decomposition": {"target": "itlr", "decompositions": "i.jsonl"}}, "itlr"]]}}]))
    with pytest.raises(PipelineError, match=r"stage 4 \(orlog\) needs query column\(s\) \['atoms'\]"):
        validate("p", parse_stages([{"decomposition": {"target": "orlog", "decompositions": "d.jsonl"}}, "bm25",
                                    {"decomposition": {"target": "itlr", "decompositions": "i.jsonl"}}, "orlog"]))
    # without a table, the decomposition asks the LLM to generate
    assert validate("p", parse_stages([{"decomposition": {"target": "itlr"}}, "itlr"])).llm == {"generate"}


def test_presets_are_pipeline_files_and_overrides_address_stages_by_name():
    p = read_presets(["dense", "hybrid", "orlog", "reasoner"], "t", ["rrf.k=250", "t-hybrid/dense.k=250", "t-hybrid/bm25.k=250", "orlog.k=250",
                                                                    "t-orlog/bm25.k=7", "reasoner.depth=7"])
    assert list(p) == ["t-dense", "t-hybrid", "t-orlog", "t-reasoner"]
    (fused,) = p["t-hybrid"]
    assert fused.stage == "rrf" and fused.k == 250 and [s[0].k for s in fused.of] == [250, 250] and p["t-dense"][0].k == 100
    assert [o.stage for o in p["t-orlog"]] == ["bm25", "decomposition", "orlog"]  # the base first: shared with the bm25 preset
    assert p["t-orlog"][0].k == 7 and p["t-orlog"][2].depth is None and p["t-orlog"][2].k == 250  # depth: all of the base's run
    assert [o.stage for o in p["t-reasoner"]] == ["bm25", "reasoner"] and p["t-reasoner"][0].k == 20 and p["t-reasoner"][1].depth == 7
    deep = read_presets(["hybrid", "bm25"], sets={"bm25.k": 50})  # a fusion's sub-pipelines are reached too
    assert deep["hybrid"][0].of[1][0].k == deep["bm25"][0].k == 50 and deep["hybrid"][0].of[0][0].k == 100
    with pytest.raises(PipelineError, match="unknown method 'sparse'"):
        read_presets(["sparse"])


@pytest.mark.parametrize(("sets", "message"), [
    (["bm25.kk=5"], r"^--set bm25.kk: stage 'bm25' has no option 'kk'; its options: k$"),
    (["orlog.k=5"], r"^--set orlog.k: no stage 'orlog' in the pipelines; their stages: bm25, decomposition, itlr$"),
    (["nope/itlr.k=5"], r"^--set nope/itlr.k: no pipeline 'nope'; pipelines: bm25, itlr-llm$"),
    (["bm25.k"], r"give KEY=VALUE"),
    (["bm25.k=0"], r"^--set bm25.k=0: must be greater than or equal to 1$"),
    (["itlr.mode=fast"], r"^--set itlr.mode=fast: must be 'exact', 'ann' or 'listed'$"),
    (["itlr.calibration=sigmoid"], r"sigmoid.*give labels"),
    (["bm25=5"], r"give STAGE.OPTION=VALUE"),
])
def test_a_bad_override_is_one_line_naming_what_exists(sets, message):
    with pytest.raises(OverrideError, match=message) as info:
        read_presets(["bm25", "itlr-llm"], sets=sets)
    assert "\n" not in str(info.value)


def test_override_values_are_read_as_yaml_and_typed_by_the_stage():
    p = read_presets(["itlr", "orlog"], sets=["itlr.mode=ann", "orlog.context=false", "itlr.ann_nprobes=none",
                                              "itlr.operators=and=min,or=max,not=complement", "decomposition.decompositions=d.parquet"])
    itlr, orlog = p["itlr"][0], p["orlog"]
    assert (itlr.mode, itlr.ann_nprobes, itlr.operators) == ("ann", None, "and=min,or=max,not=complement")  # split at the first '='
    assert orlog[2].context is False and orlog[1].decompositions == "d.parquet"
    assert read_presets(["orlog"], sets={"orlog.k": 20}) == read_presets(["orlog"], sets=["orlog.k=20"])  # a mapping, as in a file


def test_a_stage_registers_once_with_its_own_name():
    class Opts(StageOptions):
        stage: Literal["other"] = "other"

    class Bad(Stage):
        name, kind, Options = "mine", Kind.RERANKER, Opts

    with pytest.raises(RuntimeError, match="Options must declare stage"):
        register(Bad)
    with pytest.raises(RuntimeError, match="registered twice"):
        register(stages()["dense"])


def test_the_command_line_refuses_bad_pipeline_files_in_one_line(tmp_path):
    runner = CliRunner()
    bad = tmp_path / "p.yaml"
    for text, message in [
        ("x: [sparse]", "unknown stage 'sparse'; registered stages:"),
        ("x: [orlog]", "reranks a run, but no stage before it produces one"),
        ("x: [[dense]", "not valid YAML"),
        ("x: [{dense: {k: 0}}]", "--pipelines: pipeline 'x': stage 1 (dense.k) 0: must be greater than or equal to 1"),
        ("x: [{bm25: {kk: 10}}]", "--pipelines: pipeline 'x': stage 1 (bm25.kk) 10: no such option; options: k"),
    ]:
        bad.write_text(text)
        res = runner.invoke(app, ["retrieve", "q.jsonl", "--pipelines", str(bad)])
        assert res.exit_code == 2 and message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    res = runner.invoke(app, ["retrieve", "q.jsonl", "--pipelines", str(bad), "--method", "bm25"])
    assert res.exit_code == 2 and "not both" in res.output
    res = runner.invoke(app, ["retrieve", "q.jsonl", "--pipelines", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "missing.yaml" in res.output


def test_a_pipelines_file_may_nest_under_a_pipelines_key_and_a_bad_one_is_one_line(tmp_path):
    from logicrank.pipelines.retrieval.pipeline import Pipeline, pipelines_file, read_pipelines

    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"pipelines": {"d": ["dense"], "b": [{"bm25": {"k": 5}}]}}, sort_keys=False))
    assert list(_cfg(pipelines_file(f)).pipelines) == ["d", "b"]
    assert read_pipelines(f)["b"] == Pipeline.parse("b", [{"bm25": {"k": 5}}]) and read_pipelines(f)["b"].stages[0].k == 5
    for text, error in [("d: [dense", "not valid YAML"), ("[dense]", "expected a mapping of pipeline names"),
                        ("d: [{bm25: {k: 0}}]", r"pipeline 'd': stage 1 \(bm25.k\) 0: must be greater than or equal to 1"),
                        ("d: [orlog]", "reranks a run, but no stage before it produces one")]:
        f.write_text(text)
        with pytest.raises(PipelineError, match=error) as info:
            read_pipelines(f)
        assert "\n" not in str(info.value)


def test_the_command_line_sets_stage_options_on_presets_and_pipelines_files(tmp_path, monkeypatch):
    import logicrank.cli as cli

    made = []
    monkeypatch.setattr(cli, "run_job", lambda name, out, fn, cfg, *a, **kw: made.append(cfg) or {})
    f = tmp_path / "p.yaml"
    f.write_text("x: [dense, {orlog: {k: 5}}]")
    res = CliRunner().invoke(app, ["retrieve", "q.jsonl", "--pipelines", str(f), "--set", "dense.k=7"])
    assert res.exit_code == 2 and "stage 2 (orlog) needs query column(s) ['atoms']" in res.output  # validated after the overrides too
    f.write_text("x: [{dense: {k: 5}}]")
    res = CliRunner().invoke(app, ["retrieve", "q.jsonl", "--pipelines", str(f), "--set", "dense.k=7"])
    assert res.exit_code == 0 and made[-1].pipelines["x"][0].k == 7, res.output
    res = CliRunner().invoke(app, ["retrieve", "q.jsonl", "--method", "orlog", "--set", "bm25.k=50", "--run-tag", "t"])
    assert res.exit_code == 0 and made[-1].pipelines["t-orlog"][0].k == 50, res.output
    res = CliRunner().invoke(app, ["retrieve", "q.jsonl", "--method", "itlr", "--set", "itlr.mode=fast"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "itlr.mode=fast" in res.output, res.output
    res = CliRunner().invoke(app, ["retrieve", "q.jsonl", "--pipelines", str(f), "--run-tag", "t"])
    assert res.exit_code == 2 and "not both" in res.output, res.output


def test_a_written_config_loads_again_and_llm_options_beside_a_table_are_refused():
    cfg = RetrieveConfig.preset(("itlr-llm", "orlog", "expansion"), queries="q", db="d",
                                set={"decomposition.decompositions": "d.parquet", "expansion.decompositions": "d.parquet"})
    assert RetrieveConfig.model_validate(cfg.model_dump(mode="json")) == cfg  # what the manifest stores
    with pytest.raises(ValidationError, match=r"\['temperature'\] apply when the LLM generates"):
        _cfg({"x": [{"expansion": {"decompositions": "d.parquet", "temperature": 0.7}}, "dense"]})
    with pytest.raises(ValidationError, match="no whitespace"):
        _cfg({"a@b": ["dense"]})


def test_a_fused_run_deepened_past_its_lists_by_an_override_is_refused():
    with pytest.raises(OverrideError, match=r"^--set rrf.k=250: the rrf fuses runs 100 deep at most, fewer than the 250 it keeps; "
                                            r"deepen them too \(--set dense.k=250 --set bm25.k=250\)"):
        read_presets(["hybrid"], sets=["rrf.k=250"])
    assert read_presets(["hybrid"], sets=["rrf.k=250", "dense.k=250", "bm25.k=250"])["hybrid"][0].k == 250  # in any order
    assert read_presets(["hybrid"], sets=["rrf.k=20"])["hybrid"][0].k == 20


def test_one_pipelines_key_wins_over_every_pipelines_key_whatever_their_order():
    for sets in (["orlog/bm25.k=5", "bm25.k=7"], ["bm25.k=7", "orlog/bm25.k=5"], {"orlog/bm25.k": 5, "bm25.k": 7}):
        p = read_presets(["orlog", "bm25"], sets=sets)
        assert (p["orlog"][0].k, p["bm25"][0].k) == (5, 7), sets


def test_none_means_the_same_on_the_command_line_and_in_a_file():
    """The word none is an option's own value where it has one (ITLR's calibration none: raw
    scores), else None; a file's ``set:`` and ``--set`` read it alike."""
    for sets in (["itlr.scorer=bm25", "itlr.calibration=none", "itlr.ann_nprobes=none"],
                 {"itlr.scorer": "bm25", "itlr.calibration": "none", "itlr.ann_nprobes": "none"}):
        (itlr,) = read_presets(["itlr"], sets=sets)["itlr"]
        assert (itlr.calibration, itlr.ann_nprobes) == ("none", None)
    assert read_presets(["orlog"], sets=["orlog.calibration=none"])["orlog"][2].calibration == "none"
    assert read_presets(["itlr"], sets=["itlr.calibration=null"])["itlr"][0].calibration is None


def test_a_stages_options_set_together_are_validated_together():
    """sigmoid needs labels: setting both, in either order, is one valid change, not a refused half-way state."""
    for sets in ({"itlr.calibration": "sigmoid", "itlr.labels": "l.jsonl"}, ["itlr.labels=l.jsonl", "itlr.calibration=sigmoid"]):
        (itlr,) = read_presets(["itlr"], sets=sets)["itlr"]
        assert (itlr.calibration, itlr.labels) == ("sigmoid", "l.jsonl")

