"""LAG as a stage: questions in, the chains' passages out as a run, answers and steps as side
tables. The stage drives the rounds of all questions at once (pipelines/methods/lag.py):
each round is one batched encode and search on the job's encoder and table, and one batched
call on the job's LLM pool; never a job or an engine call per question or per step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from pipelines.embed import document_text, to_matrix
from pipelines.llm import prompts as templates
from pipelines.methods import lag
from pipelines.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from pipelines.stages.registry import register
from schemas.errors import UserError
from schemas.tables import LAG_ANSWERS, LAG_STEPS


class LagOptions(StageOptions):
    stage: Literal["lag"] = "lag"
    k: int = Field(5, ge=1, le=100, description="Passages retrieved per step (and for the fallback of a chain with unsolved parts).")
    t_max: int | None = Field(3, ge=1, le=20, description="Step budget: a chain stops ('budget') after this many steps (None: no budget).")
    plan: Literal["llm", "gold", "question"] = Field(
        "llm", description="Sub-questions from the LLM, from the gold file's decomposition (oracle), or the question alone as one step (standard RAG)."
    )
    sub_answers: Literal["llm", "gold"] = Field("llm", description="Sub-answers from the LLM, or the gold file's (oracle; needs plan: gold).")
    gold: str | None = Field(None, description="Answers file with each question's gold decomposition (answers.jsonl of `logicrank prepare-qa musique`).")
    retrieval_text: Literal["answer", "question"] = Field(
        "answer", description="Step i+1 retrieves with 'A_i: <answer>, Q_{i+1}: <sub-question, filled>' (LAG) or the sub-question as written (the ablation)."
    )
    order: Literal["given", "random"] = Field("given", description="Solve the sub-questions in the plan's order, or shuffled per question (the ablation).")
    seed: int = Field(0, description="Seed of the random order.")
    min_support: float | None = Field(0.3, description="Stop ('no_support') when every top-k passage has cosine below this to the sub-question (None: off).")
    redundancy: float | None = Field(0.9, description="A new passage is redundant above this cosine to the context (None: the rule is off).")
    redundant_share: float = Field(0.5, ge=0, lt=1, description="Stop ('redundant') when more than this share of a step's passages are redundant.")
    stop_unanswerable: bool = Field(True, description="Stop ('unanswerable') when the LLM cannot answer a sub-question whose dependencies are solved.")
    max_sub_questions: int = Field(4, ge=1, le=10, description="Longest plan the decomposition's JSON schema allows.")
    decompose_tokens: int = Field(160, ge=16, description="Token budget of the decomposition; a cut output falls back to the question.")
    answer_words: int = Field(12, ge=1, le=50, description="Longest (sub-)answer, in words (constrained decoding).")
    answer_tokens: int = Field(32, ge=4, description="Token budget of a (sub-)answer.")
    passage_tokens: int = Field(96, ge=8, le=1_000, description="Each passage cut to this many tokens in a prompt.")
    synthesis: bool = Field(True, description="Answer the question from the sub-answers and passages (False: the last sub-answer is the answer).")
    synthesis_passages: int = Field(10, ge=1, le=50, description="Passages of the chain's context the synthesis prompt reads, first in first.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0: greedy, reproducible).")

    @model_validator(mode="after")
    def _gold_fits(self):
        if self.sub_answers == "gold" and self.plan != "gold":
            raise ValueError("sub_answers: gold needs plan: gold (gold answers belong to the gold sub-questions)")
        if "gold" in (self.plan, self.sub_answers) and not self.gold:
            raise ValueError("plan or sub_answers 'gold' needs gold: the answers file holding the decompositions")
        return self

    def uses_llm(self) -> bool:
        return self.plan == "llm" or self.sub_answers == "llm" or self.synthesis


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
        o = self.options
        s = lag.LagSettings(
            k=o.k, t_max=o.t_max, plan=o.plan, answers=o.sub_answers, with_answer=o.retrieval_text == "answer", order=o.order, seed=o.seed,
            min_support=o.min_support, redundancy=o.redundancy, redundant_share=o.redundant_share, stop_unanswerable=o.stop_unanswerable,
            max_sub_questions=o.max_sub_questions, decompose_tokens=o.decompose_tokens, answer_words=o.answer_words, answer_tokens=o.answer_tokens,
            synthesis=o.synthesis, synthesis_passages=o.synthesis_passages, temperature=o.temperature,
        )
        llm = ctx.llm_service() if o.uses_llm() else None
        qids, texts = queries.column("query_id").to_pylist(), queries.column("text").to_pylist()
        gold = read_decompositions(o.gold, qids) if o.plan == "gold" else None
        retriever = StoreRetriever(ctx.store, ctx.embedder())

        def passage_texts(doc_ids: list[str]) -> dict[str, str]:
            rows = ctx.store.rows_for(doc_ids, ["title", "text"]).to_pylist()
            return templates.cut_to_tokens(ctx.llm_model, {r["doc_id"]: document_text(r["title"], r["text"] or "") for r in rows}, o.passage_tokens)

        chains = lag.plan(llm, qids, texts, s, gold)
        lag.solve(chains, retriever, llm, passage_texts, s, echo=ctx.echo)
        lag.synthesise(chains, retriever, llm, passage_texts, s)
        answers, steps, run = lag.tables(chains, llm.model_id if llm else None, "lag", s)
        return Output(run=run, side={"answers": answers, "lag_steps": steps}, counts=lag.counts(chains))


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
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                steps = obj.get("decomposition") or []
                if not isinstance(steps, list) or not all(isinstance(st, dict) and isinstance(st.get("question"), str) and isinstance(st.get("answer"), str)
                                                          for st in steps):
                    raise ValueError("each decomposition step needs a question and an answer (strings)")
                qid = str(obj["query_id"])
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
                raise LagError(f"lag: {path}: line {n} is not an answers line with query_id and a decomposition ({exc}).") from None
            if steps:
                out[qid] = steps
    missing = [q for q in query_ids if q not in out]
    if missing:
        raise LagError(f"lag: {path} holds no gold decomposition for {len(missing)} question(s) (e.g. {missing[:3]}); "
                       "plan: gold needs one per question (MuSiQue's answers.jsonl from `logicrank prepare-qa musique`).")
    return out
