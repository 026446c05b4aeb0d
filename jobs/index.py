"""`logicrank index`: stream a corpus through Ray Data into a LanceDB table.

Plan: one read task per source file (a generator: bounded memory) -> an actor pool that
classifies rows by content hash and embeds only new and changed documents -> the driver,
the table's one writer, which upserts in chunks. Then: delete ids missing from the
snapshot, build indexes, tag the version, write the manifest.

Crash safety: every chunk is a keyed upsert, so a rerun after a kill finds the written
documents unchanged, writes the rest, and ends with the table a clean run would give.
Deletes run only after the whole snapshot was read and passed the reject threshold.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from jobs.raysession import ray_session, require_fit
from jobs.rundir import RunDir
from pipelines.corpus import Source, list_sources, read_source
from pipelines.embed import model_id, resolve_model
from pipelines.indexing import EmbedStage, IndexWriter, RejectSink
from pipelines.store import DocStore
from schemas.config import IndexConfig


class IndexJobError(RuntimeError):
    """The index job stopped; the message says why and what to do."""


@dataclass
class IndexSummary:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    rejected: int = 0
    rows_read: int = 0
    embedded: int = 0
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    table_version: int | None = None
    table_rows: int = 0
    indexes: dict[str, str] = field(default_factory=dict)
    tag: str | None = None
    seconds: float = 0.0


class _ReadSources:
    """Ray Data UDF: a row naming a source -> that source's PARSED batches, streamed."""

    def __init__(self, sources: list[Source], batch_rows: int, max_doc_bytes: int):
        self.sources, self.batch_rows, self.max_doc_bytes = sources, batch_rows, max_doc_bytes

    def __call__(self, batch: pa.Table):
        for i in batch.column("source_index").to_pylist():
            yield from read_source(self.sources[i], self.batch_rows, self.max_doc_bytes)


class _EmbedActor(EmbedStage):
    """EmbedStage in a Ray actor: fetches the stored hashes from the object store once."""

    def __init__(self, config, stored_refs: list):
        import ray

        super().__init__(config, ray.get(stored_refs[0]))


def _plan(cfg: IndexConfig, sources: list[Source], stored_ref):
    import ray

    ds = ray.data.from_items([{"source_index": i} for i in range(len(sources))], override_num_blocks=len(sources))
    ds = ds.map_batches(
        _ReadSources(sources, cfg.ray.batch_rows, cfg.max_doc_bytes),
        batch_size=1,
        batch_format="pyarrow",
        num_cpus=_READ_CPUS,  # light work; distinct resources also keep it from fusing into the embed actors
    )
    return ds.map_batches(
        _EmbedActor,
        fn_constructor_kwargs={"config": cfg.embed, "stored_refs": [stored_ref]},  # a list: Ray passes the ref, not the value
        compute=ray.data.ActorPoolStrategy(size=cfg.ray.embed_actors),
        batch_size=cfg.ray.batch_rows,
        batch_format="pyarrow",
        num_cpus=cfg.ray.embed_num_cpus,
        num_gpus=cfg.ray.embed_num_gpus or None,
    )


_READ_CPUS = 0.5


def run_index(cfg: IndexConfig, out: str | Path, progress: bool = False) -> IndexSummary:
    """Index ``cfg.corpus`` into ``cfg.db``/``cfg.table``; outputs (rejects, manifest) go to ``out``."""
    start = time.perf_counter()
    rundir = RunDir(out, "index")
    sources = list_sources(cfg.corpus, cfg.format)  # fails before Ray or a model loads
    resolve_model(cfg.embed.model)
    mid = model_id(cfg.embed)
    store = DocStore(cfg.db, cfg.table)
    if store.exists() and store.model_id() != mid:
        raise IndexJobError(
            f"index: table {cfg.table!r} in {cfg.db!r} holds vectors from {store.model_id()!r}, not {mid!r}; "
            "index into a new table (--table) or delete this one."
        )
    summary = IndexSummary()
    version_before = store.version if store.exists() else None
    rejects = RejectSink(rundir.path / "rejects.parquet")
    writer = IndexWriter(store, mid, rejects, cfg.write_batch_rows)

    with ray_session(cfg.ray) as ray:
        require_fit(
            "index", cfg.ray.embed_actors, cfg.ray.embed_num_cpus, cfg.ray.embed_num_gpus, ray.cluster_resources(),
            IndexJobError, reserve_cpus=_READ_CPUS,
        )
        with rundir.timed("diff_load"):
            stored = store.hashes()
        stored_ref = ray.put(stored)
        with rundir.timed("stream"), _progress(progress) as tick:
            for batch in _plan(cfg, sources, stored_ref).iter_batches(batch_size=None, batch_format="pyarrow"):
                writer.consume(batch)
                tick(batch.num_rows, writer)
            writer.flush()
    rejects.close()

    c = writer.counts
    summary.inserted, summary.updated, summary.unchanged = c["insert"], c["update"], c["unchanged"]
    summary.rejected, summary.rows_read = c["reject"], writer.rows_read
    summary.embedded = summary.inserted + summary.updated
    summary.rejects_by_reason = dict(rejects.reasons)
    fraction = summary.rejected / summary.rows_read if summary.rows_read else 0.0
    too_many = fraction > cfg.max_reject_fraction

    if not too_many:
        # the ids stored before this run are already in hand: only a snapshot that misses
        # some of them needs the delete pass (which reads the table's ids again)
        absent = cfg.delete_missing and any(d not in writer.seen for d in stored.column("doc_id").to_pylist())
        if absent and store.exists():
            with rundir.timed("delete"):
                summary.deleted = store.delete_absent(pa.array(sorted(writer.seen), pa.string()))
        if store.exists():
            changed = store.version != version_before or summary.embedded or summary.deleted
            if changed or not store.table.list_indices():
                with rundir.timed("indexes"):
                    summary.indexes = store.build_indexes(cfg.ann_threshold)
            summary.tag = cfg.tag or f"index-{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}"
            store.tag(summary.tag)
    if store.exists():
        summary.table_version, summary.table_rows = store.version, store.count()
    summary.seconds = round(time.perf_counter() - start, 3)

    status = "failed" if too_many else "ok"
    rundir.write_manifest(
        cfg.model_dump(mode="json"),
        cfg.digest(),
        {"corpus": [s.fingerprint() for s in sources]},
        ["rejects.parquet"],
        status=status,
        model=mid,
        table={"db": cfg.db, "name": cfg.table, "version": summary.table_version, "rows": summary.table_rows},
        counts=asdict(summary),
    )
    if too_many:
        raise IndexJobError(
            f"index: {summary.rejected} of {summary.rows_read} rows rejected ({fraction:.1%} > max_reject_fraction "
            f"{cfg.max_reject_fraction:.1%}); reasons {summary.rejects_by_reason}. The good rows were written, but "
            f"no document was deleted and no tag made. See {rejects.path} for each row's source and reason; fix the "
            "corpus or raise --max-reject-fraction."
        )
    return summary


class _progress:
    """A rich live counter of rows read and written (quiet when disabled)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        if not self.enabled:
            return lambda n, w: None
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.p = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=False)
        self.p.__enter__()
        task = self.p.add_task("indexing")

        def tick(n: int, w: IndexWriter) -> None:
            c = w.counts
            self.p.update(
                task,
                description=f"indexing: {w.rows_read} rows read, {c['insert'] + c['update']} embedded, "
                f"{c['unchanged']} unchanged, {c['reject']} rejected",
            )

        return tick

    def __exit__(self, *exc):
        if self.enabled:
            self.p.__exit__(*exc)
        return False
