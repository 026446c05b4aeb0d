"""SIAR and R3: rule retrieval by self-induction and listwise relevance re-estimation
(ACL 2025, arXiv 2505.10870).

Queries state concrete facts and ask a question; the corpus holds abstract rules with typed
variables ("If Person X owns Animal Y, then Person X can feed Animal Y").

- **SIAR** (:func:`induce`, :func:`rewrite`): before retrieval the LLM induces a
  hypothetical rule from the query, few-shot (sum up the facts, replace concrete entities
  by typed variables, state the relation as "If ..., then ..."). The output is decoded under
  a regex of that shape, bounded in words (:func:`rule_regex`); an output that is not such a
  rule (cut at max_tokens, or unconstrained and malformed) falls back to the query, is
  counted, and the query keeps its row. The rule replaces the query's text (``rule``) or
  goes before it (``rule+query``).
- **R3** (:func:`rerank`): the LLM reads the query and a window of retrieved rules with
  short identifiers ([1], [2], ...) and writes them reordered, RankGPT style; windows slide
  from the back of the top n to its front (:func:`windows`). The output is decoded under the
  permutation syntax (:func:`permutation_regex`) and read by :func:`parse_permutation`,
  which accepts any string and always returns a permutation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from logicrank.pipelines.llm import prompts
from logicrank.pipelines.llm.engine import Constraint, Generation
from logicrank.pipelines.retrieval.options import StageOptions
from logicrank.schemas.tables import INDUCED_QUERY, RUN, question_column

# The side tables its stage writes (the stage declares them; nothing else in logicrank reads them back).
# induced_rules: SIAR's hypothetical rule per query; never dropped
INDUCED_RULES = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),  # model id (name@checksum)
        pa.field("prompt_sha", pa.string(), nullable=False),  # the prompt template's hash
        pa.field("raw_output", pa.string()),  # what the model wrote (null on error)
        pa.field("rule", pa.string()),  # the induced rule (null unless status is ok)
        pa.field("status", pa.string(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("cached_prompt_tokens", pa.int32(), nullable=False),
        pa.field("generated_tokens", pa.int32(), nullable=False),
        pa.field("cached", pa.bool_(), nullable=False),  # read from the persistent LLM cache
    ]
)

# rerank_windows: R3's listwise LLM calls, one row per (query, window)
RERANK_WINDOWS = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("window", pa.int32(), nullable=False),  # 0 = the first sent (the deepest)
        pa.field("start", pa.int32(), nullable=False),  # 0-based positions [start, end) of the list reordered
        pa.field("end", pa.int32(), nullable=False),
        pa.field("raw_output", pa.string()),  # null on error
        pa.field("permutation", pa.list_(pa.int32()), nullable=False),  # 1-based identifiers, best first, after repair
        pa.field("unknown", pa.int32(), nullable=False),  # identifiers outside the window, dropped
        pa.field("duplicate", pa.int32(), nullable=False),  # identifiers repeated, dropped
        pa.field("missing", pa.int32(), nullable=False),  # identifiers never named, appended in their previous order
        pa.field("status", pa.string(), nullable=False),  # ok | repaired | error (the window kept its order)
        pa.field("error", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("cached_prompt_tokens", pa.int32(), nullable=False),
        pa.field("generated_tokens", pa.int32(), nullable=False),
        pa.field("cached", pa.bool_(), nullable=False),
    ]
)

# One row per query of a rule-reasoning stage (``reason``): the answer the LLM gave with the
# rules it was shown (none, the gold rule, a run's top 1, ...). QA evaluation reads query_id
# and answer, as it reads LAG's answers.
RULE_ANSWERS = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("answer", pa.string()),  # "" on an engine error
        pa.field("status", pa.string(), nullable=False),  # ok | length (cut at max_tokens) | error
        pa.field("rule_ids", pa.list_(pa.string()), nullable=False),  # the rules in the prompt, in order
        pa.field("error", pa.string()),
        pa.field("model", pa.string()),
        pa.field("prompt_sha", pa.string(), nullable=False),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("generated_tokens", pa.int64(), nullable=False),
        pa.field("cached", pa.bool_(), nullable=False),
    ]
)


INDUCE_TEMPLATE = "siar_induce"
RERANK_TEMPLATE = "r3_rerank"
MODES = ("rule", "rule+query")

# a finished rule: "If <condition>, then <conclusion>." on one line, up to its first full stop before
# a space or the end (one inside a word, "3.5" or "U.S.,", does not; an unconstrained model may explain
# itself after its rule; the constrained regex's words hold no full stop)
_CLAUSE = r"\S(?:[^.\n]|\.(?=[^\s]))*?"
RULE = re.compile(rf"If {_CLAUSE}, then {_CLAUSE}\.(?=\s|$)")


def rule_regex(condition_words: int = 40, conclusion_words: int = 30) -> str:
    """The "If ..., then ..." shape as a regex for constrained decoding, bounded in words.

    Words, not characters: xgrammar compiles a bounded repetition of a character class by
    unrolling it (measured with SmolLM2's tokenizer: 1.0 s for 200 characters per clause,
    1.9 s for 400 + 300), but a bounded repetition of a word pattern in about 0.05 s
    whatever the bound. A word is any run of characters other than white space and '.',
    so the rule ends at its one full stop."""
    word = r"[^\s.]+"
    return rf"If {word}(?: {word}){{0,{condition_words - 1}}}, then {word}(?: {word}){{0,{conclusion_words - 1}}}\."


class SiarOptions(StageOptions):
    stage: Literal["siar"] = "siar"
    mode: Literal["rule", "rule+query"] = Field(
        "rule", description="The query's new text: the induced rule alone (best for dense in the paper) or the rule then the query (best for sparse)."
    )
    constrained: bool = Field(True, description="Decode under the 'If ..., then ...' regex (bounded in words).")
    max_tokens: int = Field(96, ge=8, description="Token budget of the rule; an output cut there falls back to the query.")
    condition_words: int = Field(40, ge=1, le=200, description="Longest 'If' clause the regex allows, in words.")
    conclusion_words: int = Field(30, ge=1, le=200, description="Longest 'then' clause the regex allows, in words.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0: greedy, reproducible; above 0: answers drawn anew, never from the LLM cache; a rerun "
        "into the same --out still reuses its stage outputs).")


def query_prompt_text(text: str) -> str:
    """A query's facts and question on one line (the templates put it after "Query:")."""
    return " ".join(text.split())


