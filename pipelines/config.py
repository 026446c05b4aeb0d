"""The retrieve job's config: named pipelines over one table, validated by the stage
registry (a pipeline that cannot run fails here, before Ray starts or a model loads). It lives
above schemas/ because its pipelines are the registry's: schemas/ imports nothing from
pipelines/."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipelines.pipeline import MethodOptions, from_methods, parse_pipelines, validate
from schemas.config import EmbedConfig, LLMConfig, RayConfig, _Config


class RetrieveConfig(_Config):
    """`logicrank retrieve`: named pipelines of stages over one table, one run each.

    ``pipelines`` maps a run id to a list of stages (see pipelines/pipeline.py and
    docs/pipelines.md); its schema is the stage registry's. :meth:`preset` builds it from
    ``--method`` names."""

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
    def preset(cls, methods: tuple[str, ...] | list[str] = ("dense",), run_tag: str | None = None, **fields) -> RetrieveConfig:
        """A config from ``--method`` presets: ``fields`` holds this config's own fields and
        the presets' flat options (:class:`pipelines.pipeline.MethodOptions`)."""
        own = {k: fields.pop(k) for k in list(fields) if k in cls.model_fields}
        return cls(pipelines=from_methods(tuple(methods), MethodOptions(**fields), run_tag), **own)
