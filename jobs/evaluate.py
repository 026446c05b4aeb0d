"""`logicrank evaluate`: metrics table, significance tests and a Markdown + PNG report."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.rundir import RunDir, file_fingerprint, write_parquet_atomic, write_text_atomic
from pipelines.evaluate.core import evaluate_run
from pipelines.evaluate.measures import parse_measures
from pipelines.evaluate.report import markdown_report, per_query_plot
from pipelines.evaluate.significance import compare
from pipelines.topics import read_qrels, read_run
from schemas.config import EvaluateConfig


def run_evaluate(cfg: EvaluateConfig, out: str | Path, title: str = "Evaluation") -> pa.Table:
    """Writes metrics.parquet, significance.parquet, report.md, plots/per_query.png; returns the metrics.

    Skipped (the stored metrics returned) when config, qrels and runs are unchanged.
    """
    measures = parse_measures(cfg.measures)  # a bad name fails before anything is read
    rundir = RunDir(out, "evaluate")
    inputs = {"qrels": file_fingerprint(cfg.qrels), "runs": [file_fingerprint(p) for p in cfg.runs]}
    if rundir.is_fresh(cfg.digest(), inputs):
        return pq.read_table(rundir.path / "metrics.parquet")
    qrels = read_qrels(cfg.qrels)
    tables = []
    for path in cfg.runs:
        run = read_run(path)
        for rid in run.column("run_id").unique().to_pylist():
            one = run.filter(pc.equal(run.column("run_id"), rid))
            tables.append(evaluate_run(one, qrels, measures, rid))
    metrics = pa.concat_tables(tables)
    run_ids = list(dict.fromkeys(metrics.column("run_id").to_pylist()))
    if len(run_ids) != len(tables):
        raise ValueError(f"evaluate: run ids repeat across the given runs: {run_ids}; give each run a distinct run_id.")
    baseline = cfg.baseline or run_ids[0]
    if baseline not in run_ids:
        raise ValueError(f"evaluate: baseline {baseline!r} is not among the runs {run_ids}.")
    sig = compare(metrics, baseline, cfg.test, cfg.correction, cfg.alpha) if len(run_ids) > 1 else None

    write_parquet_atomic(metrics, rundir.path / "metrics.parquet")
    outputs = ["metrics.parquet", "report.md", "plots/per_query.png"]
    if sig is not None:
        write_parquet_atomic(sig, rundir.path / "significance.parquet")
        outputs.append("significance.parquet")
    per_query_plot(metrics, str(measures[0]), baseline, rundir.path / "plots" / "per_query.png")
    write_text_atomic(markdown_report(metrics, sig, "plots/per_query.png", title), rundir.path / "report.md")
    rundir.write_manifest(
        cfg.model_dump(mode="json"),
        cfg.digest(),
        inputs,
        outputs,
        measures=[str(m) for m in measures],
        run_ids=run_ids,
    )
    return metrics
