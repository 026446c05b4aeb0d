"""Running a pipeline, in any process: stage by stage, each output cached by its prefix digest.

:meth:`logicrank.pipelines.retrieval.pipeline.Pipeline.run` calls :func:`run_stages`. What flows between stages
is the queries (a rewriter replaces them), the run so far and the side tables. A fusion
stage's children (:meth:`Stage.children`) run first, each from the fusion's queries.

A retriever after a stage that produced a run gets that run and scores only its candidates
(validation refuses one that cannot: :meth:`Stage.after_run`), here. Per-query retrievers
(``Stage.per_query``) with no run before them go through a ``map_queries`` hook: by default
:func:`in_process`, batches in this process; the retrieve job (jobs/retrieve.py) hands them
to a Ray Data actor pool instead. Either way the runner checks the rows stay keyed by the
input's query ids, each query ranked 1..n.

Each stage's output is keyed by the stages so far (their names, the digests of their code,
their manual ``version`` and options), the sub-pipelines' keys, the runner's own code, and what
the stage reads (:class:`Inputs`: the queries' content and the table's version, the encoder's
config, the LLM and its prompts, the files' content). A stage's code digest
(:meth:`Stage.code`, :mod:`logicrank.pipelines.codedigest`) covers its module and every project module it
imports, so an edit to a method is recomputed and an edit elsewhere is not. The retrieve job
builds its :class:`Inputs` with :meth:`Inputs.of` as a notebook does, so each reuses the
other's stage outputs. A :class:`StageCache`
keeps outputs by key in memory and, given a directory, on disk, so pipelines that share a
prefix compute it once and a rerun that changes a later stage reuses the earlier ones.
Given a directory, a stage also gets a checkpoint of its own key (``<key>.partial``) where an
LLM stage writes its shards as they finish (:mod:`logicrank.pipelines.retrieval.stages.shards`): a killed run
resumes from them, and they are removed once the whole output is cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logicrank.pipelines.codedigest import code_digest, source_digest
from logicrank.pipelines.files import write_parquet_atomic, write_text_atomic
from logicrank.pipelines.retrieval.stages.base import Checkpoint, Context, Kind, Output, Stage, StageOptions, Store
from logicrank.pipelines.retrieval.stages.registry import build
from logicrank.schemas.digest import json_digest
from logicrank.schemas.tables import RUN, conform

MapQueries = Callable[[Stage, Context, pa.Table], Output]
"""Runs a per-query retriever over the queries, in any order of batches; returns its run
(assembled by :func:`assemble`) and counts (``placement``: where it ran)."""


@dataclass(frozen=True)
class Inputs:
    """What a stage's output depends on besides the stages themselves (part of every key)."""

    base: str  # the queries and the table (its version)
    encoder: str | None = None  # pipelines.engines.embed.encoder_digest of the query encoder's config
    llm: tuple | None = None  # (model id, engine config digest, prompt templates digest)
    files: Mapping[str, Any] = field(default_factory=dict)  # input file -> its fingerprint

    @classmethod
    def of(cls, queries: pa.Table, store: Store, encoder: str | None = None, llm: tuple | None = None,
           files: Iterable[str] = ()) -> Inputs:
        """From the queries' content, the table's identity (its database's absolute path, its
        name), version and the time that version was made (a table dropped and made again
        reuses version numbers), and the files' content. The one way to key: the retrieve job
        (jobs/retrieve.py) and a notebook (``Pipeline.run``, ``lr.retrieve``) both build theirs
        here, so each reuses the other's stage outputs."""
        stamp = getattr(store, "version_stamp", lambda: "")()
        table = {"db": table_uri(store), "name": getattr(store, "name", ""), "version": store.version, "made": stamp}
        base = json_digest([{"sha256": queries_digest(queries)}, table])
        return cls(base, encoder, llm, {f: {"sha256": content_digest(f)} for f in files})

    def key(self, prev: str, stage: Stage, subs: Sequence[str]) -> str:
        """The digest of ``stage``'s output after the prefix ``prev``: the stage (name, the digest
        of its code, its manual ``version``, options), its sub-pipelines' keys, and the encoder,
        BM25 analyzer, LLM and files it reads."""
        needs = stage.needs()
        parts = [prev, stage.name, stage.code(), stage.version, stage.options.model_dump(mode="json"), list(subs)]
        if needs.encoder:
            if self.encoder is None:
                raise ValueError(f"stage {stage.name} encodes queries: give Inputs an encoder digest (pipelines.engines.embed.encoder_digest)")
            parts.append(["embed", self.encoder])
        if needs.fulltext:  # the analyzer and the libraries it reads (PyStemmer, regex, Unicode): its index is rebuilt under another
            from logicrank.pipelines.engines.bm25.analyzer import analyzer_digest

            parts.append(["fulltext", analyzer_digest()])
        if needs.llm:
            if self.llm is None:
                raise ValueError(f"stage {stage.name} asks the LLM: give Inputs the LLM's (model id, engine digest, templates digest)")
            parts.append(["llm", *self.llm])
        for f in needs.files:
            if f not in self.files:
                raise ValueError(f"stage {stage.name} reads {f}: give Inputs its fingerprint")
            parts.append(["file", self.files[f]])
        return json_digest(parts)


