"""The saved BM25 indexes beside a table, one per table version: where they live, opening,
making (patched or built), updating after a write, pruning and dropping them.

The index for version ``v`` of table ``t`` in database directory ``db`` lives in
``db/_bm25/t/v<v>/`` (its files: storage.py); :func:`open_index` builds it on first use (and
saves it, where the database is a local directory), and :func:`update_index` makes the next
version's by patching the nearest earlier one with the documents whose content hash changed.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.engines.bm25 import segments, storage
from logicrank.pipelines.engines.bm25.index import SOURCE_COLUMNS, BM25Index, BM25Search
from logicrank.pipelines.engines.bm25.loading import preload_kernels
from logicrank.pipelines.engines.bm25.mapped import MappedBM25

PATCH_LIMIT = 0.5  # patch while at most this share of the documents changed (measured: docs/bulk-retrieval.md)


def index_root(store) -> Path | None:
    """``<db>/_bm25/<table>``, or None where the database is not a local directory."""
    uri = str(store.uri)
    if "://" in uri and not uri.startswith("file://"):
        return None
    return Path(uri.removeprefix("file://")) / "_bm25" / store.name


def saved_versions(root: Path | None) -> list[int]:
    """The table versions whose index is saved under ``root`` (:func:`index_root`), ascending."""
    if root is None or not root.is_dir():
        return []
    return sorted(int(p.name[1:]) for p in root.iterdir() if p.is_dir() and re.fullmatch(r"v\d+", p.name))


def open_index(store, save: bool = True) -> BM25Search:
    """The BM25 index of the store's version, mapped for search (:class:`MappedBM25`) when
    saved; else made (patched from the nearest earlier saved version, or built), saved where
    the database is local and mapped; in memory (:class:`BM25Index`) where it is not."""
    version, root, stamp = store.version, index_root(store), store.version_stamp()
    if root is not None:
        found = MappedBM25.open(root / f"v{version}", stamp)
        if found is not None:
            return found
    index, _ = make_index(store, root)
    if save and root is not None:
        index.save(root / f"v{version}")
        mapped = MappedBM25.open(root / f"v{version}", stamp)
        if mapped is not None:
            return mapped
    return index


def ensure_index(store) -> None:
    """Make and save the store version's index unless it is saved (a job's driver, before its
    actors open it); where the database is not local, each reader builds its own."""
    preload_kernels()  # numba's start-up overlaps the job's (Ray's start) rather than its first search
    if index_root(store) is not None:
        index = store.bm25_index()  # made and saved unless it is; opened (a few memory maps) for the driver's stages, it loads its search loop meanwhile
        if isinstance(index, MappedBM25):  # the driver analyzes the queries: its vocabulary read meanwhile too (a shard actor never reads it)
            threading.Thread(target=_read_vocabulary, args=(index,), name="bm25-vocabulary", daemon=True).start()


def _read_vocabulary(index: MappedBM25) -> None:
    with contextlib.suppress(Exception):  # a damaged file: the search that needs it raises, whole, in its own thread
        _ = index.vocab


def make_index(store, root: Path | None = None) -> tuple[BM25Index, dict]:
    """Make the store version's index in memory: patch the nearest earlier saved version when it
    shares most documents, else build from a scan. Returns it and what was done."""
    patched = _patched(store, root)
    if patched is not None:
        return patched
    index = BM25Index.build(store.scan(SOURCE_COLUMNS, batch_rows=8192, read_ahead=True), store.version, stamp=store.version_stamp())
    return index, {"how": "built", "analyzed": len(index)}


def _patched(store, root: Path | None) -> tuple[BM25Index, dict] | None:
    """The store version's index patched from the nearest earlier saved counts (an earlier
    version's, or this version's own where its search files are of an older format or damaged),
    when they share most documents; else None."""
    version, stamps = store.version, store.version_stamps()
    earlier = [v for v in saved_versions(root) if v <= version and v in stamps]
    base = BM25Index.load(root / f"v{earlier[-1]}", stamps[earlier[-1]]) if earlier else None
    if base is None:
        return None
    stored = store.hashes()
    changed = len(stored) - int(pc.sum(pc.is_in(stored.column("content_hash"), value_set=pa.array(base.hashes, pa.string()))).as_py() or 0)
    if changed > PATCH_LIMIT * max(1, len(stored)):
        return None
    index, counts = base.patched(stored, lambda ids: store.rows_for(ids, SOURCE_COLUMNS[1:]), version, stamps[version])
    return index, {"how": "patched", "from_version": base.version, **counts}


def update_index(store, run: segments.Run = segments.in_process) -> dict:
    """After a write (the index job): save the latest version's index and return what was done
    (for the manifest). Patched from an earlier version's where it applies (one task: it holds
    that version's counts), else built in segments (segments.py), each step's tasks given to
    ``run``: one after another in this process by default, on a cluster's workers in the index
    job (jobs/index.py)."""
    root = index_root(store)
    if root is None:
        return {"how": "not saved (the database is not a local directory: each reader builds it)"}
    path = root / f"v{store.version}"
    if storage.is_saved(path, store.version_stamp()):
        return {"how": "current", "version": store.version}
    (done,) = run(patch_saved, [(segments.opener(store),)])
    if done is None:
        done = segments.build(store, path, run)
        done["docs"] = done["analyzed"]
    return {**done, "version": store.version}


def patch_saved(table) -> dict | None:
    """A task of :func:`update_index`: the index of the table version ``table()`` opens, patched
    from the nearest earlier saved one and saved, with what was done; None when no earlier index
    applies (it is built)."""
    store = table()
    root = index_root(store)
    patched = _patched(store, root)
    if patched is None:
        return None
    index, done = patched
    index.save(root / f"v{store.version}")
    return {**done, "docs": len(index), "terms": len(index.vocab)}


def prune_indexes(store, keep_versions: Iterable[int]) -> list[int]:
    """Remove the saved indexes (BM25's, and the dense engine's vectors: pipelines/engines/vectors.py)
    of versions the table no longer keeps; returns the BM25 versions removed."""
    from logicrank.pipelines.engines import vectors

    root = index_root(store)
    keep = set(keep_versions)
    vectors.prune(store, keep)
    gone = [v for v in saved_versions(root) if v not in keep]
    for v in gone:
        shutil.rmtree(root / f"v{v}", ignore_errors=True)
    for leftover in root.glob(".v*-*") if root is not None and root.is_dir() else ():  # a save a crash cut short (an hour old)
        if time.time() - leftover.stat().st_mtime > 3600:
            shutil.rmtree(leftover, ignore_errors=True)
    return gone


def drop_indexes(store) -> None:
    """Remove every saved index of the store's table, the vectors too (the table itself was dropped)."""
    from logicrank.pipelines.engines import vectors

    vectors.drop(store)
    root = index_root(store)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
