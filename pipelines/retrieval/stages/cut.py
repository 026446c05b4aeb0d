"""Cut: keep each query's top k of the incoming run, a fixed k or one per query; restrict:
keep only the (query, document) pairs a file lists.

A per-query depth comes from a JSONL file with a line per query (``query_id`` or ``_id``)
and a field holding a number or a list (its length counts): e.g. the whole question's top
5 x hops of a multi-hop set, ``{cut: {depths: answers.jsonl, field: decomposition, times:
5}}``. Scores, ranks and every other column pass through unchanged.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from logicrank.pipelines.files import read_jsonl
from logicrank.pipelines.retrieval.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from logicrank.pipelines.retrieval.stages.registry import register
from logicrank.schemas.errors import UserError


class CutError(UserError, ValueError):
    """A depths file that cannot give every query its depth."""


class CutOptions(StageOptions):
    stage: Literal["cut"] = "cut"
    k: int | None = Field(None, ge=1, le=10_000, description="Keep each query's top k (or give depths).")
    depths: str | None = Field(None, description="A JSONL file giving each query its depth: times x the value of field (a list: its length).")
    field: str = Field("k", description="The depths file's field holding each query's depth.")
    times: int = Field(1, ge=1, le=10_000, description="Multiplies each query's value from the depths file.")

    @model_validator(mode="after")
    def _one(self):
        if (self.k is None) == (self.depths is None):
            raise ValueError("cut: give k or depths (one of them)")
        return self


@register
class Cut(Stage):
    """Keep each query's top k of the incoming run: a fixed k, or times x a per-query value
    read from a JSONL file."""

    name = "cut"
    kind = Kind.RERANKER
    Options = CutOptions
    reads = ("query_id",)  # every query the run holds, blank text or not

    def needs(self) -> Needs:
        return Needs(files=(self.options.depths,) if self.options.depths else ())

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        run, o = runs[0], self.options
        if o.k is not None:
            keep = pc.less_equal(run.column("rank"), o.k)
        else:
            depth = read_depths(o.depths, o.field, o.times)
            missing = sorted(set(run.column("query_id").to_pylist()) - set(depth))
            if missing:
                raise CutError(f"cut: {o.depths} gives no {o.field!r} for {len(missing)} quer(ies) of the run (e.g. {missing[:3]}).")
            keep = pc.less_equal(run.column("rank"), pa.array([depth[q] for q in run.column("query_id").to_pylist()], pa.int32()))
        kept = run.filter(keep)
        return Output(run=kept, counts={"rows_in": run.num_rows, "rows_kept": kept.num_rows})


def read_depths(path: str, field: str, times: int) -> dict[str, int]:
    """query id -> times x the line's ``field`` (a number, or a list's length)."""
    out = {}
    for n, row in read_jsonl(path, "cut:", CutError):
        try:
            qid = str(row["query_id"] if "query_id" in row else row["_id"])
            value = row[field]
            out[qid] = times * (len(value) if isinstance(value, list) else int(value))
        except (KeyError, TypeError, ValueError) as exc:
            raise CutError(f"cut: {path}: line {n} has no query id (query_id or _id) and {field!r} (a number or a list): {exc}") from None
    return out


class RestrictOptions(StageOptions):
    stage: Literal["restrict"] = "restrict"
    pairs: str = Field(description="A qrels file (BEIR TSV or TREC qrels, any relevance) listing each query's allowed documents.")


@register
class Restrict(Stage):
    """Keep only the incoming run's (query, document) pairs a qrels-format file lists, in the
    run's order, ranked again from 1: rank a query's own candidate set (a query the file
    lists no document for keeps none). ``listed_not_in_run`` counts the listed pairs of the
    run's queries that the incoming run lacks."""

    name = "restrict"
    kind = Kind.RERANKER
    Options = RestrictOptions
    reads = ("query_id",)

    def needs(self) -> Needs:
        return Needs(files=(self.options.pairs,))

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        from logicrank.pipelines.io import read_qrels

        run = runs[0].sort_by([("query_id", "ascending"), ("rank", "ascending")])
        allowed = read_qrels(self.options.pairs)
        key = pc.binary_join_element_wise(run.column("query_id"), run.column("doc_id"), "\t")
        keep = pc.is_in(key, pc.binary_join_element_wise(allowed.column("query_id"), allowed.column("doc_id"), "\t"))
        kept = run.filter(keep)
        listed = allowed.filter(pc.is_in(allowed.column("query_id"), run.column("query_id").unique()))
        qids = kept.column("query_id").to_numpy(zero_copy_only=False)
        starts = np.r_[True, qids[1:] != qids[:-1]] if len(qids) else np.zeros(0, dtype=bool)
        first = np.maximum.accumulate(np.where(starts, np.arange(len(qids)), 0))
        ranks = pa.array(np.arange(len(qids)) - first + 1, pa.int32())
        kept = kept.set_column(kept.schema.get_field_index("rank"), "rank", ranks)
        # a listed pair the incoming run lacks was cut before this stage (its first stage's k too small) or is not in the table
        return Output(run=kept, counts={"rows_in": run.num_rows, "rows_kept": kept.num_rows, "listed_not_in_run": listed.num_rows - kept.num_rows})
