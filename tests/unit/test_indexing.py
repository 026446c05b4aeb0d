"""The index writer's routing of rows, with a recording store in place of LanceDB."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.corpus import PARSED
from logicrank.pipelines.operations.indexing import IndexWriter, RejectSink


class _RecordingStore:
    def __init__(self):
        self.written: list[str] = []  # in the order written
        self.appended: list[str] = []
        self.merged: list[str] = []
        self.merges: list[list[str]] = []  # each keyed merge's ids

    def open_or_create(self, dim, model_id, title_sep=" ", embedded_by=None):
        pass

    def exists(self) -> bool:
        return True

    def upsert(self, docs: pa.Table) -> None:
        self.merges.append(docs.column("doc_id").to_pylist())
        self.merged += docs.column("doc_id").to_pylist()
        self.written += docs.column("doc_id").to_pylist()

    def append(self, docs: pa.Table) -> None:
        self.appended += docs.column("doc_id").to_pylist()
        self.written += docs.column("doc_id").to_pylist()


def _batch(rows: list[tuple[str | None, str, int, str | None]]) -> pa.Table:
    """(doc_id, source, record, reject reason) -> an embedded batch as the actors send it (the
    record's line, its location, the same number)."""
    n = len(rows)
    t = pa.Table.from_pydict(
        {
            "doc_id": [r[0] for r in rows], "title": [None] * n, "text": [None if r[3] else "x" for r in rows],
            "metadata": [None] * n, "content_hash": [None if r[3] else "h" for r in rows], "_source": [r[1] for r in rows],
            "_location": [r[2] for r in rows], "_record": [r[2] for r in rows], "_reason": [r[3] for r in rows], "_detail": [None] * n,
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


def test_the_rows_of_one_trec_line_are_told_apart_by_their_record(tmp_path):
    """Several TREC DOCs on one line share their location (the line of their <DOC>): a reject
    there, stray text or a repeated id never makes another row of the line look like a
    redelivery; the rows are known by their record, and a batch delivered twice still is."""
    store, sink = _RecordingStore(), RejectSink(tmp_path / "rejects.parquet")
    writer = IndexWriter(store, "m", sink, chunk_rows=2)
    rows = [("x1", "c.trec", 7, "empty_text"), ("x2", "c.trec", 7, None), (None, "c.trec", 8, "outside_doc"), ("x3", "c.trec", 8, None),
            ("x2", "c.trec", 8, None)]
    batch = _batch(rows)
    batch = batch.set_column(batch.schema.get_field_index("_record"), "_record", pa.array(range(len(rows)), pa.int64()))
    writer.consume(batch)
    writer.consume(batch)  # Ray re-ran the task
    writer.flush()
    sink.close()
    assert store.written == ["x2", "x3"]
    assert writer.redelivered == 5 and writer.counts == {"insert": 2, "reject": 3}
    rejects = pq.read_table(tmp_path / "rejects.parquet").to_pylist()
    assert [(r["location"], r["doc_id"], r["reason"]) for r in rejects] == [(7, "x1", "empty_text"), (8, None, "outside_doc"),
                                                                            (8, "x2", "duplicate_id")]


def test_a_stored_document_whose_only_row_was_rejected_is_not_absent(tmp_path):
    """The snapshot holds the document, in a form that cannot be read (its text empty, too
    long, ...): its stored version stays, counted as held; an id a valid row also names is
    simply kept, and a row with no readable id holds nothing back."""
    store, sink = _RecordingStore(), RejectSink(tmp_path / "rejects.parquet")
    writer = IndexWriter(store, "m", sink, chunk_rows=2)
    writer.consume(_batch([("a", "f.jsonl", 1, None), ("b", "f.jsonl", 2, "empty_text"), ("c", "f.jsonl", 3, "oversized"),
                           ("c", "f.jsonl", 4, None), (None, "f.jsonl", 5, "malformed_json"), ("n", "f.jsonl", 6, "empty_text"),
                           ("f ", "f.jsonl", 7, "bad_id")]))
    writer.flush()
    sink.close()
    stored = [pa.array(["a", "b", "c", "d"]), pa.array(["e", "f"])]
    assert [d for ids in writer.seen.absent(stored) for d in ids.to_pylist()] == ["d", "e"]
    # b ("n" was never stored), and f: its row's id gained a space (refused as bad_id, not stripped), which named only
    # "f " and so deleted the stored "f"
    assert writer.seen.held == 2


def test_inserts_are_appended_and_updates_merged_by_id(tmp_path):
    """A new id (absent from the version the run started from, kept once per run) is appended;
    a changed one replaces its stored row by the keyed merge."""
    store, sink = _RecordingStore(), RejectSink(tmp_path / "rejects.parquet")
    writer = IndexWriter(store, "m", sink, chunk_rows=3)
    batch = _batch([("a", "f.jsonl", 1, None), ("b", "f.jsonl", 2, None), ("c", "f.jsonl", 3, None), ("d", "f.jsonl", 4, None)])
    batch = batch.set_column(batch.schema.get_field_index("_action"), "_action", pa.array(["insert", "update", "insert", "update"]))
    writer.consume(batch)
    writer.flush()
    sink.close()
    assert (store.appended, store.merged) == (["a", "c"], ["b", "d"])
    assert (writer.counts["insert"], writer.counts["update"], writer.written) == (2, 2, 4)


def _actions(batch: pa.Table, actions: list[str]) -> pa.Table:
    return batch.set_column(batch.schema.get_field_index("_action"), "_action", pa.array(actions))


def test_updates_wait_for_merge_rows_or_merge_seconds_while_inserts_are_appended_each_chunk(tmp_path):
    """Updates wait for fewer, larger keyed merges: one of ``merge_rows``, or of ``merge_bytes``,
    or of what waited ``merge_seconds`` since the oldest came (the writer's clock, here a fake
    one), or at flush. Inserts are appended every ``chunk_rows`` meanwhile."""
    now = [0.0]
    store, sink = _RecordingStore(), RejectSink(tmp_path / "rejects.parquet")
    writer = IndexWriter(store, "m", sink, chunk_rows=1, merge_rows=3, merge_seconds=10.0, clock=lambda: now[0])

    lines = itertools.count(1)

    def rows(*ids_actions: tuple[str, str]) -> pa.Table:
        batch = _batch([(i, "f.jsonl", next(lines), None) for i, _ in ids_actions])
        return _actions(batch, [a for _, a in ids_actions])

    writer.consume(rows(("a", "insert"), ("u1", "update"), ("u2", "update")))
    assert (store.appended, store.merges, writer.written) == (["a"], [], 1)
    writer.consume(rows(("u3", "update"), ("u4", "update")))  # 4 waiting >= merge_rows: one merge of 3, then 1
    assert store.merges == [["u1", "u2", "u3"], ["u4"]] and writer.written == 5
    now[0] = 100.0
    writer.consume(rows(("u5", "update")))  # the oldest waiting came now
    now[0] = 105.0
    writer.consume(rows(("u6", "update")))  # (the wait is the oldest's)
    now[0] = 109.9
    writer.consume(rows(("b", "insert")))
    assert store.merges[2:] == [] and store.appended == ["a", "b"]
    now[0] = 110.0
    writer.consume(rows(("c", "unchanged")))  # u5 waited merge_seconds
    assert store.merges[2:] == [["u5", "u6"]]
    writer.consume(rows(("u7", "update")))
    writer.flush()  # at the end, or when the job is interrupted
    assert store.merges[3:] == [["u7"]] and store.merged == ["u1", "u2", "u3", "u4", "u5", "u6", "u7"]
    assert (writer.counts["insert"], writer.counts["update"], writer.counts["unchanged"], writer.written, writer.merges) == (2, 7, 1, 9, 4)
    writer.merge_bytes = 1  # bytes waiting count too: the next update is merged at once
    writer.consume(rows(("u8", "update")))
    sink.close()
    assert store.merges[4:] == [["u8"]]


def test_a_batch_of_only_rejects_writes_them_and_nothing_else(tmp_path):
    # before: an all-rejected batch crashed in Arrow's array_take (an empty, untyped index list)
    store, sink = _RecordingStore(), RejectSink(tmp_path / "rejects.parquet")
    writer = IndexWriter(store, "m", sink)
    writer.consume(_batch([(None, "f.jsonl", 1, "malformed_json"), ("x", "f.jsonl", 2, "empty_text")]))
    writer.flush()
    sink.close()
    assert store.written == [] and writer.counts == {"reject": 2}
    assert pq.read_table(tmp_path / "rejects.parquet").num_rows == 2


def _parsed(ids: list[str | None], hashes: list[str | None], reasons: list[str | None] | None = None) -> pa.Table:
    n = len(ids)
    reasons = reasons or [None] * n
    return pa.Table.from_pydict(
        {"doc_id": ids, "title": [None] * n, "text": ["x"] * n, "metadata": [None] * n, "content_hash": hashes,
         "_source": ["f.jsonl"] * n, "_location": list(range(n)), "_record": list(range(n)), "_reason": reasons, "_detail": [None] * n},
        schema=PARSED,
    )


def test_classify_marks_each_row_against_the_stored_hashes_it_is_given():
    from logicrank.pipelines.operations.indexing import classify

    batch = _parsed(["new", "same", "edited", None, "same"], ["h1", "h2", "h3", None, "h2"], [None, None, None, "missing_id", None])
    stored = pa.table({"doc_id": ["edited", "same", "elsewhere"], "content_hash": ["old", "h2", "h9"]})
    assert classify(batch, stored).to_pylist() == ["insert", "unchanged", "update", "reject", "unchanged"]
    empty = pa.table({"doc_id": pa.array([], pa.string()), "content_hash": pa.array([], pa.string())})
    assert classify(batch, empty).to_pylist() == ["insert", "insert", "insert", "reject", "insert"]


class _ZeroEmbedder:
    class config:  # noqa: N801 - what EmbedStage reads of an embedder
        title_sep = " "

    def encode(self, texts):
        return np.zeros((len(texts), 4), np.float32)


def test_the_embed_stage_asks_for_the_stored_hashes_of_each_batch_and_no_more():
    """Bounded memory: the classifier never holds more than one batch's stored hashes (before:
    every stored id and hash of the table, in a dict, in the driver and in each actor)."""
    from logicrank.pipelines.config.settings import EmbedConfig
    from logicrank.pipelines.operations.indexing import EmbedStage

    table = {f"d{i}": f"h{i}" for i in range(100)}
    asked: list[list[str]] = []

    def lookup(ids):
        asked.append(ids.to_pylist())
        got = [d for d in ids.to_pylist() if d in table]
        return pa.table({"doc_id": got, "content_hash": [table[d] for d in got]})

    stage = EmbedStage(EmbedConfig(), lookup, lambda c: _ZeroEmbedder())
    batches = [_parsed([f"d{i}" for i in range(s, s + 10)], [f"h{i}" if i % 3 else "new" for i in range(s, s + 10)]) for s in (0, 50, 95)]
    out = [stage(b) for b in batches]
    assert asked == [b.column("doc_id").to_pylist() for b in batches]
    assert [o.column("_action").to_pylist().count("update") for o in out] == [4, 3, 2]
    assert out[2].column("_action").to_pylist()[5:] == ["insert"] * 5  # d100..d104: not stored
    assert [len(v) for v in out[0].column("vector").to_pylist()] == [0 if i % 3 else 4 for i in range(10)]


def _unique_batches(n: int, rows: int = 256):
    for s in range(0, n * rows, rows):
        b = _parsed([f"doc-{i:08d}" for i in range(s, s + rows)], ["h"] * rows)
        yield b.append_column("_action", pa.array(["unchanged"] * rows)).append_column(
            "vector", pa.ListArray.from_arrays(pa.array(np.zeros(rows + 1, np.int32)), pa.array([], pa.float32())))


def test_the_writer_keeps_the_ids_it_read_on_disk_so_its_memory_does_not_grow_with_them(tmp_path):
    """The Python memory the writer holds at its peak is the same for 2,560 ids and for
    25,600 (before, every id read stayed in a dict: ten times the ids, several times the peak)."""
    import gc
    import tracemalloc

    from logicrank.pipelines.operations.indexing import SeenIds

    def peak(batches: int) -> int:
        sink = RejectSink(tmp_path / f"rejects-{batches}.parquet")
        writer = IndexWriter(_RecordingStore(), "m", sink, seen_dir=tmp_path / f"seen-{batches}")
        inputs = list(_unique_batches(batches))
        gc.collect()
        tracemalloc.start()
        for b in inputs:
            writer.consume(b)
        size = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(writer.seen) == batches * 256 and (tmp_path / f"seen-{batches}" / SeenIds.FILE).is_file()
        writer.close()
        sink.close()
        assert not (tmp_path / f"seen-{batches}" / SeenIds.FILE).exists()
        return size

    small, large = peak(10), peak(100)
    assert large < 1.5 * small + (256 << 10), (small, large)


def test_absent_ids_come_from_an_anti_join_in_batches(tmp_path):
    from logicrank.pipelines.operations.indexing import IdSpill, SeenIds

    seen = SeenIds(tmp_path)
    seen.add({"a": 1, "c": 3}, rejected=[7])
    seen.add({"e": 5}, rejected=[])
    assert len(seen) == 3 and seen.keys_of(["a", "b", "e", None]) == {"a": 1, "e": 5} and seen.rejected_among([1, 7]) == {7}
    stored = [pa.array(["a", "b"]), pa.array(["c", "e"]), pa.array(["f", "g", "a"]), pa.array([], pa.string())]
    assert [x.to_pylist() for x in seen.absent(iter(stored))] == [["b"], ["f", "g"]]  # one answer per batch with any
    spill = IdSpill(tmp_path / "absent.parquet")
    assert spill.write(seen.absent(iter(stored))) == 3
    assert [x.to_pylist() for x in spill.read(batch_rows=2)] == [["b", "f"], ["g"]]
    spill.remove()
    seen.close()
    assert list(tmp_path.iterdir()) == []


class _TextEmbedder:
    """A vector from each text's characters: the same text, the same vector, on any path."""

    class config:  # noqa: N801 - what EmbedStage reads of an embedder
        title_sep = " "

    def encode(self, texts):
        return np.array([[len(t), ord(t[0]), ord(t[-1]), 1.0] for t in texts], np.float32)


def _write_through(tmp_path, name: str, batches: list[pa.Table], workers: bool, stored_ids: dict[str, str] | None = None):
    """The stream's two ends in one process: EmbedStage (the workers' side; with ``workers``, a
    FragmentSink), then IndexWriter on a real table. Returns the store, the writer and what the
    writer received."""
    from logicrank.pipelines.config.settings import EmbedConfig
    from logicrank.pipelines.engines.store import DocStore
    from logicrank.pipelines.operations.indexing import EmbedStage, FragmentSink, StoredHashes

    store = DocStore(str(tmp_path / name), "docs")
    writer = IndexWriter(store, "m", RejectSink(tmp_path / f"{name}-rejects.parquet"), chunk_rows=4, seen_dir=tmp_path / f"{name}-seen")
    if stored_ids:
        writer.consume(EmbedStage(EmbedConfig(), StoredHashes(str(tmp_path / name), "docs", None), lambda c: _TextEmbedder())(
            _parsed(list(stored_ids), ["old"] * len(stored_ids)).set_column(2, "text", pa.array(list(stored_ids.values())))))
        writer.flush()
        writer.close()
        writer.rejects.close()
        writer = IndexWriter(store, "m", RejectSink(tmp_path / f"{name}-rejects2.parquet"), chunk_rows=4, seen_dir=tmp_path / f"{name}-seen2")
    sink = FragmentSink(store.dataset_uri(), store.table.schema if store.exists() else None) if workers else None
    stage = EmbedStage(EmbedConfig(), StoredHashes(str(tmp_path / name), "docs", store.version if store.exists() else None),
                       lambda c: _TextEmbedder(), sink=sink)
    received = []
    for b in batches:
        received.append(stage(b))
        writer.consume(received[-1])
    writer.finish()
    writer.close()
    writer.rejects.close()
    return store, writer, received


def _rows(store) -> dict[str, tuple]:
    t = store.table.to_arrow()
    return {d: (x, tuple(v)) for d, x, v in zip(*(t.column(c).to_pylist() for c in ("doc_id", "text", "vector")), strict=True)}


def _texts(ids: list[str], texts: list[str], start: int) -> pa.Table:
    b = _parsed(ids, [f"h-{t}" for t in texts])
    rows = pa.array(range(start, start + len(ids)), pa.int64())
    return b.set_column(2, "text", pa.array(texts)).set_column(6, "_location", rows).set_column(7, "_record", rows)


def test_workers_write_new_rows_the_driver_commits_them_and_the_table_equals_the_drivers_own_writes(tmp_path):
    """New documents are written by the embedding side (one data file per batch) and reach the
    writer as ids alone; the writer commits a file whole, drops the file of a batch delivered
    twice, and reads back the one file holding a repeated id to append its other rows. Updates
    still come with their text and vector and are merged by id. The table equals the one the
    writer makes when it writes every row itself."""
    stored = {"s1": "stored one", "s2": "stored two"}
    first = _texts(["a", "b", "c"], ["alpha", "beta", "gamma"], 0)
    again = first  # Ray re-ran the task of this batch after losing a worker
    mixed = _texts(["c", "d", "s1"], ["gamma again", "delta", "stored one, edited"], 3)  # c repeats an id: a reject
    batches = [first, again, mixed]
    ws, w, received = _write_through(tmp_path, "workers", batches, workers=True, stored_ids=stored)
    ds, d, _ = _write_through(tmp_path, "driver", batches, workers=False, stored_ids=stored)
    assert _rows(ws) == _rows(ds)
    assert sorted(_rows(ws)) == ["a", "b", "c", "d", "s1", "s2"] and _rows(ws)["c"][0] == "gamma" and _rows(ws)["s1"][0] == "stored one, edited"
    assert ws.table.count_rows() == ds.table.count_rows() == 6  # each document once
    assert (w.files_committed, w.files_salvaged, w.files_dropped, w.redelivered) == (1, 1, 1, 3)
    assert w.counts == d.counts == {"insert": 4, "update": 1, "reject": 1} and w.written == d.written == 5
    # what came back from the workers: the inserts' ids, no text, no vector; the update with both
    assert received[0].column("text").to_pylist() == [None] * 3 and [len(v) for v in received[0].column("vector").to_pylist()] == [0] * 3
    assert received[0].column("text").nbytes < 24  # offsets and validity: the texts' bytes stay behind too
    assert received[2].column("text").to_pylist() == [None, None, "stored one, edited"]
    assert [json.loads(f)["fragment"]["physical_rows"] for f in received[0].column("_fragment").to_pylist() if f] == [3]


def test_a_first_build_sends_its_first_rows_to_the_driver_which_creates_the_table_then_the_workers_write(tmp_path):
    """No data file goes into a table that does not exist yet: the first batch travels with its
    text and vectors, the driver creates the table with it at once, and the batches after are
    written by the embedding side."""
    batches = [_texts([f"d{i}", f"e{i}", f"f{i}"], [f"text {i} one", f"text {i} two", f"text {i} three"], 3 * i) for i in range(4)]
    ws, w, received = _write_through(tmp_path, "workers", batches, workers=True)
    ds, _, _ = _write_through(tmp_path, "driver", batches, workers=False)
    assert [r.column("_written").to_pylist() for r in received] == [[False] * 3, [True] * 3, [True] * 3, [True] * 3]
    assert _rows(ws) == _rows(ds) and ws.table.count_rows() == 12 and w.files_committed == 3


def test_a_file_whose_rows_arrive_in_pieces_or_only_in_part_is_committed_once_with_every_row(tmp_path):
    """Ray Data may cut a worker's batch into blocks on the way: the file is settled when its
    last row arrives. A worker lost after part of its batch arrived: the task runs again and
    writes a second file of the same rows; the rows already come are kept from the first
    file, the others from the second, each once."""
    from logicrank.pipelines.config.settings import EmbedConfig
    from logicrank.pipelines.engines.store import DocStore
    from logicrank.pipelines.operations.indexing import EmbedStage, FragmentSink, StoredHashes

    store = DocStore(str(tmp_path / "db"), "docs")
    writer = IndexWriter(store, "m", RejectSink(tmp_path / "rejects.parquet"), chunk_rows=100, seen_dir=tmp_path / "seen")
    writer.consume(EmbedStage(EmbedConfig(), StoredHashes(str(tmp_path / "db"), "docs", None), lambda c: _TextEmbedder())(
        _texts(["first"], ["makes the table"], 0)))
    stage = EmbedStage(EmbedConfig(), StoredHashes(str(tmp_path / "db"), "docs", store.version), lambda c: _TextEmbedder(),
                       sink=FragmentSink(store.dataset_uri()))
    whole = stage(_texts(["a", "b", "c", "d"], ["one", "two", "three", "four"], 1))
    writer.consume(whole.slice(0, 2))
    writer.consume(whole.slice(2))
    writer.consume(whole.slice(1, 2))  # rows of a settled file again: their ids were seen; nothing is counted twice
    lost = _texts(["e", "f", "g", "h"], ["five", "six", "seven", "eight"], 5)
    writer.consume(stage(lost).slice(0, 3))  # the rest of this batch is lost with its worker ...
    writer.consume(stage(lost))  # ... and the task's second run writes a second file of the same rows
    writer.finish()
    rows = _rows(store)
    assert sorted(rows) == ["a", "b", "c", "d", "e", "f", "first", "g", "h"] and rows["h"][0] == "eight"
    assert store.table.count_rows() == 9 and writer.redelivered == 5 and writer.counts["insert"] == 9 and writer.files_dropped == 0
    # a-d whole; e-g read back from the first file of the lost batch, h from the second
    assert (writer.files_committed, writer.files_salvaged) == (1, 2)
    writer.close()
    writer.rejects.close()


def test_precomputed_vectors_are_written_by_the_workers_as_given(tmp_path):
    """A batch that carries its vectors (the reader checked them) embeds nothing: the file
    holds the given vectors, and the driver commits it."""
    from logicrank.pipelines.config.settings import EmbedConfig
    from logicrank.pipelines.engines.store import DocStore
    from logicrank.pipelines.operations.indexing import EmbedStage, FragmentSink, StoredHashes

    def embedder(config):
        raise AssertionError("nothing is embedded")

    given = [[0.6, 0.8, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.6, 0.0, 0.8]]
    batches = [_texts([f"v{i}"], [f"text {i}"], i).append_column("vector", pa.array([g], pa.list_(pa.float32()))) for i, g in enumerate(given)]
    store = DocStore(str(tmp_path / "db"), "docs")
    writer = IndexWriter(store, "m", RejectSink(tmp_path / "rejects.parquet"), chunk_rows=100, seen_dir=tmp_path / "seen")
    writer.consume(EmbedStage(EmbedConfig(), StoredHashes(str(tmp_path / "db"), "docs", None), embedder)(batches[0]))
    stage = EmbedStage(EmbedConfig(), StoredHashes(str(tmp_path / "db"), "docs", store.version), embedder, sink=FragmentSink(store.dataset_uri()))
    for b in batches[1:]:
        writer.consume(stage(b))
    writer.finish()
    assert writer.files_committed == 2 and store.table.count_rows() == 3
    assert {d: list(v[1]) for d, v in _rows(store).items()} == {f"v{i}": pytest.approx(g) for i, g in enumerate(given)}
    writer.close()
    writer.rejects.close()


@pytest.mark.parametrize(("precomputed", "word"), [(False, "embedded"), (True, "written")])
def test_the_progress_line_says_embedded_only_where_the_run_embeds(precomputed, word):
    from collections import Counter

    from logicrank.jobs.index import progress_line

    class _Writer:
        rows_read, counts = 5, Counter({"insert": 3, "update": 1, "reject": 1})

    assert progress_line(_Writer(), precomputed) == f"indexing: 5 rows read, 4 {word}, 0 unchanged, 1 rejected"


def test_documents_whose_bytes_were_not_all_utf8_are_counted_when_kept(tmp_path):
    """A TREC DOC read with U+FFFD for bytes that are not UTF-8 carries the reader's note; the
    writer counts the ones it keeps (the job's summary: ``not_utf8``), not a redelivery of one,
    nor a rejected row whose detail says the same."""
    from logicrank.pipelines.corpus import NOT_UTF8_NOTE

    store, sink = _RecordingStore(), RejectSink(tmp_path / "rejects.parquet")
    writer = IndexWriter(store, "m", sink, chunk_rows=2)
    batch = _batch([("a", "f.trec", 1, None), ("b", "f.trec", 2, None), ("c", "f.trec", 3, None), (None, "f.trec", 4, "invalid_utf8")])
    notes = [f"{NOT_UTF8_NOTE}: 1 byte sequence(s) read as U+FFFD", None, f"{NOT_UTF8_NOTE}: 2 byte sequence(s) read as U+FFFD",
             f"{NOT_UTF8_NOTE}: the DOCNO"]
    batch = batch.set_column(batch.schema.get_field_index("_detail"), "_detail", pa.array(notes, pa.string()))
    writer.consume(batch)
    writer.consume(batch)  # delivered twice: counted once
    writer.flush()
    sink.close()
    assert store.written == ["a", "b", "c"] and writer.not_utf8 == 2
