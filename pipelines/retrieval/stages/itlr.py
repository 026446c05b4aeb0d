"""ITLR: each query's logical form over text terms; every term scored once by one scorer's
evidence (dense cosines, BM25, hybrid: pipelines/retrieval/methods/evidence.py), composed with fuzzy
operators (exact over every document, over ANN candidates, or over the candidates a file lists
for each query). The algorithms live in pipelines/retrieval/methods/itlr.py and evidence.py."""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from logicrank.pipelines.retrieval.logic.fuzzy import Operators
from logicrank.pipelines.retrieval.logic.grammar import BLANK
from logicrank.pipelines.retrieval.logic.query import Term, UnparsedQueryError, looks_logical, unparsed_message
from logicrank.pipelines.retrieval.methods.evidence import check_calibration, evidence_class, make_evidence
from logicrank.pipelines.retrieval.methods.itlr import (
    TERM_SCORES,
    empty_not_queries,
    excluded_everywhere,
    negated_terms,
    parse_queries,
    refuse_empty_nots,
    score_listed,
    term_scores_from,
    unfitted_terms,
    unique_terms,
)
from logicrank.pipelines.retrieval.methods.ranking import candidate_pairs, rank_pairs
from logicrank.pipelines.retrieval.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from logicrank.pipelines.retrieval.stages.registry import register
from logicrank.schemas.tables import question_column


class ITLROptions(StageOptions):
    stage: Literal["itlr"] = "itlr"
    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query.")
    mode: Literal["exact", "ann", "listed"] = Field(
        "exact", description="Score every document, ANN candidates, or the documents a pairs file lists for each query."
    )
    operators: str = Field("and=product,or=sum,not=complement", description="Fuzzy operator families.")
    strict_not: float | None = Field(
        None, gt=0.0, le=1.0, description="None: NOT is fuzzy (the not family). A number in (0, 1]: strict NOT: a document for which "
        "a negated conjunct (... AND NOT X) holds, its terms' calibrated evidence at least this, is excluded, not demoted "
        "(docs/itlr.md, Strict NOT, gives thresholds per scorer); needs calibrated evidence.")
    scorer: Literal["dense", "bm25", "hybrid"] = Field(
        "dense", description="Term evidence: dense cosines, BM25 scores, or hybrid (their calibrated mix, hybrid_weight x bm25)."
    )
    calibration: Literal["none", "zscore", "sigmoid", "max", "saturation"] | None = Field(
        None, description="Term-score calibration to [0, 1] (None: the scorer's default, dense none, bm25 max): none, zscore (corpus "
        "sample statistics), sigmoid (fit on labels), max (over the table), saturation (BM25's largest possible score); bm25 only for the last two."
    )
    hybrid_weight: float = Field(0.5, ge=0.0, le=1.0, description="hybrid: the share of calibrated BM25 evidence (the rest dense).")
    calibration_sample: int = Field(10_000, ge=10, description="zscore (and hybrid's dense part): corpus sample size for term statistics.")
    labels: str | None = Field(None, description="sigmoid: JSONL of {doc_id, present: [terms]} to fit on.")
    ann_k: int = Field(100, ge=1, description="ann: neighbours per positive term.")
    ann_nprobes: int | None = Field(None, ge=1, description="ann: IVF partitions probed (None: LanceDB's default).")
    block_rows: int = Field(32768, ge=1, description="exact: document vectors per block.")
    pairs: str | None = Field(None, description="listed: a qrels file (BEIR TSV or TREC qrels, any relevance) of each query's candidates.")
    on_parse_error: Literal["refuse", "fallback"] = Field(
        "refuse", description="A logical query that does not parse (a query's own or a decomposition's): refuse the run in one line "
        "naming the query, or score its whole text as one term (the job names those queries on the terminal)."
    )
    pad: bool = Field(
        False, description="bm25: also return documents whose score carries no evidence (no positive term of the query in the document, "
        "and 0 with the terms it misses counted 0), filling each query's k; off: a query may return fewer than k (docs/itlr.md, Terms "
        "without evidence)."
    )
    empty_not: Literal["refuse", "hold"] = Field(
        "refuse", description="A NOT over a term no document holds (none of its words in the table: a misspelling, a title its documents "
        "only paraphrase): refuse the run in one line naming the query, or let the NOT hold for every document, as fuzzy logic reads "
        "NOT of no evidence (the queries counted: empty_nots)."
    )

    @field_validator("operators")
    @classmethod
    def _ops(cls, v: str) -> str:
        return str(Operators.parse(v))

    @model_validator(mode="after")
    def _files(self):
        chosen = check_calibration(self.scorer, self.calibration, "itlr")
        if self.strict_not is not None and chosen == "none" and self.scorer != "hybrid":
            raise ValueError(f"itlr: strict_not compares calibrated evidence with its threshold; with scorer {self.scorer} give a "
                             "calibration (" + ("zscore or sigmoid" if self.scorer == "dense" else "max or saturation") + ")")
        if self.strict_not is not None and evidence_class(self.scorer).sparse and chosen in ("zscore", "sigmoid"):
            # a document without the term scores 0 and calibrates to about 0.5 (exactly 0.5 for a term the sample lacks):
            # a threshold at or below that excluded every document the query asks for
            raise ValueError(f"itlr: strict_not over {self.scorer}'s evidence needs a calibration that keeps a missed term at 0 "
                             f"(max or saturation): {chosen} gives a document without the term about 0.5, which the threshold "
                             "would read as holding it")
        if self.scorer != "hybrid" and self.hybrid_weight != type(self).model_fields["hybrid_weight"].default:
            raise ValueError(f"itlr: hybrid_weight is the hybrid scorer's share of BM25 evidence; with scorer {self.scorer} it is not "
                             "used: give scorer: hybrid, or leave it out.")
        if self.calibration == "sigmoid" and not self.labels:
            raise ValueError("itlr calibration 'sigmoid' is supervised: give labels (JSONL of doc_id and present terms).")
        if (self.mode == "listed") != (self.pairs is not None):
            raise ValueError("itlr: mode 'listed' reads its candidates from pairs, and only it does: give both or neither.")
        return self


