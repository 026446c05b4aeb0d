"""Evaluate run tables against qrels into the long metrics table.

The numbers equal trec_eval's (``-c``) or the run is refused. A run is ranked by its
``rank`` column: :func:`logicrank.pipelines.io.read_run` has already re-ranked a TREC file by
score as trec_eval does (score descending, equal scores by docno descending), and a Parquet
run keeps its stage's ranks, checked by :func:`logicrank.pipelines.io.check_run` (distinct
positive ranks, never a better rank with a lower score; finite scores; each (query, doc)
pair once). Qrels must judge each pair once. Qrels queries the run misses score 0; run
queries absent from the qrels are not evaluated (:func:`query_coverage` counts both).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from logicrank.pipelines.evaluate.measures import Measure, RankedGains
from logicrank.pipelines.io import Duplicates, check_qrels, check_run
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import AGGREGATE_QUERY_ID, METRICS, QRELS, RUN, conform, require_columns


class EvaluationError(UserError, ValueError):
    """Runs that cannot be evaluated together as given (run ids, baseline)."""


def ranked_gains(run: pa.Table, qrels: pa.Table, query_ids: Sequence[str], depth: int | None) -> RankedGains:
    """Relevance of each run's ranked documents for ``query_ids`` (in that order).

    The ranking follows the run's ``rank`` column (checked by :func:`evaluate_run`, not
    here); ``depth`` None keeps the whole run.
    """
    require_columns(run, ["query_id", "doc_id", "rank"], "evaluate")
    require_columns(qrels, QRELS, "evaluate")
    q = qrels.select(["query_id", "doc_id", "relevance"]).to_pandas()
    r = run.select(["query_id", "doc_id", "rank"]).to_pandas()
    r = r.sort_values(["query_id", "rank"], kind="stable")
    r["pos"] = r.groupby("query_id", sort=False).cumcount()
    if depth is not None:
        r = r[r["pos"] < depth]
    r = r.merge(q, on=["query_id", "doc_id"], how="left")
    r["relevance"] = r["relevance"].fillna(0)

    index = {qid: i for i, qid in enumerate(query_ids)}
    n = len(query_ids)
    r = r[r["query_id"].isin(index)]
    width = int(r["pos"].max()) + 1 if len(r) else 1
    gains = np.zeros((n, width))
    gains[r["query_id"].map(index).to_numpy(dtype=np.int64), r["pos"].to_numpy(dtype=np.int64)] = r["relevance"].to_numpy(dtype=float)

    q = q[q["query_id"].isin(index)].sort_values(["query_id", "relevance"], ascending=[True, False])
    q["pos"] = q.groupby("query_id", sort=False).cumcount()
    iwidth = int(q["pos"].max()) + 1 if len(q) else 1
    ideal = np.zeros((n, iwidth))
    ideal[q["query_id"].map(index).to_numpy(dtype=np.int64), q["pos"].to_numpy(dtype=np.int64)] = q["relevance"].to_numpy(dtype=float)
    n_rel = (ideal >= 1).sum(axis=1)
    return RankedGains(gains=gains, ideal=ideal, n_relevant=n_rel)


def evaluate_run(
    run: pa.Table, qrels: pa.Table, measures: Sequence[Measure], run_id: str | None = None, duplicates: Duplicates = "refuse"
) -> pa.Table:
    """Per-query values of every measure for one run, plus the mean as query ``all``.

    Queries evaluated: those in the qrels (a query the run misses scores 0, trec_eval -c).
    The run and qrels are checked first (module docstring); ``duplicates="first"`` keeps
    each repeated (query, doc) pair's best-ranked row instead of refusing the run.
    """
    require_columns(run, RUN.names[:3], "evaluate")
    qrels = conform(qrels, QRELS, "evaluate")
    check_qrels(qrels, "evaluate: qrels")
    ids = run.column("run_id").unique().to_pylist() if "run_id" in run.column_names else []
    if len(ids) > 1 or (run_id is None and not ids):
        raise EvaluationError(f"evaluate: the run holds run_ids {ids[:5]}; evaluate one run at a time, or pass run_id for a run without one.")
    run_id = run_id if run_id is not None else ids[0]
    run = check_run(run, f"evaluate: run {run_id!r}", duplicates)
    query_ids = sorted(set(qrels.column("query_id").to_pylist()))
    depths = [m.depth for m in measures]
    depth = None if any(d is None for d in depths) else max(depths)
    gains = ranked_gains(run, qrels, query_ids, depth)

    frames = []
    for m in measures:
        values = m.compute(gains)
        frames.append(pd.DataFrame({"query_id": query_ids, "measure": str(m), "value": values}))
        frames.append(pd.DataFrame({"query_id": [AGGREGATE_QUERY_ID], "measure": [str(m)], "value": [float(values.mean()) if len(values) else 0.0]}))
    df = pd.concat(frames, ignore_index=True)
    df.insert(0, "run_id", run_id)
    return pa.Table.from_pandas(df, schema=METRICS, preserve_index=False)


def query_coverage(run: pa.Table, qrels: pa.Table) -> tuple[int, int]:
    """(qrels queries with no row in the run: they score 0, run queries absent from the qrels: not evaluated)."""
    in_run = set(run.column("query_id").unique().to_pylist())
    in_qrels = set(qrels.column("query_id").unique().to_pylist())
    return len(in_qrels - in_run), len(in_run - in_qrels)
