"""`logicrank index`: stream a corpus into a LanceDB table.

Plan: the sources read in turn (generators: bounded memory) -> classify rows by content hash
and embed only new and changed documents (or, with ``--vector-column``, keep the vectors the
corpus carries, checked by the reader: nothing is embedded) -> the driver, the table's one
writer (new documents appended in chunks, changed ones merged by id in fewer, larger merges). Where
the encoders run (pipelines/engines/placement.py, ``encoder_placement``): on a local
cluster of one CPU node, in the driver with every core; otherwise one read task per source
file and a Ray Data actor pool of encoders. Then: the guards, delete ids missing from
the snapshot, maintain the table (compact, indexes updated in place to cover every row, the
ANN index only when asked, prune old untagged versions), tag the version, write the manifest.

The driver's memory does not grow with the corpus: each batch's stored hashes are looked up in
the table (:class:`~logicrank.pipelines.operations.indexing.StoredHashes`), the ids read are kept on disk in the run
directory (:class:`~logicrank.pipelines.operations.indexing.SeenIds`), and the absent ids are found by an anti-join
in batches, spilled to the run directory and deleted in batches.

One writer per table: the run holds the table's lock (:mod:`logicrank.pipelines.operations.writelock`) from
start to end; a second run is refused before it reads anything.

Crash safety: every chunk is committed whole (an append of new ids, a keyed merge of changed
ones), so a rerun after a kill finds the written documents unchanged, writes the rest, and
ends with the table a clean run would give. Ctrl-C and SIGTERM write the rows waiting first.
Only complete runs are read: a run's last change to the table marks the version it finished
complete (pipelines/engines/store/versions.py, ``COMPLETE_TAG``), and readers read the newest version
so marked. A run that is interrupted (Ctrl-C, SIGTERM, the stall watchdog) or fails writes its
manifest as ``interrupted`` / ``failed`` and says in one line what it left and how to resume.
Deletes run only after the whole snapshot was read and passed the guards: the reject
threshold, a snapshot with no valid document (never deletes), and the share of the table
a snapshot may delete (``max_delete_fraction``).
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from logicrank.jobs.raysession import RayTasks, local_driver_node, ray_session, require_fit, unread_blocks_allowed
from logicrank.jobs.rundir import RunDir
from logicrank.jobs.watchdog import Stalled, beat, busy
from logicrank.pipelines.codedigest import code_digest
from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig
from logicrank.pipelines.corpus import (
    Source,
    SourceError,
    Sources,
    VectorColumn,
    check_sources,
    list_sources,
    read_source,
    source_fault,
)
from logicrank.pipelines.engines.bm25 import index_root, update_index
from logicrank.pipelines.engines.embed import MODELS, concrete, model_id, resolve_model
from logicrank.pipelines.engines.placement import EncoderPlacement, encoder_placement
from logicrank.pipelines.engines.store import DocStore, json_value, maintain_apart, update_index_apart
from logicrank.pipelines.engines.store.versions import UNKNOWN_EMBEDDED_BY
from logicrank.pipelines.engines.vector_models import embedding_code, loadable, model_dimension, model_files_digest, model_of
from logicrank.pipelines.files import require_writable
from logicrank.pipelines.operations.indexing import (
    EmbedStage,
    FragmentSink,
    IdSpill,
    IndexWriter,
    RejectSink,
    StoredHashes,
    embed_left_behind,
    index_refusal,
    left_behind,
    restore_hint,
    roll_back,
    table_state,
)
from logicrank.pipelines.operations.writelock import TableLock
from logicrank.schemas.errors import JobFailed, UserError, first_line


class IndexJobError(UserError, RuntimeError):
    """The index job stopped; the message says why and what to do."""


class IndexInterrupted(KeyboardInterrupt):
    """The index run was interrupted (Ctrl-C, SIGTERM); the message says what the table holds
    and how to resume. ``exit_code``: 130 for SIGINT, 143 for SIGTERM."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread while an index run holds its table
    (:func:`sigterm_interrupts`); the run then ends as after Ctrl-C, with exit code 143."""


@contextmanager
def sigterm_interrupts():
    """While open, SIGTERM raises :class:`Terminated` in the main thread (as Ctrl-C raises
    KeyboardInterrupt), so the run stops the same way: its manifest and its one line; the
    previous handler is put back on leaving. Off the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _raise_terminated(signum, frame):
    raise Terminated()


