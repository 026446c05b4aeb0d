"""Score fusion by CombSUM and CombMNZ (Fox and Shaw, "Combination of multiple searches",
TREC-2, 1994): each run's scores min-max normalised per query, then summed over the runs
(CombSUM), or summed and multiplied by the number of runs that retrieved the document
(CombMNZ). A document a run did not retrieve adds 0 to the sum and nothing to the count.
ranx calls these ``fusion(method="sum" | "mnz", norm="min-max")``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa

from logicrank.pipelines.methods.ranking import rank_pairs
from logicrank.schemas.tables import RUN, require_columns


def min_max(scores: pd.Series, query_ids: pd.Series) -> pd.Series:
    """Each query's scores mapped to [0, 1]; a query whose scores are all equal gets 1 for each
    (every document is that run's best), as ranx does."""
    by = scores.groupby(query_ids)
    low, high = by.transform("min"), by.transform("max")
    span = high - low
    return pd.Series(np.where(span > 0, (scores - low) / span.where(span > 0, 1.0), 1.0), index=scores.index)


def comb(runs: Sequence[pa.Table], k: int, rule: Literal["sum", "mnz"] = "mnz", run_id: str = "comb") -> pa.Table:
    """The fused run (RUN contract) of ``runs`` by CombSUM (``rule="sum"``) or CombMNZ
    (``"mnz"``) over min-max normalised scores, each query's top ``k``."""
    if not runs:
        raise ValueError("comb: give at least one run to fuse")
    frames = []
    for run in runs:
        require_columns(run, RUN.names[:4], "comb")
        df = run.select(["query_id", "doc_id", "score"]).to_pandas()
        df["score"] = min_max(df["score"].astype(float), df["query_id"])
        frames.append(df)
    pairs = pd.concat(frames, ignore_index=True).groupby(["query_id", "doc_id"], as_index=False)["score"].agg(["sum", "count"])
    pairs["score"] = pairs["sum"] * (pairs["count"] if rule == "mnz" else 1)
    return rank_pairs(pairs[["query_id", "doc_id", "score"]], k, f"comb{rule}", run_id)
