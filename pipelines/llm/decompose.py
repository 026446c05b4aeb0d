"""Query decomposition by an LLM: one row per (query, method), never dropped.

- ``itlr``: a logical query over quoted text terms, decoded under the GBNF grammar derived
  from the same rules as the parser (:mod:`logicrank.pipelines.retrieval.logic.grammar`), so a finished output
  always parses. A grammar cannot bound the output's length: an output cut at
  ``max_tokens`` is a fallback.
- ``orlog``: atomic statements about an entity ``{x}`` and a logical form over their ids,
  decoded under a JSON schema; the form is read with the same query parser (ids become
  quoted terms) and every id must name an atom.
- ``reasoning``: free text about what an answer contains (the BRIGHT-style expansion).

A row whose output is unusable gets ``status="fallback"``, an ITLR form that parses but is
degenerate (a term copied from the prompt, a conjunct beside its own negation: :func:`degenerate`;
a negation inside a term, a NOT where the question excludes nothing or over what it says before
its exclusion: :func:`misplaced_negation`) ``status="degenerate"``, one whose prompt made the engine fail ``status="error"``; each
carries the raw question in the method's shape (a one-term query, one atom, the question as
expansion) and the reason in ``error``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from logicrank.pipelines.llm import prompts
from logicrank.pipelines.llm.engine import Constraint, Generation, LLMClient
from logicrank.pipelines.retrieval.logic.grammar import to_gbnf
from logicrank.pipelines.retrieval.logic.query import (
    And,
    Node,
    Not,
    QueryParseError,
    Term,
    negated_terms,
    parse,
    positive_terms,
    quote,
    relabel,
    to_text,
)
from logicrank.schemas.errors import JobFailed, UserError
from logicrank.schemas.tables import DECOMPOSITIONS, INDUCED_QUERY, question_column, question_sha

MAX_ATOMS = 8
ATOM_ID = re.compile(r"^a[0-9]{1,2}$")
PLACEHOLDER = "{x}"


class DecompositionsError(UserError, ValueError):
    """A decompositions table does not cover the queries it is used with."""


# each NOT before a bracket or, the last, before an atom id, as the grammar reads a NOT (no "NOT NOT a1")
_FORM_OPERAND = r"(NOT \(|\()*(NOT )?a[0-9]+\)*"
FORM_PATTERN = rf"^\(*{_FORM_OPERAND}( (AND|OR) \(*{_FORM_OPERAND})*$"  # an OrLog form as the schema lets it be decoded


def _atom_pattern(max_chars: int) -> str:
    """An atom's text: ``{x}`` once, and words around it (no quote, backslash, brace or
    control character; at least one character besides the placeholder)."""
    c = r'[^{}"\\\x00-\x1f]'
    return rf"^({c}{{1,{max_chars}}}\{{x\}}{c}{{0,{max_chars}}}|\{{x\}}{c}{{1,{max_chars}}})$"


def orlog_schema(max_atoms: int = MAX_ATOMS, max_chars: int = 100) -> dict:
    """JSON schema of an OrLog decomposition (ids a1..a99; atoms that mention {x}; the form's characters only)."""
    return {
        "type": "object",
        "properties": {
            "atoms": {
                "type": "array",
                "minItems": 1,
                "maxItems": max_atoms,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "pattern": ATOM_ID.pattern},
                        # mentions {x} once (a real model writes atoms without it, issue 51), in at most
                        # 2 x max_chars characters (xgrammar ignores maxLength beside a pattern)
                        "text": {"type": "string", "pattern": _atom_pattern(max_chars)},
                    },
                    "required": ["id", "text"],
                    "additionalProperties": False,
                },
            },
            # atom ids joined by AND / OR, each under any NOTs and brackets: no other word (a real model wrote item
            # names into its forms, issue 51); parse() checks the brackets; an over-long output is cut at max_tokens
            "form": {"type": "string", "pattern": FORM_PATTERN},
        },
        "required": ["atoms", "form"],
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class Parsed:
    status: str  # ok | fallback | degenerate (parsed, but unusable: the question used instead) | error
    logical_query: str | None = None
    atoms: list[dict] | None = None
    expansion: str | None = None
    error: str | None = None


def fallback(method: str, question: str, error: str, status: str = "fallback") -> Parsed:
    """The raw question in ``method``'s shape (a row that is never dropped)."""
    return KINDS[method].fallback(question, error, status)


