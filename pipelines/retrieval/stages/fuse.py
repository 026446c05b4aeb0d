"""Fusion of sub-pipelines through ranx: its methods and normalisations, and weights optimised
on a qrels file (:mod:`logicrank.pipelines.retrieval.methods.fuse`)."""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
from pydantic import Field, model_validator

from logicrank.pipelines.retrieval.methods import fuse as fusion
from logicrank.pipelines.retrieval.stages.base import Context, Needs, Output
from logicrank.pipelines.retrieval.stages.fusion import FusionOptions, FusionStage
from logicrank.pipelines.retrieval.stages.registry import register


class FuseOptions(FusionOptions):
    stage: Literal["fuse"] = "fuse"
    method: Literal[fusion.METHODS] = Field(  # type: ignore[valid-type]
        "sum", description="ranx's fusion method: sum (CombSUM), mnz (CombMNZ), max, min, med, anz, gmnz, isr, log_isr, logn_isr, "
        "rrf, rbc, bordafuse, condorcet; weighted: wsum, wmnz, w_bordafuse, w_condorcet, mixed.")
    norm: Literal[fusion.NORMS] = Field(  # type: ignore[valid-type]
        "min-max", description="Each run's scores per query before fusing: min-max, max (over the query's largest score, which "
        "must be above 0), sum, zmuv (z-score), rank (1 - (rank - 1) / n, n the query's documents), borda, or none. "
        "ranx's min-max maps a query's one document, or scores all equal, to 0: under sum such a document adds nothing from that "
        "run, under mnz it still counts among the runs that hold it (its sum times their number).")
    weights: tuple[float, ...] | None = Field(
        None, description="Weighted methods: one weight per sub-pipeline, in order (default equal); not with optimize.")
    parameter: float | None = Field(None, description="gmnz's gamma, logn_isr's sigma, rrf's k or rbc's phi (default ranx's; gmnz and rbc have none: give it or optimize).")
    optimize: str | None = Field(
        None, description="A qrels file (TREC or BEIR TSV) to pick the weights (or the parameter) on, by metric: use training "
        "queries, not those you report.")
    metric: str = Field("ndcg@10", description="optimize: the measure to maximise, in ranx's names (ndcg@10, map@100, mrr, recall@100) "
                        "or the project's (nDCG@10, MAP@100, MRR, R@100).")
    step: float = Field(0.1, gt=0.0, le=0.5, description="optimize: the grid step between weights.")

    @model_validator(mode="after")
    def _fits(self):
        m = self.method
        if len(self.of) < 2:
            raise ValueError("fuse fuses two sub-pipelines or more; one is its own run")
        if self.weights is not None:
            if m not in fusion.WEIGHTED:
                raise ValueError(f"method {m} takes no weights (weighted: {', '.join(fusion.WEIGHTED)})")
            if len(self.weights) != len(self.of):
                raise ValueError(f"{len(self.weights)} weights for {len(self.of)} sub-pipelines; give one per sub-pipeline")
            if self.optimize:
                raise ValueError("give weights or optimize, not both")
        if self.parameter is not None and m not in fusion.PARAMETER:
            raise ValueError(f"method {m} takes no parameter (those that do: "
                             + ", ".join(f"{k} ({v})" for k, v in fusion.PARAMETER.items()) + ")")
        if problem := fusion.parameter_problem(m, self.parameter):
            raise ValueError(problem.removeprefix("fuse: "))
        if m in fusion.REQUIRED and self.parameter is None and not self.optimize:
            raise ValueError(fusion.missing_parameter(m).removeprefix("fuse: "))
        if self.optimize and m not in fusion.OPTIMIZABLE:
            raise ValueError(f"method {m} has nothing to optimise (those that do: {', '.join(fusion.OPTIMIZABLE)})")
        if self.optimize and self.parameter is not None:
            raise ValueError("give parameter or optimize, not both")
        fusion.ranx_metric(self.metric)  # a metric ranx does not know is refused here, before any sub-pipeline runs
        return self


@register
class Fuse(FusionStage):
    """ranx's fusion of the sub-pipelines' runs: each run normalised per query (``norm``),
    combined by ``method`` (CombSUM, CombMNZ, weighted sums, rank-based and voting methods),
    each query's top k kept; weights or a method's parameter given, or optimised on a qrels
    file (``optimize``, by ``metric``). A document a run did not retrieve adds nothing."""

    name = "fuse"
    Options = FuseOptions

    def needs(self) -> Needs:
        return Needs(files=(self.options.optimize,) if self.options.optimize else ())

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        o = self.options
        weights, parameter, counts = o.weights, o.parameter, {"method": o.method, "norm": o.norm}
        if o.optimize:
            from logicrank.pipelines.io import read_qrels

            best, n = fusion.optimize(runs, read_qrels(o.optimize), o.method, o.norm, o.metric, o.step)
            weights, parameter = best.get("weights"), best.get("parameter")
            counts |= {"optimized_on_queries": n, "metric": o.metric, **best}
        return Output(run=fusion.fuse(runs, o.k, o.method, o.norm, weights, parameter), counts=counts)
