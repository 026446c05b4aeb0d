"""Options declared once, by the config fields: every command line option bound to a config
field (``logicrank.cli_config.configured``) is generated from the field (its type, default and
description as help), unless it is an argument or computes its field; a config file plus
options builds the config in the documented order."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import pytest
import typer
from pydantic_core import PydanticUndefined
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.cli_config import Bound, cli_type, field_at
from logicrank.pipelines.config.retrieval import NightlyConfig  # noqa: F401 - every config importable beside the CLI
from logicrank.pipelines.config.settings import EmbedConfig, RayConfig

EXPERIMENT = Path(__file__).resolve().parents[2] / "jobs" / "experiments" / "itlr-synthetic.yaml"
UNBOUND = {"backend": (EmbedConfig, "backend"), "ray_address": (RayConfig, "address")}  # commands that pass them alone (main, nightly)


def _commands() -> dict[str, object]:
    root = typer.main.get_command(app)
    out = {}
    for cmd in root.commands.values():
        subs = getattr(cmd, "commands", None)  # a group (generate): its commands
        for sub in subs.values() if subs else [cmd]:
            out[sub.callback.__name__] = sub
    return out


BOUND = {name: cmd for name, cmd in _commands().items() if getattr(cmd.callback, "bindings", None)}


def test_the_commands_that_set_configs_are_bound():
    assert {"index", "retrieve", "evaluate", "decompose", "generate_itlr", "bench_rules", "bench_lag", "bench_setlogic",
            "experiment", "ablate"} <= set(BOUND)
    assert sum(len(c.callback.bindings) for c in BOUND.values()) >= 120  # every option walked


@pytest.mark.parametrize("command", sorted(BOUND))
def test_each_bound_option_has_its_fields_default(command):
    cmd = BOUND[command]
    params = {p.name: p for p in cmd.params}
    for option, (path, to_field) in cmd.callback.bindings.items():
        field = field_at(cmd.callback.config, path)  # a path that names no field fails here
        got = params[option].default
        if got is None or field.default is PydanticUndefined:  # None leaves the config's own; a required field has none
            continue
        got = to_field(got) if to_field else got
        assert (tuple(got) if isinstance(got, list) else got) == field.default, (command, option, got, field.default)


@pytest.mark.parametrize("command", sorted(BOUND))
def test_options_are_declared_once_by_their_fields(command):
    """A generated option's help is its field's description; an option the command declares
    itself is an argument or computes its field (``(path, to_field)``), never a copy."""
    cmd = BOUND[command]
    params = {p.name: p for p in cmd.params}
    generated = cmd.callback.generated
    for option, (path, to_field) in cmd.callback.bindings.items():
        param = params[option]
        if option in generated:
            if option != "compiled":  # --compiled computes enforce_eager (its inverse): its own help
                repeat = " Repeat the option for each value." if param.multiple else ""
                assert param.help == field_at(cmd.callback.config, path).description + repeat, (command, option)
        else:
            assert param.param_type_name == "argument" or to_field is not None, (command, option)


# the commands that pass these options alone, and which of them each has
UNBOUND_IN = {"main_job": ("backend", "ray_address"), "nightly": ("ray_address",), "nightly_demo": ("backend", "ray_address")}


@pytest.mark.parametrize("command", sorted(set(_commands()) - set(BOUND)))
def test_unbound_options_read_their_config(command):
    params = {p.name: p for p in _commands()[command].params}
    assert [o for o in UNBOUND if o in params] == list(UNBOUND_IN.get(command, ())), command
    for option in UNBOUND_IN.get(command, ()):
        config, name = UNBOUND[option]
        assert params[option].default == config.model_fields[name].default
        assert params[option].help == config.model_fields[name].description


def test_option_types_from_field_annotations():
    """Typer reads a Literal as text (pydantic refuses a bad one, naming the valid ones) and a
    tuple as a repeatable option."""
    assert cli_type(Literal["a", "b"]) == (str, ("a", "b"))
    assert cli_type(tuple[Literal["a", "b"], ...]) == (list[str], ("a", "b"))
    assert cli_type(int | None) == (int | None, ())
    assert cli_type(int | str | None) == (str | None, ())
    assert cli_type(dict[str, str]) == (str, ())


def test_a_bool_field_is_a_switch_both_ways(tmp_path):
    """--ann / --no-ann: an option given overrides a config file's value either way."""
    f = tmp_path / "index.yaml"
    f.write_text("corpus: /nowhere\nann: true\nembed: {batch_size: 0}\n")
    r = runner.invoke(app, ["index", "--config", str(f), "--no-ann", "--ann-threshold", "0"])
    # each refused value named where it came from: the flag typed, the file's key
    assert r.exit_code == 2 and f"index (--config {f} and the command line): {f}'s embed.batch_size 0: " in _err(r), _err(r)
    assert "; --ann-threshold 0: " in _err(r), _err(r)
    params = {p.name: p for p in BOUND["index"].params}
    assert params["ann"].secondary_opts == ["--no-ann"] and params["delete_missing"].secondary_opts == ["--no-delete-missing"]


