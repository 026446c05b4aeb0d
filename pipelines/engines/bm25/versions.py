"""The saved BM25 indexes beside a table, one per table version: where they live, opening,
making (patched or built, in segments: segments.py), updating after a write, pruning and
dropping them.

The index for version ``v`` of table ``t`` in database directory ``db`` lives in
``db/_bm25/t/v<v>/`` (its files: storage.py). :func:`update_index` makes and saves it after a
write, patching the nearest earlier saved one with the documents whose content hash changed;
:func:`open_index` does so on first use where no job did. Where the database is not a local
directory, nothing is saved: each reader builds the index in memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from logicrank.pipelines.engines.bm25 import segments, storage
from logicrank.pipelines.engines.bm25.index import SOURCE_COLUMNS, BM25Index, BM25Search
from logicrank.pipelines.engines.bm25.loading import preload_kernels
from logicrank.pipelines.engines.bm25.mapped import MappedBM25

PATCH_LIMIT = 0.5  # patch while at most this share of the documents changed (a patch weighs every row, but analyzes only those)

log = logging.getLogger(__name__)


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


def open_index(store) -> BM25Search:
    """The BM25 index of the store's version, mapped for search (:class:`MappedBM25`) when
    saved; else made (:func:`save_index`: patched from the nearest earlier saved version, or
    built), saved and mapped where the database is a local directory; built in memory
    (:class:`BM25Index`) where it is not."""
    root, stamp = index_root(store), store.version_stamp()
    if root is not None:
        path = root / f"v{store.version}"
        found = MappedBM25.open(path, stamp)
        if found is None:
            save_index(store, root)
            found = MappedBM25.open(path, stamp)
        if found is not None:
            return found
    return BM25Index.build(store.scan(SOURCE_COLUMNS, batch_rows=8192, read_ahead=True), store.version, stamp=stamp)


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


def update_index(store, run: segments.Run = segments.in_process) -> dict:
    """After a write (the index job): save the latest version's index unless it is saved, and
    return what was done (for the manifest). Each step's tasks are given to ``run``
    (segments.py): one after another in this process by default, on a cluster's workers in the
    index job (jobs/index.py)."""
    root = index_root(store)
    if root is None:
        return {"how": "not saved (the database is not a local directory: each reader builds it)"}
    if storage.is_saved(root / f"v{store.version}", store.version_stamp()):
        return {"how": "current", "version": store.version}
    return save_index(store, root, run)


def save_index(store, root: Path, run: segments.Run = segments.in_process) -> dict:
    """Make and save the store version's index under ``root`` (:func:`index_root`), its files
    replacing any there: patched from the nearest saved counts of this version or an earlier one
    (:func:`segments.patch`) while at most ``PATCH_LIMIT`` of the documents are new or changed,
    else built (:func:`segments.build`); a patch that fails gives way to a build
    (``patch_failed`` in the result says why). Returns what was done."""
    version, stamps = store.version, store.version_stamps()
    path = root / f"v{version}"
    earlier = [v for v in saved_versions(root) if v <= version and v in stamps]
    done, failed = None, None
    if earlier:
        try:
            done = segments.patch(store, root / f"v{earlier[-1]}", stamps[earlier[-1]], path, run, limit=PATCH_LIMIT)
        except Exception as e:  # noqa: BLE001 (a patch that fails for any reason gives way to a build, which is whole; said in the result)
            failed = f"{type(e).__name__}: {e}"
            log.warning("bm25: the patch of %r v%s from v%s failed (%s); building it", store.name, version, earlier[-1], failed)
    if done is None:
        done = segments.build(store, path, run)
        if failed:
            done["patch_failed"] = failed
    return {**done, "version": version}


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
    for leftover in root.glob(".v*-*") if root is not None and root.is_dir() else ():  # a save a crash cut short
        if time.time() - last_written(leftover) > 3600:  # nothing written in it for an hour: no process is making it
            shutil.rmtree(leftover, ignore_errors=True)
    return gone


def last_written(path: Path) -> float:
    """The newest modification time of ``path`` and everything under it (a build in progress
    writes into its segments' subdirectories, not the top one); now where it is being removed."""
    newest = 0.0
    try:
        for top, _dirs, files in os.walk(path):
            for name in (top, *(os.path.join(top, f) for f in files)):
                newest = max(newest, os.stat(name).st_mtime)
    except OSError:  # removed meanwhile: whoever removes it is done with it
        return time.time()
    return newest


def drop_indexes(store) -> None:
    """Remove every saved index of the store's table, the vectors too (the table itself was dropped)."""
    from logicrank.pipelines.engines import vectors

    vectors.drop(store)
    root = index_root(store)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
