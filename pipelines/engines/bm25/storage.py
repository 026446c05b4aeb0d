"""One saved BM25 index on disk: its format, its files, writing them and reading them back.

A saved index is a directory (versions.py names one per table version) holding:

* ``meta.json``: the format (:data:`FORMAT`), the analyzer's digest
  (:func:`~.analyzer.analyzer_digest`), the weighting's (:func:`weighting_digest`), the
  counting's (:func:`counting_digest`), the table version and its stamp, the save's id, the
  counts of documents and terms, the documents per segment, each field's postings (``nnz``:
  a counts file of another save is told by it);
* the term counts, which a patch reads: ``title.npz`` and ``text.npz`` (documents x terms,
  CSR), ``docs.parquet`` (doc id and content hash per row), ``vocab.parquet`` (the terms), and
  ``stats.npz``, each field's statistics over every row (:func:`write_stats`: a patch takes the
  dropped rows' from them instead of counting the kept ones; an index saved without it is
  patched all the same);
* ``search/``, what a search maps (:class:`~logicrank.pipelines.engines.bm25.mapped.MappedBM25`): the
  weights in segments of :data:`SEGMENT_ROWS` documents (:func:`segmented`), the idf, the
  tie-break ranks and their inverse as ``.npy``, the doc ids as an Arrow IPC file.

Every file carries the save's id, so that a reader never mixes the files of two saves; a save
writes into a temporary sibling and renames it into place. A reader that finds an index absent,
partial, damaged, of another format, analyzer, counting or weighting, or of another table
(its stamp) gets None and rebuilds it (weights of another weighting alone are weighed again
from the counts).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import tempfile
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from logicrank.pipelines.codedigest import definitions_digest
from logicrank.pipelines.engines.bm25 import loading
from logicrank.pipelines.engines.bm25.analyzer import analyzer_digest

FORMAT = 3  # the on-disk layout; an index of another format is rebuilt (2: the mapped search files; 3: in segments of documents)
COUNTS_FORMATS = (2, 3)  # the formats whose term counts a patch reads (formats 2 and 3 store them alike; of this counting's digest)
SEGMENT_ROWS = 1 << 19  # documents per segment of a saved index (:func:`segmented`): a shard reads only its segments


def segmented(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, docs: int, seg_rows: int,
              out_indices: np.ndarray, out_data: np.ndarray) -> np.ndarray:
    """A terms x documents CSR (postings sorted by row) laid out segment by segment: segment
    ``s`` holds the postings of rows ``[s * seg_rows, (s + 1) * seg_rows)``, term by term, in
    ``out_indices`` / ``out_data`` (as long as ``indices``; arrays or memory maps). Returns the
    layout's indptr, ``(segments, terms + 1)``: term ``t``'s postings in segment ``s`` are
    ``[indptr[s, t], indptr[s, t + 1])``. A process that searches one range of documents then
    reads only its segments' bytes (mapped.py)."""
    n_seg = max(1, -(-docs // seg_rows))
    kern = loading.kernels()
    at = kern.segment_starts(np.asarray(indptr, np.int64), indices, seg_rows, n_seg)
    rows, offset = [], 0
    for seg in range(n_seg):
        rows.append(kern.segment_copy(indices, data, at, seg, out_indices, out_data, offset))
        offset = int(rows[-1][-1])
    return np.stack(rows)


def write_index(index, path: Path) -> Path:
    """Write ``index`` (an in-memory :class:`~logicrank.pipelines.engines.bm25.index.BM25Index`) to
    directory ``path``: into a temporary sibling, then renamed into place. Where another process
    saved a valid index there meanwhile, that one stands."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        for name, m in (("title", index.title), ("text", index.text)):
            sp.save_npz(tmp / f"{name}.npz", m, compressed=False)
        save_id = uuid.uuid4().hex  # in every file: a load never mixes the files of two saves
        meta = {b"logicrank.save_id": save_id.encode()}
        write_docs(pa.table({"doc_id": pa.array(index.doc_ids, pa.string()), "content_hash": pa.array(index.hashes, pa.string())})
                   .replace_schema_metadata(meta), tmp / "docs.parquet")
        pq.write_table(pa.table({"term": pa.array(index.vocab.terms, pa.string())}).replace_schema_metadata(meta), tmp / "vocab.parquet")
        _write_search(index, tmp / "search", meta)
        write_stats(tmp, index.field_stats(), save_id)
        write_meta(tmp, index.version, index.stamp, save_id, len(index), len(index.vocab), analyzer=getattr(index, "analyzer", None))
        place(tmp, path, index.stamp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


STATS_KEYS = tuple(f"{field}_{k}" for field in ("title", "text") for k in ("df", "docs", "tokens"))


def write_stats(tmp: Path, stats: dict[str, np.ndarray], save_id: str) -> None:
    """The saved index's ``stats.npz``: each field's statistics over all its rows (:data:`STATS_KEYS`,
    :func:`~.index.field_stats`), with the save's id."""
    np.savez(tmp / "stats.npz", save_id=np.array(save_id), **{k: stats[k] for k in STATS_KEYS})


def read_stats(path: Path, meta: dict) -> dict[str, np.ndarray] | None:
    """The statistics saved with the index in ``path`` whose meta is ``meta``; None where there
    are none (saved before they were), or they are damaged or another save's."""
    try:
        with np.load(Path(path) / "stats.npz") as z:
            stats = {k: z[k] for k in STATS_KEYS}
            save_id = str(z["save_id"])
    except Exception:  # noqa: BLE001 (absent, or whatever a damaged file raises): the kept rows are counted instead
        return None
    whole = all(stats[f"{f}_df"].shape == (meta["terms"],) and stats[f"{f}_df"].dtype == np.int64 for f in ("title", "text"))
    return stats if whole and save_id == meta["save_id"] else None


def write_meta(tmp: Path, version: int, stamp: str, save_id: str, docs: int, terms: int, segment_rows: int | None = None,
               analyzer: str | None = None) -> None:
    """The saved index's meta.json (the module doc), written last: a directory without it is no index. ``analyzer``: the
    digest of the analyzer that made its terms (default: the project's). The term counts' postings per field, read
    from the counts already written in ``tmp`` (their headers), are recorded: a counts file of another save (of the
    same shape) is told apart by them."""
    nnz = {field: len(map_counts(tmp, field)[1]) for field in ("title", "text")}
    (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "analyzer": analyzer or analyzer_digest(), "weighting": weighting_digest(),
                                               "counting": counting_digest(), "version": version, "stamp": stamp, "save_id": save_id,
                                               "docs": docs, "terms": terms, "segment_rows": segment_rows or SEGMENT_ROWS, "nnz": nnz}))


