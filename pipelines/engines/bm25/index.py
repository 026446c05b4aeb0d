"""The search over a BM25 index's arrays (:class:`BM25Search`) and the index made in memory
(:class:`BM25Index`: built from a table scan).

The index holds, for every document of one table version, the analyzed term counts of its
title and of its text (two ``scipy.sparse`` CSR matrices, documents x vocabulary) and the
document's content hash. Scoring a batch of queries is the sparse product
``Q (queries x terms) @ W.T (terms x documents)`` followed by a top k per row, where ``W``
holds each (document, term)'s BM25 weight: one compiled loop per batch (kernels.py,
compiled.py), each query's rows of ``W.T`` summed into a dense accumulator.

The scores are the ones LanceDB's full-text search computes with a ``CombinedFieldsQuery``
over title and text (BM25F with Lucene's combined statistics), its analyzer's terms
(analyzer.py):

* per term, the document frequency is the larger of its title and text frequencies, the
  document count the larger of the two fields' (documents with at least one token in the
  field), the average length the sum of both fields' tokens over that count;
* a document's term frequency and length are its title's plus its text's;
* ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``, ``w = idf * (k1 + 1) * tf / (tf + k1 * (1 - b + b * dl / avgdl))``,
  k1 1.2, b 0.75; a query term counts as often as the query repeats it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from logicrank.pipelines.engines.bm25 import loading, storage
from logicrank.pipelines.engines.bm25.analyzer import Analyzer, Vocabulary, analyzer_digest, default_analyzer, split_words

K1, B = 1.2, 0.75
SOURCE_COLUMNS = ["doc_id", "content_hash", "title", "text"]  # the table's columns an index is made from
_BLOCK = 1 << 17  # documents scored at once: the accumulator (512 KiB) stays in a core's cache


def field_counts(fields: Sequence[Sequence[str | None]], vocab: Vocabulary, analyze: Analyzer) -> list[sp.csr_matrix]:
    """Per field (title, text: equal-length lists), documents x vocabulary term counts, each
    document's terms sorted by id. The vocabulary grows document by document, each document's
    fields in order, so a term's id is fixed by its first appearance in the documents' order
    however they are batched: an index built in segments (segments.py) numbers its terms as one
    built in one scan.

    The batch's words are split into one list, then turned into terms and counted at once:
    Arrow's dictionary of the words, its entries in order of first appearance each made a term
    (:meth:`~.analyzer.Analyzer.term`, memoised) given the vocabulary's id (new terms appended
    as met), and one sort of (document, field, term) keys. Per word and per document in
    Python, this cost more than splitting the texts."""
    slots = len(fields) * (len(fields[0]) if fields else 0)  # (document, field) pairs, documents first
    words: list[str] = []
    lengths = np.empty(slots, np.int64)
    split, make_term = _words_and_term(analyze)
    k = 0
    for row in zip(*fields, strict=True):
        for text in row:
            found = split(text)
            words.extend(found)
            lengths[k] = len(found)
            k += 1
    if words:
        codes = pa.array(words, pa.large_string()).dictionary_encode()  # (large: a batch's words may pass 2 GiB)
        at = codes.indices.to_numpy()
        entries = codes.dictionary.to_pylist()
        ids = np.full(len(entries), -1, np.int64)  # -1: a word that gives no term (a stop word, a token too long)
        for e in first_appearance(at).tolist():  # a term's id fixed by the first of its words met
            term = make_term(entries[e])
            if term is not None:
                ids[e] = vocab.id(term)
        found_ids = ids[at]
        kept = found_ids >= 0
        keys = (np.repeat(np.arange(slots, dtype=np.int64), lengths)[kept] << 32) | found_ids[kept]
        keys, counts = np.unique(keys, return_counts=True)
    else:
        keys, counts = np.empty(0, np.int64), np.empty(0, np.int64)
    slot, term = keys >> 32, (keys & 0xFFFFFFFF).astype(np.int32)
    docs = slots // max(1, len(fields))
    out = []
    for f in range(len(fields)):
        mine = slot % len(fields) == f
        indptr = np.zeros(docs + 1, np.int64)
        np.cumsum(np.bincount(slot[mine] // len(fields), minlength=docs), out=indptr[1:])
        out.append(sp.csr_matrix((counts[mine].astype(np.int32), term[mine], indptr), shape=(docs, len(vocab))))
    return out


def _words_and_term(analyze: Analyzer) -> tuple[Callable[[str | None], list[str]], Callable[[str], str | None]]:
    """How :func:`field_counts` splits a text into words and makes a word's term: the
    analyzer's ``words`` and ``term``, which its call uses for a query. An analyzer whose class
    makes its own call (a subclass overriding ``__call__``) has its call's terms taken as the
    words, each its own term, so documents are analyzed as its queries are."""
    if type(analyze).__call__ is Analyzer.__call__:
        return analyze.words, analyze.term
    return (lambda text: list(analyze(text))), (lambda term: term)


def first_appearance(codes: np.ndarray) -> np.ndarray:
    """The codes that occur in ``codes`` (each of ``0 .. max``, as a dictionary's indices),
    in order of their first occurrence. Arrow's dictionary encoding numbers its entries so,
    which one pass checks; else one sort."""
    if (np.diff(np.maximum.accumulate(codes), prepend=-1) <= 1).all():  # each new code one past the largest before it
        return np.arange(int(codes.max()) + 1 if len(codes) else 0)
    values, first = np.unique(codes, return_index=True)
    return values[np.argsort(first, kind="stable")]


def row_sums(m: sp.csr_matrix) -> np.ndarray:
    """Each row's sum of an integer CSR (int64): its data's running sum read at the rows'
    bounds, the same integers scipy's sum per row gives, faster. The data is widened before the
    sum (a sum that widens as it goes, int32 into int64, is ten times slower)."""
    total = np.zeros(m.nnz + 1, np.int64)
    total[1:] = m.data
    np.cumsum(total[1:], out=total[1:])
    return total[m.indptr[1:]] - total[m.indptr[:-1]]


def field_stats(m: sp.csr_matrix) -> dict[str, np.ndarray]:
    """One field's statistics over the rows of its counts (documents x terms): per-term document
    frequencies (``df``, int64), the documents with a token (``docs``) and the tokens (``tokens``).
    A collection's are the sums of its parts' (segments.py, the patch's saved less dropped rows)."""
    lengths = row_sums(m)
    return {"df": np.bincount(m.indices, minlength=m.shape[1]).astype(np.int64),
            "docs": np.int64((lengths > 0).sum()), "tokens": np.int64(lengths.sum())}


def _joined(parts: list[sp.spmatrix]) -> sp.csr_matrix:
    """Matrices of one shape whose columns are disjoint (one segment of documents each) as one
    CSR, assembled once."""
    if len(parts) == 1:
        return parts[0].tocsr()
    coo = [p.tocoo() for p in parts]
    out = sp.csr_matrix((np.concatenate([c.data for c in coo]), (np.concatenate([c.row for c in coo]), np.concatenate([c.col for c in coo]))),
                        shape=parts[0].shape)
    out.sort_indices()
    return out


def idf_of(docs: int, df: np.ndarray) -> np.ndarray:
    """Each term's idf, ``ln(1 + (N - df + 0.5) / (df + 0.5))``, from the document count and the
    (combined) document frequencies."""
    return np.log1p((docs - df + 0.5) / (df + 0.5))


def weigh(title: sp.csr_matrix, text: sp.csr_matrix, idf: np.ndarray, avgdl: float) -> sp.csr_matrix:
    """Documents' term counts (title and text, documents x vocabulary) -> their terms x documents
    BM25 weights (float32, as LanceDB scores; each term's documents sorted; int64 indptr). The
    statistics are the collection's (``idf``, ``avgdl``): the documents may be one segment of it
    (segments.py), whose weights are those of its rows in the whole collection's. Two passes of
    compiled loops over the counts (kernels.py: :func:`~.kernels.weight_layout`,
    :func:`~.kernels.weight_postings`) write the weights where they go in the transposed layout,
    each computed in float64 and rounded once to float32: no documents x terms sum of the fields
    or its transpose is made. The counts' rows are sorted by term id first, where they are not."""
    kern = loading.kernels()
    for m in (title, text):
        m.sum_duplicates()  # each row's terms sorted and distinct (a no-op for the analyzer's and the saved counts)
    idf = np.ascontiguousarray(idf, np.float64)
    fields = (title.indptr, title.indices, title.data, text.indptr, text.indices, text.data)
    starts, dl = kern.weight_layout(*fields, len(idf))
    dl = dl.astype(np.float64)
    norm = K1 * (1 - B + B * dl / avgdl) if avgdl else np.full(len(dl), K1)
    docs, weights = kern.weight_postings(*fields, starts, idf, K1, norm)
    out = sp.csr_matrix((weights, docs, starts), shape=(len(idf), title.shape[0]))
    out.indptr = starts  # int64 past 2**31 postings (10M documents and more); scipy may have narrowed it
    out.has_sorted_indices = True  # each term's documents ascending: a shard finds its own by binary search
    return out


def merge_keys(parts: Sequence[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The shards' (keys, found) of one batch of queries -> the batch's (keys, found) over the
    whole index: per query the k largest keys of all shards. Exact: a key orders documents as
    the run does (score, then doc id descending) and every shard kept its own k best."""
    if len(parts) == 1:
        return parts[0]
    keys = np.concatenate([p[0] for p in parts], axis=1)  # missing hits are 0, below every real key
    keys = -np.sort(-keys, axis=1)[:, :k]
    found = np.minimum(sum(p[1] for p in parts), k)
    return keys, found


def decode_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The search loop's keys -> (tiebreak ranks, float32 scores)."""
    ranks = 0xFFFFFFFF - (keys & 0xFFFFFFFF)
    scores = (keys >> 32).astype(np.int32).view(np.float32)
    return ranks, scores


def tiebreak_ranks(doc_ids) -> tuple[np.ndarray, np.ndarray]:
    """Per document row its position when the doc ids sort descending (the run order's tie
    break: trec_eval's), and the inverse (position -> row)."""
    ids = doc_ids if isinstance(doc_ids, pa.Array) else pa.array(doc_ids, pa.string())
    order = np.ascontiguousarray(pc.array_sort_indices(ids, order="descending").to_numpy())  # by UTF-8 bytes: code point order
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return rank, order


def _widen(m: sp.csr_matrix, cols: int) -> sp.csr_matrix:
    return sp.csr_matrix((m.data, m.indices, m.indptr), shape=(m.shape[0], cols))


class BM25Search:
    """The batch search of a BM25 index (module doc), over operands its subclass provides: the
    terms x documents weights in segments of documents (:meth:`segments`), the vocabulary, the idf, the
    tie-break ranks and the document ids. :class:`BM25Index` makes them in memory (from a
    scan, or loaded from a saved index's counts); :class:`~logicrank.pipelines.engines.bm25.mapped.MappedBM25` maps them from a saved index,
    so the processes of one node share one copy in the page cache. The base owns the queries'
    side: the word -> term id memo, the query matrix, the search loop's call and the decoding
    of its keys."""

    vocab: Vocabulary

    def __init__(self):
        self._words: dict[str, int] = {}  # word -> term id or -1, for queries (query_matrix)

    def postings(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The weights, terms x documents, as CSR arrays (indptr int64, indices int32 sorted per
        term, data float32), where the index is in memory."""
        raise NotImplementedError

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """The weights laid out in segments of documents (:func:`storage.segmented`): indptr
        ``(segments, terms + 1)``, indices, data and the rows per segment. One segment of every
        document where the index is in memory."""
        indptr, indices, data = self.postings()
        return np.asarray(indptr, np.int64)[None, :], indices, data, max(1, len(self))

    def segment_rows(self) -> int:
        """Documents per segment (:meth:`segments`), without making the weights."""
        return max(1, len(self))

    def _segment_weights(self) -> list[sp.csr_matrix]:
        """Each segment's weights as a terms x documents CSR over its postings (not copied)."""
        indptr, indices, data, _ = self.segments()
        shape = (indptr.shape[1] - 1, len(self))
        return [sp.csr_matrix((data[row[0] : row[-1]], indices[row[0] : row[-1]], row - row[0]), shape=shape, copy=False) for row in indptr]

    def weights(self) -> sp.csr_matrix:
        """terms x documents BM25 weights (float32, as LanceDB scores). From a saved index of
        several segments, a copy in memory."""
        return _joined(self._segment_weights())

    def idf(self) -> np.ndarray:
        raise NotImplementedError

    def term_scores(self, texts: Sequence[str | None], rows: np.ndarray | None = None) -> sp.csr_matrix:
        """texts x documents: each text's BM25 score for every document, as :meth:`search` scores
        it (float32; a document the text shares no term with is a stored zero's absence).
        ``rows``: only the documents at these table rows, as columns in that order (a reranker's
        candidates): the texts' terms' postings are cut to them before the product, so no row of
        every document is ever made."""
        q = self.query_matrix(texts)
        if rows is None:
            return _joined([q @ w for w in self._segment_weights()])  # one segment at a time: the index is never copied whole
        terms = np.unique(q.indices)
        q = sp.csr_matrix((q.data, np.searchsorted(terms, q.indices).astype(np.int32), q.indptr), shape=(q.shape[0], len(terms)))  # each row's order kept
        parts = [q @ w[terms][:, rows] for w in self._segment_weights()]  # each segment's columns are its documents alone
        return sum(parts[1:], parts[0]).tocsr()

    def score_bounds(self, texts: Sequence[str | None]) -> np.ndarray:
        """Each text's largest possible BM25 score, sum over its terms of idf x (k1 + 1): the
        limit of a document's score as every term's frequency grows (BM25's saturation). A term
        no document holds adds nothing: a patched index keeps the terms of the documents it
        removed, with the largest idf, where a build of the same table has none."""
        q = self.query_matrix(texts)
        terms = np.unique(q.indices)
        indptr = self.segments()[0]
        held = terms[(np.asarray(indptr[:, terms + 1]) - np.asarray(indptr[:, terms])).sum(axis=0) > 0]
        per_term = np.zeros(q.shape[1], np.float64)
        per_term[held] = np.asarray(self.idf(), np.float64)[held] * (K1 + 1)
        return np.asarray(q @ per_term, dtype=np.float64).ravel()

    # -- search ------------------------------------------------------------------
    def query_matrix(self, texts: Sequence[str | None], analyze: Analyzer | None = None) -> sp.csr_matrix:
        """queries x terms counts; terms the index has never seen are left out (they score 0).
        Each query's terms are held in the order of their strings, not of their ids: the search
        sums a document's terms in float32 in that order, and an index patched from an earlier
        version numbers its terms otherwise than a build of the same table (by first appearance
        in other documents), so in id order the two summed one score in two orders and could
        differ in its last bits, and rank ties otherwise. Not sorted by id after: scipy's
        product keeps the order too (:meth:`term_scores`).

        With the default analyzer each distinct word is looked up once per index (word ->
        term id, or -1 for a stop word, a too-long token or a term the index lacks): queries
        repeat their words, and a bulk run spends its Python time here. An index built with
        another analyzer (:meth:`BM25Index.build`) reads queries through that one unless
        ``analyze`` is given."""
        analyze = analyze or getattr(self, "analyze", None)
        if analyze is not None and analyze is not default_analyzer():
            ids = self.vocab.ids
            rows = ([i for i in (ids.get(t) for t in analyze(text)) if i is not None] for text in texts)
        else:
            rows = (self._word_ids(text) for text in texts)
        terms = self.vocab.terms
        indptr, indices, counts = [0], [], []
        for found in rows:
            if len(found) > 1 and len(set(found)) < len(found):  # a repeated query term counts as often as it occurs
                times: dict[int, int] = {}
                for i in found:
                    times[i] = times.get(i, 0) + 1
                found = sorted(times, key=terms.__getitem__)
                counts.extend(times[i] for i in found)
            else:
                if len(found) > 1:
                    found = sorted(found, key=terms.__getitem__)
                counts.extend([1] * len(found))
            indices.extend(found)
            indptr.append(len(indices))
        return sp.csr_matrix((np.asarray(counts, np.float32), np.asarray(indices, np.int32), np.asarray(indptr, np.int64)),
                             shape=(len(texts), len(self.vocab)))

    def _word_ids(self, text: str | None) -> list[int]:
        """``text``'s term ids through the default analyzer, memoised per word (query_matrix)."""
        if not text:
            return []
        memo = self._words
        if len(memo) > 2_000_000:  # bounded, as the analyzer's memo
            memo.clear()
        out = []
        for word in split_words(text):
            i = memo.get(word)
            if i is None:
                term = default_analyzer().term(word)
                i = memo[word] = -1 if term is None else self.vocab.ids.get(term, -1)
            if i >= 0:
                out.append(i)
        return out

    def search(self, texts: Sequence[str | None], k: int, block: int = 1024) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each text's top ``k`` as (document rows, scores), ranked as runs are: score
        descending, ties by doc id descending (trec_eval's order). Only documents with a
        positive score come back."""
        sizes, rows, scores = self.search_flat(texts, k, block)
        ends = np.cumsum(sizes)
        return [(rows[e - n : e], scores[e - n : e]) for n, e in zip(sizes.tolist(), ends.tolist(), strict=True)]

    def search_flat(self, texts: Sequence[str | None], k: int, block: int = 1024) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`search` as three flat arrays: hits per text, then every text's document rows
        and scores (float64) one after the other, in rank order."""
        parts = [self.hits(*self.search_keys(self.query_matrix(texts[i : i + block]), k)) for i in range(0, len(texts), block)]
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))
        return tuple(np.concatenate([e, *(p[j] for p in parts)]) for j, e in enumerate(empty))

    def search_keys(self, q: sp.csr_matrix, k: int, shard: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The search loop over the queries ``q`` (queries x terms, :meth:`query_matrix`), over
        every document or over the rows ``shard = (lo, hi)`` only: per query its top ``k`` keys
        and how many it found. The keys of the shards of one index merge exactly
        (:func:`merge_keys`); :meth:`hits` decodes them."""
        if k < 1:
            raise ValueError(f"bm25: k must be at least 1, got {k}")
        n = len(self)
        if n >= 2**32:
            raise ValueError("bm25: the search keys hold a document's rank in 32 bits; index below 4.29 billion documents per table")
        lo, hi = (0, n) if shard is None else (max(0, shard[0]), min(n, shard[1]))
        indptr, indices, data, seg_rows = self.segments()
        if q.shape[1] != indptr.shape[1] - 1:  # the loop reads each query term's postings unchecked
            raise ValueError(f"bm25: the queries hold {q.shape[1]} terms and the index {indptr.shape[1] - 1}: "
                             "they were analyzed for another index")
        block = max(0, min(hi - lo, _BLOCK))
        acc, cand = np.zeros(block, np.float32), np.empty(block + 2 * k, np.int64)
        return loading.kernels().top_k(q.indptr, q.indices, q.data, indptr, indices, data, seg_rows, self.tiebreak(), k, acc, cand, lo, hi)

    def hits(self, keys: np.ndarray, found: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Search keys -> (hits per query, document rows, float64 scores), flat, in rank order."""
        k = keys.shape[1] if keys.ndim == 2 else 0
        ranks, scores = decode_keys(keys[np.arange(k) < found[:, None]])  # row-major: each query's hits in rank order
        return found.astype(np.int64), np.asarray(self.rows_by_rank()[ranks], np.int64), scores.astype(np.float64)

    def doc_id_array(self) -> pa.Array:
        """The document ids as one Arrow string array, in row order."""
        raise NotImplementedError

    def tiebreak(self) -> np.ndarray:
        """Per document row: its position when doc ids sort descending (ties rank by it)."""
        raise NotImplementedError

    def rows_by_rank(self) -> np.ndarray:
        """The inverse of :meth:`tiebreak`: position -> document row."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class BM25Index(BM25Search):
    """The BM25 statistics of one table version (module doc) and its batch search."""

    def __init__(self, doc_ids: np.ndarray, hashes: np.ndarray, title: sp.csr_matrix, text: sp.csr_matrix, vocab: Vocabulary, version: int,
                 stamp: str = ""):
        """``stamp``: when the table version was made (a table dropped and made again reuses its
        version numbers; the stamp tells its versions apart)."""
        super().__init__()
        self.doc_ids, self.hashes, self.vocab, self.version, self.stamp = doc_ids, hashes, vocab, version, stamp
        self.analyzer: str | None = None  # the digest of the analyzer that made its terms, where not the project's (saved with it)
        self.analyze: Analyzer | None = None  # that analyzer, where the index was built with it: queries read through it too
        cols = len(vocab)
        self.title, self.text = _widen(title, cols), _widen(text, cols)
        self._weights = None  # terms x documents BM25 weights, made on first search
        self._tiebreak_rows = None

    # -- building ----------------------------------------------------------------
    @classmethod
    def build(cls, batches: Iterable[pa.RecordBatch], version: int, analyze: Analyzer | None = None, stamp: str = "",
              vocab: Vocabulary | None = None) -> BM25Index:
        """From record batches of (doc_id, content_hash, title, text). ``analyze``: an
        :class:`~.analyzer.Analyzer`: its ``words`` and ``term`` make the documents' terms
        (:func:`field_counts`), as its call makes a query's; a subclass that makes its own call
        has that call make the documents' terms too. ``vocab``: the vocabulary to start from, its ids kept and new terms
        appended (a patch's: segments.py); it grows in place."""
        analyze = analyze or default_analyzer()
        vocab, ids, hashes, titles, texts = vocab or Vocabulary(), [], [], [], []
        for b in batches:
            ids.append(b.column("doc_id").to_numpy(zero_copy_only=False))
            hashes.append(b.column("content_hash").to_numpy(zero_copy_only=False))
            title, text = field_counts([b.column("title").to_pylist(), b.column("text").to_pylist()], vocab, analyze)
            titles.append(title)
            texts.append(text)
        cols = len(vocab)
        stack = lambda ms: sp.vstack([_widen(m, cols) for m in ms], format="csr") if ms else sp.csr_matrix((0, cols), dtype=np.int32)  # noqa: E731
        empty = np.empty(0, dtype=object)
        index = cls(np.concatenate(ids) if ids else empty, np.concatenate(hashes) if hashes else empty, stack(titles), stack(texts), vocab, version, stamp)
        if analyze is not default_analyzer():
            index.analyzer = analyzer_digest(analyze)
            index.analyze = analyze  # its queries are analyzed as its documents were
        return index

    # -- statistics and weights ------------------------------------------------------
    def __len__(self) -> int:
        return len(self.doc_ids)

    def field_stats(self) -> dict[str, np.ndarray]:
        """Each field's statistics (:func:`field_stats`), keyed ``<field>_<statistic>`` as a saved
        index holds them (storage.py's ``stats.npz``)."""
        return {f"{name}_{k}": v for name, m in (("title", self.title), ("text", self.text)) for k, v in field_stats(m).items()}

    def stats(self) -> dict:
        """N, the average length, and per-term document frequencies (the combined statistics)."""
        t, x = field_stats(self.title), field_stats(self.text)
        n = int(max(t["docs"], x["docs"]))
        return {"docs": n, "avgdl": int(t["tokens"] + x["tokens"]) / n if n else 0.0, "df": np.maximum(t["df"], x["df"])}

    def nbytes(self) -> int:
        """Bytes this index holds in memory (its count matrices, once made its weights, and its
        ids and hashes as Python strings: an estimate of 56 bytes per string object)."""
        mats = [self.title, self.text] + ([self._weights] if self._weights is not None else [])
        strings = (self.doc_ids.nbytes + self.hashes.nbytes) + 56 * (len(self.doc_ids) + len(self.hashes))
        search = sum(a.nbytes for a in (self._tiebreak_rows, getattr(self, "_rows_by_rank", None)) if a is not None)
        search += self._doc_id_array.nbytes if getattr(self, "_doc_id_array", None) is not None else 0
        search += 120 * len(self._words)  # the query words' memo: a key string and an int per entry, about
        return sum(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes for m in mats) + strings + search

    def weights(self) -> sp.csr_matrix:
        """terms x documents BM25 weights (:func:`weigh`), made on first use."""
        if self._weights is None:
            s = self.stats()
            self._weights = weigh(self.title, self.text, idf_of(s["docs"], s["df"]), s["avgdl"])
        return self._weights

    def postings(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w = self.weights()
        return w.indptr, w.indices, w.data

    def idf(self) -> np.ndarray:
        """Each vocabulary term's idf (the combined statistics, :func:`idf_of`)."""
        s = self.stats()
        return idf_of(s["docs"], s["df"])

    def doc_id_array(self) -> pa.Array:
        """The document ids as one Arrow string array (row order), made once."""
        if getattr(self, "_doc_id_array", None) is None or len(self._doc_id_array) != len(self):
            self._doc_id_array = pa.array(self.doc_ids, pa.string())
        return self._doc_id_array

    def tiebreak(self) -> np.ndarray:
        """:meth:`BM25Search.tiebreak`, made from the doc ids once (:func:`tiebreak_ranks`)."""
        if getattr(self, "_tiebreak_rows", None) is None or len(self._tiebreak_rows) != len(self):
            self._tiebreak_rows, self._rows_by_rank = tiebreak_ranks(self.doc_ids)
        return self._tiebreak_rows

    def rows_by_rank(self) -> np.ndarray:
        """:meth:`BM25Search.rows_by_rank`, made with :meth:`tiebreak`."""
        self.tiebreak()
        return self._rows_by_rank

    # -- storage (storage.py) ----------------------------------------------------
    def save(self, path: Path) -> Path:
        """Write the index to directory ``path``: into a temporary sibling, then renamed into
        place. Where another process saved a valid index there meanwhile, that one stands."""
        return storage.write_index(self, path)

    @classmethod
    def load(cls, path: Path, stamp: str | None = None) -> BM25Index | None:
        """The index saved in ``path`` (its term counts: any of ``storage.COUNTS_FORMATS``); None
        when it is absent, partial, damaged, of another format, or (with ``stamp``) of another
        table that had the same name and version."""
        found = storage.read_counts(path, stamp)
        if found is None:
            return None
        meta, docs, title, text, terms = found
        return cls(docs.column("doc_id").to_numpy(zero_copy_only=False), docs.column("content_hash").to_numpy(zero_copy_only=False),
                   title, text, Vocabulary(terms.column("term").to_pylist()), int(meta["version"]), meta["stamp"])