def parse_rule(gen: Generation) -> tuple[str | None, str | None]:
    """(rule, None) for a finished "If ..., then ..." output; (None, why) otherwise."""
    text = gen.text.strip()
    first = text.split("\n", 1)[0].strip()  # an unconstrained model may go on after its rule
    rule = RULE.match(first)
    if rule:
        return rule.group(0), None
    if gen.finish_reason == "length":
        return None, f"output cut at max_tokens ({gen.generated_tokens} tokens)"
    return None, f"not an 'If ..., then ...' rule: {text[:80]!r}"


def induce(llm, query_ids: Sequence[str], texts: Sequence[str], s: SiarOptions) -> pa.Table:
    """INDUCED_RULES rows, one per query in order (a fallback or an error row included)."""
    template = prompts.load(INDUCE_TEMPLATE)
    constraint = Constraint("regex", rule_regex(s.condition_words, s.conclusion_words)) if s.constrained else None
    values = [{"query": query_prompt_text(t)} for t in texts]
    gens = llm.generate(template, values, constraint, s.max_tokens, s.temperature, None, label="siar")
    rows = []
    for qid, gen in zip(query_ids, gens, strict=True):
        if isinstance(gen, Exception):
            rule, error, status, gen = None, f"engine: {type(gen).__name__}: {gen}", "error", None
        else:
            rule, error = parse_rule(gen)
            status = "ok" if rule else "fallback"
        rows.append({
            "query_id": qid, "model": llm.model_id, "prompt_sha": template.sha, "raw_output": gen.text if gen else None,
            "rule": rule, "status": status, "error": error, "finish_reason": gen.finish_reason if gen else None,
            "prompt_tokens": gen.prompt_tokens if gen else 0, "cached_prompt_tokens": gen.cached_prompt_tokens if gen else 0,
            "generated_tokens": gen.generated_tokens if gen else 0, "cached": bool(gen and gen.cached),
        })
    return pa.Table.from_pylist(rows, schema=INDUCED_RULES)