# The code a saved index's weights come from: BM25's parameters, the statistics (of a build's segments, of a patch's
# kept and dropped rows, combined), the formula and the compiled passes that write it (each definition's code, its
# docstring and comments aside). A saved index records its digest, so weights an earlier release computed otherwise
# are made again from its counts, never searched as this code's. What it covers is this list, no more: a definition
# the weights come to depend on is added here, one renamed is renamed here (a name not found is an error, and
# tests/unit/test_bm25.py checks each one).
WEIGHTING = {
    "index.py": ("K1", "row_sums", "field_stats", "idf_of", "weigh", "tiebreak_ranks", "BM25Index.field_stats", "BM25Index.stats",
                 "BM25Index.weights"),
    "kernels.py": ("_next_term", "weight_layout", "weight_postings"),
    "segments.py": ("analyze_segment", "count_kept", "count_dropped", "merge_segments", "weigh_segment", "_piece_counts", "_saved_rows",
                    "row_postings"),
}


# The code a saved index's term counts come from besides the analyzer (whose digest is apart): the counting of a batch's
# terms, the vocabulary's numbering, the rows a build or a patch reads and keeps, and the counts' files written. A saved
# index records its digest; counts other code made are neither searched nor patched: the index is built again. Kept as
# WEIGHTING is (tests/unit/test_bm25.py checks each name).
COUNTING = {
    "index.py": ("field_counts", "_words_and_term", "first_appearance", "_widen", "BM25Index.__init__", "BM25Index.build"),
    "segments.py": ("ranges", "build", "patch", "plan_patch", "_repeated", "analyze_segment", "_read_rows", "_stack", "merge_segments",
                    "weigh_segment", "_piece_counts", "_saved_rows", "row_postings", "assemble", "_piece_postings", "write_counts",
                    "write_items", "_npy_header", "_append_npy"),
    "storage.py": ("write_index", "map_counts", "read_counts"),
}


