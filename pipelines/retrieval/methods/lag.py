"""LAG: logic-augmented generation (Xiao et al., PolyU; docs/lag.md).

A complex question is answered in four parts, for all questions of a batch at once:

1. **Decompose** (:func:`plan`): the LLM writes the question's atomic sub-questions in
   dependency order as a JSON list (decoded under a JSON schema); a later sub-question
   refers to an earlier one's answer as ``#k`` (1-based, MuSiQue's convention). A malformed
   or cut output falls back to the question itself as the one step (counted). The plan can
   also be the gold decomposition (oracle) or the question alone (standard RAG).
2. **Solve in order** (:func:`solve`): in each round every active chain takes its next
   sub-question; step 1 retrieves with the sub-question, step i+1 with
   ``"A_i: <answer i>, Q_{i+1}: <sub-question i+1, placeholders filled>"`` (or, the paper's
   ablation, the sub-question with its placeholders left in); top k (5) by the shared
   encoder; the LLM answers from those passages in a few words or writes ``unknown``. One
   batched retrieval and one batched LLM call per round, whatever the number of questions.
3. **Terminate** (the logical terminator, each rule configurable, the one that fired
   recorded): ``no_support`` (every top-k passage has cosine below ``min_support`` (0.3) to
   the filled sub-question), ``unanswerable`` (the LLM cannot answer a sub-question whose
   dependencies are all solved; one whose dependencies are not yet solved is deferred to the
   end of the plan, again while they are still to be tried and the chain has moved on since,
   and if they never get solved it is recorded and the chain goes on),
   ``redundant`` (more than ``redundant_share`` of a step's passages have cosine above
   ``redundancy`` (0.9) to a passage already in the context, a repeat included: the step's
   sub-question is still answered from them, then the chain stops; a retried deferred
   sub-question is exempt), ``budget`` (``t_max`` steps
   taken with sub-questions left). A chain that solves its plan stops as ``done``.
4. **Synthesise** (:func:`synthesise`): the LLM answers the question from the solved
   sub-answers and the chain's passages; a chain with unsolved parts also reads the whole
   question's own top k, first (the retrieval-grounded fallback).

The chain's passages, in the order they entered its context, are its run (score 1/rank),
so retrieval measures (supporting-paragraph recall) apply to it; the fallback's passages
are not part of it (they are listed in the answers table).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from logicrank.pipelines.answers import UNKNOWN, is_no_answer
from logicrank.pipelines.llm import prompts
from logicrank.pipelines.llm.engine import Constraint
from logicrank.pipelines.retrieval.options import StageOptions
from logicrank.schemas.tables import RUN

# The side tables its stage writes (the stage declares them; nothing else in logicrank reads them back).
# answers (side table of the lag stage): LAG's final answer, one row per question whatever stopped its chain
LAG_ANSWERS = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("answer", pa.string()),  # "" when the synthesis failed (see synthesis_status)
        pa.field("steps", pa.int32(), nullable=False),  # retrieval steps taken
        pa.field("stop_reason", pa.string(), nullable=False),  # done | no_support | unanswerable | redundant | budget | error
        pa.field("plan_status", pa.string(), nullable=False),  # ok | fallback | error (LLM plan) | gold | question
        pa.field("sub_questions", pa.list_(pa.string()), nullable=False),  # the plan, #k = the k-th sub-question's answer
        pa.field("solved", pa.int32(), nullable=False),  # sub-questions answered
        pa.field("fallback_doc_ids", pa.list_(pa.string()), nullable=False),  # the question's own top k the synthesis read first (unsolved parts)
        pa.field("synthesis_status", pa.string()),  # ok | error: ... | last_sub_answer | unsolved (no synthesis)
        pa.field("model", pa.string()),
        pa.field("prompt_shas", pa.string(), nullable=False),  # JSON: template -> sha of the prompts used
    ]
)

# lag_steps (side table of the lag stage): one row per (question, step) of a LAG chain
LAG_STEPS = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),  # 1-based, in the order taken
        pa.field("sub_index", pa.int32(), nullable=False),  # which sub-question of the plan (1-based)
        pa.field("sub_question", pa.string(), nullable=False),  # placeholders filled with the answers known then
        pa.field("retrieval_text", pa.string(), nullable=False),
        pa.field("doc_ids", pa.list_(pa.string()), nullable=False),  # the step's top k, best first
        pa.field("scores", pa.list_(pa.float64()), nullable=False),  # their cosines to the retrieval text
        pa.field("support", pa.float64(), nullable=False),  # the best cosine of a top-k passage to the sub-question
        pa.field("redundant_share", pa.float64(), nullable=False),  # share of the top k near-duplicating the context
        pa.field("sub_answer", pa.string()),
        pa.field("status", pa.string(), nullable=False),  # answered | deferred | unanswerable | no_support | redundant | error
        pa.field("error", pa.string()),
    ]
)


DECOMPOSE_TEMPLATE = "lag_decompose"
ANSWER_TEMPLATE = "lag_answer"
SYNTHESIS_TEMPLATE = "lag_synthesize"
PLACEHOLDER = re.compile(r"#(\d+)")
STOP_REASONS = ("done", "no_support", "unanswerable", "redundant", "budget", "error")
PLANS = ("llm", "gold", "question")


# ------------------------------------------------------------------------------ placeholders
def fill(question: str, answers: dict[int, str]) -> str:
    """``#k`` replaced by answer k where it is known; an unknown one is left as it is."""
    return PLACEHOLDER.sub(lambda m: answers.get(int(m.group(1)), m.group(0)), question)


