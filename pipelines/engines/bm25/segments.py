"""A BM25 index built in segments of documents, each step a task any worker of a cluster can run,
into the same saved index (storage.py's files, the same arrays) a build in one scan saves.

One segment is ``segment_rows`` consecutive rows of the table version (the saved index's
segments: storage.py's :func:`~logicrank.pipelines.engines.bm25.storage.segmented`). The steps,
each writing its files under a work directory beside the index, which every worker reads (a
local disk for one node, a shared file system for a cluster):

1. :func:`analyze_segment`, per segment: its documents analyzed (term counts in the segment's
   own term ids, numbered by first appearance as :func:`~.index.field_counts` numbers them),
   its ids and hashes, its per-term document frequencies and field lengths;
2. :func:`merge_segments`, once: the vocabulary (each segment's new terms appended in segment
   order: the ids one scan gives), the collection's statistics (N, the average length, the
   combined document frequencies, so the idf) and each segment's term-id map;
3. :func:`weigh_segment`, per segment: its counts in the vocabulary's ids and its BM25 weights
   under the collection's statistics (:func:`~.index.weigh`: a document's weights depend on
   its own counts and the collection's statistics only);
4. :func:`assemble`, once: the saved index, its search files segment after segment (streamed
   through memory maps), its counts, ids and vocabulary, renamed into place.

A worker holds one segment at a time (its counts and weights), never the collection; the
assembler holds the doc ids (for the tie-break ranks) and the vocabulary. :func:`build` runs the
steps with a ``run`` the caller gives: here one after another (:func:`in_process`), on a Ray
cluster the index job's (jobs/index.py).
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import uuid
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from logicrank.pipelines.engines.bm25 import storage
from logicrank.pipelines.engines.bm25.analyzer import Vocabulary, default_analyzer
from logicrank.pipelines.engines.bm25.index import SOURCE_COLUMNS, field_counts, idf_of, tiebreak_ranks, weigh

SCAN_ROWS = 8192  # rows per batch read from the table

Run = Callable[[Callable, Sequence[tuple]], list]  # run(step, [args, ...]) -> [result, ...], in the arguments' order


def in_process(step: Callable, args: Sequence[tuple]) -> list:
    """Run a step's tasks one after another in this process."""
    return [step(*a) for a in args]


def ranges(docs: int, segment_rows: int) -> list[tuple[int, int]]:
    """The segments' row ranges: ``[lo, hi)`` of ``segment_rows`` rows, the last shorter; one
    empty segment for an empty table."""
    return [(lo, min(docs, lo + segment_rows)) for lo in range(0, max(docs, 1), segment_rows)]


def opener(store) -> Callable:
    """What a task calls to open the store's table at its version in its own process (a
    picklable call of the store's class; a local path made absolute: a worker's working
    directory is not the driver's)."""
    uri = str(store.uri)
    if "://" not in uri:
        uri = str(Path(uri).expanduser().resolve())
    return functools.partial(type(store), uri, store.name, version=int(store.version))


def build(store, path: Path, run: Run = in_process, segment_rows: int | None = None) -> dict:
    """Build and save the BM25 index of the store's version in ``path`` in segments (module doc);
    returns what was done. Each task opens the table version itself (:func:`opener`) and reads
    and writes the work directory beside ``path``: on a cluster of several nodes, a directory
    every node sees at the same path (a shared file system), as the table itself is."""
    path = Path(path).expanduser().resolve()
    segment_rows = segment_rows or storage.SEGMENT_ROWS
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}-segments-", dir=path.parent))
    try:
        spans = ranges(store.count(), segment_rows)
        for i in range(len(spans)):  # made here: a task on a node that does not see the directory fails, never makes its own
            (work / f"s{i:05d}").mkdir()
        table = opener(store)
        rows = run(analyze_segment, [(table, lo, hi, str(work / f"s{i:05d}")) for i, (lo, hi) in enumerate(spans)])
        (stats,) = run(merge_segments, [(str(work), len(spans))])
        run(weigh_segment, [(str(work), i, lo, stats["avgdl"]) for i, (lo, _) in enumerate(spans)])
        run(assemble, [(str(work), len(spans), str(path), int(store.version), store.version_stamp(), segment_rows)])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"how": "built", "analyzed": sum(rows), "segments": len(spans), "segment_rows": segment_rows, "terms": stats["terms"]}


