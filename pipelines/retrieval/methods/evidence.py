"""Term evidence: how strongly a document holds a term, from any retrieval scorer.

ITLR composes per-term scores with fuzzy operators and OrLog takes each (candidate, atom)'s
P(True): both need, per (document, term), a number in [0, 1] for the operators and the
posterior to mean what they say (ITLR over dense cosines keeps its raw cosines by default, as
the paper does). Three scorers give the raw score:

- ``dense``: the cosine of the term's and the document's embeddings (ITLR's own evidence);
- ``bm25``: the term's text as a BM25 query over the table, through the batch engine
  (:mod:`logicrank.pipelines.engines.bm25`, the bm25 stage's scores), exact over every document;
- ``hybrid``: both, each calibrated by its own default (bm25: ``max``; dense: ``zscore``),
  combined per term as the weighted mean ``w * bm25 + (1 - w) * dense`` with ``w`` =
  ``hybrid_weight`` (default 0.5). Its evidence is already in [0, 1]: its calibration is the
  identity.

Calibrations (:class:`logicrank.pipelines.retrieval.methods.itlr.Calibration`), all label-free except ``sigmoid``:

- ``none``: the raw score (dense cosines; raw BM25 is unbounded, kept for the study only);
- ``max``: score / the term's largest score over the whole table (per-term max-normalisation;
  bm25, exact from the sparse scores);
- ``saturation``: score / the term's largest *possible* score, the sum over its words of
  idf x (k1 + 1) (BM25's saturation: the share of the term's weight the document reaches;
  bm25);
- ``zscore``: Phi((s - mean_t) / std_t), the term's mean and spread over a corpus sample (a
  probit fitted without labels);
- ``sigmoid``: fitted per term on labelled documents (the ITLR paper's appendix; needs labels).

The calibration study behind bm25's default is in docs/itlr.md.

Each scorer is one class with one protocol (:class:`Evidence`), so the ITLR stage runs one
engine over any of them: what a scorer does differently (its candidates in ``ann`` mode, the
documents of the table a ``listed`` file or an incoming run may name, whether exact scoring runs in shards of the
table's rows, its calibrations and its manifest line) is a method or attribute of its class;
:data:`EVIDENCE` maps the option value to the class, once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pandas as pd

from logicrank.pipelines.retrieval.logic.fuzzy import Operators
from logicrank.pipelines.retrieval.methods.itlr import (
    Calibration,
    LogicalQuery,
    ann_candidates,
    exact_shard,
    labelled_scores_from,
    listed_pairs,
    merge_exact,
    pair_ids,
    pair_vectors,
    score_exact,
    term_candidates,
    vector_term_raw,
)
from logicrank.schemas.errors import UserError


class EvidenceError(UserError, ValueError):
    """A scorer or calibration that cannot go together."""


Candidates = dict[str, tuple[np.ndarray, object]]  # query id -> (doc ids, the scorer's payload for them)


class Evidence:
    """What every scorer's evidence offers the ITLR engine and OrLog (subclasses set ``terms``,
    :meth:`raw`, :meth:`blocks`, :meth:`has`)."""

    name: str  # the scorer option's value
    calibrations: tuple[str, ...]  # those it takes, its default first
    encoder = False  # it embeds the terms (the stage needs the encoder)
    fulltext = False  # it reads the table's BM25 index
    counts_misses = True  # ann mode: its search may find nothing for a query's terms (counted as queries_without_candidates)
    sparse = False  # a raw score of 0 is a term the document misses (no evidence), not a low score
    terms: list[str]

    @classmethod
    def refusal(cls, chosen: str, where: str) -> str:
        """The line that refuses a calibration it does not take."""
        return f"{where}: scorer {cls.name!r} takes calibration {', '.join(cls.calibrations)}, not {chosen!r}."

    def raw(self, doc_ids: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    def blocks(self, block_rows: int, rows: tuple[int, int] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        raise NotImplementedError

    def has(self, doc_ids: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    def describe(self, calibration: str | None = None) -> str:
        """The calibration a manifest records."""
        return str(calibration)

    def empty_terms(self) -> dict[str, str]:
        """The terms with no evidence in any document of the table, each with why: dense
        evidence has a cosine for every pair, so none (hybrid's dense half likewise)."""
        return {}

    def calibrate(self, name: str, sample: int = 10_000, labels: Sequence[dict] | None = None) -> Calibration:
        return calibrate_evidence(self, name, sample, labels)

    # -- the ITLR engine's modes -------------------------------------------------------------
    def found(self, wanted: list[str], k: int, nprobes: int | None) -> dict[str, list[str]]:
        """ann mode: each wanted term's candidate documents."""
        raise NotImplementedError

    def candidates(self, queries: Sequence[LogicalQuery], k: int, nprobes: int | None) -> tuple[Candidates, list[LogicalQuery]]:
        """ann mode: each query's candidates (the union of its positive terms' :meth:`found`)
        and the queries without a positive term (scored exactly)."""
        return term_candidates(queries, self.terms, lambda wanted: self.found(wanted, k, nprobes))

    def listed(self, path: str, query_ids: set[str]) -> tuple[Candidates, int]:
        """listed mode: each query's listed documents the table holds, and how many listed pairs
        name a document it does not."""
        return self.given(listed_pairs(path, query_ids))

    def given(self, pairs: pd.DataFrame) -> tuple[Candidates, int]:
        """Each query's given candidates (``pairs``: query_id, doc_id, a listed file's or an
        incoming run's) the table holds, and how many pairs name a document it does not."""
        return pair_ids(pairs, self.has)

    def candidate_raw(self, candidates: Candidates) -> Callable[[np.ndarray, object], np.ndarray]:
        """(doc ids, payload) -> their raw scores, for :func:`score_listed`; every candidate's
        scores read once."""
        lookup = raw_lookup(self, [d for ids, _ in candidates.values() for d in ids])
        return lambda ids, _payload: lookup(ids)

    def pair_raw(self, doc_ids: pd.Series) -> Callable[[np.ndarray, np.ndarray, str], np.ndarray]:
        """(doc ids, term indices, query id) -> raw scores, for the side table of the ranked pairs ``doc_ids``."""
        ranked = raw_lookup(self, doc_ids.tolist())
        return lambda ids, idx, _qid: ranked(ids)[:, idx]

    def shard_task(self, queries, k: int, ops: Operators, calibration: Calibration, block_rows: int):
        """exact mode: ``task(store, (lo, hi))`` scoring one shard of the table's rows on a search
        actor (``Context.shards``), or None: scored here in one pass."""
        return None

    def score_blocks(self, queries, k: int, ops: Operators, calibration: Calibration, block_rows: int, pad: bool = False) -> pd.DataFrame:
        """exact mode in one pass over the table; ``pad``: as :meth:`exact`'s."""
        drop = self.sparse and not pad
        return score_exact(queries, self.terms, None, self.blocks(block_rows), k, [ops], calibration, drop_unsupported=drop)[ops]

    def exact(self, queries, k: int, ops: Operators, calibration: Calibration, block_rows: int, shards=None, pad: bool = False) -> pd.DataFrame:
        """exact mode: in shards of the table's rows where the scorer and ``shards`` (``Context.shards``) allow, else in one pass.
        ``pad`` False: over sparse evidence, a document whose composed score carries no evidence
        is no result (:func:`logicrank.pipelines.retrieval.methods.itlr.unsupported`)."""
        task = self.shard_task(queries, k, ops, calibration, block_rows)
        if task is not None and shards is not None:
            merged = shards(task, functools.partial(merge_exact, k=k, query_order=[q.query_id for q in queries]))
            if merged is not None:
                return merged
        return self.score_blocks(queries, k, ops, calibration, block_rows, pad)


class DenseEvidence(Evidence):
    """Cosines of the terms' embeddings with the documents' vectors."""

    name = "dense"
    calibrations = ("none", "zscore", "sigmoid")
    encoder = True
    counts_misses = False  # a vector search always finds neighbours

    def __init__(self, store, terms: Sequence[str], term_vectors: np.ndarray):
        self.store, self.terms = store, list(terms)
        self.T = np.asarray(term_vectors, dtype=np.float32)

    @classmethod
    def make(cls, store, terms: Sequence[str], encode=None, hybrid_weight: float = 0.5, sample: int = 10_000) -> DenseEvidence:
        return cls(store, terms, encode(list(terms)) if terms else np.zeros((0, store.dim), np.float32))

    def raw(self, doc_ids: Sequence[str]) -> np.ndarray:
        """(docs x terms) cosines; ``KeyError`` for a document the table lacks."""
        if len(doc_ids) == 0:
            return np.zeros((0, len(self.terms)), np.float32)
        vectors = self.store.vectors_for(list(dict.fromkeys(doc_ids)))
        missing = [d for d in doc_ids if d not in vectors]
        if missing:
            raise KeyError(f"dense evidence: no vector for document(s) {missing[:3]}")
        return np.stack([vectors[d] for d in doc_ids]) @ self.T.T

    def blocks(self, block_rows: int, rows: tuple[int, int] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for ids, vectors in self.store.vector_blocks(block_rows, **({} if rows is None else {"rows": rows})):
            yield ids, np.asarray(vectors, dtype=np.float32) @ self.T.T

    def has(self, doc_ids: Sequence[str]) -> np.ndarray:
        held = self.store.vectors_for(list(dict.fromkeys(doc_ids)))
        return np.array([d in held for d in doc_ids], dtype=bool)

    def sample(self, n: int) -> np.ndarray:
        return self.store.sample_vectors(n) @ self.T.T

    def search(self, wanted: list[str], k: int, nprobes: int | None, with_vectors: bool = False):
        """The vector search of the wanted terms' embeddings: a table (query_index, doc_id[, vector])."""
        order = {t: i for i, t in enumerate(self.terms)}
        return self.store.vector_search(self.T[[order[t] for t in wanted]], k, with_vectors=with_vectors, nprobes=nprobes)

    def candidates(self, queries, k: int, nprobes: int | None):
        """ann mode: each positive term's nearest documents, with their vectors (the payload
        each query's candidates are scored from)."""
        return ann_candidates(queries, self.terms, self.T, lambda v, n: self.store.vector_search(v, n, with_vectors=True, nprobes=nprobes), k)

    def given(self, pairs: pd.DataFrame):
        """The candidates with their vectors (the payload they are scored from)."""
        return pair_vectors(pairs, self.store)

    def candidate_raw(self, candidates):
        """Each query's candidates scored from their vectors (the payload), one product per query."""
        return lambda ids, vecs: np.asarray(vecs, dtype=np.float32) @ self.T.T

    def pair_raw(self, doc_ids: pd.Series):
        return vector_term_raw(self.T, self.store.vectors_for(doc_ids.unique().tolist()))

    def shard_task(self, queries, k, ops, calibration, block_rows):
        return functools.partial(exact_shard, queries, self.terms, self.T, k, ops, calibration, block_rows)

    def score_blocks(self, queries, k, ops, calibration, block_rows, pad=False):
        """The cosines composed straight from the document vectors (:func:`score_exact`'s products)."""
        return score_exact(queries, self.terms, self.T, self.store.vector_blocks(block_rows), k, [ops], calibration)[ops]


class BM25Evidence(Evidence):
    """Each term's BM25 score for every document of the table (terms x documents, sparse: the
    postings of the terms, made from the mapped index one segment at a time). The documents'
    ids are read from the index's mapped id column; the index's counts are never loaded whole."""

    name = "bm25"
    calibrations = ("max", "saturation", "zscore", "none", "sigmoid")
    fulltext = sparse = True

    def __init__(self, store, terms: Sequence[str]):
        self.index, self.terms = store.bm25_index(), list(terms)
        # terms x documents, by document (CSC: a block or a candidate set is a column slice)
        self.by_doc = self.index.term_scores(self.terms).tocsc()
        self.ids = self.index.doc_id_array()  # (a mapped index's ``doc_ids`` loads the whole saved index)
        self._rows: pd.Index | None = None

    @property
    def rows(self) -> pd.Index:
        """The documents' rows by id, made on the first look-up (candidates, a run's pairs)."""
        if self._rows is None:
            self._rows = pd.Index(self.ids.to_numpy(zero_copy_only=False))
        return self._rows

    @classmethod
    def make(cls, store, terms: Sequence[str], encode=None, hybrid_weight: float = 0.5, sample: int = 10_000) -> BM25Evidence:
        return cls(store, terms)

    def has(self, doc_ids: Sequence[str]) -> np.ndarray:
        """Which of the documents the table holds."""
        return self.rows.get_indexer(list(doc_ids)) >= 0

    def raw(self, doc_ids: Sequence[str]) -> np.ndarray:
        """(docs x terms) BM25 scores; ``KeyError`` for a document the table lacks."""
        rows = self.rows.get_indexer(list(doc_ids)) if len(doc_ids) else np.zeros(0, np.int64)
        if (rows < 0).any():
            raise KeyError(f"bm25 evidence: no document(s) {[d for d, r in zip(doc_ids, rows, strict=True) if r < 0][:3]} in the index")
        return self.by_doc[:, rows].toarray().T.astype(np.float32)

    def blocks(self, block_rows: int, rows: tuple[int, int] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        first, last = rows if rows is not None else (0, len(self.ids))
        for lo in range(first, last, block_rows):
            hi = min(lo + block_rows, last)
            yield self.ids.slice(lo, hi - lo).to_numpy(zero_copy_only=False), self.by_doc[:, lo:hi].toarray().T.astype(np.float32)

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """(sampled docs x terms) scores of up to ``n`` documents drawn uniformly."""
        n_docs = len(self.ids)
        pick = np.sort(np.random.default_rng(seed).choice(n_docs, n, replace=False)) if n < n_docs else np.arange(n_docs)
        return self.by_doc[:, pick].toarray().T.astype(np.float32)

    def maxima(self) -> np.ndarray:
        """Each term's largest score over the table (0 for a term no document holds)."""
        if self.by_doc.shape[1] == 0:  # an empty table
            return np.zeros(len(self.terms))
        return np.asarray(self.by_doc.max(axis=1).toarray(), dtype=np.float64).ravel()

    def empty_terms(self) -> dict[str, str]:
        """The terms no document of the table holds (every score 0), each with why: no word in
        it (the analyzer's split), only stop words or words too long to index (the analyzer keeps
        none of its words: LanceDB drops a token of 40 bytes or more), or words no document has."""
        from logicrank.pipelines.engines.bm25 import default_analyzer
        from logicrank.pipelines.engines.bm25.analyzer import MAX_TOKEN_BYTES, split_words

        def why(term: str) -> str:
            words = split_words(term)
            if not words:
                return "no word"
            if default_analyzer()(term):
                return "in no document"
            long = sum(len(w.encode()) >= MAX_TOKEN_BYTES for w in words)
            return "only stop words" if not long else "words too long to index" if long == len(words) else "only stop words and words too long to index"

        return {t: why(t) for t, m in zip(self.terms, self.maxima(), strict=True) if m <= 0}

    def bounds(self) -> np.ndarray:
        """Each term's largest possible score (BM25's saturation)."""
        return self.index.score_bounds(self.terms)

    def top(self, terms: Sequence[str], k: int) -> list[list[str]]:
        """Each term's ``k`` best documents (the bm25 stage's order), for candidate generation."""
        return [self.ids.take(np.asarray(rows, np.int64)).to_pylist() for rows, _ in self.index.search(list(terms), k)]

    def found(self, wanted, k, nprobes):
        """ann mode: each term's BM25 top k (only documents that share a word: maybe none)."""
        return dict(zip(wanted, self.top(wanted, k), strict=True))


class HybridEvidence(Evidence):
    """``w * bm25 + (1 - w) * dense``, each calibrated by its default (bm25 max, dense zscore)."""

    name = "hybrid"
    calibrations = ("none",)
    encoder = fulltext = True

    def __init__(self, dense: DenseEvidence, bm25: BM25Evidence, weight: float, sample: int):
        self.dense, self.bm25, self.weight, self.terms = dense, bm25, weight, dense.terms
        self.dense_cal = Calibration.zscore(self.terms, dense.sample(sample))
        self.bm25_cal = Calibration.divide("max", self.terms, bm25.maxima())

    @classmethod
    def make(cls, store, terms: Sequence[str], encode=None, hybrid_weight: float = 0.5, sample: int = 10_000) -> HybridEvidence:
        return cls(DenseEvidence.make(store, terms, encode), BM25Evidence(store, terms), hybrid_weight, sample)

    @classmethod
    def refusal(cls, chosen: str, where: str) -> str:
        return (f"{where}: scorer 'hybrid' calibrates each of its scorers by its default (bm25 max, dense zscore); "
                f"leave calibration unset, not {chosen!r}.")

    def combine(self, dense_raw: np.ndarray, bm25_raw: np.ndarray) -> np.ndarray:
        d = self.dense_cal.apply(np.asarray(dense_raw, np.float32), self.terms)
        b = self.bm25_cal.apply(np.asarray(bm25_raw, np.float32), self.terms)
        return (self.weight * b + (1.0 - self.weight) * d).astype(np.float32)

    def raw(self, doc_ids: Sequence[str]) -> np.ndarray:
        return self.combine(self.dense.raw(doc_ids), self.bm25.raw(doc_ids))

    def blocks(self, block_rows: int, rows: tuple[int, int] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for ids, dense_raw in self.dense.blocks(block_rows, rows):
            yield ids, self.combine(dense_raw, self.bm25.raw(ids))

    def has(self, doc_ids: Sequence[str]) -> np.ndarray:
        return self.bm25.has(doc_ids)

    def describe(self, calibration: str | None = None) -> str:
        return f"hybrid: {self.weight:g} x bm25 (max) + {1 - self.weight:g} x dense (zscore)"

    def found(self, wanted, k, nprobes):
        """ann mode: each term's BM25 top k, then its dense neighbours."""
        found = self.bm25.found(wanted, k, nprobes)
        if wanted:
            hits = self.dense.search(wanted, k, nprobes)
            for qi, doc in zip(hits.column("query_index").to_pylist(), hits.column("doc_id").to_pylist(), strict=True):
                found[wanted[qi]].append(doc)
        return found


EVIDENCE: dict[str, type[Evidence]] = {cls.name: cls for cls in (DenseEvidence, BM25Evidence, HybridEvidence)}
SCORERS = tuple(EVIDENCE)
CALIBRATIONS = {name: cls.calibrations for name, cls in EVIDENCE.items()}  # scorer -> the calibrations it takes, its default first


def evidence_class(scorer: str, where: str = "evidence") -> type[Evidence]:
    """The evidence class of a scorer option's value; an unknown one is one line naming the valid ones."""
    if scorer not in EVIDENCE:
        raise EvidenceError(f"{where}: unknown scorer {scorer!r}; valid: {', '.join(SCORERS)}.")
    return EVIDENCE[scorer]


def default_calibration(scorer: str) -> str:
    return EVIDENCE[scorer].calibrations[0]


def check_calibration(scorer: str, calibration: str | None, where: str) -> str:
    """The calibration a scorer uses (its default for None); a pair that does not go together
    is one line naming the valid ones."""
    cls = evidence_class(scorer, where)
    chosen = calibration or cls.calibrations[0]
    if chosen not in cls.calibrations:
        raise EvidenceError(cls.refusal(chosen, where))
    return chosen


def describe(evidence: Evidence, calibration: str) -> str:
    """The calibration a manifest records: its name, or hybrid's rule."""
    return evidence.describe(calibration)


def raw_lookup(evidence, doc_ids: Sequence[str]):
    """The raw scores of ``doc_ids`` read once (one table read for dense and hybrid evidence),
    as a function of any subset of them: (doc ids) -> (docs x terms)."""
    ids = list(dict.fromkeys(doc_ids))
    M = evidence.raw(ids) if ids else np.zeros((0, len(evidence.terms)), np.float32)
    at = pd.Index(ids)
    return lambda want: M[at.get_indexer(list(want))]


def make_evidence(scorer: str, store, terms: Sequence[str], encode=None, hybrid_weight: float = 0.5, sample: int = 10_000) -> Evidence:
    """The evidence object of ``scorer`` for ``terms``; ``encode(texts)`` embeds (dense, hybrid)."""
    return evidence_class(scorer).make(store, terms, encode, hybrid_weight, sample)


def calibrate_evidence(evidence, name: str, sample: int = 10_000, labels: Sequence[dict] | None = None) -> Calibration:
    """The calibration ``name`` fitted for this evidence (label-free but ``sigmoid``)."""
    terms = evidence.terms
    if name == "none":
        return Calibration()
    if name == "max":
        return Calibration.divide("max", terms, evidence.maxima())
    if name == "saturation":
        return Calibration.divide("saturation", terms, evidence.bounds())
    if name == "zscore":
        return Calibration.zscore(terms, evidence.sample(sample))
    if name == "sigmoid":  # labelled documents the table lacks are left out, as over dense vectors
        labels = list(labels or [])
        held = evidence.has([r["doc_id"] for r in labels]) if labels else np.zeros(0, bool)
        return Calibration.fit_sigmoid(labelled_scores_from([r for r, h in zip(labels, held, strict=True) if h], terms, evidence.raw))
    raise EvidenceError(f"unknown calibration {name!r}")
