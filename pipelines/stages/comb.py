"""Score fusion of sub-pipelines: CombSUM and CombMNZ over min-max normalised scores
(:mod:`logicrank.pipelines.methods.comb`)."""

from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, field_validator

from logicrank.pipelines.methods.comb import comb
from logicrank.pipelines.stages.base import Context, Kind, Output, Stage, StageOptions
from logicrank.pipelines.stages.registry import parse_stages, register


class CombOptions(StageOptions):
    stage: Literal["comb"] = "comb"
    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query in the fused run.")
    rule: Literal["sum", "mnz"] = Field("mnz", description="sum: CombSUM, the normalised scores summed; mnz: CombMNZ, that sum "
                                        "times the number of runs that retrieved the document.")
    of: tuple[tuple[Any, ...], ...] = Field(
        description="The sub-pipelines to fuse (at least one), each a list of stages ending in a run; each starts from this stage's queries."
    )

    @field_validator("of", mode="before")
    @classmethod
    def _parse(cls, v):
        if not v:
            raise ValueError("give at least one sub-pipeline to fuse")
        return tuple(parse_stages(p) for p in v)


@register
class Comb(Stage):
    """CombSUM / CombMNZ (Fox and Shaw, 1994): each sub-pipeline's scores min-max normalised
    per query, summed over the runs; CombMNZ multiplies the sum by the number of runs that
    retrieved the document."""

    name = "comb"
    kind = Kind.FUSION
    Options = CombOptions

    def children(self) -> tuple[tuple[StageOptions, ...], ...]:
        return self.options.of

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        return Output(run=comb(runs, self.options.k, self.options.rule))