# -- 1. analyze ---------------------------------------------------------------------------
def analyze_segment(table: Callable, lo: int, hi: int, out: str) -> int:
    """Rows ``[lo, hi)`` of the table version ``table()`` opens analyzed into ``out``: the
    segment's terms (its own ids, by first appearance), its title and text counts in those ids,
    its ids and hashes, and its statistics (per-term document frequencies per field, documents
    with tokens and tokens per field). Returns its rows."""
    out_dir = Path(out)
    if not out_dir.is_dir():
        raise FileNotFoundError(f"bm25: the segment directory {out_dir} is not on this node (the database must be at the same path on every node)")
    vocab, analyze = Vocabulary(), default_analyzer()
    ids, hashes, titles, texts = [], [], [], []
    store = table() if hi > lo else None
    if store is not None:
        for b in store.scan(SOURCE_COLUMNS, batch_rows=SCAN_ROWS, rows=(lo, hi)):
            ids.append(b.column("doc_id"))
            hashes.append(b.column("content_hash"))
            title, text = field_counts([b.column("title").to_pylist(), b.column("text").to_pylist()], vocab, analyze)
            titles.append(title)
            texts.append(text)
    cols = len(vocab)
    title, text = (_stack(ms, cols) for ms in (titles, texts))
    if title.shape[0] != hi - lo:
        raise RuntimeError(f"bm25: segment rows {lo}-{hi} of {store.name!r} v{store.version} read as {title.shape[0]} rows (a bug)")
    sp.save_npz(out_dir / "title.npz", title, compressed=False)
    sp.save_npz(out_dir / "text.npz", text, compressed=False)
    pq.write_table(pa.table({"term": pa.array(vocab.terms, pa.string())}), out_dir / "terms.parquet")
    string = pa.string()
    pq.write_table(pa.table({"doc_id": pa.chunked_array(ids, string) if ids else pa.array([], string),
                             "content_hash": pa.chunked_array(hashes, string) if hashes else pa.array([], string)}), out_dir / "docs.parquet")
    np.savez(out_dir / "stats.npz", **{f"{f}_{k}": v for f, m in (("title", title), ("text", text)) for k, v in _field_stats(m).items()})
    return hi - lo


def _stack(parts: list[sp.csr_matrix], cols: int) -> sp.csr_matrix:
    if not parts:
        return sp.csr_matrix((0, cols), dtype=np.int32)
    return sp.vstack([sp.csr_matrix((m.data, m.indices, m.indptr), shape=(m.shape[0], cols)) for m in parts], format="csr")


def _field_stats(m: sp.csr_matrix) -> dict[str, np.ndarray]:
    """One field's statistics, as :meth:`~.index.BM25Index.stats` counts them."""
    lengths = np.asarray(m.sum(axis=1)).ravel()
    return {"df": np.bincount(m.indices, minlength=m.shape[1]).astype(np.int64),
            "docs": np.int64((lengths > 0).sum()), "tokens": np.int64(lengths.sum())}


# -- 2. merge -----------------------------------------------------------------------------
def merge_segments(work: str, segments: int) -> dict:
    """The vocabulary (each segment's terms, new ones appended in segment order), each segment's
    map from its term ids to the vocabulary's (``map.npy``), and the collection's statistics:
    the idf (``idf.npy``) and the average length, as one scan's build computes them."""
    work_dir = Path(work)
    vocab = Vocabulary()
    df = {"title": [], "text": []}
    docs = {"title": 0, "text": 0}
    tokens = 0
    for i in range(segments):
        seg = work_dir / f"s{i:05d}"
        terms = pq.read_table(seg / "terms.parquet").column("term").to_pylist()
        mapping = np.fromiter((vocab.id(t) for t in terms), np.int64, len(terms))
        np.save(seg / "map.npy", mapping)
        with np.load(seg / "stats.npz") as s:
            for field in ("title", "text"):
                df[field].append((mapping, s[f"{field}_df"]))
                docs[field] += int(s[f"{field}_docs"])
                tokens += int(s[f"{field}_tokens"])
    size = len(vocab)
    combined = []
    for field in ("title", "text"):
        total = np.zeros(size, np.int64)
        for mapping, part in df[field]:
            total[mapping] += part  # a segment's terms map to distinct ids
        combined.append(total)
    n = max(docs["title"], docs["text"])
    np.save(work_dir / "idf.npy", idf_of(n, np.maximum(*combined)))
    pq.write_table(pa.table({"term": pa.array(vocab.terms, pa.string())}), work_dir / "vocab.parquet")
    return {"docs": n, "avgdl": tokens / n if n else 0.0, "terms": size}


# -- 3. weigh -----------------------------------------------------------------------------
def weigh_segment(work: str, i: int, lo: int, avgdl: float) -> int:
    """Segment ``i``'s counts in the vocabulary's term ids (``title_*.npy``, ``text_*.npy``: CSR
    arrays, documents x terms) and its weights, terms x documents with the table's row numbers
    (``w_*.npy``). Returns its postings."""
    work_dir = Path(work)
    seg = work_dir / f"s{i:05d}"
    mapping = np.load(seg / "map.npy")
    idf = np.load(work_dir / "idf.npy", mmap_mode="r")
    counts = []
    for field in ("title", "text"):
        local = sp.load_npz(seg / f"{field}.npz").tocsr()
        m = sp.csr_matrix((local.data, mapping[local.indices].astype(np.int32), local.indptr), shape=(local.shape[0], len(idf)))
        m.sort_indices()  # each document's terms by the vocabulary's ids, as one scan's build holds them
        np.save(seg / f"{field}_indptr.npy", m.indptr.astype(np.int64))  # offsets into every segment's postings after this one's
        np.save(seg / f"{field}_indices.npy", m.indices)
        np.save(seg / f"{field}_data.npy", m.data)
        counts.append(m)
    w = weigh(*counts, np.asarray(idf), avgdl)
    np.save(seg / "w_indptr.npy", w.indptr.astype(np.int64))
    np.save(seg / "w_indices.npy", (w.indices.astype(np.int64) + lo).astype(np.int32))
    np.save(seg / "w_data.npy", w.data.astype(np.float32, copy=False))
    return int(w.nnz)


