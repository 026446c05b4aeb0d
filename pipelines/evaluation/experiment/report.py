"""An experiment's end, wherever it ran (:func:`conclude`): the summary, the per-group means,
the reference checks and the one Markdown report (:func:`render`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from logicrank.pipelines.evaluation.experiment.datasets import group_of
from logicrank.pipelines.evaluation.experiment.model import Experiment, Reference, ReferenceMissed, measure_name
from logicrank.pipelines.files import write_text_atomic
from logicrank.pipelines.markdown import number, table


@dataclass
class ReferenceCheck:
    reference: Reference
    got: float | None  # None: the run or the measure is not in the results

    @property
    def ok(self) -> bool:
        # at the tolerance's edge is within it (0.65 against 0.645 ± 0.005 is 0.005000000000000004 apart in floats)
        return self.got is not None and abs(self.got - self.reference.value) <= self.reference.tolerance * (1 + 1e-9) + 1e-12


@dataclass
class ExperimentResult:
    """What a run of an experiment gives: the per-query metrics (METRICS), the summary (runs
    x measures), the significance tests, the grouped means, the reference checks, the
    report and the runs' files."""

    experiment: Experiment
    metrics: pa.Table
    summary: pd.DataFrame
    significance: pa.Table | None
    groups: dict[str, pd.DataFrame]
    checks: list[ReferenceCheck]
    report: Path
    runs: dict[str, Path]
    table_version: int  # the version of the table the pipelines read
    index: Any = None  # the index job's summary (logicrank.jobs.index.IndexSummary) when the run indexed the corpus
    timings: dict[str, float] = field(default_factory=dict)
    stages: dict[str, list[dict]] = field(default_factory=dict)  # run id -> its stages' counts (the retrieve manifest's)
    dataset: Path | None = None  # the dataset's directory (a generated or converted one's, under out)
    depths: dict[str, int] = field(default_factory=dict)  # run id -> its depth, the most documents it holds for a query

    @property
    def reproduced(self) -> bool:
        return all(c.ok for c in self.checks)



def conclude(exp: Experiment, metrics: pa.Table, significance: pa.Table | None, queries: Path, out: Path, table_version: int,
             runs: dict[str, Path], stages: dict[str, list[dict]], timings: dict[str, float], dataset: Path | None = None,
             index: Any = None, strict: bool = True) -> ExperimentResult:
    """An experiment's end, wherever it ran: the summary, the groups, the reference checks,
    the report ``out/experiment.md``; a missed reference raises :class:`ReferenceMissed` after
    the report is written (``strict``)."""
    from logicrank.pipelines.evaluation.core import run_depth
    from logicrank.pipelines.evaluation.report import summary_frame

    summary = summary_frame(metrics)
    depths = {rid: run_depth(pq.read_table(path, columns=["query_id"])) for rid, path in runs.items()}
    groups = {g: grouped(metrics, queries, g) for g in exp.group_by}
    checks = [ReferenceCheck(r, _value(summary, r.run, r.measure)) for r in exp.references]
    result = ExperimentResult(exp, metrics, summary, significance, groups, checks, out / "experiment.md", runs, table_version, index,
                              timings, stages, dataset, depths)
    write_text_atomic(render(result), result.report)
    missed = [c for c in checks if not c.ok]
    if missed and strict:
        from logicrank.pipelines.evaluation.report import figure

        raise ReferenceMissed(f"experiment {exp.name}: {len(missed)} reference figure(s) missed: " + "; ".join(
            f"{c.reference.run} {c.reference.measure} {figure(c.got)} vs {c.reference.value} ± {c.reference.tolerance}" for c in missed)
            + f" (report: {result.report})")
    return result



def _value(summary: pd.DataFrame, run: str, measure: str) -> float | None:
    name = measure_name(measure)
    return float(summary.loc[run, name]) if run in summary.index and name in summary.columns else None