def _definitions_digest(table: dict[str, tuple[str, ...]], label: str) -> str:
    """The digest of ``table``'s definitions (file in this package -> names), :func:`~logicrank.pipelines.codedigest.definitions_digest`."""
    return definitions_digest({Path(__file__).with_name(file): names for file, names in table.items()}, f"bm25: storage.{label}")


@functools.cache
def weighting_digest() -> str:
    """The digest of the :data:`WEIGHTING` definitions' code."""
    return _definitions_digest(WEIGHTING, "WEIGHTING")


@functools.cache
def counting_digest() -> str:
    """The digest of the :data:`COUNTING` definitions' code."""
    return _definitions_digest(COUNTING, "COUNTING")


def place(tmp: Path, path: Path, stamp: str) -> None:
    """A whole index written in ``tmp`` (a sibling of ``path``) renamed into place. Where another
    process saved a valid index there meanwhile, that one stands (``tmp`` is left to the caller).
    The rename is tried first: a whole index another process renamed in after a check that
    found none would otherwise be moved aside and deleted under its readers."""
    try:
        os.rename(tmp, path)  # atomic where nothing is there; refused where something is
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if is_whole(path, stamp):
        return
    if path.exists():  # damaged or another table's: moved aside, then replaced
        aside = Path(tempfile.mkdtemp(prefix=f".{path.name}-old-", dir=path.parent))
        with contextlib.suppress(OSError):  # (another process moved it first)
            os.replace(path, aside / "old")
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.replace(tmp, path)
    except OSError:  # another process saved this version meanwhile: theirs stands
        if not is_whole(path, stamp):
            raise


def write_docs(docs: pa.Table, path: Path) -> None:
    """The saved index's ``docs.parquet`` (doc id and content hash per row): uncompressed,
    without dictionaries (ids and hashes are unique): a patch's plan reads it whole, in about half
    the time of Parquet's default compression, for two thirds more bytes on disk."""
    pq.write_table(docs, path, compression="none", use_dictionary=False)


def write_doc_ids(path: Path, doc_ids: pa.Array, meta: dict) -> None:
    """The doc ids as an Arrow IPC file of one record batch (mapped as one array, not copied)."""
    ids = pa.table({"doc_id": doc_ids}).replace_schema_metadata(meta)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, ids.schema) as writer:
        writer.write_table(ids)


def _write_search(index, path: Path, meta: dict) -> None:
    """What a search maps (mapped.py): the weights in segments of
    ``SEGMENT_ROWS`` documents (:func:`segmented`, written through memory maps), the idf, the
    tie-break ranks and their inverse as ``.npy``, the doc ids as an Arrow IPC file."""
    path.mkdir()
    indptr, indices, data = index.postings()
    out_indices = np.lib.format.open_memmap(path / "indices.npy", "w+", np.int32, (len(indices),))
    out_data = np.lib.format.open_memmap(path / "data.npy", "w+", np.float32, (len(data),))
    layout = segmented(indptr, indices, data, len(index), SEGMENT_ROWS, out_indices, out_data)
    out_indices.flush()
    out_data.flush()
    del out_indices, out_data
    rank, rows = index.tiebreak(), index.rows_by_rank()
    for name, a in (("indptr", layout), ("idf", index.idf().astype(np.float64, copy=False)), ("tiebreak", rank), ("rows_by_rank", rows)):
        np.save(path / f"{name}.npy", np.ascontiguousarray(a))
    write_doc_ids(path / "doc_ids.arrow", index.doc_id_array(), meta)