# -- 4. assemble --------------------------------------------------------------------------
def assemble(work: str, segments: int, path: str, version: int, stamp: str, segment_rows: int) -> None:
    """The saved index (storage.py's files) from the segments' files, written into a temporary
    sibling of ``path`` and renamed into place."""
    work_dir, path_ = Path(work), Path(path)
    segs = [work_dir / f"s{i:05d}" for i in range(segments)]
    tmp = Path(tempfile.mkdtemp(prefix=f".{path_.name}-", dir=path_.parent))
    try:
        save_id = uuid.uuid4().hex
        meta = {b"logicrank.save_id": save_id.encode()}
        docs = pa.concat_tables([pq.read_table(s / "docs.parquet") for s in segs])
        pq.write_table(docs.replace_schema_metadata(meta), tmp / "docs.parquet")
        vocab = pq.read_table(work_dir / "vocab.parquet")
        pq.write_table(vocab.replace_schema_metadata(meta), tmp / "vocab.parquet")
        terms, n = vocab.num_rows, docs.num_rows
        for field in ("title", "text"):
            _write_counts(tmp / f"{field}.npz", work_dir, [(s / f"{field}_indptr.npy", s / f"{field}_indices.npy", s / f"{field}_data.npy")
                                                          for s in segs], (n, terms))
        search = tmp / "search"
        search.mkdir()
        parts = [(s / "w_indptr.npy", s / "w_indices.npy", s / "w_data.npy") for s in segs]
        total = sum(int(np.load(p[0], mmap_mode="r")[-1]) for p in parts)
        out_indices = np.lib.format.open_memmap(search / "indices.npy", "w+", np.int32, (total,))
        out_data = np.lib.format.open_memmap(search / "data.npy", "w+", np.float32, (total,))
        layout, offset = np.empty((len(parts), terms + 1), np.int64), 0
        for s, (p_indptr, p_indices, p_data) in enumerate(parts):
            indptr = np.load(p_indptr)
            nnz = int(indptr[-1])
            out_indices[offset : offset + nnz] = np.load(p_indices, mmap_mode="r")
            out_data[offset : offset + nnz] = np.load(p_data, mmap_mode="r")
            layout[s] = indptr + offset
            offset += nnz
        out_indices.flush()
        out_data.flush()
        del out_indices, out_data
        ids = docs.column("doc_id").combine_chunks()
        rank, rows = tiebreak_ranks(ids)
        for name, a in (("indptr", layout), ("idf", np.load(work_dir / "idf.npy")), ("tiebreak", rank), ("rows_by_rank", rows)):
            np.save(search / f"{name}.npy", np.ascontiguousarray(a))
        storage.write_doc_ids(search / "doc_ids.arrow", ids, meta)
        storage.write_meta(tmp, version, stamp, save_id, n, terms, segment_rows)
        storage.place(tmp, path_, stamp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_counts(target: Path, work_dir: Path, parts: list[tuple[Path, Path, Path]], shape: tuple[int, int]) -> None:
    """One field's documents x terms counts over every segment, as ``scipy.sparse.save_npz``
    writes a CSR (uncompressed): its index arrays in the dtype scipy gives a matrix of that size
    (int32 while every offset fits), its arrays streamed through memory maps into the archive."""
    scratch = Path(tempfile.mkdtemp(prefix="counts-", dir=work_dir))
    try:
        lengths = [int(np.load(p[0], mmap_mode="r")[-1]) for p in parts]
        rows = [len(np.load(p[0], mmap_mode="r")) - 1 for p in parts]
        index = np.int32 if max(sum(lengths), *shape) <= np.iinfo(np.int32).max else np.int64
        indptr = np.lib.format.open_memmap(scratch / "indptr.npy", "w+", index, (sum(rows) + 1,))
        indices = np.lib.format.open_memmap(scratch / "indices.npy", "w+", index, (sum(lengths),))
        data = np.lib.format.open_memmap(scratch / "data.npy", "w+", np.int32, (sum(lengths),))
        indptr[0], row, at = 0, 0, 0
        for (p_indptr, p_indices, p_data), nnz, r in zip(parts, lengths, rows, strict=True):
            indptr[row + 1 : row + r + 1] = np.load(p_indptr, mmap_mode="r")[1:] + at
            indices[at : at + nnz] = np.load(p_indices, mmap_mode="r")
            data[at : at + nnz] = np.load(p_data, mmap_mode="r")
            row, at = row + r, at + nnz
        for a in (indptr, indices, data):
            a.flush()
        del indptr, indices, data
        np.save(scratch / "format.npy", np.array(b"csr"))
        np.save(scratch / "shape.npy", np.array(shape, np.int64))
        with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for name in ("indices", "indptr", "format", "shape", "data"):
                z.write(scratch / f"{name}.npy", arcname=f"{name}.npy")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