def grouped(metrics: pa.Table, queries: Path, column: str) -> pd.DataFrame:
    """Each run's measures over the queries of each group of a field of the queries file, each
    aggregated as over all queries (:func:`~logicrank.pipelines.evaluation.measures.over_queries`:
    a mean, a sum for counts, a geometric mean for ``gm_*``) (rows: (run, group); columns:
    measures; plus the number of queries per group)."""
    from logicrank.pipelines.evaluation.measures import over_queries
    from logicrank.schemas.tables import AGGREGATE_QUERY_ID

    groups = group_of(queries, column)
    df = metrics.to_pandas()
    df = df[df["query_id"] != AGGREGATE_QUERY_ID]
    df[column] = df["query_id"].map(groups)
    df = df[df[column].notna()]  # a qrels query the queries file lacks belongs to no group
    table = (df.groupby(["run_id", column, "measure"], sort=False)["value"]
             .apply(lambda v: over_queries(v.name[2], v.to_numpy()))
             .unstack("measure")[list(dict.fromkeys(df["measure"]))])
    table = table.reindex(pd.MultiIndex.from_tuples(list(dict.fromkeys(zip(df["run_id"], df[column], strict=True))), names=["run_id", column]))
    counts = df[df["measure"] == df["measure"].iloc[0]].groupby(["run_id", column], sort=False).size()
    return table.assign(queries=counts.astype(int))


def render(r: ExperimentResult) -> str:
    """The experiment's one report (Markdown)."""
    from logicrank.pipelines.evaluation.report import DEPTH_NOTE, depth_cell, figure

    exp = r.experiment
    d = exp.dataset
    lines = [f"# {exp.title}", "", f"Dataset: {d.label} (table v{r.table_version}); measures over the qrels' queries "
             "(a query a run misses scores 0, trec_eval -c).", ""]
    measures = list(r.summary.columns)
    lines += table(["run", "depth", *measures], ([run, depth_cell(r.depths, run), *(figure(row[m]) for m in measures)]
                                                 for run, row in r.summary.iterrows()), "lr" + "r" * len(measures))
    lines += ["", DEPTH_NOTE]
    if r.significance is not None and r.significance.num_rows:
        sig = r.significance.to_pandas()
        lines += ["", f"Against `{sig['baseline'].iloc[0]}` ({sig['test'].iloc[0]}, {sig['correction'].iloc[0]} within each measure; "
                  "* significant):", ""]
        lines += table(["run", "measure", "value", "baseline", "p adjusted"],  # (each the summary's value over the queries)
                       ([s.run_id, s.measure, f"{s.mean_run:.4f}", f"{s.mean_baseline:.4f}", f"{s.p_adjusted:.3g}{' *' if s.significant else ''}"]
                        for s in sig.itertuples()), "llrrr")
    for column, by in r.groups.items():
        cols = [c for c in by.columns if c != "queries"]
        lines += ["", f"By {column}:", ""]
        lines += table(["run", column, "queries", *cols], ([run, g, int(row["queries"]), *(figure(row[c]) for c in cols)]
                                                          for (run, g), row in by.iterrows()), "llr" + "r" * len(cols))
    if r.checks:
        lines += ["", "References:", ""]
        lines += table(["run", "measure", "here", "reference", "tolerance", "source", ""],
                       ([c.reference.run, c.reference.measure, figure(c.got), c.reference.value, c.reference.tolerance, c.reference.source,
                         "reproduced" if c.ok else "**missed**"] for c in r.checks), "llrrrll")
    if r.stages:
        lines += ["", "Stages (the retrieve manifest's counts):", ""]
        lines += [f"- `{rid}`: " + "; ".join(_stage_counts(c) for c in stages) for rid, stages in r.stages.items()]
    if exp.caveats:
        lines += [""] + [f"**{c}**" for c in exp.caveats]
    lines += ["", "Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in r.timings.items()) + ".", ""]
    return "\n".join(lines)


def _stage_counts(counts: dict) -> str:
    """One stage's manifest entry in a line of words: its name, then its counts (names with
    spaces, nested ones in parentheses, lists joined, nothing as "none", no Python reprs)."""
    def fmt(v: Any) -> str:
        if isinstance(v, dict):
            return "(" + ", ".join(f"{words(k)} {fmt(x)}" for k, x in v.items()) + ")" if v else "none"
        if isinstance(v, list | tuple):
            return ", ".join(map(fmt, v)) if v else "none"
        if v is None:
            return "none"
        if isinstance(v, bool):
            return "yes" if v else "no"
        return number(v) if isinstance(v, float) else str(v)

    def words(key: str) -> str:
        return key.replace("_", " ")

    if "sub" in counts:  # a fusion's sub-pipeline
        return counts["stage"] + " (" + "; ".join(_stage_counts(c) for c in counts["sub"]) + ")"
    shown = {k: v for k, v in counts.items() if k not in ("stage", "digest", "cached", "placement")}
    body = ", ".join(f"{words(k)} {fmt(v)}" for k, v in shown.items())
    return counts["stage"] + (" (cached)" if counts.get("cached") else "") + (f" ({body})" if body else "")
