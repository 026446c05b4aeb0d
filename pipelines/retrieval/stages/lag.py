"""LAG as a stage: questions in, the chains' passages out as a run, answers and steps as side
tables. The stage drives the rounds of all questions at once (pipelines/retrieval/methods/lag.py):
each round is one batched encode and search on the job's encoder and table, and one batched
call on the job's LLM pool; never a job or an engine call per question or per step."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.engines.embed import document_text, to_matrix
from logicrank.pipelines.files import read_jsonl
from logicrank.pipelines.llm import prompts as templates
from logicrank.pipelines.retrieval.methods import lag
from logicrank.pipelines.retrieval.methods.lag import LAG_ANSWERS, LAG_STEPS, LagOptions
from logicrank.pipelines.retrieval.stages.base import Context, Kind, Needs, Output, Stage
from logicrank.pipelines.retrieval.stages.registry import register
from logicrank.pipelines.retrieval.stages.shards import in_shards
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import RUN, question_column


class LagError(UserError, ValueError):
    """The gold file lacks what an oracle LAG run needs."""


@register
class Lag(Stage):
    """LAG (logic-augmented generation): decompose each question into ordered sub-questions,
    solve them in rounds with answer-conditioned retrieval, stop by the logical terminator,
    synthesise the answer. Output: the run (each chain's passages, in the order they came
    in), side tables ``answers`` (one row per question) and ``lag_steps`` (one per step);
    counts of stop reasons and steps per question. With ``plan: gold, sub_answers: gold,
    synthesis: false`` it needs no LLM (the oracle measurement)."""

    name = "lag"
    side_tables = {"answers": LAG_ANSWERS, "lag_steps": LAG_STEPS}
    kind = Kind.RETRIEVER
    Options = LagOptions

    def needs(self) -> Needs:
        o = self.options
        return Needs(encoder=True, llm=frozenset({"generate"}) if o.uses_llm() else frozenset(), files=(o.gold,) if o.gold else ())

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        o = s = self.options  # the method reads the stage's options as they are
        llm = ctx.llm_service() if o.uses_llm() else None
        # the question as asked, where a stage before rewrote the text (siar's rule, an expansion's reasoning)
        qids, texts = queries.column("query_id").to_pylist(), queries.column(question_column(queries)).to_pylist()
        gold = read_decompositions(o.gold, qids) if o.plan == "gold" else None
        retriever = StoreRetriever(ctx.store, ctx.embedder())

        def passage_texts(doc_ids: list[str]) -> dict[str, str]:
            rows = ctx.store.rows_for(doc_ids, ["title", "text"]).to_pylist()
            return templates.cut_to_tokens(ctx.llm_model, {r["doc_id"]: document_text(r["title"], r["text"] or "") for r in rows}, o.passage_tokens)

        text_of = dict(zip(qids, texts, strict=True))

        def compute(shards: list[list[str]]) -> list[dict[str, pa.Table]]:
            """A wave of shards, its questions' rounds stepped together; each shard's rows of the three tables."""
            asked = [q for shard in shards for q in shard]
            chains = lag.plan(llm, asked, [text_of[q] for q in asked], s, gold, echo=ctx.echo)
            lag.solve(chains, retriever, llm, passage_texts, s, echo=ctx.echo)
            lag.synthesise(chains, retriever, llm, passage_texts, s)
            answers, steps, run = lag.tables(chains, llm.model_id if llm else None, "lag", s)
            tables = {"run": run, "answers": answers, "lag_steps": steps}  # the run first: a shard's main table
            return [{name: t.filter(pc.is_in(t.column("query_id"), pa.array(shard, pa.string()))) for name, t in tables.items()} for shard in shards]

        # by shards of the questions, resumable, when the LLM is asked (the oracle, without it, runs in one pass)
        done, sharding = in_shards(ctx if llm is not None else replace(ctx, checkpoint=None), qids, compute, self.name)
        run, answers, steps = (pa.concat_tables([d[name] for d in done] or [schema.empty_table()])
                               for name, schema in (("run", RUN), ("answers", LAG_ANSWERS), ("lag_steps", LAG_STEPS)))
        return Output(run=run, side={"answers": answers, "lag_steps": steps}, counts=counts_of(answers, steps) | sharding)


def counts_of(answers: pa.Table, steps: pa.Table) -> dict:
    """The manifest's counts (as :func:`logicrank.pipelines.retrieval.methods.lag.counts` gives them from the
    chains), from the tables: shards read back from a checkpoint hold no chains."""
    taken = answers.column("steps").to_pylist()
    return {
        "questions": answers.num_rows,
        "stop_reasons": dict(Counter(answers.column("stop_reason").to_pylist())),
        "plan_status": dict(Counter(answers.column("plan_status").to_pylist())),
        "step_status": dict(Counter(steps.column("status").to_pylist())),
        "steps_mean": float(np.mean(taken)) if taken else 0.0,
        "steps_max": max(taken, default=0),
    }


class StoreRetriever(lag.Retriever):
    """The chain's retriever on the job's table and encoder: exact cosine top k (ANN when
    the table has an index), the passages' vectors with them for the terminator's tests."""

    def __init__(self, store, embedder):
        self.store, self.embedder = store, embedder

    def encode(self, texts):
        return self.embedder.encode(list(texts))

    def search(self, vectors: np.ndarray, k: int) -> list[list[lag.Hit]]:
        out: list[list[lag.Hit]] = [[] for _ in range(len(vectors))]
        if len(vectors) == 0:
            return out
        t = self.store.vector_search(vectors, k, with_vectors=True)
        t = t.sort_by([("query_index", "ascending"), ("score", "descending")])
        mat = to_matrix(t.column("vector"))
        for i, (q, d, sc) in enumerate(zip(t.column("query_index").to_pylist(), t.column("doc_id").to_pylist(), t.column("score").to_pylist(), strict=True)):
            out[q].append(lag.Hit(d, sc, mat[i]))
        return out


def read_decompositions(path: str | Path, query_ids: list[str]) -> dict[str, list[dict]]:
    """query_id -> [{"question", "answer"}, ...] from an answers file; every asked question must have one."""
    out = {}
    for n, obj in read_jsonl(path, "lag:", LagError, "with query_id and a decomposition"):
        try:
            steps = obj.get("decomposition") or []
            if not isinstance(steps, list) or not all(isinstance(st, dict) and isinstance(st.get("question"), str) and isinstance(st.get("answer"), str)
                                                      for st in steps):
                raise ValueError("each decomposition step needs a question and an answer (strings)")
            qid = str(obj["query_id"])
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise LagError(f"lag: {path}: line {n} is not an answers line with query_id and a decomposition ({exc}).") from None
        if steps:
            out[qid] = steps
    missing = [q for q in query_ids if q not in out]
    if missing:
        raise LagError(f"lag: {path} holds no gold decomposition for {len(missing)} question(s) (e.g. {missing[:3]}); "
                       "plan: gold needs one per question (MuSiQue's answers.jsonl from `logicrank prepare-qa musique`).")
    return out
