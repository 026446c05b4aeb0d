"""trec_eval 10's measures where pytrec_eval's trec_eval (9.0) lacks them or computes them
otherwise: ``rbp``, ``rbp_resid`` and ``unj_k`` (new in 10), ``iprec_at_recall_r`` and
``11pt_avg`` (changed in 10), written from trec_eval's ``m_rbp.c``, ``m_rbp_resid.c``,
``m_unjudged.c``, ``m_iprec_at_recall.c`` and ``m_11pt_avg.c``.

A retrieved document is *unjudged* when the qrels do not name it for its query (trec_eval's
RELVALUE_NONPOOL) or give it a negative relevance (in the pool, not judged: RELVALUE_UNJUDGED).

- ``rbp`` (Moffat and Zobel's rank-biased precision, persistence ``p``, 0.9 unless written
  ``rbp_p=0.95``): ``(1 - p) * sum_i gain(rank i) * p**(i - 1)`` over the whole ranking. A
  gain is the relevance, divided by the query's highest judged relevance when that exceeds 1
  (trec_eval's normalisation to [0, 1]; its C code reads the running minimum and maximum
  uninitialised, and this is the value it computes when they start as its comment intends).
  Unjudged documents gain 0.
- ``rbp_resid``: how much rbp could rise if every unjudged document had gain 1:
  ``p**n + (1 - p) * sum over unjudged ranks i of p**(i - 1)`` for a ranking of n documents
  holding at least one unjudged document, else 0 (and 0 for a query without results: trec_eval
  -c clears ``rbp_resid`` there, but not ``rbp_resid_p=...``, which it leaves at 1).
- ``unj_k``: the unjudged documents among the first k, over k (a ranking shorter than k is
  filled with judged non-relevant documents, as trec_eval assumes).
- ``iprec_at_recall_r``: the interpolated precision (the best precision at this rank or
  below) at the rank where the run reaches ``round(r * R)`` of the query's R relevant
  documents; 0 where it never does. trec_eval 10 rounds ``r * R`` to the nearest integer
  (halves up); 9.0 and pytrec_eval took ``int(r * R + 0.9)``, so the two differ for some R
  (R = 14 at 0.30: 4 against 5 documents). ir_measures' ``IPrec@r`` keeps pytrec_eval's.
- ``11pt_avg``: the mean of ``iprec_at_recall`` at 0.0, 0.1, ..., 1.0.

A document is relevant at relevance >= 1. A query without results scores 0 on each (trec_eval
-c scores it over a made-up ranking of one unjudged document, which gives 0 too, but for
``rbp_resid_p=...``, below).

Each is averaged over queries. The values are checked against trec_eval 10.0's own output
(``tests/data/trec_eval``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

# trec_eval's family -> whether it takes a parameter after "_" (unj_10, iprec_at_recall_0.30);
# the rbp families take ``_p=<persistence>``.
FAMILIES = {"rbp": False, "rbp_resid": False, "unj": True, "iprec_at_recall": True, "11pt_avg": False}
DEFAULT_P = 0.9
RELEVANT = 1  # trec_eval's default relevance level (-l)
ELEVEN_POINTS = [i / 10 for i in range(11)]


def persistence(params: str) -> float:
    """``""`` -> 0.9; ``"p=0.95"`` -> 0.95."""
    return float(params.split("=", 1)[1]) if params else DEFAULT_P


def ranked_relevance(docs: Mapping[str, float], judged: Mapping[str, int]) -> list[int | None]:
    """The relevance of each retrieved document in rank order (best score first); None: unjudged."""
    ranked = sorted(docs, key=lambda d: -docs[d])
    return [None if judged.get(d, -1) < 0 else judged[d] for d in ranked]


def rbp(rels: Sequence[int | None], judged: Mapping[str, int], p: float) -> float:
    top = max((r for r in judged.values() if r >= 0), default=0)
    scale = top if top > 1 else 1
    weights = p ** np.arange(len(rels))
    gains = np.array([0.0 if r is None else r / scale for r in rels])
    return float((1.0 - p) * np.dot(gains, weights)) if len(rels) else 0.0


def rbp_resid(rels: Sequence[int | None], p: float) -> float:
    unjudged = [i for i, r in enumerate(rels) if r is None]
    if not unjudged:
        return 0.0
    return float(p ** len(rels) + (1.0 - p) * np.sum(p ** np.array(unjudged, dtype=np.float64)))


def unj(rels: Sequence[int | None], k: int) -> float:
    return sum(r is None for r in rels[:k]) / k


def _lround(x: float) -> int:
    """C's lround for x >= 0: the nearest integer, halves away from zero."""
    whole = math.floor(x)
    return whole + (x - whole >= 0.5)


def iprec_at_recall(rels: Sequence[int | None], num_rel: int, levels: Sequence[float]) -> list[float]:
    """Interpolated precision at each recall level, as m_iprec_at_recall.c computes it."""
    relevant = [r is not None and r >= RELEVANT for r in rels]
    rel_ret, n = sum(relevant), len(rels)
    cutoffs = [_lround(level * num_rel) for level in levels]
    out = [0.0] * len(levels)
    cut = len(levels) - 1
    while cut >= 0 and cutoffs[cut] > rel_ret:  # recall levels the run never reaches score 0
        cut -= 1
    best = rel_ret / n if n else 0.0
    so_far = rel_ret
    for i in range(n, 0, -1):  # from the last rank up: the best precision at or below each rank
        if so_far <= 0:
            break
        best = max(best, so_far / i)
        if relevant[i - 1]:
            while cut >= 0 and so_far == cutoffs[cut]:
                out[cut] = best
                cut -= 1
            so_far -= 1
    while cut >= 0:
        out[cut] = best
        cut -= 1
    return out


def value(family: str, params: str, rels: Sequence[int | None], judged: Mapping[str, int]) -> float:
    """One query's value. ``rels``: :func:`ranked_relevance`; ``judged``: document -> relevance."""
    if family in ("iprec_at_recall", "11pt_avg"):
        num_rel = sum(r >= RELEVANT for r in judged.values())
        levels = ELEVEN_POINTS if family == "11pt_avg" else [float(params)]
        return float(np.mean(iprec_at_recall(rels, num_rel, levels)))
    if family == "unj":
        return unj(rels, int(params))
    if family == "rbp":
        return rbp(rels, judged, persistence(params))
    return rbp_resid(rels, persistence(params))


def values(measures: Sequence[tuple[str, str]], run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]],
           query_ids: Sequence[str]) -> dict[tuple[str, str], np.ndarray]:
    """Per-query values of each ``(family, params)`` for ``query_ids``, each query ranked once;
    a query without results scores 0 (trec_eval -c)."""
    out = {m: np.zeros(len(query_ids), dtype=np.float64) for m in measures}
    for i, q in enumerate(query_ids):
        judged = qrels.get(q, {})
        rels = ranked_relevance(run.get(q, {}), judged)
        for family, params in measures:
            out[(family, params)][i] = value(family, params, rels, judged)
    return out