def _rearm_sigterm() -> None:
    """Take SIGTERM back after ``ray.init``, which installs its own handler (``sys.exit``) in
    the main thread: without this a SIGTERM ends the run as a failure with exit 15."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is not _raise_terminated:
        signal.signal(signal.SIGTERM, _raise_terminated)


@dataclass
class IndexSummary:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    rejected: int = 0
    rows_read: int = 0
    embedded: int = 0
    precomputed: int = 0  # documents written with the vector the corpus gave (--vector-column), none embedded
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    table_version: int | None = None
    table_rows: int = 0
    absent: int = 0  # stored documents missing from the snapshot
    held: int = 0  # stored documents whose only row in the snapshot was rejected: not absent, kept as stored
    redelivered: int = 0  # source rows Ray delivered twice (a retried task), written once
    not_utf8: int = 0  # documents kept (TREC DOCs) with bytes that are not UTF-8, read as U+FFFD as Anserini and ir_datasets read them
    # corpus files a directory holds that were left out by rule (--format trec: TREC's disks' READMEs, DTDs and Congressional
    # Record, as Anserini's TrecCollection leaves them out; a BEIR directory's document files other than its corpus.jsonl;
    # corpus.list_sources)
    not_read: list[str] = field(default_factory=list)
    why_not_read: str = ""  # (the rule that left them out: corpus.Sources)
    # the encoder workers' data files of new documents (--writes workers, on a pool): files_committed, committed whole;
    # files_salvaged, those whose kept rows were read back and appended; files_dropped, those of batches delivered twice;
    # driver_received_bytes, what the stream brought to the driver; and seconds, the driver's time in the table's writes
    writes: dict = field(default_factory=dict)
    maintenance: dict = field(default_factory=dict)
    placement: dict = field(default_factory=dict)  # the embedding pool: actors, CPUs and GPUs each, how decided
    tag: str | None = None
    # inserted, updated, unchanged and deleted count what changed since this version, the last one a completed
    # index run finished (what readers read before this run); None: no run had completed
    since_version: int | None = None
    # a run that started from a version readers do not read (the latest is not since_version): from_version (that
    # version), kept_manifest (the manifest of the run that stopped there, renamed in the run directory; None: no run
    # under this --out left it)
    resumed: dict = field(default_factory=dict)
    kept_manifest: str | None = None  # the manifest of a run under this --out that stopped, renamed so it is not written over
    embedded_by: dict = field(default_factory=dict)  # the embedding code's digest: before (the table's), now, reembedded
    seconds: float = 0.0


class _ReadSources:
    """Ray Data UDF: a row naming a source -> that source's PARSED batches, streamed (with
    ``vectors``: each row's precomputed vector read and checked)."""

    def __init__(self, sources: list[Source], batch_rows: int, max_doc_bytes: int, vectors: VectorColumn | None = None):
        self.sources, self.batch_rows, self.max_doc_bytes, self.vectors = sources, batch_rows, max_doc_bytes, vectors

    def __call__(self, batch: pa.Table):
        for i in batch.column("source_index").to_pylist():
            src = self.sources[i]
            try:
                yield from read_source(src, self.batch_rows, self.max_doc_bytes, self.vectors)
            except SourceError as exc:  # sent in band, to the writer: no Ray task error, no retry
                yield source_fault(src, exc, self.vectors is not None)


class _EmbedActor(EmbedStage):
    """EmbedStage in a Ray actor: looks up the stored hashes of each batch's ids in the table
    itself (:class:`~logicrank.pipelines.operations.indexing.StoredHashes`), as the driver does; no actor holds
    the table's hashes (before: every actor held a copy of all of them, from the object store)."""


def _embedded(cfg: IndexConfig, embed: EmbedConfig, sources: list[Source], stored: StoredHashes, place: EncoderPlacement,
              vectors: VectorColumn | None, sink: FragmentSink | None) -> Iterator[pa.Table]:
    """The corpus's PARSED batches, classified and embedded (their new rows written to the
    table's dataset, uncommitted, with a ``sink``), in the driver (a pool of 0 actors: the
    sources read in turn, each batch encoded as it comes) or through the Ray Data plan."""
    if place.actors == 0:
        read, stage = _ReadSources(sources, cfg.ray.batch_rows, cfg.max_doc_bytes, vectors), EmbedStage(embed, stored, sink=sink)
        for batch in read(pa.table({"source_index": list(range(len(sources)))})):
            yield stage(batch)
        return
    yield from _plan(cfg, embed, sources, stored, place, vectors, sink).iter_batches(batch_size=None, batch_format="pyarrow")