def test_a_config_file_then_the_command_line():
    """The order: the config's defaults < the command's < the file < the options given."""
    values = {"db": "data/lancedb", "table": "docs", "embed.batch_size": 16, "embed.model": "m", "tag": None}
    b = Bound(values, frozenset({"table"}), None)
    assert b.data() == {"db": "data/lancedb", "table": "docs", "embed": {"batch_size": 16, "model": "m"}}  # a None default is left out
    assert b.data("embed") == {"batch_size": 16, "model": "m"}


def test_config_file_order(tmp_path):
    f = tmp_path / "index.yaml"
    f.write_text("db: /from/file\ntable: filetable\nembed: {batch_size: 8}\n")
    values = {"db": "data/lancedb", "table": "cli", "embed.batch_size": 16, "embed.model": "m"}
    b = Bound(values, frozenset({"table"}), f)
    # the file beats the command's defaults; the option given beats the file; the file's embed merges into the defaults'
    assert b.data() == {"db": "/from/file", "table": "cli", "embed": {"batch_size": 8, "model": "m"}}
    assert b["embed.batch_size"] == 8


runner = CliRunner()


def _err(result) -> str:
    return " ".join((result.stderr or result.output).split())


def test_index_reads_a_config_file_and_an_option_overrides_it(tmp_path):
    """Refused before any work: the file's values and the option given each show in the one-line error."""
    f = tmp_path / "index.yaml"
    f.write_text("corpus: /nowhere\nembed: {batch_size: 0}\n")
    r = runner.invoke(app, ["index", "--config", str(f)])
    assert r.exit_code == 2 and f"config {f}: embed.batch_size 0:" in _err(r), _err(r)
    f.write_text("corpus: /nowhere\nembed: {batch_size: 8}\nmax_delete_fraction: 0.5\n")
    r = runner.invoke(app, ["index", "--config", str(f), "--max-delete-fraction", "2"])
    assert r.exit_code == 2 and _err(r).startswith(f"error: index (--config {f} and the command line): --max-delete-fraction 2.0: "), _err(r)
    f.write_text("corpus: /nowhere\n")  # a rule over two fields, one of them typed: not the file's alone
    r = runner.invoke(app, ["index", "--config", str(f), "--vector-dim", "8"])
    assert r.exit_code == 2 and _err(r).startswith(f"error: index (--config {f} and the command line): vector_model and vector_dim"), _err(r)
    f.write_text("db: x\n")  # a field neither gives, beside a typed value refused: by its name
    r = runner.invoke(app, ["index", "--config", str(f), "--batch-size", "0"])
    assert r.exit_code == 2 and "line): corpus: Field required; --batch-size 0: " in _err(r), _err(r)
    r = runner.invoke(app, ["index", "--config", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "missing.yaml" in _err(r), _err(r)
    f.write_text("- a list\n")
    r = runner.invoke(app, ["index", "--config", str(f)])
    assert r.exit_code == 2 and "expected a mapping" in _err(r), _err(r)


def test_a_required_field_missing_from_options_and_file(tmp_path):
    r = runner.invoke(app, ["index"])
    assert r.exit_code == 2 and "error: index: corpus: Field required" in _err(r), _err(r)  # an argument, by the name help shows
    f = tmp_path / "index.yaml"
    f.write_text("db: x\n")
    r = runner.invoke(app, ["index", "--config", str(f)])
    assert r.exit_code == 2 and f"config {f}: corpus: Field required" in _err(r), _err(r)


def test_evaluate_from_a_config_file(tmp_path):
    """A real evaluation: qrels, runs and measures from the file, one measure overridden."""
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 2.0 a\nq1 Q0 d2 2 1.0 a\nq2 Q0 d1 1 2.0 a\nq2 Q0 d2 2 1.0 a\n")
    f = tmp_path / "evaluate.yaml"
    f.write_text(f"qrels: {qrels}\nruns: [{run}]\nmeasures: [P@1, MRR]\n")
    r = runner.invoke(app, ["evaluate", "--config", str(f), "--out", str(tmp_path / "ev")])
    assert r.exit_code == 0, r.output
    assert "P@1" in r.output and "MRR" in r.output and "0.7500" in r.output and "nDCG@10" not in r.output
    r = runner.invoke(app, ["evaluate", "--config", str(f), "--measure", "P@2", "--out", str(tmp_path / "ev2")])
    assert r.exit_code == 0, r.output
    assert "P@2" in r.output and "MRR" not in r.output


def test_judge_llm_sets_the_judges_model_and_keeps_the_files_other_judge_settings(tmp_path, monkeypatch):
    """Every option overrides one key of --config's, --judge-llm too (it replaced the judge whole)."""
    from logicrank import cli

    seen = {}
    monkeypatch.setattr(cli, "run_job", lambda stage, out, fn, cfg, *a, **k: seen.setdefault("cfg", cfg) and {})
    f = tmp_path / "evaluate.yaml"
    f.write_text("judge: {model: foo, dtype: bfloat16, max_model_len: 4096}\n")
    runner.invoke(app, ["evaluate", "--config", str(f), "--judge-llm", "bar", "--answers", "a.jsonl", "--gold", "g.jsonl"])
    judge = seen.pop("cfg").judge
    assert (judge.model, judge.dtype, judge.max_model_len) == ("bar", "bfloat16", 4096)
    runner.invoke(app, ["evaluate", "--answers", "a.jsonl", "--gold", "g.jsonl"])
    assert seen.pop("cfg").judge is None  # no judge unless one is named
    f.write_text("judge: null\n")  # the file says none; the command line names one
    runner.invoke(app, ["evaluate", "--config", str(f), "--judge-llm", "bar", "--answers", "a.jsonl", "--gold", "g.jsonl"])
    assert seen["cfg"].judge.model == "bar"


def _every_command(group, path=()):
    """(path, click command) of every command of the CLI, groups' subcommands included."""
    import typer.main

    click_group = typer.main.get_command(group) if not hasattr(group, "commands") else group
    for name, command in sorted(click_group.commands.items()):
        if hasattr(command, "commands"):
            yield from _every_command(command, (*path, name))
        else:
            yield (*path, name), command


@pytest.mark.parametrize("path, command", list(_every_command(app)), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_help_names_every_option_and_default_in_full_at_80_columns_and_piped(path, command):
    """A piped --help (CliRunner's output is not a terminal) at 80 columns truncates nothing:
    every option's name and every default shows whole."""
    r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": ""}, terminal_width=80)
    assert r.exit_code == 0, r.output
    text = "".join(r.output.split())  # a wrapped value, joined (click may break a line after a hyphen)
    assert "…" not in r.output
    for param in command.params:
        if param.hidden:
            continue
        for opt in param.opts:
            assert (opt if param.param_type_name == "option" else opt.lower()) in r.output, opt
        if param.param_type_name == "option" and param.show_default and param.default not in (None, "", ()) and not callable(param.default):
            if param.is_flag and not param.secondary_opts:
                continue  # click shows no default for a lone flag
            default = ", ".join(map(str, param.default)) if isinstance(param.default, list | tuple) else str(param.default)
            if param.is_flag:  # --x / --no-x: the default is the flag's name
                default = (param.opts if param.default else param.secondary_opts)[0].lstrip("-")
            assert "".join(f"default: {default}".split()) in text, (param.opts, default)


def test_the_encoder_given_on_the_command_line_beats_the_experiment_files(tmp_path, monkeypatch):
    """docs/experiments.md: the encoder (--model, --backend) comes from the command line. A
    file's `embed:` used to win over it, silently: the index was built with the file's."""
    import logicrank.cli as cli
    import logicrank.jobs.experiment as job

    seen = []
    monkeypatch.setattr(job, "run_experiment", lambda exp, *a, **kw: seen.append(exp) or (_ for _ in ()).throw(SystemExit(0)))
    monkeypatch.setattr(cli, "run_job", lambda name, out, fn, *a, **kw: fn(*a, **kw))
    (tmp_path / "e.yaml").write_text("name: e\ntitle: e\ndataset: scifact\npresets: [bm25]\nembed: {backend: torch, title_sep: ' | '}\n")
    runner = CliRunner()
    runner.invoke(app, ["experiment", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "o"), "--backend", "openvino"])
    assert seen and seen[-1].embed == {"backend": "openvino", "title_sep": " | "}
    runner.invoke(app, ["experiment", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "o")])
    assert seen[-1].embed == {"backend": "torch", "title_sep": " | "}  # nothing given: the file's
    # the file's own value given again is no change of encoder: the file's references stay checked
    (tmp_path / "r.yaml").write_text("name: e\ntitle: e\ndataset: scifact\npresets: [bm25]\nembed: {backend: torch}\nreferences: "
                                     "[{run: bm25, measure: nDCG@10, value: 0.68, tolerance: 0.01, source: s}]\n")
    runner.invoke(app, ["experiment", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "o"), "--backend", "torch"])
    assert len(seen[-1].references) == 1
    runner.invoke(app, ["experiment", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "o"), "--backend", "openvino"])
    assert seen[-1].embed == {"backend": "openvino"} and seen[-1].references == ()