def depends_on(question: str) -> set[int]:
    """The (1-based) sub-questions whose answers ``question`` refers to."""
    return {int(m) for m in PLACEHOLDER.findall(question)}


def retrieval_text(sub_question: str, index: int, answers: dict[int, str], previous: int | None, with_answer: bool) -> str:
    """What step ``index`` (the sub-question's 1-based place in the plan) retrieves with.
    ``with_answer`` (LAG): the sub-question with its placeholders filled, after
    ``"A_i: <answer i>, "`` of the last solved sub-question (``previous``) when there is one:
    ``"A_1: <answer 1>, Q_2: <sub-question 2>"`` in the plan's order; otherwise (the
    ablation) the sub-question as written, placeholders left in."""
    if not with_answer:
        return sub_question
    filled = fill(sub_question, answers)
    if previous is None:
        return filled
    return f"A_{previous}: {answers[previous]}, Q_{index}: {filled}"


# ------------------------------------------------------------------------------ options
class LagOptions(StageOptions):
    stage: Literal["lag"] = "lag"
    depth_option: ClassVar[str | None] = None  # k is passages per step, not the run's depth
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
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0: greedy, reproducible; above 0: answers drawn anew, never from the LLM cache; a rerun "
        "into the same --out still reuses its stage outputs).")

    @model_validator(mode="after")
    def _gold_fits(self):
        if self.sub_answers == "gold" and self.plan != "gold":
            raise ValueError("sub_answers: gold needs plan: gold (gold answers belong to the gold sub-questions)")
        if "gold" in (self.plan, self.sub_answers) and not self.gold:
            raise ValueError("plan or sub_answers 'gold' needs gold: the answers file holding the decompositions")
        return self

    def uses_llm(self) -> bool:
        return self.plan == "llm" or self.sub_answers == "llm" or self.synthesis


def answer_regex(words: int) -> str:
    """A short answer on one line: 1 to ``words`` words (bounded in words, as xgrammar
    compiles word repetitions quickly; see rules.rule_regex)."""
    return rf"[^\s]+(?: [^\s]+){{0,{words - 1}}}"


_JSON_STRING = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})+"'  # a non-empty JSON string: JSON's escapes, no control character


