"""The main job: index bundled SciFact, retrieve with dense / BM25 / hybrid, evaluate; then
ITLR's synthetic logical benchmark (base vs ITLR vs calibrated ITLR, operator ablation).

Dense nDCG@10 of all-MiniLM-L6-v2 on SciFact is published by MTEB as 0.645; this job
reports how close a fresh index + retrieval + evaluation comes to it.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from jobs.evaluate import run_evaluate
from jobs.index import run_index
from jobs.itlr_bench import run_itlr_bench
from jobs.llm_demo import run_llm_demo
from jobs.raysession import ray_session
from jobs.retrieve import run_retrieve
from jobs.rundir import write_text_atomic
from pipelines.datasets import scifact
from pipelines.evaluate.report import summary_frame
from schemas.config import EmbedConfig, EvaluateConfig, IndexConfig, RayConfig, RetrieveConfig

PUBLISHED_DENSE_NDCG10 = 0.645  # MTEB, all-MiniLM-L6-v2 on SciFact
TOLERANCE = 0.005


def run_main(out: str | Path, embed: EmbedConfig, ray: RayConfig, progress: bool = True, echo=print) -> dict:
    with ray_session(ray):  # one cluster for both index runs
        return _run_main(Path(out), embed, ray, progress, echo)


def _run_main(out: Path, embed: EmbedConfig, ray: RayConfig, progress: bool, echo) -> dict:
    data = scifact()
    db = str(out / "lancedb")
    echo(f"[1/5] index {data.corpus} -> {db}")
    summary = run_index(IndexConfig(corpus=str(data.corpus), db=db, embed=embed, ray=ray), out / "index", progress=progress)
    echo(f"      {summary.inserted} inserted, {summary.updated} updated, {summary.unchanged} unchanged, "
         f"{summary.deleted} deleted, {summary.rejected} rejected in {summary.seconds:.1f} s (table v{summary.table_version})")
    echo("[2/5] retrieve 300 queries: dense, bm25, hybrid")
    runs = run_retrieve(
        RetrieveConfig.preset(("dense", "bm25", "hybrid"), queries=str(data.queries), db=db, k=100, embed=embed, trec=True, ray=ray),
        out / "retrieve",
    )
    echo("[3/5] evaluate")
    metrics = run_evaluate(
        EvaluateConfig(qrels=str(data.qrels), runs=tuple(str(p) for p in runs.values())),
        out / "evaluate",
        title="SciFact (BEIR test): dense vs BM25 vs hybrid",
    )
    ndcg = summary_frame(metrics)["nDCG@10"].to_dict()
    dense = ndcg.get("dense")
    reproduced = dense is not None and abs(dense - PUBLISHED_DENSE_NDCG10) <= TOLERANCE
    for rid, v in ndcg.items():
        echo(f"      nDCG@10 {rid:7s} {v:.4f}")
    echo(f"      dense vs published MTEB {PUBLISHED_DENSE_NDCG10}: {dense:.4f} -> "
         f"{'reproduced' if reproduced else 'NOT reproduced'} (tolerance {TOLERANCE})")
    echo("[4/5] ITLR synthetic logical benchmark (32 templates x 10 queries from SciFact text)")
    itlr = run_itlr_bench(out / "itlr", embed, ray, echo=echo)
    t1 = itlr["table1"]
    for setting in ("own", "pooled"):
        for method in ("base", "itlr"):
            row = t1[(t1["setting"] == setting) & (t1["method"] == method)].set_index("negations")["ndcg@10"]
            echo(f"      {setting:6s} {method:5s} nDCG@10 by negations 0/1/2/3: " + "/".join(f"{row[n]:.3f}" for n in range(4)))
    echo("[5/5] LLM decomposition -> ITLR (SmolLM2-135M on vLLM: plumbing and demo, not quality)")
    llm = run_llm_demo(out / "llm", out / "itlr", embed, ray, echo=echo)
    for rid, v in llm["ndcg@10"].items():
        echo(f"      nDCG@10 {rid:18s} {v:.4f}")
    _link_reports(out)
    echo(f"report: {out / 'report.md'}")
    return {"index": asdict(summary), "ndcg@10": ndcg, "reproduced": reproduced, "llm": llm["ndcg@10"]}


def _link_reports(out: Path) -> None:
    """One entry page: the retrieval report, then the ITLR tables."""
    retrieval = (out / "evaluate" / "report.md").read_text(encoding="utf-8").replace("](plots/", "](evaluate/plots/")
    itlr = (out / "itlr" / "itlr_report.md").read_text(encoding="utf-8").replace("# ITLR", "## ITLR", 1)
    llm = (out / "llm" / "llm_report.md").read_text(encoding="utf-8")
    write_text_atomic(retrieval + "\n" + itlr + "\n" + llm, out / "report.md")
