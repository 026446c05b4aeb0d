"""Pipelines as values: a list of stage options, validated as a whole before any work.

A pipeline config (YAML, see docs/pipelines.md) names several pipelines; each is a
list of stages, each stage written as ``name`` or ``{name: {options}}``. The schema is the
registry's: every registered stage's options model, picked by name (no list of methods is
kept here). ``--method X`` builds the preset pipeline X registered beside its stage.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from logicrank.pipelines.embed import encoder_digest
from logicrank.pipelines.llm.prompts import templates_digest
from logicrank.pipelines.runner import Hooks, Inputs, Result, StageCache, run_stages
from logicrank.pipelines.stages import Context, Kind, Needs, StageOptions, presets, stages
from logicrank.pipelines.stages.registry import build as build  # part of this module's API
from logicrank.pipelines.stages.registry import (
    parse_stages as parse_stages,  # part of this module's API: pipelines from their config form
)
from logicrank.schemas.errors import UserError, first_line
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class PipelineError(UserError, ValueError):
    """A pipeline whose stages do not fit together; the message names the pipeline, the
    stage and the fix."""


def validate(name: str, options: Sequence[StageOptions], columns: frozenset[str] = frozenset()) -> Needs:
    """Check the pipeline as a whole and return what it needs: each stage's input against what
    the stages before it produce (a reranker needs a run, orlog needs atoms), the pipeline
    ends in a run. ``columns``: query columns available at its start."""
    if not options:
        raise PipelineError(f"pipeline {name!r} has no stages; give at least a retriever (e.g. dense).")
    needs, have_run, cols = Needs(), False, set(columns)
    for i, o in enumerate(options, 1):
        stage = build(o)
        where = f"pipeline {name!r}, stage {i} ({o.stage})"
        if stage.kind is Kind.RERANKER and not have_run:
            raise PipelineError(f"{where} reranks a run, but no stage before it produces one; put a retriever (e.g. bm25) before it.")
        missing = stage.requires - cols
        if missing:
            raise PipelineError(f"{where} needs query column(s) {sorted(missing)} that no stage before it adds; "
                                f"put a stage that adds them first (for atoms: decomposition with target orlog).")
        if stage.kind is Kind.FUSION:
            if not stage.children():
                raise PipelineError(f"{where} fuses no sub-pipelines (a fusion stage returns them from children()).")
            for j, sub in enumerate(stage.children(), 1):
                needs = needs | validate(f"{name}/{o.stage}[{j}]", sub, frozenset(cols))
        cols |= stage.adds
        have_run = have_run or stage.kind in (Kind.RETRIEVER, Kind.FUSION)
        needs = needs | stage.needs()
    if not have_run:
        raise PipelineError(f"pipeline {name!r} produces no run; end it with a retriever, a reranker or rrf.")
    return needs


@dataclass(frozen=True)
class Pipeline:
    """A named pipeline: stages that run in any process (:mod:`logicrank.pipelines.runner`).

    >>> Pipeline.parse("hybrid", [{"rrf": {"of": [["dense"], ["bm25"]]}}])  # doctest: +SKIP
    """

    name: str
    stages: tuple[StageOptions, ...]

    @classmethod
    def parse(cls, name: str, specs: Sequence[Any]) -> Pipeline:
        """From the config form: ``["bm25", {"orlog": {"k": 20}}]``; validated."""
        try:
            pipeline = cls(name, parse_pipelines({name: specs})[name])
        except ValueError as exc:
            raise PipelineError(first_line(str(exc))) from None
        pipeline.validate()
        return pipeline

    def validate(self, columns: frozenset[str] = frozenset({"query_id", "text"})) -> Needs:
        return validate(self.name, self.stages, columns)

    def run(self, ctx: Context, queries: pa.Table, cache: StageCache | None = None, inputs: Inputs | None = None,
            hooks: Hooks | None = None) -> Result:
        """Validate, then run every stage on ``queries`` (the QUERIES contract). ``cache``:
        outputs already computed (default: a fresh one in memory); ``inputs``: what the keys
        cover besides the stages (default: :meth:`Inputs.of` the queries and ``ctx.store``,
        the files the stages read, and ``encoder`` / ``llm`` digests taken from ``ctx``);
        ``hooks``: where per-query work runs (default: batches in this process)."""
        needs = self.validate(frozenset(queries.column_names))
        if needs.encoder and ctx.encoder is None:
            raise PipelineError(f"pipeline {self.name!r} encodes queries: give its Context an encoder (Context(store, encoder=...)).")
        if needs.llm and ctx.llm is None:
            raise PipelineError(f"pipeline {self.name!r} asks the LLM: give its Context an LLM (Context(store, llm=...)).")
        if inputs is None:
            encoder = encoder_digest(ctx.embedder().config) if needs.encoder else None
            llm = None
            if needs.llm:
                service = ctx.llm_service()
                llm = (service.model_id, service.cfg.engine_digest(), templates_digest())
            inputs = Inputs.of(queries, ctx.store, encoder, llm, dict.fromkeys(needs.files))
        return run_stages(self.name, self.stages, ctx, queries, inputs, cache or StageCache(), hooks)


def parse_pipelines(spec: Any) -> dict[str, tuple[StageOptions, ...]]:
    """Named pipelines (run id -> stages) from their config form; ``ValueError`` names the
    pipeline, the stage and the option. Run ids name files and TREC tags: non-blank, no
    whitespace, no '/' or '@'."""
    if not isinstance(spec, Mapping) or not spec:
        raise ValueError("give at least one named pipeline (run id -> list of stages)")
    bad = [name for name in spec if not isinstance(name, str) or not name or name.split() != [name] or "/" in name or "@" in name]
    if bad:
        raise ValueError(f"pipeline names are run ids (file names, TREC tags): non-blank, no whitespace, no '/' or '@': {bad}")
    out = {}
    for name, specs in spec.items():
        try:
            out[name] = parse_stages(specs)
        except ValidationError as exc:  # name the pipeline, the stage and the option
            where = lambda loc: f"stage {loc[0] + 1} ({'.'.join(map(str, loc[1:]))})" if loc and isinstance(loc[0], int) else "stages"  # noqa: E731
            raise ValueError(f"pipeline {name!r}: " + "; ".join(
                f"{where(e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors(include_url=False))) from None
        except ValueError as exc:
            raise ValueError(f"pipeline {name!r}: {exc}") from None
    return out


def pipelines_file(path: str | Path) -> dict:
    """A pipelines YAML file's mapping of name -> stages (or under a ``pipelines:`` key), not yet parsed."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise PipelineError(f"pipelines file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise PipelineError(f"pipelines file {path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if isinstance(data, dict) and set(data) == {"pipelines"}:
        data = data["pipelines"]
    if not isinstance(data, dict) or not data:
        raise PipelineError(f"pipelines file {path}: expected a mapping of pipeline names to lists of stages.")
    return data


