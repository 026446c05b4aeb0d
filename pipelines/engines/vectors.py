"""The dense engine's operand, saved beside the table and mapped by every process that searches.

For version ``v`` of table ``t`` in database directory ``db``, ``db/_vectors/t/v<v>/`` holds the
version's unit vectors as one ``(n, dim)`` ``.npy`` per precision (``float32``, or ``float16``:
half the bytes, its recall measured in docs/bulk-retrieval.md), the tie-break ranks (each row's
position when doc ids sort descending: the run order's tie break) and the doc ids as an Arrow
IPC file. A search maps them (``np.load(mmap_mode="r")``, an Arrow memory map): the processes
of one node share one copy in the page cache, and a process that searches one shard (a range of
rows) touches only that range. The files are written once per version and precision, into a
temporary sibling renamed into place (two writers leave one whole copy), and pruned with the
table's versions (:func:`logicrank.pipelines.engines.bm25.prune_indexes` calls :func:`prune`). A database that
is not a local directory keeps nothing: each reader reads the vectors into memory.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PRECISIONS = ("float32", "float16")
FORMAT = 1
# The code saved vectors come from (each definition's code, docstrings aside): the unit vectors in their precision, the
# tie-break ranks and the save's layout. A save records its digest (:func:`code_digest`), so files an earlier release
# computed otherwise are written again, never mapped as this code's (BM25's ``storage.WEIGHTING`` does the same).
CODE = ("tiebreak_ranks", "_rows", "_save")


@dataclass(frozen=True)
class Vectors:
    """One version's unit vectors (rows in table order), their doc ids and tie-break ranks."""

    ids: pa.Array  # doc_id per row
    matrix: np.ndarray  # (n, dim) unit vectors, float32 or float16; mapped where saved
    tiebreak: np.ndarray  # int64 per row: its position when doc ids sort descending
    path: Path | None = None  # where they are mapped from (None: in memory)
    save_id: str = ""  # which save of ``path`` (a table dropped and made again reuses the path)

    def __len__(self) -> int:
        return len(self.tiebreak)

    def nbytes(self) -> int:
        """Bytes a whole search touches (mapped: one copy per node in the page cache)."""
        return int(self.matrix.nbytes + self.tiebreak.nbytes + self.ids.nbytes)

    def own_bytes(self) -> int:
        """Bytes this process holds of its own: none where mapped."""
        return 0 if self.path is not None else self.nbytes()


def tiebreak_ranks(ids: pa.Array) -> np.ndarray:
    """Per row its position when the ids sort descending (Arrow sorts strings by their UTF-8
    bytes, which is code point order, as the run order compares ids)."""
    order = pc.array_sort_indices(ids, order="descending").to_numpy()
    rank = np.empty(len(ids), np.int64)
    rank[order] = np.arange(len(ids))
    return rank


@functools.cache
def code_digest() -> str:
    """The digest of the :data:`CODE` definitions' code, read from this file."""
    from logicrank.pipelines.codedigest import definitions_digest

    return definitions_digest({Path(__file__): CODE}, "dense: vectors.CODE")


def root(store) -> Path | None:
    """``<db>/_vectors/<table>``, or None where the database is not a local directory."""
    uri = str(store.uri)
    if "://" in uri and not uri.startswith("file://"):
        return None
    return Path(uri.removeprefix("file://")) / "_vectors" / store.name


def open_vectors(store, precision: str = "float32") -> Vectors:
    """The store version's vectors, mapped from their saved files (written first where missing,
    where the database is local), else read into memory."""
    if precision not in PRECISIONS:
        raise ValueError(f"dense: precision must be one of {PRECISIONS}, got {precision!r}")
    where = root(store)
    if where is None:
        return _read(store, precision)
    path, stamp = where / f"v{store.version}", store.version_stamp()
    found = _open(path, precision, stamp)
    if found is None:
        try:
            _save(store, path, precision, stamp)
        except OSError:  # a database directory this process cannot write (read-only, full): read into memory instead
            return _read(store, precision)
        found = _open(path, precision, stamp)
    if found is None:
        raise RuntimeError(f"dense: the vectors saved in {path} cannot be read back")
    return found


def ensure_vectors(store, precision: str = "float32") -> None:
    """Save the store version's vectors unless saved (a job's driver, before its actors map them)."""
    if root(store) is not None:
        open_vectors(store, precision)