def rewrite(queries: pa.Table, induced: pa.Table, mode: str) -> pa.Table:
    """The queries with the induced rule as their text (``rule``) or before it
    (``rule+query``), plus ``original_text``, ``induced_rule`` and ``induction_status``. A
    query whose induction fell back keeps its text. ``induced`` is row-aligned with
    ``queries``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if induced.column("query_id").to_pylist() != queries.column("query_id").to_pylist():
        raise ValueError("induced rules are not row-aligned with the queries (a bug)")
    texts = queries.column("text").to_pylist()
    asked = queries.column(question_column(queries)).to_pylist()  # (an earlier rewrite's original stays the original)
    rules = induced.column("rule").to_pylist()
    new = [t if r is None else (r if mode == "rule" else f"{r}\n{t}") for t, r in zip(texts, rules, strict=True)]
    out = queries
    for name, values in (("original_text", asked), ("induced_rule", rules), ("induction_status", induced.column("status").to_pylist())):
        if name in out.column_names:
            out = out.drop_columns([name])
        out = out.append_column(INDUCED_QUERY.field(name), pa.array(values, INDUCED_QUERY.field(name).type))
    return out.set_column(out.schema.get_field_index("text"), "text", pa.array(new, pa.string()))


# ---------------------------------------------------------------------------------------- R3
def windows(n: int, window: int, stride: int) -> list[tuple[int, int]]:
    """The [start, end) spans of a sliding window over a list of ``n``, back to front as in
    RankGPT (window 20, stride 10: [80, 100), [70, 90), ..., [0, 20)); the last span always
    is the front window [0, min(window, n)), so every position is read at least once and
    the top of the list is reordered with a full window."""
    if n <= 0:
        return []
    if window < 2 or not 1 <= stride <= window:
        raise ValueError(f"need window >= 2 and 1 <= stride <= window, got window {window}, stride {stride}")
    spans, end = [], n
    while end - window > 0:
        spans.append((end - window, end))
        end -= stride
    spans.append((0, min(window, n)))  # the front window is a full one, whatever the stride left over
    return spans


def permutation_regex(n: int) -> str:
    """Exactly ``n`` bracketed identifiers from 1..n separated by " > " (a regex cannot
    forbid repeats without listing every permutation: :func:`parse_permutation` drops them)."""
    ident = "|".join(str(i) for i in range(n, 0, -1))  # longest first
    return rf"\[(?:{ident})\](?: > \[(?:{ident})\]){{{n - 1}}}"


@dataclass(frozen=True)
class Repairs:
    unknown: int = 0  # numbers outside 1..n, dropped
    duplicate: int = 0  # identifiers named again, dropped
    missing: int = 0  # identifiers never named, appended in their previous order

    @property
    def any(self) -> bool:
        return bool(self.unknown or self.duplicate or self.missing)


_NUMBER = re.compile(r"\d+")
_BRACKETED = re.compile(r"\[(\d+)\]")


def parse_permutation(text: str, n: int) -> tuple[list[int], Repairs]:
    """Read a ranking of identifiers 1..n from whatever the model wrote: every run of digits
    is an identifier (RankGPT's reading: "[3] > [1]", "3, 1", "3 then 1" all give 3, 1), but
    where the text brackets any ("[3] > [1]"), only the bracketed ones (a preamble's "the 3
    rules" or a list's "1." are not identifiers); numbers outside 1..n are dropped, repeats
    dropped after their first mention, and the identifiers never named appended in their
    previous order. Returns 0-based positions, a permutation of range(n), and what was
    repaired. Never raises."""
    seen: set[int] = set()
    order: list[int] = []
    unknown = duplicate = 0
    found = _BRACKETED if _BRACKETED.search(text) else _NUMBER
    for m in found.finditer(text):
        digits = m.group(m.lastindex or 0).lstrip("0")
        i = int(digits) - 1 if digits and len(digits) <= 6 else -1
        if not 0 <= i < n:
            unknown += 1
        elif i in seen:
            duplicate += 1
        else:
            seen.add(i)
            order.append(i)
    missing = [i for i in range(n) if i not in seen]
    return order + missing, Repairs(unknown, duplicate, len(missing))


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
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0: greedy, reproducible; above 0: answers drawn anew, never from the LLM cache; a rerun "
        "into the same --out still reuses its stage outputs).")

    @model_validator(mode="after")
    def _stride_fits(self):
        if self.stride is not None and self.stride > self.window:
            raise ValueError(f"stride ({self.stride}) must not exceed window ({self.window})")
        return self

    @property
    def step(self) -> int:
        """The step between windows (half the window when ``stride`` is not given)."""
        return self.stride or max(1, self.window // 2)

    @staticmethod
    def max_tokens(size: int) -> int:
        return 6 * size + 8  # "[12] > " is at most 5 tokens in the tokenizers measured, plus slack


def rerank(llm, queries: dict[str, str], lists: dict[str, list[str]], texts: dict[str, str], s: R3Options) -> tuple[dict[str, list[str]], pa.Table]:
    """Reorder each query's top ``s.n`` (``lists``: query_id -> doc ids, best first) by
    sliding windows; deeper documents keep their place after them. ``queries``: query_id ->
    the text the LLM reads; ``texts``: doc_id -> the rule's text. Windows of all queries at
    the same step go to the LLM as one batch (a query's next window needs its last one's
    order). Returns the new lists and RERANK_WINDOWS rows."""
    template = prompts.load(RERANK_TEMPLATE)
    order = {q: list(docs) for q, docs in lists.items()}
    plans = {q: windows(min(s.n, len(docs)), s.window, s.step) for q, docs in order.items()}
    plans = {q: p for q, p in plans.items() if p and p[0][1] - p[0][0] >= 2}  # a single rule has nothing to reorder
    rows = []
    for step in range(max((len(p) for p in plans.values()), default=0)):
        due = [(q, p[step]) for q, p in plans.items() if step < len(p)]
        by_size: dict[int, list[tuple[str, tuple[int, int]]]] = {}
        for q, span in due:
            by_size.setdefault(span[1] - span[0], []).append((q, span))
        for size, group in sorted(by_size.items()):  # one constraint per window size
            values = [_window_prompt(queries[q], order[q][a:b], texts) for q, (a, b) in group]
            constraint = Constraint("regex", permutation_regex(size)) if s.constrained else None
            gens = llm.generate(template, values, constraint, s.max_tokens(size), s.temperature, None, label="r3")
            for (q, (a, b)), gen in zip(group, gens, strict=True):
                rows.append(_apply(order[q], q, step, a, b, gen))
    return order, pa.Table.from_pylist(rows, schema=RERANK_WINDOWS)


def _window_prompt(query: str, docs: list[str], texts: dict[str, str]) -> dict[str, str]:
    lines = [f"[{i}] {texts.get(d, '')}" for i, d in enumerate(docs, start=1)]
    return {"query": query_prompt_text(query), "rules": "\n".join(lines), "n": str(len(docs))}


def _apply(order: list[str], qid: str, step: int, a: int, b: int, gen) -> dict:
    """Reorder ``order[a:b]`` in place by the window's output; the window's row."""
    size = b - a
    base = {"query_id": qid, "window": step, "start": a, "end": b}
    if isinstance(gen, Exception):  # the window keeps its order
        return {**base, "raw_output": None, "permutation": list(range(1, size + 1)), "unknown": 0, "duplicate": 0, "missing": 0,
                "status": "error", "error": f"engine: {type(gen).__name__}: {gen}", "finish_reason": None,
                "prompt_tokens": 0, "cached_prompt_tokens": 0, "generated_tokens": 0, "cached": False}
    perm, rep = parse_permutation(gen.text, size)
    order[a:b] = [order[a + i] for i in perm]
    return {**base, "raw_output": gen.text, "permutation": [i + 1 for i in perm], "unknown": rep.unknown,
            "duplicate": rep.duplicate, "missing": rep.missing, "status": "repaired" if rep.any else "ok", "error": None,
            "finish_reason": gen.finish_reason, "prompt_tokens": gen.prompt_tokens, "cached_prompt_tokens": gen.cached_prompt_tokens,
            "generated_tokens": gen.generated_tokens, "cached": gen.cached}


def to_run(lists: dict[str, list[str]], k: int, method: str, run_id: str) -> pa.Table:
    """RUN rows from ordered lists: rank 1.., score = the list's length minus the position
    (higher is better; the order is the LLM's, the score carries no more than that)."""
    qids, docs, ranks, scores = [], [], [], []
    for q in sorted(lists):
        kept = lists[q][:k]
        qids += [q] * len(kept)
        docs += kept
        ranks += range(1, len(kept) + 1)
        scores += [float(len(lists[q]) - i) for i in range(len(kept))]
    n = len(qids)
    return pa.table({
        "query_id": pa.array(qids, pa.string()), "doc_id": pa.array(docs, pa.string()), "rank": pa.array(ranks, pa.int32()),
        "score": pa.array(np.asarray(scores, np.float64)), "method": pa.array([method] * n, pa.string()),
        "run_id": pa.array([run_id] * n, pa.string()),
    }, schema=RUN)


def window_counts(table: pa.Table, n_queries: int) -> dict:
    """The stage's manifest counts: totals, and per-query means and maxima, of windows, prompt
    tokens (and prefix-cache hits), generated tokens and parse repairs (each query's own in
    the ``rerank_windows`` side table)."""
    df = table.to_pandas()
    q = max(n_queries, 1)
    totals = {
        "windows": len(df), "prompt_tokens": int(df["prompt_tokens"].sum()), "cached_prompt_tokens": int(df["cached_prompt_tokens"].sum()),
        "generated_tokens": int(df["generated_tokens"].sum()), "repaired_windows": int((df["status"] == "repaired").sum()),
        "unknown_ids": int(df["unknown"].sum()), "duplicate_ids": int(df["duplicate"].sum()), "missing_ids": int(df["missing"].sum()),
        "error_windows": int((df["status"] == "error").sum()), "llm_cache_hits": int(df["cached"].sum()),
    }
    keys = ("windows", "prompt_tokens", "cached_prompt_tokens", "generated_tokens", "repaired_windows")
    by_query = df.assign(windows=1, repaired_windows=df["status"] == "repaired").groupby("query_id")[list(keys)].sum()
    per_query = {key: round(totals[key] / q, 3) for key in keys}
    per_query_max = {key: int(by_query[key].max()) if len(by_query) else 0 for key in keys}
    return {"queries": n_queries, **totals, "per_query": per_query, "per_query_max": per_query_max}


# ---------------------------------------------------------------------------------- reasoning
REASON_TEMPLATE = "rule_reason"
DEFAULT_INSTRUCTION = "Answer the question in one line."


class ReasonOptions(StageOptions):
    stage: Literal["reason"] = "reason"
    rules: int = Field(1, ge=0, le=20, description="The incoming run's top documents given as rules (0: none, the no-rule row).")
    gold: str | None = Field(None, description="An answers file (`prepare-rulebench`'s answers.jsonl): each query's input as given "
                             "(labels kept) and its instruction, in place of the query text and the default instruction.")
    max_tokens: int = Field(64, ge=1, description="Token budget of an answer; an answer cut there is kept and counted (status length).")
    answer_words: int = Field(40, ge=1, le=200, description="Longest answer the one-line regex allows, in words.")
    doc_tokens: int = Field(128, ge=8, description="Each rule cut to this many tokens of the LLM's tokenizer.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0: greedy, reproducible; above 0: answers drawn anew, never from the LLM cache; a rerun "
        "into the same --out still reuses its stage outputs).")


def reason_values(questions: Sequence[str], instructions: Sequence[str], rules: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    """The prompt values of each query: its instruction, its rules ("Rule: ..." lines, or
    nothing) and its question as given."""
    return [{"instruction": (i or DEFAULT_INSTRUCTION).strip(), "question": q.strip(),
             "rules": "".join(f"Rule: {' '.join(r.split())}\n" for r in rs) + ("\n" if rs else "")}
            for q, i, rs in zip(questions, instructions, rules, strict=True)]


def reason(llm, query_ids: Sequence[str], values: Sequence[dict[str, str]], rule_ids: Sequence[Sequence[str]], o: ReasonOptions) -> pa.Table:
    """RULE_ANSWERS rows, one per query in order: the LLM's one-line answer (decoded under
    :func:`logicrank.pipelines.retrieval.methods.lag.answer_regex`); an engine error is an empty answer, counted."""
    from logicrank.pipelines.retrieval.methods.lag import answer_regex

    template = prompts.load(REASON_TEMPLATE)
    gens = llm.generate(template, values, Constraint("regex", answer_regex(o.answer_words)), o.max_tokens, o.temperature, None,
                        label="reason") if values else []
    rows = []
    for qid, ids, gen in zip(query_ids, rule_ids, gens, strict=True):
        failed = isinstance(gen, Exception)
        rows.append({
            "query_id": qid, "answer": "" if failed else gen.text.strip(), "rule_ids": list(ids),
            "status": "error" if failed else ("length" if gen.finish_reason == "length" else "ok"),
            "error": f"engine: {type(gen).__name__}: {gen}" if failed else None, "model": llm.model_id, "prompt_sha": template.sha,
            "prompt_tokens": 0 if failed else gen.prompt_tokens, "generated_tokens": 0 if failed else gen.generated_tokens,
            "cached": bool(not failed and gen.cached),
        })
    return pa.Table.from_pylist(rows, schema=RULE_ANSWERS)