def _itlr_fallback(question: str, error: str, status: str) -> Parsed:
    return Parsed(status, logical_query=quote(question), error=error)


def _orlog_fallback(question: str, error: str, status: str) -> Parsed:
    atoms = [{"id": "a1", "text": f"{PLACEHOLDER} answers the question: {question}"}]
    return Parsed(status, logical_query='"a1"', atoms=atoms, error=error)


def _reasoning_fallback(question: str, error: str, status: str) -> Parsed:
    return Parsed(status, expansion=question, error=error)


def read_form(form: str) -> str:
    """An OrLog form over bare ids (``a1 AND (a2 OR NOT a3)``) as a canonical query over
    quoted ids; raises QueryParseError on anything else."""
    out = []
    for m in re.finditer(r"\s+|[()]|[A-Za-z0-9_]+|.", form):
        tok = m.group()
        if tok.isspace() or tok in "()":
            out.append(tok)
        elif tok.upper() in ("AND", "OR", "NOT"):
            out.append(tok.upper())
        elif ATOM_ID.match(tok):
            out.append(f'"{tok}"')
        else:
            raise QueryParseError(form, m.start(), f"an atom id (a1, a2, ...) or AND/OR/NOT, not {tok!r}")
    return to_text(parse("".join(out)))


def parse_output(method: str, question: str, gen: Generation) -> Parsed:
    """``method``'s reading of the LLM's output: ok, or a fallback saying why."""
    if gen.finish_reason == "length" and not KINDS[method].cut_ok:
        return fallback(method, question, f"output cut at max_tokens ({gen.generated_tokens} tokens)")
    return KINDS[method].parse(question, gen.text.strip())


def _parse_reasoning(question: str, text: str) -> Parsed:
    return Parsed("ok", expansion=text) if text else _reasoning_fallback(question, "empty output", "fallback")


def _read_itlr(question: str, text: str) -> Parsed:
    """An ITLR logical query as written (by the LLM or by hand): it parses, or a fallback."""
    try:
        return Parsed("ok", logical_query=to_text(parse(text)))
    except QueryParseError as exc:
        return _itlr_fallback(question, str(exc).splitlines()[0], "fallback")


def _parse_itlr(question: str, text: str) -> Parsed:
    """The LLM's logical query (:func:`_read_itlr`), refused as degenerate for a term copied
    from the prompt, a conjunct beside its own negation or a misplaced negation."""
    parsed = _read_itlr(question, text)
    if parsed.status != "ok":
        return parsed
    node = parse(parsed.logical_query)
    why = degenerate(node, question, example_terms(KINDS["itlr"].template)) or misplaced_negation(node, question)
    excluded = [t for t in node.terms() if t in negated_terms(node)]
    why = why or missed_exclusion(question, excluded, node.terms())
    return _itlr_fallback(question, why, "degenerate") if why else parsed


def _fold(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.casefold()))


@cache
def example_terms(template_name: str) -> frozenset[str]:
    """Every double-quoted phrase of a decomposition prompt, folded: its worked examples' terms
    and the words its instructions quote ("other than", "who"), which a model copies too."""
    return frozenset(f for f in (_fold(m) for m in re.findall(r'"([^"\n]+)"', prompts.load(template_name).text)) if f)


def degenerate(node: Node, question: str, examples: frozenset[str]) -> str | None:
    """Why a form that parses is unusable, or None: a term copied from the prompt's worked
    examples (one of theirs with a word the question lacks, compared as BM25 terms, so "pool"
    for "hotels with pools" is the question's own), or a conjunct beside its own negation
    (``"X" AND NOT "X"``: no document can match). A real model writes both (issue 51)."""
    from logicrank.pipelines.engines.bm25 import default_analyzer

    asked = set(default_analyzer()(question))
    for term in node.terms():
        if _fold(term) in examples and not set(default_analyzer()(term)) <= asked:
            return f"degenerate: the term {quote(term)} comes from the prompt's examples, not the question"
    for conj in _conjunctions(node):
        leaves = list(_conjuncts(conj))  # "A AND (B AND NOT C)" is A, B and NOT C
        positive = {_fold(c.text) for c in leaves if isinstance(c, Term)}
        negated = {_fold(c.child.text) for c in leaves if isinstance(c, Not) and isinstance(c.child, Term)}
        if positive & negated:
            term = sorted(positive & negated)[0]
            return f"degenerate: {quote(term)} AND NOT {quote(term)}: that conjunction can match no document"
    return None


