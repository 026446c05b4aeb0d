"""Hybrid retrieval: reciprocal-rank fusion (Cormack et al., 2009) of ranked runs."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from logicrank.pipelines.retrieval.methods.ranking import rank_pairs
from logicrank.schemas.tables import RUN, require_columns


def rrf(runs: Sequence[pa.Table], k: int, rrf_k: int = 60, run_id: str = "hybrid") -> pa.Table:
    """score(d) = sum over runs of 1 / (rrf_k + rank(d)); a document absent from a run adds 0."""
    if not runs:
        raise ValueError("rrf: give at least one run to fuse")
    frames = []
    for run in runs:
        require_columns(run, RUN.names[:3], "rrf")
        df = run.select(["query_id", "doc_id", "rank"]).to_pandas()
        df["score"] = 1.0 / (rrf_k + df["rank"].astype(float))
        frames.append(df)
    import pandas as pd

    pairs = pd.concat(frames, ignore_index=True).groupby(["query_id", "doc_id"], as_index=False)["score"].sum()
    return rank_pairs(pairs, k, "hybrid", run_id)
