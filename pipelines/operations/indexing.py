"""Incremental indexing: classify rows by content hash, embed what changed, write once.

The stages, in order, each over PARSED tables (see :mod:`logicrank.pipelines.corpus`):

1. :class:`EmbedStage` marks each row ``reject`` / ``unchanged`` / ``update`` / ``insert``
   against the stored hashes of that batch's ids (:class:`StoredHashes`, looked up in the
   table per batch) and embeds only inserts and updates (a Ray actor in the job).
2. :class:`IndexWriter` (the one writer) keeps the first row of each id, sends later
   duplicates and rejects to the rejects sink, and writes the rest: inserts appended in
   chunks, updates in fewer, larger keyed merges.

After the stream, the job deletes stored ids the snapshot did not contain
(:meth:`SeenIds.absent`, an anti-join in batches).

What a run tells its operator about the table (no Ray): why a snapshot is refused
(:func:`index_refusal`), the undo of a run whose input failed (:func:`roll_back`), and what the
table holds and how to restore it (:func:`restore_hint`, :func:`table_state`).

Bounded memory: nothing here holds a whole corpus's ids or hashes. The stored hashes are
read per batch through the table's scalar index on doc_id; the ids read so far are kept on
disk (:class:`SeenIds`, SQLite in the run's directory). Every stored (doc_id, content_hash) in a
dict and every id read in a set would take about 2 GiB of the driver at 10M documents, and a
copy in each embedding actor.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig
from logicrank.pipelines.corpus import NOT_UTF8_NOTE, UNREADABLE, SourceError
from logicrank.pipelines.engines.embed import Embedder, document_text, to_fixed_size_list
from logicrank.schemas.errors import first_line
from logicrank.schemas.tables import CORPUS, REJECTS, as_stored

if TYPE_CHECKING:  # the embedding actor imports this module: keep lancedb out of it
    from logicrank.pipelines.engines.store import DocStore
    from logicrank.pipelines.operations.writelock import TableLock

# Lance's caches of the dataset the lookups read: at their defaults they grow with the lookups
# (about 24 MiB of RSS per 1M ids looked up, measured), bounded here they stay flat, and the
# lookups take as long (tests/perf/bench_reindex.py --diff).
_BOUNDED_CACHES = {"index_cache_size_bytes": 4 << 20, "metadata_cache_size_bytes": 4 << 20}
_HASHES = pa.schema([pa.field("doc_id", pa.string()), pa.field("content_hash", pa.string())])


def classify(batch: pa.Table, stored: pa.Table) -> pa.Array:
    """The action for each row of a PARSED batch, given the stored ``(doc_id, content_hash)``
    of (at least) the batch's ids: a join in Arrow, no per-row Python."""
    def col(t: pa.Table, name: str) -> pa.Array:
        return t.column(name).combine_chunks()

    old = col(stored, "content_hash").take(pc.index_in(col(batch, "doc_id"), value_set=col(stored, "doc_id")))
    same = pc.fill_null(pc.equal(old, col(batch, "content_hash")), False)
    action = pc.if_else(pc.is_null(old), "insert", pc.if_else(same, "unchanged", "update"))
    return pc.if_else(pc.is_valid(col(batch, "_reason")), "reject", action)


class StoredHashes:
    """The stored ``(doc_id, content_hash)`` of a batch's ids, read from table ``name`` of
    ``uri`` at ``version`` (the version the run started from; None: no table yet) through its
    scalar index on doc_id.

    One lookup per batch instead of every stored hash in memory: measured at 1M stored ids,
    3 to 6 s of lookups in all when the snapshot comes in the table's order (batches of 4,096
    and 512), against 0.15 s to read every hash once, which holds the whole table's ids.
    Picklable: a Ray embedding actor opens the table itself, as the retrieval actors do, so
    the database must be readable from every node that hosts one.

    ``reembed``: every stored id reads as changed (the embedding code changed, so no stored
    vector is reused)."""

    def __init__(self, uri: str, name: str, version: int | None, reembed: bool = False):
        if "://" not in uri:  # an actor's working directory is not the driver's
            uri = str(Path(uri).resolve())
        self.uri, self.name, self.version, self.reembed = uri, name, version, reembed
        self._ds = None

    def __getstate__(self):
        return {**self.__dict__, "_ds": None}

    def dataset(self):
        """The Lance dataset of the pinned version, opened once."""
        if self._ds is None:
            from logicrank.pipelines.engines.store import DocStore

            self._ds = DocStore(self.uri, self.name, version=self.version).table.to_lance(**_BOUNDED_CACHES)
        return self._ds

    def __call__(self, ids: pa.Array | pa.ChunkedArray) -> pa.Table:
        ids = pc.unique(pc.drop_null(ids))
        if self.version is None or len(ids) == 0:
            return _HASHES.empty_table()
        found = self.dataset().to_table(columns=["doc_id", "content_hash"], filter=pc.field("doc_id").isin(ids))
        if self.reembed:
            found = found.set_column(1, "content_hash", pa.array([""] * found.num_rows, pa.string()))
        return found.cast(_HASHES)

    def ids(self, batch_rows: int = 65536) -> Iterator[pa.Array]:
        """Every stored id of the pinned version, in batches (nothing when there is no table)."""
        if self.version is None:
            return
        for b in self.dataset().to_batches(columns=["doc_id"], batch_size=batch_rows):
            yield b.column("doc_id")

    def count(self) -> int:
        return 0 if self.version is None else int(self.dataset().count_rows())