def decompose_regex(max_items: int) -> str:
    """A JSON list of 1 to ``max_items`` non-empty strings, whitespace allowed between them: a
    real model lays its list out over lines, and under compact JSON (no whitespace) Qwen wrote
    ``[",",",",",",","]`` for every question (issue 51)."""
    # a line break and an indent at most (no budget spent on whitespace), of JSON's whitespace: under \s, which is
    # Unicode's, SmolLM2 wrote no-break spaces after a string, and 89 of 100 HotpotQA plans failed to parse as JSON
    gap = r"[ \t\n\r]{0,8}"
    return rf"\[{gap}{_JSON_STRING}(?:{gap},{gap}{_JSON_STRING}){{0,{max_items - 1}}}{gap}\]"


# ------------------------------------------------------------------------------ chains
@dataclass
class Chain:
    """One question's progress through the rounds."""

    query_id: str
    question: str
    subs: list[str]  # the plan; sub-question j (1-based) is subs[j - 1]
    gold: list[str] | None = None  # gold sub-answers (oracle)
    plan_status: str = "ok"  # ok | fallback | error | gold | question
    pending: deque = field(default_factory=deque)  # 1-based indices, in solving order
    deferred: dict = field(default_factory=dict)  # sub-question -> how many were answered when it was last deferred
    answers: dict = field(default_factory=dict)  # 1-based index -> answer
    last_solved: int | None = None
    context: list = field(default_factory=list)  # doc ids, in the order they came in
    vectors: dict = field(default_factory=dict)  # doc id -> vector
    steps: list = field(default_factory=list)
    fallback: list = field(default_factory=list)  # the whole question's top k, for the synthesis of a chain with unsolved parts
    stop: str | None = None
    answer: str | None = None
    synthesis_status: str | None = None

    @property
    def refers(self) -> bool:
        """Whether its sub-questions' ``#k`` name earlier sub-questions (an LLM's checked plan or
        a gold one); in a question asked whole (a fallback, plan ``question``) "#1" is text."""
        return self.plan_status in ("ok", "gold")


@dataclass(frozen=True)
class Hit:
    doc_id: str
    score: float
    vector: np.ndarray