def _rows(store, precision: str):
    """(ids, unit vectors in ``precision``) blocks of the whole table, streamed."""
    for block_ids, block in store.vector_blocks():
        norms = np.linalg.norm(block, axis=1, keepdims=True)
        yield block_ids, (block / np.where(norms > 0, norms, 1)).astype(precision)


def _read(store, precision: str) -> Vectors:
    n = store.count()
    m = np.empty((n, store.dim), precision)
    ids, at = [], 0
    for block_ids, block in _rows(store, precision):
        m[at : at + len(block)] = block
        ids.append(pa.array(block_ids, pa.string()))
        at += len(block)
    ids = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
    return Vectors(ids, m[:at], tiebreak_ranks(ids))


def _save(store, path: Path, precision: str, stamp: str) -> None:
    """Write the version's vectors in ``precision`` (streamed into a mapped file: one block in
    memory at a time), the ids and the tie-break, then move them into ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{precision}-", dir=path))
    try:
        n = store.count()
        m = np.lib.format.open_memmap(tmp / "vectors.npy", mode="w+", dtype=precision, shape=(n, store.dim))
        ids, at = [], 0
        for block_ids, block in _rows(store, precision):
            if at + len(block) > n:
                raise RuntimeError(f"dense: the table's version {store.version} grew while its vectors were read (a bug)")
            m[at : at + len(block)] = block
            ids.append(pa.array(block_ids, pa.string()))
            at += len(block)
        m.flush()
        del m
        if at != n:
            raise RuntimeError(f"dense: read {at} vectors of the {n} rows of version {store.version} (a bug)")
        ids = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
        np.save(tmp / "tiebreak.npy", tiebreak_ranks(ids))
        save_id = uuid.uuid4().hex
        table = pa.table({"doc_id": ids}).replace_schema_metadata({b"logicrank.save_id": save_id.encode()})
        with pa.OSFile(str(tmp / "doc_ids.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "version": store.version, "stamp": stamp, "save_id": save_id,
                                                   "rows": n, "dim": store.dim, "precision": precision, "code": code_digest()}))
        target = path / precision
        if _open(path, precision, stamp) is not None:
            return  # another process saved it meanwhile
        if target.exists():  # damaged or another table's: moved aside, then replaced
            aside = Path(tempfile.mkdtemp(prefix=f".{precision}-old-", dir=path))
            with contextlib.suppress(OSError):
                os.replace(target, aside / "old")
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if _open(path, precision, stamp) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _open(path: Path, precision: str, stamp: str | None) -> Vectors | None:
    """The saved vectors mapped; None when absent, partial, damaged, another table's or made by
    other code (:func:`code_digest`)."""
    where = path / precision
    try:
        meta = json.loads((where / "meta.json").read_text())
        if (meta.get("format") != FORMAT or meta.get("precision") != precision or (stamp is not None and meta.get("stamp") != stamp)
                or meta.get("code") != code_digest()):
            return None
        matrix = np.load(where / "vectors.npy", mmap_mode="r")
        tiebreak = np.load(where / "tiebreak.npy", mmap_mode="r")
        table = pa.ipc.open_file(pa.memory_map(str(where / "doc_ids.arrow"))).read_all()
        ok = (matrix.shape == (meta["rows"], meta["dim"]) and matrix.dtype == np.dtype(precision) and len(tiebreak) == table.num_rows == meta["rows"]
              and (table.schema.metadata or {}).get(b"logicrank.save_id", b"").decode() == meta["save_id"])
        if not ok:
            return None
    except Exception:  # noqa: BLE001 (whatever a damaged file raises): written again
        return None
    ids = table.column("doc_id")
    ids = ids.chunk(0) if ids.num_chunks == 1 else ids.combine_chunks()  # one chunk: the mapped file's, not a copy
    return Vectors(ids, matrix, tiebreak, where, meta["save_id"])


def prune(store, keep_versions) -> None:
    """Remove the saved vectors of versions the table no longer keeps (and any save a crash cut
    short, an hour old)."""
    where = root(store)
    if where is None or not where.is_dir():
        return
    keep = set(keep_versions)
    import time

    for p in where.iterdir():
        if p.is_dir() and re.fullmatch(r"v\d+", p.name) and int(p.name[1:]) not in keep:
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_dir():
            for leftover in p.glob(".*-*"):
                if time.time() - leftover.stat().st_mtime > 3600:
                    shutil.rmtree(leftover, ignore_errors=True)


def drop(store) -> None:
    """Remove every saved version's vectors of the store's table (the table was dropped)."""
    where = root(store)
    if where is not None:
        shutil.rmtree(where, ignore_errors=True)