class FragmentSink:
    """Where an encoder worker writes the rows it embedded for new ids: one Lance data file per
    batch under the table's dataset (``lance.fragment.write_fragments``), committed by nobody
    here. The driver commits the files whose rows it keeps (:class:`IndexWriter`), so no text or
    vector of a new document passes through it. Picklable, as :class:`StoredHashes`: every node
    that hosts an encoder must reach ``dataset_uri``.

    Files go only into a table that exists (a data file in the directory of a table not yet
    created would make a table without versions): until the driver has created it, with the
    first rows of a first build, :meth:`write` writes nothing and the rows travel to the driver
    with their text and vector, as when the workers write nothing."""

    def __init__(self, dataset_uri: str, schema: pa.Schema | None = None):
        """``dataset_uri``: absolute (:meth:`DocStore.dataset_uri`): an actor's working directory is not the driver's."""
        self.uri, self.schema = dataset_uri, schema  # the table's schema, once known

    def _table_schema(self) -> pa.Schema | None:
        if self.schema is None:
            import lance

            try:
                self.schema = lance.dataset(self.uri).schema
            except ValueError as exc:
                if "was not found" not in str(exc):
                    raise
        return self.schema

    def write(self, rows: pa.Table) -> str | None:
        """Write ``rows`` (CORPUS columns, content_hash, vector as a fixed-size list) as one file;
        returns its fragment and the vectors' dimension, as JSON (None: no table yet, nothing written)."""
        from lance.fragment import write_fragments

        schema = self._table_schema()
        if schema is None:
            return None
        dim = rows.schema.field("vector").type.list_size
        if schema.field("vector").type.list_size != dim:
            raise ValueError(f"index: the embedder returned {dim}-dimensional vectors for a table of "
                             f"{schema.field('vector').type.list_size} dimensions")
        (fragment,) = write_fragments(as_stored(rows, schema), self.uri, schema=schema, max_rows_per_file=rows.num_rows)
        return json.dumps({"dim": dim, "fragment": fragment.to_json()})


class EmbedStage:
    """Classify a PARSED batch and embed its inserts and updates.

    Adds ``_action`` and ``vector`` (empty where nothing was embedded). Texts of unchanged
    rows are dropped from the output: only their ids travel on. A batch that carries its own
    vectors (PARSED_VECTORS: the corpus's precomputed vectors, checked by the reader) embeds
    nothing: its inserts and updates keep the vectors they came with.

    With a ``sink`` (:class:`FragmentSink`) the batch's inserts are written here, as one data
    file, and leave as ids alone, like unchanged rows: ``_written`` marks them, ``_file`` and
    ``_file_row`` say where each is, and ``_fragment`` holds the file's JSON on the first of
    them (while the table does not exist yet, none is written). Updates travel on with their text and vector: the driver writes them as keyed merges.

    ``stored``: the stored hashes of a batch's ids (:class:`StoredHashes`, or any callable
    from ids to a ``(doc_id, content_hash)`` table), asked once per batch.
    """

    def __init__(self, config: EmbedConfig, stored: Callable[[pa.Array], pa.Table], embedder_factory: Callable[[EmbedConfig], Embedder] = Embedder,
                 sink: FragmentSink | None = None):
        self.config, self._factory, self._embedder = config, embedder_factory, None
        self.stored, self.sink = stored, sink

    @property
    def embedder(self) -> Embedder:
        """Loaded on first use: a re-index with nothing to embed never loads the model."""
        if self._embedder is None:
            self._embedder = self._factory(self.config)
        return self._embedder

    def __call__(self, batch: pa.Table) -> pa.Table:
        actions = classify(batch, self.stored(batch.column("doc_id")))
        todo = pc.is_in(actions, pa.array(["insert", "update"])).to_numpy(zero_copy_only=False)
        # In transit a vector is a variable-size list (empty where nothing was embedded);
        # the writer turns it into the table's fixed-size column.
        counts = np.zeros(batch.num_rows, dtype=np.int32)
        values = np.zeros(0, dtype=np.float32)
        given = batch.column("vector").combine_chunks() if "vector" in batch.column_names else None
        if given is not None:
            batch = batch.drop_columns(["vector"])
        if todo.any():
            idx = np.flatnonzero(todo)
            if given is not None:  # precomputed: the reader checked each (unit length, the table's dimension)
                vecs = given.take(pa.array(idx))
                counts[idx] = pc.list_value_length(vecs).to_numpy(zero_copy_only=False)
                values = pc.list_flatten(vecs).to_numpy(zero_copy_only=False).astype(np.float32)
            else:
                titles = batch.column("title").take(idx).to_pylist()
                texts = batch.column("text").take(idx).to_pylist()
                vecs = self.embedder.encode([document_text(t, x, self.embedder.config.title_sep) for t, x in zip(titles, texts, strict=True)])
                counts[idx] = vecs.shape[1]
                values = vecs.reshape(-1)
        written = np.zeros(batch.num_rows, dtype=bool)
        fragment = None
        if self.sink is not None:
            written = pc.equal(actions, "insert").to_numpy(zero_copy_only=False)
            if written.any():
                rows = np.flatnonzero(written)
                dim = int(counts[rows[0]])
                mine = np.repeat(written, counts)  # the written rows' values, in row order
                if (counts[rows] != dim).any():
                    raise ValueError("index: the embedder returned vectors of different sizes in one run")
                fixed = pa.FixedSizeListArray.from_arrays(pa.array(values[mine], pa.float32()), dim)
                new = batch.take(pa.array(rows)).select(CORPUS.names + ["content_hash"]).append_column("vector", fixed)
                fragment = self.sink.write(new)
                if fragment is None:  # no table yet: these rows go to the driver, which creates it
                    written[:] = False
                else:
                    values, counts = values[~mine], np.where(written, 0, counts)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        vectors = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.float32()))
        # only the id goes on: a take with a null index where a row travels light copies only the other rows' texts
        # (if_else with a null scalar keeps every row's bytes in the result's buffer)
        light = pc.equal(actions, "unchanged").to_numpy(zero_copy_only=False) | written
        keep_text = pa.array(np.arange(batch.num_rows), mask=light)
        for name in ("title", "text", "metadata"):
            batch = batch.set_column(batch.schema.get_field_index(name), name, batch.column(name).take(keep_text))
        batch = batch.append_column("_action", actions).append_column("vector", vectors)
        if self.sink is None:
            return batch
        # each written row names its file and its place in it; the first also carries the file's fragment (Ray Data may
        # cut a batch into several blocks on its way to the driver, so a file's rows can arrive in several batches)
        path = json.loads(fragment)["fragment"]["files"][0]["path"] if fragment is not None else None
        place = np.cumsum(written) - 1
        first = int(np.argmax(written)) if written.any() else -1
        return (batch.append_column("_written", pa.array(written))
                .append_column("_file", pa.array([path if w else None for w in written], pa.string()))
                .append_column("_file_row", pa.array([int(p) if w else None for p, w in zip(place, written, strict=True)], pa.int32()))
                .append_column("_fragment", pa.array([fragment if i == first else None for i in range(batch.num_rows)], pa.string())))


