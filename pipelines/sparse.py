"""BM25 as a batch engine: a sparse index kept beside the table, tied to its version.

The index holds, for every document of one table version, the analyzed term counts of its
title and of its text (two ``scipy.sparse`` CSR matrices, documents x vocabulary) and the
document's content hash. Scoring a batch of queries is the sparse product
``Q (queries x terms) @ W.T (terms x documents)`` followed by a top k per row, where ``W``
holds each (document, term)'s BM25 weight: one compiled loop per batch (numba, as bm25s's
fastest backend), each query's rows of ``W.T`` summed into a dense accumulator.

The scores are the ones LanceDB's full-text search computes with a
``CombinedFieldsQuery`` over title and text (BM25F with Lucene's combined statistics):

* the analyzer (:class:`Analyzer`): LanceDB's simple tokenizer (split on characters that
  are not alphanumeric), tokens of 40 bytes or more dropped, lower case, Snowball English
  stemming, Lucene's English stop words (matched after stemming), ASCII folding, in that
  order; one analyzer for every BM25 path of the project, checked token for token against
  LanceDB's on SciFact and RuleBench (tests/integration/test_sparse.py);
* per term, the document frequency is the larger of its title and text frequencies, the
  document count the larger of the two fields' (documents with at least one token in the
  field), the average length the sum of both fields' tokens over that count;
* a document's term frequency and length are its title's plus its text's;
* ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``, ``w = idf * (k1 + 1) * tf / (tf + k1 * (1 - b + b * dl / avgdl))``,
  k1 1.2, b 0.75; a query term counts as often as the query repeats it.

The index for version ``v`` of table ``t`` in database directory ``db`` lives in
``db/_bm25/t/v<v>/``; :func:`open_index` builds it on first use (and saves it, where the
database is a local directory), and :func:`update_index` makes the next version's by
patching the nearest earlier one with the documents whose content hash changed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import tempfile
import threading
import unicodedata
import uuid
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import regex
import scipy.sparse as sp

K1, B = 1.2, 0.75
MAX_TOKEN_BYTES = 40  # LanceDB's max_token_length: tokens of this many UTF-8 bytes or more are dropped
FORMAT = 3  # the on-disk layout; an index of another format is rebuilt (2: the mapped search files; 3: in segments of documents)
COUNTS_FORMATS = (2, 3)  # the formats whose term counts a patch reads (formats 2 and 3 store them alike): an older index is re-saved, not re-analyzed

# Lucene's English stop set (EnglishAnalyzer, also Pyserini's and bm25s's), not LanceDB's own
# English list of about 180 words, which drops "can", "has", "own", "from", ...: on
# RuleBench, where "X can feed Y" is the rule, that list costs 7 points of R@1.
ENGLISH_STOP_WORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not",
    "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was",
    "will", "with",
)
# the simple tokenizer's words: runs of Rust's alphanumeric characters (Alphabetic or Numeric,
# which keeps Devanagari's and Arabic's combining vowel signs inside words; Python's isalnum does not)
_WORD = regex.compile(r"[\p{Alphabetic}\p{N}]+")


def _fold(token: str) -> str:
    """ASCII folding: each character with an ASCII form (é -> e, ß -> ss, ¼ -> 14) becomes it;
    the others (Greek, CJK, ...) stay."""
    if token.isascii():
        return token
    return "".join(_fold_char(c) for c in token)


@functools.cache
def _fold_char(c: str) -> str:
    special = {"ß": "ss", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O", "đ": "d", "Đ": "D",
               "ł": "l", "Ł": "L", "þ": "th", "Þ": "TH", "ð": "d", "Ð": "D", "ı": "i", "ħ": "h", "Ħ": "H"}
    if c in special:
        return special[c]
    ascii_part = "".join(x for x in unicodedata.normalize("NFKD", c) if x.isascii())
    return ascii_part or c


class Analyzer:
    """Text -> BM25 terms, as LanceDB's full-text index analyzes title and text (module doc).

    Words are memoised: a corpus repeats its words, so each distinct word is lowered,
    stemmed and folded once."""

    def __init__(self, stop_words: Iterable[str] = ENGLISH_STOP_WORDS):
        import Stemmer  # PyStemmer: the Snowball English stemmer LanceDB's analyzer uses

        self.stemmer = Stemmer.Stemmer("english")
        self._stem = self.stemmer.stemWord
        self._stop = frozenset(stop_words)
        self._memo: dict[str, str | None] = {}

    def _term(self, word: str) -> str | None:
        if len(word.encode()) >= MAX_TOKEN_BYTES:
            return None
        lowered = word.lower() if word.isascii() else "".join(c.lower() for c in word)  # per character, as Rust's char::to_lowercase
        stem = self._stem(lowered)
        return None if stem in self._stop else _fold(stem)

    def term(self, word: str) -> str | None:
        """One word's term (None: a stop word or a token too long), memoised."""
        memo = self._memo
        term = memo.get(word, 0)
        if term == 0:
            term = memo[word] = self._term(word)
            if len(memo) > 2_000_000:  # bounded on corpora with huge vocabularies
                memo.clear()
        return term

    def __call__(self, text: str | None) -> list[str]:
        if not text:
            return []
        memo, out = self._memo, []
        for word in _WORD.findall(text):
            term = memo.get(word, 0)
            if term == 0:
                term = self.term(word)
            if term is not None:
                out.append(term)
        return out