class Retriever:
    """What the chain needs from the index: the encoder and a batched top-k search."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:  # (n, dim), unit length
        raise NotImplementedError

    def search(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:  # best first, per row
        raise NotImplementedError


def parse_plan(text: str, max_items: int) -> tuple[list[str] | None, str | None]:
    """(sub-questions, None) for a JSON list of 1..max_items strings, each holding a word (a
    letter or a digit); (None, why) otherwise: a sub-question that is only punctuation (a real
    model's ``[","]``) would be retrieved as is and stop its chain at once."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg}): {text[:80]!r}"
    if not isinstance(value, list) or not value or not all(isinstance(s, str) and s.strip() for s in value):
        return None, f"not a list of sub-questions: {text[:80]!r}"
    if len(value) > max_items:
        return None, f"{len(value)} sub-questions (at most {max_items})"
    for i, sub in enumerate(value, 1):
        if not any(ch.isalnum() for ch in sub):
            return None, f"sub-question {i} has no word: {sub[:40]!r}"
        wrong = sorted(k for k in depends_on(sub) if not 1 <= k < i)
        if wrong:  # itself, a later one, one the plan lacks: never filled, or a cycle
            return None, f"sub-question {i} refers to #{wrong[0]}: a #k must name an earlier sub-question"
    return [" ".join(s.split()) for s in value], None


def plan(llm, query_ids: Sequence[str], questions: Sequence[str], s: LagOptions, gold: dict[str, list[dict]] | None = None,
         echo: Callable[[str], None] | None = None) -> list[Chain]:
    """One chain per question, in order, with its plan (never dropped: a failed or unusable
    decomposition falls back to the question as its one step, counted as ``fallback`` and
    named on the terminal with ``echo``)."""
    chains = []
    if s.plan == "llm":
        template = prompts.load(DECOMPOSE_TEMPLATE)
        gens = llm.generate(template, [{"question": " ".join(q.split())} for q in questions], Constraint("regex", decompose_regex(s.max_sub_questions)),
                            s.decompose_tokens, s.temperature, None, label="lag:decompose")
        unusable = []
        for qid, q, gen in zip(query_ids, questions, gens, strict=True):
            if isinstance(gen, Exception):
                chains.append(Chain(qid, q, [q], plan_status="error"))
                continue
            subs, why = parse_plan(gen.text, s.max_sub_questions)
            chains.append(Chain(qid, q, subs, plan_status="ok") if subs else Chain(qid, q, [q], plan_status="fallback"))
            if not subs:
                unusable.append(f"{qid}: {why}")
        if unusable and echo:
            echo(f"lag: {len(unusable)} of {len(chains)} plans unusable, those questions asked whole (e.g. {'; '.join(unusable[:2])})")
    elif s.plan == "gold":
        missing = [q for q in query_ids if not (gold or {}).get(q)]
        if missing:
            raise ValueError(f"lag: no gold decomposition for {len(missing)} question(s) (e.g. {missing[:3]}); the answers file must hold one for each.")
        for qid, q in zip(query_ids, questions, strict=True):
            steps = gold[qid]
            chains.append(Chain(qid, q, [st["question"] for st in steps], gold=[st["answer"] for st in steps], plan_status="gold"))
    elif s.plan == "question":
        chains = [Chain(qid, q, [q], plan_status="question") for qid, q in zip(query_ids, questions, strict=True)]
    else:
        raise ValueError(f"plan must be one of {PLANS}, not {s.plan!r}")
    for c in chains:
        order = list(range(1, len(c.subs) + 1))
        if s.order == "random":  # seeded per question: the same question gets the same order in every run
            random.Random(f"{s.seed}:{c.query_id}").shuffle(order)
        c.pending = deque(order)
    return chains


def _cos_max(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """For each row of ``new``, its largest cosine to a row of ``old`` (unit vectors)."""
    if len(old) == 0:
        return np.full(len(new), -1.0)
    return (new @ old.T).max(axis=1)


def solve(chains: list[Chain], retriever: Retriever, llm, passage_texts: Callable[[list[str]], dict[str, str]], s: LagOptions,
          echo: Callable[[str], None] | None = None) -> None:
    """Run the rounds until every chain has stopped; each round one batched encode, one
    batched search and (``answers="llm"``) one batched LLM call."""
    template = prompts.load(ANSWER_TEMPLATE)
    constraint = Constraint("regex", answer_regex(s.answer_words))
    rounds = 0
    while True:
        active = []
        for c in chains:
            if c.stop is not None:
                continue
            if not c.pending:  # every sub-question tried: done when each was answered (stop_unanswerable off, or a
                # dependency never solved, leaves unanswered ones behind)
                c.stop = "done" if len(c.answers) == len(c.subs) else "unanswerable"
            elif s.t_max is not None and len(c.steps) >= s.t_max:
                c.stop = "budget"
            else:
                active.append(c)
        if not active:
            return
        rounds += 1
        picks = [c.pending.popleft() for c in active]
        texts = [retrieval_text(c.subs[j - 1], j, c.answers, c.last_solved, s.retrieval_text == "answer") for c, j in zip(active, picks, strict=True)]
        filled = [fill(c.subs[j - 1], c.answers) for c, j in zip(active, picks, strict=True)]
        vectors = retriever.encode(texts + filled)  # one batch: retrieval texts, then the sub-questions for the support test
        hits = retriever.search(vectors[: len(texts)], s.k)
        sub_vectors = vectors[len(texts):]
        asking = []
        for n, (c, j) in enumerate(zip(active, picks, strict=True)):
            found = hits[n]
            hv = np.stack([h.vector for h in found]) if found else np.zeros((0, vectors.shape[1]), np.float32)
            support = float((hv @ sub_vectors[n]).max()) if len(found) else -1.0
            near = _cos_max(hv, np.stack([c.vectors[d] for d in c.context])) if c.context else np.full(len(found), -1.0)
            redundant_share = float((near > s.redundancy).mean()) if (s.redundancy is not None and len(found)) else 0.0
            step = {"query_id": c.query_id, "step": len(c.steps) + 1, "sub_index": j, "sub_question": filled[n], "retrieval_text": texts[n],
                    "doc_ids": [h.doc_id for h in found], "scores": [float(h.score) for h in found], "support": support,
                    "redundant_share": redundant_share, "sub_answer": None, "status": None}
            c.steps.append(step)
            if s.min_support is not None and support < s.min_support:
                step["status"], c.stop = "no_support", "no_support"
                continue
            # a retried (deferred) sub-question is exempt: its first look put its passages in the context
            saturated = s.redundancy is not None and bool(c.context) and redundant_share > s.redundant_share and j not in c.deferred
            for h in found:
                if h.doc_id not in c.vectors:
                    c.context.append(h.doc_id)
                    c.vectors[h.doc_id] = h.vector
            asking.append((c, j, step, saturated))
        if s.sub_answers == "gold":  # the oracle reader answers a sub-question once what it refers to is solved, as a model could
            replies = [chain.gold[j - 1] if not chain.refers or depends_on(chain.subs[j - 1]) <= chain.answers.keys() else UNKNOWN
                       for chain, j, _, _ in asking]
        elif not asking:
            replies = []
        else:
            texts_of = passage_texts(sorted({d for _, _, st, _ in asking for d in st["doc_ids"]}))
            values = [{"passages": _numbered([texts_of[d] for d in st["doc_ids"]]), "question": st["sub_question"]} for _, _, st, _ in asking]
            replies = llm.generate(template, values, constraint, s.answer_tokens, s.temperature, None, label=f"lag:round {rounds}")
        for (c, j, step, saturated), reply in zip(asking, replies, strict=True):
            if isinstance(reply, Exception):
                step["status"], c.stop = "error", "error"
                step["error"] = f"engine: {type(reply).__name__}: {reply}"
                continue
            answer = reply if isinstance(reply, str) else reply.text.strip()
            solved_deps = not c.refers or depends_on(c.subs[j - 1]) <= c.answers.keys()
            if answer and not is_no_answer(answer):
                step["status"], step["sub_answer"] = "answered", answer
                c.answers[j] = answer
                c.last_solved = j
            elif not solved_deps and (j not in c.deferred or (len(c.answers) > c.deferred[j]
                                                                and (depends_on(c.subs[j - 1]) - c.answers.keys()) & set(c.pending))):
                # it may become answerable once what it refers to is solved: deferred once, and again while what it refers to
                # is still to be tried and the chain moved on since (random order [3, 2, 1] of a chain 1 <- 2 <- 3: 3 is tried
                # again once 1 is answered, before 2 is; a gold plan whose references go round never moves on, and ends)
                step["status"] = "deferred"
                c.deferred[j] = len(c.answers)
                c.pending.append(j)
            elif s.stop_unanswerable and solved_deps:
                step["status"], c.stop = "unanswerable", "unanswerable"
            else:  # recorded; the chain goes on (the rule is off, or what it refers to was never solved)
                step["status"] = "unanswerable"
            if saturated and c.stop is None and c.pending:  # the step was answered from what it found; retrieval adds nothing new: stop
                c.stop = "redundant"
        if echo:
            echo(f"lag: round {rounds}: {len(active)} chains stepped, {sum(c.stop is None for c in chains)} still active")


def synthesis_passages(c: Chain, budget: int) -> list[str]:
    """The passages the synthesis reads: the question's own top k (a chain with unsolved
    parts: the retrieval-grounded fallback) first, then the chain's context first in first,
    ``budget`` in all, each once."""
    return list(dict.fromkeys([*c.fallback, *c.context]))[:budget]


def _numbered(texts: Sequence[str]) -> str:
    return "\n".join(f"[{i}] {t}" for i, t in enumerate(texts, 1))


def synthesise(chains: list[Chain], retriever: Retriever, llm, passage_texts: Callable[[list[str]], dict[str, str]], s: LagOptions) -> None:
    """Each chain's final answer. Without synthesis, the last solved sub-answer (``unknown``
    when none). With it, one batched LLM call: the question, each sub-question with its
    answer or "(unsolved)", and the chain's passages; a chain with an unsolved part first
    gets the whole question's top k added (one batched search)."""
    partial = [c for c in chains if len(c.answers) < len(c.subs)]
    if s.synthesis and partial:
        hits = retriever.search(retriever.encode([c.question for c in partial]), s.k)
        for c, found in zip(partial, hits, strict=True):
            c.fallback = [h.doc_id for h in found]
    if not s.synthesis:
        for c in chains:
            c.answer = c.answers[c.last_solved] if c.last_solved is not None else UNKNOWN
            c.synthesis_status = "last_sub_answer" if c.last_solved is not None else "unsolved"
        return
    template = prompts.load(SYNTHESIS_TEMPLATE)
    read = {c.query_id: synthesis_passages(c, s.synthesis_passages) for c in chains}
    texts_of = passage_texts(sorted({d for docs in read.values() for d in docs}))
    values = []
    for c in chains:
        solved = "\n".join(f"Q{j}: {fill(q, c.answers) if c.refers else q} A{j}: {c.answers.get(j, '(unsolved)')}" for j, q in enumerate(c.subs, 1))
        values.append({"question": " ".join(c.question.split()), "sub_answers": solved,
                       "passages": _numbered([texts_of[d] for d in read[c.query_id]]) or "(none)"})
    gens = llm.generate(template, values, Constraint("regex", answer_regex(s.answer_words)), s.answer_tokens, s.temperature, None, label="lag:synthesis")
    for c, gen in zip(chains, gens, strict=True):
        if isinstance(gen, Exception):
            c.answer, c.synthesis_status = "", f"error: engine: {type(gen).__name__}: {gen}"
        else:
            c.answer, c.synthesis_status = gen.text.strip(), "ok"


# ------------------------------------------------------------------------------ outputs
def tables(chains: list[Chain], model: str | None, run_id: str, s: LagOptions) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(answers, steps, run): one answer row per chain, one step row per step taken, the
    chain's passages ranked in the order they came in (the synthesis's fallback passages
    are not the chain's: they are in the answers table)."""
    used = {"decompose": (DECOMPOSE_TEMPLATE, s.plan == "llm"), "answer": (ANSWER_TEMPLATE, s.sub_answers == "llm"), "synthesis": (SYNTHESIS_TEMPLATE, s.synthesis)}
    shas = {name: prompts.load(t).sha for name, (t, asked) in used.items() if asked}
    answers = pa.Table.from_pylist([{
        "query_id": c.query_id, "answer": c.answer, "steps": len(c.steps), "stop_reason": c.stop, "plan_status": c.plan_status,
        "sub_questions": c.subs, "solved": len(c.answers), "fallback_doc_ids": c.fallback, "synthesis_status": c.synthesis_status, "model": model,
        "prompt_shas": json.dumps(shas, sort_keys=True),
    } for c in chains], schema=LAG_ANSWERS)
    steps = pa.Table.from_pylist([{**st, "error": st.get("error")} for c in chains for st in c.steps], schema=LAG_STEPS)
    rows = [{"query_id": c.query_id, "doc_id": d, "rank": r, "score": 1.0 / r, "method": "lag", "run_id": run_id}
            for c in chains for r, d in enumerate(c.context, 1)]
    return answers, steps, pa.Table.from_pylist(rows, schema=RUN)


def counts(chains: list[Chain]) -> dict:
    """The manifest's counts: stop reasons, plan statuses, steps per question."""
    steps = [len(c.steps) for c in chains]
    return {
        "questions": len(chains),
        "stop_reasons": dict(Counter(c.stop for c in chains)),
        "plan_status": dict(Counter(c.plan_status for c in chains)),
        "step_status": dict(Counter(st["status"] for c in chains for st in c.steps)),
        "steps_mean": float(np.mean(steps)) if steps else 0.0,
        "steps_max": max(steps, default=0),
    }
