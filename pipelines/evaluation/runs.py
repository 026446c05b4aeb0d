"""Evaluating runs, in any process: per-query measures, QA measures of answers, significance
against a baseline, the notes on coverage, a Markdown rendering and a plot.

``logicrank evaluate`` (jobs/evaluate.py) reads the files, checks freshness and writes the
outputs and the manifest around :func:`evaluate_runs`; ``lr.evaluate`` and an experiment run in
a notebook (:func:`logicrank.pipelines.evaluation.experiment.run_in_process`) call it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.evaluation.core import EvaluationError, query_coverage, run_depth, run_metrics
from logicrank.pipelines.evaluation.measures import parse_measures
from logicrank.pipelines.evaluation.qa import Gold, Judge, coverage, evaluate_answers, parse_qa_measures
from logicrank.pipelines.evaluation.report import coverage_notes, markdown_report, per_query_plot
from logicrank.pipelines.evaluation.significance import compare
from logicrank.schemas.tables import RUN


@dataclass
class Evaluation:
    """What :func:`evaluate_runs` gives: the per-query metrics (METRICS, means under query
    ``all``), the significance tests against ``baseline`` (None with one run), and what the
    notes are made of (per run id: qrels queries it misses, its queries the qrels lack; per
    answers run: gold questions it leaves unanswered, answers the gold lacks) and each run's
    depth (:func:`~logicrank.pipelines.evaluation.core.run_depth`)."""

    metrics: pa.Table
    significance: pa.Table | None
    baseline: str
    measures: list[str]
    qa_measures: list[str]
    qrels_queries: int
    missing_queries: dict[str, int] = field(default_factory=dict)
    queries_without_qrels: dict[str, int] = field(default_factory=dict)
    duplicates_removed: dict[str, int] = field(default_factory=dict)
    unanswered_questions: dict[str, int] = field(default_factory=dict)
    answers_without_gold: dict[str, int] = field(default_factory=dict)
    depths: dict[str, int] = field(default_factory=dict)

    @property
    def run_ids(self) -> list[str]:
        return list(dict.fromkeys(self.metrics.column("run_id").to_pylist()))

    def notes(self) -> list[str]:
        """The report's notes: queries a run misses or the qrels lack, rows dropped as
        duplicates, questions an answers run leaves out."""
        return notes(self.missing_queries, self.queries_without_qrels, self.qrels_queries, self.duplicates_removed,
                     self.unanswered_questions, self.answers_without_gold)

    def markdown(self, title: str = "Evaluation", plot: str | None = "plots/per_query.png") -> str:
        return markdown_report(self.metrics, self.significance, plot, title, self.notes(), self.depths)

    def plot(self, path: str | Path) -> Path:
        """The per-query plot of every measure the baseline has, each run against the baseline."""
        has = set(self.metrics.filter(pc.equal(self.metrics.column("run_id"), self.baseline)).column("measure").to_pylist())
        return per_query_plot(self.metrics, [m for m in [*self.measures, *self.qa_measures] if m in has], self.baseline, path)


def evaluate_runs(runs: Sequence[pa.Table], qrels: pa.Table | None, measures: Sequence[str], baseline: str | None = None,
                  test: str = "t-test", correction: str = "holm", alpha: float = 0.05, run_ids: Sequence[str] | None = None,
                  answers: Mapping[str, Mapping[str, str]] | None = None, gold: Mapping[str, Gold] | None = None,
                  qa_measures: Sequence[str] = (), judge: Judge | None = None, duplicates_removed: Mapping[str, int] | None = None,
                  done: Callable[[str], None] = lambda message: None, significance: bool = True) -> Evaluation:
    """Evaluate every run id of ``runs`` (RUN tables, checked as :func:`logicrank.pipelines.io.read_run`
    checks a file) against ``qrels``, trec_eval's rules (a query of the qrels a run misses scores
    0); ``run_ids``: the runs to evaluate (default: those with rows; a named run with no rows
    scores 0). ``answers``: run id -> query id -> predicted answer, scored by ``qa_measures``
    against ``gold`` (``judge``: the LLM judge of the Judge measure). Significance: each run
    against ``baseline`` (default the first), paired ``test``, p-values adjusted by
    ``correction`` (``significance=False``: none computed). ``done`` hears each run evaluated (a
    job's watchdog beat)."""
    parsed = parse_measures(measures)  # a bad name fails before anything is read
    qa = parse_qa_measures(qa_measures) if answers else []
    if "Judge" in qa and judge is None:
        raise EvaluationError("evaluate: the Judge measure needs an LLM judge; or drop Judge.")
    if run_ids is None:  # each run id of each table, in order; one run id in two tables is refused
        parts = [(rid, t.filter(pc.equal(t.column("run_id"), rid))) for t in runs for rid in pc.unique(t.column("run_id")).to_pylist()]
    else:
        table = pa.concat_tables(runs) if runs else RUN.empty_table()
        parts = [(rid, table.filter(pc.equal(table.column("run_id"), rid))) for rid in run_ids]
    ids = [rid for rid, _ in parts]
    if len(ids) != len(set(ids)):
        raise EvaluationError(f"evaluate: run ids repeat across the given runs: {ids}; give each run a distinct run_id.")
    if parts and qrels is None:
        raise EvaluationError("evaluate: runs need qrels.")
    out, missing, without, depths = [], {}, {}, {}
    for rid, one in parts:
        require_shared_queries(rid, one, qrels)
        out.append(run_metrics(one, qrels, parsed, rid))
        missing[rid], without[rid] = query_coverage(one, qrels)
        depths[rid] = run_depth(one)
        done(f"evaluate: run {rid} evaluated")
    unanswered, not_asked = {}, {}
    for rid, predictions in (answers or {}).items():
        out.append(evaluate_answers(dict(predictions), dict(gold or {}), qa, rid, judge=judge))
        unanswered[rid], not_asked[rid] = coverage(dict(predictions), dict(gold or {}))
    if not out:
        raise EvaluationError("evaluate: no runs: the table is empty and no run_ids were named.")
    metrics = pa.concat_tables(out)
    every = list(dict.fromkeys(metrics.column("run_id").to_pylist()))
    baseline = baseline or every[0]
    if baseline not in every:
        raise EvaluationError(f"evaluate: baseline {baseline!r} is not among the runs {every}; pick one of them.")
    sig = compare(metrics, baseline, test, correction, alpha) if significance and len(every) > 1 else None
    n = len(set(qrels.column("query_id").to_pylist())) if qrels is not None and parts else len(set(metrics.column("query_id").to_pylist())) - 1
    return Evaluation(metrics, sig, baseline, [str(m) for m in parsed] if parts else [], qa, n, missing, without, dict(duplicates_removed or {}),
                      unanswered, not_asked, depths)


def require_shared_queries(run_id: str, run: pa.Table, qrels: pa.Table, who: str | None = None) -> None:
    """A run with rows, none of them for a query of the qrels, would score 0 on every measure
    (trec_eval -c's rule for a missed query): almost surely the qrels of other queries, or ids
    spelt otherwise (``"1"`` against ``"q1"``); refused, as trec_eval refuses it without -c.
    ``run`` may be any table of ``query_id``s (``ablate``'s queries), ``who`` naming it in the
    message (default: ``evaluate: run <run_id>``)."""
    who = who or f"evaluate: run {run_id}"
    in_run = pc.unique(run.column("query_id")).cast(pa.string())
    judged = pc.unique(qrels.column("query_id")).cast(pa.string())
    _require_ids_spelt_alike(who, set(in_run.to_pylist()), set(judged.to_pylist()))
    if len(in_run) == 0 or pc.any(pc.is_in(in_run, value_set=judged)).as_py():
        return
    ours, theirs = (sorted(set(t.column("query_id").to_pylist()))[:3] for t in (run, qrels))
    raise EvaluationError(f"{who} has no query the qrels judge (its queries {ours}..., the qrels' {theirs}...); "
                          "give the qrels of its queries (or check how the ids are written).")


def _require_ids_spelt_alike(who: str, in_run: set[str], judged: set[str]) -> None:
    """A run query the qrels lack whose number they hold with other leading zeros (``051``
    against ``51``: TREC's topics files pad what its qrels do not, NTCIR's qrels keep the
    zeros) would score 0 as a missed query, silently; refused, naming the pair."""
    def number(qid: str) -> str | None:
        return (qid.lstrip("0") or "0") if qid.isascii() and qid.isdigit() else None

    theirs = {number(q): q for q in sorted(judged, reverse=True) if number(q) is not None}  # (the same one named every run)
    spelt = [(q, theirs[number(q)]) for q in sorted(in_run - judged) if number(q) in theirs]
    if spelt:
        ours, their = spelt[0]
        raise EvaluationError(f"{who}'s query {ours!r} is the qrels' {their!r} with other leading zeros ({len(spelt)} "
                              "such quer(ies)), and would score 0 as a query the run misses; write the run's ids as the qrels write them.")


def notes(missing: Mapping[str, int], without_qrels: Mapping[str, int], qrels_queries: int, removed: Mapping[str, int],
          unanswered: Mapping[str, int], not_asked: Mapping[str, int]) -> list[str]:
    """A report's notes from an evaluation's counts (also read back from an evaluate manifest)."""
    return coverage_notes(dict(missing), dict(without_qrels), qrels_queries, dict(removed)) + [
        f"answers {rid}: {n} gold question(s) without an answer or with a blank one; they score 0." for rid, n in unanswered.items() if n] + [
        f"answers {rid}: {n} answer(s) to questions the gold lacks; not evaluated." for rid, n in not_asked.items() if n]


def without_identical_ids(run: pa.Table) -> tuple[pa.Table, int]:
    """(the run without the rows whose document id is their query's id, how many there were):
    BEIR's evaluation drops them (``ignore_identical_ids``), as ArguAna's and Quora's queries
    are documents of their corpus, each retrieving itself first; trec_eval scores them."""
    if not run.num_rows:
        return run, 0
    same = pc.equal(run.column("query_id"), run.column("doc_id"))
    n = pc.sum(same).as_py() or 0
    return (run.filter(pc.invert(same)) if n else run), n


def named_runs(runs: Sequence[pa.Table], paths: Sequence[str], names: Mapping[str, str | None]) -> list[pa.Table]:
    """Each run file's run under the run id ``--name NEWID=FILE`` gives it (``names``: path ->
    NEWID, None keeping the file's own). A named file of several runs, or a NEWID that is
    another file's run id, is refused in one line."""
    out = []
    for path, run in zip(paths, runs, strict=True):
        run_id = names.get(path)
        if run_id is not None:
            ids = list(dict.fromkeys(run.column("run_id").to_pylist()))
            if len(ids) > 1:
                raise EvaluationError(f"evaluate: --name {run_id}={path}: the file holds {len(ids)} runs ({', '.join(ids[:5])}"
                                      f"{', ...' if len(ids) > 5 else ''}); --name renames a file of one run: split it, or drop --name for it.")
            i = run.schema.get_field_index("run_id")
            run = run.set_column(i, run.schema.field(i), pa.array([run_id] * run.num_rows, run.schema.field(i).type))
        out.append(run)
    for path, newid in names.items():  # against the runs as renamed: two names may swap two files' ids
        for other, run in zip(paths, out, strict=True):
            if newid is not None and other != path and newid in set(run.column("run_id").unique().to_pylist()):
                raise EvaluationError(f"evaluate: --name {newid}={path}: run id {newid!r} is already a run of {other}; pick another NEWID.")
    return out
