"""Retrieval measures, named by strings parsed once (``nDCG@10``, ``P@1``, ``MRR``...).

A :class:`Measure` is a small hashable value whose ``str`` is canonical and parses back to
itself. Each measure's kernel works on a whole run at once: a (queries x depth) matrix of
graded relevance of the ranked documents, the ideal gains, and the number of relevant
documents per query. Conventions follow trec_eval (the reference the tests compare with):

- a document is relevant when its relevance >= 1; unjudged documents count as 0;
- nDCG uses the graded relevance as gain and log2(rank + 1) as discount;
- R, MAP and F1 divide by the number of relevant documents in the qrels (0 when none);
- a qrels query with no row in the run scores 0 on every measure (trec_eval ``-c``);
  queries in the run but not in the qrels are not evaluated;
- the ranking is trec_eval's: a TREC run file is ranked by score descending, equal scores by
  docno descending, whatever its rank column says; a Parquet run keeps its ``rank``, which
  must agree with its scores (a better rank never has a lower score; ties in any order);
- a run or qrels that repeats a (query, doc) pair, a run with a non-finite score, and an
  empty run file or qrels are refused, never scored (``pipelines.topics`` checks the rules).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from logicrank.schemas.errors import UserError

Kernel = Callable[["RankedGains", int | None], np.ndarray]


@dataclass(frozen=True)
class RankedGains:
    """What every kernel needs, for n queries ranked to a common depth."""

    gains: np.ndarray  # (n, depth) relevance of the document at each rank, 0 past the end
    ideal: np.ndarray  # (n, depth_ideal) qrels relevance sorted descending, 0-padded
    n_relevant: np.ndarray  # (n,) documents with relevance >= 1


def _cut(m: np.ndarray, k: int | None) -> np.ndarray:
    return m if k is None else m[:, :k]


def _ndcg(g: RankedGains, k: int | None) -> np.ndarray:
    gains = np.clip(_cut(g.gains, k), 0, None)
    ideal = np.clip(_cut(g.ideal, k), 0, None)
    disc = 1.0 / np.log2(np.arange(2, max(gains.shape[1], ideal.shape[1]) + 2))
    dcg = gains @ disc[: gains.shape[1]]
    idcg = ideal @ disc[: ideal.shape[1]]
    return np.divide(dcg, idcg, out=np.zeros_like(dcg), where=idcg > 0)


def _hits(g: RankedGains, k: int | None) -> np.ndarray:
    return (_cut(g.gains, k) >= 1).sum(axis=1).astype(np.float64)


def _precision(g: RankedGains, k: int | None) -> np.ndarray:
    return _hits(g, k) / float(k)


def _recall(g: RankedGains, k: int | None) -> np.ndarray:
    nrel = g.n_relevant.astype(np.float64)
    return np.divide(_hits(g, k), nrel, out=np.zeros_like(nrel), where=nrel > 0)


def _f1(g: RankedGains, k: int | None) -> np.ndarray:
    p, r = _precision(g, k), _recall(g, k)
    return np.divide(2 * p * r, p + r, out=np.zeros_like(p), where=(p + r) > 0)


def _mrr(g: RankedGains, k: int | None) -> np.ndarray:
    rel = _cut(g.gains, k) >= 1
    first = rel.argmax(axis=1)
    return np.where(rel.any(axis=1), 1.0 / (first + 1.0), 0.0)


def _ap(g: RankedGains, k: int | None) -> np.ndarray:
    rel = (_cut(g.gains, k) >= 1).astype(np.float64)
    prec_at = np.cumsum(rel, axis=1) / np.arange(1, rel.shape[1] + 1)
    nrel = g.n_relevant.astype(np.float64)
    total = (prec_at * rel).sum(axis=1)
    return np.divide(total, nrel, out=np.zeros_like(nrel), where=nrel > 0)


@dataclass(frozen=True)
class _Spec:
    kernel: Kernel
    cutoff: str  # "required" | "optional" | "none"
    doc: str


# The registry: canonical name -> spec. Parsing, errors and docs all read this one dict.
REGISTRY: dict[str, _Spec] = {
    "nDCG": _Spec(_ndcg, "optional", "normalised discounted cumulative gain (graded gains, log2 discount)"),
    "P": _Spec(_precision, "required", "precision: relevant documents in the top k, over k"),
    "R": _Spec(_recall, "required", "recall: relevant documents in the top k, over all relevant"),
    "F1": _Spec(_f1, "required", "harmonic mean of P@k and R@k"),
    "MRR": _Spec(_mrr, "optional", "reciprocal rank of the first relevant document"),
    "MAP": _Spec(_ap, "optional", "average precision (mean over queries: MAP)"),
}
_BY_LOWER = {k.lower(): k for k in REGISTRY}
_SYNTAX = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)\s*(?:@\s*(\d+))?\s*$")


class MeasureError(UserError, ValueError):
    """A measure name that does not parse; the message lists the valid ones."""


@dataclass(frozen=True, order=True)
class Measure:
    name: str
    cutoff: int | None = None

    def __str__(self) -> str:
        return self.name if self.cutoff is None else f"{self.name}@{self.cutoff}"

    def __repr__(self) -> str:
        return f"Measure({str(self)!r})"

    @property
    def depth(self) -> int | None:
        """How deep in the ranking this measure looks (None: the whole run)."""
        return self.cutoff

    def compute(self, gains: RankedGains) -> np.ndarray:
        return REGISTRY[self.name].kernel(gains, self.cutoff)


def valid_names() -> list[str]:
    out = []
    for name, spec in REGISTRY.items():
        out.append({"required": f"{name}@k", "optional": f"{name}[@k]", "none": name}[spec.cutoff])
    return out


def parse_measure(text: str) -> Measure:
    """``"ndcg@10"`` -> ``Measure('nDCG@10')``; names are case-insensitive."""
    m = _SYNTAX.match(text) if isinstance(text, str) else None
    name = _BY_LOWER.get(m.group(1).lower()) if m else None
    if name is None:
        raise MeasureError(f"unknown measure {text!r}; valid: {', '.join(valid_names())} (k a positive integer).")
    cutoff = int(m.group(2)) if m.group(2) else None
    rule = REGISTRY[name].cutoff
    if rule == "required" and cutoff is None:
        raise MeasureError(f"measure {text!r} needs a cutoff, e.g. {name}@10.")
    if rule == "none" and cutoff is not None:
        raise MeasureError(f"measure {name} takes no cutoff.")
    if cutoff is not None and cutoff < 1:
        raise MeasureError(f"measure {text!r}: the cutoff must be >= 1.")
    return Measure(name, cutoff)


def parse_measures(texts: Iterable[str]) -> list[Measure]:
    """Parse all, report all bad names at once, drop repeats keeping order."""
    out: list[Measure] = []
    errors = []
    for t in texts:
        try:
            m = parse_measure(t)
        except MeasureError as exc:
            errors.append(str(exc))
            continue
        if m not in out:
            out.append(m)
    if errors:
        raise MeasureError("; ".join(errors))
    if not out:
        raise MeasureError(f"no measures given; valid: {', '.join(valid_names())}.")
    return out
