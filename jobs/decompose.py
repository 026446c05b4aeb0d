"""`logicrank decompose`: LLM decompositions of a queries table, on an actor pool of engines.

The job's one LLM service (jobs/llm_service.py: an actor pool of vLLM engines behind the
persistent cache) generates DECOMPOSITIONS rows: one per (query, method), whatever the
model writes. The driver checks that every (query, method) came back exactly once, then
writes ``<out>/decompositions.parquet`` atomically and a manifest with the counts by
method and status, the tokens, the cache hits, the model id and the template hashes.


"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from logicrank.jobs.llm_service import LLMService
from logicrank.jobs.raysession import ray_session
from logicrank.jobs.rundir import RunDir, file_fingerprint
from logicrank.pipelines.config.retrieval import DecomposeConfig
from logicrank.pipelines.files import write_parquet_atomic
from logicrank.pipelines.io import read_queries
from logicrank.pipelines.llm import prompts
from logicrank.pipelines.llm.decompose import TEMPLATES, check_conserved, decompose, settings_of
from logicrank.pipelines.llm.models import resolve
from logicrank.pipelines.retrieval.runner import queries_digest
from logicrank.schemas.tables import DECOMPOSITIONS, conform


@dataclass
class DecomposeSummary:
    path: Path
    rows: int
    by_status: dict[str, dict[str, int]] = field(default_factory=dict)  # method -> status -> rows
    prompts_run: int = 0  # rows computed by an engine (not cache hits, not errors)
    cache_hits: int = 0
    seconds: float = 0.0
    skipped: bool = False


def run_decompose(cfg: DecomposeConfig, out: str | Path, progress: bool = False, echo=print) -> DecomposeSummary:
    start = time.perf_counter()
    rundir = RunDir(out, "decompose")
    queries = read_queries(cfg.queries, cfg.topics_field).select(["query_id", "text"])
    resolved = resolve(cfg.llm.model, log=echo)  # prepares a registered model once, before any actor starts
    templates = {m: prompts.load(TEMPLATES[m]).sha for m in cfg.methods}
    # the queries as read beside the file's fingerprint, as retrieve records them: a file replaced while the model was
    # prepared was recorded beside decompositions of the queries read before, and a rerun on it skipped as fresh
    inputs = {"queries": file_fingerprint(cfg.queries), "queries_read": queries_digest(queries), "model": resolved.model_id,
              "templates": templates, "engine": cfg.llm.engine_digest()}  # (dtype auto: float32 on a CPU, the GPU's own there)
    with rundir.held():
        return _decompose(cfg, rundir, progress, echo, start, queries, inputs)


def _decompose(cfg: DecomposeConfig, rundir: RunDir, progress: bool, echo, start: float, queries: pa.Table, inputs: dict) -> DecomposeSummary:
    target = rundir.path / "decompositions.parquet"
    if rundir.is_fresh(cfg.digest(), inputs):
        prev = rundir.previous() or {}
        return DecomposeSummary(target, prev.get("rows", 0), prev.get("by_status", {}), skipped=True)

    n = queries.num_rows
    rundir.begin()
    llm = LLMService(cfg.llm, echo=(lambda line: echo(f"decompose: {line}")) if progress else None)
    with ray_session(cfg.ray, llm=llm), rundir.timed("decompose"):
        try:
            table = decompose(llm, queries.column("query_id").to_pylist(), queries.column("text").to_pylist(), settings_of(cfg))
        finally:
            pool = llm.close()
    table = conform(table, DECOMPOSITIONS, "decompose")
    check_conserved(queries, table, cfg.methods)
    write_parquet_atomic(table, target)

    by_status: dict[str, dict[str, int]] = {}
    for method, status in zip(table.column("method").to_pylist(), table.column("status").to_pylist(), strict=True):
        by_status.setdefault(method, Counter())[status] += 1
    cached = pc.sum(table.column("cached")).as_py() or 0
    errors = sum(c.get("error", 0) for c in by_status.values())
    summary = DecomposeSummary(
        target, table.num_rows, {m: dict(c) for m, c in by_status.items()},
        prompts_run=table.num_rows - cached - errors, cache_hits=cached, seconds=time.perf_counter() - start,
    )
    fresh = pc.invert(table.column("cached"))
    rundir.write_manifest(
        cfg.model_dump(mode="json"), cfg.digest(), inputs, ["decompositions.parquet"],
        rows=table.num_rows, queries=n, by_status=summary.by_status, model=inputs["model"], prompt_sha=inputs["templates"],
        prompts_run=summary.prompts_run, cache_hits=cached, llm=pool,
        prompt_tokens=pc.sum(pc.filter(table.column("prompt_tokens"), fresh)).as_py() or 0,
        generated_tokens=pc.sum(pc.filter(table.column("generated_tokens"), fresh)).as_py() or 0,
    )
    return summary
