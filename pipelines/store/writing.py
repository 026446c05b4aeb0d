"""Writing the table: create, upsert by content hash, delete what a snapshot lacks, build and
maintain its indexes. One writer per table (the index job's lease, pipelines/writelock.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.sparse import drop_indexes, prune_indexes
from pipelines.store.base import _FTS_ANALYZER, _FTS_COLUMNS, _META_MODEL, _META_TITLE_SEP
from schemas.tables import docs_schema


class Writing:
    """The write side of :class:`pipelines.store.DocStore`."""

    def open_or_create(self, dim: int, model_id: str, title_sep: str = " "):
        """Open the table, checking it was embedded with ``model_id`` and ``title_sep``; create it when absent."""
        if not self.exists():
            schema = docs_schema(dim).with_metadata({_META_MODEL: model_id.encode(), _META_TITLE_SEP: title_sep.encode()})
            self._table = self.db.create_table(self.name, schema=schema)
            return self._table
        self.require_model(model_id, "store", "index into a new table (--table) or delete this one")
        self.require_title_sep(title_sep, "store")
        return self.table

    def drop(self) -> None:
        """Remove the table with every version and tag (the index job's undo of a table it created)."""
        self.db.drop_table(self.name)
        drop_indexes(self)
        self._table = self._lance = self._bm25 = self._matrix = None

    # -- writes ------------------------------------------------------------------
    def upsert(self, docs: pa.Table) -> None:
        """Insert new and replace changed documents, keyed by doc_id (idempotent)."""
        if docs.num_rows == 0:
            return
        n = docs.num_rows
        if "indexed_at" not in docs.column_names:
            now = pa.array(np.full(n, np.datetime64(datetime.now(UTC).replace(tzinfo=None), "us")), pa.timestamp("us", tz="UTC"))
            docs = docs.append_column("indexed_at", now)
        docs = docs.select(self.table.schema.names).cast(self.table.schema)
        (
            self.table.merge_insert("doc_id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(docs)
        )

    def delete_absent(self, keep_ids: pa.Array) -> int:
        """Delete every document whose id is not in ``keep_ids``; returns how many went.

        Makes no commit (no new version) when nothing is absent.
        """
        stored = self.hashes().column("doc_id")
        if pc.all(pc.is_in(stored, value_set=pa.array(keep_ids, pa.string()))).as_py() in (True, None):
            return 0
        before = self.count()
        keep = pa.table({"doc_id": pa.array(keep_ids, pa.string())})
        (
            self.table.merge_insert("doc_id")
            .when_not_matched_by_source_delete()
            .execute(keep)
        )
        return before - self.count()

    def build_indexes(self, ann_threshold: int) -> dict[str, str]:
        """Scalar index on doc_id, full-text index on title and text, ANN index when large."""
        t = self.table
        built = {}
        t.create_scalar_index("doc_id", index_type="BTREE", replace=True)
        built["doc_id"] = "BTREE"
        built.update(self._build_fts())
        if self.count() >= ann_threshold:
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

    def maintain(self, ann_threshold: int, prune_older_than: timedelta, changed: bool = True) -> dict:
        """After a successful write: compact small fragments, bring every index up to date so it
        covers every row, and prune versions older than ``prune_older_than`` that no tag names.

        Indexes are built when missing (or when the table crossed ``ann_threshold``) and
        otherwise updated incrementally; an index still missing rows afterwards is rebuilt, and
        so is a full-text index made with another analyzer than :data:`ENGLISH_STOP_WORDS`'s.
        Tagged versions are never pruned, so every earlier index run stays restorable. With
        ``changed`` False and every index complete, only the pruning runs (no new version).
        Maintenance changes no document: when the version it starts from is marked complete
        (pipelines/store/versions.py), so is the one it ends at.
        """
        t = self.table
        start, marked = self.version, self.complete_version()
        names = {c for idx in t.list_indices() for c in idx.columns}
        wanted = {"doc_id", *_FTS_COLUMNS} | ({"vector"} if self.count() >= ann_threshold else set())
        fts_current = self.fts_current()
        complete = wanted <= names and not any(self.index_coverage().values()) and fts_current
        built: dict[str, str] = {}
        fragments = (0, 0)
        if changed or not complete:
            compaction = t.to_lance().optimize.compact_files()
            fragments = (int(compaction.fragments_removed), int(compaction.fragments_added))
            t.checkout_latest()
            built = self.build_indexes(ann_threshold) if not wanted <= names else {}
            if not built:
                if not fts_current:  # indexed by an older analyzer: re-analyze the text
                    built = self._build_fts()
                    t.checkout_latest()
                t.to_lance().optimize.optimize_indices()
                t.checkout_latest()
                if any(self.index_coverage().values()):
                    built = self.build_indexes(ann_threshold)
        if marked == start and self.version != start:
            self.mark_complete()
        cleanup = t.to_lance().cleanup_old_versions(older_than=prune_older_than, error_if_tagged_old_versions=False)
        t.checkout_latest()
        prune_indexes(self, [v["version"] for v in t.list_versions()])
        return {
            "fragments_removed": fragments[0],
            "fragments_added": fragments[1],
            "indexes_rebuilt": sorted(built),
            "unindexed_rows": self.index_coverage(),
            "versions_pruned": int(cleanup.old_versions),
            "bytes_pruned": int(cleanup.bytes_removed),
            "versions_left": len(t.list_versions()),
        }
