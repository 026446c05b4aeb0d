"""Night-over-night comparison, the metrics history and its plots (`logicrank nightly`).

A night is the per-query metrics of every (query set, pipeline) against one table version.
:func:`compare_nights` pairs tonight with the previous night (and a pinned baseline night)
query by query: a paired test per measure, the p-values corrected within each measure over
every (reference night, query set, pipeline) compared that night, and a regression when the
value over queries (the measure's own aggregation, as the report prints it) changes for the
worse by more than the measure's ``max_drop``: drops, or rises for a measure where lower is
better (``unj_k``, ``rbp_resid``, ``num_nonrel_judged_ret``: ``Measure.lower_is_better``),
and, when the rule asks, the change is significant. A pipeline or query set whose definition changed between the
nights (another config hash) is not compared: the note says so, and that night is the new
reference. :func:`merge_history` replaces a night's rows, so writing the same night twice
leaves one copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.evaluation.measures import lower_is_better, over_queries
from logicrank.pipelines.evaluation.report import save_figure
from logicrank.pipelines.evaluation.significance import adjust, paired_p_value
from logicrank.schemas.tables import AGGREGATE_QUERY_ID, METRICS, NIGHTLY_COMPARISONS, NIGHTLY_HISTORY, conform, require_columns


@dataclass(frozen=True)
class Night:
    """One night's results: ``metrics[query_set]`` is a METRICS table whose run ids are the
    pipelines; ``hashes[(query_set, pipeline)]`` their config hashes."""

    date: str
    table_version: int
    metrics: Mapping[str, pa.Table]
    hashes: Mapping[tuple[str, str], str]


@dataclass(frozen=True)
class Rule:
    max_drop: float
    significant: bool = True


def compare_nights(old: Night | None, new: Night, rules: Mapping[str, Rule], baseline: Night | None = None,
                   test: str = "t-test", correction: str = "holm", alpha: float = 0.05,
                   since: Mapping[tuple[str, str], Night] | None = None) -> pa.Table:
    """One row per reference night (``old``, the previous one; ``baseline``, a pinned one; each
    may be None) and (query set, pipeline, measure) of ``new``: its change from that night
    (NIGHTLY_COMPARISONS). Both references' tests are one family per measure for the correction.
    ``since``: for a (query set, pipeline) that ``old`` ran otherwise or not at all, the first
    night that ran it as ``new`` does, when later than ``old`` (held nights, never served):
    its previous night instead of ``old``."""
    rows, family = [], {}  # measure -> indexes of the rows tested, for the correction
    for reference, against in ((old, "previous"), (baseline, "baseline")):
        if reference is not None:
            _compare(reference, new, rules, against, test, rows, family, since if against == "previous" else None)
    for indexes in family.values():
        for i, p in zip(indexes, adjust([rows[i]["p_value"] for i in indexes], correction), strict=True):
            rows[i]["p_adjusted"] = float(p)
    for row in rows:
        rule = rules.get(row["measure"])
        if rule is not None and row["delta"] is not None:
            worse = row["delta"] if lower_is_better(row["measure"]) else -row["delta"]  # (unj_10 rising is worse)
            row["regression"] = bool(worse > rule.max_drop and (row["p_adjusted"] < alpha if rule.significant else True))
    return pa.Table.from_pylist(rows, schema=NIGHTLY_COMPARISONS)


def _compare(old: Night, new: Night, rules: Mapping[str, Rule], against: str, test: str, rows: list, family: dict,
             since: Mapping[tuple[str, str], Night] | None = None) -> None:
    """``new``'s rows against ``old`` (or a pair's night in ``since``: :func:`compare_nights`)
    appended to ``rows``; each tested row's index to its measure's ``family``."""
    for query_set, metrics in new.metrics.items():
        require_columns(metrics, METRICS, "nightly")
        new_df = _per_query(metrics)
        for (pipeline, measure), values in new_df.groupby(["run_id", "measure"], sort=False):
            key = (query_set, pipeline)
            ref = old
            if since and key in since and old.hashes.get(key) != new.hashes[key]:
                ref = since[key]
            row = {"query_set": query_set, "pipeline": pipeline, "measure": measure, "against": against,
                   "old_date": ref.date, "new_date": new.date, "old_table_version": ref.table_version,
                   "new_table_version": new.table_version, "old_value": None, "new_value": None, "delta": None,
                   "queries": 0, "p_value": None, "p_adjusted": None,
                   "max_drop": rules[measure].max_drop if measure in rules else None, "regression": False,
                   "note": "" if ref is old else (f"the {against} night ({old.date}) ran it otherwise or not at all: compared with "
                                                  f"{ref.date}, the first night that ran it as tonight (held since)")}
            rows.append(row)
            old_df = _per_query(ref.metrics[query_set]) if query_set in ref.metrics else None
            if old_df is None or key not in ref.hashes:
                row["note"] = f"not in the {against} night ({ref.date})"
                continue
            if ref.hashes[key] != new.hashes[key]:
                row["note"] = f"pipeline, encoder, LLM or query set changed since {ref.date}: not compared (this night is the new reference)"
                continue
            before = old_df[(old_df["run_id"] == pipeline) & (old_df["measure"] == measure)].set_index("query_id")["value"]
            after = values.set_index("query_id")["value"]
            if before.empty:  # (a measure added since)
                row["note"] = f"{measure} was not evaluated on {ref.date}: not compared"
                continue
            common = sorted(set(before.index) & set(after.index))
            if not common:
                row["note"] = f"no query in common with {ref.date}"
                continue
            a, b = before.loc[common].to_numpy(np.float64), after.loc[common].to_numpy(np.float64)
            old_value, new_value = over_queries(measure, a), over_queries(measure, b)  # (gm_*: a geometric mean; counts: a sum)
            row.update(old_value=old_value, new_value=new_value, delta=new_value - old_value,
                       queries=len(common), p_value=paired_p_value(a, b, test))
            family.setdefault(measure, []).append(len(rows) - 1)


def _per_query(metrics: pa.Table):
    df = metrics.select(["run_id", "query_id", "measure", "value"]).to_pandas()
    return df[df["query_id"] != AGGREGATE_QUERY_ID]


def history_rows(night: Night, tag: str, comparisons: pa.Table | None) -> pa.Table:
    """The night's rows of the history: each (query set, pipeline, measure)'s mean (the
    evaluation's aggregate row), marked when any comparison found a regression."""
    flagged = set()
    if comparisons is not None and comparisons.num_rows:
        hit = comparisons.filter(comparisons.column("regression"))
        flagged = set(zip(*(hit.column(c).to_pylist() for c in ("query_set", "pipeline", "measure")), strict=True))
    rows = []
    for query_set, metrics in night.metrics.items():
        df = metrics.select(["run_id", "query_id", "measure", "value"]).to_pandas()
        counts = df[df["query_id"] != AGGREGATE_QUERY_ID].groupby(["run_id", "measure"])["query_id"].nunique()
        for r in df[df["query_id"] == AGGREGATE_QUERY_ID].itertuples():
            rows.append({"date": night.date, "table_version": night.table_version, "tag": tag, "query_set": query_set,
                         "pipeline": r.run_id, "measure": r.measure, "value": float(r.value),
                         "queries": int(counts.get((r.run_id, r.measure), 0)), "config_hash": night.hashes[(query_set, r.run_id)],
                         "regression": (query_set, r.run_id, r.measure) in flagged})
    return pa.Table.from_pylist(rows, schema=NIGHTLY_HISTORY)


def merge_history(history: pa.Table | None, night_rows: pa.Table) -> pa.Table:
    """``history`` with the night's rows in place of any earlier rows of that date, sorted by date."""
    dates = set(night_rows.column("date").to_pylist())
    if len(dates) != 1:
        raise ValueError(f"history: one night at a time, not {sorted(dates)}")
    night_rows = conform(night_rows, NIGHTLY_HISTORY, "history")
    if history is None or history.num_rows == 0:
        merged = night_rows
    else:
        history = conform(history, NIGHTLY_HISTORY, "history")
        keep = pc.invert(pc.is_in(history.column("date"), value_set=pa.array(sorted(dates))))
        merged = pa.concat_tables([history.filter(keep), night_rows])
    return merged.sort_by([("date", "ascending"), ("query_set", "ascending"), ("pipeline", "ascending"), ("measure", "ascending")])


def plot_file(measure: str) -> str:
    """A measure's plot file name (``nDCG@10`` -> ``nDCG_10.png``)."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in measure) + ".png"


def plot_history(history: pa.Table, measure: str, path: str | Path) -> Path:
    """``measure`` over the nights: one line per (query set, pipeline), regressions circled in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = history.filter(pc.equal(history.column("measure"), measure)).to_pandas()
    nights = sorted(set(df["date"]))  # one position per night that ran (stopped nights have no point)
    df["night"] = df["date"].map({d: i for i, d in enumerate(nights)})
    fig, ax = plt.subplots(figsize=(8, 4))
    for (query_set, pipeline), line in df.groupby(["query_set", "pipeline"], sort=True):
        line = line.sort_values("night")
        ax.plot(line["night"], line["value"], marker="o", markersize=3, label=f"{pipeline} / {query_set}")
        bad = line[line["regression"]]
        if len(bad):
            ax.scatter(bad["night"], bad["value"], s=140, facecolors="none", edgecolors="red", linewidths=2, zorder=3)
    if df["regression"].any():
        ax.scatter([], [], s=140, facecolors="none", edgecolors="red", linewidths=2, label="regression")
    step = max(1, len(nights) // 12)
    ax.set_xticks(range(0, len(nights), step), nights[::step], rotation=30, ha="right")
    ax.set_ylabel(measure)
    ax.set_title(f"{measure} per night")
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
