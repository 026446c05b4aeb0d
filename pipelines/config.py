"""The retrieve job's config: named pipelines over one table, validated by the stage
registry (a pipeline that cannot run fails here, before Ray starts or a model loads). It lives
above schemas/ because its pipelines are the registry's: schemas/ imports nothing from
pipelines/."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from logicrank.pipelines.options import StageOptions
from logicrank.pipelines.pipeline import parse_pipelines, read_presets, validate
from logicrank.schemas.config import EmbedConfig, LLMConfig, RayConfig, _Config


def with_option(value: Any, name: str, setting: Any) -> Any:
    """Stage options (a stage, or tuples of them, sub-pipelines included) with option ``name``
    set to ``setting`` in every stage that has it."""
    if isinstance(value, tuple):
        return tuple(with_option(v, name, setting) for v in value)
    if not isinstance(value, StageOptions):
        return value
    update = {f: with_option(getattr(value, f), name, setting) for f in type(value).model_fields if isinstance(getattr(value, f), tuple)}
    if name in type(value).model_fields:
        update[name] = setting
    return value.model_copy(update=update)


class RetrieveConfig(_Config):
    """`logicrank retrieve`: named pipelines of stages over one table, one run each.

    ``pipelines`` maps a run id to a list of stages (see pipelines/pipeline.py and
    docs/pipelines.md); its schema is the stage registry's. :meth:`preset` builds it from
    ``--method`` presets."""

    queries: str = Field(description="Queries: BEIR queries.jsonl, JSONL, Parquet, qid<TAB>text TSV (.tsv) or a TREC topics file.")
    topics_field: Literal["title", "desc", "narr"] = Field(
        "title", description="The field of a TREC topics file whose text is the query (title, desc or narr); only TREC topics files have one."
    )
    db: str
    table: str = "docs"
    pipelines: dict[str, tuple[Any, ...]] = Field(description="run id -> its stages.")
    table_version: int | str | None = Field(
        None, description="Read this version of the table (a number or a tag, e.g. nightly-2026-11-20); None: the latest."
    )
    embed: EmbedConfig = EmbedConfig()
    llm: LLMConfig = LLMConfig()
    ray: RayConfig = RayConfig()
    trec: bool = Field(False, description="Also write a TREC run file per pipeline.")
    on_parse_error: Literal["refuse", "fallback"] | None = Field(
        None, description="Every stage that takes on_parse_error (itlr): refuse a logical query that does not parse, or score its "
        "whole text as one term; set, it replaces each stage's own (None: each stage's, default refuse)."
    )

    @model_validator(mode="before")
    @classmethod
    def _parse_policy(cls, data):
        """``on_parse_error`` set: every stage that takes it, in every pipeline (fused ones
        too), gets it, so the stages' options (and their cache keys) say what ran."""
        if not isinstance(data, dict) or data.get("on_parse_error") not in ("refuse", "fallback") or "pipelines" not in data:
            return data  # a bad value or bad pipelines: the fields' own validation names them
        try:
            parsed = parse_pipelines(data["pipelines"])
        except ValueError:
            return data
        return {**data, "pipelines": {name: with_option(stages, "on_parse_error", data["on_parse_error"]) for name, stages in parsed.items()}}

    @field_validator("pipelines", mode="before")
    @classmethod
    def _stages(cls, v):
        return parse_pipelines(v)

    @model_validator(mode="after")
    def _whole(self):
        for name, stages in self.pipelines.items():
            validate(name, stages)
        return self

    @classmethod
    def preset(cls, methods: tuple[str, ...] | list[str] = ("dense",), run_tag: str | None = None, set: Any = None, **fields) -> RetrieveConfig:
        """A config from ``--method`` presets (pipelines/presets/), with the overrides ``set``
        (``{"orlog.k": 20}`` or ``["orlog.k=20"]``) and this config's own ``fields``."""
        return cls(pipelines=read_presets(tuple(methods), run_tag, set), **fields)
