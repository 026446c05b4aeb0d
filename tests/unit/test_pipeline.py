"""Stages and pipelines as values: the registry, parsing, whole-pipeline validation, presets."""

from __future__ import annotations

from typing import Literal

import pytest
import yaml
from logicrank.jobs.cli import app
from logicrank.pipelines.config import RetrieveConfig
from logicrank.pipelines.pipeline import MethodOptions, PipelineError, from_methods, parse_stages, validate
from logicrank.pipelines.stages import Kind, Stage, StageOptions, presets, register, stages
from pydantic import ValidationError
from typer.testing import CliRunner


def _cfg(pipelines) -> RetrieveConfig:
    return RetrieveConfig(queries="q.jsonl", db="db", pipelines=pipelines)


def test_every_stage_class_in_the_stages_package_is_registered_and_every_preset_builds():
    """Found by walking ``pipelines/stages``, not from a list kept by hand: a stage written and
    not registered (or not imported at the registry's bottom) fails here."""
    import importlib
    import inspect
    import pkgutil

    import logicrank.pipelines.stages as package

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
    for name in presets():  # every preset builds a pipeline that validates (validate raises otherwise)
        (run_id, options), = from_methods([name], MethodOptions()).items()
        validate(run_id, options)


def test_stage_spellings_are_equivalent_and_unknown_ones_list_the_registry():
    a, b, c = parse_stages(["dense"]), parse_stages([{"dense": None}]), parse_stages([{"stage": "dense", "k": 100}])
    assert a == b == c
    with pytest.raises(ValueError, match="unknown stage 'sparse'; registered stages: bm25, cut, decomposition, dense"):
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
    # without a table, the decomposition asks the LLM to generate
    assert validate("p", parse_stages([{"decomposition": {"target": "itlr"}}, "itlr"])).llm == {"generate"}


def test_presets_build_the_methods_pipelines():
    p = from_methods(["dense", "hybrid", "orlog", "reasoner"], MethodOptions(k=250, hybrid_depth=100, orlog_k=7, decompositions="d.parquet"), "t")
    assert list(p) == ["t-dense", "t-hybrid", "t-orlog", "t-reasoner"]
    (fused,) = p["t-hybrid"]
    assert fused.stage == "rrf" and fused.k == 250 and [s[0].k for s in fused.of] == [250, 250]  # at least k deep
    assert [o.stage for o in p["t-orlog"]] == ["bm25", "decomposition", "orlog"]  # the base first: shared with the bm25 preset
    assert p["t-orlog"][0].k == 7 and p["t-orlog"][2].depth == 7 and p["t-orlog"][2].k == 250
    assert [o.stage for o in p["t-reasoner"]] == ["bm25", "reasoner"]
    with pytest.raises(PipelineError, match="unknown method 'sparse'"):
        from_methods(["sparse"])
    with pytest.raises(PipelineError, match="sigmoid.*give labels"):
        from_methods(["itlr"], MethodOptions(calibration="sigmoid"))


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
        ("x: [{dense: {k: 0}}]", "--pipelines: pipeline 'x': stage 1 (dense.k): must be greater than or equal to 1"),
    ]:
        bad.write_text(text)
        res = runner.invoke(app, ["retrieve", "q.jsonl", "--pipelines", str(bad)])
        assert res.exit_code == 2 and message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    res = runner.invoke(app, ["retrieve", "q.jsonl", "--pipelines", str(bad), "--method", "bm25"])
    assert res.exit_code == 2 and "not both" in res.output
    res = runner.invoke(app, ["retrieve", "q.jsonl", "--pipelines", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "missing.yaml" in res.output


def test_a_pipelines_file_may_nest_under_a_pipelines_key_and_a_bad_one_is_one_line(tmp_path):
    from logicrank.pipelines.pipeline import Pipeline, pipelines_file, read_pipelines

    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"pipelines": {"d": ["dense"], "b": [{"bm25": {"k": 5}}]}}, sort_keys=False))
    assert list(_cfg(pipelines_file(f)).pipelines) == ["d", "b"]
    assert read_pipelines(f)["b"] == Pipeline.parse("b", [{"bm25": {"k": 5}}]) and read_pipelines(f)["b"].stages[0].k == 5
    for text, error in [("d: [dense", "not valid YAML"), ("[dense]", "expected a mapping of pipeline names"),
                        ("d: [{bm25: {k: 0}}]", r"pipeline 'd': stage 1 \(bm25.k\): Input should be greater than or equal to 1"),
                        ("d: [orlog]", "reranks a run, but no stage before it produces one")]:
        f.write_text(text)
        with pytest.raises(PipelineError, match=error) as info:
            read_pipelines(f)
        assert "\n" not in str(info.value)


def test_preset_options_are_refused_beside_a_pipelines_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("x: [dense]")
    res = CliRunner().invoke(app, ["retrieve", "q.jsonl", "--pipelines", str(f), "--k", "10", "--set", "orlog_k=5"])
    assert res.exit_code == 2 and "--k, --set set(s) a --method preset's options" in res.output, res.output


def test_a_written_config_loads_again_and_llm_options_beside_a_table_are_refused():
    cfg = RetrieveConfig.preset(("itlr", "orlog", "expansion"), queries="q", db="d", decompositions="d.parquet")
    assert RetrieveConfig.model_validate(cfg.model_dump(mode="json")) == cfg  # what the manifest stores
    with pytest.raises(ValidationError, match=r"\['temperature'\] apply when the LLM generates"):
        _cfg({"x": [{"expansion": {"decompositions": "d.parquet", "temperature": 0.7}}, "dense"]})
    with pytest.raises(ValidationError, match="no whitespace"):
        _cfg({"a@b": ["dense"]})


def test_preset_options_are_set_by_key_typed_by_the_options_model_and_a_mistake_is_one_line():
    from logicrank.pipelines.pipeline import method_options

    o = method_options(["itlr_mode=ann", "orlog-k=5", "orlog_context=false", "ann_nprobes=none", "decompositions=d.parquet"], k=7)
    assert (o.itlr_mode, o.orlog_k, o.orlog_context, o.ann_nprobes, o.decompositions, o.k) == ("ann", 5, False, None, "d.parquet", 7)
    assert method_options(["operators=and=min,or=max,not=complement"]).operators == "and=min,or=max,not=complement"  # split at the first '='
    assert method_options() == MethodOptions()
    for bad, message in [(["orlog_kk=5"], "--set 'orlog_kk=5': give KEY=VALUE with KEY one of k, hybrid_depth"),
                         (["orlog_k"], "give KEY=VALUE"), (["orlog_k=0"], "^method option orlog_k=0: must be greater than or equal to 1$"),
                         (["itlr_mode=fast"], "itlr_mode=fast: must be 'exact' or 'ann'")]:
        with pytest.raises(PipelineError, match=message):
            method_options(bad)
    res = CliRunner().invoke(app, ["retrieve", "q.jsonl", "--method", "itlr", "--set", "itlr_mode=fast"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "itlr_mode" in res.output, res.output
    res = CliRunner().invoke(app, ["retrieve", "q.jsonl", "--k", "5", "--set", "k=6"])
    assert res.exit_code == 2 and "give the presets' k once, as --k N or --set k=N" in res.output, res.output