def _plan(cfg: IndexConfig, embed: EmbedConfig, sources: list[Source], stored: StoredHashes, place: EncoderPlacement,
          vectors: VectorColumn | None, sink: FragmentSink | None):
    import ray

    ds = ray.data.from_items([{"source_index": i} for i in range(len(sources))], override_num_blocks=len(sources))
    ds = ds.map_batches(
        _ReadSources(sources, cfg.ray.batch_rows, cfg.max_doc_bytes, vectors),
        batch_size=1,
        batch_format="pyarrow",
        num_cpus=_READ_CPUS,  # light work; distinct resources also keep it from fusing into the embed actors
    )
    with warnings.catch_warnings():
        # Ray 2.60 names no scheduling strategy among map_batches' parameters and warns that the
        # generic remote args will go in 2.64 (requirements.lock pins 2.60): SPREAD puts one
        # encoder on each node, as the placement sized it, not two on the largest.
        warnings.filterwarnings("ignore", message=r".*ray_remote_args.* is deprecated")
        return unread_blocks_allowed(ds.map_batches(
            _EmbedActor,
            fn_constructor_kwargs={"config": embed, "stored": stored, "sink": sink},
            compute=ray.data.ActorPoolStrategy(size=place.actors),
            batch_size=cfg.ray.batch_rows,
            batch_format="pyarrow",
            num_cpus=place.num_cpus,
            num_gpus=place.num_gpus or None,
            **({"scheduling_strategy": "SPREAD"} if place.how == "one per node" else {}),
            **({"resources": dict(cfg.ray.embed_resources)} if cfg.ray.embed_resources else {}),
        ))


_READ_CPUS = 0.5
# the writer's LanceDB metadata cache: at LanceDB's default it keeps the manifest of each of the
# thousands of versions a build commits (10M documents: 2,544), and the driver grows with the corpus
WRITER_METADATA_CACHE = 64 << 20
_AUTO_TAG = "index-"  # the tag each run makes when none is given: index-<UTC time>; only these expire
_AUTO_TAG_NAME = re.compile(r"index-\d{8}T\d{12}Z")


def run_index(cfg: IndexConfig, out: str | Path, progress: bool = False) -> IndexSummary:
    """Index ``cfg.corpus`` into ``cfg.db``/``cfg.table``; outputs (rejects, manifest) go to ``out``.

    Holds the table's write lock for the whole run (a second run is refused at start).
    Refuses, with a non-zero exit and the command that restores the table: too many
    rejects; a snapshot with no valid document (it never deletes anything); a snapshot that
    would delete more than ``max_delete_fraction`` of the table (unless ``allow_mass_delete``).
    """
    start = time.perf_counter()
    require_writable(out, "index", "--out", IndexJobError)  # before any work: no lock, no run directory left behind
    require_writable(cfg.db, "index", "--db", IndexJobError)
    rundir = RunDir(out, "index")
    sources = list_sources(cfg.corpus, cfg.format)  # fails before Ray or a model loads
    try:
        # a file that cannot be opened, decompressed or read as text (or, with --vector-column, carries no vectors): refused now
        check_sources(sources, cfg.vector_column)
    except SourceError as exc:
        raise IndexJobError(f"index: {exc} Nothing was read into the table.") from None
    if cfg.vector_column is None:  # (precomputed vectors need no encoder)
        resolve_model(cfg.embed.model)
    concrete(cfg.embed)  # openvino asked to run on cuda: refused now
    # the run directory held too: a second index run writing its manifest and rejects there (another table's) is refused
    with sigterm_interrupts(), TableLock(cfg.db, cfg.table, "index") as lock, rundir.held():
        return _index_locked(cfg, rundir, sources, progress, start, lock)


