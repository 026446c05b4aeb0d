"""Score fusion of sub-pipelines: CombSUM and CombMNZ over min-max normalised scores
(:mod:`logicrank.pipelines.methods.comb`)."""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
from pydantic import Field

from logicrank.pipelines.methods.comb import comb
from logicrank.pipelines.stages.base import Context, Output
from logicrank.pipelines.stages.fusion import FusionOptions, FusionStage
from logicrank.pipelines.stages.registry import register


class CombOptions(FusionOptions):
    stage: Literal["comb"] = "comb"
    rule: Literal["sum", "mnz"] = Field("mnz", description="sum: CombSUM, the normalised scores summed; mnz: CombMNZ, that sum "
                                        "times the number of runs that retrieved the document.")


@register
class Comb(FusionStage):
    """CombSUM / CombMNZ (Fox and Shaw, 1994): each sub-pipeline's scores min-max normalised
    per query, summed over the runs; CombMNZ multiplies the sum by the number of runs that
    retrieved the document."""

    name = "comb"
    Options = CombOptions

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        return Output(run=comb(runs, self.options.k, self.options.rule))
