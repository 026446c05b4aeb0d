"""Rule retrieval: SIAR (a rewriter: the LLM's induced rule becomes the query) and R3 (a
reranker: the LLM reorders the retrieved rules listwise). Method logic in
:mod:`pipelines.methods.rules`; both generate on the job's one LLM pool."""

from __future__ import annotations

from collections import Counter
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from pipelines.embed import document_text
from pipelines.llm import prompts as templates
from pipelines.methods import rules
from pipelines.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from pipelines.stages.registry import register
from schemas.tables import INDUCED_RULES, RERANK_WINDOWS


class SiarOptions(StageOptions):
    stage: Literal["siar"] = "siar"
    mode: Literal["rule", "rule+query"] = Field(
        "rule", description="The query's new text: the induced rule alone (best for dense in the paper) or the rule then the query (best for sparse)."
    )
    constrained: bool = Field(True, description="Decode under the 'If ..., then ...' regex (bounded in words).")
    max_tokens: int = Field(96, ge=8, description="Token budget of the rule; an output cut there falls back to the query.")
    condition_words: int = Field(40, ge=1, le=200, description="Longest 'If' clause the regex allows, in words.")
    conclusion_words: int = Field(30, ge=1, le=200, description="Longest 'then' clause the regex allows, in words.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0: greedy, reproducible).")


@register
class Siar(Stage):
    """SIAR: the LLM induces a hypothetical abstract rule from each query (few-shot: sum up
    the facts, typed variables for the entities, "If ..., then ..."), which replaces the
    query's text or goes before it. A malformed or cut output falls back to the query
    (counted; the row is kept). Adds ``original_text``, ``induced_rule`` and
    ``induction_status``; side table ``induced_rules``."""

    name = "siar"
    side_tables = {"induced_rules": INDUCED_RULES}
    kind = Kind.REWRITER
    Options = SiarOptions
    adds = frozenset({"original_text", "induced_rule", "induction_status"})

    def needs(self) -> Needs:
        return Needs(llm=frozenset({"generate"}))

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        o = self.options
        settings = rules.InduceSettings(o.constrained, o.max_tokens, o.condition_words, o.conclusion_words, o.temperature)
        # the rule is induced from the query's own text, also when an earlier rewriter changed it
        source = queries.column("original_text") if "original_text" in queries.column_names else queries.column("text")
        induced = rules.induce(ctx.llm_service(), queries.column("query_id").to_pylist(), source.to_pylist(), settings)
        out = rules.rewrite(queries.set_column(queries.schema.get_field_index("text"), "text", source), induced, o.mode)
        status = Counter(induced.column("status").to_pylist())
        sums = {"prompt_tokens": "prompt_tokens", "cached_prompt_tokens": "cached_prompt_tokens", "generated_tokens": "generated_tokens",
                "llm_cache_hits": "cached"}
        counts = {"by_status": dict(status), "fallbacks": status["fallback"] + status["error"],
                  **{key: pc.sum(induced.column(col)).as_py() or 0 for key, col in sums.items()}}
        return Output(queries=out, side={"induced_rules": induced}, counts=counts)


class R3Options(StageOptions):
    stage: Literal["r3"] = "r3"
    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query.")
    n: int = Field(20, ge=2, le=1_000, description="Rerank the incoming run's top n; deeper documents keep their order after them.")
    window: int = Field(20, ge=2, le=100, description="Rules the LLM reads at once.")
    stride: int | None = Field(None, ge=1, le=100, description="Step between windows, back to front (None: half the window; RankGPT: 20 and 10).")
    doc_tokens: int = Field(
        96, ge=1, le=1_000, description="Each rule's text cut to this many tokens (a window's prompt must fit the LLM's context, or the window keeps its order and counts as an error)."
    )
    constrained: bool = Field(True, description="Decode under the permutation syntax ([i] > [j] > ...).")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0: greedy, reproducible).")

    @model_validator(mode="after")
    def _stride_fits(self):
        if self.stride is not None and self.stride > self.window:
            raise ValueError(f"stride ({self.stride}) must not exceed window ({self.window})")
        return self


@register
class R3(Stage):
    """R3: the LLM reads the query and the top n retrieved rules, [1] to [n], and writes
    them reordered by whether the query's facts instantiate the rule and it helps answer
    the question (RankGPT-style listwise). Sliding windows over deeper lists, back to
    front. The output is decoded under the permutation syntax and parsed whatever it holds
    (repeats and unknown identifiers dropped, missing ones appended in their previous
    order). Reads ``original_text`` when a ``siar`` stage rewrote the query. Side table
    ``rerank_windows``; the manifest counts windows, tokens and repairs per query."""

    name = "r3"
    side_tables = {"rerank_windows": RERANK_WINDOWS}
    kind = Kind.RERANKER
    Options = R3Options

    def needs(self) -> Needs:
        return Needs(llm=frozenset({"generate"}))

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        o = self.options
        run = runs[0].select(["query_id", "doc_id", "rank"]).sort_by([("query_id", "ascending"), ("rank", "ascending")])
        lists: dict[str, list[str]] = {}
        for q, d in zip(run.column("query_id").to_pylist(), run.column("doc_id").to_pylist(), strict=True):
            lists.setdefault(q, []).append(d)
        column = "original_text" if "original_text" in queries.column_names else "text"
        texts_of = dict(zip(queries.column("query_id").to_pylist(), queries.column(column).to_pylist(), strict=True))
        top = sorted({d for docs in lists.values() for d in docs[: o.n]})
        docs = ctx.store.rows_for(top, ["title", "text"]).to_pylist()
        texts = templates.cut_to_tokens(ctx.llm_model, {d["doc_id"]: document_text(d["title"], d["text"] or "") for d in docs}, o.doc_tokens)
        settings = rules.RerankSettings(o.n, o.window, o.stride or max(1, o.window // 2), o.constrained, o.temperature)
        reranked, table = rules.rerank(ctx.llm_service(), {q: texts_of[q] for q in lists}, lists, texts, settings)
        return Output(run=rules.to_run(reranked, o.k, "r3", "r3"), side={"rerank_windows": table}, counts=rules.window_counts(table, len(lists)))