def test_the_help_shows_choices_as_they_must_be_typed():
    """`--format AUTO|BEIR|...` was shown, and `--format TREC` then refused: choices are
    case-sensitive, so the help shows them as typed."""
    import re

    out = CliRunner().invoke(app, ["index", "--help"], terminal_width=200).output
    assert re.search(r"--format\s+auto\|beir\|", out), out
    assert "AUTO|BEIR" not in out


def test_an_unquoted_date_tag_in_a_config_file_is_the_date_written(tmp_path):
    """YAML reads `tag: 2026-11-25` as a date: the index config refused it with a Python repr
    ("tag datetime.date(2026, 11, 25): must be a valid string"). A number is still refused
    (YAML reads `1.10` as 1.1 and `010` as 8: quote it)."""
    import datetime

    import pydantic

    from logicrank.pipelines.config.settings import IndexConfig
    from logicrank.pipelines.files import load_yaml

    for text, tag in (("2026-11-25", "2026-11-25"), ("v1", "v1"), ("'1.10'", "1.10")):  # read as a --config file is read
        assert IndexConfig.model_validate(load_yaml(f"corpus: c\ndb: d\ntag: {text}")).tag == tag
    for value in (1.1, 8, datetime.datetime(2026, 11, 25, 10)):  # what YAML makes of 1.10, 010, 2026-11-25 10:00:00
        with pytest.raises(pydantic.ValidationError):
            IndexConfig(corpus="c", db="d", tag=value)