_APOSTROPHE = "['\u2019\u02bc]"
# Anything a question may exclude by: a generous list (a cue wrongly seen only keeps a form).
_QUESTION_NEGATION = re.compile(
    r"\b(?:not|no|none|non|nothing|nobody|never|neither|nor|without|but|except\w*|exclud\w*|besides|aside|minus|unless"
    r"|lack\w*|other than|apart from|rather than|instead of|free of|\w+-free|dislik\w*|hate[sd]?|hating|avoid\w*|unlike)\b"
    rf"|n{_APOSTROPHE}t\b|\b(?:do|does|did|is|are|was|were|has|have|had|wo|ca|could|would|should)nt\b", re.IGNORECASE)
# The phrases by which a question excludes what follows them ("A but not B", "not A and B", "A,
# except B"): the words before one are not what it excludes. A negated verb is no such phrase
# ("films Spielberg did not direct" excludes Spielberg, said before "not"), nor a "not" that
# ends the question ("birds that fly or not").
_EXCLUSION = re.compile(r"(?:^|[,;:(]|\b(?:and|or|but)\b)\s*not\b(?=\s*\w)"
                        r"|\b(?:except(?: for)?|excluding|other than|apart from|aside from|besides|without)\b", re.IGNORECASE)
# A negation a model wrote inside a term, in lower case ("but not Smoothies", "not Autonomic
# neuropathy", "does not like X", "dogs, not cats"), an exclusion a term starts with ("except
# giraffes", "other than X", "NOT giraffes"), or a whole formula escaped into one term ('dogs" OR
# "cats'); a title keeps its capitals ("Not Fade Away", "Doctors Without Borders", "Don't Look
# Up", "I'M NOT THERE"), "not-for-profit" is a word, and a phrase that holds one inside it is the
# question's ("anything other than water", "children living apart from their parents").
_TERM_NEGATION = re.compile(rf"^(?:not|never|without|except|excluding|other than|apart from|aside from|NOT)\s"
                            rf"|\b(?:but|and|or) not\b|,\s*not\b(?!-)"
                            rf"|\b(?:do|does|did|is|are|was|were) not\b|\b(?:do|does|did|is|are|was|were)n{_APOSTROPHE}?t\b"
                            rf"|\"\s*(?:AND|OR|NOT)\b|\b(?:AND|OR|NOT)\s*\""
                            # a whole formula in one term ("dogs AND NOT cats"), a negation after a bracket or a semicolon
                            rf"|\b(?:AND|OR)\s+NOT\b|[(;]\s*not\b")


def misplaced_negation(node: Node, question: str) -> str | None:
    """Why an ITLR form's negation cannot be what the question asks, or None (a real model
    writes each of these, issue 51): a negation inside a term (``"but not Smoothies"``: no
    evidence applies it, BM25 drops "not" as a stop word and searches for Smoothies); a NOT in
    the form of a question that negates nothing (``"Cognitive Science" AND NOT "likes"`` for
    "Who likes Cognitive Science?"); a negated term every word of which the question says only
    before its first exclusion phrase (``NOT "likes"`` for "Who likes Mace but not Napkins?")."""
    for term in node.terms():
        if _TERM_NEGATION.search(term):
            return f"degenerate: the term {quote(term)} holds a negation no evidence applies (NOT goes outside the quotes)"
    # negated: under an odd number of NOTs (NOT (NOT "x") negates nothing)
    also = positive_terms(node)
    return misplaced_exclusion(question, [(f"NOT {quote(t)}", t, t in also) for t in node.terms() if t in negated_terms(node)])


def misplaced_exclusion(question: str, excluded: list[tuple[str, str, bool]]) -> str | None:
    """Why what a form excludes cannot be what the question excludes, or None: ``excluded`` is
    (how the form says it, its words, whether the form also asserts it) for each statement the
    form excludes; refused when the question leaves nothing out (``("A" OR "B") AND NOT ("A" AND
    "B")`` for "A or B", a real model's), or when every word of one the form only excludes is
    said before the question's first exclusion phrase (ITLR's negated terms; OrLog's atoms
    under an odd number of NOTs, or a negative statement asserted): ``"A" AND NOT ("A" AND
    "B")`` for "A but not B" excludes B alone."""
    if not excluded:
        return None
    if _QUESTION_NEGATION.search(question) is None:
        return f"degenerate: {excluded[0][0]}, but the question leaves nothing out"
    cue = _EXCLUSION.search(question)
    if cue is None:
        return None
    before, after = set(_fold(question[: cue.start()]).split()), set(_fold(question[cue.start():]).split())
    for said, text, asserted in excluded:
        if asserted:
            continue
        words = set(_fold(text).split())
        if words and words <= before and not words & after:
            return f"degenerate: {said} negates words the question says before {cue.group(0)!r}, not after it"
    return None