@functools.cache
def analyzer() -> Analyzer:
    return Analyzer()


class Vocabulary:
    """term <-> id, growing as documents bring new terms (ids never change)."""

    def __init__(self, terms: Sequence[str] = ()):
        self.terms = list(terms)
        self.ids = {t: i for i, t in enumerate(self.terms)}

    def id(self, term: str) -> int:
        i = self.ids.get(term)
        if i is None:
            i = self.ids[term] = len(self.terms)
            self.terms.append(term)
        return i

    def __len__(self) -> int:
        return len(self.terms)


def _counts(texts: Iterable[str | None], vocab: Vocabulary, analyze: Analyzer) -> sp.csr_matrix:
    """Documents x vocabulary term counts of ``texts`` (the vocabulary grows as needed)."""
    indptr, indices, data = [0], [], []
    for text in texts:
        ids = np.fromiter((vocab.id(t) for t in analyze(text)), dtype=np.int64)
        if len(ids):
            uniq, cnt = np.unique(ids, return_counts=True)
            indices.append(uniq)
            data.append(cnt)
            indptr.append(indptr[-1] + len(uniq))
        else:
            indptr.append(indptr[-1])
    indices = np.concatenate(indices) if indices else np.empty(0, np.int64)
    data = np.concatenate(data) if data else np.empty(0, np.int64)
    return sp.csr_matrix((data.astype(np.int32), indices.astype(np.int32), np.asarray(indptr, np.int64)), shape=(len(indptr) - 1, len(vocab)))


class _Kernels:
    """The engine's compiled loops: the search loop ``top_k`` compiled ahead of time once per
    machine and loaded without numba (pipelines/bm25_compiled.py; numba's JIT loop where it
    cannot be built), the index-building loops from numba's JIT and its on-disk cache
    (pipelines/bm25_kernels.py), imported on first use: numba loads only in a process that
    builds an index (or searches where the compiled loop is unavailable)."""

    @staticmethod
    def top_k(*args):
        from logicrank.pipelines import bm25_compiled

        return bm25_compiled.top_k(*args)

    def __getattr__(self, name: str):
        from logicrank.pipelines import bm25_kernels

        return getattr(bm25_kernels, name)


_KERNELS = _Kernels()


def kernels() -> _Kernels:
    return _KERNELS


_preloading: set[str] = set()
_preload_lock = threading.Lock()


def preload_kernels(index: MappedBM25 | None = None) -> None:
    """Load the search loop in a background thread, once per process: the compiled module
    (under a millisecond; built first where this machine has none, about 12 s, once), or,
    where it is unavailable, numba's start-up and its cache load (about 0.5 s here), which then
    overlap what the process does before its first search (the retrieve job: Ray's start; a
    shard actor: its creation) instead of adding to it. With ``index`` (a mapped index, as the
    job's stages and shard actors open), the JIT loop for its argument types too. A search that
    comes first waits on the same locks; an error here is raised again, whole, by that search."""
    key = "numba" if index is None else "mapped"
    with _preload_lock:
        if key in _preloading:
            return
        _preloading.add(key)
    threading.Thread(target=_load_kernels, args=(index,), name="bm25-kernels", daemon=True).start()