def read_counts(path: Path, stamp: str | None = None) -> tuple[dict, pa.Table, sp.csr_matrix, sp.csr_matrix, pa.Table] | None:
    """The term counts saved in ``path`` (of any of :data:`COUNTS_FORMATS`): its meta, its
    documents (doc id, content hash), the title and text counts and its terms; None when they are
    absent, partial, damaged, of another format, or (with ``stamp``) of another table that had
    the same name and version."""
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
        if not of_this(meta, stamp, COUNTS_FORMATS, weights=False):
            return None
        docs = pq.read_table(path / "docs.parquet")
        terms = pq.read_table(path / "vocab.parquet")
        ids = {(t.schema.metadata or {}).get(b"logicrank.save_id", b"").decode() for t in (docs, terms)}
        title, text = (sp.load_npz(path / f"{n}.npz").tocsr() for n in ("title", "text"))
        shapes_ok = all(m.shape == (meta["docs"], meta["terms"]) and m.nnz == meta["nnz"][n] for n, m in (("title", title), ("text", text)))
        if ids != {meta["save_id"]} or docs.num_rows != meta["docs"] or terms.num_rows != meta["terms"] or not shapes_ok:
            return None
    except Exception:  # noqa: BLE001 (whatever a damaged file raises: zipfile, pickle, Arrow, JSON): rebuilt
        return None
    return meta, docs, title, text, terms


def counts_meta(path: Path, stamp: str | None = None) -> dict | None:
    """The meta of the index saved in ``path`` when its term counts (of any of
    :data:`COUNTS_FORMATS`) are whole by their headers: the files' save ids, the rows of its
    tables, the shapes and lengths of its arrays. Their data is not read (a patch reads only the
    rows it keeps, :func:`map_counts`). None when they are absent, partial, damaged, of another
    format, or (with ``stamp``) of another table that had the same name and version."""
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
        if not of_this(meta, stamp, COUNTS_FORMATS, weights=False):
            return None
        docs, terms = int(meta["docs"]), int(meta["terms"])
        for name, rows in (("docs.parquet", docs), ("vocab.parquet", terms)):
            f = pq.ParquetFile(path / name)
            if f.metadata.num_rows != rows or (f.schema_arrow.metadata or {}).get(b"logicrank.save_id", b"").decode() != meta["save_id"]:
                return None
        for field in ("title", "text"):
            indptr, indices, data, shape = map_counts(path, field)
            if shape != (docs, terms) or len(indptr) != docs + 1 or not len(indices) == len(data) == int(indptr[-1]) == meta["nnz"][field]:
                return None
    except Exception:  # noqa: BLE001 (whatever a damaged file raises: zipfile, Arrow, JSON, a map past the file's end)
        return None
    return meta