# The phrases after which a question surely excludes something ("A but not B", "not A and B",
# "A, except B", "A other than B"): a form must negate a word of what follows. ("without",
# "apart from", "besides" also say "with" or "in addition to": "children living apart from
# their parents".)
_SURE_EXCLUSION = re.compile(r"(?:^|[,;:(]|\b(?:and|or|but)\b)\s*not\b(?=\s*\w)|\b(?:except(?: for)?|excluding|other than)\b",
                             re.IGNORECASE)


def missed_exclusion(question: str, excluded: list[str], terms: list[str]) -> str | None:
    """Why a form leaves out what the question excludes, or None: the question says "but not
    X" ("except X", "other than X", "not X and Y") and no statement the form excludes
    (``excluded``: its texts) shares a word, as BM25 reads it, with what follows the phrase.
    A model drops the NOT (``"vitamin D" AND "bone health"``), cancels it (``NOT (NOT ...)``)
    or negates the wrong side; each ran as ``ok``. A term that keeps the question's phrase
    (``"anything other than water"``: ``terms``) is the question's wording, searched as it is."""
    from logicrank.pipelines.engines.bm25 import default_analyzer

    cue = _SURE_EXCLUSION.search(question)
    if cue is None:
        return None
    phrase = f" {_fold(cue.group(0))} "
    if any(phrase in f" {_fold(t)} " for t in terms):
        return None
    after = set(default_analyzer()(question[cue.end():]))
    if not after or any(set(default_analyzer()(t)) & after for t in excluded):
        return None
    return f"degenerate: the question excludes what follows {cue.group(0).strip()!r}, and the form negates none of it"


def _conjuncts(node: And):
    for child in node.children:
        if isinstance(child, And):
            yield from _conjuncts(child)
        else:
            yield child


def _conjunctions(node: Node):
    if isinstance(node, And):
        yield node
    for child in getattr(node, "children", ()) or ((node.child,) if isinstance(node, Not) else ()):
        yield from _conjunctions(child)


def one_id_per_statement(atoms: Sequence[tuple[str, str]], form: Node) -> tuple[list[tuple[str, str]], Node]:
    """Atoms (id, text) and a form over their ids with each statement under one id, the first
    (compared case-folded, spaces and a closing full stop aside: :func:`_statement`): scored
    apart, two ids of one statement would be taken for independent facts by the exact
    posterior, though their P(True) is the same."""
    first: dict[str, str] = {}
    names = {i: first.setdefault(_statement(t), i) for i, t in atoms}
    if all(names[i] == i for i, _ in atoms):
        return list(atoms), form
    return [(i, t) for i, t in atoms if names[i] == i], relabel(form, {**{t: t for t in form.terms()}, **names})


def _statement(text: str) -> str:
    """An atom's statement as compared for sameness: its words and its symbols, case-folded
    (``{x} is written in C++`` is not ``{x} is written in C``, nor ``> 5`` ``< 5``: words alone
    made them one, and ``a1 AND NOT a2`` a contradiction), without a closing full stop."""
    tokens = re.findall(r"\w+|[^\w\s]", text.casefold())
    while tokens and tokens[-1] in (".", "!", "?", ";"):
        tokens.pop()
    return " ".join(tokens)


