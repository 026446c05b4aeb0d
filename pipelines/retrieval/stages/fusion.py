"""Reciprocal-rank fusion of sub-pipelines (``hybrid`` is rrf of dense and bm25)."""

from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, field_validator

from logicrank.pipelines.retrieval.methods.hybrid import rrf
from logicrank.pipelines.retrieval.stages.base import Context, Kind, Output, Stage, StageOptions
from logicrank.pipelines.retrieval.stages.registry import parse_stages, register


class FusionOptions(StageOptions):
    """The options every fusion stage has: the sub-pipelines it fuses and the fused run's depth."""

    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query in the fused run.")
    of: tuple[tuple[Any, ...], ...] = Field(
        description="The sub-pipelines to fuse (at least one), each a list of stages ending in a run; each starts from this stage's queries."
    )

    @field_validator("of", mode="before")
    @classmethod
    def _parse(cls, v):
        if not v:
            raise ValueError("give at least one sub-pipeline to fuse")
        if isinstance(v, str | dict) or not isinstance(v, list | tuple):
            raise ValueError(f"of is a list of sub-pipelines (each a list of stages), not {type(v).__name__}")
        return tuple(parse_stages(p) for p in v)


class FusionStage(Stage):
    """A stage over its sub-pipelines' runs (:class:`FusionOptions`)."""

    kind = Kind.FUSION

    def children(self) -> tuple[tuple[StageOptions, ...], ...]:
        return self.options.of

    def after_run(self) -> str | None:
        return "it fuses the runs of its own sub-pipelines (put the first stage in its of)"


class RRFOptions(FusionOptions):
    stage: Literal["rrf"] = "rrf"
    rrf_k: int = Field(60, ge=1, description="The fusion constant: score(d) = sum of 1 / (rrf_k + rank).")


@register
class RRF(FusionStage):
    """score(d) = sum over the sub-pipelines' runs of 1 / (rrf_k + rank(d)); absent adds 0."""

    name = "rrf"
    Options = RRFOptions

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        return Output(run=rrf(runs, self.options.k, self.options.rrf_k))
