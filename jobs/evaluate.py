"""`logicrank evaluate`: metrics table, significance tests and a Markdown + PNG report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from logicrank.jobs.rundir import RunDir, input_fingerprint
from logicrank.jobs.watchdog import beat
from logicrank.pipelines.evaluate.core import EvaluationError, evaluate_run, query_coverage
from logicrank.pipelines.evaluate.measures import parse_measures
from logicrank.pipelines.evaluate.qa import (
    JUDGE_TEMPLATE,
    QAError,
    coverage,
    evaluate_answers,
    llm_judge,
    parse_qa_measures,
    read_gold,
    read_predictions,
)
from logicrank.pipelines.evaluate.report import coverage_notes, markdown_report, per_query_plot
from logicrank.pipelines.evaluate.significance import compare
from logicrank.pipelines.files import write_parquet_atomic, write_text_atomic
from logicrank.pipelines.topics import DUPLICATES_REMOVED, read_qrels, read_run
from logicrank.schemas.config import EvaluateConfig

OUTPUTS = ("metrics.parquet", "significance.parquet", "report.md", "plots/per_query.png")  # all an evaluation can write


def run_evaluate(cfg: EvaluateConfig, out: str | Path, title: str = "Evaluation", echo: Callable[[str], None] | None = None) -> pa.Table:
    """Writes metrics.parquet, significance.parquet, report.md, plots/per_query.png; returns the metrics.

    Runs and qrels are read and checked by :mod:`logicrank.pipelines.topics` (the numbers equal
    trec_eval's, or a one-line error says why not); ``cfg.dedupe`` keeps each repeated
    (query, doc) pair's best-ranked row instead of refusing the run. The manifest records,
    per run_id, ``missing_queries`` (qrels queries without results: they score 0) and
    ``queries_without_qrels`` (not evaluated), and per run file ``duplicates_removed``.
    Skipped (the stored metrics returned) when config, qrels and runs are unchanged.
    """
    measures = parse_measures(cfg.measures)  # a bad name fails before anything is read
    qa_measures = parse_qa_measures(cfg.qa_measures) if cfg.answers else []
    if "Judge" in qa_measures and cfg.judge is None:
        raise QAError("evaluate: the Judge measure needs an LLM (--judge-llm MODEL); or drop Judge.")
    given = ([("qrels", cfg.qrels)] if cfg.runs else []) + [("run", p) for p in cfg.runs] + [("answers", p) for p in cfg.answers]
    for kind, path in given:
        if not Path(path).exists():
            raise EvaluationError(f"evaluate: no {kind} file at {str(path)!r}; check the path.")
    dedupe = cfg.dedupe
    rundir = RunDir(out, "evaluate")
    inputs = {"qrels": input_fingerprint("qrels", cfg.qrels, EvaluationError) if cfg.runs else None, "runs": [input_fingerprint("run", p, EvaluationError) for p in cfg.runs]}
    if cfg.answers:
        gold_file = Path(cfg.gold) / "answers.jsonl" if Path(cfg.gold).is_dir() else Path(cfg.gold)
        inputs.update(gold=input_fingerprint("gold answers", gold_file, EvaluationError) if gold_file.is_file() else None,
                      answers=[input_fingerprint("answers", p, EvaluationError) for p in cfg.answers])
        if "Judge" in qa_measures:  # an edited judge prompt or another checkpoint is a new evaluation
            from logicrank.pipelines.llm import prompts
            from logicrank.pipelines.llm.models import resolve

            inputs["judge"] = {"template": prompts.load(JUDGE_TEMPLATE).sha, "model": resolve(cfg.judge.model, log=lambda m: None).model_id}
    if rundir.is_fresh(cfg.digest(), inputs) and "missing_queries" in (rundir.previous() or {}):
        if echo:
            echo(f"evaluate: config, qrels and runs unchanged since the last run: skipped; metrics in {rundir.path / 'metrics.parquet'}")
        return pq.read_table(rundir.path / "metrics.parquet")
    qrels = read_qrels(cfg.qrels) if cfg.runs else None
    tables, missing, without_qrels, removed = [], {}, {}, {}
    for path in cfg.runs:
        run = read_run(path, duplicates="first" if dedupe else "refuse")
        removed[str(path)] = int(run.schema.metadata[DUPLICATES_REMOVED])
        for rid in run.column("run_id").unique().to_pylist():
            one = run.filter(pc.equal(run.column("run_id"), rid))
            tables.append(evaluate_run(one, qrels, measures, rid))
            missing[rid], without_qrels[rid] = query_coverage(one, qrels)
            beat(f"evaluate: run {rid} evaluated")
    n_runs = len(tables)
    unanswered, not_asked = {}, {}
    if cfg.answers:
        qa_tables, unanswered, not_asked = _evaluate_answers(cfg, qa_measures)
        tables += qa_tables
    metrics = pa.concat_tables(tables)
    run_ids = list(dict.fromkeys(metrics.column("run_id").to_pylist()))
    run_only = list(dict.fromkeys(t.column("run_id")[0].as_py() for t in tables[:n_runs]))
    if len(run_only) != n_runs:
        raise EvaluationError(f"evaluate: run ids repeat across the given runs: {run_ids}; give each run a distinct run_id.")
    baseline = cfg.baseline or run_ids[0]
    if baseline not in run_ids:
        raise EvaluationError(f"evaluate: baseline {baseline!r} is not among the runs {run_ids}; pick one of them.")
    sig = compare(metrics, baseline, cfg.test, cfg.correction, cfg.alpha) if len(run_ids) > 1 else None

    n_queries = len(set(qrels.column("query_id").to_pylist())) if qrels is not None else len(set(metrics.column("query_id").to_pylist())) - 1
    write_parquet_atomic(metrics, rundir.path / "metrics.parquet")
    outputs = ["metrics.parquet", "report.md", "plots/per_query.png"]
    if sig is not None:
        write_parquet_atomic(sig, rundir.path / "significance.parquet")
        outputs.append("significance.parquet")
    per_query_plot(metrics, _plotted(metrics, baseline, [str(m) for m in measures] if cfg.runs else [], qa_measures), baseline,
                   rundir.path / "plots" / "per_query.png")
    notes = coverage_notes(missing, without_qrels, n_queries, removed) + _qa_notes(unanswered, not_asked)
    write_text_atomic(markdown_report(metrics, sig, "plots/per_query.png", title, notes), rundir.path / "report.md")
    rundir.set_aside([o for o in OUTPUTS if o not in outputs], echo)  # an earlier run's significance table, with one run now
    rundir.write_manifest(
        cfg.model_dump(mode="json"),
        cfg.digest(),
        inputs,
        outputs,
        measures=[str(m) for m in measures],
        run_ids=run_ids,
        qrels_queries=n_queries,
        missing_queries=missing,
        queries_without_qrels=without_qrels,
        duplicates_removed=removed,
        qa_measures=qa_measures,
        unanswered_questions=unanswered,
        answers_without_gold=not_asked,
    )
    return metrics


def _evaluate_answers(cfg: EvaluateConfig, measures: list[str]) -> tuple[list[pa.Table], dict[str, int], dict[str, int]]:
    """QA metrics of each answers file (run id = its stem), the questions it leaves
    unanswered and the answers the gold lacks; the Judge starts the LLM pool once."""
    gold = read_gold(cfg.gold)
    preds = {}
    for path in cfg.answers:
        rid = Path(path).stem
        if rid in preds:
            raise EvaluationError(f"evaluate: two answer files named {rid!r}; the file stem is the run id, so give each a distinct name.")
        preds[rid] = read_predictions(path)
    cover = {rid: coverage(p, gold) for rid, p in preds.items()}
    unanswered, not_asked = {r: c[0] for r, c in cover.items()}, {r: c[1] for r, c in cover.items()}
    if "Judge" not in measures:
        return [evaluate_answers(p, gold, measures, rid) for rid, p in preds.items()], unanswered, not_asked
    from logicrank.jobs.llm_service import LLMService
    from logicrank.jobs.raysession import ray_session

    with ray_session(cfg.ray):
        llm = LLMService(cfg.judge)
        try:
            tables = [evaluate_answers(p, gold, measures, rid, judge=llm_judge(llm)) for rid, p in preds.items()]
        finally:
            llm.close()
    return tables, unanswered, not_asked


def _plotted(metrics: pa.Table, baseline: str, measures: list[str], qa_measures: list[str]) -> str:
    """The per-query plot's measure: the first one the baseline has (an answers-only baseline has no retrieval measure)."""
    has = set(metrics.filter(pc.equal(metrics.column("run_id"), baseline)).column("measure").to_pylist())
    return next(m for m in [*measures, *qa_measures] if m in has)


def evaluation_notes(out: str | Path) -> list[str]:
    """The notes of report.md (queries a run misses or the qrels lack, rows dedupe dropped,
    questions an answers file leaves out), to print."""
    m = _manifest(out)
    return coverage_notes(
        m.get("missing_queries", {}), m.get("queries_without_qrels", {}), m.get("qrels_queries", 0), m.get("duplicates_removed", {})
    ) + _qa_notes(m.get("unanswered_questions", {}), m.get("answers_without_gold", {}))


def _qa_notes(unanswered: dict[str, int], not_asked: dict[str, int]) -> list[str]:
    return [f"answers {rid}: {n} gold question(s) without an answer; they score 0." for rid, n in unanswered.items() if n] + [
        f"answers {rid}: {n} answer(s) to questions the gold lacks; not evaluated." for rid, n in not_asked.items() if n]


def _manifest(out: str | Path) -> dict:
    path = Path(out) / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}