class RejectSink:
    """Streams rejected rows to a Parquet file (written under a temporary name until closed)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.writer = pq.ParquetWriter(self.tmp, REJECTS)
        self.reasons: Counter[str] = Counter()

    def write(self, rows: pa.Table) -> None:
        if rows.num_rows:
            self.writer.write_table(rows.cast(REJECTS))
            self.reasons.update(rows.column("reason").to_pylist())

    def close(self) -> Path:
        self.writer.close()
        self.tmp.replace(self.path)
        return self.path

    @property
    def count(self) -> int:
        return sum(self.reasons.values())


class SeenIds:
    """The ids this snapshot kept, each with the key of its source row, the keys of the rows
    it rejected and the ids those rows named: on disk (SQLite in ``directory``, a temporary one when None), so the
    writer's memory does not grow with the corpus.

    SQLite because the writer asks, batch after batch, "which of these ids came before?", a
    keyed lookup into everything seen so far that must see the rows written a moment ago:
    measured at 1M ids, 1.1 s of inserts and 1.1 s for the anti-join of the stored ids
    (:meth:`absent`). The file is scratch: no journal, no sync; a run that is killed leaves
    it, and the next run starts it anew."""

    FILE = ".seen-ids.sqlite"

    def __init__(self, directory: str | Path | None = None):
        self._tmp = None if directory is not None else tempfile.mkdtemp(prefix="logicrank-seen-")
        self.path = Path(directory if directory is not None else self._tmp) / self.FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        for pragma in ("journal_mode = OFF", "synchronous = OFF", "temp_store = FILE"):
            self.db.execute(f"PRAGMA {pragma}")
        self.db.execute("CREATE TABLE seen (doc_id TEXT PRIMARY KEY, key INTEGER NOT NULL) WITHOUT ROWID")
        self.db.execute("CREATE TABLE rejected (key INTEGER PRIMARY KEY)")
        self.db.execute("CREATE TABLE rejected_ids (doc_id TEXT PRIMARY KEY) WITHOUT ROWID")
        self.kept = 0
        self.named_by_rejects = 0  # ids rejected rows named (a clean snapshot: 0, and absent asks nothing of them)
        self.held = 0  # of the stored ids the last :meth:`absent` read: those only a rejected row named

    def __len__(self) -> int:
        return self.kept

    def keys_of(self, ids: Iterable[str | None]) -> dict[str, int]:
        """id -> its source row's key, for those of ``ids`` kept before."""
        wanted = json.dumps(sorted({d for d in ids if d is not None}))
        return dict(self.db.execute("SELECT doc_id, key FROM seen WHERE doc_id IN (SELECT value FROM json_each(?))", (wanted,)))

    def rejected_among(self, keys: Iterable[int]) -> set[int]:
        """Those of ``keys`` whose rows were rejected before."""
        wanted = json.dumps(sorted(set(keys)))
        return {k for (k,) in self.db.execute("SELECT key FROM rejected WHERE key IN (SELECT value FROM json_each(?))", (wanted,))}

    def add(self, kept: dict[str, int], rejected: Iterable[int], rejected_ids: Iterable[str] = ()) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO seen VALUES (?, ?)", kept.items())
        self.db.executemany("INSERT OR IGNORE INTO rejected VALUES (?)", ((k,) for k in rejected))
        named = [(d,) for d in rejected_ids]
        self.db.executemany("INSERT OR IGNORE INTO rejected_ids VALUES (?)", named)
        self.db.execute("COMMIT")
        self.kept += len(kept)
        self.named_by_rejects += len(named)

    def _rejected_among(self, ids: list[str]) -> list[str]:
        wanted = json.dumps(sorted(set(ids)))
        return [d for (d,) in self.db.execute("SELECT doc_id FROM rejected_ids WHERE doc_id IN (SELECT value FROM json_each(?))", (wanted,))]

    def absent(self, stored_ids: Iterable[pa.Array]) -> Iterator[pa.Array]:
        """The ids of ``stored_ids`` (batches) that this snapshot holds no row of: an anti-join,
        one batch at a time. An id that only a rejected row of the snapshot named (its text
        empty, too long, not UTF-8, ...) is not absent: the snapshot holds the document, in a
        form that cannot be read, and the stored version stays (:attr:`held` counts them)."""
        self.held = 0
        for missing in self.not_kept(stored_ids):
            if self.named_by_rejects:  # (a clean snapshot asks nothing more)
                held = self._rejected_among(missing.to_pylist())
                self.held += len(held)
                missing = _without(missing, held)
            if len(missing):
                yield missing

    def not_kept(self, stored_ids: Iterable[pa.Array]) -> Iterator[pa.Array]:
        """The ids of ``stored_ids`` (batches) that no row this snapshot kept holds: the absent
        ones and the held ones (:meth:`absent`), whose stored rows this run did not write."""
        for ids in stored_ids:
            ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
            missing = _without(ids, list(self.keys_of(ids.to_pylist()))) if len(ids) else ids
            if len(missing):
                yield missing

    def close(self) -> None:
        """Close and remove the file (and the temporary directory made for it)."""
        self.db.close()
        self.path.unlink(missing_ok=True)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _without(ids: pa.Array, drop: list[str]) -> pa.Array:
    """``ids`` less those in ``drop``, in their order."""
    return ids.filter(pc.invert(pc.is_in(ids, value_set=pa.array(drop, pa.string())))) if drop else ids


