"""Defaults are declared once, in the configs: every command line option that sets a config
field reads its default from that field (``jobs.cli._d``), none repeats it as a literal."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import typer

from jobs.cli import app
from jobs.nightly_config import NightlyConfig  # noqa: F401 - every config importable beside the CLI
from pipelines.config import RetrieveConfig
from schemas.config import DecomposeConfig, EmbedConfig, EvaluateConfig, GenerateConfig, IndexConfig, LLMConfig, RayConfig

CFG = {c.__name__: c for c in (EmbedConfig, LLMConfig, IndexConfig, EvaluateConfig, DecomposeConfig, GenerateConfig, RayConfig, RetrieveConfig)}
# command function -> option -> (config, field) it sets
LLM = {"llm_model": ("LLMConfig", "model"), "llm_dtype": ("LLMConfig", "dtype"), "llm_max_model_len": ("LLMConfig", "max_model_len"),
       "tensor_parallel_size": ("LLMConfig", "tensor_parallel_size"), "llm_cache": ("LLMConfig", "cache"), "actors": ("LLMConfig", "actors"),
       "cpus_per_actor": ("LLMConfig", "cpus_per_actor"), "llm_batch_rows": ("LLMConfig", "batch_rows")}
EMB = {"model": ("EmbedConfig", "model"), "backend": ("EmbedConfig", "backend"), "title_sep": ("EmbedConfig", "title_sep"), "batch_size": ("EmbedConfig", "batch_size")}
MAP = {
    "index": {**EMB, **{f: ("IndexConfig", f) for f in ("table", "format", "delete_missing", "max_delete_fraction", "allow_mass_delete", "prune_after_hours",
                                                       "write_batch_rows", "max_reject_fraction", "max_doc_bytes", "ann_threshold", "tag")}},
    "retrieve": {**EMB, **LLM, "table": ("RetrieveConfig", "table"), "trec": ("RetrieveConfig", "trec"), "retrieve_batch_rows": ("RayConfig", "retrieve_batch_rows")},
    "evaluate": {"measure": ("EvaluateConfig", "measures"), "test": ("EvaluateConfig", "test"), "correction": ("EvaluateConfig", "correction"),
                 "qa_measure": ("EvaluateConfig", "qa_measures"), "dedupe": ("EvaluateConfig", "dedupe")},
    "decompose": {"model": ("LLMConfig", "model"), "method": ("DecomposeConfig", "methods"), "constrained": ("DecomposeConfig", "constrained"),
                  "dtype": ("LLMConfig", "dtype"), "max_model_len": ("LLMConfig", "max_model_len"), "tensor_parallel_size": ("LLMConfig", "tensor_parallel_size"),
                  "actors": ("LLMConfig", "actors"), "cpus_per_actor": ("LLMConfig", "cpus_per_actor"), "batch_rows": ("LLMConfig", "batch_rows"), "cache": ("LLMConfig", "cache")},
    "ablate": {**EMB, "table": ("IndexConfig", "table")},
    "generate_itlr": {**EMB, **LLM, **{f: ("GenerateConfig", f) for f in ("table", "docs", "shard_docs", "questions_per_shard", "max_topics", "seed",
                                                                       "candidate_k", "dedup_threshold", "label_threshold")}, "candidate": ("GenerateConfig", "candidates")},
}
CLI = Path(__file__).resolve().parents[2] / "jobs" / "cli.py"


def _commands() -> dict[str, object]:
    root = typer.main.get_command(app)
    out = {}
    for cmd in root.commands.values():
        subs = getattr(cmd, "commands", None)  # a group (generate): its commands
        for sub in subs.values() if subs else [cmd]:
            out[sub.callback.__name__] = sub
    return out


def _mapping(command: str) -> dict:
    """The options of ``command`` that set config fields: its own list, else the encoder's and the LLM's."""
    return MAP.get(command, {**EMB, **LLM})


@pytest.mark.parametrize("command", sorted(_commands()))
def test_each_option_that_sets_a_config_field_has_the_fields_default(command):
    params = {p.name: p for p in _commands()[command].params}
    checked = [option for option in _mapping(command) if option in params]  # (not every command has every option)
    for option in checked:
        config, field = _mapping(command)[option]
        want = CFG[config].model_fields[field].default
        got = params[option].default
        assert (tuple(got) if isinstance(got, list) else got) == want, (command, option, got, want)


def test_no_command_repeats_a_config_default_as_a_literal():
    tree = ast.parse(CLI.read_text(encoding="utf-8"))
    literal = []
    commands = set(_commands())
    checked = 0
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in commands):
        names = [a.arg for a in fn.args.args][-len(fn.args.defaults):] if fn.args.defaults else []
        for name, node in zip(names, fn.args.defaults, strict=True):
            checked += name in _mapping(fn.name)
            if name in _mapping(fn.name) and "_d(" not in ast.unparse(node):
                literal.append(f"{fn.name} --{name.replace('_', '-')} = {ast.unparse(node)}")
    assert not literal, f"give these defaults as _d(Config, field): {literal}"
    assert checked >= 90, checked  # every command read (the walk found the options)
