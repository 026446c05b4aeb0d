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
4. :func:`assemble`, per part of the saved index (its search files segment after segment, the
   bytes copied by the kernel; its ids, vocabulary and statistics; each field's counts), then
   its meta, renamed into place.

A worker holds one segment at a time (its counts and weights), never the collection; the
assembler holds the doc ids (for the tie-break ranks) and the vocabulary. :func:`build` runs the
steps with a ``run`` the caller gives: here one after another (:func:`in_process`), on a Ray
cluster the index job's (jobs/index.py).

:func:`patch` makes the next version's index from an earlier saved one in the same steps: a plan
(:func:`plan_patch`: which saved rows are kept, which of the table's rows are new or changed),
the kept rows' statistics (the saved index's less its dropped rows', :func:`count_dropped`; or,
for an index saved without its statistics, read from its kept counts, :func:`count_kept`, per
segment of it) beside the new rows analyzed, the merge (the saved vocabulary first, its ids kept),
then each segment of the new index weighed from its kept rows' saved counts and its new rows'
(:func:`weigh_segment`) and assembled. Only the new and changed rows are analyzed; the saved
arrays equal those of a build over the same rows whose vocabulary starts from the saved one.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import scipy.sparse as sp

from logicrank.pipelines.engines.bm25 import storage
from logicrank.pipelines.engines.bm25.analyzer import Vocabulary, default_analyzer
from logicrank.pipelines.engines.bm25.index import SOURCE_COLUMNS, field_counts, field_stats, idf_of, tiebreak_ranks, weigh

SCAN_ROWS = 8192  # rows per batch read from the table

Run = Callable[[Callable, Sequence[tuple]], list]  # run(step, [args, ...]) -> [result, ...], in the arguments' order


def timed(run: Run, seconds: dict[str, float]) -> Run:
    """``run``, adding each step's wall time to ``seconds`` under the step's name (a build's or a
    patch's report: where its time went)."""

    def timed_run(step: Callable, args: Sequence[tuple]) -> list:
        t = time.perf_counter()
        try:
            return run(step, args)
        finally:
            seconds[step.__name__] = round(seconds.get(step.__name__, 0.0) + time.perf_counter() - t, 3)

    return timed_run


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
    seconds: dict[str, float] = {}
    run = timed(run, seconds)
    try:
        spans = ranges(store.count(), segment_rows)
        for i in range(len(spans)):  # made here: a task on a node that does not see the directory fails, never makes its own
            (work / f"s{i:05d}").mkdir()
        table = opener(store)
        analyzed = [str(work / f"s{i:05d}") for i in range(len(spans))]
        rows = run(analyze_segment, [(table, lo, hi, seg) for seg, (lo, hi) in zip(analyzed, spans, strict=True)])
        (stats,) = run(merge_segments, [(str(work), analyzed, None, [])])
        run(weigh_segment, [(str(work), i, lo, stats["avgdl"], [("analyzed", seg, 0, hi - lo)])
                            for i, (seg, (lo, hi)) in enumerate(zip(analyzed, spans, strict=True))])
        _assemble(run, work, len(spans), path, int(store.version), store.version_stamp(), segment_rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"how": "built", "analyzed": sum(rows), "docs": sum(rows), "segments": len(spans), "segment_rows": segment_rows, "terms": stats["terms"],
            "seconds": seconds}


def patch(store, base: Path, base_stamp: str | None, path: Path, run: Run = in_process, limit: float = 1.0,
          segment_rows: int | None = None) -> dict | None:
    """Save the store version's index in ``path``, patched in segments (module doc) from the
    index saved in ``base`` (an earlier version's, or this version's own counts; made when the
    table version had ``base_stamp``); returns what was done, or None where the saved counts are
    not whole or more than ``limit`` of the table's documents are new or changed (a build costs
    less). Tasks and paths as :func:`build`'s."""
    path = Path(path).expanduser().resolve()
    segment_rows = segment_rows or storage.SEGMENT_ROWS
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}-patch-", dir=path.parent))
    seconds: dict[str, float] = {}
    run = timed(run, seconds)
    try:
        base = _pinned(Path(base).expanduser().resolve(), work / "base")
        before = storage.counts_meta(base, base_stamp)
        if before is None:
            return None
        spans = ranges(store.count(), segment_rows)
        for i in range(len(spans)):
            (work / f"s{i:05d}").mkdir()
        (plan,) = run(plan_patch, [(opener(store), str(base), str(work), segment_rows, limit)])
        if plan["fresh"] > limit * max(1, plan["docs"]) or plan["docs"] != spans[-1][1] or plan["repeated"]:  # most changed; or ids repeated
            return None
        saved = ranges(before["docs"], int(before.get("segment_rows") or storage.SEGMENT_ROWS))
        fresh = ranges(plan["fresh"], max(1, segment_rows // 8)) if plan["fresh"] else []  # new rows analyzed in smaller tasks, spread
        counted = storage.read_stats(base, before) is None  # an index saved without its statistics: its kept rows counted
        kept_dirs = [str(work / f"k{j:05d}") for j in range(len(saved) if counted else 1)]
        fresh_dirs = [str(work / f"f{j:05d}") for j in range(len(fresh))]
        for d in kept_dirs + fresh_dirs:
            Path(d).mkdir()
        if counted:
            run(count_kept, [(str(base), str(work), d, lo, hi) for d, (lo, hi) in zip(kept_dirs, saved, strict=True)])
        else:
            run(count_dropped, [(str(base), before, str(work), kept_dirs[0])])
        run(analyze_segment, [(opener(store), lo, hi, d, str(work / "fresh.parquet")) for d, (lo, hi) in zip(fresh_dirs, fresh, strict=True)])
        (stats,) = run(merge_segments, [(str(work), fresh_dirs, str(base), kept_dirs)])
        kept = plan["kept"]
        weighs = []
        for i, (lo, hi) in enumerate(spans):
            pieces = [("saved", str(base), lo, min(hi, kept))] if lo < kept else []
            for j, (f_lo, f_hi) in enumerate(fresh):  # the new rows follow the kept ones
                a, b = max(lo, kept + f_lo), min(hi, kept + f_hi)
                if a < b:
                    pieces.append(("analyzed", fresh_dirs[j], a - kept - f_lo, b - kept - f_lo))
            weighs.append((str(work), i, lo, stats["avgdl"], pieces or [("saved", str(base), 0, 0)]))
        run(weigh_segment, weighs)
        _assemble(run, work, len(spans), path, int(store.version), store.version_stamp(), segment_rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"how": "patched", "from_version": before["version"], "kept": plan["kept"], "dropped": before["docs"] - plan["kept"],
            "analyzed": plan["fresh"], "docs": plan["docs"], "segments": len(spans), "segment_rows": segment_rows, "terms": stats["terms"],
            "kept_statistics": "counted" if counted else "saved less dropped", "seconds": seconds}


def _pinned(base: Path, into: Path) -> Path:
    """The saved index's counts' files hard-linked into ``into`` (the patch's work directory, on
    the same file system): a save of that version meanwhile (a rename into place) or its prune
    leaves the patch reading the files it checked. Where links fail, ``base`` itself."""
    try:
        into.mkdir()
        for name in ("meta.json", "docs.parquet", "vocab.parquet", "title.npz", "text.npz"):
            os.link(base / name, into / name)
    except OSError:
        return base
    with contextlib.suppress(OSError):  # (an index saved before its statistics were: its kept rows are counted)
        os.link(base / "stats.npz", into / "stats.npz")
    return into


def plan_patch(table: Callable, base: str, work: str, segment_rows: int, limit: float = 1.0) -> dict:
    """A patch's plan (:func:`patch`): the rows of the index saved in ``base`` whose document
    the table version ``table()`` opens still holds, unchanged (its (doc id, content hash)
    pair): their numbers (``kept.npy``); the table's other rows, new or changed (their doc ids,
    in the table's order: ``fresh.parquet``); and the new index's documents, the kept rows then
    the new ones, written per segment (``s<i>/docs.parquet``). Returns the counts; writes
    nothing where more than ``limit`` of the rows are new or changed, or where the kept and the
    new rows are not the table's (a doc id repeated in the saved index, or in the table:
    ``repeated``).

    One hash look-up of the saved doc ids in the table's (each saved row's document: the table's
    row of its id), then the content hashes of the pairs compared (a null hash as the empty
    string): a third of the time of looking up joined (doc id, hash) keys both ways at 10M."""
    work_dir = Path(work)
    stored = table().hashes().select(["doc_id", "content_hash"])
    old = pq.read_table(Path(base) / "docs.parquet", columns=["doc_id", "content_hash"]).replace_schema_metadata(None)
    at = pc.index_in(old.column("doc_id"), value_set=stored.column("doc_id"))
    if stored.num_rows:
        hashes = [pc.fill_null(h, "") for h in (old.column("content_hash"), pc.take(stored.column("content_hash"), pc.fill_null(at, 0)))]
        keep = pc.and_(pc.is_valid(at), pc.equal(*hashes))
    else:
        keep = pa.array(np.zeros(old.num_rows, bool))
    kept = np.flatnonzero(keep.to_numpy(zero_copy_only=False))
    hit = np.zeros(stored.num_rows, bool)  # the table's rows some kept row is
    hit[pc.fill_null(at, 0).to_numpy(zero_copy_only=False)[kept]] = True
    new = stored.filter(pa.array(~hit))
    counts = {"docs": len(kept) + new.num_rows, "kept": len(kept), "fresh": new.num_rows, "repeated": False}
    if new.num_rows > limit * max(1, stored.num_rows) or counts["docs"] != stored.num_rows:
        return counts  # (a build: the look-up below is not paid for)
    counts["repeated"] = _repeated(old, keep, new)
    if counts["repeated"]:
        return counts
    np.save(work_dir / "kept.npy", kept)
    _write_work(new.select(["doc_id"]), work_dir / "fresh.parquet")
    docs = pa.concat_tables([old.take(pa.array(kept)), new.cast(old.schema)])
    for i, (lo, hi) in enumerate(ranges(docs.num_rows, segment_rows)):
        _write_work(docs.slice(lo, hi - lo), _segment_dir(str(work_dir / f"s{i:05d}")) / "docs.parquet")
    return counts


def _repeated(old: pa.Table, keep: pa.Array, new: pa.Table) -> bool:
    """Whether a doc id of the table's new or changed rows (``new``) is repeated among them or
    is a kept row's (``keep`` of the saved rows ``old``): the table then holds that id twice (a
    store's ``append`` does not check), and the new rows, read by id, would be read wrong. The
    look-up hashes the new ids only (0.15 s for 100,000 against 10M saved rows; the whole
    table's distinct ids would cost 6 s)."""
    ids = new.column("doc_id")
    if not len(ids):
        return False
    return pc.count_distinct(ids).as_py() != len(ids) or bool(pc.any(pc.and_(keep, pc.is_in(old.column("doc_id"), value_set=ids))).as_py())


def _write_work(table: pa.Table, path: Path) -> None:
    """A work file of documents (read once, by a later step): uncompressed, without dictionaries
    (unique ids: at 10M written in half the time, read in a fifth), as the saved index's own."""
    storage.write_docs(table, path)


def count_kept(base: str, work: str, out: str, lo: int, hi: int) -> int:
    """The statistics (:func:`analyze_segment`'s ``stats.npz``) of the kept ones among rows
    ``[lo, hi)`` of the index saved in ``base``, read from its counts, into ``out``; returns
    how many were kept."""
    kept = np.load(Path(work) / "kept.npy", mmap_mode="r")
    rows = np.asarray(kept[np.searchsorted(kept, lo) : np.searchsorted(kept, hi)])
    stats, terms = {}, storage.map_counts(Path(base), "title")[3][1]  # (the fields' shapes are one)
    for field in ("title", "text"):
        indptr, indices, data = _saved_rows(Path(base), field, rows)
        m = sp.csr_matrix((data, indices.astype(np.int32, copy=False), indptr), shape=(len(rows), terms))
        stats.update({f"{field}_{k}": v for k, v in field_stats(m).items()})
    np.savez(_segment_dir(out) / "stats.npz", **stats)
    return len(rows)


def count_dropped(base: str, meta: dict, work: str, out: str) -> int:
    """The statistics (:func:`analyze_segment`'s ``stats.npz``) of the kept rows of the index
    saved in ``base`` (its meta ``meta``): its saved statistics (storage.py's ``stats.npz``) less
    those of the rows it does not keep, read from its counts (a re-index drops few: it reads
    those rows' postings only), into ``out``; returns how many were kept."""
    saved = storage.read_stats(Path(base), meta)
    if saved is None:
        raise RuntimeError(f"bm25: the statistics saved in {base} are no longer whole")
    kept = np.load(Path(work) / "kept.npy")
    dropped = np.ones(meta["docs"], bool)
    dropped[kept] = False
    rows = np.flatnonzero(dropped)
    stats = {}
    for field in ("title", "text"):
        indptr, indices, data = _saved_rows(Path(base), field, rows)
        gone = field_stats(sp.csr_matrix((data, indices.astype(np.int32, copy=False), indptr), shape=(len(rows), meta["terms"])))
        stats.update({f"{field}_{k}": saved[f"{field}_{k}"] - v for k, v in gone.items()})
    np.savez(_segment_dir(out) / "stats.npz", **stats)
    return len(kept)


# -- 1. analyze ---------------------------------------------------------------------------
def analyze_segment(table: Callable, lo: int, hi: int, out: str, fresh: str | None = None) -> int:
    """Rows ``[lo, hi)`` of the table version ``table()`` opens analyzed into ``out`` (with
    ``fresh``, a Parquet file of doc ids: the table's rows of its ids ``[lo, hi)``, in its
    order): the segment's terms (its own ids, by first appearance), its title and text counts in
    those ids, its ids and hashes, and its statistics (per-term document frequencies per field,
    documents with tokens and tokens per field). Returns its rows."""
    out_dir = _segment_dir(out)
    vocab, analyze = Vocabulary(), default_analyzer()
    ids, hashes, titles, texts = [], [], [], []
    store = table() if hi > lo else None
    if store is not None:
        for b in _read_rows(store, lo, hi, fresh):
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
    _write_work(pa.table({"doc_id": pa.chunked_array(ids, string) if ids else pa.array([], string),
                          "content_hash": pa.chunked_array(hashes, string) if hashes else pa.array([], string)}), out_dir / "docs.parquet")
    np.savez(out_dir / "stats.npz", **{f"{f}_{k}": v for f, m in (("title", title), ("text", text)) for k, v in field_stats(m).items()})
    return hi - lo


def _segment_dir(out: str) -> Path:
    out_dir = Path(out)
    if not out_dir.is_dir():
        raise FileNotFoundError(f"bm25: the segment directory {out_dir} is not on this node (the database must be at the same path on every node)")
    return out_dir


def _read_rows(store, lo: int, hi: int, fresh: str | None):
    """The record batches :func:`analyze_segment` analyzes: the table's rows ``[lo, hi)``, or
    the rows of the doc ids ``[lo, hi)`` of the Parquet file ``fresh``, in that file's order."""
    if fresh is None:
        yield from store.scan(SOURCE_COLUMNS, batch_rows=SCAN_ROWS, rows=(lo, hi))
        return
    wanted = pq.read_table(fresh, columns=["doc_id"]).column("doc_id").slice(lo, hi - lo)
    rows = store.rows_for(wanted.to_pylist(), SOURCE_COLUMNS[1:]).select(SOURCE_COLUMNS)
    if rows.num_rows != len(wanted):
        raise RuntimeError(f"bm25: {len(wanted) - rows.num_rows} of the documents to analyze are not in {store.name!r} v{store.version}")
    order = pc.index_in(wanted, value_set=rows.column("doc_id"))  # the file's order (the table's, as it was listed)
    yield from rows.take(order).to_batches(max_chunksize=SCAN_ROWS)


def _stack(parts: list[sp.csr_matrix], cols: int) -> sp.csr_matrix:
    if not parts:
        return sp.csr_matrix((0, cols), dtype=np.int32)
    return sp.vstack([sp.csr_matrix((m.data, m.indices, m.indptr), shape=(m.shape[0], cols)) for m in parts], format="csr")


# -- 2. merge -----------------------------------------------------------------------------
def merge_segments(work: str, analyzed: Sequence[str], prior: str | None, kept: Sequence[str]) -> dict:
    """The vocabulary, each analyzed segment's map from its term ids to the vocabulary's
    (``map.npy``), and the collection's statistics: the idf (``idf.npy``) and the average length,
    as one scan's build computes them. The vocabulary: the terms of the saved index ``prior``
    first (a patch: their ids kept), then each analyzed segment's new terms in segment order (the
    ids one scan gives). ``kept``: directories of statistics of rows in ``prior``'s term ids
    (:func:`count_dropped`'s one, or :func:`count_kept`'s per segment). The collection's
    statistics per field are written too (``stats.npz``, saved with the index)."""
    work_dir = Path(work)
    prior_terms = pq.read_table(Path(prior) / "vocab.parquet").column("term").combine_chunks() if prior else pa.array([], pa.string())
    parts = [(np.arange(len(prior_terms)), Path(d)) for d in kept]  # (term ids, statistics' directory)
    new: dict[str, int] = {}  # terms the prior vocabulary lacks, numbered on first sight (segment order)
    for d in analyzed:
        terms = pq.read_table(Path(d) / "terms.parquet").column("term").combine_chunks()
        found = pc.fill_null(pc.index_in(terms, value_set=prior_terms), -1).to_numpy() if len(prior_terms) else np.full(len(terms), -1)
        ids = found.astype(np.int64)
        misses = np.flatnonzero(ids < 0)
        for j, term in zip(misses.tolist(), terms.take(pa.array(misses)).to_pylist(), strict=True):
            ids[j] = new.setdefault(term, len(prior_terms) + len(new))
        np.save(Path(d) / "map.npy", ids)
        parts.append((ids, Path(d)))
    size = len(prior_terms) + len(new)
    df = {"title": np.zeros(size, np.int64), "text": np.zeros(size, np.int64)}
    docs = {"title": 0, "text": 0}
    tokens = {"title": 0, "text": 0}
    for ids, d in parts:
        with np.load(d / "stats.npz") as s:
            for field in ("title", "text"):
                df[field][ids] += s[f"{field}_df"]  # a segment's terms map to distinct ids
                docs[field] += int(s[f"{field}_docs"])
                tokens[field] += int(s[f"{field}_tokens"])
    n = max(docs["title"], docs["text"])
    np.save(work_dir / "idf.npy", idf_of(n, np.maximum(df["title"], df["text"])))
    np.savez(work_dir / "stats.npz", **{f"{f}_df": df[f] for f in df}, **{f"{f}_docs": np.int64(docs[f]) for f in docs},
             **{f"{f}_tokens": np.int64(tokens[f]) for f in tokens})
    vocab = pa.concat_arrays([prior_terms, pa.array(list(new), pa.string())])
    pq.write_table(pa.table({"term": vocab}), work_dir / "vocab.parquet")
    return {"docs": n, "avgdl": (tokens["title"] + tokens["text"]) / n if n else 0.0, "terms": size}


# -- 3. weigh -----------------------------------------------------------------------------
Piece = tuple[str, str, int, int]  # (kind, directory, lo, hi): rows of an analyzed segment, or of a saved index's kept rows


def weigh_segment(work: str, i: int, lo: int, avgdl: float, pieces: Sequence[Piece]) -> int:
    """Segment ``i`` of the new index (its rows from ``lo``): its weights, terms x documents with
    the index's row numbers (``w_*.npy``), and what the assembly needs of its counts in the
    vocabulary's term ids (documents x terms, each document's terms sorted), in ``work``'s
    ``s<i>``. Its rows, in order, are those of ``pieces`` (``pieces.json``):
    ``("analyzed", dir, lo, hi)``, rows of a segment :func:`analyze_segment` wrote (its term ids
    mapped by :func:`merge_segments`; their counts saved, ``<field>_<k>_*.npy`` for the ``k``-th
    piece); ``("saved", dir, lo, hi)``, the kept rows ``[lo, hi)`` (``kept.npy``) of the index
    saved in ``dir`` (their counts, already in the vocabulary's ids and sorted, are read from it
    again by the assembly: a patch writes the kept rows' counts once). Returns its postings."""
    work_dir = Path(work)
    seg = _segment_dir(str(work_dir / f"s{i:05d}"))
    idf = np.load(work_dir / "idf.npy", mmap_mode="r")
    counts = []
    for field in ("title", "text"):
        parts = [_piece_counts(work_dir, piece, field, len(idf)) for piece in pieces]
        for k, (piece, part) in enumerate(zip(pieces, parts, strict=True)):
            if piece[0] == "analyzed":
                part.sort_indices()  # each document's terms by the vocabulary's ids, as one scan's build holds them
                np.save(seg / f"{field}_{k}_indptr.npy", part.indptr.astype(np.int64))  # summed with other pieces' offsets past 2**31
                for name in ("indices", "data"):
                    np.save(seg / f"{field}_{k}_{name}.npy", getattr(part, name))
        counts.append(sp.vstack(parts, format="csr") if len(parts) > 1 else parts[0])
    (seg / "pieces.json").write_text(json.dumps([list(p) for p in pieces]))
    w = weigh(*counts, np.asarray(idf), avgdl)
    np.save(seg / "w_indptr.npy", w.indptr.astype(np.int64))
    np.save(seg / "w_indices.npy", w.indices.astype(np.int32, copy=False) + np.int32(lo))  # (the saved rows are int32)
    np.save(seg / "w_data.npy", w.data.astype(np.float32, copy=False))
    return int(w.nnz)


def _piece_counts(work_dir: Path, piece: Piece, field: str, terms: int) -> sp.csr_matrix:
    """One field's counts of a piece's rows (:func:`weigh_segment`) in the vocabulary's term ids."""
    kind, where, lo, hi = piece
    if kind == "analyzed":
        local = sp.load_npz(Path(where) / f"{field}.npz").tocsr()
        local = local if (lo, hi) == (0, local.shape[0]) else local[lo:hi]
        mapping = np.load(Path(where) / "map.npy")
        return sp.csr_matrix((local.data, mapping[local.indices].astype(np.int32), local.indptr), shape=(hi - lo, terms))
    if kind == "saved":
        indptr, indices, data = _saved_rows(Path(where), field, np.load(work_dir / "kept.npy", mmap_mode="r")[lo:hi])
        return sp.csr_matrix((data, indices.astype(np.int32, copy=False), indptr), shape=(hi - lo, terms))  # its ids: the vocabulary's first
    raise ValueError(f"bm25: unknown piece {kind!r}")


def _saved_rows(base: Path, field: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR arrays of the given rows (ascending) of a saved index's counts, read from its
    mapped archive (:func:`row_postings`)."""
    indptr, indices, data, _ = storage.map_counts(base, field)
    out_indptr, take = row_postings(indptr, rows)
    return out_indptr, np.require(take(indices), requirements="W"), np.require(take(data), np.int32, "W")  # (scipy may sort them in place)


def row_postings(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """The CSR indptr of the given rows (ascending) of a CSR whose indptr is ``indptr``, and a
    function that takes their postings out of one of its arrays (indices or data, mapped): where
    the rows are most of those between their first and their last (the kept ones), the postings
    of that span less the others' (one pass over those bytes; where they are all of them, a view
    of the span); where they are few (the dropped ones), each row's postings gathered."""
    rows = np.asarray(rows, np.int64)
    if not len(rows):
        return np.zeros(1, np.int64), lambda a: np.asarray(a[:0])
    first, last = int(rows[0]), int(rows[-1]) + 1
    out_indptr = np.zeros(len(rows) + 1, np.int64)
    if len(rows) < (last - first) // 4:  # few: a gather of their postings
        starts = np.asarray(indptr[rows], np.int64)
        lengths = np.asarray(indptr[rows + 1], np.int64) - starts
        np.cumsum(lengths, out=out_indptr[1:])
        # (the postings' positions found when they are taken: a caller after the indptr alone pays nothing for them)
        return out_indptr, lambda a: np.asarray(a[np.repeat(starts - out_indptr[:-1], lengths) + np.arange(out_indptr[-1])])
    bounds = np.asarray(indptr[first : last + 1], np.int64)
    lengths = np.diff(bounds)
    block = slice(int(bounds[0]), int(bounds[-1]))
    np.cumsum(lengths[rows - first], out=out_indptr[1:])
    if len(rows) == last - first:  # every row between: the block itself (a view of a mapped array)
        return out_indptr, lambda a: a[block]

    def span_less_others(a: np.ndarray) -> np.ndarray:
        wanted = np.zeros(last - first, bool)
        wanted[rows - first] = True
        return np.asarray(a[block])[np.repeat(wanted, lengths)]

    return out_indptr, span_less_others


# -- 4. assemble --------------------------------------------------------------------------
PARTS = ("search", "ids", "title", "text")  # the saved index's files, assembled as separate tasks


def _assemble(run: Run, work: Path, segments: int, path: Path, version: int, stamp: str, segment_rows: int) -> None:
    """The saved index (storage.py's files) from the segments' files: its parts (:func:`assemble`)
    written as tasks into a temporary sibling of ``path``, then its meta, then renamed into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        save_id = uuid.uuid4().hex  # in every file: a load never mixes the files of two saves
        (tmp / "search").mkdir()
        run(assemble, [(str(work), segments, str(tmp), part, save_id) for part in PARTS])
        storage.write_meta(tmp, version, stamp, save_id, _docs(work, segments), _terms(work), segment_rows)
        storage.place(tmp, path, stamp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def assemble(work: str, segments: int, tmp: str, part: str, save_id: str) -> None:
    """One part (:data:`PARTS`) of the saved index, from the segments' files in ``work``, into
    ``tmp``: ``search``, the weights in segments (each segment's bytes copied by the kernel) and
    the idf; ``ids``, the documents (``docs.parquet``, the doc ids, the tie-break ranks), the
    vocabulary and the statistics; ``title`` and ``text``, that field's counts."""
    work_dir, out = Path(work), Path(tmp)
    segs = [work_dir / f"s{i:05d}" for i in range(segments)]
    meta = {b"logicrank.save_id": save_id.encode()}
    if part in ("title", "text"):
        blocks = [functools.partial(_piece_postings, work_dir, s, part, k, piece)
                  for s in segs for k, piece in enumerate(json.loads((s / "pieces.json").read_text()))]
        write_counts(out / f"{part}.npz", blocks, (_docs(work_dir, segments), _terms(work_dir)))
    elif part == "search":
        parts = [(s / "w_indptr.npy", s / "w_indices.npy", s / "w_data.npy") for s in segs]
        layout, total = np.empty((len(parts), _terms(work_dir) + 1), np.int64), 0
        for s, p in enumerate(parts):
            layout[s] = np.load(p[0]) + total
            total = int(layout[s, -1])
        for name, dtype, k in (("indices", np.int32, 1), ("data", np.float32, 2)):  # each segment's postings appended, term by term
            with open(out / "search" / f"{name}.npy", "wb") as f:
                f.write(_npy_header(dtype, total))
                for p in parts:
                    _append_npy(f, p[k], dtype)
        np.save(out / "search" / "indptr.npy", layout)
        np.save(out / "search" / "idf.npy", np.load(work_dir / "idf.npy"))
    elif part == "ids":
        docs = pa.concat_tables([pq.read_table(s / "docs.parquet") for s in segs]).replace_schema_metadata(meta)
        storage.write_docs(docs, out / "docs.parquet")
        pq.write_table(pq.read_table(work_dir / "vocab.parquet").replace_schema_metadata(meta), out / "vocab.parquet")
        ids = docs.column("doc_id").combine_chunks()
        rank, rows = tiebreak_ranks(ids)
        np.save(out / "search" / "tiebreak.npy", rank)
        np.save(out / "search" / "rows_by_rank.npy", rows)
        storage.write_doc_ids(out / "search" / "doc_ids.arrow", ids, meta)
        with np.load(work_dir / "stats.npz") as stats:
            storage.write_stats(out, dict(stats), save_id)
    else:
        raise ValueError(f"bm25: unknown part {part!r} of a saved index")


def _docs(work_dir: Path, segments: int) -> int:
    return sum(pq.ParquetFile(work_dir / f"s{i:05d}" / "docs.parquet").metadata.num_rows for i in range(segments))


def _terms(work_dir: Path) -> int:
    return pq.ParquetFile(work_dir / "vocab.parquet").metadata.num_rows


def _piece_postings(work_dir: Path, seg: Path, field: str, k: int, piece: Piece) -> tuple[np.ndarray, Callable[[str], np.ndarray]]:
    """The ``k``-th piece of segment ``seg`` (:func:`weigh_segment`), one field's counts: its
    CSR indptr, and a function giving its indices or its data: an analyzed piece's from the
    files weigh wrote (mapped), a saved piece's kept rows from the saved index's counts."""
    kind, where, lo, hi = piece
    if kind == "saved":
        indptr, indices, data, _ = storage.map_counts(Path(where), field)
        out_indptr, take = row_postings(indptr, np.load(work_dir / "kept.npy", mmap_mode="r")[lo:hi])
        return out_indptr, lambda name: take({"indices": indices, "data": data}[name])
    return np.load(seg / f"{field}_{k}_indptr.npy"), lambda name: np.load(seg / f"{field}_{k}_{name}.npy", mmap_mode="r")


def write_counts(target: Path, blocks: list[Callable[[], tuple[np.ndarray, Callable[[str], np.ndarray]]]], shape: tuple[int, int]) -> None:
    """One field's documents x terms counts over every segment, as ``scipy.sparse.save_npz``
    writes a CSR (uncompressed): its index arrays in the dtype scipy gives a matrix of that size
    (int32 while every offset fits), each member of the archive written block by block
    (``blocks``: each a call giving a block's CSR indptr and a function giving its ``"indices"``
    or its ``"data"``, :func:`_piece_postings`; a block's arrays are read, and written, once per
    member, and no more than one block's are held at a time)."""
    sizes = [(len(p) - 1, int(p[-1])) for p in (block()[0] for block in blocks)]  # (rows, postings)
    lengths = [nnz for _, nnz in sizes]
    index = np.int32 if max(sum(lengths), *shape) <= np.iinfo(np.int32).max else np.int64
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED, allowZip64=True) as z:  # the members in scipy's order
        with z.open("indices.npy", "w", force_zip64=True) as f:
            f.write(_npy_header(index, sum(lengths)))
            for block in blocks:
                write_items(f, block()[1]("indices"), index)
        with z.open("indptr.npy", "w", force_zip64=True) as f:
            f.write(_npy_header(index, sum(rows for rows, _ in sizes) + 1))
            f.write(np.zeros(1, index).tobytes())
            at = 0
            for block, nnz in zip(blocks, lengths, strict=True):
                f.write((np.asarray(block()[0][1:], np.int64) + at).astype(index))  # offsets summed in int64: past 2**31 exact
                at += nnz
        for name, a in (("format", np.array(b"csr")), ("shape", np.array(shape, np.int64))):
            with z.open(f"{name}.npy", "w") as f:
                np.lib.format.write_array(f, a)
        with z.open("data.npy", "w", force_zip64=True) as f:
            f.write(_npy_header(np.int32, sum(lengths)))
            for block in blocks:
                write_items(f, block()[1]("data"), np.int32)


def write_items(out, items: np.ndarray, dtype) -> None:
    """A one-dimensional array's items written to the open binary file ``out`` as ``dtype``s,
    in chunks (a mapped array's pages are read as they are written)."""
    step = COPY_BYTES // np.dtype(dtype).itemsize
    for i in range(0, len(items), step):
        out.write(np.ascontiguousarray(items[i : i + step], dtype=dtype))


COPY_BYTES = 64 << 20  # a copy's chunk (:func:`_append_npy`, :func:`write_items`)


def _npy_header(dtype, length: int) -> bytes:
    """The header ``np.save`` writes before a one-dimensional array of ``length`` ``dtype``s."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (int(length),)})
    return buf.getvalue()


def _append_npy(out, source: Path, dtype) -> None:
    """The items of the one-dimensional ``.npy`` file ``source`` written to the open binary file
    ``out`` as ``dtype``s: its bytes copied by the kernel where ``out`` is a plain file (not an
    archive's member) of the same dtype and the system has ``copy_file_range`` (Linux), else read
    in chunks (converted where the dtypes differ)."""
    items = np.load(source, mmap_mode="r")
    if items.dtype != np.dtype(dtype):
        write_items(out, items, dtype)
        return
    start, size = items.offset, items.nbytes
    del items
    copy = getattr(os, "copy_file_range", None)
    with open(source, "rb") as f:
        if copy is not None and isinstance(out, io.BufferedWriter | io.FileIO):
            out.flush()  # (the kernel writes at the file's position, then moves it)
            done = 0
            with contextlib.suppress(OSError):  # (no copy_file_range between these files: read below)
                while done < size:
                    n = copy(f.fileno(), out.fileno(), size - done, start + done)
                    if n == 0:
                        break
                    done += n
            if done == size:
                return
            start, size = start + done, size - done
        f.seek(start)
        while size:
            chunk = f.read(min(size, COPY_BYTES))
            if not chunk:
                raise RuntimeError(f"bm25: {source} ended {size} bytes early")
            out.write(chunk)
            size -= len(chunk)
