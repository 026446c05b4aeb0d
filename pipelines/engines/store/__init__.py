"""LanceDB document store: upsert by content hash, delete, search, versions and tags.

One committer per table (LanceDB commits conflict under concurrent writers): the index job
funnels every commit through one :class:`DocStore`. New documents are appended (rows written
here, or data files its encoder workers wrote, committed here), changed ones replaced by a
keyed ``merge_insert`` on ``doc_id``; the job appends only ids absent from the version it
started from and kept once per run, so a run repeated after a crash never duplicates a row.
No user text is ever pasted into a LanceDB filter string.
"""

from __future__ import annotations

from logicrank.pipelines.engines.bm25 import ENGLISH_STOP_WORDS
from logicrank.pipelines.engines.store.base import StoreError, TableHandle
from logicrank.pipelines.engines.store.reading import Reading
from logicrank.pipelines.engines.store.versions import Versions
from logicrank.pipelines.engines.store.writing import Writing

__all__ = ["APART_FROM_ROWS", "ENGLISH_STOP_WORDS", "DocStore", "StoreError", "json_value", "update_index_apart"]


class DocStore(Reading, Writing, Versions, TableHandle):
    """A LanceDB table of documents (the ``docs`` contract), in parts: reading
    (pipelines/engines/store/reading.py), writing (writing.py), versions (versions.py), over one table
    handle (base.py)."""


# below this many rows the BM25 index is made in the caller: a build or patch holds about 2 KiB
# a document of passage length (20 GiB at 10M, docs/bulk-retrieval.md), about 100 MiB here, and a
# child's start-up (a fresh interpreter importing logicrank, LanceDB and numba: about 2 s on 2
# cores) is most of a small table's index time. Rows, not bytes: a table of long documents
# holds more per row.
APART_FROM_ROWS = 50_000


def update_index_apart(store: DocStore, apart_from_rows: int = APART_FROM_ROWS) -> dict:
    """:func:`logicrank.pipelines.engines.bm25.update_index` in a child process (a fresh interpreter,
    pipelines/engines/store/apart.py) for a table of ``apart_from_rows`` rows or more: the index
    job's driver stays small whatever the corpus (a build's or a patch's steps hold a segment's
    counts and weights at a time, and the plan and the assembly every id and hash:
    docs/bulk-retrieval.md); the child's memory
    goes when it ends, and an interrupt of the job ends it too. A smaller table's index is made here.
    Not multiprocessing's spawn, which imports the caller's ``__main__`` again: a script without
    a ``__main__`` guard would run again in the child. An OSError in the child is raised here as
    one. Either way the result is what the child prints: plain JSON values."""
    import json
    import subprocess
    import sys

    if store.count() < apart_from_rows:
        from logicrank.pipelines.engines.bm25 import update_index

        return json.loads(json.dumps(update_index(store), default=json_value))
    done = subprocess.run([sys.executable, "-m", "logicrank.pipelines.engines.store.apart", str(store.uri), store.name, str(store.version)],
                          capture_output=True, text=True)  # (an interrupt kills the child, then propagates)
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if done.returncode in (0, 3) and lines else {}
    if done.returncode == 3:
        raise OSError(*result["oserror"])
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RuntimeError(f"store: saving the BM25 index of table {store.name!r} v{store.version} failed in its child process: {said}")
    return result


def json_value(value):
    """A numpy scalar as its Python value, anything else as its text (as the child prints it)."""
    return value.item() if hasattr(value, "item") else str(value)
