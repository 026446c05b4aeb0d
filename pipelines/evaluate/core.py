"""Evaluate run tables against qrels into the long metrics table."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from pipelines.evaluate.measures import Measure, RankedGains
from schemas.tables import AGGREGATE_QUERY_ID, METRICS, QRELS, RUN, conform, require_columns


def ranked_gains(run: pa.Table, qrels: pa.Table, query_ids: Sequence[str], depth: int | None) -> RankedGains:
    """Relevance of each run's ranked documents for ``query_ids`` (in that order).

    The ranking follows the run's ``rank`` column; ``depth`` None keeps the whole run.
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


def evaluate_run(run: pa.Table, qrels: pa.Table, measures: Sequence[Measure], run_id: str | None = None) -> pa.Table:
    """Per-query values of every measure for one run, plus the mean as query ``all``.

    Queries evaluated: those in the qrels (a query the run misses scores 0).
    """
    require_columns(run, RUN.names[:3], "evaluate")
    qrels = conform(qrels, QRELS, "evaluate")
    if run_id is None:
        ids = run.column("run_id").unique().to_pylist() if "run_id" in run.column_names else []
        if len(ids) != 1:
            raise ValueError(f"evaluate: the run holds run_ids {ids[:5]}; evaluate one run at a time or pass run_id.")
        run_id = ids[0]
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
