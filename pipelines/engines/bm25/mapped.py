"""A saved BM25 index mapped from disk for search (:class:`MappedBM25`), as the jobs' stages
and shard actors open it: the files storage.py reads, searched by :class:`BM25Search`'s loop."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from logicrank.pipelines.engines.bm25 import storage
from logicrank.pipelines.engines.bm25.analyzer import Vocabulary
from logicrank.pipelines.engines.bm25.index import BM25Index, BM25Search
from logicrank.pipelines.engines.bm25.loading import preload_kernels


class MappedBM25(BM25Search):
    """A saved index opened for search: its weights, idf, tie-break ranks and doc ids mapped
    from the files :meth:`BM25Index.save` wrote (``np.load(mmap_mode="r")``, an Arrow memory
    map), not read into the process. Every process of a node that searches one table version
    shares one copy in the page cache, and a process searching one shard (:meth:`search_keys`
    with ``shard``) touches only the segments of documents that shard spans (the postings are
    saved segment by segment, :func:`storage.segmented`). The vocabulary is read on
    first use (a shard actor that is handed analyzed queries never reads it); the term counts
    and hashes (:attr:`title`, :attr:`text`, :attr:`hashes`, :meth:`stats`: tests, inspection)
    are loaded from the saved index on first use."""

    def __init__(self, path: Path, meta: dict, arrays: dict[str, np.ndarray], doc_ids: pa.Array):
        super().__init__()
        self.path, self.version, self.stamp = Path(path), int(meta["version"]), meta["stamp"]
        self._meta, self._arrays, self._doc_ids = meta, arrays, doc_ids
        self._vocab: Vocabulary | None = None
        self._vocab_lock = threading.Lock()
        self._counts: BM25Index | None = None
        preload_kernels(self)

    @classmethod
    def open(cls, path: Path, stamp: str | None = None) -> MappedBM25 | None:
        """The index saved in ``path`` mapped for search; None when it is absent, partial,
        damaged, of another format or (with ``stamp``) of another table of the same name."""
        path = Path(path)
        found = storage.map_search_files(path, stamp)
        return None if found is None else cls(path, *found)

    def __len__(self) -> int:
        return int(self._meta["docs"])

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        a = self._arrays
        return a["indptr"], a["indices"], a["data"], self.segment_rows()

    def segment_rows(self) -> int:
        return int(self._meta["segment_rows"])

    def idf(self) -> np.ndarray:
        return np.asarray(self._arrays["idf"])

    def doc_id_array(self) -> pa.Array:
        return self._doc_ids

    def tiebreak(self) -> np.ndarray:
        return self._arrays["tiebreak"]

    def rows_by_rank(self) -> np.ndarray:
        return self._arrays["rows_by_rank"]

    @property
    def vocab(self) -> Vocabulary:
        with self._vocab_lock:  # read once, whichever thread asks first (versions.py's :func:`ensure_index` reads it ahead)
            if self._vocab is None and self._counts is not None:  # loaded whole from this save: its terms are there
                self._vocab = self._counts.vocab
            if self._vocab is None:
                terms = pq.read_table(self.path / "vocab.parquet")
                if (terms.schema.metadata or {}).get(b"logicrank.save_id", b"").decode() != self.save_id or terms.num_rows != self._meta["terms"]:
                    raise RuntimeError(f"bm25: the saved index {self.path} changed or was damaged while open; open it again")
                self._vocab = Vocabulary(terms.column("term").to_pylist())
        return self._vocab

    @property
    def save_id(self) -> str:
        """The id of the save mapped (storage.py): every process that searches one index holds the same."""
        return self._meta["save_id"]

    def _full(self) -> BM25Index:
        if self._counts is None:
            try:
                same = json.loads((self.path / "meta.json").read_text()).get("save_id") == self.save_id
            except (OSError, ValueError):
                same = False
            self._counts = BM25Index.load(self.path, self.stamp) if same else None
            if self._counts is None:
                raise RuntimeError(f"bm25: the saved index {self.path} changed or was damaged while open; open it again")
        return self._counts

    @property
    def doc_ids(self) -> np.ndarray:
        return self._full().doc_ids

    @property
    def hashes(self) -> np.ndarray:
        return self._full().hashes

    @property
    def title(self) -> sp.csr_matrix:
        return self._full().title

    @property
    def text(self) -> sp.csr_matrix:
        return self._full().text

    def stats(self) -> dict:
        return self._full().stats()

    def nbytes(self) -> int:
        """Bytes this process holds of its own (not the mapped files, which the page cache
        holds once per node): the vocabulary and the query words' memo, about."""
        own = 100 * len(self._vocab) if self._vocab is not None else 0
        return own + 120 * len(self._words) + (self._counts.nbytes() if self._counts is not None else 0)

    def mapped_bytes(self) -> int:
        """Bytes of the files a whole search maps (one copy per node, in the page cache)."""
        return sum(f.stat().st_size for f in (self.path / "search").iterdir())
