"""`logicrank itlr-bench`: the synthetic logical benchmark end to end.

generate (seeded, from bundled SciFact) -> index with the Ray index job -> embed queries and
unique terms once -> base / ITLR / calibrated ITLR / random by negation count, and the
operator grid -> ``itlr_table1.parquet``, ``itlr_ablation.parquet``, ``itlr_report.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jobs.index import run_index
from jobs.raysession import ray_session
from jobs.rundir import RunDir
from pipelines.benchmarks.itlr import evaluate_synthetic, markdown
from pipelines.datasets import scifact
from pipelines.embed import Embedder, model_id
from pipelines.files import write_parquet_atomic, write_text_atomic
from pipelines.generate.synthetic import generate
from pipelines.methods.itlr import Calibration, labelled_scores, parse_queries, unique_terms
from pipelines.store import DocStore
from pipelines.topics import read_qrels, read_queries
from schemas.config import EmbedConfig, IndexConfig, RayConfig


def run_itlr_bench(out: str | Path, embed: EmbedConfig, ray: RayConfig, per_template: int = 10, seed: int = 0, echo=print) -> dict:
    out = Path(out)
    rundir = RunDir(out, "itlr-bench")
    syn = out / "synthetic"
    with rundir.timed("generate"):
        counts = generate(scifact().corpus, syn, per_template=per_template, seed=seed)
    echo(f"      generated {counts['queries']} queries (32 templates x {per_template}), {counts['docs']} documents")
    db = out / "lancedb"
    with ray_session(ray), rundir.timed("index"):
        run_index(IndexConfig(corpus=str(syn / "corpus.jsonl"), db=str(db), embed=embed, ray=ray), out / "index")
    store = DocStore(str(db))
    blocks = list(store.vector_blocks(read_ahead=False))
    ids = [d for block_ids, _ in blocks for d in block_ids]
    V = np.concatenate([v for _, v in blocks])
    queries = read_queries(syn / "queries.jsonl")
    meta = {r["_id"]: r for r in map(json.loads, (syn / "queries.jsonl").read_text().splitlines())}
    labels = [json.loads(line) for line in (syn / "labels.jsonl").read_text().splitlines()]
    own: dict[str, set[str]] = {}
    for r in labels:
        own.setdefault(r["query_id"], set()).add(r["doc_id"])

    with rundir.timed("score"):
        embedder = Embedder(embed)
        parsed = parse_queries(queries)
        if any(q.status != "ok" for q in parsed):
            raise RuntimeError("itlr-bench: a generated logical query did not parse (a generator bug)")
        terms = unique_terms(parsed)
        T = embedder.encode(terms)
        Q = embedder.encode(queries.column("text").to_pylist())
        S = V @ T.T
        calibrations = {
            "none": Calibration(),
            "zscore": Calibration.zscore(terms, S),
            "sigmoid": Calibration.fit_sigmoid(labelled_scores(labels, terms, T, dict(zip(ids, V, strict=True)))),
        }
        table1, ablation = evaluate_synthetic(
            parsed, [meta[q.query_id]["negations"] for q in parsed], own, ids, V, Q, terms, T, calibrations,
            read_qrels(syn / "qrels" / "test.tsv"), {r["doc_id"]: r["present"] for r in labels},
        )
    write_parquet_atomic(_arrow(table1), out / "itlr_table1.parquet")
    write_parquet_atomic(_arrow(ablation), out / "itlr_ablation.parquet")
    report = markdown(table1, ablation, model_id(embed))
    write_text_atomic(report, out / "itlr_report.md")
    rundir.write_manifest(
        {"per_template": per_template, "seed": seed, "embed": embed.model_dump(mode="json")},
        f"{per_template}-{seed}-{embed.digest()}",
        {"scifact": str(scifact().corpus)},
        ["itlr_table1.parquet", "itlr_ablation.parquet", "itlr_report.md"],
        counts=counts,
        unique_terms=len(terms),
    )
    return {"table1": table1, "ablation": ablation, "report": out / "itlr_report.md"}


def _arrow(df):
    import pyarrow as pa

    return pa.Table.from_pandas(df, preserve_index=False)