def read_pipelines(spec: Mapping[str, Any] | str | Path) -> dict[str, Pipeline]:
    """Named pipelines from a mapping (run id -> stages) or a pipelines YAML file, each validated."""
    data = pipelines_file(spec) if isinstance(spec, (str, Path)) else spec
    try:
        parsed = parse_pipelines(data)
    except ValueError as exc:
        raise PipelineError(first_line(str(exc))) from None
    out = {name: Pipeline(name, stages) for name, stages in parsed.items()}
    for pipeline in out.values():
        pipeline.validate()
    return out


class MethodOptions(BaseModel):
    """The flat options behind ``--method`` presets, set on the command line with
    ``--set KEY=VALUE`` (repeatable; ``logicrank stages`` lists them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query in each preset's run.")
    hybrid_depth: int = Field(100, ge=1, description="hybrid: depth of each fused list (at least k is used).")
    rrf_k: int = Field(60, ge=1, description="hybrid: the fusion constant.")
    itlr_mode: Literal["exact", "ann"] = Field("exact", description="itlr: exact (every document) or ann (re-score ANN candidates).")
    operators: str = Field("and=product,or=sum,not=complement", description="itlr: the fuzzy operators.")
    itlr_scorer: Literal["dense", "bm25", "hybrid"] = Field("dense", description="itlr: term evidence (dense cosines, BM25, hybrid).")
    calibration: Literal["none", "zscore", "sigmoid", "max", "saturation"] | None = Field(
        None, description="itlr: per-term score calibration (None: the scorer's default; sigmoid needs labels; max, saturation: bm25).")
    hybrid_weight: float = Field(0.5, ge=0.0, le=1.0, description="itlr scorer hybrid: the share of calibrated BM25 evidence in each term's score (not the hybrid preset's RRF).")
    calibration_sample: int = Field(10_000, ge=10, description="itlr zscore: documents sampled per term.")
    labels: str | None = Field(None, description="itlr sigmoid: JSONL of doc_id + present terms.")
    ann_k: int = Field(100, ge=1, description="itlr ann: candidates per term.")
    ann_nprobes: int | None = Field(None, ge=1, description="itlr ann: IVF partitions probed (none: LanceDB's default).")
    block_rows: int = Field(32768, ge=1, description="itlr exact: documents scored per block.")
    decompositions: str | None = Field(
        None, description="Decompositions table (`logicrank decompose`) for itlr, expansion and orlog; without it they ask the LLM.")
    orlog_base: Literal["bm25", "dense", "hybrid"] = Field("bm25", description="orlog/reasoner: the base retriever.")
    orlog_k: int = Field(20, ge=1, description="orlog/reasoner: candidates reranked per query.")
    orlog_context: bool = Field(True, description="orlog: put the candidate's text before each statement.")
    orlog_context_tokens: int = Field(256, ge=1, description="orlog: tokens of the candidate's text kept.")
    orlog_calibration: Literal["none", "content-free", "pool-mean"] = Field("none", description="orlog: logit calibration.")
    orlog_scorer: Literal["llm", "bm25", "dense"] = Field("llm", description="orlog: P(True) from the LLM, or a calibrated retrieval score.")
    orlog_score_calibration: Literal["max", "saturation", "zscore"] | None = Field(
        None, description="orlog bm25/dense: the retrieval score's calibration to P(True) (None: bm25 max, dense zscore).")
    orlog_reasoner: Literal["compiled", "problog"] = Field("compiled", description="orlog: compiled (exact, vectorised) or problog (reference).")


def method_options(overrides: Sequence[str] = (), **given: Any) -> MethodOptions:
    """Method options from ``KEY=VALUE`` overrides (``--set``) over ``given``; a wrong key or
    value is one line naming it (``none`` sets an optional option to None)."""
    values = dict(given)
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in MethodOptions.model_fields:
            raise PipelineError(f"--set {item!r}: give KEY=VALUE with KEY one of {', '.join(MethodOptions.model_fields)}.")
        optional = not MethodOptions.model_fields[key].is_required() and MethodOptions.model_fields[key].default is None
        values[key] = None if optional and value.strip().lower() in ("none", "null", "") else value.strip()
    try:
        return MethodOptions(**values)
    except ValidationError as exc:
        parts = [f"{'.'.join(map(str, e['loc']))}={e.get('input')}: {e['msg'].replace('Input should be', 'must be')}" for e in exc.errors(include_url=False)]
        raise PipelineError("method option " + "; ".join(parts)) from None


def from_methods(methods: Sequence[str], options: MethodOptions | None = None, run_tag: str | None = None) -> dict[str, tuple[StageOptions, ...]]:
    """``--method`` presets as named pipelines (run id ``<run_tag>-<method>`` or the method)."""
    options = options or MethodOptions()
    known = presets()
    if not methods:
        raise PipelineError(f"give at least one method; presets: {', '.join(sorted(known))}")
    if len(set(methods)) != len(methods):
        raise PipelineError(f"methods repeat: {list(methods)}")
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise PipelineError(f"unknown method {unknown[0]!r}; presets: {', '.join(sorted(known))} (or give --pipelines FILE)")
    try:
        return {f"{run_tag}-{m}" if run_tag else m: tuple(known[m](options)) for m in methods}
    except ValidationError as exc:  # a preset's stage rejects a value (e.g. sigmoid without labels)
        raise PipelineError(f"method options: {'; '.join(e['msg'].removeprefix('Value error, ') for e in exc.errors())}") from None


def describe() -> str:
    """Every registered stage (kind, docstring, options with defaults) and every preset, as
    Markdown: ``logicrank stages`` prints it, and docs/stages.md is this text."""
    lines = ["## Stages", ""]
    for name, cls in sorted(stages().items()):
        doc = " ".join((cls.__doc__ or "").split())
        extra = [f"requires query columns {sorted(cls.requires)}" if cls.requires else "",
                 "runs on the retrieval actor pool (per query)" if cls.per_query else ""]
        lines += [f"### `{name}` ({cls.kind.value})", "", doc + "".join(f" ({e})" for e in extra if e), ""]
        lines += ["| option | default | meaning |", "|---|---|---|"]
        for field, info in cls.Options.model_fields.items():
            if field == "stage":
                continue
            default = "required" if info.is_required() else json.dumps(info.default)
            lines.append(f"| `{field}` | `{default}` | {info.description or ''} |")
        lines.append("")
    lines += ["## Presets (`--method NAME`)", "", "Each builds a pipeline from the method options below; on the defaults:", ""]
    for name, fn in sorted(presets().items()):
        stages_ = fn(MethodOptions())
        lines.append(f"- `{name}`: " + " -> ".join(f"`{o.stage}`" for o in stages_))
    lines += ["", "## Method options (`logicrank retrieve --set KEY=VALUE`)", "", "| option | default | meaning |", "|---|---|---|"]
    for field, info in MethodOptions.model_fields.items():
        lines.append(f"| `{field}` | `{json.dumps(info.default)}` | {info.description or ''} |")
    return "\n".join(lines) + "\n"
