"""What the terminal is told about pipelines and their queries: a logical query that does not
parse refused before Ray starts or a model loads (:func:`refuse_unparsed`), and the queries a
pipeline scored as their whole text (:func:`fallback_notes`). Used by ``logicrank retrieve``
(jobs/retrieve.py); no Ray here."""

from __future__ import annotations

import pyarrow as pa

from logicrank.pipelines.retrieval.pipeline import Pipeline, build
from logicrank.pipelines.retrieval.stages import Kind


def refuse_unparsed(pipelines: list[Pipeline], queries: pa.Table) -> None:
    """A logical query of the queries file that does not parse stops the job here, before Ray
    starts or a model loads, when an itlr stage that refuses it (``on_parse_error: refuse``)
    reads it as given (no rewriter before it); the stage itself refuses the rest (a
    decomposition's)."""
    from logicrank.pipelines.retrieval.logic.query import UnparsedQueryError
    from logicrank.pipelines.retrieval.methods.itlr import parse_queries
    from logicrank.pipelines.retrieval.stages.itlr import refusal, unparsed_queries

    def refusing(stages) -> bool:
        for o in stages:
            stage = build(o)
            if stage.kind is Kind.REWRITER:
                return False
            if getattr(o, "on_parse_error", None) == "refuse" or any(refusing(child) for child in stage.children()):
                return True
        return False

    if "logical_query" in queries.column_names and any(refusing(p.stages) for p in pipelines):
        unparsed = unparsed_queries(queries, parse_queries(queries))
        if unparsed:
            raise UnparsedQueryError(refusal(unparsed))


def fallback_notes(pipeline: str, steps: list[dict], where: str = "") -> list[str]:
    """The terminal's lines naming the queries a pipeline scored as their whole text although
    they had a logical form: one that does not parse (``on_parse_error: fallback``), or a
    decomposition that fell back (the LLM's output was unusable, or its engine failed); the
    queries whose logical query is blank; the terms no document holds (itlr over bm25: a
    misspelling, a stop word, no word) and the queries using them; and the queries whose
    candidates cannot satisfy their NOT (every one holds a negated term or atom: itlr's ann
    and listed modes, orlog)."""
    lines = []
    for step in steps:
        if "sub" in step:
            lines += fallback_notes(pipeline, step["sub"], f"{where}{step['stage']}/")
            continue
        stage = f"pipeline {pipeline!r}, stage {where}{step['stage']}"
        if step.get("unparsed"):
            n = step["unparsed"]
            lines.append(f"retrieve: {stage}: {count_queries(n)} whose logical query does not parse scored as {'its' if n == 1 else 'their'} "
                         f"whole text, one term (on_parse_error: fallback): {shown_ids(step.get('unparsed_query_ids'), n)}.")
        if step.get("unsatisfiable"):
            n = step["unsatisfiable"]
            lines.append(f"retrieve: {stage}: {count_queries(n)} whose every candidate holds a negated term or atom, so none "
                         f"satisfies {'its' if n == 1 else 'their'} NOT (give the stage a deeper or another first stage, or use "
                         f"itlr's exact mode): {shown_ids(step.get('unsatisfiable_query_ids'), n)}.")
        if n := step.get("uncalibrated_terms"):
            them = "them" if n > 1 else "it"
            lines.append(f"retrieve: {stage}: sigmoid calibration fitted no sigmoid for {n} composed term{'s' if n > 1 else ''} (no labelled "
                         f"document holds {them} beside one that does not), composed raw beside calibrated ones: "
                         f"{shown_ids([repr(t) for t in step.get('uncalibrated_term_names') or []], n, 5)}; add labels for {them}, "
                         "or use another calibration.")
        if step.get("logic_in_text"):
            n = step["logic_in_text"]
            lines.append(f"retrieve: {stage}: {count_queries(n)} with no logical query whose text reads as one ('\"a\" AND NOT \"b\"') "
                         f"scored as {'its' if n == 1 else 'their'} whole text, one term, a NOT raising what it negates (give the form "
                         f"as logical_query, or decompose them): {shown_ids(step.get('logic_in_text_query_ids'), n)}.")
        if step.get("blank_logical"):
            n = step["blank_logical"]
            lines.append(f"retrieve: {stage}: {count_queries(n)} whose logical query is blank scored as {'its' if n == 1 else 'their'} "
                         f"text, one term: {shown_ids(step.get('blank_logical_query_ids'), n)}.")
        if step.get("empty_terms"):
            empty, n = step["empty_terms"], step.get("empty_term_queries", 0)
            named = "; ".join(f"{t!r}: {why}" for t, why in list(empty.items())[:5]) + (f"; and {len(empty) - 5} more" if len(empty) > 5 else "")
            one = len(empty) == 1
            lines.append(f"retrieve: {stage}: {len(empty)} term{'' if one else 's'} with no evidence in the table ({named}) "
                         f"hold{'s' if one else ''} for no document; {count_queries(n)} use{'s' if n == 1 else ''} "
                         f"{'it' if one else 'them'}: {shown_ids(step.get('empty_term_query_ids'), n)}.")
        if step.get("fallback_decompositions"):
            n = step["fallback_decompositions"]
            lines.append(f"retrieve: {stage}: {count_queries(n)} whose decomposition fell back to the whole question (an unusable LLM "
                         f"output, or an engine error; decompositions' status and error say which): {shown_ids(step.get('fallback_decomposition_query_ids'), n)}.")
    return lines


def count_queries(n: int) -> str:
    """``n`` quer(y|ies)."""
    return f"{n} quer{'y' if n == 1 else 'ies'}"


def shown_ids(ids: list[str] | None, n: int, shown: int = 10) -> str:
    """The first ``shown`` of ``n`` query ids (those recorded), and how many more."""
    if not ids:
        return "ids not recorded (the stage's output was cached before they were)"
    more = f" and {n - shown} more (the manifest lists the first {len(ids)})" if n > shown else ""
    return ", ".join(ids[:shown]) + more
