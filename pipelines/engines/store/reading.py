"""Reading the table: rows and vectors by id, scans, exact and ANN vector search, the BM25
engine's index and the full-text reference search, what the engines hold in memory."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.engines.bm25 import open_index
from logicrank.pipelines.engines.embed import to_matrix
from logicrank.pipelines.engines.store.base import _FTS_ANALYZER, _FTS_COLUMNS, _WORD, StoreError, _stemmer


class Reading:
    """The read side of :class:`logicrank.pipelines.engines.store.DocStore` (what stages see: pipelines.retrieval.stages.base.Store)."""

    # -- reads -------------------------------------------------------------------
    def hashes(self) -> pa.Table:
        """(doc_id, content_hash) of every stored document: what a re-index diffs against."""
        if not self.exists():
            return pa.table({"doc_id": pa.array([], pa.string()), "content_hash": pa.array([], pa.string())})
        return self.table.to_lance().to_table(columns=["doc_id", "content_hash"])

    def rows_for(self, doc_ids: Sequence[str], columns: Sequence[str]) -> pa.Table:
        """The given columns of the given documents (a pyarrow expression filter, not a SQL string)."""
        if len(doc_ids) == 0:
            return self.table.schema.empty_table().select(list(dict.fromkeys(["doc_id", *columns])))
        return self.table.to_lance().to_table(columns=list(dict.fromkeys(["doc_id", *columns])), filter=pc.field("doc_id").isin(list(doc_ids)))

    def vectors_for(self, doc_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """doc_id -> vector for the given ids (a pyarrow expression filter, not a SQL string)."""
        if len(doc_ids) == 0:
            return {}
        t = self.rows_for(doc_ids, ["vector"])
        return dict(zip(t.column("doc_id").to_pylist(), to_matrix(t.column("vector")), strict=True))

    def sample_vectors(self, n: int, seed: int = 0) -> np.ndarray:
        """Up to ``n`` document vectors drawn uniformly (all of them for a small table)."""
        ds = self.table.to_lance()
        total = ds.count_rows()
        if total <= n:
            t = ds.to_table(columns=["vector"])
        else:
            rows = np.sort(np.random.default_rng(seed).choice(total, size=n, replace=False))
            t = ds.take(rows, columns=["vector"])
        return to_matrix(t.column("vector"))

    def vector_blocks(self, batch_rows: int = 32768, read_ahead: bool = True, rows: tuple[int, int] | None = None):
        """(doc_ids, (n, dim) float32 vectors) blocks of the whole table (or of its rows
        ``rows = (lo, hi)`` in scan order: one shard), streamed."""
        for b in self.scan(["doc_id", "vector"], batch_rows, read_ahead, rows):
            yield b.column("doc_id").to_numpy(zero_copy_only=False), to_matrix(b.column("vector"))

    def scan(self, columns: Sequence[str], batch_rows: int = 8192, read_ahead: bool = False, rows: tuple[int, int] | None = None):
        """Stream record batches of ``columns`` (bounded memory), of every row or of the rows
        ``rows = (lo, hi)`` in scan order.

        ``read_ahead`` decodes the next batch on a thread while the caller works on this one
        (at most two batches in memory).
        """
        window = {} if rows is None else {"offset": rows[0], "limit": max(0, rows[1] - rows[0])}
        batches = self.table.to_lance().to_batches(columns=list(columns), batch_size=batch_rows, **window)
        if not read_ahead:
            yield from batches
            return
        from concurrent.futures import ThreadPoolExecutor

        it = iter(batches)
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(next, it, None)
            while (batch := pending.result()) is not None:
                pending = pool.submit(next, it, None)
                yield batch

    def fts_current(self) -> bool:
        """Whether the full-text indexes exist and analyze text as this version of logicrank
        does (a table indexed by an older one is re-analyzed by the next ``logicrank index``)."""
        found = {}
        for idx in self.table.list_indices():
            if idx.index_type == "FTS" and len(idx.columns) == 1:
                details = idx.index_details or {}
                found[idx.columns[0]] = all(details.get(key) == value for key, value in _FTS_ANALYZER.items())
        return all(found.get(col, False) for col in _FTS_COLUMNS)

    def require_fts(self, job: str) -> None:
        """Raise :class:`StoreError` unless BM25 can run on this table as documented."""
        if not self.fts_current():
            raise StoreError(
                f"{job}: table {self.name!r} in {self.uri!r} has no full-text index with logicrank's BM25 analyzer "
                "(it was indexed by an older version); run `logicrank index` on it again: the full-text index is "
                "rebuilt in place, nothing is re-embedded."
            )

    def index_coverage(self) -> dict[str, int]:
        """Index name -> rows it does not cover (0 everywhere after :meth:`maintain`)."""
        t = self.table
        out = {}
        for idx in t.list_indices():
            stats = t.index_stats(idx.name)
            out[idx.name] = int(stats.num_unindexed_rows) if stats is not None else self.count()
        return out

    def has_ann_index(self) -> bool:
        return any("vector" in idx.columns for idx in self.table.list_indices())

    # -- search ------------------------------------------------------------------
    def vector_search(
        self, vectors: np.ndarray, k: int, exact: bool | None = None, with_vectors: bool = False, nprobes: int | None = None,
        refine_factor: int | None = None,
    ) -> pa.Table:
        """Top-k by cosine for each query vector: (query_index, doc_id, score = cos[, vector]).

        Exact when the table has no ANN index (or ``exact``); ``nprobes`` trades the ANN
        index's speed for recall (LanceDB's default when None)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if len(vectors) == 0:
            return pa.table({"query_index": pa.array([], pa.int32()), "doc_id": pa.array([], pa.string()), "score": pa.array([], pa.float64())})
        columns = ["doc_id", "_distance"] + (["vector"] if with_vectors else [])
        q = self.table.search(list(vectors), vector_column_name="vector").metric("cosine").limit(k).select(columns)
        if exact or (exact is None and not self.has_ann_index()):
            q = q.bypass_vector_index()
        else:
            if nprobes:
                q = q.nprobes(nprobes)
            if refine_factor:  # re-rank refine_factor * k ANN candidates by their full vectors
                q = q.refine_factor(refine_factor)
        res = q.to_arrow()
        if "query_index" not in res.column_names:  # a single query comes back unbatched
            res = res.append_column("query_index", pa.array(np.zeros(res.num_rows, np.int32)))
        score = pa.array(1.0 - res.column("_distance").to_numpy().astype(np.float64))
        out = {"query_index": res.column("query_index").cast(pa.int32()), "doc_id": res.column("doc_id"), "score": score}
        if with_vectors:
            out["vector"] = res.column("vector")
        return pa.table(out)

    def held_bytes(self) -> int:
        """Bytes of the engines' data this process holds of its own (what each retrieval actor
        would hold again): none of the saved, mapped files (one copy per node in the page
        cache), all of an engine read into memory (a database that is not a local directory)."""
        held = sum(v.own_bytes() for v in self._vectors.values())
        return held + (self._bm25.nbytes() if self._bm25 is not None else 0)

    def mapped_bytes(self) -> int:
        """Bytes of the engines' files this process has mapped (a whole search touches them all):
        what a node's page cache holds once, and what sharding divides."""
        mapped = sum(v.nbytes() for v in self._vectors.values() if v.path is not None)
        return mapped + (self._bm25.mapped_bytes() if self._bm25 is not None and hasattr(self._bm25, "mapped_bytes") else 0)

    def bm25_index(self):
        """The BM25 engine's index of this version (pipelines/engines/bm25/), opened once: mapped
        from its saved files where the database is a local directory."""
        self._forget_other_versions()
        if self._bm25 is None:
            self._bm25 = open_index(self)
        return self._bm25

    def _forget_other_versions(self) -> None:
        """Forget the engines' operands opened for another version than the store's now: a
        write through this store (an upsert, a delete) moves it to a new version, whose search
        must not answer from the old one's index (deleted documents back, new ones missing)."""
        now = self.version
        if self._operands_of != now:
            self.release()
            self._operands_of = now

    def vectors(self, precision: str = "float32"):
        """The dense engine's operand of this version (pipelines/engines/vectors.py: unit vectors, doc ids,
        tie-break ranks), opened once per precision: mapped from their saved files where the
        database is a local directory (saved first if missing), else read into memory."""
        self._forget_other_versions()
        if precision not in self._vectors:
            from logicrank.pipelines.engines.vectors import open_vectors

            self._vectors[precision] = open_vectors(self, precision)
        return self._vectors[precision]

    def release(self) -> None:
        """Forget the engines' operands (the BM25 index, the vectors) of this process."""
        self._bm25 = None
        self._vectors = {}

    def text_search(self, text: str, k: int) -> pa.Table:
        """BM25 (k1 1.2, b 0.75) over title and text as one combined field through LanceDB's
        full-text index, one query at a time: the top ``k`` (doc_id, score), best first. The
        text is matched, never parsed as syntax. Retrieval uses the batch engine
        (:meth:`bm25_index`, pipelines/engines/bm25/); this is the reference it is tested against.

        A query term counts as often as it occurs in the query, as in Lucene, Pyserini and
        bm25s ("Alice's laptop ... her laptop" weighs "laptop" twice). LanceDB scores each
        distinct query term once, so the query is split into rounds (round r: the terms that
        occur at least r times), each one LanceDB search, and the rounds' scores summed; the
        top k of the sum is found exactly by Fagin's threshold algorithm over the rounds'
        ranked lists (a document seen in one list is looked up in the others with a
        prefiltered search, which keeps the table's statistics). A query without a repeated
        term is one search.

        Through the Lance dataset directly: the same search as ``table.search(...)``, about
        1.7x faster per query. Title and text are scored with combined-field statistics
        (``CombinedFieldsQuery``: BM25F, pipelines/engines/bm25/). LanceDB's index, updated in place, keeps replaced and
        deleted rows in its statistics until it is rebuilt; the engine's are the version's own."""
        rounds = self._query_rounds(text)
        if not rounds:
            return pa.table({"doc_id": pa.array([], pa.string()), "score": pa.array([], pa.float64())})
        if len(rounds) == 1:
            return self._fts(rounds[0], k)
        searches = [lambda m, r=r: self._fts(r, m) for r in rounds]
        lookups = [lambda ids, r=r: self._fts(r, len(ids), among=ids) for r in rounds]
        return summed_top_k(searches, lookups, k, start=max(4 * k, 64))

    def _fts(self, text: str, k: int, among: Sequence[str] | None = None) -> pa.Table:
        """The top ``k`` for ``text`` (of the documents ``among``, scored with the whole
        table's statistics: a prefilter)."""
        from lance.query import CombinedFieldsQuery

        if self._lance is None:
            self._lance = self.table.to_lance()
        where = {} if among is None else {"filter": pc.field("doc_id").isin(list(among)), "prefilter": True}
        res = self._lance.to_table(full_text_query=CombinedFieldsQuery(text, list(_FTS_COLUMNS)), columns=["doc_id", "_score"], limit=k, **where)
        return pa.table({"doc_id": res.column("doc_id"), "score": res.column("_score").cast(pa.float64())})

    def _query_rounds(self, text: str) -> list[str]:
        """The query as rounds of words: round r holds one word for each term (after the
        analyzer) that occurs at least r times; [] when no term survives the analyzer."""
        tokens = list(self.table.tokenize(text, column="text"))
        if not tokens:
            return []
        counts: dict[str, int] = {}
        for tok in tokens:
            counts[tok.text] = counts.get(tok.text, 0) + 1
        if max(counts.values()) == 1:
            return [text]
        # one word of the query for each term, found by stemming the query's words as the
        # analyzer does (Snowball English); a term no word stems to stands for itself
        spelled: dict[str, str] = {}
        words = _WORD.findall(text)
        for word, stem in zip(words, _stemmer().stemWords([w.lower() for w in words]), strict=True):
            spelled.setdefault(stem, word)
        return [text] + [" ".join(spelled.get(t, t) for t, c in counts.items() if c >= r) for r in range(2, max(counts.values()) + 1)]