def _index_locked(cfg: IndexConfig, rundir: RunDir, sources: Sources, progress: bool, start: float, lock: TableLock) -> IndexSummary:
    mid = cfg.vector_model if cfg.vector_column is not None else model_id(cfg.embed)  # what made the table's vectors, recorded in it
    store = DocStore(cfg.db, cfg.table, metadata_cache_bytes=WRITER_METADATA_CACHE)
    if store.exists():
        store.require_model(mid, "index", "index into a new table (--table) or delete this one")
        store.require_title_sep(cfg.embed.title_sep, "index")
    vectors = vector_column(cfg, store)
    summary = IndexSummary(not_read=list(sources.not_read), why_not_read=sources.why_not_read)
    version_before = store.version if store.exists() else None
    summary.since_version = last_complete(store)
    stopped = rundir.previous() or {}
    _refuse_a_finished_tag(cfg, store, summary.since_version, stopped)
    summary.kept_manifest = rundir.keep_unfinished()  # a stopped run's record is never written over, whatever it left
    # a run killed outright (SIGKILL, the OOM killer, a lost node) leaves a manifest that says `running`, not the earlier
    # run's `ok` beside a table this run changed
    rundir.begin()
    baseline = None
    if version_before is not None and summary.since_version != version_before:
        # the latest version is not one readers read: this run counts against what they read. It resumes a run that
        # stopped here only where that run's kept manifest says it left this version (else: a restore of an unfinished
        # version, a run stopped under another --out, a table from before the completion mark)
        left_here = summary.kept_manifest is not None and (stopped.get("table") or {}).get("version") == version_before
        summary.resumed = {"from_version": version_before, "kept_manifest": summary.kept_manifest if left_here else None}
        baseline = StoredHashes(cfg.db, cfg.table, summary.since_version)
    rejects = RejectSink(rundir.path / "rejects.parquet")
    # the code that makes a document's vector (its text, the encoder) and a local model directory's files: a stored vector
    # made by other code or other weights is not reused; precomputed vectors are the corpus's own (a table embedded
    # before takes them all, as changed rows)
    # (precomputed vectors from a local model directory: its files' content, so queries are refused once it is saved over;
    # not a registered model's package version, which made none of them: an upgrade would take every row as changed)
    if vectors:
        named = model_of(cfg.vector_model)
        embed_code = embedding_code(PRECOMPUTED, None if named in MODELS else model_files_digest(named))
    else:
        embed_code = embedding_code(code_digest("logicrank.pipelines.engines.embed"), model_files_digest(cfg.embed.model))
    writer = IndexWriter(store, mid, rejects, cfg.write_batch_rows, before_commit=lock.ensure_held, title_sep=cfg.embed.title_sep,
                         seen_dir=rundir.path, baseline=baseline, embedded_by=embed_code)
    try:
        return _index_written(cfg, rundir, sources, progress, start, lock, mid, store, summary, version_before, rejects, writer, vectors)
    except IndexJobError:
        raise  # a refusal: its manifest is written and its message says what the table holds
    except BaseException as exc:
        stop = _stopped(cfg, rundir, sources, mid, store, version_before, writer, exc)
        if stop is exc:
            raise
        raise stop from None
    finally:
        writer.close()


def _index_written(cfg: IndexConfig, rundir: RunDir, sources: list[Source], progress: bool, start: float, lock: TableLock, mid: str,
                   store: DocStore, summary: IndexSummary, version_before: int | None, rejects: RejectSink, writer: IndexWriter,
                   vectors: VectorColumn | None) -> IndexSummary:
    """The locked run: stream, count, the guards, then (unless refused) deletes, maintenance,
    the completion mark and the run's tag; the manifest."""
    embed_code = writer.embedded_by
    # a local cluster started for the stream also serves the BM25 index's tasks (--bm25-workers), rather than a second
    # start after maintenance (docs/bulk-retrieval.md, the 10M rows of 8b24db8); _commit shuts it down after the BM25
    # index, before the version is marked complete. A joined cluster is joined again at no cost: not held meanwhile.
    with ExitStack() as ray_held:
        if cfg.bm25_workers and not cfg.ray.address and index_root(store) is not None:
            ray_held.enter_context(ray_session(cfg.ray))
            _rearm_sigterm()  # (Ray's start installs its own handler)
        stored, stored_rows = _stream(cfg, rundir, sources, progress, lock, mid, store, summary, version_before, rejects, writer, embed_code,
                                      vectors)
        _count(summary, writer, rejects, precomputed=vectors is not None)
        with rundir.timed("absent"):  # the stored ids the snapshot lacks, spilled to the run's directory
            absent = IdSpill(rundir.path / ".absent-ids.parquet")
            summary.absent = absent.write(writer.seen.absent(stored.ids()))
            summary.held = writer.seen.held
        guard = None
        if writer.baseline is not None and summary.since_version is not None:
            # resumed: the deletes readers would see, of the last complete version's documents (the version the run
            # started from also holds the unfinished run's inserts, which would thin the share). Where no version was
            # ever complete (a first build killed or refused), the share is of the documents the table holds: the
            # complete version's would be 0 of 0, and a wrong snapshot deleted every document the first run wrote
            guard = (sum(len(ids) for ids in writer.seen.absent(writer.baseline.ids())), writer.baseline.count())
        failure = index_refusal(cfg, summary, stored_rows, bool(writer.seen), rejects.path, restore_hint(cfg, store, version_before),
                                deletes=guard)
        if failure is None:
            failure = _commit(cfg, rundir, lock, store, summary, version_before, writer, absent, embed_code, ray_held.close)
    absent.remove()
    if store.exists():
        summary.table_version, summary.table_rows = store.version, store.count()
    summary.seconds = round(time.perf_counter() - start, 3)

    rundir.write_manifest(
        cfg.model_dump(mode="json"),
        cfg.digest(),
        {"corpus": [s.fingerprint() for s in sources]},
        ["rejects.parquet"],
        status="failed" if failure else "ok",
        model=mid,
        table={"db": cfg.db, "name": cfg.table, "version_before": version_before, "version": summary.table_version, "rows": summary.table_rows,
               "complete": failure is None},
        counts=asdict(summary),
        error=failure,
    )
    if failure:
        raise IndexJobError(failure)
    return summary


