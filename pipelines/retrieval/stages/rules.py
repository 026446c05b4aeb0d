"""Rule retrieval: SIAR (a rewriter: the LLM's induced rule becomes the query), R3 (a
reranker: the LLM reorders the retrieved rules listwise) and reasoning with the retrieved
rules (``reason``: the LLM answers each query given the run's top rules). Method logic in
:mod:`logicrank.pipelines.retrieval.methods.rules`; all three generate on the job's one LLM pool."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.engines.embed import document_text
from logicrank.pipelines.files import read_jsonl
from logicrank.pipelines.llm import prompts as templates
from logicrank.pipelines.retrieval.methods import rules
from logicrank.pipelines.retrieval.methods.rules import (
    INDUCED_RULES,
    RERANK_WINDOWS,
    RULE_ANSWERS,
    R3Options,
    ReasonOptions,
    SiarOptions,
)
from logicrank.pipelines.retrieval.stages.base import Context, Kind, Needs, Output, Stage
from logicrank.pipelines.retrieval.stages.registry import register
from logicrank.pipelines.retrieval.stages.shards import in_shards
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import question_column


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
        source = queries.column(question_column(queries))
        induced = rules.induce(ctx.llm_service(), queries.column("query_id").to_pylist(), source.to_pylist(), o)
        out = rules.rewrite(queries.set_column(queries.schema.get_field_index("text"), "text", source), induced, o.mode)
        status = Counter(induced.column("status").to_pylist())
        sums = {"prompt_tokens": "prompt_tokens", "cached_prompt_tokens": "cached_prompt_tokens", "generated_tokens": "generated_tokens",
                "llm_cache_hits": "cached"}
        counts = {"by_status": dict(status), "fallbacks": status["fallback"] + status["error"],
                  **{key: pc.sum(induced.column(col)).as_py() or 0 for key, col in sums.items()}}
        return Output(queries=out, side={"induced_rules": induced}, counts=counts)


R3_ORDER = pa.schema([("query_id", pa.string()), ("doc_ids", pa.list_(pa.string()))])  # a shard of R3: each query's new order


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
        column = question_column(queries)
        texts_of = dict(zip(queries.column("query_id").to_pylist(), queries.column(column).to_pylist(), strict=True))

        def compute(shards: list[list[str]]) -> list[dict[str, pa.Table]]:
            """A wave of shards: its rules read and cut, its windows on the pool (each step one batch for the wave)."""
            asked = {q: lists[q] for shard in shards for q in shard}
            top = sorted({d for docs in asked.values() for d in docs[: o.n]})
            docs = ctx.store.rows_for(top, ["title", "text"]).to_pylist()
            texts = templates.cut_to_tokens(ctx.llm_model, {d["doc_id"]: document_text(d["title"], d["text"] or "") for d in docs}, o.doc_tokens)
            reranked, table = rules.rerank(ctx.llm_service(), {q: texts_of[q] for q in asked}, asked, texts, o)
            return [{"order": pa.table({"query_id": shard, "doc_ids": [reranked[q] for q in shard]}, schema=R3_ORDER),
                     "rerank_windows": table.filter(pc.is_in(table.column("query_id"), pa.array(shard, pa.string())))} for shard in shards]

        tables, sharding = in_shards(ctx, list(lists), compute, self.name)  # by shards of the run's queries, resumable
        reranked = {q: docs for t in tables for q, docs in zip(*(t["order"].column(c).to_pylist() for c in R3_ORDER.names), strict=True)}
        table = pa.concat_tables([t["rerank_windows"] for t in tables] or [RERANK_WINDOWS.empty_table()])
        return Output(run=rules.to_run(reranked, o.k, "r3", "r3"), side={"rerank_windows": table},
                      counts=rules.window_counts(table, len(lists)) | sharding)




class ReasonError(UserError, ValueError):
    """The answers file a reason stage reads lacks a query or cannot be read."""


@register
class Reason(Stage):
    """Reasoning with retrieved rules (the SIAR paper's reasoning table): the LLM answers each
    query in one line given the incoming run's top ``rules`` documents as rules (0: none). Put
    it after a retriever (vanilla top 1), after SIAR or R3, or after ``qrels`` (the gold rule).
    The run passes through unchanged; side table ``answers`` (one row per query: the answer,
    the rule ids shown, status), which ``qa_measures`` score against the set's gold outputs."""

    name = "reason"
    side_tables = {"answers": RULE_ANSWERS}
    kind = Kind.RERANKER
    Options = ReasonOptions

    def needs(self) -> Needs:
        return Needs(llm=frozenset({"generate"}), files=(self.options.gold,) if self.options.gold else ())

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        o = self.options
        run = runs[0].sort_by([("query_id", "ascending"), ("rank", "ascending")])
        top: dict[str, list[str]] = {}
        for q, d in zip(run.column("query_id").to_pylist(), run.column("doc_id").to_pylist(), strict=True):
            if len(top.setdefault(q, [])) < o.rules:
                top[q].append(d)
        qids = queries.column("query_id").to_pylist()
        column = question_column(queries)
        questions, instructions = queries.column(column).to_pylist(), [""] * len(qids)
        if o.gold:
            given = read_inputs(o.gold, qids)
            questions, instructions = [given[q][0] for q in qids], [given[q][1] for q in qids]
        ids = [top.get(q, []) for q in qids]
        docs = ctx.store.rows_for(sorted({d for r in ids for d in r}), ["title", "text"]).to_pylist() if o.rules else []
        texts = templates.cut_to_tokens(ctx.llm_model, {d["doc_id"]: document_text(d["title"], d["text"] or "") for d in docs}, o.doc_tokens) if docs else {}
        values = rules.reason_values(questions, instructions, [[texts[d] for d in r] for r in ids])
        table = rules.reason(ctx.llm_service(), qids, values, ids, o)
        status = Counter(table.column("status").to_pylist())
        counts = {"by_status": dict(status), "with_rules": sum(1 for r in ids if r), "prompt_tokens": pc.sum(table.column("prompt_tokens")).as_py() or 0,
                  "generated_tokens": pc.sum(table.column("generated_tokens")).as_py() or 0, "llm_cache_hits": pc.sum(table.column("cached")).as_py() or 0}
        return Output(run=runs[0], side={"answers": table}, counts=counts)


def read_inputs(path: str, query_ids: list[str]) -> dict[str, tuple[str, str]]:
    """query_id -> (question as given, instruction) from an answers file; every query must have one."""
    out = {}
    for n, row in read_jsonl(path, "reason:", ReasonError, "with query_id and question"):
        try:
            out[str(row["query_id"])] = (str(row["question"]), str(row.get("instruction") or ""))
        except (KeyError, TypeError) as exc:
            raise ReasonError(f"reason: {path}: line {n} is not an answers line with query_id and question ({exc}).") from None
    missing = [q for q in query_ids if q not in out]
    if missing:
        raise ReasonError(f"reason: {path} has no question for {len(missing)} query(ies), e.g. {missing[:3]}; "
                          "give the answers.jsonl `logicrank prepare-rulebench` wrote for these queries.")
    return out