def map_counts(path: Path, field: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """One field's saved counts (``<field>.npz``, documents x terms CSR) as its CSR arrays
    (indptr, indices, data) and shape, each array a memory map of its member of the archive
    (stored uncompressed, as the index writes it): a patch reads only the rows it keeps. A
    member stored compressed is read whole."""
    target = Path(path) / f"{field}.npz"
    out = {}
    with zipfile.ZipFile(target) as z, open(target, "rb") as f:
        for name in ("indptr", "indices", "data", "shape"):
            info = z.getinfo(f"{name}.npy")
            f.seek(info.header_offset)
            local = f.read(30)  # the member's local header: its name's and extra field's lengths at 26 and 28
            member = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
            f.seek(member)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(
                np.lib.format.read_magic(f) if info.compress_type == zipfile.ZIP_STORED else None)
            shape, fortran, dtype = read_header(f) if read_header else ((), True, None)
            if fortran or not int(np.prod(shape)):  # compressed, another header, or empty: read whole
                with z.open(info) as member:
                    out[name] = np.lib.format.read_array(member)
                continue
            start = f.tell()
            if start - member + int(np.prod(shape)) * dtype.itemsize != info.file_size:  # the header's shape against the member's size
                raise ValueError(f"bm25: {target}'s {name} holds {info.file_size} bytes, not the {shape} its header says")
            out[name] = np.memmap(target, dtype=dtype, mode="r", offset=start, shape=shape)
    return out["indptr"], out["indices"], out["data"], tuple(int(x) for x in out["shape"])


def map_search_files(path: Path, stamp: str | None = None) -> tuple[dict, dict[str, np.ndarray], pa.Array] | None:
    """The search files of the index saved in ``path``, mapped: its meta, its arrays (memory
    maps) and its doc ids (an Arrow memory map); None when it is absent, partial, damaged, of
    another format or (with ``stamp``) of another table of the same name."""
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
        if not of_this(meta, stamp):
            return None
        arrays = {name: np.load(path / "search" / f"{name}.npy", mmap_mode="r")
                  for name in ("indptr", "indices", "data", "idf", "tiebreak", "rows_by_rank")}
        reader = pa.ipc.open_file(pa.memory_map(str(path / "search" / "doc_ids.arrow")))
        table = reader.read_all()
        docs, terms = meta["docs"], meta["terms"]
        indptr, seg_rows = arrays["indptr"], int(meta["segment_rows"])
        ends = (np.asarray(indptr[:, 0]), np.asarray(indptr[:, -1]))  # each segment's first and last offsets: contiguous, in order
        ok = (indptr.shape == (max(1, -(-docs // seg_rows)), terms + 1) and len(arrays["idf"]) == terms
              and int(ends[0][0]) == 0 and bool((ends[0][1:] == ends[1][:-1]).all()) and bool((ends[1] >= ends[0]).all())
              and int(indptr[-1, -1]) == len(arrays["indices"]) == len(arrays["data"])
              and len(arrays["tiebreak"]) == len(arrays["rows_by_rank"]) == table.num_rows == docs
              and (table.schema.metadata or {}).get(b"logicrank.save_id", b"").decode() == meta["save_id"])
        for name in ("title", "text"):  # the counts a patch reads: their zip directories, not their data
            with zipfile.ZipFile(path / f"{name}.npz") as z:
                ok = ok and bool(z.namelist())
        if not ok:
            return None
    except Exception:  # noqa: BLE001 (whatever a damaged file raises): rebuilt
        return None
    ids = table.column("doc_id")
    return meta, arrays, ids.chunk(0) if ids.num_chunks == 1 else ids.combine_chunks()  # one chunk: mapped, not copied


def is_whole(path: Path, stamp: str) -> bool:
    """Whether ``path`` holds a whole saved index of this table version: its search files
    consistent and its counts' files readable (their zip directories; not their data, which
    a patch reads: a re-index would otherwise read the whole index once more to check it)."""
    return map_search_files(path, stamp) is not None


def is_saved(path: Path, stamp: str) -> bool:
    """Whether ``path`` holds a saved index of this format and table version, by its meta.json
    alone (a reader that finds its files damaged rebuilds them: versions.py's :func:`open_index`)."""
    try:
        meta = json.loads((Path(path) / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return of_this(meta, stamp)


def of_this(meta: dict, stamp: str | None, formats: tuple[int, ...] = (FORMAT,), weights: bool = True) -> bool:
    """Whether a saved index's meta is of one of ``formats``, of this analyzer
    (:func:`~.analyzer.analyzer_digest`: an index whose terms another analyzer made is rebuilt),
    with ``weights``, of this weighting (:func:`weighting_digest`: weights other code computed
    are not searched; the term counts beside them, which no weighting changes, are weighed
    again by a patch) and (with ``stamp``) of this table version."""
    return (meta.get("format") in formats and meta.get("analyzer") == analyzer_digest() and meta.get("counting") == counting_digest()
            and (not weights or meta.get("weighting") == weighting_digest()) and (stamp is None or meta.get("stamp") == stamp))