@register
class ITLR(Stage):
    """ITLR: the query's logical form over text terms (its ``logical_query``; the raw text as
    one term when it has none); a logical query that does not parse stops the run, naming the
    query (``on_parse_error: fallback``: its raw text as one term, the query named on the
    terminal); every distinct term scored once (dense:
    embedded, raw cosines by default; bm25: BM25 over the table; hybrid: both), BM25 and hybrid
    calibrated to [0, 1], composed with fuzzy operators. Side table ``term_scores``: each (query, document, term)
    score behind the run."""

    name = "itlr"
    version = 4  # bump when a change alters results
    side_tables = {"term_scores": TERM_SCORES}
    kind = Kind.RETRIEVER
    Options = ITLROptions
    reads = ("text", "logical_query")  # a blank-text query still runs when it carries its logical form
    misreads = {"atoms": "its logical_query is then a form over OrLog's atom ids (a1, a2, ...), which itlr would search as words; "
                         "decompose with target itlr for itlr, or rerank with orlog"}

    def needs(self) -> Needs:
        files = tuple(f for f in (self.options.labels, self.options.pairs) if f)
        evidence = evidence_class(self.options.scorer)
        return Needs(encoder=evidence.encoder, fulltext=evidence.fulltext, files=files)

    def after_run(self) -> str | None:
        """After a run, mode exact scores that run's candidates (as listed mode scores a file's)."""
        if self.options.mode == "exact":
            return None
        return f"its mode {self.options.mode!r} picks its own candidates (mode exact scores the run's)"

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        """One engine over any scorer's evidence (pipelines/retrieval/methods/evidence.py): the terms'
        evidence and calibration, each query's candidates (ann, listed, or the incoming run's
        after a retriever) re-scored exactly or every document scored (exact; in shards of the
        table's rows where the scorer allows), composed with the fuzzy operators, and the side
        table of the ranked pairs."""
        o = self.options
        parsed, fallbacks = self._parse(queries)
        terms = unique_terms(parsed)
        evidence = make_evidence(o.scorer, ctx.store, terms, lambda texts: ctx.embedder().encode(texts), o.hybrid_weight, o.calibration_sample)
        name = check_calibration(o.scorer, o.calibration, "itlr")
        calibration = evidence.calibrate(name, o.calibration_sample, _read_labels(o.labels) if name == "sigmoid" else None)
        empty = evidence.empty_terms()  # held by no document: named, 0 whatever the calibration, refused under a NOT
        if "decomposition_status" in queries.column_names and empty:  # an LLM's form negating such a term: that query asks its question
            parsed, fell = _empty_not_fallbacks(parsed, empty, dict(zip(queries.column("query_id").to_pylist(),  # the question as asked
                                                                          queries.column(question_column(queries)).to_pylist(), strict=True)))
            if fell:
                fallbacks |= {"empty_not_decompositions": len(fell), "empty_not_decomposition_query_ids": fell[:100]}
                if ctx.echo:
                    ctx.echo(f"itlr: {len(fell)} decomposed quer{'y negates' if len(fell) == 1 else 'ies negate'} a term no document holds "
                             f"(e.g. {', '.join(fell[:3])}): scored as their question instead")
                terms = unique_terms(parsed)
                evidence = make_evidence(o.scorer, ctx.store, terms, lambda texts: ctx.embedder().encode(texts), o.hybrid_weight,
                                         o.calibration_sample)
                calibration = evidence.calibrate(name, o.calibration_sample, _read_labels(o.labels) if name == "sigmoid" else None)
                empty = evidence.empty_terms()
        if o.empty_not == "refuse":
            refuse_empty_nots(parsed, empty)
        elif held := empty_not_queries(parsed, empty):
            fallbacks |= {"empty_nots": len(held), "empty_not_query_ids": held[:100]}
        if unfit := unfitted_terms(calibration, parsed, empty):
            fallbacks |= {"uncalibrated_terms": len(unfit), "uncalibrated_term_names": unfit[:100]}
        calibration = dataclasses.replace(calibration, empty=frozenset(empty))
        drop = evidence.sparse and not o.pad
        ops = dataclasses.replace(Operators.parse(o.operators), strict_not=o.strict_not)
        candidates, mode_counts, exact_queries = {}, {}, parsed
        if runs:  # after a run: its candidates, in mode exact (Pipeline validation refuses the other modes)
            candidates, absent = evidence.given(candidate_pairs(runs[0], [q.query_id for q in parsed]))
            mode_counts = {"run_pairs_not_in_table": absent, "queries_without_candidates": sum(q.query_id not in candidates for q in parsed)}
            exact_queries = []
        elif o.mode == "ann":
            candidates, exact_queries = evidence.candidates(parsed, o.ann_k, o.ann_nprobes)
            if evidence.counts_misses:
                mode_counts = {"queries_without_candidates": sum(q.query_id not in candidates for q in parsed) - len(exact_queries)}
        elif o.mode == "listed":
            candidates, absent = evidence.listed(o.pairs, {q.query_id for q in parsed})
            mode_counts = {"listed_pairs_not_in_table": absent, "queries_without_pairs": sum(q.query_id not in candidates for q in parsed)}
            exact_queries = []
        frames = []
        if candidates:
            raw = evidence.candidate_raw(candidates)
            frames.append(score_listed(parsed, terms, raw, candidates, o.k, ops, calibration, drop_unsupported=drop))
            held = excluded_everywhere(parsed, terms, raw, candidates, calibration, self._holds(calibration.name), sparse=evidence.sparse)
            mode_counts |= {"unsatisfiable": len(held), "unsatisfiable_query_ids": held[:100]}
        if exact_queries:
            frames.append(evidence.exact(exact_queries, o.k, ops, calibration, o.block_rows, ctx.shards, pad=o.pad))
        pairs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["query_id", "doc_id", "score"])
        scores = term_scores_from(pairs, parsed, terms, evidence.pair_raw(pairs["doc_id"]), calibration)
        counts = {
            "queries": len(parsed), **fallbacks, "unique_terms": len(terms),
            "mode": "exact over the run's candidates" if runs else o.mode, "operators": str(ops), "scorer": o.scorer, "calibration": evidence.describe(calibration.name),
            "mean_candidates": float(np.mean([len(c[0]) for c in candidates.values()])) if candidates else None,
            **mode_counts, **empty_counts(parsed, empty),
        }
        return Output(run=rank_pairs(pairs, o.k, "itlr", "itlr"), side={"term_scores": scores}, counts=counts)

    def _holds(self, calibration: str) -> float | None:
        """The evidence at which a candidate holds a term, for the unsatisfiable count: strict
        NOT's threshold, else 0.5 of a calibration to [0, 1] (None: raw cosines or BM25 scores, not told)."""
        if self.options.strict_not is not None:
            return self.options.strict_not
        return None if calibration == "none" and self.options.scorer != "hybrid" else 0.5

    def _parse(self, queries: pa.Table) -> tuple[list, dict]:
        """Each query's logical form, refusing those that do not parse (``on_parse_error:
        refuse``), and the counts of the queries scored as their whole text: ``fallback`` (no
        logical query, or one that does not parse), ``unparsed`` (those that do not parse),
        ``blank_logical`` (a blank logical query: empty, whitespace, or null beside queries that
        have one), ``fallback_decompositions`` (a decomposition's fallback: the LLM's output was
        unusable), each with its first 100 query ids."""
        parsed = parse_queries(queries)
        unparsed = unparsed_queries(queries, parsed)
        if unparsed and self.options.on_parse_error == "refuse":
            raise UnparsedQueryError(refusal(unparsed, "decomposition_status" in queries.column_names))
        fallback = [q.query_id for q in parsed if q.status == "fallback"]
        blank = blank_logical_queries(queries)
        written = logic_in_text(queries)
        counts = {"fallback": len(fallback), "fallback_query_ids": fallback[:100],
                  "unparsed": len(unparsed), "unparsed_query_ids": [qid for qid, _, _ in unparsed[:100]],
                  "blank_logical": len(blank), "blank_logical_query_ids": blank[:100],
                  "logic_in_text": len(written), "logic_in_text_query_ids": written[:100]}
        if "decomposition_status" in queries.column_names:  # after a decomposition stage: its fallbacks are named too
            ids = queries.column("query_id").to_pylist()
            fell = [qid for qid, status in zip(ids, queries.column("decomposition_status").to_pylist(), strict=True) if status != "ok"]
            counts |= {"fallback_decompositions": len(fell), "fallback_decomposition_query_ids": fell[:100]}
        return parsed, counts