def test_a_yes_or_no_for_a_number_is_refused_not_read_as_one():
    """pydantic's lax mode read True as 1: `--set bm25.k=true` (YAML's yes, on) ran bm25 with
    k 1, and `batch_rows: yes` in a config file batched one row."""
    from logicrank.pipelines.retrieval.overrides import OverrideError
    from logicrank.pipelines.retrieval.pipeline import read_presets

    with pytest.raises(OverrideError, match="k true: a yes or no, where a number is asked"):
        read_presets(["bm25"], sets=["bm25.k=yes"])
    with pytest.raises(ValueError, match="batch_rows true: a yes or no"):
        RayConfig(batch_rows=True)
    assert read_presets(["bm25"], sets=["bm25.k=7"])["bm25"][0].k == 7 and RayConfig(batch_rows=5).batch_rows == 5
    import numpy as np

    with pytest.raises(ValueError, match="batch_rows true: a yes or no"):
        RayConfig(batch_rows=np.bool_(True))  # numpy's yes or no too
    from logicrank.pipelines.config.settings import LLMConfig

    assert LLMConfig(enforce_eager=False).enforce_eager is False  # a yes/no field takes one
    # inside a list or a mapping of numbers: fuse's weights [yes, 0.5] were (1.0, 0.5), an LLM resource {gpu_a: yes} 1.0
    from logicrank.pipelines.retrieval.stages.fuse import FuseOptions

    fuse = {"method": "wsum", "of": [["bm25"], ["dense"]]}
    with pytest.raises(ValueError, match=r"weights \[True, 0.5\]: a yes or no, where a number is asked"):
        FuseOptions.model_validate(fuse | {"weights": [True, 0.5]})
    with pytest.raises(ValueError, match="resources {'gpu_a': True}: a yes or no, where a number is asked"):
        LLMConfig(resources={"gpu_a": True})
    assert FuseOptions.model_validate(fuse | {"weights": [2, 0.5]}).weights == (2.0, 0.5)
    assert LLMConfig(resources={"gpu_a": 1}).resources == (("gpu_a", 1.0),)
    with pytest.raises(ValueError, match="resources: 'gpu_a' asks for '1'; an amount is a number"):  # a TypeError's traceback before
        LLMConfig(resources={"gpu_a": "1"})