def _read_orlog(question: str, text: str) -> Parsed:
    """An OrLog decomposition's JSON as written (by the LLM or by hand): atoms and a form over
    their ids. Atoms the form does not use are dropped (they cannot change a posterior; a real
    model defines helper statements it then leaves out); every atom the form uses must mention
    ``{x}``; atoms of the same statement (:func:`_statement`) become the first one's id."""
    try:
        obj = json.loads(text, strict=False)  # xgrammar lets raw control characters into strings
        atoms = obj["atoms"]
        ids = [a["id"] for a in atoms]
        texts = [a["text"] for a in atoms]
        if not atoms or len(set(ids)) != len(ids) or not all(isinstance(i, str) and ATOM_ID.match(i) for i in ids):
            raise ValueError(f"atom ids must be distinct a1, a2, ...: {ids}")
        form = read_form(str(obj["form"]))
        used = set(parse(form).terms())
        unknown = sorted(used - set(ids))
        if unknown:
            raise ValueError(f"the form uses undefined atoms {unknown}")
        kept = [(i, t) for i, t in zip(ids, texts, strict=True) if i in used]
        if not all(isinstance(t, str) and PLACEHOLDER in t for _, t in kept):
            raise ValueError(f"every atom the form uses must mention {PLACEHOLDER}")
        kept, node = one_id_per_statement(kept, parse(form))
        return Parsed("ok", logical_query=to_text(node), atoms=[{"id": i, "text": t} for i, t in kept])
    except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError and QueryParseError are ValueErrors
        return _orlog_fallback(question, f"{type(exc).__name__}: {str(exc).splitlines()[0]}", "fallback")


_NEGATIVE = re.compile(r"\b(?:not|never|neither|nor|without)\b|n['\u2019]t\b", re.IGNORECASE)  # ("no": titles such as "No Country for Old Men")


def _parse_orlog(question: str, text: str) -> Parsed:
    """The LLM's OrLog decomposition (:func:`_read_orlog`), refused as degenerate when its
    form negates an atom that carries its own negation (``NOT a2`` with a2 = "{x} does not
    like Walruses": the question's "but not" applied twice, which selects the people it
    excludes) or conjoins an atom with its own negation."""
    parsed = _read_orlog(question, text)
    if parsed.status != "ok":
        return parsed
    node = parse(parsed.logical_query)
    why = degenerate(node, question, frozenset())
    texts = {a["id"]: a["text"] for a in parsed.atoms}
    odd, even = negated_terms(node), positive_terms(node)
    negated = sorted(t for t in odd if _NEGATIVE.search(texts[t]))  # NOT a2, NOT (a2 OR a3)
    if why is None and negated:
        why = f"degenerate: NOT {negated[0]} negates a statement already negative ({texts[negated[0]]!r})"
    # what the form excludes: a statement under an odd number of NOTs, or a negative one asserted ("{x} does not like X")
    excluded = [t for t in node.terms() if (t in odd and not _NEGATIVE.search(texts[t])) or (t in even and _NEGATIVE.search(texts[t]))]
    words = {t: texts[t].replace(PLACEHOLDER, " ") for t in node.terms()}
    why = why or misplaced_exclusion(question, [(f"{'NOT ' * (t in odd)}{t} ({texts[t]!r})", words[t], t in odd and t in even)
                                                for t in excluded])
    why = why or missed_exclusion(question, [words[t] for t in excluded], list(words.values()))
    return _orlog_fallback(question, why, "degenerate") if why else parsed


@dataclass(frozen=True)
class DecomposeSettings:
    methods: tuple[str, ...] = field(default_factory=lambda: tuple(KINDS))
    constrained: bool = True  # False: no grammar/schema (to test and measure the fallbacks)
    max_tokens: tuple[tuple[str, int], ...] = field(default_factory=lambda: tuple((k.name, k.max_tokens) for k in KINDS.values()))
    max_term_chars: int | None = None
    temperature: float = 0.0
    seed: int | None = None


def settings_of(cfg) -> DecomposeSettings:
    """The decomposition settings of ``cfg`` (a ``DecomposeConfig``, pipelines/config/retrieval.py): its methods,
    each kind's token budget (the kind's own unless the config sets one), and a seed only when sampling."""
    return DecomposeSettings(
        methods=cfg.methods,
        constrained=cfg.constrained,
        max_tokens=tuple((k.name, cfg.max_tokens.get(k.name, k.max_tokens)) for k in KINDS.values()),
        max_term_chars=cfg.max_term_chars,
        temperature=cfg.temperature,
        seed=cfg.llm.seed if cfg.temperature > 0 else None,
    )


def constraint_for(method: str, s: DecomposeSettings) -> Constraint | None:
    return KINDS[method].constraint(s) if s.constrained else None


