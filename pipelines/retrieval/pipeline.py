"""Pipelines as values: a list of stage options, validated as a whole before any work.

A pipeline config (YAML, see docs/pipelines.md) names several pipelines; each is a
list of stages, each stage written as ``name`` or ``{name: {options}}``. The schema is the
registry's: every registered stage's options model, picked by name (no list of methods is
kept here). ``--method X`` reads the preset pipeline file pipelines/retrieval/presets/X.yaml; ``--set
STAGE.OPTION=VALUE`` overrides any stage's option (:mod:`logicrank.pipelines.retrieval.overrides`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import ValidationError

from logicrank.pipelines.engines.embed import encoder_digest
from logicrank.pipelines.llm.prompts import templates_digest
from logicrank.pipelines.markdown import table
from logicrank.pipelines.retrieval.runner import Hooks, Inputs, Result, StageCache, run_stages
from logicrank.pipelines.retrieval.stages import Context, Kind, Needs, StageOptions, stages
from logicrank.pipelines.retrieval.stages.registry import build as build  # part of this module's API
from logicrank.pipelines.retrieval.stages.registry import (
    parse_stages as parse_stages,  # part of this module's API: pipelines from their config form
)
from logicrank.pipelines.retrieval.stages.registry import stages_type
from logicrank.schemas.errors import UserError, first_line, validation_line


class PipelineError(UserError, ValueError):
    """A pipeline whose stages do not fit together; the message names the pipeline, the
    stage and the fix."""


def validate(name: str, options: Sequence[StageOptions], columns: frozenset[str] = frozenset(), partial: bool = False) -> Needs:
    """Check the pipeline as a whole and return what it needs: each stage's input against what
    the stages before it produce (a reranker needs a run, orlog needs atoms), the pipeline
    ends in a run, and a retriever or fusion after a run scores that run's candidates or is
    refused (:meth:`Stage.after_run`). ``columns``: query columns available at its start.
    ``partial``: the start of a pipeline still being composed (``>>``), which need not end in a
    run yet."""
    if not options:
        raise PipelineError(f"pipeline {name!r} has no stages; give at least a retriever (e.g. dense).")
    needs, cols = Needs(), set(columns)
    made_run = None  # "stage i (name)" of the last stage that produced a run
    for i, o in enumerate(options, 1):
        stage = build(o)
        where = f"pipeline {name!r}, stage {i} ({o.stage})"
        if stage.kind is Kind.RERANKER and made_run is None:
            raise PipelineError(f"{where} reranks a run, but no stage before it produces one; put a retriever (e.g. bm25) before it.")
        if stage.kind in (Kind.RETRIEVER, Kind.FUSION) and made_run is not None and (instead := stage.after_run()) is not None:
            raise PipelineError(f"{where} comes after {made_run}, which produced a run, but {instead}: it would discard that run; "
                                f"put {o.stage} first, or fuse the two runs (rrf).")
        for col in sorted(set(stage.misreads) & cols):
            raise PipelineError(f"{where} cannot read queries that carry {col!r} (a stage before it, or the queries, add it): "
                                f"{stage.misreads[col]}.")
        missing = stage.requires - cols
        if missing:
            raise PipelineError(f"{where} needs query column(s) {sorted(missing)} that no stage before it adds; "
                                f"put a stage that adds them first (for atoms: decomposition with target orlog).")
        if stage.kind is Kind.FUSION:
            if not stage.children():
                raise PipelineError(f"{where} fuses no sub-pipelines (a fusion stage returns them from children()).")
            for j, sub in enumerate(stage.children(), 1):
                needs = needs | validate(f"{name}/{o.stage}[{j}]", sub, frozenset(cols))
        cols = (cols - stage.drops) | stage.adds
        if stage.kind is not Kind.REWRITER:  # a rewriter passes the run through
            made_run = f"stage {i} ({o.stage})"
        needs = needs | stage.needs()
    if made_run is None and not partial:
        raise PipelineError(f"pipeline {name!r} produces no run; end it with a retriever, a reranker or rrf.")
    return needs


@dataclass(frozen=True)
class Pipeline:
    """A named pipeline: stages that run in any process (:mod:`logicrank.pipelines.retrieval.runner`).

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

    def __rshift__(self, other: Any) -> Pipeline:
        """``pipeline >> stage`` (or ``>> pipeline``): :func:`compose`."""
        return compose(self, other)

    def __rrshift__(self, other: Any) -> Pipeline:
        return compose(other, self)

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


def compose(left: Any, right: Any) -> Pipeline:
    """``left >> right``: a pipeline of ``left``'s stages then ``right``'s, each a stage's options
    (``lr.bm25(k=100)``) or a :class:`Pipeline`, named by both names (``bm25-itlr``). Checked as
    it grows, left to right, by :func:`validate` (a reranker with no run before it is refused
    here); whether it ends in a run is checked when it runs."""
    parts = []
    for side in (left, right):
        if isinstance(side, Pipeline):
            parts.append((side.name, side.stages))
        elif isinstance(side, StageOptions):
            parts.append((side.stage, (side,)))
        else:
            raise PipelineError(f">> joins stages and pipelines (e.g. lr.bm25(k=100) >> lr.itlr(scorer='bm25')), not {type(side).__name__} {side!r:.60}.")
    pipeline = Pipeline(f"{parts[0][0]}-{parts[1][0]}", parts[0][1] + parts[1][1])
    validate(pipeline.name, pipeline.stages, frozenset({"query_id", "text"}), partial=True)
    return pipeline