def _below_their_minimum():
    """(command, option, value) for every bound int option with a minimum: the value under it."""
    import annotated_types

    for command, cmd in sorted(BOUND.items()):
        for option, (path, to_field) in cmd.callback.bindings.items():
            field = field_at(cmd.callback.config, path)
            low = [m.ge for m in field.metadata if isinstance(m, annotated_types.Ge)]
            if to_field is None and low and isinstance(low[0], int) and not isinstance(low[0], bool):
                yield command, option, low[0] - 1


@pytest.mark.parametrize("command, option, value", list(_below_their_minimum()))
def test_a_value_refused_is_named_by_the_flag_it_was_typed_with(command, option, value):
    """`retrieve --llm-max-model-len 0` was blamed on `--max-model-len`, `--shards 0` on
    `--retrieve-shards`: the one-line error names each option as this command spells it."""
    cmd = BOUND[command]
    params = {p.name: p for p in cmd.params}
    flags = [o for o in params[option].opts if o.startswith("--")]
    words = ["generate", "itlr"] if command == "generate_itlr" else [command.replace("_", "-")]
    # every argument given (an experiment file is read before its options are checked), and every required option
    args = [{"experiment": str(EXPERIMENT), "bench_lag": "musique"}.get(command, "x") for p in cmd.params if p.param_type_name == "argument"]
    required = [w for p in cmd.params if p.param_type_name == "option" and p.required for w in (p.opts[0], "x")]
    r = runner.invoke(app, [*words, *args, *required, flags[-1], str(value)])
    said = re.escape(f"{'/'.join(flags)} {value}") + r"(\.0)?: must be greater than or equal to"  # a float field shows -1.0
    assert r.exit_code == 2 and re.search(said, _err(r)), (command, option, _err(r))


def test_values_that_would_change_what_a_command_does_are_refused_before_it_works(tmp_path, monkeypatch):
    """A seed with nothing to draw (bench-rules without --sample ran the whole set), a count of
    queries to corrupt below 1 (nightly-demo read -5 as all but five, and 0 failed only after
    three nights), a depth of 0: one line, exit 2, and no job started."""
    from logicrank.pipelines.evaluation import benchmarks

    started = []
    monkeypatch.setattr("logicrank.cli.run_job", lambda *a, **k: started.append(a))
    monkeypatch.setattr(benchmarks, "rules", lambda *a, **k: started.append(a))
    runner = CliRunner()
    seed = runner.invoke(app, ["bench-rules", str(tmp_path), "--seed", "3", "--out", str(tmp_path / "o")])
    assert seed.exit_code == 2 and "--seed 3: the seed of a sample; give --sample N too" in seed.stderr, seed.output
    for value in ("0", "-5"):
        res = runner.invoke(app, ["nightly-demo", "--corrupt-queries", value, "--out", str(tmp_path / "d")])
        assert res.exit_code == 2 and "--corrupt-queries" in res.output, res.output
    k = runner.invoke(app, ["bench-setlogic", "--k", "0", "--out", str(tmp_path / "s")])
    assert k.exit_code == 2 and "--k" in k.output, k.output
    assert started == []