def decompose(client: LLMClient, query_ids: Sequence[str], questions: Sequence[str], s: DecomposeSettings) -> pa.Table:
    """DECOMPOSITIONS rows for every (query, method): len(query_ids) x len(methods)."""
    rows = []
    for method in s.methods:
        template = prompts.load(KINDS[method].template)
        gens = _generate_isolating_failures(client, template, questions, constraint_for(method, s), dict(s.max_tokens)[method], s)
        for qid, question, gen in zip(query_ids, questions, gens, strict=True):
            if isinstance(gen, Exception):
                parsed, gen = fallback(method, question, f"engine: {type(gen).__name__}: {gen}", "error"), None
            else:
                parsed = parse_output(method, question, gen)
            rows.append({
                "query_id": qid, "method": method, "model": client.model_id, "prompt_sha": template.sha, "question_sha": question_sha(question),
                "raw_output": gen.text if gen else None, "logical_query": parsed.logical_query, "atoms": parsed.atoms,
                "expansion": parsed.expansion, "status": parsed.status, "error": parsed.error,
                "finish_reason": gen.finish_reason if gen else None, "prompt_tokens": gen.prompt_tokens if gen else 0,
                "generated_tokens": gen.generated_tokens if gen else 0, "cached": bool(gen and gen.cached),
            })
    return pa.Table.from_pylist(rows, schema=DECOMPOSITIONS)


def _generate_isolating_failures(client, template, questions, constraint, max_tokens, s) -> list:
    """One batched call; if the engine raises, retry one prompt at a time so a bad prompt
    (e.g. longer than the model's window) fails alone, as an exception in its slot. What
    stops the whole call (the LLM cannot go on, a pool the cluster cannot place, a bad
    setting) stops the job: never a table of "error" rows, cached as if answered."""
    values = [{"question": q} for q in questions]
    try:
        return client.generate(template, values, constraint, max_tokens, s.temperature, s.seed)
    except Exception as exc:  # noqa: BLE001 - isolate below, and record each failure
        if _stops_the_job(exc):
            raise
        out: list = []
        for v in values:
            try:
                out += client.generate(template, [v], constraint, max_tokens, s.temperature, s.seed)
            except Exception as exc:  # noqa: BLE001
                if _stops_the_job(exc):
                    raise
                out.append(exc)
        return out


def _stops_the_job(exc: Exception) -> bool:
    """A failure no prompt of its own causes: the LLM cannot go on, or a refusal (a user's
    error) other than a prompt longer than the model's window."""
    from logicrank.pipelines.llm.engine import PromptTooLong

    return isinstance(exc, JobFailed) or (isinstance(exc, UserError) and not isinstance(exc, PromptTooLong))



def check_conserved(queries: pa.Table, table: pa.Table, methods) -> None:
    """Raise unless ``table`` (the decompositions) holds every (query, method) pair of
    ``queries`` x ``methods`` exactly once: the error counts the pairs missing and those
    unexpected (duplicated or unknown), with a few of each."""
    want = Counter((q, m) for q in queries.column("query_id").to_pylist() for m in methods)
    got = Counter(zip(table.column("query_id").to_pylist(), table.column("method").to_pylist(), strict=True))
    if got != want:
        lost, extra = want - got, got - want
        raise RuntimeError(f"decompose: rows not conserved (a bug): {sum(lost.values())} missing (e.g. {list(lost)[:3]}), "
                                f"{sum(extra.values())} unexpected (e.g. {list(extra)[:3]})")