def queries_digest(queries: pa.Table) -> str:
    """The SHA-256 of a queries table's content (its columns and rows, as one Arrow IPC stream
    of one batch without schema metadata): the same queries read from the same file, or given
    as a table, digest alike however their chunks are laid out."""
    table = queries.replace_schema_metadata(None).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(1, table.num_rows))
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def content_digest(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, or of the names and bytes of every file under a directory."""
    p = Path(path)
    if not p.is_dir():
        return hashlib.sha256(p.read_bytes()).hexdigest()
    h = hashlib.sha256()
    for f in sorted(f for f in p.rglob("*") if f.is_file()):
        h.update(f.relative_to(p).as_posix().encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def table_uri(store: Store) -> str:
    """A table's database as a key holds it: a local path made absolute (a relative path and
    its absolute spelling are one table), a URI (``s3://...``) as it is."""
    uri = str(getattr(store, "uri", ""))
    return uri if not uri or "://" in uri else os.path.abspath(uri)


class StageCache:
    """Stage outputs by key: in memory, and as Parquet under ``root/<key>/`` when a root is given."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else None
        self.memo: dict[str, Output] = {}

    def get(self, key: str) -> Output | None:
        if key in self.memo:
            return self.memo[key]
        if self.root is not None and (self.root / key / "done.json").is_file():
            out = _load(self.root / key)
            if out is not None:
                self.memo[key] = out
            return out
        return None

    def put(self, key: str, out: Output) -> None:
        if self.root is not None:
            _save(out, self.root / key)
            shutil.rmtree(self.root / f"{key}.partial", ignore_errors=True)  # the stage's shards: its whole output now stands
        self.memo[key] = out

    def checkpoint(self, key: str) -> Checkpoint | None:
        """Where the stage of this key keeps its finished shards while it runs (``<key>.partial``
        beside its output; pipelines/retrieval/stages/shards.py); None without a directory."""
        return None if self.root is None else Checkpoint(self.root / f"{key}.partial", key)


@dataclass
class Result:
    """One pipeline's output: its run (the RUN contract, ``run_id`` set), its side tables by
    file stem (``<kind>/<run_id>``, or ``<kind>/<run_id>@<where>`` for a second table of a
    kind or one from a fusion's child) and a step per stage (digest, cached, counts)."""

    run_id: str
    run: pa.Table
    side: dict[str, pa.Table]
    steps: list[dict]

    def to_pandas(self):
        return self.run.to_pandas()


@dataclass
class Hooks:
    """How a runner reaches its host: where per-query retrievers run, how a stage is timed,
    what is said when a stage is done (a job's watchdog beat)."""

    map_queries: MapQueries | None = None  # None: in_process()
    timed: Callable[[str], AbstractContextManager] = lambda label: nullcontext()
    done: Callable[[str], None] = lambda message: None


CONTEXT_CODE = ("logicrank.pipelines.engines.store", "logicrank.pipelines.llm.engine", "logicrank.jobs.llm_service")
"""The modules behind a stage's :class:`~logicrank.pipelines.retrieval.stages.Context` (the table's
reads, the query encoder's model checks, the LLM in process or as the job's engine pool): their
code is in every stage's key (named, not imported: nothing here imports jobs/)."""

HOST_CODE = ("logicrank.jobs.retrieve",)
"""The module of the retrieve job's :class:`Hooks` and shard searches (its query batches, the
searches on shard actors, the merge of the shards' top k), which shape what a stage returns in
the job: its own source is in every stage's key, in a job and in a notebook alike
(:func:`~logicrank.pipelines.codedigest.source_digest`; its imports, every stage among them, are
keyed by each stage's own code)."""


def run_stages(run_id: str, stages: Sequence[StageOptions], ctx: Context, queries: pa.Table, inputs: Inputs,
               cache: StageCache, hooks: Hooks | None = None) -> Result:
    """Run a validated pipeline (:meth:`logicrank.pipelines.retrieval.pipeline.Pipeline.run` validates first)."""
    hooks = hooks or Hooks()
    starts = reads(stages[0])
    # the runner's code shapes every output (blank queries, conform), and a stage reads the table and asks the LLM
    # through code its module does not import (the Context's): theirs is in every key too
    start = json_digest([inputs.base, "input", starts, code_digest(__name__), [code_digest(m) for m in CONTEXT_CODE],
                         [source_digest(m) for m in HOST_CODE]])
    state, steps = StageRunner(ctx, inputs, cache, hooks).pipeline(stages, with_content(queries, starts), start)
    run = state.run.set_column(state.run.schema.get_field_index("run_id"), "run_id", pa.array([run_id] * state.run.num_rows, pa.string()))
    side = {f"{kind}/{run_id}@{where}" if where else f"{kind}/{run_id}": table for (kind, where), table in state.side.items()}  # '@' is not allowed in a run id
    return Result(run_id, conform(run, RUN, run_id), side, steps)


def stage_classes(stages: Iterable[StageOptions]) -> list[type[Stage]]:
    """Every stage class a pipeline uses, its fusions' children included."""
    out: list[type[Stage]] = []
    for options in stages:
        stage = build(options)
        out.append(type(stage))
        for child in stage.children():
            out += stage_classes(child)
    return out


def reads(options: StageOptions) -> tuple[str, ...]:
    """The query columns a pipeline starting with this stage reads (a fusion: its children's)."""
    stage = build(options)
    if stage.kind is Kind.FUSION:
        return tuple(dict.fromkeys(c for child in stage.children() for c in reads(child[0])))
    return stage.reads


def blank(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """True where a query column is null or only whitespace."""
    return pc.fill_null(pc.equal(pc.utf8_trim_whitespace(col), ""), True)


def with_content(queries: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """The queries with something in at least one of ``columns`` (a stage's ``reads``).

    A blank text asks for nothing: the text stages return no results for it (rather than
    dense ranking the whole corpus by the empty string's vector while BM25 returns
    nothing); itlr still runs a blank-text query that carries its own logical form. Blank
    queries score 0 in evaluation (trec_eval -c's rule)."""
    if not columns:
        return queries
    keep = pc.invert(blank(queries.column(columns[0])))
    for c in columns[1:]:
        keep = pc.or_(keep, pc.invert(blank(queries.column(c))))
    return queries.filter(keep)


def in_process(batch_rows: int = 4096) -> MapQueries:
    """The per-query hook that runs each batch of ``batch_rows`` queries here, in turn."""

    def run(stage: Stage, ctx: Context, queries: pa.Table) -> Output:
        queries = queries.sort_by([("query_id", "ascending")])  # results come in the run's order: assembled without a copy
        parts = [stage.run(ctx, queries.slice(i, batch_rows), []).run for i in range(0, queries.num_rows, batch_rows)]
        return Output(run=assemble(parts, stage.name), counts={"placement": "in process"})

    return run


def assemble(parts: list[pa.Table], stage: str) -> pa.Table:
    """Batches' runs as one, by query id then rank (batches arrive in any order). The sort
    is Arrow's ``sort_by([query_id, rank])`` computed on integers: each row's query id replaced
    by its position among the distinct ids in byte order (a string sort of millions of rows
    costs seconds)."""
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
    if (order == np.arange(len(order))).all():  # already in order (queries run sorted by id): no copy of millions of rows
        return run
    return run.take(order)


def check_keyed(run: pa.Table, queries: pa.Table, stage: str, contiguous: bool = True) -> None:
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


def check_scores(run: pa.Table, stage: str) -> None:
    """Every score finite: a NaN or infinite score has no place in a ranking (trec_eval and
    ``evaluate`` refuse it), so the stage's run is refused here, before it is cached or written."""
    from logicrank.pipelines.retrieval.methods.ranking import refuse_unrankable

    scores = run.column("score").to_numpy(zero_copy_only=False).astype(np.float64)  # a null is NaN here
    refuse_unrankable(scores, lambda i: (run.column("query_id")[i].as_py(), run.column("doc_id")[i].as_py()), stage)


class _State:
    """What flows between stages: the queries, the run so far, the side tables."""

    def __init__(self, queries: pa.Table):
        self.queries, self.run = queries, None
        self.side: dict[tuple[str, str], pa.Table] = {}  # (kind, where) -> table; where is "" for the pipeline's own stages


@dataclass
class StageRunner:
    """Runs a pipeline's stages in one context (what :func:`run_stages` uses): each stage's
    output taken from ``cache`` under its prefix key, or computed (a per-query retriever through
    ``hooks.map_queries``), checked and conformed to its contracts, then cached."""

    ctx: Context
    inputs: Inputs
    cache: StageCache
    hooks: Hooks

    def pipeline(self, stages: Sequence[StageOptions], queries: pa.Table, key: str) -> tuple[_State, list[dict]]:
        """Run ``stages`` from ``queries``, whose prefix digest is ``key``."""
        state, steps = _State(queries), []
        for i, options in enumerate(stages, 1):
            stage = build(options)
            runs, subs = [], []
            if stage.kind is Kind.RERANKER or (stage.kind is Kind.RETRIEVER and state.run is not None):  # a retriever after a run scores its candidates
                runs = [state.run]
            for j, child in enumerate(stage.children(), 1):  # each starts from this point's queries (and shares the cache)
                # those with content in what the child reads: a fusion's own filter is over every child's columns together,
                # so a query blank in one child's (its text, beside an itlr sibling's logical form) reached that child
                sub_state, sub_steps = self.pipeline(child, with_content(state.queries, reads(child[0])), key)
                runs.append(sub_state.run)
                subs.append(sub_steps[-1]["digest"])  # the fusion's key covers everything its inputs depend on
                steps.append({"stage": f"{options.stage}[{j}]", "sub": sub_steps})
                for (kind, where), table in sub_state.side.items():  # kept, named by where they come from
                    state.side[kind, f"{i}-{options.stage}{j}" + (f"-{where}" if where else "")] = table
            key = self.inputs.key(key, stage, subs)
            given = state.queries
            if runs and not stage.children() and stage.reads:  # scoring a run's candidates by what it reads: as a first stage, a
                # query blank there asks for nothing (after a stage that reads only query_id, dense ranked a blank query's
                # candidates by the empty string's vector, and bm25 dropped them)
                given = with_content(state.queries, stage.reads)
                if given.num_rows < state.queries.num_rows:
                    runs = [r.filter(pc.is_in(r.column("query_id"), value_set=given.column("query_id"))) for r in runs]
            out, cached = self.run_stage(key, stage, given, runs)
            if out.queries is not None:
                state.queries = out.queries
            if out.run is not None:
                state.run = out.run
            for kind, table in out.side.items():  # a second table of a kind in one pipeline is named by its stage's position
                state.side[kind, "" if (kind, "") not in state.side else f"{i}-{options.stage}"] = table
            steps.append({"stage": options.stage, "digest": key, "cached": cached, **out.counts})
        return state, steps

    def run_stage(self, key: str, stage: Stage, queries: pa.Table, runs: list[pa.Table]) -> tuple[Output, bool]:
        """One stage's output under prefix key ``key``, and whether it came from the cache. A
        stage that works in shards gets the key's checkpoint; the output is refused (a bug) when
        a rewriter changes the queries' rows, a run is not keyed by the queries, or a side table
        is not declared; side tables are conformed to their declared schemas."""
        out = self.cache.get(key)
        if out is not None:
            return out, True
        bulk = stage.per_query and stage.kind is Kind.RETRIEVER and not runs  # over candidates: here, with the run
        with self.hooks.timed(f"{stage.name}:{key[:8]}"):
            if bulk:
                out = (self.hooks.map_queries or in_process())(stage, self.ctx, queries)
            else:  # a stage that works in shards resumes from those this key has finished
                out = stage.run(replace(self.ctx, checkpoint=self.cache.checkpoint(key)), queries, runs)
        if out.queries is not None and out.queries.column("query_id").to_pylist() != queries.column("query_id").to_pylist():
            raise RuntimeError(f"{stage.name}: a rewriter must return one row per query, in order (a bug)")
        if out.run is not None:  # a run assembled from batches must also rank each query 1..n
            check_keyed(out.run, queries, stage.name, contiguous=bulk)
            check_scores(out.run, stage.name)
        undeclared = sorted(set(out.side) - set(stage.side_tables))
        if undeclared:
            raise RuntimeError(f"{stage.name}: side table(s) {undeclared} not declared in its side_tables (a bug)")
        out.side = {kind: conform(table, stage.side_tables[kind], f"{stage.name} ({kind})") for kind, table in out.side.items()}
        self.cache.put(key, out)
        self.hooks.done(f"stage {stage.name} done")
        return out, False


def _save(out: Output, where: Path) -> None:
    if out.queries is not None:
        write_parquet_atomic(out.queries, where / "queries.parquet")
    if out.run is not None:
        write_parquet_atomic(out.run, where / "run.parquet")
    for kind, table in out.side.items():
        write_parquet_atomic(table, where / f"side-{kind}.parquet")
    made = {"queries": out.queries is not None, "run": out.run is not None, "side": sorted(out.side)}
    write_text_atomic(json.dumps({"counts": out.counts, **made}, default=str), where / "done.json")


def _load(where: Path) -> Output | None:
    """A stage's saved output, or None where a file its ``done.json`` names is gone (a cache
    pruned by hand): a miss, so the stage runs again; a missing run was read as a stage that
    makes none, and the run before it passed on as this stage's."""
    meta = json.loads((where / "done.json").read_text(encoding="utf-8"))
    if "run" not in meta:  # (written by code before done.json named its files)
        return None
    q, r = where / "queries.parquet", where / "run.parquet"
    files = [q] * bool(meta.get("queries")) + [r] * bool(meta.get("run")) + [where / f"side-{kind}.parquet" for kind in meta["side"]]
    if not all(f.is_file() for f in files):
        return None
    return Output(
        queries=pq.read_table(q) if meta.get("queries") else None,
        run=pq.read_table(r) if meta.get("run") else None,
        side={kind: pq.read_table(where / f"side-{kind}.parquet") for kind in meta["side"]},
        counts=meta["counts"],
    )
