"""Incremental indexing: classify rows by content hash, embed what changed, write once.

The stages, in order, each over PARSED tables (see :mod:`pipelines.corpus`):

1. :class:`EmbedStage` marks each row ``reject`` / ``unchanged`` / ``update`` / ``insert``
   against the stored hashes and embeds only inserts and updates (a Ray actor in the job).
2. :class:`IndexWriter` (the one writer) keeps the first row of each id, sends later
   duplicates and rejects to the rejects sink, and upserts the rest in chunks.

After the stream, the job deletes stored ids the snapshot did not contain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.corpus import UNREADABLE, SourceError
from pipelines.embed import Embedder, document_text
from schemas.config import EmbedConfig
from schemas.tables import CORPUS, REJECTS

if TYPE_CHECKING:  # the embedding actor imports this module: keep lancedb out of it
    from pipelines.store import DocStore

def classify(batch: pa.Table, stored: dict[str, str]) -> pa.Array:
    """The action for each row of a PARSED batch, given stored ``doc_id -> content_hash``."""
    out = []
    for doc_id, h, reason in zip(
        batch.column("doc_id").to_pylist(),
        batch.column("content_hash").to_pylist(),
        batch.column("_reason").to_pylist(),
        strict=True,
    ):
        if reason is not None:
            out.append("reject")
        else:
            old = stored.get(doc_id)
            out.append("insert" if old is None else ("unchanged" if old == h else "update"))
    return pa.array(out, pa.string())


class EmbedStage:
    """Classify a PARSED batch and embed its inserts and updates.

    Adds ``_action`` and ``vector`` (zeros where nothing was embedded). Texts of unchanged
    rows are dropped from the output: only their ids travel on.
    """

    def __init__(self, config: EmbedConfig, stored: pa.Table, embedder_factory: Callable[[EmbedConfig], Embedder] = Embedder):
        self.config, self._factory, self._embedder = config, embedder_factory, None
        self.stored = dict(zip(stored.column("doc_id").to_pylist(), stored.column("content_hash").to_pylist(), strict=True))

    @property
    def embedder(self) -> Embedder:
        """Loaded on first use: a re-index with nothing to embed never loads the model."""
        if self._embedder is None:
            self._embedder = self._factory(self.config)
        return self._embedder

    def __call__(self, batch: pa.Table) -> pa.Table:
        actions = classify(batch, self.stored)
        todo = pc.is_in(actions, pa.array(["insert", "update"])).to_numpy(zero_copy_only=False)
        # In transit a vector is a variable-size list (empty where nothing was embedded);
        # the writer turns it into the table's fixed-size column.
        counts = np.zeros(batch.num_rows, dtype=np.int32)
        values = np.zeros(0, dtype=np.float32)
        if todo.any():
            idx = np.flatnonzero(todo)
            titles = batch.column("title").take(idx).to_pylist()
            texts = batch.column("text").take(idx).to_pylist()
            vecs = self.embedder.encode([document_text(t, x, self.embedder.config.title_sep) for t, x in zip(titles, texts, strict=True)])
            counts[idx] = vecs.shape[1]
            values = vecs.reshape(-1)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        vectors = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.float32()))
        unchanged = pc.equal(actions, "unchanged")
        for name in ("title", "text", "metadata"):
            col = batch.column(name)
            batch = batch.set_column(batch.schema.get_field_index(name), name, pc.if_else(unchanged, pa.scalar(None, col.type), col))
        return batch.append_column("_action", actions).append_column("vector", vectors)


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


class IndexWriter:
    """The single writer: dedups ids, routes rejects, upserts in chunks of ``chunk_rows``.

    ``seen`` maps each id kept to the key of the source row it came from. A row delivered
    twice (a task Ray re-ran after losing a worker) has the same key and is dropped quietly
    (counted as ``redelivered``); a second row with the same id elsewhere in the snapshot is
    a ``duplicate_id`` reject.
    """

    def __init__(
        self, store: DocStore, model_id: str, rejects: RejectSink, chunk_rows: int = 4096, before_commit: Callable[[], None] = lambda: None,
        title_sep: str = " ",
    ):
        """``before_commit`` runs before every write (the job checks it still holds the table's lock)."""
        self.store, self.model_id, self.rejects, self.chunk_rows, self.title_sep = store, model_id, rejects, chunk_rows, title_sep
        self.before_commit = before_commit
        self.seen: dict[str, int] = {}
        self.counts: Counter[str] = Counter()
        self.redelivered = 0
        self.written = 0  # rows committed to the table so far (inserts and updates)
        self._rejected_at: set[int] = set()
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    @property
    def rows_read(self) -> int:
        return sum(self.counts.values())

    def consume(self, batch: pa.Table) -> None:
        """Take one embedded batch. Raises :class:`~pipelines.corpus.SourceError` on the row a
        reader sends in place of a file it could not read to its end."""
        faults = pc.equal(batch.column("_reason"), UNREADABLE)
        if pc.any(faults).as_py():
            raise SourceError(batch.filter(faults).column("_detail")[0].as_py())
        actions = batch.column("_action").to_pylist()
        ids = batch.column("doc_id").to_pylist()
        keys = [hash(k) for k in zip(batch.column("_source").to_pylist(), batch.column("_location").to_pylist(), strict=True)]
        keep, dup, bad = [], [], []
        for i, (doc_id, action, key) in enumerate(zip(ids, actions, keys, strict=True)):
            if self.seen.get(doc_id) == key or key in self._rejected_at:
                self.redelivered += 1  # this very source row was delivered before
            elif action == "reject":
                self._rejected_at.add(key)
                bad.append(i)
            elif doc_id in self.seen:
                self._rejected_at.add(key)
                dup.append(i)
            else:
                self.seen[doc_id] = key
                keep.append(i)
        self._reject(batch, bad, dup)
        kept = batch.take(pa.array(keep, pa.int64()))
        kept_actions = kept.column("_action").to_pylist()
        self.counts.update(kept_actions)
        write = [i for i, a in enumerate(kept_actions) if a in ("insert", "update")]
        if write:
            self._pending.append(kept.take(pa.array(write, pa.int64())))
            self._pending_rows += len(write)
        if self._pending_rows >= self.chunk_rows:
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
        """Upsert everything pending, ``chunk_rows`` rows per commit."""
        if not self._pending:
            return
        pending = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        for start in range(0, pending.num_rows, self.chunk_rows):
            self._write(pending.slice(start, self.chunk_rows))

    def _write(self, chunk: pa.Table) -> None:
        lists = chunk.column("vector").combine_chunks()
        dim = len(lists[0])
        if (pc.list_value_length(lists).to_numpy() != dim).any():
            raise ValueError("index: the embedder returned vectors of different sizes in one run")
        fixed = pa.FixedSizeListArray.from_arrays(lists.flatten(), dim)
        chunk = chunk.set_column(chunk.schema.get_field_index("vector"), "vector", fixed)
        self.before_commit()
        self.store.open_or_create(dim, self.model_id, self.title_sep)
        self.store.upsert(chunk.select(CORPUS.names + ["content_hash", "vector"]))
        self.written += chunk.num_rows
