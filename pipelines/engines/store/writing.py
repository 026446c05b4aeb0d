"""Writing the table: create, upsert by content hash, delete what a snapshot lacks, build and
maintain its indexes. One writer per table (the index job's lease, pipelines/operations/writelock.py).

What each index costs a re-index after 1% of the documents changed, measured with
tests/perf/bench_reindex.py (384-dimensional vectors, texts of 40 words; 2 shared cores):

- compaction: only small fragments are merged (:data:`COMPACT_TARGET_ROWS`).
- the scalar index on doc_id (BTREE): updated in place in 0.02 s at 100k, 0.4 s at 1M;
  change detection looks up each batch's stored hashes through it (pipelines/operations/indexing.py),
  so it is kept whole every run.
- the full-text indexes on title and text: merged in place they cost 0.4 + 0.5 s at 100k but
  8 to 20 s each at 1M (a merge rewrites the index, so it grows with the table; rebuilt at
  1M: 11 s for title, 71 s for text). Added as a delta index instead: 0.15 to 0.25 s at 1M.
  Retrieval does not read them (the BM25 engine, pipelines/engines/bm25/, keeps its own
  index); they stay the reference the BM25 engine is tested against and serve
  LanceDB-native full-text search, so each run keeps them covering every row, by deltas,
  merged past :data:`MAX_DELTAS` (never into the first index); they are rebuilt only when
  asked (``rebuild``) or when made by an older analyzer. Their statistics keep replaced and
  deleted rows until a rebuild (pipelines/engines/store/reading.py, ``text_search``).
- the ANN index (IVF_HNSW_SQ): built in about 75 s at 100k; a delta for the changed rows
  takes 0.2 s; merging the deltas into the first index costs another 76 s, a rebuild. So
  the ANN index is built only when asked (``ann_threshold`` given: the index job's ``ann``
  option) and, once built, never rebuilt because rows changed: deltas as above, the newest
  ones merged past :data:`MAX_DELTAS` (about 1.2 s for a few thousand rows at 100k).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.engines.bm25 import drop_indexes, prune_indexes
from logicrank.pipelines.engines.store.base import _FTS_ANALYZER, _FTS_COLUMNS, _META_EMBEDDED_BY, _META_MODEL, _META_TITLE_SEP
from logicrank.schemas.tables import as_stored, docs_schema


def local_path(uri: str) -> Path | None:
    """The local directory of a database or dataset URI, as LanceDB reads it (``~`` expanded,
    ``file://`` stripped, absolute); None for an object store's."""
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    elif "://" in uri:
        return None
    return Path(uri).expanduser().resolve()


MAX_DELTAS = 7  # delta indexes of a full-text or ANN index (a week of nights) before maintenance merges them
# Compaction merges fragments smaller than this (and rewrites those with 10% of their rows
# deleted). At Lance's default, 1M rows, the table's big fragment falls under it as soon as a
# re-index replaces one row, and every run rewrites it with the new rows: 51 s at 1M documents
# for a 1% re-index, against 1.2 s with 64k, which merges only the runs' small fragments.
COMPACT_TARGET_ROWS = 1 << 16


@contextmanager
def _timed(into: dict[str, float], name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        into[name] = round(into.get(name, 0.0) + time.perf_counter() - start, 3)


class Writing:
    """The write side of :class:`logicrank.pipelines.engines.store.DocStore`."""

    def open_or_create(self, dim: int, model_id: str, title_sep: str = " ", embedded_by: str | None = None):
        """Open the table, checking it was embedded with ``model_id`` and ``title_sep``; create it when absent
        (``embedded_by``: the digest of the code that makes its vectors, :meth:`embedded_by`)."""
        if not self.exists():
            meta = {_META_MODEL: model_id.encode(), _META_TITLE_SEP: title_sep.encode()}
            if embedded_by is not None:
                meta[_META_EMBEDDED_BY] = embedded_by.encode()
            schema = docs_schema(dim).with_metadata(meta)
            self._table = self.db.create_table(self.name, schema=schema)
            return self._table
        self.require_model(model_id, "store", "index into a new table (--table) or delete this one")
        self.require_title_sep(title_sep, "store")
        return self.table

    def drop(self) -> None:
        """Remove the table with every version and tag (the index job's undo of a table it created)."""
        self.db.drop_table(self.name)  # (its directory with it, a data file no version holds included)
        drop_indexes(self)
        self._table = self._lance = self._bm25 = None
        self._vectors = {}

    # -- writes ------------------------------------------------------------------
    def _as_stored(self, docs: pa.Table) -> pa.Table:
        return as_stored(docs, self.table.schema)

    def dataset_uri(self) -> str:
        """Where the table's Lance dataset is (or will be, before it is created): what the index
        job's workers write data files under (pipelines/operations/indexing.py, FragmentSink)."""
        if self.exists():
            return self.table.to_lance().uri
        where = local_path(self.uri)
        return str(where / f"{self.name}.lance") if where is not None else f"{self.uri.rstrip('/')}/{self.name}.lance"

    def commit_fragments(self, fragments: list[str]) -> None:
        """Add the rows of data files written elsewhere (the JSON of each file's fragment, as
        pipelines/operations/indexing.py's FragmentSink returns it) to the table in one commit: one new version, as :meth:`append` makes. Like
        :meth:`append`, for rows whose ids the table does not hold."""
        import lance
        from lance.fragment import FragmentMetadata

        if not fragments:
            return
        ds = self.table.to_lance()
        lance.LanceDataset.commit(ds.uri, lance.LanceOperation.Append([FragmentMetadata.from_json(f) for f in fragments]),
                                  read_version=ds.version)
        self.table.checkout_latest()
        self._lance = None

    def reopen(self) -> None:
        """Follow the table's latest version after another process committed to it (the
        child of :func:`logicrank.pipelines.engines.store.maintain_apart`), forgetting what this
        process held of the version before (the Lance dataset, the engines' operands)."""
        self.table.checkout_latest()
        self._lance = None
        self.release()

    def file_rows(self, path: str) -> pa.Table:
        """The rows of one uncommitted data file (``path`` under the dataset's ``data/``), read
        back as written: for the writer's rare case of a file holding a row it must not add."""
        from lance.file import LanceFileReader

        return LanceFileReader(f"{self.dataset_uri()}/data/{path}").read_all().to_table()

    def upsert(self, docs: pa.Table) -> None:
        """Insert new and replace changed documents, keyed by doc_id (idempotent), in one commit.

        What LanceDB's keyed merge (``merge_insert``) commits, made here: the stored rows of the
        given ids found through the id index (BTREE) and marked deleted in their fragments'
        deletion files, the given rows written as new data files, both committed as one version
        (Lance's Update operation). The keyed merge through the index took ten times as long
        (a 1% re-index at 10M documents, docs/bulk-retrieval.md); through a scan of the stored
        ids its memory grew with the table. Ids repeated in ``docs`` are refused (which row would
        stand is undefined; the index job's writer keeps one per id)."""
        if docs.num_rows == 0:
            return
        import lance
        from lance.fragment import write_fragments

        docs = self._as_stored(docs)
        ids = docs.column("doc_id").combine_chunks()
        if len(pc.unique(ids)) != len(ids):
            raise ValueError("store: doc ids repeated in one upsert (each id may appear once)")
        ds = self.table.to_lance()
        found = ds.scanner(columns=[], filter=pc.field("doc_id").isin(ids), with_row_address=True).to_table()
        addresses = np.sort(found.column("_rowaddr").to_numpy())  # fragment id << 32 | row offset
        fragments, starts = np.unique(addresses >> np.uint64(32), return_index=True)
        removed, updated = [], []
        for fragment, rows in zip(fragments.tolist(), np.split(addresses, starts[1:]) if len(addresses) else [], strict=True):
            kept = ds.get_fragment(fragment).delete_rows((rows & np.uint64(0xFFFFFFFF)).tolist())  # (offsets in the fragment)
            (removed.append(fragment) if kept is None else updated.append(kept))
        new = write_fragments(docs, ds.uri, schema=ds.schema)
        # (a version committed since this read that changed the same fragments makes Lance refuse this commit,
        # CommitConflictError, and nothing is committed: the table's write lock admits one writer, and the files
        # written stay unreferenced until maintenance removes them.
        # The new fragments are not in the id index until maintenance, as after a keyed merge: look-ups scan them)
        lance.LanceDataset.commit(ds.uri, lance.LanceOperation.Update(removed_fragment_ids=removed, updated_fragments=updated,
                                                                      new_fragments=new), read_version=ds.version)
        self.table.checkout_latest()
        self._lance = None

    def append(self, docs: pa.Table) -> None:
        """Add documents whose ids the table does not hold, without the keyed merge's look-up of
        every stored id (the caller knows they are new: the index job's inserts, classified
        against the version its run started from and each kept once per run)."""
        if docs.num_rows:
            self.table.add(self._as_stored(docs))

    def delete_absent(self, keep_ids: pa.Array) -> int:
        """Delete every document whose id is not in ``keep_ids``; returns how many went.

        Makes no commit (no new version) when nothing is absent. (The index job, which must
        not hold every id, finds the absent ids itself and calls :meth:`delete_ids`.)
        """
        keep = pa.array(keep_ids, pa.string())

        def absent():
            for b in self.table.to_lance().to_batches(columns=["doc_id"], batch_size=65536):
                ids = b.column("doc_id")
                yield ids.filter(pc.invert(pc.is_in(ids, value_set=keep)))

        return self.delete_ids(absent())

    def delete_ids(self, batches: Iterable[pa.Array], before_each: Callable[[], None] = lambda: None) -> int:
        """Delete the documents with the given ids, one commit per batch of ids (a filter of
        pyarrow expressions, never a SQL string); returns how many went. No commit for an
        empty batch. ``before_each`` runs before each commit (the job checks its lock).

        A batch at a time so that no process holds every id; a run killed between two
        batches leaves the rest, which its rerun deletes (they are still absent)."""
        gone = 0
        for ids in batches:
            if len(ids) == 0:
                continue
            before_each()
            res = self.table.to_lance().delete(pc.field("doc_id").isin(pa.array(ids, pa.string())))
            gone += int(res["num_deleted_rows"])
            self.table.checkout_latest()
            self._lance = None
        return gone

    def build_indexes(self, ann_threshold: int | None) -> dict[str, str]:
        """Scalar index on doc_id, full-text index on title and text, and the ANN index when
        ``ann_threshold`` is given and the table has at least that many rows."""
        t = self.table
        built = {}
        t.create_scalar_index("doc_id", index_type="BTREE", replace=True)
        built["doc_id"] = "BTREE"
        built.update(self._build_fts())
        if ann_threshold is not None and self.count() >= ann_threshold:
            built["vector"] = self.build_ann()
        return built

    def build_ann(self) -> str:
        """The ANN index over the vectors; returns what it is."""
        # HNSW does the fine search inside each IVF partition, so partitions stay few
        # (about one per million rows). Measured on 100k generated vectors: recall@100
        # 0.995 with one partition, 0.65 with sqrt(n) = 316 at LanceDB's default probes.
        partitions = max(1, self.count() // 1_000_000)
        self.table.create_index(metric="cosine", vector_column_name="vector", index_type="IVF_HNSW_SQ", num_partitions=partitions, replace=True)
        return f"IVF_HNSW_SQ(partitions={partitions})"

    def _build_fts(self) -> dict[str, str]:
        for col in _FTS_COLUMNS:
            self.table.create_fts_index(col, replace=True, with_position=False, **_FTS_ANALYZER)
        return dict.fromkeys(_FTS_COLUMNS, "FTS")

    def _build_one(self, column: str) -> str:
        """Build the index of one column (doc_id, a full-text column or the vectors)."""
        if column == "doc_id":
            self.table.create_scalar_index("doc_id", index_type="BTREE", replace=True)
            return "BTREE"
        if column == "vector":
            return self.build_ann()
        self.table.create_fts_index(column, replace=True, with_position=False, **_FTS_ANALYZER)
        return "FTS"

    def _stale_fts(self) -> set[str]:
        """The full-text columns whose index analyzes text otherwise than this version does."""
        stale = set()
        for idx in self.table.list_indices():
            if idx.index_type == "FTS" and len(idx.columns) == 1:
                details = idx.index_details or {}
                if any(details.get(key) != value for key, value in _FTS_ANALYZER.items()):
                    stale.add(idx.columns[0])
        return stale

    def _deltas(self, name: str) -> int:
        """How many delta indexes index ``name`` has beside its first."""
        return max(0, int(getattr(self.table.index_stats(name), "num_indices", 1) or 1) - 1)

    def _update_index(self, name: str, deltas: bool) -> None:
        """Add the rows an index does not cover to it, in place (no retraining). With
        ``deltas`` (the full-text and ANN indexes) they go to a new delta index, and past
        :data:`MAX_DELTAS` the deltas (never the first index) are merged into one with them;
        the doc_id index merges them into itself."""
        kw = {}
        if deltas:
            have = self._deltas(name)
            kw["num_indices_to_merge"] = have if have >= MAX_DELTAS else 0
        self.table.to_lance().optimize.optimize_indices(index_names=[name], **kw)
        self.table.checkout_latest()

    def maintain(self, ann_threshold: int | None, prune_older_than: timedelta, changed: bool = True, rebuild: bool = False) -> dict:
        """After a successful write: compact small fragments, bring every index up to date so it
        covers every row, and prune versions older than ``prune_older_than`` that no tag names.

        ``ann_threshold``: build the ANN index once the table has this many rows; None: build
        none (an ANN index the table has is still kept up to date). An index that is missing is
        built (that one alone); one that exists is updated in place (the module's docstring
        says what each costs), and never rebuilt because rows changed: the full-text ones are
        rebuilt when made with another analyzer than :data:`ENGLISH_STOP_WORDS`'s, a scalar or
        full-text index still missing rows after its update is rebuilt (seconds), an ANN index
        is not (a search reads the rows it misses without it). ``rebuild``: rebuild every index
        from the rows (the ANN index retrained), what a user asks for after many nights.

        Tagged versions are never pruned, so every earlier index run stays restorable. Data files
        that no version holds are removed (the caller holds the table's write lock). With
        ``changed`` False and every index complete, only the pruning runs (no new version).
        Maintenance changes no document: when the version it starts from is marked complete
        (pipelines/engines/store/versions.py), so is the one it ends at.
        """
        t = self.table
        start, marked = self.version, self.complete_version()
        index_of = {c: idx.name for idx in t.list_indices() for c in idx.columns}
        wanted = {"doc_id", *_FTS_COLUMNS} | ({"vector"} if ann_threshold is not None and self.count() >= ann_threshold else set())
        fts_current = self.fts_current()
        complete = wanted <= index_of.keys() and not any(self.index_coverage().values()) and fts_current
        built: dict[str, str] = {}
        updated: list[str] = []
        seconds: dict[str, float] = {}  # what each part took (compaction, each index built or updated)
        fragments = (0, 0)
        if changed or not complete or rebuild:
            with _timed(seconds, "compaction"):
                compaction = t.to_lance().optimize.compact_files(target_rows_per_fragment=COMPACT_TARGET_ROWS)
            fragments = (int(compaction.fragments_removed), int(compaction.fragments_added))
            t.checkout_latest()
            if rebuild:
                with _timed(seconds, "rebuild"):
                    built = self.build_indexes(ann_threshold)
                    if "vector" in index_of and "vector" not in built:  # an ANN index the table has: retrained too
                        built["vector"] = self.build_ann()
            else:
                stale = set() if fts_current else self._stale_fts()  # indexed by an older analyzer: re-analyze the text
                for column in sorted((wanted - index_of.keys()) | stale):
                    with _timed(seconds, column):
                        built[column] = self._build_one(column)
                    t.checkout_latest()
                coverage = self.index_coverage()
                for column, name in sorted(index_of.items()):
                    if column not in built and coverage.get(name):
                        with _timed(seconds, column):
                            self._update_index(name, deltas=column != "doc_id")
                        updated.append(column)
                coverage = self.index_coverage()
                for column, name in sorted(index_of.items()):
                    if column not in built and column != "vector" and coverage.get(name):
                        with _timed(seconds, column):
                            built[column] = self._build_one(column)
            t.checkout_latest()
        if marked == start and self.version != start:
            self.mark_complete()
        # delete_unverified: also the data files no version holds, however new (Lance keeps them 7 days by default, as
        # another writer's commit may be under way): the index job holds the table's lock, so any such file is one of
        # its workers' that was never committed (a batch delivered twice, a run killed before its commit)
        cleanup = t.to_lance().cleanup_old_versions(older_than=prune_older_than, error_if_tagged_old_versions=False, delete_unverified=True)
        t.checkout_latest()
        prune_indexes(self, [v["version"] for v in t.list_versions()])
        deltas = {c: self._deltas(idx.name) for idx in t.list_indices() for c in idx.columns if c != "doc_id"}
        return {
            "fragments_removed": fragments[0],
            "fragments_added": fragments[1],
            "indexes_rebuilt": sorted(built),
            "indexes_updated": sorted(set(updated) - built.keys()),
            "deltas": deltas,  # the full-text and ANN indexes' delta indexes beside their first
            "unindexed_rows": self.index_coverage(),
            "seconds": seconds,
            "versions_pruned": int(cleanup.old_versions),
            "bytes_pruned": int(cleanup.bytes_removed),
            "versions_left": len(t.list_versions()),
        }