def apply_to_queries(queries: pa.Table, decompositions: pa.Table, method: str) -> pa.Table:
    """The queries with what ``method``'s decomposition gives them (its kind's ``apply``:
    ``itlr`` sets ``logical_query``; ``orlog`` sets ``logical_query`` (over atom ids) and adds
    ``atoms``; ``reasoning`` replaces ``text`` by the expansion), plus its
    ``decomposition_status``. Every query must have its row (fallback rows count: they carry
    the raw question)."""
    from logicrank.schemas.tables import DECOMPOSED_QUERY, require_columns

    kind = KINDS[method]
    require_columns(decompositions, ["query_id", "method", "status", *kind.columns], "decompositions")
    rows = decompositions.filter(pa.compute.equal(decompositions.column("method"), method)).to_pylist()
    by_id = {r["query_id"]: r for r in rows}
    if len(by_id) < len(rows):  # (two runs' tables concatenated): which one holds would be the file's order
        twice = sorted(q for q, n in Counter(r["query_id"] for r in rows).items() if n > 1)
        raise DecompositionsError(f"decompositions: {len(twice)} queries have more than one {method} row (e.g. {twice[:3]}); keep one per query.")
    qids = queries.column("query_id").to_pylist()
    missing = [q for q in qids if q not in by_id]
    if missing:
        raise DecompositionsError(f"decompositions: no {method} row for {len(missing)} queries (e.g. {missing[:3]}); run `logicrank decompose` on these queries.")
    picked = [by_id[q] for q in qids]
    if "question_sha" in decompositions.column_names:  # made for another question under the same id: another query set's table
        texts = queries.column("text").to_pylist()
        # the question as asked, where a stage before rewrote the text (siar and an expansion keep it as original_text)
        asked = queries.column(question_column(queries)).to_pylist()
        other = [(q, t) for q, t, a, r in zip(qids, texts, asked, picked, strict=True)
                 if r.get("question_sha") not in (None, question_sha(t), question_sha(a))]
        if other:
            raise DecompositionsError(
                f"decompositions: {len(other)} of {len(qids)} queries' {method} rows were made for another question text under the same id "
                f"(e.g. {other[0][0]}: {other[0][1][:60]!r}): a table of another query set (or topics field), or one made before a stage "
                "that rewrites the text; run `logicrank decompose` on these queries.")
    out = _put(queries, "decomposition_status", [r["status"] for r in picked], DECOMPOSED_QUERY.field("decomposition_status").type)
    return kind.apply(out, picked)


def _put(table: pa.Table, name: str, values, type_) -> pa.Table:
    column = pa.array(values, type_)
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, column) if i >= 0 else table.append_column(name, column)


def _apply_logical_query(queries: pa.Table, rows: list[dict]) -> pa.Table:
    return _put(queries, "logical_query", [r["logical_query"] for r in rows], pa.string())


def _apply_atoms(queries: pa.Table, rows: list[dict]) -> pa.Table:
    from logicrank.schemas.tables import DECOMPOSED_QUERY

    return _put(_apply_logical_query(queries, rows), "atoms", [r["atoms"] for r in rows], DECOMPOSED_QUERY.field("atoms").type)


def _apply_expansion(queries: pa.Table, rows: list[dict]) -> pa.Table:
    """The reasoning text replaces the query's text; the question as asked is kept as
    ``original_text`` (an earlier rewrite's kept), which a later LLM stage asks about."""
    asked = _put(queries, "original_text", queries.column(question_column(queries)), INDUCED_QUERY.field("original_text").type)
    return _put(asked, "text", [r["expansion"] for r in rows], pa.string())


# ------------------------------------------------------------------------------ the kinds
@dataclass(frozen=True)
class DecompositionKind:
    """One kind of decomposition, registered by name: everything that lists kinds (the
    settings' defaults, the prompt templates, parsing, fallbacks, what a query gets) reads
    :data:`KINDS`. A new kind is a prompt file and one :func:`register_kind`, in the module of
    the stage that reads it (every stage module is imported before kinds are listed:
    :func:`logicrank.pipelines.config.retrieval.decomposition_kinds`); the table's ``method`` column holds
    the kind's name."""

    name: str
    template: str  # the prompt file in pipelines/llm/prompts/
    max_tokens: int  # the default token budget
    constraint: Callable[[DecomposeSettings], Constraint | None]  # under constrained decoding
    parse: Callable[[str, str], Parsed]  # (question, output text) -> ok or a fallback
    fallback: Callable[[str, str, str], Parsed]  # (question, error, status) -> the raw question in this kind's shape
    columns: tuple[str, ...]  # the decomposition table's columns it fills
    apply: Callable[[pa.Table, list[dict]], pa.Table]  # the queries with its rows' values
    cut_ok: bool = False  # an output cut at max_tokens is still usable (free text), not a fallback
    written: Callable[[dict], str] | None = None  # a hand-written JSON Lines record -> the output text ``parse`` reads
    parse_written: Callable[[str, str], Parsed] | None = None  # reads hand-written text instead of ``parse`` (no LLM-only checks)


KINDS: dict[str, DecompositionKind] = {}


def register_kind(kind: DecompositionKind) -> DecompositionKind:
    if kind.name in KINDS:
        raise RuntimeError(f"decomposition kind {kind.name!r} registered twice")
    KINDS[kind.name] = kind
    return kind


