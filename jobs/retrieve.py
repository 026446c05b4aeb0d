"""`logicrank retrieve`: run named pipelines of stages over one LanceDB table.

For each pipeline (run id -> stages) writes ``<out>/runs/<run_id>.parquet`` (RUN contract),
optionally a TREC run file beside it, the side tables its stages produce
(``<out>/<kind>/<run_id>.parquet``: term_scores, predicate_scores, decompositions) and one
manifest. Every pipeline is validated before Ray starts or a model loads.

Where the work runs:
- per-query retrievers (dense, bm25) run over query batches on a Ray Data actor pool
  (``ray.retrieve_actors``), each actor opening the table and the encoder once; the driver
  only assembles the runs, checking that rows stay keyed by the input's query ids. Without
  ``ray.retrieve_actors`` the driver first runs the stage on one query (opening the index
  or loading the encoder) and times it on a probe of the next ones, and finishes there when
  the rest would take at most ``ray.retrieve_local_s`` (a pool costs seconds to start and
  each actor opens the index and the encoder again: at SciFact's size a whole bm25 run takes
  less than the start); otherwise the pool, sized to the cluster's free CPUs, takes the rest;
- every stage that needs the LLM shares one engine pool per job (jobs/llm_service.py);
- the rest (itlr, fusion, rewriters, the rerankers' composition) runs in the driver.

The pipelines run in pipelines/retrieval/runner.py (as in a notebook); this job adds the config, the
inputs' fingerprints, the placement of per-query work (the runner's ``map_queries`` hook) and
the manifest. Each stage's output is cached under ``<out>/stages/<prefix digest>/``: the digest
covers the stages so far (their code, options, and the encoder or LLM config they use), the
queries, the table version and the files they read, computed as a notebook computes it
(:meth:`logicrank.pipelines.retrieval.runner.Inputs.of`). Pipelines that share a prefix compute it once, a rerun
that changes a later stage (orlog's depth, say) reuses the earlier ones, and an edit to a
stage's code recomputes that stage and those after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logicrank.jobs.raysession import local_driver_node, unread_blocks_allowed
from logicrank.jobs.retrieve_notes import fallback_notes, refuse_unparsed
from logicrank.jobs.rundir import RunDir, input_fingerprint
from logicrank.jobs.watchdog import beat
from logicrank.pipelines.config.retrieval import RetrieveConfig
from logicrank.pipelines.config.settings import EmbedConfig
from logicrank.pipelines.engines.embed import concrete, encoder_digest, model_id, resolve_model
from logicrank.pipelines.engines.exact import gpu_share, pool_within_memory, segment_bounds, shard_bounds
from logicrank.pipelines.engines.placement import is_mapped, require_mapped, shard_count
from logicrank.pipelines.engines.store import DocStore
from logicrank.pipelines.engines.vector_models import require_query_model
from logicrank.pipelines.files import write_parquet_atomic
from logicrank.pipelines.io import TopicsError, read_queries, write_trec_run
from logicrank.pipelines.llm.prompts import templates_digest
from logicrank.pipelines.retrieval.pipeline import Pipeline, build
from logicrank.pipelines.retrieval.runner import (
    Hooks,
    Inputs,
    StageCache,
    assemble,
    blank,
    queries_digest,
    reads,
    stage_classes,
    with_content,
)
from logicrank.pipelines.retrieval.stages import Context, Needs, Output, StageOptions
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import RUN


class RetrieveJobError(UserError, RuntimeError):
    """The retrieval actor pool cannot be placed on this cluster."""


def run_retrieve(cfg: RetrieveConfig, out: str | Path, echo: Callable[[str], None] | None = None, progress: bool = True) -> dict[str, Path]:
    """Returns run_id -> run table path. ``echo`` (if given) receives notes (blank queries, a
    skipped rerun) and, with ``progress``, the progress lines of LLM stages."""
    rundir = RunDir(out, "retrieve")
    job = _check_inputs(cfg, echo, progress)
    with rundir.held():  # (after the checks: a refused run makes no directory)
        return _retrieve(cfg, rundir, job, echo, progress)


def _retrieve(cfg: RetrieveConfig, rundir: RunDir, job: _Job, echo: Callable[[str], None] | None, progress: bool) -> dict[str, Path]:
    outputs = {p.name: f"runs/{p.name}.parquet" for p in job.pipelines}
    inputs, files = _fingerprint(cfg, job)
    if job.blank_ids and echo:
        echo(f"retrieve: {len(job.blank_ids)} quer{'y has' if len(job.blank_ids) == 1 else 'ies have'} a blank text and get no results "
             f"from the text stages (e.g. {job.blank_ids[:3]}); they score 0 in evaluation.")
    inputs_read = {str(Path(f).resolve()) for f in job.needs.files}  # a run file this run reads is never moved, wherever it lies
    if _skip_if_fresh(cfg, rundir, job, inputs, inputs_read, echo):
        return {rid: rundir.path / o for rid, o in outputs.items()}
    rundir.begin()
    written, report, llm, encoded = _run_pipelines(cfg, rundir, job, files, outputs, echo, progress)
    made = set(outputs.values()) | set(written) | ({f"runs/{p.name}.trec" for p in job.pipelines} if cfg.trec else set())
    rundir.set_aside([rel for rel in earlier_outputs(rundir, cfg, made) if str((rundir.path / rel).resolve()) not in inputs_read],
                     echo)  # a side table this run's pipelines no longer make
    trec = [f"runs/{p.name}.trec" for p in job.pipelines] if cfg.trec else []  # (a rerun is fresh only with them too)
    rundir.write_manifest(
        cfg.model_dump(mode="json"), cfg.digest(), inputs, list(outputs.values()) + written + trec,
        model=model_id(cfg.embed) if job.needs.encoder else None,
        rows={rid: r["rows"] for rid, r in report.items()},
        pipelines=report,
        queries=job.queries.num_rows, blank_queries=len(job.blank_ids), blank_query_ids=job.blank_ids[:100], table_note=job.table_note,
        llm=llm,
        driver_texts=encoded,  # texts the driver's encoder encoded, and those it had encoded before in this job (ITLR's terms)
    )
    return {rid: rundir.path / o for rid, o in outputs.items()}


@dataclass
class _Job:
    """What a retrieve run works on, checked before Ray starts or a model loads."""

    queries: pa.Table
    store: DocStore
    table_note: str | None
    pipelines: list[Pipeline]
    needs: Needs
    llm: Any  # the job's LLMService, when a stage asks the LLM
    blank_ids: list[str]


def _check_inputs(cfg: RetrieveConfig, echo: Callable[[str], None] | None, progress: bool) -> _Job:
    """The queries, the table's version, the pipelines validated against them, the encoder,
    the files the stages read and the LLM, each refused in one line before any work."""
    queries = read_queries(cfg.queries, cfg.topics_field)
    # the version given, else the last one a completed index run finished (said when newer ones exist)
    store, table_note = DocStore(cfg.db, cfg.table).readable(cfg.table_version, "retrieve")
    if table_note and echo:
        echo(table_note)
    pipelines = [Pipeline(rid, stages) for rid, stages in cfg.pipelines.items()]
    needs = Needs()
    for p in pipelines:
        needs = needs | p.validate(frozenset(queries.column_names))
    refuse_unparsed(pipelines, queries)  # before Ray starts or a model loads
    if needs.encoder:  # before Ray starts: a wrong model fails here
        resolve_model(cfg.embed.model)
        require_query_model(store, model_id(cfg.embed), "retrieve")
    missing = [f for f in dict.fromkeys(needs.files) if not Path(f).is_file()]
    if missing:
        raise TopicsError(f"retrieve: input file(s) not found: {missing}")
    llm = None
    if needs.llm:  # before Ray starts: an unknown model fails here (a registered one is prepared once)
        from logicrank.jobs.llm_service import LLMService

        llm = LLMService(cfg.llm, echo=echo if progress else None)
    blank_ids = queries.filter(blank(queries.column("text"))).column("query_id").to_pylist()
    if all(with_content(queries, reads(p.stages[0])).num_rows == 0 for p in pipelines):
        raise TopicsError(f"queries {cfg.queries}: every query's text is blank; give queries with text.")
    return _Job(queries, store, table_note, pipelines, needs, llm, blank_ids)


def _fingerprint(cfg: RetrieveConfig, job: _Job) -> tuple[dict, dict]:
    """(what the run's outputs depend on, the input files' fingerprints): an unchanged-looking
    rerun is skipped only when none of it changed."""
    inputs = {"queries": input_fingerprint("queries", cfg.queries, TopicsError),
              # the queries as read: a file replaced between the read and the fingerprint above would record the new file's
              # content beside runs of the old, and a rerun on the new file be skipped as fresh
              "queries_read": queries_digest(job.queries),
              "table": {"db": cfg.db, "name": cfg.table, "version": job.store.version, "made": job.store.version_stamp()}}
    files = {f: input_fingerprint("input file", f, TopicsError) for f in dict.fromkeys(job.needs.files)}
    inputs.update({f"file:{f}": fp for f, fp in files.items()})
    # what else changes a stage's output, so that an unchanged-looking rerun is not skipped wrongly: each stage's
    # manual version and the digest of its code (RunDir's own check covers this job's code, every stage's included)
    inputs["stages"] = sorted({(cls.name, cls.version, cls.code()) for p in job.pipelines for cls in stage_classes(p.stages)})
    if job.needs.encoder:  # the encoder as it runs (backend auto: OpenVINO where installed, else torch: other vectors), as the stage keys
        inputs["encoder"] = [model_id(cfg.embed), encoder_digest(cfg.embed)]
    if job.needs.fulltext:  # (another PyStemmer or regex: the table's BM25 index is rebuilt, its runs made again)
        from logicrank.pipelines.engines.bm25.analyzer import analyzer_digest

        inputs["analyzer"] = analyzer_digest()
    if job.llm is not None:
        inputs["llm"] = {"model": job.llm.model_id, "templates": templates_digest(), "engine": cfg.llm.engine_digest()}  # (CPU or GPU dtype)
    return inputs, files


def _skip_if_fresh(cfg: RetrieveConfig, rundir: RunDir, job: _Job, inputs: dict, inputs_read: set[str],
                   echo: Callable[[str], None] | None) -> bool:
    """Set aside what earlier runs wrote in ``--out`` that this one does not make (refusing
    files no retrieve run wrote); True when config and inputs are unchanged since the last
    run, whose runs stand."""
    stale = [rel for rel in earlier_outputs(rundir, cfg) if str((rundir.path / rel).resolve()) not in inputs_read]
    if stale and rundir.previous() is None and not (rundir.path / "stages").is_dir():  # no retrieve run's: the user's files
        shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        raise RetrieveJobError(f"retrieve: --out {rundir.path} holds files that no retrieve run wrote there ({shown}; no manifest.json); "
                               "they would be read as this run's outputs: choose another --out, or move them.")
    rundir.set_aside(stale, echo)  # what earlier runs wrote here that this one does not make
    if not rundir.is_fresh(cfg.digest(), inputs):
        return False
    if echo:
        echo(f"retrieve: config, queries and table v{job.store.version} unchanged since the last run: skipped; runs in {rundir.path / 'runs'}")
    return True


def _run_pipelines(cfg: RetrieveConfig, rundir: RunDir, job: _Job, files: dict, outputs: dict[str, str],
                   echo: Callable[[str], None] | None, progress: bool) -> tuple[list[str], dict, Any, Any]:
    """Every pipeline on the Ray cluster (one LLM pool, stage outputs cached by prefix): its run,
    TREC file and side tables written. Returns (side tables written, per-pipeline report, the
    LLM pool's summary, the texts the driver encoded)."""
    if job.needs.fulltext:  # the BM25 index of this version, made once here rather than by every actor
        from logicrank.pipelines.engines.bm25 import ensure_index

        with rundir.timed("bm25_index"):
            ensure_index(job.store)

    from logicrank.jobs.raysession import ray_session

    # the stage keys as a notebook computes them (the queries' content, so another topics field is other queries):
    # the job and `lr.retrieve` reuse each other's stage outputs
    llm = job.llm
    keys = Inputs.of(job.queries, job.store, encoder_digest(cfg.embed) if job.needs.encoder else None,
                     (llm.model_id, cfg.llm.engine_digest(), templates_digest()) if llm is not None else None, files)
    with ray_session(cfg.ray, llm=llm):
        host = _Host(cfg, job.store, rundir, echo if progress else None, llm)
        try:
            host.check_fit(job.needs)  # every pool fits the cluster, before any stage runs
            cache = StageCache(rundir.path / "stages")
            written, report = [], {}
            for p in job.pipelines:
                result = p.run(host.ctx, job.queries, cache, keys, host.hooks)
                write_parquet_atomic(result.run, rundir.path / outputs[p.name])
                if cfg.trec:
                    write_trec_run(result.run, rundir.path / f"runs/{p.name}.trec")
                for stem, table in result.side.items():
                    written.append(str(write_parquet_atomic(table, rundir.path / f"{stem}.parquet").relative_to(rundir.path)))
                for line in fallback_notes(p.name, result.steps) if echo else ():
                    echo(line)
                report[p.name] = {"rows": result.run.num_rows, "queries": pc.count_distinct(result.run.column("query_id")).as_py(), "stages": result.steps}
        finally:
            llm = host.close()
    return written, report, llm, host.encoded()


class _Host:
    """What the job gives the runner: the stages' context (the table, the encoder and the LLM
    pool, each started on first use, once per job) and the hooks (per-query retrievers in the
    driver or on an actor pool, stage timings in the manifest, the watchdog's beat)."""

    def __init__(self, cfg: RetrieveConfig, store: DocStore, rundir: RunDir, echo, llm=None):
        self.cfg, self.store, self.rundir = cfg, store, rundir
        self.version = store.version  # every reader of the table reads this version
        self.stamp = store.version_stamp()  # (and checks it is this table's: when the version was made)
        self._embedder = None
        self._llm = llm  # the job's LLM service (None: no stage needs it); its actors start on first use
        self.ctx = Context(store, encoder=self._encoder, llm=self._llm_service, llm_model=str(llm.resolved.path) if llm else None, echo=echo,
                           shards=self._shard_map)
        self.hooks = Hooks(map_queries=self._bulk, timed=rundir.timed, done=lambda message: beat(f"retrieve: {message}"))

    def _encoder(self):
        if self._embedder is None:
            from logicrank.pipelines.engines.embed import Embedder, MemoEncoder

            with self.rundir.timed("load_model"):
                self._embedder = MemoEncoder(Embedder(self.cfg.embed))  # a term shared by several pipelines is encoded once
        return self._embedder

    def encoded(self) -> dict | None:
        """Distinct texts the driver's encoder encoded, and those it had encoded before in this job."""
        return None if self._embedder is None else {"encoded": self._embedder.misses, "reused": self._embedder.hits}

    def _llm_service(self):
        if self._llm is None:
            raise RuntimeError("a stage asked for the LLM but no stage declared Needs(llm=...) (a bug)")
        return self._llm

    def close(self) -> dict | None:
        return self._llm.close() if self._llm is not None else None

    def check_fit(self, needs: Needs) -> None:
        import ray

        from logicrank.jobs.raysession import require_fit

        r = self.cfg.ray
        if r.retrieve_actors is not None:  # (a pool sized to the cluster fits it)
            require_fit("retrieve", r.retrieve_actors, r.retrieve_num_cpus, 0.0, ray.cluster_resources(), RetrieveJobError)
        if r.retrieve_shards is not None and r.retrieve_shards * r.retrieve_num_cpus > ray.cluster_resources().get("CPU", 0):
            self._fit_shards(r.retrieve_shards)  # (raises: what fits and what to change)
        if needs.llm:
            self._llm_service().check_fit()

    def _bulk(self, stage, ctx: Context, queries: pa.Table) -> Output:
        """A per-query retriever over query batches: in the driver when the job is small
        (module doc), else on a Ray Data actor pool. The counts say where it ran."""
        import time

        r = self.cfg.ray
        n = queries.num_rows
        if n == 0:
            return Output(run=RUN.empty_table(), counts={"placement": "none"})
        queries = queries.sort_by([("query_id", "ascending")])  # results come in the run's order: assembled without a copy
        shards = shard_count(stage, ctx.store, r)
        if shards is not None:
            return self._sharded(stage, ctx, queries, shards)
        parts, done = [], 0
        if r.retrieve_actors is None and r.retrieve_local_s > 0:
            parts.append(stage.run(ctx, queries.slice(0, 1), []).run)  # opens the index or loads the encoder, untimed
            probe = min(n, 1 + max(1, r.retrieve_batch_rows // 4))
            start = time.perf_counter()
            if probe > 1:
                parts.append(stage.run(ctx, queries.slice(1, probe - 1), []).run)
            done = probe
            rate = (time.perf_counter() - start) / max(1, probe - 1)
            small = rate * (n - done) <= r.retrieve_local_s
            if small or self._encoder_on_one_cpu_node(stage):
                for i in range(done, n, r.retrieve_batch_rows):
                    parts.append(stage.run(ctx, queries.slice(i, r.retrieve_batch_rows), []).run)
                    beat(f"retrieve: {stage.name}: {min(n, i + r.retrieve_batch_rows)} of {n} queries")
                where = "driver" if small else "driver (one CPU node: its encoder uses every core)"
                return Output(run=assemble(parts, stage.name), counts={"placement": where})
        batches = -(-(n - done) // r.retrieve_batch_rows)  # no more actors than batches
        held = self.store.held_bytes()  # what the driver loaded for the stage: each actor loads it again
        actors = r.retrieve_actors or pool_within_memory(min(self._pool_size(), max(1, batches)), held, _cluster_memory())
        self.store.release()  # the driver's copies of the index and the vectors: the actors hold their own
        parts += self._pool(stage, queries.slice(done), actors)
        return Output(run=assemble(parts, stage.name), counts={"placement": f"pool of {actors}" + (f" after {done} in the driver" if done else "")})

    def _sharded(self, stage, ctx: Context, queries: pa.Table, shards: int) -> Output:
        """The stage over ``shards`` search actors, each mapping one range of the index's
        documents (spread over the nodes); per batch the driver analyzes (bm25) or encodes
        (dense) the queries once, every shard searches them, and the driver merges their top k
        exactly and builds the run from the arrays. An actor lost with its node is placed again
        by Ray and its searches sent again (the same shard, the same answer)."""
        import ray

        r, o = self.cfg.ray, stage.options
        engine = stage.name
        if engine == "bm25":
            index = ctx.store.bm25_index()
            bounds = segment_bounds(len(index), shards, index.segment_rows())
        else:
            bounds = shard_bounds(len(ctx.store.vectors(o.precision)), shards)
        # dense shards get a GPU where the cluster has them (an equal share of one when the shards outnumber them): the product runs there
        gpus = int(ray.cluster_resources().get("GPU", 0)) if engine == "dense" and getattr(o, "product", "auto") != "numpy" else 0
        share = gpu_share(shards, gpus)
        self._fit_shards(shards, share)
        restarts = len([node for node in ray.nodes() if node.get("Alive")]) + 2  # each node lost once, and then some; not forever
        actor = ray.remote(ShardSearch).options(num_cpus=r.retrieve_num_cpus, num_gpus=share, max_restarts=restarts, max_task_retries=restarts,
                                                 scheduling_strategy="SPREAD")
        save = getattr(index, "save_id", None) if engine == "bm25" else None  # each shard searches the index whose terms the driver sends
        actors = [actor.remote(self.cfg.db, self.cfg.table, self.version, engine, lo, hi, getattr(o, "precision", "float32"),
                               getattr(o, "product", "auto"), save, self.stamp) for lo, hi in bounds]
        n, rows, parts = queries.num_rows, r.retrieve_batch_rows, []
        try:
            pending = []
            for i in range(0, n, rows):
                batch = queries.slice(i, rows)
                texts = batch.column("text").to_pylist()
                if engine == "bm25":
                    q = index.query_matrix(texts)
                    payload = ray.put((q.indptr, q.indices, q.data, q.shape))
                else:
                    payload = ray.put(np.asarray(ctx.embedder().encode(texts), np.float32))
                pending.append((batch, [a.search.remote(payload, o.k) for a in actors]))
                if len(pending) >= 2:  # one batch searched while the next is prepared
                    parts.append(self._merged(engine, ctx, pending.pop(0), o, n))
            while pending:
                parts.append(self._merged(engine, ctx, pending.pop(0), o, n))
            memory = ray.get([a.memory.remote() for a in actors])
        finally:
            for a in actors:
                ray.kill(a)
        counts = {"placement": f"{shards} shards" + (f" ({share} GPU each)" if share else ""),
                  "shards": [{"rows": [lo, hi], **m} for (lo, hi), m in zip(bounds, memory, strict=True)]}
        return Output(run=assemble(parts, stage.name), counts=counts)

    def _fit_shards(self, shards: int, gpu_share: float = 0.0) -> None:
        """Refuse, before any actor starts, shard actors the cluster cannot hold all at once (Ray
        would leave the last ones pending, and the job would wait forever); the LLM pool gives
        its CPUs and GPUs back first when the shards would fit without it."""
        import ray

        r = self.cfg.ray
        total = ray.cluster_resources()
        need = shards * r.retrieve_num_cpus
        if self._llm is not None and crowded(self._llm.holds(), total, need, shards * gpu_share):
            self._llm.release()
        if need > total.get("CPU", 0) or (gpu_share and shards * gpu_share > total.get("GPU", 0)):
            most = int(total.get("CPU", 0) // r.retrieve_num_cpus)
            raise RetrieveJobError(f"retrieve: {shards} search shards x {r.retrieve_num_cpus} CPU need {need:g} CPU, the cluster has "
                                   f"{total.get('CPU', 0):g}; give --shards {most} or fewer (each shard then maps more: "
                                   "ray.retrieve_shard_bytes), lower ray.retrieve_num_cpus, or add nodes.")

    def _shard_map(self, task, merge):
        """``Context.shards`` (ITLR's exact scoring): ``task(store, (lo, hi))`` on one search actor
        per shard of the table's rows, spread over the nodes, the parts merged by ``merge``; None
        (the stage scores the table in the driver) when the vectors fit one actor's
        ``ray.retrieve_shard_bytes`` and no ``ray.retrieve_shards`` is given."""
        import math

        import ray

        r = self.cfg.ray
        n = self.store.count()
        shards = r.retrieve_shards or math.ceil(n * self.store.dim * 4 / r.retrieve_shard_bytes)
        if r.retrieve_shards is None and (shards <= 1 or not is_mapped(self.store)):
            return None
        require_mapped(self.store, shards)
        self._fit_shards(shards)
        restarts = len([node for node in ray.nodes() if node.get("Alive")]) + 2
        actor = ray.remote(_ShardTask).options(num_cpus=r.retrieve_num_cpus, max_restarts=restarts, max_task_retries=restarts,
                                               scheduling_strategy="SPREAD")
        bounds = shard_bounds(n, shards)
        actors = [actor.remote(self.cfg.db, self.cfg.table, self.version, self.stamp) for _ in bounds]
        try:
            work = ray.put(task)
            parts = ray.get([a.run.remote(work, b) for a, b in zip(actors, bounds, strict=True)])
        finally:
            for a in actors:
                ray.kill(a)
        beat(f"retrieve: {len(bounds)} shards scored")
        return merge(parts)

    def _merged(self, engine: str, ctx: Context, sent, o, n: int) -> pa.Table:
        import ray

        from logicrank.pipelines.engines.bm25 import merge_keys
        from logicrank.pipelines.retrieval.methods.bm25 import run_from_hits
        from logicrank.pipelines.retrieval.methods.dense import merge_top, run_table

        batch, futures = sent
        found = ray.get(futures)
        shard_searched()
        qids = batch.column("query_id")
        if engine == "bm25":
            index = ctx.store.bm25_index()
            run = run_from_hits(qids, index, *index.hits(*merge_keys(found, o.k)))
        else:
            vecs = ctx.store.vectors(o.precision)
            rows, scores = merge_top(found, vecs.tiebreak, o.k)
            run = run_table(qids.to_pylist(), vecs, rows.reshape(len(qids), -1), scores.reshape(len(qids), -1))
        beat(f"retrieve: {engine}: {run.num_rows} rows merged from the shards ({n} queries)")
        return run

    def _encoder_on_one_cpu_node(self, stage) -> bool:
        """A stage that encodes queries, on a cluster of one node without GPUs: the driver's
        encoder already uses every core there, and a pool of encoders only adds its start and
        the batches' transfers (30,000 SciFact queries: 416 q/s in the driver, 306 on 1 or 2
        actors; docs/bulk-retrieval.md)."""
        import ray

        if not stage.needs().encoder:
            return False
        alive = [node for node in ray.nodes() if node.get("Alive")]
        here = local_driver_node(self.cfg.ray)  # None on a cluster joined by address or through Ray Client
        return here is not None and len(alive) == 1 and alive[0].get("NodeID") == here and not ray.cluster_resources().get("GPU", 0)

    def _pool_size(self) -> int:
        """As many retrieval actors as the cluster's CPUs hold beside the LLM pool (at least one)."""
        import ray

        r = self.cfg.ray
        cpus = ray.cluster_resources().get("CPU", 1.0)
        held = self._llm.holds() if self._llm is not None else None
        if held and cpus - held["CPU"] >= r.retrieve_num_cpus:
            cpus -= held["CPU"]
        return max(1, int(cpus // r.retrieve_num_cpus))

    def _pool(self, stage, queries: pa.Table, actors: int) -> list[pa.Table]:
        import ray

        from logicrank.pipelines.engines.embed import resolve_model as resolved

        r = self.cfg.ray
        n = queries.num_rows
        if n == 0:
            return []
        if self._llm is not None and crowded(self._llm.holds(), ray.cluster_resources(), actors * r.retrieve_num_cpus):
            self._llm.release()  # the LLM pool gives its CPUs back when the retrieval pool would not fit beside it
        embed = concrete(self.cfg.embed).model_copy(update={"model": str(resolved(self.cfg.embed.model))}) if stage.needs().encoder else None
        ds = ray.data.from_arrow([queries.slice(i, r.retrieve_batch_rows) for i in range(0, n, r.retrieve_batch_rows)])
        ds = ds.map_batches(
            _RetrieveActor,
            fn_constructor_kwargs={"db": self.cfg.db, "table": self.cfg.table, "version": self.version, "embed": embed, "options": stage.options,
                                   "stamp": self.stamp},
            compute=ray.data.ActorPoolStrategy(size=actors),
            batch_size=r.retrieve_batch_rows,
            batch_format="pyarrow",
            num_cpus=r.retrieve_num_cpus,
        )
        unread_blocks_allowed(ds)  # results flow without pausing the actors (jobs/raysession.py)
        parts = []
        for part in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            parts.append(part)
            beat(f"retrieve: {stage.name}: {sum(p.num_rows for p in parts)} result rows")
        return parts


def crowded(held: Mapping[str, float], total: Mapping[str, float], cpus: float, gpus: float = 0.0) -> bool:
    """True when work that needs ``cpus`` and ``gpus`` does not fit the cluster (``total``)
    beside what the LLM pool holds (``held``, nothing when no pool runs or is kept for the
    job): the pool gives it back first, or the work would wait for ever."""
    return bool(held) and (cpus > total.get("CPU", 0) - held.get("CPU", 0) or (gpus > 0 and gpus > total.get("GPU", 0) - held.get("GPU", 0)))


def _cluster_memory() -> float:
    """Ray's ``memory`` resource of the cluster: what tasks and actors may use (bytes)."""
    import ray

    return float(ray.cluster_resources().get("memory", 0.0))


def shard_searched() -> None:
    """Called in the driver after each batch's shards answered (a seam for the fault tests, which
    kill a node once a batch has been searched)."""


class ShardSearch:
    """A Ray actor holding one shard of a table version's index, mapped: the BM25 weights'
    postings of rows ``[lo, hi)`` (the collection's statistics whole: the weights were made
    over every document) or those rows' vectors. It searches what the driver sends (analyzed
    queries, or query vectors) and returns its top k as keys (bm25) or (rows, scores) (dense).
    A BM25 shard refuses to start on a save of the index other than the driver's (``save_id``:
    its term ids and rows would not be the driver's)."""

    def __init__(self, db: str, table: str, version: int, engine: str, lo: int, hi: int, precision: str, product: str,
                 save_id: str | None = None, stamp: str | None = None):
        import psutil

        self._start = psutil.Process().memory_full_info()  # before the index is mapped: what the shard adds is measured against it
        store = pinned(db, table, version, stamp)
        self.engine, self.shard, self.product = engine, (lo, hi), product
        self.index = store.bm25_index() if engine == "bm25" else store.vectors(precision)
        if engine == "bm25" and getattr(self.index, "save_id", None) != save_id:
            raise RuntimeError(f"bm25: the saved index of table {table!r} v{version} was replaced during the job "
                               f"(save {getattr(self.index, 'save_id', None)}, the driver's {save_id}); rerun the job")

    def search(self, payload, k: int):
        if self.engine == "bm25":
            import scipy.sparse as sp

            indptr, indices, data, shape = payload
            return self.index.search_keys(sp.csr_matrix((data, indices, indptr), shape=shape), k, self.shard)
        from logicrank.pipelines.engines.exact import top_k

        return top_k(payload, self.index, k, shard=self.shard, product=self.product)

    def memory(self) -> dict:
        """This actor's memory: peak resident (ru_maxrss), and now its resident, unique and
        proportional set sizes (MiB; shared mapped pages count in RSS, once per node in PSS), and
        its RSS and PSS when it started, before its shard was mapped."""
        import resource

        import psutil

        info, start = psutil.Process().memory_full_info(), self._start
        mib = 1 << 20
        return {"node": _node_ip(), "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "rss_mib": round(info.rss / mib, 1), "uss_mib": round(info.uss / mib, 1), "pss_mib": round(info.pss / mib, 1),
                "rss_at_start_mib": round(start.rss / mib, 1), "pss_at_start_mib": round(start.pss / mib, 1)}


def pinned(db: str, table: str, version: int, stamp: str | None) -> DocStore:
    """The table at the driver's version, as an actor opens it: refused where that version was
    made at another time than the driver's (``stamp``), the table dropped and made again during
    the job (its version numbers start over), so that no part of a run searches another table."""
    store = DocStore(db, table, version=version)
    if stamp is not None and (made := store.version_stamp()) != stamp:
        raise RuntimeError(f"retrieve: table {table!r} v{version} was made again during the job (made {made}, the "
                           f"driver's {stamp}); rerun the job")
    return store


class _ShardTask:
    """A Ray actor that runs a stage's scoring over one shard of a table version's rows
    (``Context.shards``: ITLR's exact scoring reads its rows' vectors and keeps its top k)."""

    def __init__(self, db: str, table: str, version: int, stamp: str | None = None):
        self.store = pinned(db, table, version, stamp)

    def run(self, task, rows: tuple[int, int]):
        return task(self.store, rows)


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address() + ":" + ray.get_runtime_context().get_node_id()[:8]


class _RetrieveActor:
    """A Ray Data actor: the table and the encoder opened once, then one stage over query batches."""

    def __init__(self, db: str, table: str, version: int, embed: EmbedConfig | None, options: StageOptions, stamp: str | None = None):
        store = pinned(db, table, version, stamp)
        embedder = None
        if embed is not None:
            from logicrank.pipelines.engines.embed import Embedder

            embedder = Embedder(embed)
        self.ctx = Context(store, encoder=lambda: embedder)
        self.stage = build(options)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.stage.run(self.ctx, batch, []).run


def output_dirs() -> list[str]:
    """Where the job writes under its ``out``: ``runs/`` and one directory per kind of side
    table a stage declares (``term_scores/``, ``answers/``, ...); never ``stages/``, the cache."""
    from logicrank.pipelines.retrieval.stages import stages as registered

    return ["runs", *sorted({kind for cls in registered().values() for kind in cls.side_tables})]


def earlier_outputs(rundir: RunDir, cfg: RetrieveConfig, made: set[str] | None = None) -> list[str]:
    """The files in the job's output directories that this run does not make: ``made`` (its
    outputs, once written) when given, else what its pipelines can write (``runs/<run id>.parquet``,
    ``.trec`` with ``trec``, ``<kind>/<run id>[@<where>].parquet``), so a rerun that is skipped or
    resumed keeps its own."""
    names = set(cfg.pipelines)

    def ours(rel: str) -> bool:
        folder, name = rel.split("/", 1)
        if made is not None:
            return rel in made
        if folder == "runs":
            return name in {f"{p}.parquet" for p in names} | ({f"{p}.trec" for p in names} if cfg.trec else set())
        return name.endswith(".parquet") and name.removesuffix(".parquet").split("@", 1)[0] in names

    return [rel for rel in rundir.files_in(output_dirs(), (".parquet", ".trec")) if not ours(rel)]