LEFT_BEHIND_ROWS = 4096  # stored documents embedded again per keyed merge (:func:`embed_left_behind`)


def embed_left_behind(store: DocStore, seen: SeenIds, config: EmbedConfig, before_each: Callable[[], None] = lambda: None,
                      embedder_factory: Callable[[EmbedConfig], Embedder] = Embedder) -> int:
    """In a run that embeds every stored document again (the code that makes vectors changed:
    the table's record is not this run's), the stored documents that no valid row of the
    snapshot rewrote (held: only a rejected row named them; absent ones a run that deletes
    nothing keeps) embedded again here, from their stored title and text, and written back by
    keyed merges: no vector of the earlier code stays under this code's record. ``seen``: the
    run's kept ids; ``before_each``: called before each write (the table's lock). Returns how
    many were embedded."""
    columns = [name for name in store.table.schema.names if name != "vector"]
    embedder, done = None, 0
    for batch in _not_rewritten(store, seen):
        rows = store.rows_for(batch.to_pylist(), columns)
        embedder = embedder or embedder_factory(config)
        texts = [document_text(t, x, embedder.config.title_sep) for t, x in zip(rows.column("title").to_pylist(),
                                                                                 rows.column("text").to_pylist(), strict=True)]
        before_each()
        store.upsert(rows.append_column("vector", to_fixed_size_list(embedder.encode(texts))))
        done += rows.num_rows
    return done


def _not_rewritten(store: DocStore, seen: SeenIds) -> Iterator[pa.Array]:
    """The ids of the stored documents no valid row of the snapshot rewrote, in batches: those
    of this version, read while the merges add others."""
    return seen.not_kept(StoredHashes(store.uri, store.name, store.version).ids(LEFT_BEHIND_ROWS))


def left_behind(store: DocStore, seen: SeenIds, first: int = 3) -> tuple[int, list[str]]:
    """How many stored documents no valid row of the snapshot rewrote (held: only a rejected
    row named them; absent ones a run that deletes nothing keeps), and the first ``first`` of
    their ids: in a run whose vectors come with the corpus they keep the earlier vectors."""
    n, named = 0, []
    for batch in _not_rewritten(store, seen):
        n += len(batch)
        named += batch.to_pylist()[: max(0, first - len(named))]
    return n, named