def _empty_not_fallbacks(parsed: list, empty: dict[str, str], text_of: dict[str, str]) -> tuple[list, list[str]]:
    """An LLM's form that negates a term no document holds would be refused; where the form came
    from a decomposition, that query is scored as its question (one term) instead, as the
    decomposition's other unusable outputs are. Returns the queries and the ids changed."""
    out, fell = [], []
    for q in parsed:
        if q.status == "ok" and negated_terms(q.ast) & empty.keys():
            out.append(dataclasses.replace(q, ast=Term(text_of[q.query_id]), status="fallback", error="a NOT over a term no document holds"))
            fell.append(q.query_id)
        else:
            out.append(q)
    return out, fell


def unparsed_queries(queries: pa.Table, parsed: list) -> list[tuple[str, str, str]]:
    """(query id, logical query, parse error) of each query whose logical query is not blank
    and does not parse (a blank one is no logical query: the text is its one term)."""
    logical = queries.column("logical_query").to_pylist()
    return [(q.query_id, text, q.error) for q, text in zip(parsed, logical, strict=True)
            if q.status == "fallback" and text and text.strip(BLANK)]


def logic_in_text(queries: pa.Table) -> list[str]:
    """The ids of the queries with no logical query whose text reads as one (``"vitamin D" AND
    NOT "bone"``, :func:`~logicrank.pipelines.retrieval.logic.query.looks_logical`): scored as
    one term, their words searched, a NOT raising what it negates; the terminal names them."""
    logical = queries.column("logical_query").to_pylist()
    return [qid for qid, text, form in zip(queries.column("query_id").to_pylist(), queries.column("text").to_pylist(), logical, strict=True)
            if not (form and form.strip(BLANK)) and text and looks_logical(text)]


