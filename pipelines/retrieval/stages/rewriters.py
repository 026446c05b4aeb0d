"""Rewriters: the LLM's decomposition of each query, read from a decompositions table (from
`logicrank decompose`) or generated on the job's LLM service.

- ``decomposition`` (target itlr): the logical query over text terms replaces the query's.
- ``decomposition`` (target orlog): atoms about ``{x}`` and a form over their ids (``atoms``,
  ``logical_query``), for the ``orlog`` reranker.
- ``expansion``: the LLM's reasoning about what an answer contains replaces the query text
  (the BRIGHT-style baseline: ``expansion`` then ``dense``).

Every query keeps its row: an unusable output is a fallback carrying the raw question, and
``decomposition_status`` says which.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from logicrank.pipelines.llm.decompose import KINDS, DecomposeSettings, apply_to_queries, decompose, read_decompositions
from logicrank.pipelines.retrieval.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from logicrank.pipelines.retrieval.stages.registry import register
from logicrank.pipelines.retrieval.stages.shards import in_shards
from logicrank.schemas.tables import DECOMPOSITIONS, QUERIES, question_column

# the kinds that give a query a logical form (the rest, free text, are the expansion stage's)
TARGETS = tuple(name for name, kind in KINDS.items() if "logical_query" in kind.columns)


class DecompositionOptions(StageOptions):
    stage: Literal["decomposition"] = "decomposition"
    target: Literal[TARGETS] = Field(description="itlr: a logical query over text terms; orlog: atoms and a form over their ids.")
    decompositions: str | None = Field(None, description="A decompositions table to read (Parquet from `logicrank decompose`, or "
                                       "hand-written JSON Lines: docs/orlog.md); None: generate on the job's LLM.")
    constrained: bool = Field(True, description="LLM: decode under the grammar (itlr) or JSON schema (orlog).")
    max_tokens: int | None = Field(None, ge=8, description="LLM: token budget (None: the target's own, "
                                   + ", ".join(f"{KINDS[t].max_tokens} for {t}" for t in TARGETS) + ").")
    max_term_chars: int | None = Field(None, ge=1, description="LLM, itlr: longest term the grammar allows.")
    temperature: float = Field(0.0, ge=0, description="LLM: sampling temperature (0: greedy, reproducible; above 0: answers drawn anew, never from the "
        "LLM cache; a rerun into the same --out still reuses its stage outputs).")

    _table_or_llm = model_validator(mode="after")(lambda self: _table_or_llm(self))


class ExpansionOptions(StageOptions):
    stage: Literal["expansion"] = "expansion"
    decompositions: str | None = Field(None, description="A decompositions table to read; None: generate on the job's LLM.")
    max_tokens: int = Field(256, ge=8, description="LLM: token budget of the reasoning text.")
    temperature: float = Field(0.0, ge=0, description="LLM: sampling temperature (0: greedy, reproducible; above 0: answers drawn anew, never from the "
        "LLM cache; a rerun into the same --out still reuses its stage outputs).")

    _table_or_llm = model_validator(mode="after")(lambda self: _table_or_llm(self))


def _table_or_llm(options: StageOptions) -> StageOptions:
    """The LLM options apply when the stage generates: refuse them beside a table."""
    if options.decompositions:
        fields = type(options).model_fields
        set_ = sorted(f for f in ("constrained", "max_tokens", "max_term_chars", "temperature") if f in fields and getattr(options, f) != fields[f].default)
        if set_:
            raise ValueError(f"{options.stage}: {set_} apply when the LLM generates; with a decompositions table, leave them out")
    return options


class _Rewriter(Stage):
    kind = Kind.REWRITER
    method: str  # the decompositions table's method
    side_tables = {"decompositions": DECOMPOSITIONS}

    def needs(self) -> Needs:
        if self.options.decompositions:
            return Needs(files=(self.options.decompositions,))
        return Needs(llm=frozenset({"generate"}))

    def _settings(self) -> DecomposeSettings:
        o = self.options
        budget = o.max_tokens or KINDS[self.method].max_tokens
        return DecomposeSettings(
            methods=(self.method,), constrained=getattr(o, "constrained", True), max_tokens=((self.method, budget),),
            max_term_chars=getattr(o, "max_term_chars", None), temperature=o.temperature,
        )

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        if self.options.decompositions:
            table = read_decompositions(self.options.decompositions, self.method)
            side, sharding = {}, {}
        else:
            table, sharding = self._generate(ctx, queries)
            side = {"decompositions": table}
        out = apply_to_queries(queries, table, self.method)
        asked = set(queries.column("query_id").to_pylist())  # a decompose table may hold other methods' rows and other queries
        ours = [r for r in table.select(["query_id", "method", "status", "error"]).to_pylist() if r["method"] == self.method and r["query_id"] in asked]
        unusable = [f"{r['query_id']}: {r['error']}" for r in ours if r["status"] in ("degenerate", "fallback", "error")]
        if unusable and ctx.echo:  # named, as blank queries and empty terms are: the question itself stands in for each
            echo_unusable(ctx.echo, self.name, unusable, len(ours))
        return Output(queries=out, side=side, counts={"by_status": dict(Counter(out.column("decomposition_status").to_pylist())), **sharding})

    def _generate(self, ctx: Context, queries: pa.Table) -> tuple[pa.Table, dict]:
        """The LLM's decompositions, by shards of the queries (pipelines/retrieval/stages/shards.py), each
        written as it finishes so a killed job resumes from them; one row per query, in order."""
        llm, settings = ctx.llm_service(), self._settings()
        # the question as asked, where a stage before rewrote the text (siar's rule): a decomposition is of the question
        text_of = dict(zip(queries.column("query_id").to_pylist(), queries.column(question_column(queries)).to_pylist(), strict=True))

        def compute(wave: list[list[str]]) -> list[dict[str, pa.Table]]:
            asked = [q for shard in wave for q in shard]
            table = decompose(llm, asked, [text_of[q] for q in asked], settings)  # one call of the pool per method for the wave
            return [{"decompositions": table.filter(pc.is_in(table.column("query_id"), pa.array(shard, pa.string())))} for shard in wave]

        tables, sharding = in_shards(ctx, list(text_of), compute, self.name)
        table = pa.concat_tables([t["decompositions"] for t in tables]) if tables else DECOMPOSITIONS.empty_table()
        return table, sharding


def echo_unusable(echo, stage: str, unusable: list[str], total: int) -> None:
    echo(f"{stage}: {len(unusable)} of {total} outputs unusable (unparsed, degenerate or failed), the question used instead "
         f"(e.g. {'; '.join(u[:120] for u in unusable[:2])}); counts in the manifest's by_status")


@register
class Decomposition(_Rewriter):
    """The LLM's decomposition of each query: for itlr, a logical query over text terms that
    replaces the query's own; for orlog, atoms about {x} and a form over their ids (adds
    ``atoms``). Read from a decompositions table, or generated on the job's LLM."""

    name = "decomposition"
    Options = DecompositionOptions

    @property
    def method(self) -> str:
        return self.options.target

    @property
    def adds(self) -> frozenset[str]:
        return frozenset(KINDS[self.options.target].columns) - set(QUERIES.names)  # orlog: atoms

    @property
    def drops(self) -> frozenset[str]:
        """itlr's logical query replaces an OrLog form: the atoms of an earlier decomposition are
        no longer what the query's form is over."""
        return frozenset({"atoms"}) - self.adds


@register
class Expansion(_Rewriter):
    """The LLM's reasoning about what an answer contains replaces the query text (the
    BRIGHT-style baseline: expansion then dense). Read from a decompositions table, or
    generated on the job's LLM (free text, within max_tokens)."""

    name = "expansion"
    Options = ExpansionOptions
    method = "reasoning"
    adds = frozenset({"original_text"})  # the question as asked, which a later LLM stage reads