def summed_top_k(searches, lookups, k: int, start: int) -> pa.Table:
    """The exact top ``k`` of a sum of non-negative scores (Fagin's threshold algorithm).

    ``searches[r](m)`` returns list r's top ``m`` (doc_id, score), best first;
    ``lookups[r](ids)`` the scores in list r of the given documents (those it leaves out
    score 0 there). Every list is read to depth ``m``; each document seen in one is looked up
    in the others, so its sum is exact. Any document not seen sums to at most the lists' last
    scores (0 for a list read to its end): once the k-th best sum reaches that, the top k is
    final; otherwise the depth grows fourfold."""
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    m = max(start, 1)
    while True:
        lists = [search(m) for search in searches]
        last = sum(t.column("score")[-1].as_py() if t.num_rows == m else 0.0 for t in lists)
        seen = {d for t in lists for d in t.column("doc_id").to_pylist()}
        total = dict.fromkeys(seen, 0.0)
        for t, lookup in zip(lists, lookups, strict=True):
            have = dict(zip(t.column("doc_id").to_pylist(), t.column("score").to_pylist(), strict=True))
            missing = sorted(seen - have.keys())
            if missing and t.num_rows == m:  # a list read to its end scores the others 0
                found = lookup(missing)
                have.update(zip(found.column("doc_id").to_pylist(), found.column("score").to_pylist(), strict=True))
            for d, v in have.items():
                total[d] += v
        top = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        if (len(top) == k and top[-1][1] >= last) or last == 0.0:
            return pa.table({"doc_id": pa.array([d for d, _ in top], pa.string()), "score": pa.array([v for _, v in top], pa.float64())})
        m *= 4
