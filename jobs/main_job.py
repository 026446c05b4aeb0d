"""The main job: index bundled SciFact, retrieve with dense / BM25 / hybrid, evaluate.

Dense nDCG@10 of all-MiniLM-L6-v2 on SciFact is published by MTEB as 0.645; this job
reports how close a fresh index + retrieval + evaluation comes to it.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pyarrow as pa

from jobs.evaluate import run_evaluate
from jobs.index import run_index
from jobs.raysession import ray_session
from jobs.retrieve import run_retrieve
from pipelines.datasets import scifact
from schemas.config import EmbedConfig, EvaluateConfig, IndexConfig, RayConfig, RetrieveConfig
from schemas.tables import AGGREGATE_QUERY_ID

PUBLISHED_DENSE_NDCG10 = 0.645  # MTEB, all-MiniLM-L6-v2 on SciFact
TOLERANCE = 0.005


def run_main(out: str | Path, embed: EmbedConfig, ray: RayConfig, progress: bool = True, echo=print) -> dict:
    out = Path(out)
    data = scifact()
    db = str(out / "lancedb")
    with ray_session(ray):
        echo(f"[1/3] index {data.corpus} -> {db}")
        summary = run_index(IndexConfig(corpus=str(data.corpus), db=db, embed=embed, ray=ray), out / "index", progress=progress)
    echo(f"      {summary.inserted} inserted, {summary.updated} updated, {summary.unchanged} unchanged, "
         f"{summary.deleted} deleted, {summary.rejected} rejected in {summary.seconds:.1f} s (table v{summary.table_version})")
    echo("[2/3] retrieve 300 queries: dense, bm25, hybrid")
    runs = run_retrieve(
        RetrieveConfig(queries=str(data.queries), db=db, methods=("dense", "bm25", "hybrid"), k=100, embed=embed, trec=True),
        out / "retrieve",
    )
    echo("[3/3] evaluate")
    metrics = run_evaluate(
        EvaluateConfig(qrels=str(data.qrels), runs=tuple(str(p) for p in runs.values())),
        out / "evaluate",
        title="SciFact (BEIR test): dense vs BM25 vs hybrid",
    )
    agg = metrics.filter(pa.compute.equal(metrics.column("query_id"), AGGREGATE_QUERY_ID)).to_pandas()
    ndcg = agg[agg["measure"] == "nDCG@10"].set_index("run_id")["value"].to_dict()
    dense = ndcg.get("dense")
    reproduced = dense is not None and abs(dense - PUBLISHED_DENSE_NDCG10) <= TOLERANCE
    for rid, v in ndcg.items():
        echo(f"      nDCG@10 {rid:7s} {v:.4f}")
    echo(f"      dense vs published MTEB {PUBLISHED_DENSE_NDCG10}: {dense:.4f} -> "
         f"{'reproduced' if reproduced else 'NOT reproduced'} (tolerance {TOLERANCE})")
    echo(f"report: {out / 'evaluate' / 'report.md'}")
    return {"index": asdict(summary), "ndcg@10": ndcg, "reproduced": reproduced}
