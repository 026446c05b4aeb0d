"""Evaluation report: Markdown tables and a per-query comparison plot (PNG)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa

from logicrank.pipelines.evaluation.measures import lower_is_better, over_queries
from logicrank.pipelines.evaluation.qa import REGISTRY as QA_MEASURES
from logicrank.pipelines.markdown import table
from logicrank.schemas.tables import AGGREGATE_QUERY_ID


def figure(x: float | None) -> str:
    """A figure as the reports and the terminal print it: 4 decimals; ``-`` where a run has no
    value (a measure it lacks: a run of answers alone has no nDCG, a ranking no EM)."""
    return "-" if x is None or x != x else f"{x:.4f}"


def summary_frame(metrics: pa.Table) -> pd.DataFrame:
    """Rows: run ids; columns: measures; values: the aggregate over queries (query ``all``: trec_eval's, a mean but for counts and gm_*)."""
    df = metrics.to_pandas()
    agg = df[df["query_id"] == AGGREGATE_QUERY_ID]
    out = agg.pivot(index="run_id", columns="measure", values="value")
    return out.reindex(index=list(dict.fromkeys(agg["run_id"])), columns=list(dict.fromkeys(agg["measure"])))


DEPTH_NOTE = ("depth: the most documents the run holds for a query (`--k N` sets it); measures count no deeper, so a "
              "100-deep run's MAP and R@1000 are those of its top 100.")


def depth_cell(depths: Mapping[str, int], run_id: str) -> str:
    """A run's depth in a table; "-" for a run without a ranking (answers alone)."""
    return str(depths[run_id]) if run_id in depths else "-"


def coverage_notes(
    missing: Mapping[str, int], without_qrels: Mapping[str, int], n_queries: int, duplicates_removed: Mapping[str, int] | None = None
) -> list[str]:
    """One line per run that misses qrels queries or has queries the qrels lack, and per run
    file whose repeated (query, doc) rows were dropped; nothing when all is whole."""
    lines = [
        f"run {rid} has no results for {n} of {n_queries} qrels queries; they score 0 (trec_eval -c)."
        for rid, n in missing.items() if n
    ]
    lines += [
        f"run {rid} has results for {n} queries absent from the qrels; they are not evaluated (as trec_eval)."
        for rid, n in without_qrels.items() if n
    ]
    lines += [
        f"run file {path}: {n} repeated (query, doc) rows dropped (dedupe: each pair's best-ranked row kept)."
        for path, n in (duplicates_removed or {}).items() if n
    ]
    return lines


GM_NOTE = ("gm_*: trec_eval's per-query values are logs (of AP for gm_map, bpref for gm_bpref, floored at 1e-5); over "
           "queries, their geometric mean; the median is the median query's AP (or bpref).")


def _spread(measure: str, values: pd.Series) -> list:
    """A run's row for ``measure``: the value over its queries (the measure's own aggregation,
    as the summary's), then the median, spread and count of queries above 0 of the per-query
    values; of a ``gm_*`` measure, whose per-query values are logs, only the median query's
    value (as AP)."""
    import numpy as np

    over = figure(over_queries(measure, values.to_numpy()))
    if measure.startswith("gm_"):
        return [measure, over, figure(float(np.median(np.exp(values.to_numpy())))), "-", "-"]  # (of an even count: the two middle APs' mean)
    return [measure, over, figure(values.median()), figure(values.std(ddof=0)), int((values > 0).sum())]


def markdown_report(
    metrics: pa.Table, significance: pa.Table | None, plot: str | None = None, title: str = "Evaluation", notes: Sequence[str] = (),
    depths: Mapping[str, int] | None = None,
) -> str:
    """The report; ``notes`` (e.g. :func:`coverage_notes`) are listed under the first line;
    ``depths``: each run's depth (run id -> documents per query at most), a column of the summary."""
    df = metrics.to_pandas()
    per_query = df[df["query_id"] != AGGREGATE_QUERY_ID]
    summary = summary_frame(metrics)
    sig = significance.to_pandas() if significance is not None and significance.num_rows else None
    answered = per_query["measure"].isin(QA_MEASURES)  # an answers run's rows are the gold's questions, not the qrels' queries
    counts = [f"{per_query[~answered]['query_id'].nunique()} queries (the qrels' queries)"] if (~answered).any() or not answered.any() else []
    counts += [f"{per_query[answered]['query_id'].nunique()} questions (the gold answers')"] if answered.any() else []

    lines = [f"# {title}", "", f"{len(summary)} run(s), {', '.join(counts)}.", ""]
    if notes:
        lines += [*(f"- {n}" for n in notes), ""]
    lines += ["## Summary", ""]
    rows = []
    for run_id, row in summary.iterrows():
        cells = []
        for measure, value in row.items():
            mark = ""
            if sig is not None:
                hit = sig[(sig["run_id"] == run_id) & (sig["measure"] == measure)]
                if len(hit) and bool(hit["significant"].iloc[0]):
                    mark = "&dagger;"
            cells.append(figure(value) + mark)
        rows.append([run_id, *([depth_cell(depths, run_id)] if depths is not None else []), *cells])
    depth = ["depth"] if depths is not None else []
    lines += table(["run", *depth, *summary.columns], rows, "l" + "r" * (len(depth) + len(summary.columns)))
    if depths is not None:
        lines += ["", DEPTH_NOTE]
    if sig is not None:
        first = sig.iloc[0]
        lines += [
            "",
            f"&dagger;: differs from `{first['baseline']}` ({first['test']}, {first['correction']} correction "
            f"within each measure, adjusted p < alpha).",
            "",
            "## Significance",
            "",
        ]
        lines += table(["measure", "run", "baseline", "run's", "p", "p adjusted"],  # (each the summary's value over the queries)
                       ([r.measure, r.run_id, figure(r.mean_baseline), figure(r.mean_run), f"{r.p_value:.3g}", f"{r.p_adjusted:.3g}"]
                        for r in sig.itertuples()), "llrrrr")
    for run_id in summary.index:
        block = per_query[per_query["run_id"] == run_id]
        lines += ["", f"## Run `{run_id}`", ""]
        lines += table(["measure", "over queries", "median", "std", "queries > 0"],
                       (_spread(measure, vals) for measure, vals in block.groupby("measure", sort=False)["value"]), "lrrrr")
        if any(m.startswith("gm_") for m in block["measure"].unique()):
            lines += ["", GM_NOTE]
    if plot:
        lines += ["", "## Per-query comparison", "", f"![per-query comparison]({plot})"]
    return "\n".join(lines) + "\n"


def per_query_plot(metrics: pa.Table, measures: str | Sequence[str], baseline: str, path: str | Path) -> Path:
    """:func:`per_query_figure`, written to ``path`` (PNG)."""
    return save_figure(per_query_figure(metrics, measures, baseline), path)


def per_query_figure(metrics: pa.Table, measures: str | Sequence[str], baseline: str):
    """For each run (a row of panels) and each measure (a column), per-query ``measure`` minus
    the baseline's, sorted; the panels of one measure share their y axis, so runs compare at a
    glance. With the baseline alone: its per-query values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = [measures] if isinstance(measures, str) else list(measures)
    df = metrics.to_pandas()
    df = df[(df["query_id"] != AGGREGATE_QUERY_ID) & df["measure"].isin(measures)]
    others = [r for r in dict.fromkeys(df["run_id"]) if r != baseline]
    panels = others or [baseline]
    fig, axes = plt.subplots(len(panels), len(measures), figsize=(6 * len(measures), 2.6 * len(panels)), squeeze=False, sharey="col")
    for col, measure in enumerate(measures):
        wide = df[df["measure"] == measure].pivot(index="query_id", columns="run_id", values="value")
        for ax, run_id in zip(axes[:, col], panels, strict=True):
            if run_id not in wide or baseline not in wide:  # a measure only some runs have (a QA measure of the runs that answer)
                ax.set_axis_off()
                ax.set_title(f"{run_id}: no {measure}")
                continue
            if run_id == baseline:
                values = wide[baseline].sort_values(ascending=False).to_numpy()
                _bars(ax, values, values >= 0, "tab:blue")
                ax.set_ylabel(measure)
                ax.set_title(f"{baseline}: per-query {measure}")
            else:
                delta = (wide[run_id] - wide[baseline]).sort_values(ascending=False).to_numpy()
                better, worse = (delta < 0, delta > 0) if lower_is_better(measure) else (delta > 0, delta < 0)  # (fewer unjudged: unj_10 falls)
                _bars(ax, delta, better, "tab:green")
                _bars(ax, delta, worse, "tab:red")
                ax.axhline(0, color="black", linewidth=0.6)
                wins, losses = int(better.sum()), int(worse.sum())
                ax.set_title(f"{run_id} - {baseline}: {measure} ({wins} better, {losses} worse)")
                ax.set_ylabel(f"delta {measure}")
            ax.set_xlabel("queries, sorted")
    return fig


def _bars(ax, values, where, color) -> None:
    """Unit-width bars from 0 to ``values`` where ``where`` holds, drawn as one filled stairs
    artist (not one patch per query: thousands of queries draw in a blink)."""
    import numpy as np

    ax.stairs(np.where(where, values, 0.0), np.arange(len(values) + 1) - 0.5, baseline=0.0, fill=True, color=color, linewidth=0)
    ax.set_xlim(-0.5, max(len(values) - 0.5, 0.5))


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write (creating the directory) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
