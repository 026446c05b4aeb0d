"""Pipelines as values: a list of stage options, validated as a whole before any work.

A pipeline config (YAML, see docs/pipelines.md) names several pipelines; each is a
list of stages, each stage written as ``name`` or ``{name: {options}}``. The schema is the
registry's: every registered stage's options model, picked by name (no list of methods is
kept here). ``--method X`` builds the preset pipeline X registered beside its stage.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines.stages import Kind, Needs, Stage, StageOptions, presets, stage_class, stages
from pipelines.stages.registry import parse_stages as parse_stages  # part of this module's API: pipelines from their config form
from schemas.errors import UserError


class PipelineError(UserError, ValueError):
    """A pipeline whose stages do not fit together; the message names the pipeline, the
    stage and the fix."""


def build(options: StageOptions) -> Stage:
    return stage_class(options.stage)(options)


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
            for j, sub in enumerate(o.of, 1):
                needs = needs | validate(f"{name}/{o.stage}[{j}]", sub, frozenset(cols))
        cols |= stage.adds
        have_run = have_run or stage.kind in (Kind.RETRIEVER, Kind.FUSION)
        needs = needs | stage.needs()
    if not have_run:
        raise PipelineError(f"pipeline {name!r} produces no run; end it with a retriever, a reranker or rrf.")
    return needs


class MethodOptions(BaseModel):
    """The flat options behind ``--method`` presets (the command line's retrieve options)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int = Field(100, ge=1, le=10_000)
    hybrid_depth: int = Field(100, ge=1, description="Depth of each list fused by hybrid.")
    rrf_k: int = Field(60, ge=1)
    itlr_mode: Literal["exact", "ann"] = "exact"
    operators: str = "and=product,or=sum,not=complement"
    calibration: Literal["none", "zscore", "sigmoid"] = "none"
    calibration_sample: int = Field(10_000, ge=10)
    labels: str | None = None
    ann_k: int = Field(100, ge=1)
    ann_nprobes: int | None = Field(None, ge=1)
    block_rows: int = Field(32768, ge=1)
    decompositions: str | None = None
    orlog_base: Literal["bm25", "dense", "hybrid"] = "bm25"
    orlog_k: int = Field(20, ge=1)
    orlog_context: bool = True
    orlog_context_tokens: int = Field(256, ge=1)
    orlog_calibration: Literal["none", "content-free", "pool-mean"] = "none"
    orlog_reasoner: Literal["compiled", "problog"] = "compiled"


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
    lines += ["## Presets (`--method NAME`)", "", "Each builds a pipeline from the method options of `logicrank retrieve`; on the defaults:", ""]
    for name, fn in sorted(presets().items()):
        stages_ = fn(MethodOptions())
        lines.append(f"- `{name}`: " + " -> ".join(f"`{o.stage}`" for o in stages_))
    return "\n".join(lines) + "\n"
