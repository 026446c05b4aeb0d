"""Rule retrieval: SIAR (a rewriter: the LLM's induced rule becomes the query) and R3 (a
reranker: the LLM reorders the retrieved rules listwise). Method logic in
:mod:`pipelines.methods.rules`; both generate on the job's one LLM pool."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.embed import document_text
from pipelines.llm import prompts as templates
from pipelines.methods import rules
from pipelines.methods.rules import R3Options, SiarOptions
from pipelines.stages.base import Context, Kind, Needs, Output, Stage
from pipelines.stages.registry import register
from schemas.tables import INDUCED_RULES, RERANK_WINDOWS


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
        # the rule is induced from the query's own text, also when an earlier rewriter changed it
        source = queries.column("original_text") if "original_text" in queries.column_names else queries.column("text")
        induced = rules.induce(ctx.llm_service(), queries.column("query_id").to_pylist(), source.to_pylist(), o)
        out = rules.rewrite(queries.set_column(queries.schema.get_field_index("text"), "text", source), induced, o.mode)
        status = Counter(induced.column("status").to_pylist())
        sums = {"prompt_tokens": "prompt_tokens", "cached_prompt_tokens": "cached_prompt_tokens", "generated_tokens": "generated_tokens",
                "llm_cache_hits": "cached"}
        counts = {"by_status": dict(status), "fallbacks": status["fallback"] + status["error"],
                  **{key: pc.sum(induced.column(col)).as_py() or 0 for key, col in sums.items()}}
        return Output(queries=out, side={"induced_rules": induced}, counts=counts)


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
        reranked, table = rules.rerank(ctx.llm_service(), {q: texts_of[q] for q in lists}, lists, texts, o)
        return Output(run=rules.to_run(reranked, o.k, "r3", "r3"), side={"rerank_windows": table}, counts=rules.window_counts(table, len(lists)))

