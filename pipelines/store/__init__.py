"""LanceDB document store: upsert by content hash, delete, search, versions and tags.

One writer per table (LanceDB commits conflict under concurrent writers): the index job
funnels every write through one :class:`DocStore`. Every write is a keyed
``merge_insert`` on ``doc_id``, so a write repeated after a crash never duplicates a row.
No user text is ever pasted into a LanceDB filter string.
"""

from __future__ import annotations

from logicrank.pipelines.sparse import ENGLISH_STOP_WORDS
from logicrank.pipelines.store.base import StoreError, TableHandle
from logicrank.pipelines.store.reading import Reading
from logicrank.pipelines.store.versions import Versions
from logicrank.pipelines.store.writing import Writing

__all__ = ["ENGLISH_STOP_WORDS", "DocStore", "StoreError", "update_index_apart"]


class DocStore(Reading, Writing, Versions, TableHandle):
    """A LanceDB table of documents (the ``docs`` contract), in parts: reading
    (pipelines/store/reading.py), writing (writing.py), versions (versions.py), over one table
    handle (base.py)."""


def update_index_apart(store: DocStore) -> dict:
    """:func:`logicrank.pipelines.sparse.update_index` in a child process (spawned): the index job's driver
    stays small whatever the corpus (the patch holds the previous version's counts and every id
    and hash, 17 GiB at 10M documents, docs/bulk-retrieval.md); the child's memory goes when it
    ends, and an interrupt of the job ends it too."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:  # (leaving the block terminates the child)
        return pool.apply(_update_saved, (str(store.uri), store.name, store.version))


def _update_saved(uri: str, name: str, version: int) -> dict:
    from logicrank.pipelines.sparse import update_index

    return update_index(DocStore(uri, name, version=version))
