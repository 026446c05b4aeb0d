"""The index writer's routing of rows, with a recording store in place of LanceDB."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.corpus import PARSED
from pipelines.indexing import IndexWriter, RejectSink


class _RecordingStore:
    def __init__(self):
        self.written: list[str] = []

    def open_or_create(self, dim, model_id, title_sep=" "):
        pass

    def upsert(self, docs: pa.Table) -> None:
        self.written += docs.column("doc_id").to_pylist()


def _batch(rows: list[tuple[str | None, str, int, str | None]]) -> pa.Table:
    """(doc_id, source, location, reject reason) -> an embedded batch as the actors send it."""
    n = len(rows)
    t = pa.Table.from_pydict(
        {
            "doc_id": [r[0] for r in rows], "title": [None] * n, "text": [None if r[3] else "x" for r in rows],
            "metadata": [None] * n, "content_hash": [None if r[3] else "h" for r in rows], "_source": [r[1] for r in rows],
            "_location": [r[2] for r in rows], "_reason": [r[3] for r in rows], "_detail": [None] * n,
        },
        schema=PARSED,
    )
    actions = pa.array(["reject" if r[3] else "insert" for r in rows])
    counts = np.array([0 if r[3] else 4 for r in rows], dtype=np.int32)
    vectors = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)), pa.array(np.ones(counts.sum(), np.float32)))
    return t.append_column("_action", actions).append_column("vector", vectors)


def test_a_redelivered_row_is_written_once_and_a_repeated_id_is_a_reject(tmp_path):
    store, sink = _RecordingStore(), RejectSink(tmp_path / "rejects.parquet")
    writer = IndexWriter(store, "m", sink, chunk_rows=2)
    first = _batch([("a", "f.jsonl", 1, None), ("b", "f.jsonl", 2, None), (None, "f.jsonl", 3, "malformed_json")])
    writer.consume(first)
    writer.consume(first)  # Ray re-ran the task that produced this batch after losing a worker
    second = _batch([("a", "f.jsonl", 9, None), ("c", "f.jsonl", 10, None)])  # line 9 reuses id "a"
    writer.consume(second)
    writer.consume(second)  # redelivered too: its duplicate is not rejected twice
    writer.flush()
    sink.close()
    assert store.written == ["a", "b", "c"]
    assert writer.redelivered == 5
    assert writer.counts == {"insert": 3, "reject": 2}
    rejects = pq.read_table(tmp_path / "rejects.parquet").to_pylist()
    assert [(r["location"], r["reason"]) for r in rejects] == [(3, "malformed_json"), (9, "duplicate_id")]


def test_a_batch_of_only_rejects_writes_them_and_nothing_else(tmp_path):
    # before: an all-rejected batch crashed in Arrow's array_take (an empty, untyped index list)
    store, sink = _RecordingStore(), RejectSink(tmp_path / "rejects.parquet")
    writer = IndexWriter(store, "m", sink)
    writer.consume(_batch([(None, "f.jsonl", 1, "malformed_json"), ("x", "f.jsonl", 2, "empty_text")]))
    writer.flush()
    sink.close()
    assert store.written == [] and writer.counts == {"reject": 2}
    assert pq.read_table(tmp_path / "rejects.parquet").num_rows == 2
