"""Score and rank fusion through ranx (Bassani and Romelli, "ranx.fuse", CIKM 2022): each
run's scores normalised per query (``norm``), then combined by one of ranx's fusion methods,
the fused run cut to each query's top ``k``.

- Normalisations (ranx's names): ``min-max``, ``max`` (each score over the query's largest:
  refused where that is not above 0 and some score is below, as log-probabilities are, which
  ranx would multiply by 1e9), ``sum``, ``zmuv`` (z-score: zero mean, unit variance), ``rank`` (``1 - (rank - 1) / n``
  over the query's ``n`` documents: linear, not 1 / rank), ``borda``; ``none`` keeps the raw
  scores. A query whose scores are all equal normalises to 0 under ``min-max`` (ranx's rule).
- Methods that need no training: CombSUM ``sum``, CombMNZ ``mnz``, ``max``, ``min``, ``med``,
  ``anz``, ``gmnz`` (``gamma``), ``isr``, ``log_isr``, ``logn_isr`` (``sigma``), ``rrf``
  (``k``), ``rbc`` (``phi``), ``bordafuse``, ``condorcet``; weighted, one weight per run:
  ``wsum``, ``wmnz``, ``w_bordafuse``, ``w_condorcet``, ``mixed``.
- :func:`optimize` picks a method's weights or parameter on a qrels (ranx's grid search,
  ``optimize_fusion``) by one measure; use training queries, not the ones you report.

A document a run did not retrieve contributes nothing (ranx's rule); a query that only some
runs retrieved for is fused over those runs; when only one run retrieved anything at all, the
fused run ranks as that run. A fusion or normalisation of ranks reads each run's own ranks,
its tied documents in its order (:data:`BY_RANK_METHODS`). Ties in the fused scores rank by doc id
descending (trec_eval's order), so a run and its TREC file evaluate alike.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from logicrank.pipelines.retrieval.methods.ranking import rank_pairs
from logicrank.schemas.tables import RUN, require_columns

NORMS = ("min-max", "max", "sum", "zmuv", "rank", "borda", "none")
PLAIN = ("sum", "mnz", "max", "min", "med", "anz", "isr", "log_isr", "bordafuse", "condorcet")
PARAMETER = {"gmnz": "gamma", "logn_isr": "sigma", "rrf": "k", "rbc": "phi"}  # method -> its one parameter
REQUIRED = ("gmnz", "rbc")  # the methods whose parameter ranx gives no default: given, or optimised
WEIGHTED = ("wsum", "wmnz", "w_bordafuse", "w_condorcet", "mixed")
METHODS = (*PLAIN, *PARAMETER, *WEIGHTED)
# the measures optimize may maximise: ranx's names, with the project's spellings of the same families
METRICS = ("ndcg", "map", "mrr", "precision", "recall", "f1", "r-precision", "bpref", "hits", "hit_rate", "dcg", "ndcg_burges", "dcg_burges")
_PROJECT_METRICS = {"ndcg": "ndcg", "map": "map", "ap": "map", "mrr": "mrr", "rr": "mrr", "p": "precision", "r": "recall",
                    "f1": "f1", "rprec": "r-precision"}


def ranx_metric(name: str) -> str:
    """``name`` in ranx's spelling (``nDCG@10`` -> ``ndcg@10``, ``MAP`` -> ``map``, ``P@5`` ->
    ``precision@5``); ValueError naming the valid ones for anything else."""
    family, at, cutoff = name.strip().partition("@")
    key = family.strip().lower()
    got = key if key in METRICS else _PROJECT_METRICS.get(key)
    if got is None or (at and not cutoff.strip().isdigit()) or (at and int(cutoff) < 1):
        raise ValueError(f"metric {name!r}: give one of {', '.join(METRICS)} (ranx's names; nDCG, MAP, MRR, P, R, F1 too), "
                         "with @k for a cutoff, e.g. ndcg@10")
    return got + (f"@{int(cutoff)}" if at else "")
OPTIMIZABLE = (*PARAMETER, *WEIGHTED)
# what reads each run's order, not its scores: ranx takes the order from a sort of the scores
# that leaves tied documents in any order, so these are given the run's own ranks as scores
BY_RANK_METHODS = ("rrf", "isr", "log_isr", "logn_isr", "rbc", "bordafuse", "w_bordafuse", "condorcet", "w_condorcet")
BY_RANK_NORMS = ("rank", "borda")


def _ranx():
    """ranx, imported with its numba functions (compiled on first use) cached by the content of
    its files (pipelines/numba_cache.py), so a new virtual environment with the same ranx loads
    what another compiled, and with numba's typed containers' helpers cached alike. If ranx was
    already imported (by the caller's own code), its functions keep the caches numba gave them
    then."""
    # (here: it loads numba, which ranx loads anyway)
    from logicrank.pipelines.numba_cache import ContentKeyedCache, cache_typed_containers

    cache_typed_containers()  # ranx holds its runs in numba's typed dicts and lists
    if "ranx" not in sys.modules:
        package = Path(importlib.util.find_spec("ranx").origin).parent
        with ContentKeyedCache(f"ranx-{importlib.metadata.version('ranx')}", package):
            import ranx  # noqa: F401 (its functions are decorated, so their caches picked, as it is imported)
    import ranx

    return ranx


def _ranx_run(run: pa.Table, query_ids: Sequence[str], norm: str, by_rank: bool = False):
    """A ranx Run of ``run``'s scores normalised (``norm``, but borda, which ranx computes over
    all the runs' candidates together), with an empty entry for each of ``query_ids`` it lacks
    (ranx fuses runs that share their query ids). Normalised over the run's own queries
    first: ranx's zmuv of a query without a document divides by zero inside a numba loop,
    which ends silently and leaves the other queries of its thread's share unnormalised.
    ``by_rank``: each document's score is minus its rank (:data:`BY_RANK_METHODS`), so ranx's
    order of tied documents is the run's (trec_eval's: doc id descending)."""
    ranx = _ranx()

    require_columns(run, RUN.names[:4], "fuse")
    held: dict[str, dict[str, float]] = {}
    values = run.column("rank") if by_rank else run.column("score")
    for q, d, s in zip(run.column("query_id").to_pylist(), run.column("doc_id").to_pylist(), values.to_pylist(), strict=True):
        held.setdefault(q, {})[d] = -float(s) if by_rank else float(s)
    if norm in ("none", "borda"):
        return ranx.Run(held | {q: {} for q in query_ids if q not in held})
    if norm == "max" and not by_rank:  # (minus ranks: only their order is read)
        _require_positive_max(held)
    from numba import typed, types
    from ranx.normalization import norm_switch

    normed = norm_switch(norm)(ranx.Run(held))  # (each query's documents in the order ranx sorted them once: its ties kept)
    for q in query_ids:
        if q not in held:
            normed.run[q] = typed.Dict.empty(types.unicode_type, types.float64)
    return normed


def _require_positive_max(held: dict[str, dict[str, float]]) -> None:
    """Refuse ``max`` over a query whose scores are below 0 and none above: ranx divides by
    ``max(largest, 1e-9)``, so such a run's scores (log-probabilities, say) would be multiplied
    by 1e9 and decide the fused ranking alone. Scores all 0 stay 0."""
    for q, scores in held.items():
        top, low = max(scores.values()), min(scores.values())
        if not top > 0 and low < 0:
            raise ValueError(f"fuse: norm max divides each query's scores by its largest, and query {q!r} has none above 0 "
                             f"(its largest: {top!r}); use min-max or sum for scores that may be negative")


def _ranx_params(method: str, weights: Sequence[float] | None, parameter: float | None, n_runs: int) -> dict[str, Any]:
    if method in WEIGHTED:
        return {"weights": list(weights) if weights is not None else [1.0 / n_runs] * n_runs}
    if method in PARAMETER and parameter is not None:
        return {PARAMETER[method]: int(parameter) if method == "rrf" else parameter}
    return {}


def parameter_problem(method: str, parameter: float | None) -> str | None:
    """Why ``parameter`` cannot be ``method``'s, or None: rrf's k is a whole number above 0
    (ranx reads it as an integer: 60.7 would run as 60, 0.5 as 0)."""
    if method == "rrf" and parameter is not None and not (float(parameter).is_integer() and parameter >= 1):
        return f"fuse: rrf's k is a whole number of 1 or more (ranx reads it as one), got {parameter!r}"
    return None


def missing_parameter(method: str) -> str:
    """The one-line refusal of a method whose parameter has no default (:data:`REQUIRED`)."""
    return f"fuse: method {method} has no default {PARAMETER[method]}: give its parameter or optimize it"


def fuse(runs: Sequence[pa.Table], k: int, method: str = "sum", norm: str = "min-max", weights: Sequence[float] | None = None,
         parameter: float | None = None, run_id: str = "fuse") -> pa.Table:
    """The fused run (RUN contract) of ``runs``: ranx's ``method`` over ``norm``-normalised
    scores, each query's top ``k``. ``weights``: one per run (weighted methods; default
    equal); ``parameter``: the method's one parameter (``PARAMETER``; default ranx's)."""
    ranx_fuse = _ranx().fuse

    if len(runs) < 2:
        raise ValueError("fuse: give two runs or more to fuse")
    if method in REQUIRED and parameter is None:
        raise ValueError(missing_parameter(method))
    if problem := parameter_problem(method, parameter):
        raise ValueError(problem)
    label = f"fuse-{method}"
    held = [i for i, run in enumerate(runs) if run.num_rows]  # ranx cannot read a run without a row
    if len(held) < 2:  # nothing to fuse with: the one run that found anything ranks as itself, its ties in its own order
        frame = runs[held[0]].select(["query_id", "doc_id", "score", "rank"]).to_pandas().rename(columns={"rank": "tiebreak"}) if held \
            else pd.DataFrame({"query_id": [], "doc_id": [], "score": []})
        return rank_pairs(frame, k, label, run_id)
    runs = [runs[i] for i in held]
    weights = [weights[i] for i in held] if weights is not None else None
    query_ids = list(dict.fromkeys(q for run in runs for q in run.column("query_id").to_pylist()))
    with warnings.catch_warnings():  # numba's type-safety warnings from ranx's kernels are not the user's business
        warnings.simplefilter("ignore")
        by_rank = method in BY_RANK_METHODS or norm in BY_RANK_NORMS
        ranx_runs = [_ranx_run(run, query_ids, norm, by_rank) for run in runs]
        fused = ranx_fuse(ranx_runs, norm="borda" if norm == "borda" else None, method=method,
                          params=_ranx_params(method, weights, parameter, len(ranx_runs)))
    rows = [(q, d, s) for q, docs in fused.to_dict().items() for d, s in docs.items()]
    pairs = pd.DataFrame(rows, columns=["query_id", "doc_id", "score"])
    return rank_pairs(pairs, k, label, run_id)


def optimize(runs: Sequence[pa.Table], qrels: pa.Table, method: str, norm: str, metric: str = "ndcg@10",
             step: float = 0.1) -> tuple[dict[str, Any], int]:
    """The weights (or the one parameter) of ``method`` that maximise ``metric`` (ranx's name,
    e.g. ``ndcg@10``, ``map@100``) on the queries that ``qrels`` judges and the runs retrieved
    for, by ranx's grid search (``step`` between weights); and how many queries it used.
    Returns ``({"weights": [...]}, n)`` or ``({"parameter": x}, n)``."""
    ranx = _ranx()
    Qrels, ranx_optimize = ranx.Qrels, ranx.optimize_fusion

    judged = qrels.filter(pa.compute.greater(qrels.column("relevance"), 0))
    held = set(judged.column("query_id").to_pylist())
    for run in runs:
        held &= set(run.column("query_id").to_pylist())
    query_ids = sorted(held)
    if not query_ids:
        raise ValueError("fuse: no query is both judged relevant in the qrels and retrieved by every run; nothing to optimise on")
    truth: dict[str, dict[str, int]] = {q: {} for q in query_ids}
    for q, d, r in zip(*(judged.column(c).to_pylist() for c in ("query_id", "doc_id", "relevance")), strict=True):
        if q in truth:
            truth[q][d] = int(r)
    keep = pa.array(query_ids)
    # (every run holds every one of these queries: ranx normalises them)
    by_rank = method in BY_RANK_METHODS or norm in BY_RANK_NORMS
    ranx_runs = [_ranx_run(run.filter(pa.compute.is_in(run.column("query_id"), keep)), query_ids, "none", by_rank) for run in runs]
    kwargs: dict[str, Any] = {"show_progress": False}
    if method in WEIGHTED:
        kwargs["step"] = step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        best = ranx_optimize(Qrels(truth), ranx_runs, norm=None if norm == "none" else norm, method=method, metric=ranx_metric(metric),
                             **kwargs)
    if method in WEIGHTED:
        return {"weights": [float(w) for w in best["weights"]]}, len(query_ids)
    return {"parameter": float(best[PARAMETER[method]])}, len(query_ids)
