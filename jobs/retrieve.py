"""`logicrank retrieve`: run queries against the LanceDB table with one or more methods.

Writes ``<out>/runs/<run_id>.parquet`` (RUN contract) per method, optionally a TREC run
file beside it, and a manifest. Skipped on rerun when the config, the queries and the
table version are unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from jobs.rundir import RunDir, file_fingerprint, write_parquet_atomic
from pipelines.embed import Embedder, model_id, resolve_model
from pipelines.methods.bm25 import bm25
from pipelines.methods.dense import dense
from pipelines.methods.hybrid import rrf
from pipelines.store import DocStore, StoreError
from pipelines.topics import read_queries, write_trec_run
from schemas.config import RetrieveConfig


def run_retrieve(cfg: RetrieveConfig, out: str | Path) -> dict[str, Path]:
    """Returns run_id -> run table path."""
    rundir = RunDir(out, "retrieve")
    queries = read_queries(cfg.queries)
    store = DocStore(cfg.db, cfg.table)
    needs_vectors = any(m in ("dense", "hybrid") for m in cfg.methods)
    if needs_vectors:
        resolve_model(cfg.embed.model)
        if store.model_id() != model_id(cfg.embed):
            raise StoreError(
                f"retrieve: table {cfg.table!r} was embedded with {store.model_id()!r}; "
                f"queries would be embedded with {model_id(cfg.embed)!r}. Use the table's model (--model)."
            )
    run_ids = {m: f"{cfg.run_tag}-{m}" if cfg.run_tag else m for m in cfg.methods}
    outputs = {m: f"runs/{rid}.parquet" for m, rid in run_ids.items()}
    inputs = {"queries": file_fingerprint(cfg.queries), "table": {"db": cfg.db, "name": cfg.table, "version": store.version}}
    if rundir.is_fresh(cfg.digest(), inputs):
        return {run_ids[m]: rundir.path / o for m, o in outputs.items()}

    embedder = None
    if needs_vectors:
        with rundir.timed("load_model"):
            embedder = Embedder(cfg.embed)
    cache: dict[tuple[str, int], pa.Table] = {}

    def scored(method: str, depth: int) -> pa.Table:
        """dense or bm25 to ``depth``, computed once (hybrid reuses them)."""
        if (method, depth) not in cache:
            with rundir.timed(f"{method}@{depth}"):
                cache[method, depth] = dense(queries, store, embedder, depth) if method == "dense" else bm25(queries, store, depth)
        return cache[method, depth]

    produced: dict[str, pa.Table] = {}
    for method in cfg.methods:
        if method == "hybrid":
            run = rrf([scored("dense", cfg.hybrid_depth), scored("bm25", cfg.hybrid_depth)], cfg.k, cfg.rrf_k)
        else:
            run = scored(method, cfg.k)
        rid = run_ids[method]
        run = run.set_column(run.schema.get_field_index("run_id"), "run_id", pa.array([rid] * run.num_rows, pa.string()))
        produced[rid] = run
        write_parquet_atomic(run, rundir.path / outputs[method])
        if cfg.trec:
            write_trec_run(run, rundir.path / f"runs/{rid}.trec")

    rundir.write_manifest(
        cfg.model_dump(mode="json"),
        cfg.digest(),
        inputs,
        list(outputs.values()),
        model=model_id(cfg.embed) if needs_vectors else None,
        rows={rid: t.num_rows for rid, t in produced.items()},
        queries=queries.num_rows,
    )
    return {run_ids[m]: rundir.path / o for m, o in outputs.items()}
