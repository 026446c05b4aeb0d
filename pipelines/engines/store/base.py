"""The table handle every part of the store shares: which table, at which version, made by
which model; the metadata and analyzer constants; :class:`StoreError`."""

from __future__ import annotations

import os
import re
from pathlib import Path

import lancedb

from logicrank.pipelines.engines.bm25 import ENGLISH_STOP_WORDS, default_analyzer
from logicrank.schemas.errors import UserError

_META_MODEL = b"logicrank.model"
_META_EMBEDDED_BY = b"logicrank.embedded_by"  # the digest of the code that made every vector of the version (versions.py)
_META_TITLE_SEP = b"logicrank.title_sep"  # how documents' titles were joined to their text when embedded (absent: a space)
_FTS_COLUMNS = ("title", "text")

# LanceDB's full-text index analyzes text as the BM25 engine's analyzer does
# (pipelines/engines/bm25/analyzer.py): simple tokenizer, English stemming, Lucene's English stop words.
_FTS_ANALYZER = {"language": "English", "stem": True, "remove_stop_words": True, "custom_stop_words": list(ENGLISH_STOP_WORDS)}
_WORD = re.compile(r"[^\W_]+")  # the simple tokenizer's words


def _stemmer():
    return default_analyzer().stemmer


class StoreError(UserError, RuntimeError):
    """The table cannot be used as asked (wrong model, missing, ...)."""


class TableHandle:
    """A LanceDB table by database URI and name, pinned to a version or following the latest."""

    def __init__(self, uri: str, name: str = "docs", version: int | None = None, metadata_cache_bytes: int | None = None):
        """``version``: read that version of the table (a job's readers all read the version
        it started with), else the latest. ``metadata_cache_bytes``: bound LanceDB's metadata cache
        to that many bytes (None: LanceDB's default, which keeps the manifests of the versions a
        process has read: a process appending 4,096 rows a commit grew from 0.31 to 0.59 GiB
        over 750 commits with it, to 0.35 bounded to 64 MiB).

        Opening creates nothing: the database is connected on first use, and a reader of a
        local path that does not exist is refused (:meth:`exists` is False, :attr:`table`
        raises one line naming the path) without making it (``lancedb.connect`` makes the
        directory tree). Only a write that creates the table makes it."""
        # "~" expanded as LanceDB expands it (a config file's "db: ~/x" reaches no shell): else the path checks here
        # and the table's write lock (writelock.py) looked elsewhere than LanceDB writes
        uri = os.path.expanduser(uri) if "://" not in uri else uri
        self.uri, self.name, self._version, self._metadata_cache_bytes = uri, name, version, metadata_cache_bytes
        self._db = None
        self._table = None
        self._lance = None  # the Lance dataset, for full-text search
        self._bm25 = None  # the BM25 engine's index of this version (pipelines/engines/bm25/)
        self._vectors: dict = {}  # precision -> the dense engine's vectors of this version (pipelines/engines/vectors.py)
        self._operands_of: int | None = None  # the version the two above were opened for

    # -- lifecycle ---------------------------------------------------------------
    @property
    def db(self):
        """The LanceDB connection, made on first use (it makes a missing local directory)."""
        if self._db is None:
            bytes_ = self._metadata_cache_bytes
            session = None if bytes_ is None else lancedb.Session(metadata_cache_size_bytes=bytes_)
            self._db = lancedb.connect(self.uri, session=session)
        return self._db

    def _missing_path(self) -> Path | None:
        """The local directory of the database when it does not exist (None: it does, or the URI is
        remote); a path that is a file is refused."""
        if self._db is not None:
            return None
        if "://" not in self.uri:
            path = Path(self.uri)
        elif self.uri.startswith("file://"):
            path = Path(self.uri[len("file://"):])
        else:
            return None
        if path.exists() and not path.is_dir():  # (lancedb.connect would fail making its directory, with a traceback)
            raise StoreError(f"store: {self.uri!r} is a file, not a database (a LanceDB directory); check --db")
        return None if path.exists() else path

    def exists(self) -> bool:
        if self._missing_path() is not None:
            return False
        return self.name in self.db.table_names(limit=1 << 30)

    def absent(self) -> str:
        """Why the table cannot be opened, naming the tables the database holds:
        ``no table 'docs' in 'db' (it holds 'corpus', 'docs_v2')``."""
        if self._missing_path() is not None:
            return f"no database at {self.uri!r} (no such directory)"
        held = sorted(self.db.table_names(limit=1 << 30))
        there = f"it holds {', '.join(map(repr, held))}" if held else "it holds no table"
        return f"no table {self.name!r} in {self.uri!r} ({there})"

    @property
    def table(self):
        if self._table is None:
            if self._missing_path() is not None:
                raise StoreError(f"store: no database at {self.uri!r} (no such directory; nothing was created there); check --db, "
                                 "or run `logicrank index` first.")
            if not self.exists():
                raise StoreError(f"store: {self.absent()}; check --table, or run `logicrank index` first.")
            table = self.db.open_table(self.name)
            if self._version is not None:
                self._checkout(table, self._version)
            self._table = table
        return self._table

    def _checkout(self, table, version: int | str) -> None:
        """Read ``version`` (a number or a tag) of ``table``, or say which ones exist."""
        tags = table.tags.list()
        numbers = [v["version"] for v in table.list_versions()]
        if isinstance(version, str) and version not in tags and version.isdigit():
            version = int(version)
        if version not in tags and version not in numbers:
            raise StoreError(
                f"store: table {self.name!r} in {self.uri!r} has no version or tag {version!r}; "
                f"versions kept: {numbers[-10:]}, tags: {sorted(tags)[-10:]}."
            )
        table.checkout(version)

    def title_sep(self) -> str:
        """What joined each document's title to its text when it was embedded."""
        value = (self.table.schema.metadata or {}).get(_META_TITLE_SEP)
        return value.decode() if value is not None else " "

    def require_title_sep(self, expected: str, job: str) -> None:
        """Raise :class:`StoreError` unless the table's documents were embedded with ``expected`` between title and text."""
        found = self.title_sep()
        if found != expected:
            raise StoreError(f"{job}: table {self.name!r} in {self.uri!r} embedded its documents as title + {found!r} + text, not {expected!r}; "
                             f"index with --title-sep {found!r}, or into a new table (--table).")

    def require_model(self, expected: str, job: str, fix: str = "use the table's model (--model)") -> None:
        """Raise :class:`StoreError` unless the table's vectors come from ``expected``."""
        found = self.model_id()
        if found != expected:
            raise StoreError(f"{job}: table {self.name!r} in {self.uri!r} holds vectors from {found!r}, not {expected!r}; {fix}.")

    def model_id(self) -> str | None:
        meta = self.table.schema.metadata or {}
        value = meta.get(_META_MODEL)
        return value.decode() if value else None

    @property
    def dim(self) -> int:
        return self.table.schema.field("vector").type.list_size

    def count(self) -> int:
        return int(self.table.count_rows())
