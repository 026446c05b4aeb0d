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

Each stage's output is cached under ``<out>/stages/<prefix digest>/``: the digest covers the
stages so far (their options, and the encoder or LLM config they use), the queries, the
table version and the files they read. Pipelines that share a prefix compute it once, and a
rerun that changes a later stage (orlog's depth, say) reuses the earlier ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.raysession import local_driver_node, unread_blocks_allowed
from jobs.rundir import RunDir, input_fingerprint, write_parquet_atomic, write_text_atomic
from jobs.watchdog import beat
from pipelines.embed import concrete, model_id, resolve_model
from pipelines.pipeline import build, validate
from pipelines.stages import Context, Kind, Needs, Output, StageOptions
from pipelines.store import DocStore
from pipelines.topics import TopicsError, read_queries, write_trec_run
from schemas.config import EmbedConfig, RetrieveConfig
from schemas.digest import json_digest
from schemas.errors import UserError
from schemas.tables import RUN, conform


class RetrieveJobError(UserError, RuntimeError):
    """The retrieval actor pool cannot be placed on this cluster."""


def run_retrieve(cfg: RetrieveConfig, out: str | Path, echo: Callable[[str], None] | None = None, progress: bool = True) -> dict[str, Path]:
    """Returns run_id -> run table path. ``echo`` (if given) receives notes (blank queries, a
    skipped rerun) and, with ``progress``, the progress lines of LLM stages."""
    rundir = RunDir(out, "retrieve")
    queries = read_queries(cfg.queries)
    store = DocStore(cfg.db, cfg.table, version=cfg.table_version)
    needs = Needs()
    for name, stages in cfg.pipelines.items():
        needs = needs | validate(name, stages, frozenset(queries.column_names))
    if needs.encoder:  # before Ray starts: a wrong model fails here
        resolve_model(cfg.embed.model)
        store.require_model(model_id(cfg.embed), "retrieve")
    missing = [f for f in dict.fromkeys(needs.files) if not Path(f).is_file()]
    if missing:
        raise TopicsError(f"retrieve: input file(s) not found: {missing}")
    llm = None
    if needs.llm:  # before Ray starts: an unknown model fails here (a registered one is prepared once)
        from jobs.llm_service import LLMService

        llm = LLMService(cfg.llm, echo=echo if progress else None)
    blank = _blank(queries.column("text")).to_pylist()
    blank_ids = [q for q, b in zip(queries.column("query_id").to_pylist(), blank, strict=True) if b]
    starts = {rid: _reads(stages[0]) for rid, stages in cfg.pipelines.items()}  # the query columns each pipeline starts from
    if all(_with_content(queries, reads).num_rows == 0 for reads in starts.values()):
        raise TopicsError(f"queries {cfg.queries}: every query's text is blank; give queries with text.")
    outputs = {rid: f"runs/{rid}.parquet" for rid in cfg.pipelines}
    inputs = {"queries": input_fingerprint("queries", cfg.queries, TopicsError), "table": {"db": cfg.db, "name": cfg.table, "version": store.version}}
    inputs.update({f"file:{f}": input_fingerprint("input file", f, TopicsError) for f in dict.fromkeys(needs.files)})
    # what else changes a stage's output, so that an unchanged-looking rerun is not skipped wrongly
    inputs["stages"] = sorted({(cls.name, cls.version) for cls in _stage_classes(cfg.pipelines.values())})
    if needs.encoder:
        inputs["encoder"] = model_id(cfg.embed)
    if llm is not None:
        inputs["llm"] = {"model": llm.model_id, "templates": _template_digest()}
    if blank_ids and echo:
        echo(f"retrieve: {len(blank_ids)} quer{'y has' if len(blank_ids) == 1 else 'ies have'} a blank text and get no results "
             f"from the text stages (e.g. {blank_ids[:3]}); they score 0 in evaluation.")
    if rundir.is_fresh(cfg.digest(), inputs):
        if echo:
            echo(f"retrieve: config, queries and table v{store.version} unchanged since the last run: skipped; runs in {rundir.path / 'runs'}")
        return {rid: rundir.path / o for rid, o in outputs.items()}

    if needs.fulltext:  # the BM25 index of this version, made once here rather than by every actor
        from pipelines.sparse import ensure_index

        with rundir.timed("bm25_index"):
            ensure_index(store)

    from jobs.raysession import ray_session

    with ray_session(cfg.ray):
        executor = _Executor(cfg, store, rundir, inputs, echo if progress else None, llm)
        try:
            executor.check_fit(needs)  # every pool fits the cluster, before any stage runs
            written, report = [], {}
            for rid, stages in cfg.pipelines.items():
                state, steps = executor.pipeline(stages, _with_content(queries, starts[rid]), json_digest([executor.base, "input", starts[rid]]))
                run = conform(state.run.set_column(state.run.schema.get_field_index("run_id"), "run_id", pa.array([rid] * state.run.num_rows, pa.string())), RUN, "retrieve")
                write_parquet_atomic(run, rundir.path / outputs[rid])
                if cfg.trec:
                    write_trec_run(run, rundir.path / f"runs/{rid}.trec")
                for (kind, where), table in state.side.items():  # <kind>/<run_id>.parquet, or <kind>/<run_id>@<where>.parquet
                    name = f"{rid}@{where}.parquet" if where else f"{rid}.parquet"  # '@' is not allowed in a run id
                    written.append(str(write_parquet_atomic(table, rundir.path / kind / name).relative_to(rundir.path)))
                report[rid] = {"rows": run.num_rows, "queries": len(set(run.column("query_id").to_pylist())), "stages": steps}
        finally:
            llm = executor.close()
    rundir.write_manifest(
        cfg.model_dump(mode="json"), cfg.digest(), inputs, list(outputs.values()) + written,
        model=model_id(cfg.embed) if needs.encoder else None,
        rows={rid: r["rows"] for rid, r in report.items()},
        pipelines=report,
        queries=queries.num_rows, blank_queries=len(blank_ids), blank_query_ids=blank_ids[:100],
        llm=llm,
    )
    return {rid: rundir.path / o for rid, o in outputs.items()}


def _stage_classes(pipelines) -> list:
    """Every stage class the pipelines use, sub-pipelines included."""
    out = []
    for stages in pipelines:
        for options in stages:
            out.append(type(build(options)))
            out += _stage_classes(getattr(options, "of", ()))
    return out


def _reads(options: StageOptions) -> tuple[str, ...]:
    """The query columns a pipeline starting with this stage reads (a fusion: its sub-pipelines')."""
    stage = build(options)
    if stage.kind is Kind.FUSION:
        return tuple(dict.fromkeys(c for sub in options.of for c in _reads(sub[0])))
    return stage.reads


def _blank(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.fill_null(pc.equal(pc.utf8_trim_whitespace(col), ""), True)


def _with_content(queries: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """The queries with something in at least one of ``columns`` (a stage's ``reads``).

    A blank text asks for nothing: the text stages return no results for it (rather than
    dense ranking the whole corpus by the empty string's vector while BM25 returns
    nothing); itlr still runs a blank-text query that carries its own logical form. Blank
    queries are counted in the manifest and score 0 in evaluation (trec_eval -c's rule)."""
    keep = pc.invert(_blank(queries.column(columns[0])))
    for c in columns[1:]:
        keep = pc.or_(keep, pc.invert(_blank(queries.column(c))))
    return queries.filter(keep)


class _State:
    """What flows between stages: the queries, the run so far, the side tables."""

    def __init__(self, queries: pa.Table, run: pa.Table | None = None, side: dict | None = None):
        """``side``: (kind, where) -> table; where is "" for the pipeline's own stages."""
        self.queries, self.run, self.side = queries, run, dict(side or {})


class _Executor:
    """Runs pipelines stage by stage, each stage's output cached by its prefix digest."""

    def __init__(self, cfg: RetrieveConfig, store: DocStore, rundir: RunDir, inputs: dict, echo, llm=None):
        self.cfg, self.store, self.rundir, self.echo = cfg, store, rundir, echo
        self.base = json_digest([inputs["queries"], inputs["table"]])  # a stage adds the files it reads itself
        self.files = {k.removeprefix("file:"): v for k, v in inputs.items() if k.startswith("file:")}
        self.version = inputs["table"]["version"]  # every reader of the table reads this version
        self.memo: dict[str, Output] = {}
        self._embedder = None
        self._llm = llm  # the job's LLM service (None: no stage needs it); its actors start on first use
        self.ctx = Context(store, encoder=self._encoder, llm=self._llm_service, llm_model=str(llm.resolved.path) if llm else None, echo=echo)

    # the encoder and the LLM pool start on first use, once per job
    def _encoder(self):
        if self._embedder is None:
            from pipelines.embed import Embedder

            with self.rundir.timed("load_model"):
                self._embedder = Embedder(self.cfg.embed)
        return self._embedder

    def _llm_service(self):
        if self._llm is None:
            raise RuntimeError("a stage asked for the LLM but no stage declared Needs(llm=...) (a bug)")
        return self._llm

    def close(self) -> dict | None:
        return self._llm.close() if self._llm is not None else None

    def check_fit(self, needs: Needs) -> None:
        import ray

        from jobs.raysession import require_fit

        r = self.cfg.ray
        if r.retrieve_actors is not None:  # (a pool sized to the cluster fits it)
            require_fit("retrieve", r.retrieve_actors, r.retrieve_num_cpus, 0.0, ray.cluster_resources(), RetrieveJobError)
        if needs.llm:
            self._llm_service().check_fit()

    def pipeline(self, stages: tuple[StageOptions, ...], queries: pa.Table, key: str) -> tuple[_State, list[dict]]:
        """Run ``stages`` from ``queries``, whose prefix digest is ``key``."""
        state, steps = _State(queries), []
        for i, options in enumerate(stages, 1):
            stage = build(options)
            runs, subs = [], []
            if stage.kind is Kind.RERANKER:
                runs = [state.run]
            elif stage.kind is Kind.FUSION:  # each sub-pipeline starts from this point's queries (and shares its cache)
                for j, sub in enumerate(options.of, 1):
                    sub_state, sub_steps = self.pipeline(sub, state.queries, key)
                    runs.append(sub_state.run)
                    subs.append(sub_steps[-1]["digest"])  # the fusion's key covers everything its inputs depend on
                    steps.append({"stage": f"{options.stage}[{j}]", "sub": sub_steps})
                    for (kind, where), table in sub_state.side.items():  # kept, named by where they come from
                        state.side[kind, f"{i}-{options.stage}{j}" + (f"-{where}" if where else "")] = table
            key = self._key(key, stage, subs)
            out, cached = self._stage(key, stage, state.queries, runs)
            if out.queries is not None:
                state.queries = out.queries
            if out.run is not None:
                state.run = out.run
            for kind, table in out.side.items():  # a second table of a kind in one pipeline is named by its stage's position
                state.side[kind, "" if (kind, "") not in state.side else f"{i}-{options.stage}"] = table
            steps.append({"stage": options.stage, "digest": key, "cached": cached, **out.counts})
        return state, steps

    def _key(self, prev: str, stage, subs: list[str]) -> str:
        """The digest of a stage's output: the prefix before it, the stage (name, code version,
        options), its sub-pipelines' digests, and what it reads: the encoder's config, the LLM
        (its checkpoint's id, its engine config, the prompt templates) and its input files."""
        needs = stage.needs()
        parts = [prev, stage.name, stage.version, stage.options.model_dump(mode="json"), subs]
        if needs.encoder:
            parts.append(["embed", _embed_digest(self.cfg.embed)])
        if needs.llm:
            parts.append(["llm", self._llm_service().model_id, self.cfg.llm.engine_digest(), _template_digest()])
        parts += [["file", self.files[f]] for f in needs.files]
        return json_digest(parts)

    def _stage(self, key: str, stage, queries: pa.Table, runs: list[pa.Table]) -> tuple[Output, bool]:
        if key in self.memo:
            return self.memo[key], True
        where = self.rundir.path / "stages" / key
        if (where / "done.json").is_file():
            out = _load(where)
            self.memo[key] = out
            return out, True
        bulk = stage.per_query and stage.kind is Kind.RETRIEVER
        with self.rundir.timed(f"{stage.name}:{key[:8]}"):
            out = self._bulk(stage, queries) if bulk else stage.run(self.ctx, queries, runs)
        if out.queries is not None and out.queries.column("query_id").to_pylist() != queries.column("query_id").to_pylist():
            raise RuntimeError(f"{stage.name}: a rewriter must return one row per query, in order (a bug)")
        if out.run is not None:  # a run assembled from actor batches must also rank each query 1..n
            _check_keyed(out.run, queries, stage.name, contiguous=bulk)
        _save(out, where)
        self.memo[key] = out
        beat(f"retrieve: stage {stage.name} done")
        return out, False

    def _bulk(self, stage, queries: pa.Table) -> Output:
        """A per-query retriever over query batches: in the driver when the job is small
        (module doc), else on a Ray Data actor pool. The counts say where it ran."""
        import time

        r = self.cfg.ray
        n = queries.num_rows
        if n == 0:
            return Output(run=RUN.empty_table(), counts={"placement": "none"})
        parts, done = [], 0
        if r.retrieve_actors is None and r.retrieve_local_s > 0:
            parts.append(stage.run(self.ctx, queries.slice(0, 1), []).run)  # opens the index or loads the encoder, untimed
            probe = min(n, 1 + max(1, r.retrieve_batch_rows // 4))
            start = time.perf_counter()
            if probe > 1:
                parts.append(stage.run(self.ctx, queries.slice(1, probe - 1), []).run)
            done = probe
            rate = (time.perf_counter() - start) / max(1, probe - 1)
            small = rate * (n - done) <= r.retrieve_local_s
            if small or self._encoder_on_one_cpu_node(stage):
                for i in range(done, n, r.retrieve_batch_rows):
                    parts.append(stage.run(self.ctx, queries.slice(i, r.retrieve_batch_rows), []).run)
                    beat(f"retrieve: {stage.name}: {min(n, i + r.retrieve_batch_rows)} of {n} queries")
                where = "driver" if small else "driver (one CPU node: its encoder uses every core)"
                return Output(run=_assemble(parts, stage.name), counts={"placement": where})
        batches = -(-(n - done) // r.retrieve_batch_rows)  # no more actors than batches
        held = self.store.held_bytes()  # what the driver loaded for the stage: each actor loads it again
        actors = r.retrieve_actors or pool_within_memory(min(self._pool_size(), max(1, batches)), held, _cluster_memory())
        self.store.release()  # the driver's copies of the index and the vectors: the actors hold their own
        parts += self._pool(stage, queries.slice(done), actors)
        return Output(run=_assemble(parts, stage.name), counts={"placement": f"pool of {actors}" + (f" after {done} in the driver" if done else "")})

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

        from pipelines.embed import resolve_model as resolved

        r = self.cfg.ray
        n = queries.num_rows
        if n == 0:
            return []
        if self._llm is not None:  # the LLM pool gives its CPUs/GPUs back when the retrieval pool would not fit beside it
            free = ray.cluster_resources()
            held = self._llm.holds()
            if held and (actors * r.retrieve_num_cpus > free.get("CPU", 0) - held["CPU"]):
                self._llm.release()
        embed = concrete(self.cfg.embed).model_copy(update={"model": str(resolved(self.cfg.embed.model))}) if stage.needs().encoder else None
        ds = ray.data.from_arrow([queries.slice(i, r.retrieve_batch_rows) for i in range(0, n, r.retrieve_batch_rows)])
        ds = ds.map_batches(
            _RetrieveActor,
            fn_constructor_kwargs={"db": self.cfg.db, "table": self.cfg.table, "version": self.version, "embed": embed, "options": stage.options},
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


ACTOR_BASE_BYTES = 1 << 30  # an actor's own footprint beside the engine's data: Python, torch, the encoder, a batch


def pool_within_memory(actors: int, engine_bytes: int, cluster_bytes: float) -> int:
    """At most as many retrieval actors as the cluster's memory holds, each with its own copy
    of the engine's data (``engine_bytes``, as the driver held it) plus ``ACTOR_BASE_BYTES``;
    at least one. Unknown cluster memory (0): no cap."""
    if cluster_bytes <= 0:
        return actors
    return max(1, min(actors, int(cluster_bytes // (engine_bytes + ACTOR_BASE_BYTES))))


def _cluster_memory() -> float:
    """Ray's ``memory`` resource of the cluster: what tasks and actors may use (bytes)."""
    import ray

    return float(ray.cluster_resources().get("memory", 0.0))


def _assemble(parts: list[pa.Table], stage: str) -> pa.Table:
    """The batches' runs as one, by query id then rank (batches arrive in any order). The sort
    is Arrow's ``sort_by([query_id, rank])`` computed on integers: each row's query id replaced
    by its position among the distinct ids in byte order (a string sort of millions of rows
    cost seconds)."""
    run = pa.concat_tables([conform(p, RUN, stage) for p in parts]) if parts else RUN.empty_table()
    if run.num_rows == 0:
        return run
    ids = pc.unique(run.column("query_id"))
    ids = ids.take(pc.sort_indices(ids))  # Arrow sorts strings by bytes, as sort_by does
    where = pc.index_in(run.column("query_id"), value_set=ids).to_numpy().astype(np.int64)  # any number of chunks
    rank = run.column("rank").to_numpy().astype(np.int64)
    low, span = int(rank.min()), int(rank.max() - rank.min()) + 1
    # one int64 key: 6x faster than lexsort over 3M rows (it sorts runs of ascending keys)
    fits = len(ids) * span < 2**62
    order = np.argsort(where * span + (rank - low), kind="stable") if fits else np.lexsort((rank, where))
    return run.take(order)


class _RetrieveActor:
    """A Ray Data actor: the table and the encoder opened once, then one stage over query batches."""

    def __init__(self, db: str, table: str, version: int, embed: EmbedConfig | None, options: StageOptions):
        store = DocStore(db, table, version=version)
        embedder = None
        if embed is not None:
            from pipelines.embed import Embedder

            embedder = Embedder(embed)
        self.ctx = Context(store, encoder=lambda: embedder)
        self.stage = build(options)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.stage.run(self.ctx, batch, []).run


def _check_keyed(run: pa.Table, queries: pa.Table, stage: str, contiguous: bool = True) -> None:
    """Rows keyed by the input: every row belongs to an input query, each (query, doc) once,
    and (``contiguous``) each query's ranks are 1..n."""
    asked = set(queries.column("query_id").to_pylist())
    df = run.select(["query_id", "doc_id", "rank"]).to_pandas()
    stray = set(df["query_id"]) - asked
    dup = int(df.duplicated(["query_id", "doc_id"]).sum())
    ranks_ok = True
    if contiguous and len(df):
        df = df.sort_values(["query_id", "rank"], kind="stable")
        ranks_ok = bool((df["rank"].to_numpy() == df.groupby("query_id", sort=False).cumcount().to_numpy() + 1).all())
    if stray or dup or not ranks_ok:
        raise RuntimeError(f"{stage}: the run is not keyed by the input queries (a bug): "
                           f"{len(stray)} unknown query ids (e.g. {sorted(stray)[:3]}), {dup} duplicate pairs, ranks contiguous: {ranks_ok}")


def _embed_digest(embed: EmbedConfig) -> str:
    """What can change a vector: the model, the backend that runs it and its precision, the device,
    batch size and token window (not the thread count). Query encoders hold no GPU: ``auto`` is the CPU."""
    embed = concrete(embed)
    precision = "f32" if embed.backend == "openvino" else None  # (OpenVINO's bf16 default once gave other vectors)
    return json_digest([model_id(embed), embed.backend, precision, embed.device, embed.batch_size, embed.max_seq_length])


def _template_digest() -> str:
    """Every prompt template's hash: an edited prompt is a new LLM stage output."""
    from pipelines.llm import prompts

    return json_digest(sorted((name, prompts.load(name).sha) for name in prompts.names()))


def _save(out: Output, where: Path) -> None:
    if out.queries is not None:
        write_parquet_atomic(out.queries, where / "queries.parquet")
    if out.run is not None:
        write_parquet_atomic(out.run, where / "run.parquet")
    for kind, table in out.side.items():
        write_parquet_atomic(table, where / f"side-{kind}.parquet")
    write_text_atomic(json.dumps({"counts": out.counts, "side": sorted(out.side)}, default=str), where / "done.json")


def _load(where: Path) -> Output:
    meta = json.loads((where / "done.json").read_text(encoding="utf-8"))
    q, r = where / "queries.parquet", where / "run.parquet"
    return Output(
        queries=pq.read_table(q) if q.exists() else None,
        run=pq.read_table(r) if r.exists() else None,
        side={kind: pq.read_table(where / f"side-{kind}.parquet") for kind in meta["side"]},
        counts=meta["counts"],
    )
