"""Term evidence: how strongly a document holds a term, from any retrieval scorer.

ITLR composes per-term scores with fuzzy operators and OrLog takes each (candidate, atom)'s
P(True): both need, per (document, term), a number in [0, 1] for the operators and the
posterior to mean what they say (ITLR over dense cosines keeps its raw cosines by default, as
the paper does). Three scorers give the raw score:

- ``dense``: the cosine of the term's and the document's embeddings (ITLR's own evidence);
- ``bm25``: the term's text as a BM25 query over the table, through the batch engine
  (:mod:`logicrank.pipelines.sparse`, the bm25 stage's scores), exact over every document;
- ``hybrid``: both, each calibrated by its own default (bm25: ``max``; dense: ``zscore``),
  combined per term as the weighted mean ``w * bm25 + (1 - w) * dense`` with ``w`` =
  ``hybrid_weight`` (default 0.5). Its evidence is already in [0, 1]: its calibration is the
  identity.

Calibrations (:class:`logicrank.pipelines.methods.itlr.Calibration`), all label-free except ``sigmoid``:

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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

from logicrank.pipelines.methods.itlr import Calibration
from logicrank.schemas.errors import UserError

SCORERS = ("dense", "bm25", "hybrid")
CALIBRATIONS = {  # scorer -> the calibrations it takes, its default first
    "dense": ("none", "zscore", "sigmoid"),
    "bm25": ("max", "saturation", "zscore", "none", "sigmoid"),
    "hybrid": ("none",),
}


class EvidenceError(UserError, ValueError):
    """A scorer or calibration that cannot go together."""


def default_calibration(scorer: str) -> str:
    return CALIBRATIONS[scorer][0]


def check_calibration(scorer: str, calibration: str | None, where: str) -> str:
    """The calibration a scorer uses (its default for None); a pair that does not go together
    is one line naming the valid ones."""
    if scorer not in SCORERS:
        raise EvidenceError(f"{where}: unknown scorer {scorer!r}; valid: {', '.join(SCORERS)}.")
    chosen = calibration or default_calibration(scorer)
    if chosen not in CALIBRATIONS[scorer]:
        if scorer == "hybrid":
            raise EvidenceError(f"{where}: scorer 'hybrid' calibrates each of its scorers by its default (bm25 max, dense zscore); "
                                f"leave calibration unset, not {chosen!r}.")
        raise EvidenceError(f"{where}: scorer {scorer!r} takes calibration {', '.join(CALIBRATIONS[scorer])}, not {chosen!r}.")
    return chosen


class DenseEvidence:
    """Cosines of the terms' embeddings with the documents' vectors."""

    scorer = "dense"

    def __init__(self, store, terms: Sequence[str], term_vectors: np.ndarray):
        self.store, self.terms = store, list(terms)
        self.T = np.asarray(term_vectors, dtype=np.float32)

    def raw(self, doc_ids: Sequence[str]) -> np.ndarray:
        """(docs x terms) cosines; ``KeyError`` for a document the table lacks."""
        if len(doc_ids) == 0:
            return np.zeros((0, len(self.terms)), np.float32)
        vectors = self.store.vectors_for(list(dict.fromkeys(doc_ids)))
        missing = [d for d in doc_ids if d not in vectors]
        if missing:
            raise KeyError(f"dense evidence: no vector for document(s) {missing[:3]}")
        return np.stack([vectors[d] for d in doc_ids]) @ self.T.T

    def blocks(self, block_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for ids, vectors in self.store.vector_blocks(block_rows):
            yield ids, np.asarray(vectors, dtype=np.float32) @ self.T.T

    def has(self, doc_ids: Sequence[str]) -> np.ndarray:
        held = self.store.vectors_for(list(dict.fromkeys(doc_ids)))
        return np.array([d in held for d in doc_ids], dtype=bool)

    def sample(self, n: int) -> np.ndarray:
        return self.store.sample_vectors(n) @ self.T.T


class BM25Evidence:
    """Each term's BM25 score for every document of the table (terms x documents, sparse)."""

    scorer = "bm25"

    def __init__(self, store, terms: Sequence[str]):
        self.index, self.terms = store.bm25_index(), list(terms)
        # terms x documents, by document (CSC: a block or a candidate set is a column slice)
        self.by_doc = self.index.term_scores(self.terms).tocsc()
        self.rows = pd.Index(self.index.doc_ids)

    def has(self, doc_ids: Sequence[str]) -> np.ndarray:
        """Which of the documents the table holds."""
        return self.rows.get_indexer(list(doc_ids)) >= 0

    def raw(self, doc_ids: Sequence[str]) -> np.ndarray:
        """(docs x terms) BM25 scores; ``KeyError`` for a document the table lacks."""
        rows = self.rows.get_indexer(list(doc_ids)) if len(doc_ids) else np.zeros(0, np.int64)
        if (rows < 0).any():
            raise KeyError(f"bm25 evidence: no document(s) {[d for d, r in zip(doc_ids, rows, strict=True) if r < 0][:3]} in the index")
        return self.by_doc[:, rows].toarray().T.astype(np.float32)

    def blocks(self, block_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for lo in range(0, len(self.rows), block_rows):
            hi = min(lo + block_rows, len(self.rows))
            yield self.index.doc_ids[lo:hi], self.by_doc[:, lo:hi].toarray().T.astype(np.float32)

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """(sampled docs x terms) scores of up to ``n`` documents drawn uniformly."""
        n_docs = len(self.rows)
        pick = np.sort(np.random.default_rng(seed).choice(n_docs, n, replace=False)) if n < n_docs else np.arange(n_docs)
        return self.by_doc[:, pick].toarray().T.astype(np.float32)

    def maxima(self) -> np.ndarray:
        """Each term's largest score over the table (0 for a term no document holds)."""
        if self.by_doc.shape[1] == 0:  # an empty table
            return np.zeros(len(self.terms))
        return np.asarray(self.by_doc.max(axis=1).toarray(), dtype=np.float64).ravel()

    def bounds(self) -> np.ndarray:
        """Each term's largest possible score (BM25's saturation)."""
        return self.index.score_bounds(self.terms)

    def top(self, terms: Sequence[str], k: int) -> list[list[str]]:
        """Each term's ``k`` best documents (the bm25 stage's order), for candidate generation."""
        return [self.index.doc_ids[rows].tolist() for rows, _ in self.index.search(list(terms), k)]


class HybridEvidence:
    """``w * bm25 + (1 - w) * dense``, each calibrated by its default (bm25 max, dense zscore)."""

    scorer = "hybrid"

    def __init__(self, dense: DenseEvidence, bm25: BM25Evidence, weight: float, sample: int):
        self.dense, self.bm25, self.weight, self.terms = dense, bm25, weight, dense.terms
        self.dense_cal = Calibration.zscore(self.terms, dense.sample(sample))
        self.bm25_cal = Calibration.divide("max", self.terms, bm25.maxima())

    def combine(self, dense_raw: np.ndarray, bm25_raw: np.ndarray) -> np.ndarray:
        d = self.dense_cal.apply(np.asarray(dense_raw, np.float32), self.terms)
        b = self.bm25_cal.apply(np.asarray(bm25_raw, np.float32), self.terms)
        return (self.weight * b + (1.0 - self.weight) * d).astype(np.float32)

    def raw(self, doc_ids: Sequence[str]) -> np.ndarray:
        return self.combine(self.dense.raw(doc_ids), self.bm25.raw(doc_ids))

    def blocks(self, block_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for ids, dense_raw in self.dense.blocks(block_rows):
            yield ids, self.combine(dense_raw, self.bm25.raw(ids))

    def has(self, doc_ids: Sequence[str]) -> np.ndarray:
        return self.bm25.has(doc_ids)

    def describe(self) -> str:
        return f"hybrid: {self.weight:g} x bm25 (max) + {1 - self.weight:g} x dense (zscore)"


def describe(evidence, calibration: str) -> str:
    """The calibration a manifest records: its name, or hybrid's rule."""
    return evidence.describe() if evidence.scorer == "hybrid" else calibration


def raw_lookup(evidence, doc_ids: Sequence[str]):
    """The raw scores of ``doc_ids`` read once (one table read for dense and hybrid evidence),
    as a function of any subset of them: (doc ids) -> (docs x terms)."""
    ids = list(dict.fromkeys(doc_ids))
    M = evidence.raw(ids) if ids else np.zeros((0, len(evidence.terms)), np.float32)
    at = pd.Index(ids)
    return lambda want: M[at.get_indexer(list(want))]


def make_evidence(scorer: str, store, terms: Sequence[str], encode=None, hybrid_weight: float = 0.5, sample: int = 10_000):
    """The evidence object of ``scorer`` for ``terms``; ``encode(texts)`` embeds (dense, hybrid)."""
    if scorer == "bm25":
        return BM25Evidence(store, terms)
    dense = DenseEvidence(store, terms, encode(list(terms)) if terms else np.zeros((0, store.dim), np.float32))
    if scorer == "dense":
        return dense
    return HybridEvidence(dense, BM25Evidence(store, terms), hybrid_weight, sample)


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
        from logicrank.pipelines.methods.itlr import labelled_scores_from

        labels = list(labels or [])
        held = evidence.has([r["doc_id"] for r in labels]) if labels else np.zeros(0, bool)
        return Calibration.fit_sigmoid(labelled_scores_from([r for r, h in zip(labels, held, strict=True) if h], terms, evidence.raw))
    raise EvidenceError(f"unknown calibration {name!r}")