# a stage's options compose too (``lr.bm25() >> lr.itlr()``); given here, where Pipeline is, as
# options.py is a leaf every stage imports
StageOptions.__rshift__ = lambda self, other: compose(self, other)  # type: ignore[method-assign]
StageOptions.__rrshift__ = lambda self, other: compose(other, self)  # type: ignore[attr-defined]


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
            raise ValueError(f"pipeline {name!r}: {validation_line(exc, stages_type(), where)}") from None
        except ValueError as exc:
            raise ValueError(f"pipeline {name!r}: {exc}") from None
    return out


def pipelines_file(path: str | Path) -> dict:
    """A pipelines YAML file's mapping of name -> stages (or under a ``pipelines:`` key), not yet parsed."""
    from logicrank.pipelines.files import read_yaml

    data = read_yaml(path, "pipelines file", PipelineError)
    if isinstance(data, dict) and set(data) == {"pipelines"}:
        data = data["pipelines"]
    if not isinstance(data, dict) or not data:
        raise PipelineError(f"pipelines file {path}: expected a mapping of pipeline names to lists of stages.")
    return data


def read_pipelines(spec: Mapping[str, Any] | str | Path, sets: Mapping[str, Any] | Sequence[str] | None = None) -> dict[str, Pipeline]:
    """Named pipelines from a mapping (run id -> stages) or a pipelines YAML file, with the
    overrides ``sets`` applied (``["orlog.k=20"]``), each validated."""
    data = pipelines_file(spec) if isinstance(spec, (str, Path)) else spec
    try:
        parsed = parse_pipelines(data)
    except ValueError as exc:
        raise PipelineError(first_line(str(exc))) from None
    if sets:
        parsed = with_sets(parsed, sets)
    out = {name: Pipeline(name, stages) for name, stages in parsed.items()}
    for pipeline in out.values():
        pipeline.validate()
    return out


PRESETS = Path(__file__).parent / "presets"
"""The ``--method`` presets: pipeline files that ship with the package, one per preset, named
as the pipeline each holds (pipelines/retrieval/presets/orlog.yaml holds the pipeline ``orlog``)."""


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def read_presets(methods: Sequence[str], run_tag: str | None = None, sets: Mapping[str, Any] | Sequence[str] | None = None,
                 k: int | None = None) -> dict[str, tuple[StageOptions, ...]]:
    """``--method`` presets as named pipelines (run id ``<run_tag>-<method>`` or the method),
    with ``sets`` applied (``orlog.k=20``: :mod:`logicrank.pipelines.retrieval.overrides`) and ``k``,
    every run's depth (``--k``)."""
    known = preset_names()
    if not methods:
        raise PipelineError(f"give at least one method; presets: {', '.join(known)}")
    if len(set(methods)) != len(methods):
        raise PipelineError(f"methods repeat: {list(methods)}")
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise PipelineError(f"unknown method {unknown[0]!r}; presets: {', '.join(known)} (or give --pipelines FILE)")
    out = {}
    for m in methods:
        (pipeline,) = read_pipelines(PRESETS / f"{m}.yaml").values()
        out[f"{run_tag}-{m}" if run_tag else m] = pipeline.stages
    return with_sets(out, sets, k)


def with_sets(pipelines: Mapping[str, Sequence[StageOptions]], sets: Mapping[str, Any] | Sequence[str] | None, k: int | None = None
              ) -> dict[str, tuple[StageOptions, ...]]:
    """``pipelines`` with the overrides ``sets`` applied (``["orlog.k=20"]`` or ``{"orlog.k": 20}``)
    and ``k``, every run's depth (``--k``: :func:`logicrank.pipelines.retrieval.overrides.depth_sets`),
    each pipeline validated again."""
    from logicrank.pipelines.retrieval.overrides import OverrideError, parse_sets, set_stage_options, with_depth

    given = parse_sets(sets)
    changes = with_depth(given, pipelines, k)
    try:
        out = set_stage_options(pipelines, changes) if changes else {n: tuple(s) for n, s in pipelines.items()}
    except OverrideError as exc:
        if any(key in str(exc) for key in set(changes) - set(given)):  # a key --k stands for: say so
            raise OverrideError(f"--k {k}: {exc}") from None
        raise
    for name, steps in out.items():
        validate(name, steps)
    return out


def describe() -> str:
    """Every registered stage (kind, docstring, options with defaults) and every preset, as
    Markdown: ``logicrank stages`` prints it, and docs/stages.md is this text."""
    lines = ["## Stages", ""]
    for name, cls in sorted(stages().items()):
        doc = " ".join((cls.__doc__ or "").split())
        extra = [f"requires query columns {sorted(cls.requires)}" if cls.requires else "",
                 "runs on the retrieval actor pool (per query)" if cls.per_query else ""]
        lines += [f"### `{name}` ({cls.kind.value})", "", doc + "".join(f" ({e})" for e in extra if e), ""]
        lines += table(["option", "default", "meaning"], (
            [f"`{field}`", f"`{'required' if info.is_required() else json.dumps(info.default)}`", info.description or ""]
            for field, info in cls.Options.model_fields.items() if field != "stage"))
        lines.append("")
    lines += ["## Presets (`--method NAME`)", "",
              "Each is a pipeline file in pipelines/retrieval/presets/; set any stage's option with `--set STAGE.OPTION=VALUE` "
              "(e.g. `--method orlog --set bm25.k=50`):", ""]
    for name, stages_ in read_presets(preset_names()).items():
        lines.append(f"- `{name}`: " + " -> ".join(f"`{o.stage}`" for o in stages_))
    return "\n".join(lines) + "\n"