def _stream(cfg: IndexConfig, rundir: RunDir, sources: list[Source], progress: bool, lock: TableLock, mid: str, store: DocStore,
            summary: IndexSummary, version_before: int | None, rejects: RejectSink, writer: IndexWriter,
            embed_code: str, vectors: VectorColumn | None) -> tuple[StoredHashes, int]:
    """Every document read, embedded where its content is new, and written (on the cluster's
    encoder pool); returns the stored hashes of the version the run started from and their
    count. A corpus that cannot be read rolls the table back, with its manifest, as one line."""
    try:
        with ray_session(cfg.ray) as ray:
            _rearm_sigterm()
            # precomputed vectors: readers that check them, on the CPU (no encoder holds a GPU)
            wanted = cfg.embed.model_copy(update={"device": "cpu"}) if vectors else cfg.embed
            place = encoder_placement(cfg.ray, ray.nodes(), _READ_CPUS, wanted, driver_node=local_driver_node(cfg.ray))
            embed = concrete(cfg.embed, gpu=place.num_gpus > 0)  # resolved here: an actor sees GPUs it did not reserve
            summary.placement = {**asdict(place), "device": embed.device, "backend": embed.backend}
            if place.actors:
                require_fit(
                    "index", place.actors, place.num_cpus, place.num_gpus, ray.cluster_resources(),
                    IndexJobError, reserve_cpus=_READ_CPUS, custom=dict(cfg.ray.embed_resources),
                )
            # the stored hashes of each batch's ids, read from the version this run started from
            stored = StoredHashes(cfg.db, cfg.table, version_before)
            stored_rows = stored.count()
            summary.embedded_by = {"before": store.embedded_by() if store.exists() else None, "now": embed_code}
            if summary.embedded_by["before"] not in (None, embed_code) and stored_rows:
                # vectors made by other code are not reused: every stored document is embedded again (an update). Until
                # this run has written them all the table holds vectors of both codes: its record says "unknown" from
                # before the first write, so a run that stops leaves no version whose record is either code's
                lock.ensure_held()
                store.mark_embedded_by(UNKNOWN_EMBEDDED_BY)
                stored.reembed = True
                if writer.baseline is not None:
                    writer.baseline.reembed = True
                summary.embedded_by["reembedded"] = stored_rows
            # (closed on a fault too: the driver's encoder is let go before the roll-back)
            sink = _sink(cfg, store, place)
            with (rundir.timed("stream"), _progress(progress, vectors is not None) as tick,
                  closing(_embedded(cfg, embed, sources, stored, place, vectors, sink)) as batches):
                try:
                    for batch in batches:
                        writer.consume(batch)
                        tick(batch.num_rows, writer)
                        beat(f"index: {writer.rows_read} rows read")
                    writer.finish()
                except KeyboardInterrupt:
                    # Ctrl-C, SIGTERM: what was embedded is kept, the rows waiting are written first (updates wait for
                    # larger keyed merges); a second Ctrl-C stops this too. Not after a stall: the store may be what hangs.
                    with suppress(Exception):
                        writer.flush()
                    raise
    except SourceError as exc:
        failure = f"index: {exc} {roll_back(cfg, store, version_before, lock)} Nothing was deleted and no tag made; fix the file and rerun."
        rundir.write_manifest(
            cfg.model_dump(mode="json"), cfg.digest(), {"corpus": [s.fingerprint() for s in sources]}, ["rejects.parquet"],
            status="failed", model=mid, table={"db": cfg.db, "name": cfg.table, "version_before": version_before},
            counts={"rows_read": writer.rows_read}, error=failure,
        )
        raise IndexJobError(failure) from None
    finally:
        rejects.close()  # what was rejected stays on disk, whatever stopped the run
    return stored, stored_rows