class IdSpill:
    """Ids written to a Parquet file in batches and read back in batches: the absent ids
    between the guards, which count them, and the deletes, which need them again."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def write(self, batches: Iterable[pa.Array]) -> int:
        """Write every id of ``batches``; returns how many."""
        n = 0
        schema = pa.schema([pa.field("doc_id", pa.string())])
        with pq.ParquetWriter(self.path, schema) as out:
            for ids in batches:
                out.write_table(pa.table({"doc_id": ids}, schema=schema))
                n += len(ids)
        return n

    def read(self, batch_rows: int = 65536) -> Iterator[pa.Array]:
        for b in pq.ParquetFile(self.path).iter_batches(batch_size=batch_rows, columns=["doc_id"]):
            yield b.column("doc_id")

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


# Each keyed merge (DocStore.upsert) is a commit, a table version and a look-up of its ids in
# the id index, so updates wait for fewer, larger merges: MERGE_ROWS of them, MERGE_BYTES of them
# (their texts and vectors wait in the driver), or what waited MERGE_SECONDS, which bounds what a
# kill of the driver loses of the encoders' work (the rerun embeds those rows again). The wait
# is checked as each batch arrives.
MERGE_ROWS = 1 << 16
MERGE_BYTES = 256 << 20
MERGE_SECONDS = 120.0


class IndexWriter:
    """The single committer: dedups ids, routes rejects, and commits what it keeps: the data
    files the workers wrote for new ids (:class:`FragmentSink`) and the inserts that came with
    their text and vector (when the workers write nothing) appended in chunks of
    ``chunk_rows``; updates as keyed merges of ``merge_rows`` (or ``merge_bytes``), or of what
    waited ``merge_seconds`` (:data:`MERGE_ROWS`). :meth:`flush` commits everything waiting
    (the index job calls it on Ctrl-C and SIGTERM too).

    ``seen`` (:class:`SeenIds`, on disk under ``seen_dir``) holds each id kept with the key of
    the source row it came from (its ``_source`` and ``_record``). A row delivered twice (a task Ray re-ran after losing a
    worker) has the same key and is dropped quietly (counted as ``redelivered``); a second row
    with the same id elsewhere in the snapshot is a ``duplicate_id`` reject. A worker's file is
    committed whole when every row in it is kept, not at all when none is (a batch delivered
    twice: its second file), and otherwise read back here and its kept rows appended. Call
    :meth:`finish` after the last batch.
    """

    def __init__(
        self, store: DocStore, model_id: str, rejects: RejectSink, chunk_rows: int = 4096, before_commit: Callable[[], None] = lambda: None,
        title_sep: str = " ", seen_dir: str | Path | None = None, baseline: Callable[[pa.Array], pa.Table] | None = None,
        merge_rows: int = MERGE_ROWS, merge_bytes: int = MERGE_BYTES, merge_seconds: float = MERGE_SECONDS,
        clock: Callable[[], float] = time.monotonic, embedded_by: str | None = None,
    ):
        """``before_commit`` runs before every write (the job checks it still holds the table's lock).

        ``baseline``: the stored hashes of another version than the one the rows were
        classified against (a run that resumes one that did not finish counts what changed
        since the last complete version, :attr:`since`); None: no second count.

        ``embedded_by``: the digest of the code that makes the vectors, recorded in a table this
        writer creates (``DocStore.embedded_by``)."""
        self.store, self.model_id, self.rejects, self.chunk_rows, self.title_sep = store, model_id, rejects, chunk_rows, title_sep
        self.embedded_by = embedded_by
        self.before_commit = before_commit
        self.baseline = baseline
        self.merge_rows, self.merge_bytes, self.merge_seconds, self.clock = merge_rows, merge_bytes, merge_seconds, clock
        self.seen = SeenIds(seen_dir)
        self.counts: Counter[str] = Counter()  # what this run does to each row: insert (embedded), update, unchanged, reject
        self.since: Counter[str] = Counter()  # the kept rows classified against ``baseline``
        self.redelivered = 0
        self.not_utf8 = 0  # documents kept whose bytes were not all UTF-8 (TREC: read as U+FFFD, corpus.NOT_UTF8_NOTE)
        self.written = 0  # rows committed to the table so far (inserts and updates)
        self._pending: list[pa.Table] = []  # inserts to append
        self._pending_rows = 0
        self._updates: list[pa.Table] = []  # updates waiting for their keyed merge
        self._update_rows = 0
        self._update_bytes = 0
        self._updates_since = 0.0  # when the oldest of them came (``clock``)
        self._files: list[str] = []  # workers' data files to commit whole (their fragments' JSON)
        self._salvaged: list[tuple[str, list[int]]] = []  # (a file's path, the positions of its rows to keep)
        self._arriving: dict[str, dict] = {}  # a file's path -> its fragment and dimension (once come), the rows come, those kept
        self._settled: set[str] = set()  # the files settled (about 60 bytes each: 1.2 MB at 10M documents)
        self._file_rows = 0  # the rows those hold
        self._dim = 0  # their vectors' dimension
        self.files_committed = 0  # workers' files committed whole
        self.files_salvaged = 0  # workers' files some of whose rows were read back and appended (the rest not kept)
        self.files_dropped = 0  # workers' files none of whose rows was kept (a batch delivered twice), never committed
        self.received_bytes = 0  # what the batches brought to this process
        self.write_seconds = 0.0  # spent in the table's writes (commits of the workers' files, appends, keyed merges)
        self.merges = 0  # keyed merges made (updates)
        self._opened = store.exists()  # else the first rows written make it (a first build)

    @property
    def rows_read(self) -> int:
        return sum(self.counts.values())

    def close(self) -> None:
        """Let go of the ids seen (the file on disk)."""
        self.seen.close()

    def consume(self, batch: pa.Table) -> None:
        """Take one embedded batch. Raises :class:`~logicrank.pipelines.corpus.SourceError` on the row a
        reader sends in place of a file it could not read to its end."""
        self.received_bytes += batch.nbytes
        faults = pc.equal(batch.column("_reason"), UNREADABLE)
        if pc.any(faults).as_py():
            raise SourceError(batch.filter(faults).column("_detail")[0].as_py())
        actions = batch.column("_action").to_pylist()
        ids = batch.column("doc_id").to_pylist()
        keys = [hash(k) for k in zip(batch.column("_source").to_pylist(), batch.column("_record").to_pylist(), strict=True)]
        # what came before this batch, asked once for the batch; then the batch's own rows on top
        before, rejected_before = self.seen.keys_of(ids), self.seen.rejected_among(keys)
        kept: dict[str, int] = {}
        rejected: set[int] = set()
        keep, dup, bad = [], [], []
        for i, (doc_id, action, key) in enumerate(zip(ids, actions, keys, strict=True)):
            known = kept.get(doc_id, before.get(doc_id))
            if known == key or key in rejected_before or key in rejected:
                self.redelivered += 1  # this very source row was delivered before
            elif action == "reject":
                rejected.add(key)
                bad.append(i)
            elif known is not None:
                rejected.add(key)
                dup.append(i)
            else:
                kept[doc_id] = key
                keep.append(i)
        # a rejected row holds back the stored document it names; an id refused for surrounding whitespace names the
        # stored one without it too (ids are never stripped, so "d1 " is refused, and "d1" is not absent)
        self.seen.add(kept, rejected, (n for i in bad if ids[i] is not None for n in dict.fromkeys((ids[i], ids[i].strip())) if n))
        self._reject(batch, bad, dup)
        written = batch.column("_written").to_pylist() if "_written" in batch.column_names else [False] * batch.num_rows
        if any(written):
            self._take_files(batch, written, set(keep))
        kept_rows = batch.take(pa.array(keep, pa.int64()))
        kept_actions = kept_rows.column("_action").to_pylist()
        self.not_utf8 += pc.sum(pc.starts_with(kept_rows.column("_detail").cast(pa.string()).fill_null(""), NOT_UTF8_NOTE)).as_py() or 0
        self.counts.update(kept_actions)
        if self.baseline is not None and kept_rows.num_rows:
            self.since.update(classify(kept_rows, self.baseline(kept_rows.column("doc_id"))).to_pylist())
        inserts = [j for j, (i, a) in enumerate(zip(keep, kept_actions, strict=True)) if a == "insert" and not written[i]]
        updates = [j for j, a in enumerate(kept_actions) if a == "update"]
        if inserts:
            self._pending.append(kept_rows.take(pa.array(inserts, pa.int64())))
            self._pending_rows += len(inserts)
        if updates:
            if not self._updates:
                self._updates_since = self.clock()
            self._updates.append(kept_rows.take(pa.array(updates, pa.int64())))
            self._update_rows += len(updates)
            self._update_bytes += self._updates[-1].nbytes
        # the first rows written make the table at once when there is none: the workers write into it from then on
        append = self._pending_rows >= self.chunk_rows or self._file_rows >= self.chunk_rows or (self._pending and not self._opened)
        merge = (self._update_rows >= self.merge_rows or self._update_bytes >= self.merge_bytes
                 or (self._updates and self.clock() - self._updates_since >= self.merge_seconds))
        if append or merge:
            self._timed(self._append_waiting if not merge else self._flush)

    def _take_files(self, batch: pa.Table, written: list[bool], keep: set[int]) -> None:
        """Note which rows of the workers' files this batch keeps; a file whose rows have all
        arrived (they may come in several batches) is settled for the next commit."""
        paths, places, marks = (batch.column(c).to_pylist() for c in ("_file", "_file_row", "_fragment"))
        arrived = set()
        for i, path in enumerate(paths):
            if not written[i]:
                continue
            if path in self._settled:  # rows of a file settled already, again: their ids were seen, none is kept
                continue
            f = self._arriving.setdefault(path, {"meta": None, "seen": set(), "kept": []})
            if marks[i] is not None:
                f["meta"] = json.loads(marks[i])
            if places[i] in f["seen"]:  # the same row of the same file again: its id was seen, so it is not kept
                continue
            f["seen"].add(places[i])
            if i in keep:
                f["kept"].append(places[i])
            arrived.add(path)
        for path in arrived:
            if _all_arrived(self._arriving[path]):
                self._settle(path, self._arriving.pop(path))

    def _settle(self, path: str, f: dict) -> None:
        """A file committed whole when every row in it is kept, not at all when none is (a batch
        delivered twice), else its kept rows read back and appended. ``f["meta"]`` None: a
        file whose rows did not all arrive (the task that sent it was run again), its kept rows
        read back."""
        self._settled.add(path)
        meta = f["meta"]
        if meta is not None and len(f["kept"]) == meta["fragment"]["physical_rows"]:
            self._files.append(json.dumps(meta["fragment"]))
            self._dim = meta["dim"]
        elif f["kept"]:
            self._salvaged.append((path, sorted(f["kept"])))
        else:
            self.files_dropped += 1
        self._file_rows += len(f["kept"])

    def finish(self) -> None:
        """After the last batch: settle the files whose rows did not all arrive (each row that did
        is kept or not as it came), then commit everything left."""
        for path in list(self._arriving):
            f = self._arriving.pop(path)
            if _all_arrived(f):
                raise RuntimeError(f"index: the worker's file {path} was left unsettled (a bug)")
            self._settle(path, {**f, "meta": None})
        self.flush()

    def _reject(self, batch: pa.Table, bad: list[int], dup: list[int]) -> None:
        if bad:
            rows = batch.take(pa.array(bad, pa.int64()))
            self._write_rejects(rows, rows.column("_reason"), rows.column("_detail"))
        if dup:
            note = "an earlier row of this snapshot has this id; the first one is kept"
            self._write_rejects(batch.take(pa.array(dup, pa.int64())), pa.array(["duplicate_id"] * len(dup)), pa.array([note] * len(dup)))
        self.counts["reject"] += len(bad) + len(dup)

    def _write_rejects(self, rows: pa.Table, reasons, details) -> None:
        self.rejects.write(
            pa.table(
                {
                    "source": rows.column("_source"),
                    "location": rows.column("_location"),
                    "doc_id": rows.column("doc_id"),
                    "reason": reasons,
                    "detail": details,
                }
            )
        )

    def flush(self) -> None:
        """Commit everything waiting: the workers' files noted so far (one commit), the inserts
        (``chunk_rows`` rows per commit), then the updates (``merge_rows`` per keyed merge). The
        time it takes: :attr:`write_seconds`."""
        self._timed(self._flush)

    def _timed(self, write: Callable[[], None]) -> None:
        start = time.perf_counter()
        try:
            write()
        finally:
            self.write_seconds += time.perf_counter() - start

    def _flush(self) -> None:
        self._append_waiting()
        if not self._updates:
            return
        # a slice leaves the waiting rows once merged (a merge is idempotent): a flush stopped between two keeps the rest
        self._updates = [pa.concat_tables(self._updates)]
        while self._updates:
            rows = self._updates[0].slice(0, self.merge_rows)
            self.store.upsert(self._stored_rows(rows))
            rest = self._updates[0].slice(rows.num_rows)
            self._updates = [rest] if rest.num_rows else []
            self._update_rows, self._update_bytes = rest.num_rows, rest.nbytes
            self.merges += 1
            self.written += rows.num_rows

    def _append_waiting(self) -> None:
        """Commit the workers' files noted so far (one commit) and append the inserts pending here."""
        if self._files or self._salvaged:
            self.before_commit()
            self.store.open_or_create(self._dim, self.model_id, self.title_sep, self.embedded_by)
            self._opened = True
            # taken before the commit: an interrupt that lands as it returns must not see them again (a second commit)
            files, salvaged, rows = self._files, self._salvaged, self._file_rows
            self._files, self._salvaged, self._file_rows = [], [], 0
            self.store.commit_fragments(files)
            for path, positions in salvaged:
                self.store.append(self.store.file_rows(path).take(pa.array(positions, pa.int64())))
            self.written += rows
            self.files_committed += len(files)
            self.files_salvaged += len(salvaged)
        if not self._pending:
            return
        pending = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        for start in range(0, pending.num_rows, self.chunk_rows):
            # an insert's id is absent from the version the run started from and kept once in this run (the seen ids), and
            # a rerun after a kill reads what this run wrote as stored: appended, no keyed merge
            chunk = pending.slice(start, self.chunk_rows)
            self.store.append(self._stored_rows(chunk))
            self.written += chunk.num_rows

    def _stored_rows(self, chunk: pa.Table) -> pa.Table:
        """``chunk``'s columns as the table stores them (fixed-size vectors), the table opened
        or made for them and the lock checked: the last step before a write."""
        lists = chunk.column("vector").combine_chunks()
        dim = len(lists[0])
        if (pc.list_value_length(lists).to_numpy() != dim).any():
            raise ValueError("index: the embedder returned vectors of different sizes in one run")
        fixed = pa.FixedSizeListArray.from_arrays(lists.flatten(), dim)
        chunk = chunk.set_column(chunk.schema.get_field_index("vector"), "vector", fixed)
        self.before_commit()
        self.store.open_or_create(dim, self.model_id, self.title_sep, self.embedded_by)
        self._opened = True
        return chunk.select(CORPUS.names + ["content_hash", "vector"])


def _all_arrived(f: dict) -> bool:
    """Every row of a worker's file has come (its mark with the file's row count among them)."""
    return f["meta"] is not None and len(f["seen"]) == f["meta"]["fragment"]["physical_rows"]


def index_refusal(cfg: IndexConfig, s, stored: int, any_valid: bool, rejects: Path, restore: str,
                  deletes: tuple[int, int] | None = None) -> str | None:
    """Why this snapshot must not change the table further (no deletes, no tag), or None. ``s``: the
    run's counts (the index job's summary: ``rejected``, ``rows_read``, ``rejects_by_reason``,
    ``absent``); ``stored``: the documents the table held; ``restore``: :func:`restore_hint`'s line;
    ``deletes``: (the deletes, of how many documents) the mass-delete guard weighs, when not
    (``s.absent``, ``stored``): a resumed run's, against the last complete version."""
    fraction = s.rejected / s.rows_read if s.rows_read else 0.0
    if fraction > cfg.max_reject_fraction:
        return (
            f"index: {s.rejected} of {s.rows_read} rows rejected ({fraction:.1%} > max_reject_fraction "
            f"{cfg.max_reject_fraction:.1%}); reasons {s.rejects_by_reason}. No document was deleted and no tag made. "
            f"See {rejects} for each row's source and reason; fix the corpus or raise --max-reject-fraction.{restore}"
        )
    if not any_valid:
        return (
            f"index: the snapshot {cfg.corpus!r} holds no valid document ({s.rows_read} rows read, {s.rejected} rejected); "
            f"an empty snapshot never deletes anything, so the table is unchanged. Check the corpus path and format"
            + (f"; see {rejects} for each rejected row's reason." if s.rejected else ".")
        )
    gone, of = deletes or (s.absent, stored)
    share = gone / of if of else 0.0
    if cfg.delete_missing and share > cfg.max_delete_fraction and not cfg.allow_mass_delete:
        return (
            f"index: this snapshot would delete {gone} of the {of} documents in table {cfg.table!r} "
            f"({share:.1%} > max_delete_fraction {cfg.max_delete_fraction:.1%}); refused, nothing was deleted. If the "
            f"deletions are meant, rerun with --allow-mass-delete (or raise --max-delete-fraction).{restore}"
        )
    return None


def roll_back(cfg: IndexConfig, store: DocStore, version_before: int | None, lock: TableLock) -> str:
    """Undo what this run wrote before its input failed (only while it still holds the table's
    lock); says what the table is now, or how to put it back when the undo could not run."""
    if version_before is not None and store.version == version_before:
        return f"The table is unchanged (v{version_before})."
    if version_before is None and not store.exists():
        return f"No table {cfg.table!r} was created."
    try:
        lock.ensure_held()
        if version_before is None:  # this run created it
            store.drop()
            return f"No table {cfg.table!r} was left: this run had created it."
        store.restore(version_before)
    except Exception as exc:  # noqa: BLE001 - the fault of the input is what must surface; say what is left to do
        undo = (f"logicrank restore --db {cfg.db} --table {cfg.table} --version {version_before}" if version_before is not None
                else f"remove table {cfg.table!r} from {cfg.db}")
        return f"Rolling back what this run wrote failed ({first_line(exc)}); to undo it: {undo}."
    return f"The documents written before the fault were rolled back: the table is as it was at v{version_before} (now v{store.version})."


def restore_hint(cfg: IndexConfig, store: DocStore, version_before: int | None) -> str:
    """What the table holds and how to put it back as it was before this run, for refusal messages."""
    if version_before is None:
        return f" The good rows were written: {table_state(cfg, store, None)}." if store.exists() else ""
    if store.exists() and store.version == version_before:
        why = unread_reason(store)
        return f" The table is unchanged (v{version_before}){f', still incomplete, and will not be read {why}' if why else ''}."
    return (
        f" New and changed documents were written: {table_state(cfg, store, version_before)}; to return to the table as it was "
        f"before this run: logicrank restore --db {cfg.db} --table {cfg.table} --version {version_before}"
    )


def unread_reason(store: DocStore) -> str | None:
    """None when readers read the table's latest version (a completed run finished it); else
    why not, in parentheses."""
    from logicrank.pipelines.engines.store import StoreError

    try:
        read = store.readable_version("index")[0]
    except StoreError:
        return "(no index run has completed on this table, so retrieve refuses it)"
    return None if read == store.version else f"(readers keep reading v{read}, the last version a completed index run finished)"


def table_state(cfg: IndexConfig, store: DocStore, version_before: int | None) -> str:
    """What a run that did not finish left: the table's latest version, and whether readers read
    it (a version a completed run finished) or which one they read instead."""
    table = repr(cfg.table)
    try:
        if not store.exists():
            return f"no table {table} was created"
        latest, why = store.version, unread_reason(store)
        if latest == version_before:
            return f"table {table} is unchanged (v{latest})" + (f", still incomplete, and will not be read {why}" if why else "")
        return f"table {table} v{latest} is complete" if why is None else f"table {table} v{latest} is incomplete and will not be read {why}"
    except Exception as exc:  # noqa: BLE001 - what stopped the run is what must surface
        return f"the state of table {table} could not be read ({first_line(exc)})"
