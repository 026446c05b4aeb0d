"""An experiment run in this process over a table that exists (:func:`run_in_process`), and what
every run checks before any work (:func:`prepared`); ``logicrank experiment`` runs the same
through the jobs (jobs/experiment.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from logicrank.pipelines.evaluation.experiment.datasets import dataset_root, expand, gold_of, group_of, prepare_dataset
from logicrank.pipelines.evaluation.experiment.model import Experiment, ExperimentError, in_dataset
from logicrank.pipelines.evaluation.experiment.report import ExperimentResult, conclude


def prepared(exp: Experiment, out: Path) -> tuple[Path, Path, Path, Path, dict[str, tuple[Any, ...]], Path | None]:
    """Everything an experiment needs before any work, checked: (corpus, queries, qrels, the
    dataset's directory, the pipelines to run, the gold answers of the queries run or None);
    a conversion or a sample is written under ``out``."""
    corpus, queries, qrels = prepare_dataset(exp.dataset, out)
    for column in exp.group_by:
        group_of(queries, column)
    root = dataset_root(exp.dataset, out)
    gold = None
    if exp.qa_measures:
        gold = Path(expand(in_dataset(exp.gold, str(root)))) if exp.gold else root / "answers.jsonl"
        gold = gold_of(gold, queries, out / "sample" / "answers.jsonl")
    try:
        pipelines = exp.pipelines_to_run(root)
    except ValueError as exc:
        raise ExperimentError(f"experiment {exp.name}: {exc}") from None
    return corpus, queries, qrels, root, pipelines, gold



def run_in_process(exp: Experiment, ctx: Any, out: str | Path, strict: bool = True, cache: Any = None, judge: Any = None) -> ExperimentResult:
    """Run ``exp`` over a table that exists (``ctx``: the :class:`~logicrank.pipelines.retrieval.stages.Context`
    of a table indexed from the experiment's corpus, as ``lr.open_table`` makes), in this
    process, without Ray: its pipelines through :mod:`logicrank.pipelines.retrieval.runner`, then
    evaluate and :func:`conclude`. Runs go to ``out/runs/<run id>.parquet``, a LAG stage's
    answers to ``out/answers/``. ``cache``: a :class:`~logicrank.pipelines.retrieval.runner.StageCache`
    (default: ``out/stages``, keyed as the retrieve job keys it); ``judge``: the LLM judge of
    the Judge measure."""
    import time

    from logicrank.pipelines.evaluation.qa import read_gold, read_predictions
    from logicrank.pipelines.evaluation.runs import evaluate_runs, without_identical_ids
    from logicrank.pipelines.files import write_parquet_atomic
    from logicrank.pipelines.io import read_qrels, read_queries
    from logicrank.pipelines.retrieval.pipeline import Pipeline
    from logicrank.pipelines.retrieval.runner import StageCache

    out = Path(out)
    _, queries, qrels, root, pipelines, gold = prepared(exp, out)
    asked = read_queries(queries)
    cache = cache if cache is not None else StageCache(out / "stages")
    runs, stages, answers, timings = {}, {}, {}, {}
    t = time.perf_counter()
    for rid, steps in pipelines.items():
        result = Pipeline(rid, steps).run(ctx, asked, cache)
        runs[rid] = write_parquet_atomic(result.run, out / "runs" / f"{rid}.parquet")
        stages[rid] = result.steps
        if f"answers/{rid}" in result.side:
            answers[rid] = read_predictions(write_parquet_atomic(result.side[f"answers/{rid}"], out / "answers" / f"{rid}.parquet"))
    timings["retrieve"] = time.perf_counter() - t
    if exp.qa_measures and not answers:
        raise ExperimentError(f"experiment {exp.name}: qa_measures, but no pipeline answers (a LAG stage writes answers)")
    t = time.perf_counter()
    tables = [pq.read_table(p) for p in runs.values()]
    if exp.ignore_identical_ids:  # (as the evaluate job drops them)
        tables = [without_identical_ids(t)[0] for t in tables]
    ev = evaluate_runs(tables, read_qrels(qrels), exp.measures, exp.baseline,
                       run_ids=list(runs),  # every pipeline's run, one that retrieved nothing a row of zeros
                       answers=answers if exp.qa_measures else None, gold=read_gold(gold) if gold else None,
                       qa_measures=exp.qa_measures, judge=judge)
    timings["evaluate"] = time.perf_counter() - t
    return conclude(exp, ev.metrics, ev.significance, queries, out, ctx.store.version, runs, stages, timings, root, strict=strict)