def _sink(cfg: IndexConfig, store: DocStore, place: EncoderPlacement) -> FragmentSink | None:
    """Where the pool's workers write new documents' rows for the driver to commit; None: every
    row comes to the driver (``writes: driver``; no pool, so the driver encodes them itself; a
    table in Lance's legacy file format, whose files the writer could not read back)."""
    if cfg.writes != "workers" or place.actors == 0:
        return None
    if not store.exists():
        return FragmentSink(store.dataset_uri())
    if store.table.to_lance().data_storage_version in ("legacy", "0.1"):
        return None
    return FragmentSink(store.dataset_uri(), store.table.schema)


def _count(summary: IndexSummary, writer: IndexWriter, rejects: RejectSink, precomputed: bool = False) -> None:
    """The writer's counts into the summary (a resumed run's against the last complete version)."""
    c = writer.counts
    written = c["insert"] + c["update"]
    summary.embedded, summary.precomputed = (0, written) if precomputed else (written, 0)
    since = writer.since if writer.baseline is not None else c  # a resumed run: against the last complete version
    summary.inserted, summary.updated, summary.unchanged = since["insert"], since["update"], since["unchanged"]
    summary.rejected, summary.rows_read = c["reject"], writer.rows_read
    summary.redelivered, summary.not_utf8 = writer.redelivered, writer.not_utf8
    summary.writes = {"files_committed": writer.files_committed, "files_salvaged": writer.files_salvaged,
                      "files_dropped": writer.files_dropped, "driver_received_bytes": writer.received_bytes,
                      "merges": writer.merges, "seconds": round(writer.write_seconds, 3)}
    summary.rejects_by_reason = dict(rejects.reasons)


def _bm25_index(cfg: IndexConfig, store: DocStore) -> dict:
    """The new version's BM25 index, saved beside the table, segment after segment: in a child
    process from APART_FROM_ROWS rows (the driver stays small), in the driver below; with
    ``bm25_workers``, as tasks on the cluster, that many at once (the driver holds none of it;
    a patch runs in segments too). The same index either way."""
    if not cfg.bm25_workers or index_root(store) is None:
        return update_index_apart(store)
    with ray_session(cfg.ray) as ray:
        _rearm_sigterm()  # (Ray's start installs its own handler)
        tasks = RayTasks(ray, cfg.bm25_workers)
        done = update_index(store, run=tasks)
    return json.loads(json.dumps({**done, "workers": cfg.bm25_workers, "nodes": len(tasks.nodes)}, default=json_value))