def _field(record: dict, name: str) -> str:
    value = record.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}: a non-empty string is required, got {json.dumps(value)}")
    return value


def _written_orlog(record: dict) -> str:
    """``atoms`` as a list of {id, text} or a mapping id -> text; ``logical_query`` over the ids,
    quoted or bare (``"a1" AND NOT "a2"`` or ``a1 AND NOT a2``)."""
    atoms = record.get("atoms")
    if isinstance(atoms, dict):
        atoms = [{"id": k, "text": v} for k, v in atoms.items()]
    if not isinstance(atoms, list) or not all(isinstance(a, dict) and set(a) == {"id", "text"} for a in atoms):
        raise ValueError('atoms: a list of {"id": "a1", "text": "{x} ..."} or a mapping {"a1": "{x} ..."} is required')
    return json.dumps({"atoms": atoms, "form": _field(record, "logical_query").replace('"', "")})


register_kind(DecompositionKind("itlr", "itlr_decompose", 256, lambda s: Constraint("grammar", to_gbnf(s.max_term_chars)),
                                _parse_itlr, _itlr_fallback, ("logical_query",), _apply_logical_query,
                                written=lambda r: _field(r, "logical_query"), parse_written=_read_itlr))
register_kind(DecompositionKind("orlog", "orlog_decompose", 384, lambda s: Constraint("json", orlog_schema()),
                                _parse_orlog, _orlog_fallback, ("logical_query", "atoms"), _apply_atoms, written=_written_orlog,
                                parse_written=_read_orlog))
register_kind(DecompositionKind("reasoning", "reasoning_expand", 256, lambda s: None,
                                _parse_reasoning, _reasoning_fallback, ("expansion",), _apply_expansion, cut_ok=True,
                                written=lambda r: _field(r, "expansion")))


def read_decompositions(path: str, method: str) -> pa.Table:
    """A decompositions table: Parquet as `logicrank decompose` writes it, or hand-written JSON
    Lines (a name ending in .jsonl, .jsonl.gz or .json), one query a line, read as the LLM's
    output is (docs/orlog.md, "Hand-written decompositions"):

    - ``itlr``: ``{"query_id": "q1", "logical_query": "\"malaria\" AND NOT \"children\""}``;
    - ``orlog``: ``{"query_id": "q1", "logical_query": "a1 AND NOT a2", "atoms": {"a1": "{x} is a
      museum in Paris", "a2": "{x} is an art museum"}}`` (atoms also as a list of {id, text});
    - ``reasoning``: ``{"query_id": "q1", "expansion": "..."}``.

    A record the kind's parser does not accept is refused, naming its line: hand-written
    decompositions never fall back silently."""
    import pyarrow.parquet as pq

    from logicrank.pipelines.files import read_jsonl

    if not str(path).endswith((".jsonl", ".jsonl.gz", ".json")):
        return pq.read_table(path)
    kind = KINDS[method]
    if kind.written is None:
        raise DecompositionsError(f"decompositions {path}: kind {method!r} has no hand-written form; give a `logicrank decompose` table")
    rows, seen = [], set()
    for n, record in read_jsonl(path, "decompositions", DecompositionsError, f"with query_id and the {method} fields"):
        qid = record.get("query_id")
        where = f"decompositions {path}: line {n}"
        if not isinstance(qid, str | int) or isinstance(qid, bool) or str(qid) in seen:
            raise DecompositionsError(f"{where}: query_id must be a string given once, got {json.dumps(qid)}")
        seen.add(str(qid))
        try:
            parsed = (kind.parse_written or kind.parse)(str(qid), kind.written(record))
        except ValueError as exc:
            raise DecompositionsError(f"{where} (query {qid}): {exc}") from None
        if parsed.status != "ok":
            raise DecompositionsError(f"{where} (query {qid}): {parsed.error}")
        rows.append({"query_id": str(qid), "method": method, "model": "hand-written", "prompt_sha": "", "raw_output": json.dumps(record),
                     "logical_query": parsed.logical_query, "atoms": parsed.atoms, "expansion": parsed.expansion, "status": "ok",
                     "error": None, "finish_reason": None, "prompt_tokens": 0, "generated_tokens": 0, "cached": False})
    return pa.Table.from_pylist(rows, schema=DECOMPOSITIONS)
TEMPLATES = {name: kind.template for name, kind in KINDS.items()}  # the prompt file of each kind
