"""Query decomposition by an LLM: one row per (query, method), never dropped.

- ``itlr``: a logical query over quoted text terms, decoded under the GBNF grammar derived
  from the same rules as the parser (:mod:`pipelines.logic.grammar`), so a finished output
  always parses. A grammar cannot bound the output's length: an output cut at
  ``max_tokens`` is a fallback.
- ``orlog``: atomic statements about an entity ``{x}`` and a logical form over their ids,
  decoded under a JSON schema; the form is read with the same query parser (ids become
  quoted terms) and every id must name an atom.
- ``reasoning``: free text about what an answer contains (the BRIGHT-style expansion).

A row whose output is unusable gets ``status="fallback"``, one whose prompt made the
engine fail ``status="error"``; both carry the raw question in the method's shape (a
one-term query, one atom, the question as expansion) and the reason in ``error``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from pipelines.llm import prompts
from pipelines.llm.engine import Constraint, Generation, LLMClient
from pipelines.logic.grammar import to_gbnf
from pipelines.logic.query import QueryParseError, parse, quote, to_text
from schemas.errors import JobFailed, UserError
from schemas.tables import DECOMPOSITIONS

TEMPLATES = {"itlr": "itlr_decompose", "orlog": "orlog_decompose", "reasoning": "reasoning_expand"}
MAX_ATOMS = 8
ATOM_ID = re.compile(r"^a[0-9]{1,2}$")
PLACEHOLDER = "{x}"


class DecompositionsError(UserError, ValueError):
    """A decompositions table does not cover the queries it is used with."""


def orlog_schema(max_atoms: int = MAX_ATOMS, max_chars: int = 200) -> dict:
    """JSON schema of an OrLog decomposition (ids a1..a99; the form's characters only)."""
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
                        "text": {"type": "string", "minLength": 4, "maxLength": max_chars},
                    },
                    "required": ["id", "text"],
                    "additionalProperties": False,
                },
            },
            # unbounded: xgrammar compiles neither a bounded repetition in a pattern nor a
            # pattern with maxLength; an over-long output is cut at max_tokens (a fallback)
            "form": {"type": "string", "pattern": r"^[a-zA-Z0-9 ()]+$"},
        },
        "required": ["atoms", "form"],
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class Parsed:
    status: str  # ok | fallback
    logical_query: str | None = None
    atoms: list[dict] | None = None
    expansion: str | None = None
    error: str | None = None


def fallback(method: str, question: str, error: str, status: str = "fallback") -> Parsed:
    if method == "itlr":
        return Parsed(status, logical_query=quote(question), error=error)
    if method == "orlog":
        atoms = [{"id": "a1", "text": f"{PLACEHOLDER} answers the question: {question}"}]
        return Parsed(status, logical_query='"a1"', atoms=atoms, error=error)
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
    text = gen.text.strip()
    if method == "reasoning":
        return Parsed("ok", expansion=text) if text else fallback(method, question, "empty output")
    if gen.finish_reason == "length":
        return fallback(method, question, f"output cut at max_tokens ({gen.generated_tokens} tokens)")
    if method == "itlr":
        try:
            return Parsed("ok", logical_query=to_text(parse(text)))
        except QueryParseError as exc:
            return fallback(method, question, str(exc).splitlines()[0])
    try:
        obj = json.loads(text, strict=False)  # xgrammar lets raw control characters into strings
        atoms = obj["atoms"]
        ids = [a["id"] for a in atoms]
        texts = [a["text"] for a in atoms]
        if not atoms or len(set(ids)) != len(ids) or not all(isinstance(i, str) and ATOM_ID.match(i) for i in ids):
            raise ValueError(f"atom ids must be distinct a1, a2, ...: {ids}")
        if not all(isinstance(t, str) and PLACEHOLDER in t for t in texts):
            raise ValueError(f"every atom must mention {PLACEHOLDER}")
        form = read_form(str(obj["form"]))
        unknown = sorted(set(parse(form).terms()) - set(ids))
        if unknown:
            raise ValueError(f"the form uses undefined atoms {unknown}")
        return Parsed("ok", logical_query=form, atoms=[{"id": i, "text": t} for i, t in zip(ids, texts, strict=True)])
    except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError and QueryParseError are ValueErrors
        return fallback(method, question, f"{type(exc).__name__}: {str(exc).splitlines()[0]}")


@dataclass(frozen=True)
class DecomposeSettings:
    methods: tuple[str, ...] = ("itlr", "orlog", "reasoning")
    constrained: bool = True  # False: no grammar/schema (to test and measure the fallbacks)
    max_tokens: tuple[tuple[str, int], ...] = (("itlr", 256), ("orlog", 384), ("reasoning", 256))
    max_term_chars: int | None = None
    temperature: float = 0.0
    seed: int | None = None