def _load_kernels(index: MappedBM25 | None) -> None:
    with contextlib.suppress(Exception):
        from logicrank.pipelines import bm25_compiled

        if bm25_compiled.compiled_top_k() is not None:
            return  # loaded (built first, once per machine): this process needs no numba to search
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target

        from logicrank.pipelines import bm25_kernels  # noqa: F401 (numba's JIT loop: its start-up, then its cache)

        with global_compiler_lock:  # as numba's own compiles do: a search's compile in the other thread waits, never sees them half loaded
            cpu_target.typing_context.refresh()  # the registries numba loads before its first call or cache load
            cpu_target.target_context.refresh()
        if index is not None:  # no queries: the types dispatched, the code loaded from the cache, nothing searched
            index.search_keys(sp.csr_matrix((np.ones(0, np.float32), np.zeros(0, np.int32), np.zeros(1, np.int64)), shape=(0, 1)), 1)


_WEIGHT_ROWS = 1 << 17  # documents whose weights are computed at once (float64 temporaries of ~250 MiB)
SEGMENT_ROWS = 1 << 19  # documents per segment of a saved index (:func:`segmented`): a shard reads only its segments
_BLOCK = 1 << 17  # documents scored at once: the accumulator (512 KiB) stays in a core's cache


def segmented(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, docs: int, seg_rows: int,
              out_indices: np.ndarray, out_data: np.ndarray) -> np.ndarray:
    """A terms x documents CSR (postings sorted by row) laid out segment by segment: segment
    ``s`` holds the postings of rows ``[s * seg_rows, (s + 1) * seg_rows)``, term by term, in
    ``out_indices`` / ``out_data`` (as long as ``indices``; arrays or memory maps). Returns the
    layout's indptr, ``(segments, terms + 1)``: term ``t``'s postings in segment ``s`` are
    ``[indptr[s, t], indptr[s, t + 1])``. A process that searches one range of documents then
    reads only its segments' bytes (:class:`MappedBM25`)."""
    n_seg = max(1, -(-docs // seg_rows))
    kern = kernels()
    at = kern.segment_starts(np.asarray(indptr, np.int64), indices, seg_rows, n_seg)
    rows, offset = [], 0
    for seg in range(n_seg):
        rows.append(kern.segment_copy(indices, data, at, seg, out_indices, out_data, offset))
        offset = int(rows[-1][-1])
    return np.stack(rows)


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


class _Search:
    """The batch search of a BM25 index (module doc), over operands its subclass provides: the
    terms x documents weights in segments of documents (:meth:`segments`), the vocabulary, the idf, the
    tie-break ranks and the document ids. :class:`BM25Index` makes them in memory (a build or
    a patch); :class:`MappedBM25` maps them from a saved index, so the processes of one node
    share one copy in the page cache."""

    vocab: Vocabulary
    _words: dict[str, int]

    def postings(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The weights, terms x documents, as CSR arrays (indptr int64, indices int32 sorted per
        term, data float32), where the index is in memory."""
        raise NotImplementedError

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """The weights laid out in segments of documents (:func:`segmented`): indptr
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
        q = q[:, terms]
        parts = [q @ w[terms][:, rows] for w in self._segment_weights()]  # each segment's columns are its documents alone
        return sum(parts[1:], parts[0]).tocsr()

    def score_bounds(self, texts: Sequence[str | None]) -> np.ndarray:
        """Each text's largest possible BM25 score, sum over its terms of idf x (k1 + 1): the
        limit of a document's score as every term's frequency grows (BM25's saturation)."""
        return np.asarray(self.query_matrix(texts) @ (self.idf() * (K1 + 1)), dtype=np.float64).ravel()

    # -- search ------------------------------------------------------------------
    def query_matrix(self, texts: Sequence[str | None], analyze: Analyzer | None = None) -> sp.csr_matrix:
        """queries x terms counts; terms the index has never seen are left out (they score 0).

        With the default analyzer each distinct word is looked up once per index (word ->
        term id, or -1 for a stop word, a too-long token or a term the index lacks): queries
        repeat their words, and a bulk run spends its Python time here."""
        if analyze is not None and analyze is not analyzer():
            ids = self.vocab.ids
            rows = ([i for i in (ids.get(t) for t in analyze(text)) if i is not None] for text in texts)
        else:
            rows = (self._word_ids(text) for text in texts)
        indptr, indices = [0], []
        for found in rows:
            indices.extend(found)
            indptr.append(len(indices))
        data = np.ones(len(indices), np.float32)
        q = sp.csr_matrix((data, np.asarray(indices, np.int32), np.asarray(indptr, np.int64)), shape=(len(texts), len(self.vocab)))
        q.sum_duplicates()  # a repeated query term counts as often as it occurs
        return q

    def _word_ids(self, text: str | None) -> list[int]:
        """``text``'s term ids through the default analyzer, memoised per word (query_matrix)."""
        if not text:
            return []
        memo = self._words
        if len(memo) > 2_000_000:  # bounded, as the analyzer's memo
            memo.clear()
        out = []
        for word in _WORD.findall(text):
            i = memo.get(word)
            if i is None:
                term = analyzer().term(word)
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
        block = max(0, min(hi - lo, _BLOCK))
        acc, cand = np.zeros(block, np.float32), np.empty(block + 2 * k, np.int64)
        return kernels().top_k(q.indptr, q.indices, q.data, indptr, indices, data, seg_rows, self._tiebreak(), k, acc, cand, lo, hi)

    def hits(self, keys: np.ndarray, found: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Search keys -> (hits per query, document rows, float64 scores), flat, in rank order."""
        k = keys.shape[1] if keys.ndim == 2 else 0
        ranks, scores = decode_keys(keys[np.arange(k) < found[:, None]])  # row-major: each query's hits in rank order
        return found.astype(np.int64), np.asarray(self._row_of_rank()[ranks], np.int64), scores.astype(np.float64)

    def doc_id_array(self) -> pa.Array:
        raise NotImplementedError

    def _tiebreak(self) -> np.ndarray:
        raise NotImplementedError

    def _row_of_rank(self) -> np.ndarray:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class BM25Index(_Search):
    """The BM25 statistics of one table version (module doc) and its batch search."""

    def __init__(self, doc_ids: np.ndarray, hashes: np.ndarray, title: sp.csr_matrix, text: sp.csr_matrix, vocab: Vocabulary, version: int,
                 stamp: str = ""):
        """``stamp``: when the table version was made (a table dropped and made again reuses its
        version numbers; the stamp tells its versions apart)."""
        self.doc_ids, self.hashes, self.vocab, self.version, self.stamp = doc_ids, hashes, vocab, version, stamp
        cols = len(vocab)
        self.title, self.text = _widen(title, cols), _widen(text, cols)
        self._weights = None  # terms x documents BM25 weights, made on first search
        self._tiebreak_rows = None
        self._words: dict[str, int] = {}  # word -> term id or -1, for queries (query_matrix)

    # -- building ----------------------------------------------------------------
    @classmethod
    def build(cls, batches: Iterable[pa.RecordBatch], version: int, analyze: Analyzer | None = None, stamp: str = "") -> BM25Index:
        """From record batches of (doc_id, content_hash, title, text)."""
        analyze = analyze or analyzer()
        vocab, ids, hashes, titles, texts = Vocabulary(), [], [], [], []
        for b in batches:
            ids.append(b.column("doc_id").to_numpy(zero_copy_only=False))
            hashes.append(b.column("content_hash").to_numpy(zero_copy_only=False))
            titles.append(_counts(b.column("title").to_pylist(), vocab, analyze))
            texts.append(_counts(b.column("text").to_pylist(), vocab, analyze))
        cols = len(vocab)
        stack = lambda ms: sp.vstack([_widen(m, cols) for m in ms], format="csr") if ms else sp.csr_matrix((0, cols), dtype=np.int32)  # noqa: E731
        empty = np.empty(0, dtype=object)
        return cls(np.concatenate(ids) if ids else empty, np.concatenate(hashes) if hashes else empty, stack(titles), stack(texts), vocab, version, stamp)

    def patched(self, stored: pa.Table, read_rows, version: int, stamp: str = "", analyze: Analyzer | None = None) -> tuple[BM25Index, dict]:
        """This index brought to another version of the table: ``stored`` is that version's
        (doc_id, content_hash); ``read_rows(ids)`` returns its (doc_id, content_hash, title,
        text) rows for the given ids. Documents whose hash is unchanged are kept as they are,
        the others dropped and (when still stored) analyzed again."""
        analyze = analyze or analyzer()
        new_ids = stored.column("doc_id").to_numpy(zero_copy_only=False)
        new_hashes = stored.column("content_hash").to_numpy(zero_copy_only=False)
        old = dict(zip(self.doc_ids.tolist(), self.hashes.tolist(), strict=True))
        keep_mask = np.fromiter((old.get(d) == h for d, h in zip(new_ids.tolist(), new_hashes.tolist(), strict=True)), bool, len(new_ids))
        kept = set(new_ids[keep_mask].tolist())
        rows = np.fromiter((d in kept for d in self.doc_ids.tolist()), bool, len(self.doc_ids))
        fresh = read_rows(new_ids[~keep_mask].tolist())
        vocab = Vocabulary(self.vocab.terms)
        title = _counts(fresh.column("title").to_pylist(), vocab, analyze)
        text = _counts(fresh.column("text").to_pylist(), vocab, analyze)
        cols = len(vocab)
        out = BM25Index(
            np.concatenate([self.doc_ids[rows], fresh.column("doc_id").to_numpy(zero_copy_only=False)]),
            np.concatenate([self.hashes[rows], fresh.column("content_hash").to_numpy(zero_copy_only=False)]),
            sp.vstack([_widen(self.title[rows], cols), _widen(title, cols)], format="csr"),
            sp.vstack([_widen(self.text[rows], cols), _widen(text, cols)], format="csr"),
            vocab, version, stamp,
        )
        return out, {"kept": int(rows.sum()), "analyzed": fresh.num_rows, "dropped": int(len(self.doc_ids) - rows.sum())}

    # -- statistics and weights ------------------------------------------------------
    def __len__(self) -> int:
        return len(self.doc_ids)

    def stats(self) -> dict:
        """N, the average length, and per-term document frequencies (the combined statistics)."""
        def field(m):
            lengths = np.asarray(m.sum(axis=1)).ravel()
            df = np.bincount(m.indices, minlength=m.shape[1])
            return int((lengths > 0).sum()), int(lengths.sum()), df
        nt, tt, dft = field(self.title)
        nx, tx, dfx = field(self.text)
        n = max(nt, nx)
        return {"docs": n, "avgdl": (tt + tx) / n if n else 0.0, "df": np.maximum(dft, dfx)}

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
        """terms x documents BM25 weights (float32, as LanceDB scores; each term's documents sorted).
        Computed in float64 ``_WEIGHT_ROWS`` documents at a time (the temporaries stay bounded at
        10M documents), each weight rounded to float32 as one whole-array pass would round it."""
        if self._weights is None:
            s = self.stats()
            tf = (self.title + self.text).tocsr()
            tf.sort_indices()
            n, avgdl, df = s["docs"], s["avgdl"], s["df"]
            idf = np.log1p((n - df + 0.5) / (df + 0.5))
            dl = np.asarray(tf.sum(axis=1)).ravel().astype(np.float64)
            norm = K1 * (1 - B + B * dl / avgdl) if avgdl else np.full(len(dl), K1)
            w = np.empty(tf.nnz, np.float32)
            for r0 in range(0, tf.shape[0], _WEIGHT_ROWS):
                r1 = min(tf.shape[0], r0 + _WEIGHT_ROWS)
                a, b = tf.indptr[r0], tf.indptr[r1]
                row = np.repeat(np.arange(r0, r1), np.diff(tf.indptr[r0 : r1 + 1]))
                f = tf.data[a:b].astype(np.float64)
                w[a:b] = idf[tf.indices[a:b]] * (K1 + 1) * f / (f + norm[row])
            weights = sp.csr_matrix((w, tf.indices, tf.indptr), shape=tf.shape).T.tocsr()
            del tf, w
            weights.sort_indices()  # a shard finds its documents in a term's postings by binary search
            weights.indptr = weights.indptr.astype(np.int64)  # past 2**31 postings (10M documents and more)
            self._weights = weights
        return self._weights

    def postings(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w = self.weights()
        return w.indptr, w.indices, w.data

    def idf(self) -> np.ndarray:
        """Each vocabulary term's idf, ``ln(1 + (N - df + 0.5) / (df + 0.5))`` (the combined statistics)."""
        s = self.stats()
        return np.log1p((s["docs"] - s["df"] + 0.5) / (s["df"] + 0.5))

    def doc_id_array(self) -> pa.Array:
        """The document ids as one Arrow string array (row order), made once."""
        if getattr(self, "_doc_id_array", None) is None or len(self._doc_id_array) != len(self):
            self._doc_id_array = pa.array(self.doc_ids, pa.string())
        return self._doc_id_array

    def _tiebreak(self) -> np.ndarray:
        """Per document row: its position when doc ids sort descending (ties rank by it)."""
        if getattr(self, "_tiebreak_rows", None) is None or len(self._tiebreak_rows) != len(self):
            self._tiebreak_rows, self._rows_by_rank = tiebreak_ranks(self.doc_ids)
        return self._tiebreak_rows

    def _row_of_rank(self) -> np.ndarray:
        """The inverse of :meth:`_tiebreak`: position -> document row."""
        self._tiebreak()
        return self._rows_by_rank

    # -- storage -----------------------------------------------------------------
    def save(self, path: Path) -> Path:
        """Write the index to directory ``path``: into a temporary sibling, then renamed into
        place. Where another process saved a valid index there meanwhile, that one stands."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
        try:
            for name, m in (("title", self.title), ("text", self.text)):
                sp.save_npz(tmp / f"{name}.npz", m, compressed=False)
            save_id = uuid.uuid4().hex  # in every file: a load never mixes the files of two saves
            meta = {b"logicrank.save_id": save_id.encode()}
            pq.write_table(pa.table({"doc_id": pa.array(self.doc_ids, pa.string()), "content_hash": pa.array(self.hashes, pa.string())})
                           .replace_schema_metadata(meta), tmp / "docs.parquet")
            pq.write_table(pa.table({"term": pa.array(self.vocab.terms, pa.string())}).replace_schema_metadata(meta), tmp / "vocab.parquet")
            self._save_search(tmp / "search", meta)
            (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "version": self.version, "stamp": self.stamp, "save_id": save_id,
                                                       "docs": len(self), "terms": len(self.vocab),
                                                       "segment_rows": SEGMENT_ROWS}))
            if _whole(path, self.stamp):
                return path
            if path.exists():  # damaged or another table's: moved aside, then replaced
                aside = Path(tempfile.mkdtemp(prefix=f".{path.name}-old-", dir=path.parent))
                with contextlib.suppress(OSError):  # (another process moved it first)
                    os.replace(path, aside / "old")
                shutil.rmtree(aside, ignore_errors=True)
            try:
                os.replace(tmp, path)
            except OSError:  # another process saved this version meanwhile: theirs stands
                if not _whole(path, self.stamp):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return path

    def _save_search(self, path: Path, meta: dict) -> None:
        """What a search maps (:class:`MappedBM25`): the weights in segments of
        ``SEGMENT_ROWS`` documents (:func:`segmented`, written through memory maps), the idf, the
        tie-break ranks and their inverse as ``.npy``, the doc ids as an Arrow IPC file."""
        path.mkdir()
        indptr, indices, data = self.postings()
        out_indices = np.lib.format.open_memmap(path / "indices.npy", "w+", np.int32, (len(indices),))
        out_data = np.lib.format.open_memmap(path / "data.npy", "w+", np.float32, (len(data),))
        layout = segmented(indptr, indices, data, len(self), SEGMENT_ROWS, out_indices, out_data)
        out_indices.flush()
        out_data.flush()
        del out_indices, out_data
        rank, rows = self._tiebreak(), self._row_of_rank()
        for name, a in (("indptr", layout), ("idf", self.idf().astype(np.float64, copy=False)), ("tiebreak", rank), ("rows_by_rank", rows)):
            np.save(path / f"{name}.npy", np.ascontiguousarray(a))
        ids = pa.table({"doc_id": self.doc_id_array()}).replace_schema_metadata(meta)
        with pa.OSFile(str(path / "doc_ids.arrow"), "wb") as sink, pa.ipc.new_file(sink, ids.schema) as writer:
            writer.write_table(ids)

    @classmethod
    def load(cls, path: Path, stamp: str | None = None) -> BM25Index | None:
        """The index saved in ``path`` (its term counts: any of ``COUNTS_FORMATS``); None when it
        is absent, partial, damaged, of another format, or (with ``stamp``) of another table that
        had the same name and version."""
        path = Path(path)
        try:
            meta = json.loads((path / "meta.json").read_text())
            if meta.get("format") not in COUNTS_FORMATS or (stamp is not None and meta.get("stamp") != stamp):
                return None
            docs = pq.read_table(path / "docs.parquet")
            terms = pq.read_table(path / "vocab.parquet")
            ids = {(t.schema.metadata or {}).get(b"logicrank.save_id", b"").decode() for t in (docs, terms)}
            title, text = (sp.load_npz(path / f"{n}.npz").tocsr() for n in ("title", "text"))
            shapes_ok = all(m.shape == (meta["docs"], meta["terms"]) for m in (title, text))
            if ids != {meta["save_id"]} or docs.num_rows != meta["docs"] or terms.num_rows != meta["terms"] or not shapes_ok:
                return None
        except Exception:  # noqa: BLE001 (whatever a damaged file raises: zipfile, pickle, Arrow, JSON): rebuilt
            return None
        return cls(docs.column("doc_id").to_numpy(zero_copy_only=False), docs.column("content_hash").to_numpy(zero_copy_only=False),
                   title, text, Vocabulary(terms.column("term").to_pylist()), int(meta["version"]), meta["stamp"])


class MappedBM25(_Search):
    """A saved index opened for search: its weights, idf, tie-break ranks and doc ids mapped
    from the files :meth:`BM25Index.save` wrote (``np.load(mmap_mode="r")``, an Arrow memory
    map), not read into the process. Every process of a node that searches one table version
    shares one copy in the page cache, and a process searching one shard (:meth:`search_keys`
    with ``shard``) touches only the segments of documents that shard spans (the postings are
    saved segment by segment, :func:`segmented`). The vocabulary is read on
    first use (a shard actor that is handed analyzed queries never reads it); the term counts
    and hashes (:attr:`title`, :attr:`text`, :attr:`hashes`, :meth:`stats`: patching, tests)
    are loaded from the saved index on first use."""

    def __init__(self, path: Path, meta: dict, arrays: dict[str, np.ndarray], doc_ids: pa.Array):
        self.path, self.version, self.stamp = Path(path), int(meta["version"]), meta["stamp"]
        self._meta, self._arrays, self._doc_ids = meta, arrays, doc_ids
        self._vocab: Vocabulary | None = None
        self._vocab_lock = threading.Lock()
        self._counts: BM25Index | None = None
        self._words: dict[str, int] = {}
        preload_kernels(self)

    @classmethod
    def open(cls, path: Path, stamp: str | None = None) -> MappedBM25 | None:
        """The index saved in ``path`` mapped for search; None when it is absent, partial,
        damaged, of another format or (with ``stamp``) of another table of the same name."""
        path = Path(path)
        try:
            meta = json.loads((path / "meta.json").read_text())
            if meta.get("format") != FORMAT or (stamp is not None and meta.get("stamp") != stamp):
                return None
            arrays = {name: np.load(path / "search" / f"{name}.npy", mmap_mode="r")
                      for name in ("indptr", "indices", "data", "idf", "tiebreak", "rows_by_rank")}
            reader = pa.ipc.open_file(pa.memory_map(str(path / "search" / "doc_ids.arrow")))
            table = reader.read_all()
            docs, terms = meta["docs"], meta["terms"]
            indptr, seg_rows = arrays["indptr"], int(meta["segment_rows"])
            ends = (np.asarray(indptr[:, 0]), np.asarray(indptr[:, -1]))  # each segment's first and last offsets: contiguous, in order
            ok = (indptr.shape == (max(1, -(-docs // seg_rows)), terms + 1) and len(arrays["idf"]) == terms
                  and int(ends[0][0]) == 0 and bool((ends[0][1:] == ends[1][:-1]).all()) and bool((ends[1] >= ends[0]).all())
                  and int(indptr[-1, -1]) == len(arrays["indices"]) == len(arrays["data"])
                  and len(arrays["tiebreak"]) == len(arrays["rows_by_rank"]) == table.num_rows == docs
                  and (table.schema.metadata or {}).get(b"logicrank.save_id", b"").decode() == meta["save_id"])
            for name in ("title", "text"):  # the counts a patch reads: their zip directories, not their data
                with zipfile.ZipFile(path / f"{name}.npz") as z:
                    ok = ok and bool(z.namelist())
            if not ok:
                return None
        except Exception:  # noqa: BLE001 (whatever a damaged file raises): rebuilt
            return None
        ids = table.column("doc_id")
        return cls(path, meta, arrays, ids.chunk(0) if ids.num_chunks == 1 else ids.combine_chunks())  # one chunk: mapped, not copied

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

    def _tiebreak(self) -> np.ndarray:
        return self._arrays["tiebreak"]

    def _row_of_rank(self) -> np.ndarray:
        return self._arrays["rows_by_rank"]

    @property
    def vocab(self) -> Vocabulary:
        with self._vocab_lock:  # read once, whichever thread asks first (:func:`ensure_index` reads it ahead)
            if self._vocab is None:
                self._vocab = Vocabulary(pq.read_table(self.path / "vocab.parquet").column("term").to_pylist())
        return self._vocab

    def _full(self) -> BM25Index:
        if self._counts is None:
            try:
                same = json.loads((self.path / "meta.json").read_text()).get("save_id") == self._meta["save_id"]
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


def _whole(path: Path, stamp: str) -> bool:
    """Whether ``path`` holds a whole saved index of this table version: its search files
    consistent and its counts' files readable (their zip directories; not their data, which
    a patch reads: a re-index would otherwise read the whole index once more to check it)."""
    return MappedBM25.open(path, stamp) is not None


def _saved(path: Path, stamp: str) -> bool:
    """Whether ``path`` holds a saved index of this format and table version, by its meta.json
    alone (a reader that finds its files damaged rebuilds them: :func:`open_index`)."""
    try:
        meta = json.loads((Path(path) / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == FORMAT and meta.get("stamp") == stamp


# -- the index beside a table --------------------------------------------------------
_COLUMNS = ["doc_id", "content_hash", "title", "text"]


def index_root(store) -> Path | None:
    """``<db>/_bm25/<table>``, or None where the database is not a local directory."""
    uri = str(store.uri)
    if "://" in uri and not uri.startswith("file://"):
        return None
    return Path(uri.removeprefix("file://")) / "_bm25" / store.name


def _saved_versions(root: Path | None) -> list[int]:
    if root is None or not root.is_dir():
        return []
    return sorted(int(p.name[1:]) for p in root.iterdir() if p.is_dir() and re.fullmatch(r"v\d+", p.name))


def open_index(store, save: bool = True) -> _Search:
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
    """Make the store version's index: patch the nearest earlier saved version when it
    shares most documents, else build from a scan. Returns it and what was done."""
    version, stamps = store.version, store.version_stamps()
    # the nearest saved counts: an earlier version's, or this version's own where its search files are of an older format or damaged
    earlier = [v for v in _saved_versions(root) if v <= version and v in stamps]
    base = BM25Index.load(root / f"v{earlier[-1]}", stamps[earlier[-1]]) if earlier else None
    if base is not None:
        stored = store.hashes()
        changed = len(stored) - int(pc.sum(pc.is_in(stored.column("content_hash"), value_set=pa.array(base.hashes, pa.string()))).as_py() or 0)
        if changed <= PATCH_LIMIT * max(1, len(stored)):
            index, counts = base.patched(stored, lambda ids: store.rows_for(ids, _COLUMNS[1:]), version, stamps[version])
            return index, {"how": "patched", "from_version": base.version, **counts}
    index = BM25Index.build(store.scan(_COLUMNS, batch_rows=8192, read_ahead=True), version, stamp=stamps[version])
    return index, {"how": "built", "analyzed": len(index)}


PATCH_LIMIT = 0.5  # patch while at most this share of the documents changed (measured: docs/bulk-retrieval.md)


def update_index(store) -> dict:
    """After a write (the index job): save the latest version's index, patched or built, and
    return what was done (for the manifest)."""
    root = index_root(store)
    if root is None:
        return {"how": "not saved (the database is not a local directory: each reader builds it)"}
    path = root / f"v{store.version}"
    if _saved(path, store.version_stamp()):
        return {"how": "current", "version": store.version}
    index, done = make_index(store, root)
    index.save(path)
    return {**done, "version": store.version, "docs": len(index), "terms": len(index.vocab)}


def prune_indexes(store, keep_versions: Iterable[int]) -> list[int]:
    """Remove the saved indexes (BM25's, and the dense engine's vectors: pipelines/vectors.py)
    of versions the table no longer keeps; returns the BM25 versions removed."""
    from logicrank.pipelines import vectors

    root = index_root(store)
    keep = set(keep_versions)
    vectors.prune(store, keep)
    gone = [v for v in _saved_versions(root) if v not in keep]
    for v in gone:
        shutil.rmtree(root / f"v{v}", ignore_errors=True)
    import time

    for leftover in root.glob(".v*-*") if root is not None and root.is_dir() else ():  # a save a crash cut short (an hour old)
        if time.time() - leftover.stat().st_mtime > 3600:
            shutil.rmtree(leftover, ignore_errors=True)
    return gone


def drop_indexes(store) -> None:
    """Remove every saved index of the store's table, the vectors too (the table itself was dropped)."""
    from logicrank.pipelines import vectors

    vectors.drop(store)
    root = index_root(store)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
