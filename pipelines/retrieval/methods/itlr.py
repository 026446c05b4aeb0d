"""ITLR: inference-time logical reasoning over dense scores (ACL 2025, arXiv 2503.17860).

A query's ``logical_query`` (e.g. ``"vitamin D" AND NOT "bone health"``) is parsed; each
distinct term across all queries is embedded once; every document gets one cosine per
term; per-term scores are optionally calibrated, then composed along the parse tree with
named fuzzy operator families (:mod:`logicrank.pipelines.retrieval.logic.fuzzy`). The same composition takes the
raw scores of any other scorer (BM25, hybrid: :mod:`logicrank.pipelines.retrieval.methods.evidence`).

Candidate modes:

- ``exact``: every document is scored. Document vectors stream in blocks; per block one
  (block x terms) matrix product, then composition, and a running top-k per query, so
  memory is bounded by block size + queries x k whatever the corpus size. NOT is exact:
  a document's negated-term scores are always known.
- ``ann``: candidates are the union of each *positive* term's top ``ann_k`` neighbours
  (terms not under an odd number of NOTs); candidates are then re-scored exactly on every
  term, negated ones included. NOT can therefore only demote candidates, never bring in a
  document no positive term found. A query with no positive term (``NOT "x"``) is scored
  in exact mode.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from logicrank.pipelines.engines.embed import to_matrix
from logicrank.pipelines.retrieval.logic.fuzzy import Operators, compile_query
from logicrank.pipelines.retrieval.logic.query import (
    Node,
    QueryParseError,
    Term,
    negated_terms,
    parse,
    positive_terms,
    quote,
    relabel,
)
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import QUERIES, require_columns

TERM_SCORES = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("term_id", pa.int32(), nullable=False),  # index into the run's unique terms
        pa.field("term", pa.string(), nullable=False),
        pa.field("score", pa.float64(), nullable=False),  # the scorer's raw score (cosine, BM25; hybrid: its mix, in [0, 1])
        pa.field("calibrated", pa.float64(), nullable=False),  # what was composed
    ]
)


@dataclass(frozen=True)
class LogicalQuery:
    query_id: str
    ast: Node
    status: str  # ok | fallback
    error: str | None = None


def parse_queries(queries: pa.Table) -> list[LogicalQuery]:
    """Parse every query's logical form; a missing or bad one falls back to the raw text as
    a single term (kept, with the reason), never dropped."""
    require_columns(queries, QUERIES, "itlr")
    out = []
    for qid, text, logical in zip(*(queries.column(c).to_pylist() for c in ("query_id", "text", "logical_query")), strict=True):
        if not logical:
            out.append(LogicalQuery(qid, Term(text), "fallback", "no logical_query"))
            continue
        try:
            out.append(LogicalQuery(qid, parse(logical), "ok"))
        except QueryParseError as exc:
            out.append(LogicalQuery(qid, Term(text), "fallback", str(exc).splitlines()[0]))
    return out


def unfitted_terms(calibration: Calibration, parsed: Sequence[LogicalQuery], empty: Mapping[str, str] | frozenset = frozenset()) -> list[str]:
    """The terms composed with others (in a query of more than one term) that a ``sigmoid``
    calibration has no fit for (no labelled document holds the term beside one that does not):
    they are composed raw (a cosine, BM25's unbounded score) beside calibrated terms, out of
    [0, 1], so the run names them. A query of one term (a fallback's whole text) ranks by its
    raw score alike, and a term no document holds is 0 whatever the calibration: neither is
    named."""
    if calibration.name != "sigmoid":
        return []
    composed = dict.fromkeys(t for q in parsed if len(set(q.ast.terms())) > 1 for t in q.ast.terms())
    return [t for t in composed if t not in calibration.params and t not in empty]


class EmptyNotError(UserError, ValueError):
    """A NOT over a term no document holds: it would hold for every document."""


class ScoreError(UserError, ValueError):
    """A composed score that is NaN: a document it ranks nowhere would silently leave the run."""


def refuse_unrankable(scores: np.ndarray, queries: Sequence[LogicalQuery], doc_ids, strict_not: bool = False) -> None:
    """Raise :class:`ScoreError` where the (queries x docs) composed ``scores`` hold a NaN (a NaN
    in the table's vectors, or a calibration that divides by a zero spread) or an infinity
    (``not=reciprocal`` overflowed: 1/1e-6 for each negated term a document misses, past
    float32's range at seven; -inf where the reciprocals multiply a negative score): such a
    document would rank below every other, or be dropped as an exclusion, and leave the run
    without a word. With ``strict_not`` (the operators' ``strict_not`` is set) -inf is strict
    NOT's exclusion, not refused. ``doc_ids``: the columns' ids."""
    overflow = np.isinf(scores) if not strict_not else np.isposinf(scores)
    for bad, what, why in ((np.isnan(scores), "NaN", "a NaN in the table's vectors or its term scores, or a calibration with a zero spread"),
                           (overflow, "infinite", "an operator past float32's range: not=reciprocal over many negated terms "
                                                  "a document misses; use not=complement")):
        if bad.any():
            q, d = (int(i[0]) for i in np.nonzero(bad))
            raise ScoreError(f"itlr: {int(bad.sum())} composed score(s) are {what}, e.g. query {queries[q].query_id!r}, doc {doc_ids[d]!r} "
                             f"({why}); nothing is ranked.")


def empty_not_queries(parsed: Sequence[LogicalQuery], empty: dict[str, str]) -> list[str]:
    """The ids of the queries that negate a term with no evidence in the table (``empty``)."""
    return [q.query_id for q in parsed if negated_terms(q.ast) & empty.keys()]


def refuse_empty_nots(parsed: Sequence[LogicalQuery], empty: dict[str, str], where: str = "itlr") -> None:
    """Refuse the queries that negate a term with no evidence in the table (``empty``: term ->
    why, :meth:`~logicrank.pipelines.retrieval.methods.evidence.Evidence.empty_terms`): NOT of it is 1
    for every document, so the NOT would exclude nothing (``AND NOT "the"`` silently dropped).
    ``where``: the stage or command named first in the line."""
    found = [(q.query_id, t) for q in parsed for t in sorted(negated_terms(q.ast) & empty.keys(), key=q.ast.terms().index)]
    if not found:
        return
    qid, term = found[0]
    why = f"NOT {quote(term)} negates a term no document holds ({empty[term]}), so it would hold for every document"
    if len(found) == 1:
        head = f"{where}: query {qid}'s {why}"
    else:
        ids = list(dict.fromkeys(q for q, _ in found))
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        head = f"{where}: {len(ids)} quer{'y negates' if len(ids) == 1 else 'ies negate'} terms no document holds ({shown}); {qid}'s {why}"
    raise EmptyNotError(head + "; remove the NOT, or negate words the table's documents hold (the scorer's words: bm25 drops stop words), "
                        "or let such a NOT hold for every document (itlr's empty_not: hold).")


def unique_terms(queries: Sequence[LogicalQuery]) -> list[str]:
    """Every distinct term of the queries, in first-seen order (each is embedded once)."""
    return list(dict.fromkeys(t for q in queries for t in q.ast.terms()))


# -- calibration ---------------------------------------------------------------------------
@dataclass
class Calibration:
    """Maps raw cosines (docs x terms) to the values composed.

    - ``none``: raw cosines;
    - ``zscore`` (unsupervised): Phi((s - mean_t) / std_t), the term's mean and std over a
      corpus sample: "how unusually high is this score for this term", in (0, 1);
    - ``sigmoid`` (supervised, the paper's appendix): sigmoid((s - tau_t) * lambda_t), fitted
      per term on labelled positive and negative documents;
    - ``max`` and ``saturation`` (BM25, :mod:`logicrank.pipelines.retrieval.methods.evidence`): s / b_t clipped to
      [0, 1], b_t the term's largest score over the table or its largest possible score.
    """

    name: str = "none"
    params: dict[str, tuple[float, float]] = field(default_factory=dict)  # term -> (a, b)
    # terms with no evidence anywhere in the table (Evidence.empty_terms): 0 for every document
    # whatever the calibration (zscore would make a term no document holds 0.5 everywhere)
    empty: frozenset[str] = frozenset()

    NAMES = ("none", "zscore", "sigmoid", "max", "saturation")

    def __post_init__(self):
        if self.name not in self.NAMES:
            raise ValueError(f"unknown calibration {self.name!r}; valid: {', '.join(self.NAMES)}.")

    @classmethod
    def zscore(cls, terms: Sequence[str], sample_scores: np.ndarray) -> Calibration:
        """``sample_scores``: (sample docs x terms) raw cosines."""
        mean, std = sample_scores.mean(axis=0), sample_scores.std(axis=0)
        return cls("zscore", {t: (float(m), float(max(s, 1e-6))) for t, m, s in zip(terms, mean, std, strict=True)})

    @classmethod
    def divide(cls, name: str, terms: Sequence[str], divisors: np.ndarray) -> Calibration:
        """s / b_t per term (``max``, ``saturation``); a term with b_t <= 0 (no document
        holds it) maps every score to 0."""
        return cls(name, {t: (0.0, float(b)) for t, b in zip(terms, divisors, strict=True)})

    @classmethod
    def fit_sigmoid(cls, labelled: dict[str, tuple[np.ndarray, np.ndarray]]) -> Calibration:
        """``labelled``: term -> (scores of positives, scores of negatives)."""
        from sklearn.linear_model import LogisticRegression

        params = {}
        for term, (pos, neg) in labelled.items():
            x = np.concatenate([pos, neg]).reshape(-1, 1)
            y = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
            if len(pos) == 0 or len(neg) == 0:
                continue  # nothing to separate: the term stays uncalibrated
            lr = LogisticRegression(C=100.0).fit(x, y)
            lam = float(lr.coef_[0, 0])
            tau = -float(lr.intercept_[0]) / lam if lam else 0.0
            params[term] = (tau, lam)
        return cls("sigmoid", params)

    @property
    def keeps_zero(self) -> bool:
        """Whether a raw 0 (a term the document misses, over sparse evidence) stays 0: none, max
        and saturation; zscore and sigmoid give it a positive value."""
        return self.name in ("none", "max", "saturation")

    def apply(self, S: np.ndarray, terms: Sequence[str]) -> np.ndarray:
        if self.name == "none" and not self.empty:
            return S
        from scipy.special import expit, ndtr

        out = np.array(S, copy=True)
        for j, t in enumerate(terms):
            if t in self.empty:
                out[:, j] = 0.0
                continue
            if t not in self.params:
                continue
            a, b = self.params[t]
            if self.name == "zscore":
                out[:, j] = ndtr((S[:, j] - a) / b)
            elif self.name == "sigmoid":
                out[:, j] = expit((S[:, j] - a) * b)
            else:
                out[:, j] = np.clip(S[:, j] / b, 0.0, 1.0) if b > 0 else 0.0
        return out


_TILE = 2048  # columns composed at a time


# -- scoring -------------------------------------------------------------------------------
class _TopK:
    """Running top-k (score, doc id, table row) per query over streamed blocks, in the run's
    order (``rank_pairs``'): score descending, then doc id descending. Ties at the k-th score
    (common over BM25 evidence: every document a NOT-only query's term misses scores 1) thus go
    to the largest doc ids, whatever the table's row order, the block size, the number of
    threads or shards, and whatever k: the top k is the first k of a deeper run's. Excluded
    documents (-inf) never enter. Doc ids are held as numpy strings, compared in C."""

    def __init__(self, n_queries: int, k: int):
        self.k = k
        self.scores = np.full((n_queries, 0), -np.inf, dtype=np.float32)
        self.rows = np.zeros((n_queries, 0), dtype=np.int64)
        self.ids = np.zeros((n_queries, 0), dtype=str)

    def push(self, block_scores: np.ndarray, first_row: int, block_ids: np.ndarray) -> None:
        n_q, width = block_scores.shape
        if self.scores.shape[1] == self.k:
            # only scores at least the current k-th best can enter (one tied with it, by its doc id)
            hits = block_scores >= self.scores.min(axis=1, keepdims=True)
        elif width >= self.k:
            # not yet k kept: the k-th best of a leading sample of the block is a lower bound of the
            # k-th best overall, so nothing below it can enter
            n_sample = max(self.k, min(width, 4096))
            kth = np.partition(block_scores[:, :n_sample], -self.k, axis=1)[:, -self.k :][:, :1]
            hits = block_scores >= kth
        else:
            hits = np.ones(block_scores.shape, dtype=bool)
        hits &= block_scores > -np.inf  # an excluded document is no result
        flat = np.flatnonzero(hits)  # (flat is ~4x faster than 2-d nonzero)
        if len(flat) == 0:
            return
        hit_q, hit_col = np.divmod(flat, width)
        per_q = np.bincount(hit_q, minlength=n_q)
        most = int(per_q.max(initial=0))
        if most > self.k and most > width // 4:  # a tie over much of the block: the block itself, what cannot enter at -inf
            scores, cols = np.where(hits, block_scores, -np.inf), np.broadcast_to(np.arange(width), (n_q, width))
        else:  # the hits alone, each query's in its row
            slot = np.arange(len(flat)) - np.repeat(np.cumsum(per_q) - per_q, per_q)
            scores = np.full((n_q, max(most, 1)), -np.inf, dtype=block_scores.dtype)
            cols = np.zeros((n_q, max(most, 1)), dtype=np.int64)
            scores[hit_q, slot] = block_scores.reshape(-1)[flat]
            cols[hit_q, slot] = hit_col
        block_ids = np.asarray(block_ids, dtype=object)
        if scores.shape[1] > self.k:  # the k best of each query's hits, ties by id in the block's own order of its ids
            order: list[np.ndarray] = []

            def key(rows: np.ndarray) -> np.ndarray:
                if not order:
                    order.append(np.unique(block_ids.astype(str), return_inverse=True)[1].reshape(-1))  # each id's place, ascending
                return -order[0][cols[rows]]  # the largest id first

            keep = _best_columns(scores, key, self.k)
            scores, cols = np.take_along_axis(scores, keep, axis=1), np.take_along_axis(cols, keep, axis=1)
        self._merge(scores, first_row + cols, np.where(np.isfinite(scores), block_ids[cols], "").astype(str))

    def _merge(self, block_scores: np.ndarray, block_rows: np.ndarray, block_ids: np.ndarray) -> None:
        scores = np.concatenate([self.scores, block_scores], axis=1)
        rows = np.concatenate([self.rows, block_rows], axis=1)
        ids = np.concatenate([self.ids, block_ids], axis=1)
        if scores.shape[1] > self.k:
            def key(over: np.ndarray) -> np.ndarray:
                _, order = np.unique(ids[over], return_inverse=True)
                return -order.reshape(len(over), -1)

            keep = _best_columns(scores, key, self.k)
            scores, rows, ids = (np.take_along_axis(a, keep, axis=1) for a in (scores, rows, ids))
        self.scores, self.rows, self.ids = scores, rows, ids

    @classmethod
    def merged(cls, parts: Sequence[_TopK]) -> _TopK:
        """One top-k over the rows of several (disjoint) top-k."""
        out = cls(parts[0].scores.shape[0], parts[0].k)
        for p in parts:
            out._merge(p.scores, p.rows, p.ids)
        return out


def _best_columns(scores: np.ndarray, key: Callable[[np.ndarray], np.ndarray], k: int) -> np.ndarray:
    """Per query (row of ``scores``), the columns of its ``k`` best entries by score descending,
    then ``key`` ascending (``key(rows)``: the keys of those rows' entries, asked only of the
    rows with more ties at the k-th score than places); ``scores`` is wider than ``k``."""
    kth = np.partition(scores, -k, axis=1)[:, -k][:, None]  # each query's k-th largest score
    above, tied = scores > kth, scores == kth
    need = k - above.sum(axis=1)  # how many of the tied entries each query keeps (>= 1)
    keep = above | tied
    over = np.flatnonzero(tied.sum(axis=1) > need)  # more ties than places: the smallest keys win
    for lo in range(0, len(over), _KEY_ROWS):  # (in parts: a tie may span a whole block, for every query)
        rows = over[lo : lo + _KEY_ROWS]
        order = np.argsort(np.where(tied[rows], key(rows), np.iinfo(np.int64).max), axis=1, kind="stable")
        place = np.empty_like(order)
        np.put_along_axis(place, order, np.broadcast_to(np.arange(order.shape[1]), order.shape), axis=1)
        keep[rows] = above[rows] | (place < need[rows, None])
    return np.nonzero(keep)[1].reshape(len(scores), k)


_KEY_ROWS = 256  # queries whose ties are ordered at once (:func:`_best_columns`)


def score_exact(
    queries: Sequence[LogicalQuery],
    terms: Sequence[str],
    term_vectors: np.ndarray,
    doc_blocks: Iterable[tuple[np.ndarray, np.ndarray]],
    k: int,
    operators: Sequence[Operators],
    calibration: Calibration,
    threads: int | None = None,
    first_row: int = 0,
    with_rows: bool = False,
    drop_unsupported: bool = False,
) -> dict[Operators, pd.DataFrame]:
    """Top-k (query_id, doc_id, score) per operator choice, every document scored.

    ``first_row``: the table row of the blocks' first document (a shard's first row);
    ``with_rows`` adds each pair's table ``row``. The top k is in the run's order (score
    descending, then doc id descending: :class:`_TopK`), so the top k of several shards merge
    exactly (:func:`merge_exact`).

    ``doc_blocks`` yields (doc_ids, unit vectors) blocks; composing several operator
    choices costs one pass over the corpus. Queries are grouped by formula shape; the
    score rows are laid out group by group, slot by slot, so the scores of slot j of every
    query of a shape are one contiguous (queries x docs) slab and composition reads views,
    never gathers. Per block: one product (BLAS, all cores) straight into that layout when
    few terms repeat across queries (else a product over unique terms, then one gather);
    then the block's columns are split across ``threads`` (default: the cores this process
    may use), each composing every query over its columns in float32 into its own running
    top-k (numpy releases the GIL); the per-thread top-k are merged at the end.

    ``term_vectors`` None: ``doc_blocks`` yield (doc_ids, (docs x terms) raw scores) of any
    scorer instead (:mod:`logicrank.pipelines.retrieval.methods.evidence`), composed the same way.
    ``drop_unsupported`` (raw scores only): a document whose score carries no evidence is no
    result of a query (:func:`unsupported`).
    """
    groups = _shape_groups(queries, terms)
    compiled = {ops: [compile_query(shape, slots, ops) for shape, slots, _, _ in groups] for ops in operators}
    positive = [sorted(int(s) for s in positive_terms(shape)) for shape, *_ in groups]  # each shape's positive slots
    n_threads = max(1, threads or len(os.sched_getaffinity(0)))
    tops = {ops: [_TopK(len(queries), k) for _ in range(n_threads)] for ops in operators}
    T = None if term_vectors is None else np.asarray(term_vectors, dtype=np.float32)
    layout = np.concatenate([idx.T.reshape(-1) for *_, idx in groups]) if groups else np.zeros(0, np.int64)
    offsets = np.cumsum([0] + [idx.size for *_, idx in groups])
    layout_terms = [terms[i] for i in layout]
    direct = len(layout) <= 1.5 * len(terms)  # the product straight into the layout costs at most 1.5x
    T_rows = T[layout] if direct and T is not None else T

    def compose(M: np.ndarray, E: np.ndarray | None, Z: np.ndarray | None, part: int, first_row: int, block_ids: np.ndarray) -> None:
        cols = np.array_split(np.arange(M.shape[1]), n_threads)[part]
        if len(cols) == 0:
            return
        lo, hi = int(cols[0]), int(cols[-1]) + 1
        for ops, fs in compiled.items():
            block = np.empty((len(queries), hi - lo), dtype=M.dtype)
            # column tiles small enough that the temporaries stay in cache
            for t0 in range(lo, hi, _TILE):
                t1 = min(hi, t0 + _TILE)
                for f, (_, slots, rows, _), start, pos in zip(fs, groups, offsets, positive, strict=False):
                    slab = M[start : start + len(slots) * len(rows), t0:t1].reshape(len(slots), len(rows), t1 - t0)
                    scores = f(slab.transpose(1, 2, 0))  # (queries, docs, slots), a view
                    if not np.isfinite(scores).all():  # (before unsupported documents are marked -inf below)
                        refuse_unrankable(scores, [queries[r] for r in rows], block_ids[t0:t1], ops.strict_not is not None)
                    if E is not None:  # the raw evidence laid out as M: :func:`unsupported`'s rule
                        held = E[start : start + len(slots) * len(rows), t0:t1].reshape(len(slots), len(rows), t1 - t0)[pos].any(axis=0)
                        support = scores if Z is None else f(Z[start : start + len(slots) * len(rows), t0:t1].reshape(
                            len(slots), len(rows), t1 - t0).transpose(1, 2, 0))
                        scores = np.where((support == 0) & ~held, -np.inf, scores)
                    block[rows, t0 - lo : t1 - lo] = scores
            tops[ops][part].push(block, first_row + lo, block_ids[lo:hi])

    seen = first_row
    with ThreadPoolExecutor(n_threads) as pool:
        for block_ids, vecs in doc_blocks:
            ids_now = np.asarray(block_ids, dtype=object)
            V = np.asarray(vecs, dtype=np.float32)
            E = Z = None
            if T_rows is None:  # raw scores given (docs x terms): calibrated per term, then laid out
                M = np.ascontiguousarray(calibration.apply(V, terms).T)[layout]  # (layout rows x docs): rows gathered whole
                E = np.ascontiguousarray((V > 0).T)[layout] if drop_unsupported else None
                Z = M * E if E is not None and not calibration.keeps_zero else None  # the terms a document misses at 0
            else:  # the cosines, straight into the layout
                M = T_rows @ V.T if direct else (T_rows @ V.T)[layout]
                M = np.ascontiguousarray(calibration.apply(M.T, layout_terms).T)
            for done in [pool.submit(compose, M, E, Z, part, seen, ids_now) for part in range(n_threads)]:
                done.result()
            seen += len(block_ids)
    out = {ops: _pairs(queries, _TopK.merged(parts)) for ops, parts in tops.items()}
    return out if with_rows else {ops: df.drop(columns="row") for ops, df in out.items()}


def exact_shard(queries, terms, term_vectors, k, ops, calibration, block_rows, store, rows: tuple[int, int]) -> pd.DataFrame:
    """ITLR exact over one shard of the table's rows (a search actor's part of ``Context.shards``):
    its top k with their table rows, which :func:`merge_exact` merges exactly."""
    blocks = store.vector_blocks(block_rows, rows=rows)
    return score_exact(queries, terms, term_vectors, blocks, k, [ops], calibration, first_row=rows[0], with_rows=True)[ops]


def merge_exact(parts: Sequence[pd.DataFrame], k: int, query_order: Sequence[str]) -> pd.DataFrame:
    """The top k of several shards' :func:`score_exact` (each over its own rows of the table)
    under the order one pass keeps, and laid out as one pass lays them out: the queries in
    ``query_order``, each one's pairs by score descending, then doc id descending. Exact:
    each shard kept its own k best under that order."""
    if not parts:
        return pd.DataFrame({"query_id": [], "doc_id": [], "score": []})
    both = pd.concat(parts, ignore_index=True)
    both["position"] = both["query_id"].map({q: i for i, q in enumerate(query_order)})
    both = both.sort_values(["position", "score", "doc_id"], ascending=[True, False, False], kind="stable")
    return both.groupby("position", sort=False).head(k).drop(columns=["row", "position"]).reset_index(drop=True)


def _shape_groups(queries: Sequence[LogicalQuery], terms: Sequence[str]):
    """Queries grouped by the shape of their formula (terms replaced by slots in order of
    first appearance): [(shape AST, slot names, query rows, term index per query x slot)]."""
    index = {t: i for i, t in enumerate(terms)}
    by_shape: dict[str, list[int]] = {}
    slotted: dict[str, Node] = {}
    for row, q in enumerate(queries):
        slots = {t: f"{i}" for i, t in enumerate(q.ast.terms())}
        shape = relabel(q.ast, slots)
        key = str(shape)
        by_shape.setdefault(key, []).append(row)
        slotted[key] = shape
    out = []
    for key, rows in by_shape.items():
        n_slots = len(slotted[key].terms())
        idx = np.array([[index[t] for t in queries[r].ast.terms()] for r in rows], dtype=np.int64).reshape(len(rows), n_slots)
        out.append((slotted[key], [str(i) for i in range(n_slots)], np.array(rows), idx))
    return out


def compose(queries: Sequence[LogicalQuery], terms: Sequence[str], raw: np.ndarray, ops: Operators, calibration: Calibration) -> np.ndarray:
    """(queries x docs) ITLR scores from the (docs x terms) raw cosines ``raw``: calibrated,
    then each query's form composed with ``ops``. The re-scoring of candidates and the
    synthetic benchmark's full matrices use it; :func:`score_exact` is the same composition in
    blocks over the whole table (tests/unit/test_itlr.py holds them equal)."""
    C = calibration.apply(np.asarray(raw, dtype=np.float32), terms)
    return np.stack([compile_query(q.ast, terms, ops)(C) for q in queries]) if queries else np.zeros((0, len(raw)), np.float32)


def score_candidates(
    queries: Sequence[LogicalQuery],
    terms: Sequence[str],
    term_vectors: np.ndarray,
    candidates: dict[str, tuple[np.ndarray, np.ndarray]],
    k: int,
    ops: Operators,
    calibration: Calibration,
) -> pd.DataFrame:
    """Exact re-scoring of each query's own candidates: query_id -> (doc_ids, vectors)."""
    T = np.asarray(term_vectors, dtype=np.float32)
    return score_listed(queries, terms, lambda ids, vecs: np.asarray(vecs, dtype=np.float32) @ T.T, candidates, k, ops, calibration)


def score_listed(queries: Sequence[LogicalQuery], terms: Sequence[str], raw, candidates: dict, k: int, ops: Operators,
                 calibration: Calibration, drop_unsupported: bool = False) -> pd.DataFrame:
    """Exact re-scoring of each query's own candidates (query_id -> (doc_ids, payload)) with any
    scorer: ``raw(doc_ids, payload)`` gives their (docs x terms) raw scores. Each query keeps its
    first ``k`` in the run order (:func:`~logicrank.pipelines.retrieval.methods.ranking.rank_pairs`'s: score
    descending, then doc id descending), whatever order the candidates came in.
    ``drop_unsupported``: as :func:`score_exact`'s."""
    frames = []
    for q in queries:
        ids, payload = candidates.get(q.query_id, (np.empty(0, dtype=object), None))
        if len(ids) == 0:
            continue
        R = raw(ids, payload)
        scores = compose([q], terms, R, ops, calibration)[0]
        refuse_unrankable(scores[None, :], [q], ids, ops.strict_not is not None)
        if drop_unsupported:
            scores = np.where(unsupported(q, terms, R, scores, ops, calibration), -np.inf, scores)
        ids = np.asarray(ids, dtype=object)
        by_id = np.empty(len(ids), np.int64)
        by_id[np.argsort(ids, kind="stable")] = np.arange(len(ids))  # each id's place in ascending order
        order = np.lexsort((-by_id, -np.where(np.isnan(scores), -np.inf, scores)))[:k]
        order = order[np.isfinite(scores[order])]  # strict NOT's exclusions (-inf) are not results
        frames.append(pd.DataFrame({"query_id": q.query_id, "doc_id": ids[order], "score": scores[order]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["query_id", "doc_id", "score"])


def unsupported(query: LogicalQuery, terms: Sequence[str], raw: np.ndarray, scores: np.ndarray, ops: Operators,
                calibration: Calibration) -> np.ndarray:
    """Per document (rows of the (docs x terms) ``raw`` scores of a sparse scorer, where 0 is a
    term the document misses): whether its score (``scores``, composed) carries no evidence: the
    document holds no positive term of the query (one under an even number of NOTs), and its
    score with the terms it misses counted 0 is 0. Such documents are not results, whatever the
    calibration (zscore and sigmoid give a missed term a positive value, which would let them
    fill a query's k in table order). Kept: a document holding a positive term, and one its NOTs
    carry (``NOT "x"`` and ``"a" OR NOT "b"``: every document without x, without b)."""
    R = np.asarray(raw)
    index = {t: i for i, t in enumerate(terms)}
    pos = [index[t] for t in positive_terms(query.ast)]
    held = (R[:, pos] > 0).any(axis=1) if pos else np.zeros(len(R), bool)
    if calibration.keeps_zero:
        support = np.asarray(scores)
    else:
        missed_zero = np.where(R > 0, calibration.apply(R.astype(np.float32), terms), 0.0).astype(np.float32)
        support = compile_query(query.ast, terms, ops)(missed_zero)
    return (support == 0) & ~held


def excluded_everywhere(queries: Sequence[LogicalQuery], terms: Sequence[str], raw, candidates: dict, calibration: Calibration,
                        threshold: float | None, sparse: bool = False) -> list[str]:
    """The queries whose every candidate is excluded by a negated conjunct (``... AND NOT X``:
    X holds with calibrated evidence at least ``threshold``, :func:`logicrank.pipelines.retrieval.logic.fuzzy.exclusion`):
    their candidates cannot satisfy the query (strict NOT returns none of them; fuzzy NOT only
    ranks excluded documents), so a deeper candidate list or exact mode is needed. Queries
    without candidates or negated conjuncts are never counted; ``threshold`` None counts
    nothing. ``sparse``: a raw 0 is a term the document misses (BM25's evidence), which does
    not hold the term whatever its calibrated value (zscore and sigmoid give it about 0.5)."""
    from logicrank.pipelines.retrieval.logic.fuzzy import exclusion

    if threshold is None:
        return []
    out = []
    for q in queries:
        excluded = exclusion(q.ast, terms, threshold)
        ids, payload = candidates.get(q.query_id, (np.empty(0, dtype=object), None))
        if excluded is None or len(ids) == 0:
            continue
        R = np.asarray(raw(ids, payload), dtype=np.float32)
        C = calibration.apply(R, terms)
        if excluded(np.where(R > 0, C, 0.0) if sparse else C).all():
            out.append(q.query_id)
    return out


def _pairs(queries: Sequence[LogicalQuery], top: _TopK) -> pd.DataFrame:
    """The top k as pairs: the queries in order, each one's by score descending, then doc id
    descending (the run's order; the layout :func:`merge_exact` gives shards too), with each
    pair's table ``row``."""
    n, k = top.scores.shape
    kept = np.isfinite(top.scores).reshape(-1)  # not an excluded document, nor an empty slot
    pairs = pd.DataFrame({
        "position": np.repeat(np.arange(n), k)[kept],
        "doc_id": top.ids.reshape(-1)[kept].astype(object),
        "score": top.scores.reshape(-1)[kept],
        "row": top.rows.reshape(-1)[kept],
    }).sort_values(["position", "score", "doc_id"], ascending=[True, False, False], kind="stable")
    query_ids = np.array([q.query_id for q in queries], dtype=object)
    return pd.DataFrame({"query_id": query_ids[pairs["position"].to_numpy()] if n else np.empty(0, dtype=object),
                         "doc_id": pairs["doc_id"].to_numpy(), "score": pairs["score"].to_numpy(), "row": pairs["row"].to_numpy()})


def term_scores(
    pairs: pd.DataFrame,
    queries: Sequence[LogicalQuery],
    terms: Sequence[str],
    term_vectors: np.ndarray,
    doc_vectors: dict[str, np.ndarray],
    calibration: Calibration,
) -> pa.Table:
    """The per-term scores behind each ranked (query, document) pair (TERM_SCORES): per
    query, its pairs' rows in order, each with the query's terms in order."""
    return term_scores_from(pairs, queries, terms, vector_term_raw(term_vectors, doc_vectors), calibration)


def vector_term_raw(term_vectors: np.ndarray, doc_vectors: dict[str, np.ndarray]):
    """:func:`term_scores_from`'s ``raw`` over dense vectors: (doc ids, term indices, query id)
    -> their cosines, each query's documents times its terms."""
    T = np.asarray(term_vectors, dtype=np.float32)
    docs = pd.Index(list(doc_vectors))
    D = np.stack([doc_vectors[d] for d in docs]) if len(docs) else np.zeros((0, T.shape[1]), np.float32)

    def raw(doc_ids: np.ndarray, idx: np.ndarray, qid: str) -> np.ndarray:
        rows = docs.get_indexer(doc_ids)
        if (rows < 0).any():
            raise KeyError(f"term_scores: no vector for document(s) {list(doc_ids[rows < 0][:3])} of query {qid}")
        return D[rows] @ T[idx].T

    return raw


def term_scores_from(pairs: pd.DataFrame, queries: Sequence[LogicalQuery], terms: Sequence[str], raw, calibration: Calibration) -> pa.Table:
    """:func:`term_scores` for any scorer: ``raw(doc_ids, term indices, query_id)`` gives the
    (docs x those terms) raw scores."""
    index = {t: i for i, t in enumerate(terms)}
    by_query = {q.query_id: q for q in queries}
    cols: dict[str, list[np.ndarray]] = {name: [] for name in TERM_SCORES.names}
    for qid, group in pairs.groupby("query_id", sort=False):
        q_terms = by_query[qid].ast.terms()
        idx = np.array([index[t] for t in q_terms], dtype=np.int32)
        doc_ids = group["doc_id"].to_numpy(dtype=object)
        raw_scores = raw(doc_ids, idx, qid)
        cal = calibration.apply(raw_scores, q_terms)
        n, m = raw_scores.shape
        cols["query_id"].append(np.full(n * m, qid, dtype=object))
        cols["doc_id"].append(np.repeat(doc_ids, m))
        cols["term_id"].append(np.tile(idx, n))
        cols["term"].append(np.tile(np.array(q_terms, dtype=object), n))
        cols["score"].append(np.asarray(raw_scores, dtype=np.float64).reshape(-1))
        cols["calibrated"].append(np.asarray(cal, dtype=np.float64).reshape(-1))
    if not cols["query_id"]:
        return TERM_SCORES.empty_table()
    return pa.table({name: np.concatenate(parts) for name, parts in cols.items()}, schema=TERM_SCORES)


def ann_candidates(
    queries: Sequence[LogicalQuery],
    terms: Sequence[str],
    term_vectors: np.ndarray,
    search,
    ann_k: int,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[LogicalQuery]]:
    """Union of each positive term's ``ann_k`` nearest documents, per query.

    ``search(vectors, k)`` returns a table (query_index, doc_id, vector) as
    :meth:`logicrank.pipelines.engines.store.DocStore.vector_search` does. Returns the candidates and the
    queries without a positive term (to be scored exactly).
    """
    index = {t: i for i, t in enumerate(terms)}
    wanted = sorted({t for q in queries for t in positive_terms(q.ast)}, key=index.__getitem__)
    found: dict[str, dict[str, np.ndarray]] = {t: {} for t in wanted}
    if wanted:
        hits = search(np.asarray(term_vectors)[[index[t] for t in wanted]], ann_k)
        vecs = to_matrix(hits.column("vector"))
        for qi, doc, v in zip(hits.column("query_index").to_pylist(), hits.column("doc_id").to_pylist(), vecs, strict=True):
            found[wanted[qi]][doc] = v
    candidates, no_positive = {}, []
    for q in queries:
        pos = positive_terms(q.ast)
        if not pos:
            no_positive.append(q)
            continue
        union: dict[str, np.ndarray] = {}
        for t in sorted(pos, key=index.__getitem__):
            union.update(found[t])
        candidates[q.query_id] = (np.array(list(union), dtype=object), np.stack(list(union.values())))
    return candidates, no_positive


def term_candidates(queries: Sequence[LogicalQuery], terms: Sequence[str], find) -> tuple[dict[str, tuple[np.ndarray, None]], list[LogicalQuery]]:
    """ann mode over any scorer: the union of each positive term's documents, per query
    (``find(wanted terms)`` -> term -> doc ids, the terms in ``terms``' order); the queries
    without a positive term are scored exactly. A query whose positive terms find nothing (BM25
    returns only documents that share a word) gets no candidates."""
    order = {t: i for i, t in enumerate(terms)}
    wanted = sorted({t for q in queries for t in positive_terms(q.ast)}, key=order.__getitem__)
    found = find(wanted)
    candidates, exact = {}, []
    for q in queries:
        pos = sorted(positive_terms(q.ast), key=order.__getitem__)
        if not pos:
            exact.append(q)
            continue
        ids = list(dict.fromkeys(d for t in pos for d in found[t]))
        if ids:
            candidates[q.query_id] = (np.array(ids, dtype=object), None)
    return candidates, exact


def listed_pairs(path: str, query_ids: set[str]) -> pd.DataFrame:
    """listed mode: the (query_id, doc_id) pairs a qrels-format file lists (any relevance) for these queries, in its order."""
    from logicrank.pipelines.io import read_qrels

    pairs = read_qrels(path).select(["query_id", "doc_id"]).to_pandas()
    return pairs[pairs["query_id"].isin(query_ids)]


def pair_ids(pairs: pd.DataFrame, has) -> tuple[dict[str, tuple[np.ndarray, None]], int]:
    """Each query's given candidates over any scorer (``pairs``: query_id, doc_id, from a listed
    file or an incoming run) that the table holds (``has(doc ids)`` -> bool per document), and
    how many pairs name a document it does not."""
    held = has(pairs["doc_id"])
    out = {qid: (group["doc_id"].to_numpy(dtype=object), None) for qid, group in pairs[held].groupby("query_id", sort=False)}
    return out, int((~held).sum())


def pair_vectors(pairs: pd.DataFrame, store) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
    """:func:`pair_ids` over dense vectors: query id -> (doc ids, vectors) of its given
    candidates the table holds, and how many pairs name a document the table does not."""
    vectors = store.vectors_for(pairs["doc_id"].unique().tolist())
    out = {}
    for qid, group in pairs.groupby("query_id", sort=False):
        ids = np.array([d for d in group["doc_id"] if d in vectors], dtype=object)
        out[qid] = (ids, np.stack([vectors[d] for d in ids]) if len(ids) else np.zeros((0, 0), np.float32))
    return out, int((~pairs["doc_id"].isin(list(vectors))).sum())


def labelled_scores(
    labels: Sequence[dict], terms: Sequence[str], term_vectors: np.ndarray, doc_vectors: dict[str, np.ndarray]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per term: cosines of labelled documents that contain it (positives) and that do not
    (negatives). ``labels`` rows: ``{"doc_id", "present": [terms], "query_id"?}``; with a
    query_id, a term's negatives are the other documents of its queries' groups."""
    T = np.asarray(term_vectors, dtype=np.float32)
    known = [r for r in labels if r["doc_id"] in doc_vectors]
    return labelled_scores_from(known, terms, lambda ids: np.stack([doc_vectors[d] for d in ids]) @ T.T)


def labelled_scores_from(labels: Sequence[dict], terms: Sequence[str], raw) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """:func:`labelled_scores` for any scorer: ``raw(doc_ids)`` gives their (docs x terms)
    scores; every labelled document must be in the table."""
    index = {t: i for i, t in enumerate(terms)}
    groups: dict[str | None, list[dict]] = {}
    for r in labels:
        groups.setdefault(r.get("query_id"), []).append(r)
    docs = list(dict.fromkeys(r["doc_id"] for r in labels))
    S = raw(docs) if docs else np.zeros((0, len(terms)), np.float32)
    row = {d: i for i, d in enumerate(docs)}
    pos: dict[str, list[float]] = {t: [] for t in terms}
    neg: dict[str, list[float]] = {t: [] for t in terms}
    for rows in groups.values():
        group_terms = {t for r in rows for t in r["present"] if t in index}
        for r in rows:
            present = set(r["present"])
            for t in group_terms:
                (pos if t in present else neg)[t].append(float(S[row[r["doc_id"]], index[t]]))
    return {t: (np.array(pos[t]), np.array(neg[t])) for t in terms if pos[t] or neg[t]}