def _commit(cfg: IndexConfig, rundir: RunDir, lock: TableLock, store: DocStore, summary: IndexSummary, version_before: int | None,
            writer: IndexWriter, absent: IdSpill, embed_code: str, release_ray: Callable[[], None]) -> str | None:
    """A run the guards let through: the absent ids deleted (``delete_missing``), the table
    maintained, the BM25 index of the new version made, the Ray session the run held let go
    (``release_ray``), the version marked complete and tagged. Returns a refusal found only
    here (a re-embed from the corpus that leaves earlier vectors), as the guards give one: the
    version is not marked complete, and the manifest records it."""
    lock.ensure_held()  # (a lease can lapse; each step below changes the table)
    if cfg.delete_missing and summary.absent and store.exists():
        with rundir.timed("delete"):
            summary.deleted = store.delete_ids(absent.read(), before_each=lock.ensure_held)
    if cfg.delete_missing and writer.baseline is not None:
        # deleted since the last complete version: what it held that this snapshot lacks (the ids the
        # unfinished run wrote and this snapshot lacks were never read; those it deleted were)
        summary.deleted = sum(len(ids) for ids in writer.seen.absent(writer.baseline.ids()))
    if not store.exists():
        return
    if summary.embedded_by.get("reembedded") and embed_code.partition("+")[0] != PRECOMPUTED:
        # the stored documents no valid row rewrote (held, or absent and kept) still hold the earlier code's vectors
        with rundir.timed("reembed_left"), busy("index: embedding again the stored documents this snapshot did not rewrite"):
            left = embed_left_behind(store, writer.seen, concrete(cfg.embed), before_each=lock.ensure_held)
        summary.embedded += left
        summary.embedded_by["reembedded"] = writer.counts["update"] + left
    elif summary.embedded_by.get("reembedded"):  # vectors from the corpus: nothing here can make the ones it did not give
        n, named = left_behind(store, writer.seen)
        if n:
            return (f"index: {n} stored document(s) no valid row of this snapshot rewrote (held by a rejected row, or absent and kept), "
                    f"e.g. {', '.join(map(repr, named))}, would keep vectors of the earlier code ({summary.embedded_by.get('before')}) "
                    f"under this run's record ({embed_code}); give them valid rows with vectors, or leave them out of the snapshot with "
                    f"--delete-missing.{restore_hint(cfg, store, version_before)}")
    # every vector is written: the version records the code that made them (in its schema: a later run whose code
    # differs embeds every document again, and a restored version brings back the record of its own vectors)
    store.mark_embedded_by(embed_code)
    changed = store.version != version_before or bool(summary.embedded or summary.precomputed or summary.deleted or summary.resumed)
    lock.ensure_held()
    with rundir.timed("maintain"), busy("index: maintaining the table (compaction, indexes)"):
        summary.maintenance = maintain_apart(store, cfg.ann_from(), timedelta(hours=cfg.prune_after_hours), changed,
                                             rebuild=cfg.rebuild_indexes)  # in a child process from APART_FROM_ROWS rows
    with rundir.timed("bm25_index"), busy("index: the BM25 index of the new version"):
        try:
            summary.maintenance["bm25_index"] = _bm25_index(cfg, store)
        except OSError as exc:  # (a full disk, say): the table is done; readers build the index on first use
            summary.maintenance["bm25_index"] = {"how": "failed", "error": first_line(exc)}
    release_ray()  # (a local cluster's shutdown takes seconds: a Ctrl-C in them stops a run not yet marked complete)
    summary.tag = cfg.tag or f"{_AUTO_TAG}{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}"
    lock.ensure_held()
    store.tag(summary.tag)  # (before the mark: a tag that fails leaves the version unread, as the run's manifest says)
    store.mark_complete()  # readers read this version from now on (pipelines/engines/store/versions.py)
    summary.maintenance["tags_dropped"] = store.drop_old_tags(_AUTO_TAG_NAME, cfg.keep_index_tags)


PRECOMPUTED = "precomputed"  # the embedded-by mark of a table whose vectors the corpus gave (+ the named local model's files)


def vector_column(cfg: IndexConfig, store: DocStore) -> VectorColumn | None:
    """Where the corpus's precomputed vectors are and their dimension (None: the run embeds):
    the table's dimension, ``--vector-dim`` and the named model's, whichever are known, must
    agree; a new table of external vectors needs ``--vector-dim``."""
    if cfg.vector_column is None:
        return None
    dims = {}
    if store.exists():
        dims[f"table {cfg.table!r}"] = store.dim
    if cfg.vector_dim is not None:
        dims["--vector-dim"] = cfg.vector_dim
    if loadable(cfg.vector_model):
        dims[f"model {cfg.vector_model!r}"] = model_dimension(cfg.vector_model)
    if not dims:
        raise IndexJobError(f"index: --vector-column {cfg.vector_column} into a new table needs the vectors' dimension: give --vector-dim N "
                            f"(or --vector-model naming a model logicrank can load, whose dimension is used).")
    if len(set(dims.values())) > 1:
        raise IndexJobError(f"index: the vectors' dimension disagrees: {', '.join(f'{k} {v}' for k, v in dims.items())}; "
                            "nothing was read into the table.")
    return VectorColumn(cfg.vector_column, next(iter(dims.values())))