def blank_logical_queries(queries: pa.Table) -> list[str]:
    """The ids of the queries whose logical query is blank: an empty or whitespace string, or
    null while another query has one (the column is in use). Each is scored as its text."""
    logical = queries.column("logical_query").to_pylist()
    in_use = any(text and text.strip(BLANK) for text in logical)
    return [qid for qid, text in zip(queries.column("query_id").to_pylist(), logical, strict=True)
            if (text is not None and not text.strip(BLANK)) or (text is None and in_use)]


def empty_counts(parsed: list, empty: dict[str, str]) -> dict:
    """The step's counts naming the terms no document holds (term -> why, the first 100) and the
    queries that use one (how many, the first 100 ids)."""
    if not empty:
        return {}
    ids = [q.query_id for q in parsed if any(t in empty for t in q.ast.terms())]
    return {"empty_terms": dict(list(empty.items())[:100]), "empty_term_queries": len(ids), "empty_term_query_ids": ids[:100]}


def refusal(unparsed: list[tuple[str, str, str]], decomposed: bool = False) -> str:
    """The one line that refuses queries whose logical query does not parse."""
    what = ("decomposition's logical query", "decompositions' logical queries") if decomposed else ("logical query", "logical queries")
    return unparsed_message("itlr", unparsed, what=what, hint=(
        'Quote each term ("vitamin D" AND NOT "bone"), or pass --on-parse-error fallback (stage option on_parse_error: fallback) '
        "to score " + ("its" if len(unparsed) == 1 else "each one's") + " whole text as one term"))


def _read_labels(path: str) -> list[dict]:
    from logicrank.pipelines.files import read_jsonl
    from logicrank.schemas.errors import UserError

    return [obj for _, obj in read_jsonl(path, "itlr: labels", UserError)]