def constraint_for(method: str, s: DecomposeSettings) -> Constraint | None:
    if not s.constrained or method == "reasoning":
        return None
    if method == "itlr":
        return Constraint("grammar", to_gbnf(s.max_term_chars))
    return Constraint("json", orlog_schema())


def decompose(client: LLMClient, query_ids: Sequence[str], questions: Sequence[str], s: DecomposeSettings) -> pa.Table:
    """DECOMPOSITIONS rows for every (query, method): len(query_ids) x len(methods)."""
    rows = []
    for method in s.methods:
        template = prompts.load(TEMPLATES[method])
        gens = _generate_isolating_failures(client, template, questions, constraint_for(method, s), dict(s.max_tokens)[method], s)
        for qid, question, gen in zip(query_ids, questions, gens, strict=True):
            if isinstance(gen, Exception):
                parsed, gen = fallback(method, question, f"engine: {type(gen).__name__}: {gen}", "error"), None
            else:
                parsed = parse_output(method, question, gen)
            rows.append({
                "query_id": qid, "method": method, "model": client.model_id, "prompt_sha": template.sha,
                "raw_output": gen.text if gen else None, "logical_query": parsed.logical_query, "atoms": parsed.atoms,
                "expansion": parsed.expansion, "status": parsed.status, "error": parsed.error,
                "finish_reason": gen.finish_reason if gen else None, "prompt_tokens": gen.prompt_tokens if gen else 0,
                "generated_tokens": gen.generated_tokens if gen else 0, "cached": bool(gen and gen.cached),
            })
    return pa.Table.from_pylist(rows, schema=DECOMPOSITIONS)


def _generate_isolating_failures(client, template, questions, constraint, max_tokens, s) -> list:
    """One batched call; if the engine raises, retry one prompt at a time so a bad prompt
    (e.g. longer than the model's window) fails alone, as an exception in its slot."""
    values = [{"question": q} for q in questions]
    try:
        return client.generate(template, values, constraint, max_tokens, s.temperature, s.seed)
    except JobFailed:  # the LLM cannot go on: the job stops (never a table of "error" rows, cached as if answered)
        raise
    except Exception:  # noqa: BLE001 - isolate below, and record each failure
        out: list = []
        for v in values:
            try:
                out += client.generate(template, [v], constraint, max_tokens, s.temperature, s.seed)
            except JobFailed:
                raise
            except Exception as exc:  # noqa: BLE001
                out.append(exc)
        return out



def apply_to_queries(queries: pa.Table, decompositions: pa.Table, method: str) -> pa.Table:
    """The queries with what ``method``'s decomposition gives them, plus its
    ``decomposition_status``: ``itlr`` sets ``logical_query``; ``orlog`` sets
    ``logical_query`` (over atom ids) and adds ``atoms``; ``reasoning`` replaces ``text`` by
    the expansion. Every query must have its row (fallback rows count: they carry the raw
    question)."""
    from schemas.tables import DECOMPOSED_QUERY, require_columns

    require_columns(decompositions, ["query_id", "method", "status", *{"itlr": ["logical_query"], "orlog": ["logical_query", "atoms"]}.get(method, ["expansion"])], "decompositions")
    rows = decompositions.filter(pa.compute.equal(decompositions.column("method"), method)).to_pylist()
    by_id = {r["query_id"]: r for r in rows}
    qids = queries.column("query_id").to_pylist()
    missing = [q for q in qids if q not in by_id]
    if missing:
        raise DecompositionsError(f"decompositions: no {method} row for {len(missing)} queries (e.g. {missing[:3]}); run `logicrank decompose` on these queries.")

    def put(table: pa.Table, name: str, values, type_) -> pa.Table:
        column = pa.array(values, type_)
        i = table.schema.get_field_index(name)
        return table.set_column(i, name, column) if i >= 0 else table.append_column(name, column)

    picked = [by_id[q] for q in qids]
    out = put(queries, "decomposition_status", [r["status"] for r in picked], DECOMPOSED_QUERY.field("decomposition_status").type)
    if method == "reasoning":
        return put(out, "text", [r["expansion"] for r in picked], pa.string())
    out = put(out, "logical_query", [r["logical_query"] for r in picked], pa.string())
    return put(out, "atoms", [r["atoms"] for r in picked], DECOMPOSED_QUERY.field("atoms").type) if method == "orlog" else out
