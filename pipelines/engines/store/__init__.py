"""LanceDB document store: upsert by content hash, delete, search, versions and tags.

One committer per table (LanceDB commits conflict under concurrent writers): the index job
funnels every commit through one :class:`DocStore`. New documents are appended (rows written
here, or data files its encoder workers wrote, committed here), changed ones replaced keyed by
``doc_id`` in one commit (:meth:`DocStore.upsert`: the stored rows deleted, the new ones added, as
LanceDB's ``merge_insert`` commits them); the job appends only ids absent from the version it
started from and kept once per run, so a run repeated after a crash never duplicates a row.
No user text is ever pasted into a LanceDB filter string (the upsert looks ids up with an
Arrow expression and deletes rows by their offsets).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from logicrank.pipelines.engines.bm25 import ENGLISH_STOP_WORDS
from logicrank.pipelines.engines.store.base import StoreError, TableHandle
from logicrank.pipelines.engines.store.reading import Reading
from logicrank.pipelines.engines.store.versions import Versions
from logicrank.pipelines.engines.store.writing import Writing

__all__ = ["APART_FROM_ROWS", "ENGLISH_STOP_WORDS", "DocStore", "StoreError", "json_value", "maintain_apart", "update_index_apart"]


class DocStore(Reading, Writing, Versions, TableHandle):
    """A LanceDB table of documents (the ``docs`` contract), in parts: reading
    (pipelines/engines/store/reading.py), writing (writing.py), versions (versions.py), over one table
    handle (base.py)."""


# below this many rows the BM25 index is made, and the table maintained, in the caller: a build
# or patch holds about 2 KiB a document of passage length (20 GiB at 10M, docs/bulk-retrieval.md),
# LanceDB's compaction and full-text index builds hold about 0.3 KiB a document (3.2 GiB at 10M),
# about 100 MiB here, and a child's start-up (a fresh interpreter importing logicrank, LanceDB
# and numba: about 2 s on 2 cores) is most of a small table's time. Rows, not bytes: a table of
# long documents holds more per row.
APART_FROM_ROWS = 50_000


def update_index_apart(store: DocStore, apart_from_rows: int = APART_FROM_ROWS) -> dict:
    """:func:`logicrank.pipelines.engines.bm25.update_index` in a child process (a fresh interpreter,
    pipelines/engines/store/apart.py) for a table of ``apart_from_rows`` rows or more: the index
    job's driver stays small whatever the corpus (a build's or a patch's steps hold a segment's
    counts and weights at a time, and the plan and the assembly every id and hash:
    docs/bulk-retrieval.md). A smaller table's index is made here. The result is what the
    child prints: plain JSON values."""
    if store.count() < apart_from_rows:
        from logicrank.pipelines.engines.bm25 import update_index

        return _plain(update_index(store))
    return _apart(store, "bm25", {"version": store.version}, "saving the BM25 index")


def maintain_apart(store: DocStore, ann_threshold: int | None, prune_older_than: timedelta, changed: bool = True,
                   rebuild: bool = False, apart_from_rows: int = APART_FROM_ROWS) -> dict:
    """:meth:`DocStore.maintain <logicrank.pipelines.engines.store.writing.Writing.maintain>` in a
    child process for a table of ``apart_from_rows`` rows or more (here below): LanceDB's
    compaction and full-text index builds run in the process that calls them and keep what they
    held there (3.2 GiB in the index job's driver at 10M documents), so the driver stays small
    whatever the corpus. The caller's ``store`` then follows the version the child made. The
    caller holds the table's write lock; the child writes under it, as the caller would."""
    args = {"ann_threshold": ann_threshold, "prune_seconds": prune_older_than.total_seconds(), "changed": changed, "rebuild": rebuild}
    if store.count() < apart_from_rows:
        return _plain(store.maintain(ann_threshold, prune_older_than, changed, rebuild))
    try:
        result = _apart(store, "maintain", args, "maintaining it")
    except BaseException:
        with contextlib.suppress(Exception):  # (the child's error is the one to tell)
            store.reopen()  # what the child committed before it failed or was stopped
        raise
    store.reopen()  # the child committed: read the table as it left it
    return result


def _apart(store: DocStore, what: str, args: dict, doing: str) -> dict:
    """``python -m logicrank.pipelines.engines.store.apart WHAT URI NAME ARGS``: its one JSON line.
    Not multiprocessing's spawn, which imports the caller's ``__main__`` again: a script without
    a ``__main__`` guard would run again in the child. An interrupt kills the child, then
    propagates; a caller killed outright takes the child with it (it writes under the caller's
    lock: apart.py). An OSError in the child (exit 3) is raised here as one, a user error
    (exit 4) as a :class:`StoreError`."""
    import json
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "logicrank.pipelines.engines.store.apart", what, str(store.uri), store.name, json.dumps(args), str(os.getpid())]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if done.returncode in (0, 3, 4) and lines else None
    if done.returncode == 3 and result:
        raise OSError(*result["oserror"])
    if done.returncode == 4 and result:
        raise StoreError(result["usererror"])
    if done.returncode != 0 or result is None:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}, nothing printed"])[-1]
        raise RuntimeError(f"store: {doing} (table {store.name!r} v{store.version}) failed in its child process: {said}")
    return result


def _plain(result: dict) -> dict:
    """``result`` as the child prints it: plain JSON values."""
    import json

    return json.loads(json.dumps(result, default=json_value))


def json_value(value):
    """A numpy scalar as its Python value, anything else as its text (as the child prints it)."""
    return value.item() if hasattr(value, "item") else str(value)
