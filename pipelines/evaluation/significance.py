"""Paired significance tests between runs, with multiple-testing correction.

Each run is compared with one baseline on every measure, query by query (the same
queries in the same order). A family is all comparisons of one measure; the correction
(Holm, Bonferroni or Benjamini-Hochberg) is applied within each family.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from scipy import stats

from logicrank.pipelines.evaluation.measures import over_queries
from logicrank.schemas.tables import AGGREGATE_QUERY_ID, METRICS, SIGNIFICANCE, require_columns

TESTS = ("t-test", "randomisation")
CORRECTIONS = ("holm", "bonferroni", "bh")


def paired_p_value(a: np.ndarray, b: np.ndarray, test: str = "t-test", resamples: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value that the per-query values ``a`` and ``b`` share a mean."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("paired tests need two 1-d arrays of equal length (one value per query)")
    diff = b - a
    if len(diff) < 2 or np.allclose(diff, 0):
        return 1.0
    if test == "t-test":
        if np.ptp(diff) <= 1e-12 * max(1.0, abs(float(diff.mean()))):
            # every query moved by the same amount: zero variance, an infinite t, p = 0 (scipy's
            # answer when the differences are exactly equal; with float noise in their last bits
            # it warns of precision loss and its p-value depends on that noise)
            return 0.0
        return float(stats.ttest_rel(b, a).pvalue)
    if test == "randomisation":
        res = stats.permutation_test(
            (diff,),
            np.mean,
            permutation_type="samples",
            n_resamples=resamples,
            alternative="two-sided",
            rng=np.random.default_rng(seed),
        )
        return float(res.pvalue)
    raise ValueError(f"unknown test {test!r}; valid: {list(TESTS)}")


def adjust(p_values: Sequence[float], method: str = "holm") -> np.ndarray:
    """Adjusted p-values (compare each with alpha)."""
    p = np.asarray(p_values, dtype=np.float64)
    m = len(p)
    if m == 0:
        return p
    if method == "bonferroni":
        return np.minimum(p * m, 1.0)
    if method == "holm":
        order = np.argsort(p, kind="stable")
        stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
        out = np.empty(m)
        out[order] = np.minimum(stepped, 1.0)
        return out
    if method == "bh":
        return stats.false_discovery_control(p, method="bh")
    raise ValueError(f"unknown correction {method!r}; valid: {list(CORRECTIONS)}")


def _mean(measure: str, values: np.ndarray) -> float:
    """The figure the table gives beside the paired test: the measure's value over the queries,
    as the summary gives it (:func:`~logicrank.pipelines.evaluation.measures.over_queries`:
    the sum of a count, NumRet; the geometric mean of a ``gm_*`` measure, whose per-query values
    are logs; else the mean)."""
    return over_queries(measure, values)


def compare(
    metrics: pa.Table,
    baseline: str,
    test: str = "t-test",
    correction: str = "holm",
    alpha: float = 0.05,
) -> pa.Table:
    """Test every other run against ``baseline`` on every measure in ``metrics``."""
    require_columns(metrics, METRICS, "significance")
    df = metrics.to_pandas()
    df = df[df["query_id"] != AGGREGATE_QUERY_ID]
    runs = list(dict.fromkeys(df["run_id"]))
    if baseline not in runs:
        raise ValueError(f"significance: baseline {baseline!r} is not among the runs {runs}.")
    rows = []
    for measure, block in df.groupby("measure", sort=False):
        wide = block.pivot(index="query_id", columns="run_id", values="value")
        others = [r for r in runs if r != baseline and r in wide.columns]
        if not others or baseline not in wide.columns:  # (a measure the baseline lacks: QA measures of answers-only runs)
            continue
        for r in [baseline, *others]:  # a paired test pairs each query's values: a run without some gave NaN, and a NaN p
            # counted in the correction's family (the other runs' adjusted p inflated), or scipy's error under bh
            if (missing := wide.index[wide[r].isna()]).size:
                raise ValueError(f"significance: run {r!r} has no {measure} for {missing.size} of the {len(wide)} queries the runs "
                                 f"hold (e.g. {missing[0]!r}); compare runs evaluated over the same queries (evaluate them together, "
                                 "where a query a run misses scores 0).")
        base = wide[baseline].to_numpy()
        pvals = [paired_p_value(base, wide[r].to_numpy(), test) for r in others]
        padj = adjust(pvals, correction)
        for r, p, pa_ in zip(others, pvals, padj, strict=True):
            rows.append(
                {
                    "measure": measure,
                    "baseline": baseline,
                    "run_id": r,
                    "mean_baseline": _mean(measure, base),
                    "mean_run": _mean(measure, wide[r].to_numpy()),
                    "test": test,
                    "p_value": p,
                    "p_adjusted": float(pa_),
                    "correction": correction,
                    "significant": bool(pa_ < alpha),
                }
            )
    return pa.Table.from_pylist(rows, schema=SIGNIFICANCE)