def _refuse_a_finished_tag(cfg: IndexConfig, store: DocStore, complete: int | None, previous: dict) -> None:
    """Refuse ``--tag`` where the tag already names a version a completed run finished (at or
    before the last complete one): it was moved to this run's version without a word, so a
    manifest, a paper or ``--table-version TAG`` naming it read other documents, and its
    version, untagged, was pruned. Moved as before: a tag this job made on a version it then
    did not mark (a run stopped between the two, rerun), and one naming the last complete
    version where this run directory's previous run did not finish (``previous``: its manifest;
    stopped after the tag and the mark, before its record: a nightly's index step resumed)."""
    at = store.tagged_version(cfg.tag) if cfg.tag and store.exists() else None
    own_retry = at == complete and previous.get("status") not in (None, "ok")
    if at is not None and complete is not None and at <= complete and not own_retry:
        raise IndexJobError(f"index: tag {cfg.tag!r} already names v{at}, which a completed run finished; a tag names one version "
                            "(what its manifests and --table-version read): give this run another tag. Nothing was read into the table.")


def last_complete(store: DocStore) -> int | None:
    """The version readers read by default (the last one a completed index run finished), or
    None: no table, or no run on it completed (pipelines/engines/store/versions.py)."""
    from logicrank.pipelines.engines.store import StoreError

    if not store.exists():
        return None
    try:
        return store.readable_version("index")[0]
    except StoreError:
        return None


def _stopped(cfg: IndexConfig, rundir: RunDir, sources: list[Source], mid: str, store: DocStore, version_before: int | None,
             writer: IndexWriter, exc: BaseException) -> BaseException:
    """A run that stopped before it finished: interrupted (Ctrl-C, SIGTERM, the stall watchdog) or
    failed (an error). Writes its manifest with that status and returns what to raise, saying in
    one line what the table holds and how to resume: :class:`IndexInterrupted` for an
    interruption; else ``exc``, its one-line message extended (a :class:`UserError` or
    :class:`JobFailed`) or the line added as a note (a bug keeps its traceback)."""
    interrupted = isinstance(exc, KeyboardInterrupt | Stalled)
    state = table_state(cfg, store, version_before)
    done = (f"after reading {writer.rows_read:,} rows ({writer.written:,} documents written)" if writer.written
            else f"after reading {writer.rows_read:,} rows, before writing any")
    resume = "rerun the same command to resume (documents already written are kept and not embedded again)"
    line = f"index: {'interrupted' if interrupted else 'failed'} {done}; {state}; {resume}."
    with suppress(Exception):  # the manifest is a record; what stopped the run is what must surface
        rundir.write_manifest(
            cfg.model_dump(mode="json"), cfg.digest(), {"corpus": [s.fingerprint() for s in sources]}, ["rejects.parquet"],
            status="interrupted" if interrupted else "failed", model=mid,
            table={"db": cfg.db, "name": cfg.table, "version_before": version_before,
                   "version": store.version if store.exists() else None, "complete": _marked_complete(store)},
            counts={"rows_read": writer.rows_read, "written": writer.written, **dict(writer.counts)},
            error=line if isinstance(exc, KeyboardInterrupt) else f"{line} {type(exc).__name__}: {first_line(exc)}",
        )
    if isinstance(exc, KeyboardInterrupt):
        return IndexInterrupted(line, 143 if isinstance(exc, Terminated) else 130)
    if isinstance(exc, UserError | JobFailed) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0].rstrip()} Index run stopped {done}; {state}; {resume}.",)
    else:
        exc.add_note(line)
    return exc


def _marked_complete(store: DocStore) -> bool:
    """Whether the table's latest version is one readers read (a step after the completion mark
    failed, the old tags' drop say): what a stopped run's manifest records, as read."""
    with suppress(Exception):
        return store.exists() and store.complete_version() == store.version
    return False


def progress_line(w: IndexWriter, precomputed: bool) -> str:
    """The live line of the stream: rows read, written (embedded, unless the corpus gave the vectors), unchanged, rejected."""
    c = w.counts
    made = "written" if precomputed else "embedded"
    return f"indexing: {w.rows_read} rows read, {c['insert'] + c['update']} {made}, {c['unchanged']} unchanged, {c['reject']} rejected"


class _progress:
    """A rich live counter of rows read and written (quiet when disabled)."""

    def __init__(self, enabled: bool, precomputed: bool = False):
        self.enabled, self.precomputed = enabled, precomputed

    def __enter__(self):
        if not self.enabled:
            return lambda n, w: None
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.p = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=False)
        self.p.__enter__()
        task = self.p.add_task("indexing")

        def tick(n: int, w: IndexWriter) -> None:
            self.p.update(task, description=progress_line(w, self.precomputed))

        return tick

    def __exit__(self, *exc):
        if self.enabled:
            self.p.__exit__(*exc)
        return False
