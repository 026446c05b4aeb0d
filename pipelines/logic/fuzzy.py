"""Fuzzy composition of per-term scores along a query's parse tree (ITLR).

Operator families are chosen by name and parsed once (``"and=product,or=sum,not=complement"``).
A compiled query maps an (n_docs x n_terms) score matrix to n_docs scores in one vectorised
pass. ITLR's default OR is the sum x + y, not the probabilistic p + q - pq (``or=prob``):
the two are separate, named families.

    >>> import numpy as np
    >>> from logicrank.pipelines.logic.query import parse
    >>> q = parse('("dog" OR "cat" AND "mouse") AND NOT "giraffe"')
    >>> S = np.array([[0.5, 0.2, 0.4, 0.1]])      # dog, cat, mouse, giraffe
    >>> round(float(compile_query(q, q.terms(), Operators.parse(""))(S)[0]), 6)   # (0.5 + 0.2*0.4) * (1 - 0.1)
    0.522
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np

from logicrank.pipelines.logic.query import And, Node, Not, Term
from logicrank.schemas.errors import UserError

_EPS = 1e-6

AND_FAMILIES: dict[str, Callable[[list[np.ndarray]], np.ndarray]] = {
    "product": lambda xs: reduce(np.multiply, xs),
    "sum": lambda xs: reduce(np.add, xs),
    "min": lambda xs: reduce(np.minimum, xs),
}
OR_FAMILIES: dict[str, Callable[[list[np.ndarray]], np.ndarray]] = {
    "sum": lambda xs: reduce(np.add, xs),
    "max": lambda xs: reduce(np.maximum, xs),
    "prob": lambda xs: 1.0 - reduce(np.multiply, [1.0 - x for x in xs]),
}
# reciprocal: 1/x, with x floored at a small positive value (cosines can be <= 0)
NOT_FAMILIES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "complement": lambda x: 1.0 - x,
    "reciprocal": lambda x: 1.0 / np.maximum(x, _EPS),
}
FAMILIES = {"and": AND_FAMILIES, "or": OR_FAMILIES, "not": NOT_FAMILIES}
DEFAULTS = {"and": "product", "or": "sum", "not": "complement"}


class OperatorError(UserError, ValueError):
    """An unknown operator or family name; the message lists the valid ones."""


@dataclass(frozen=True)
class Operators:
    """The operator families, and ``strict_not``: None (NOT is fuzzy, the family's), or a
    calibrated evidence threshold: a document whose evidence for any negated term (one under
    an odd number of NOTs) is at least it is excluded from the query's results, not demoted
    (its composed score is -inf, which no ranking keeps)."""

    and_: str = "product"
    or_: str = "sum"
    not_: str = "complement"
    strict_not: float | None = None

    def __post_init__(self):
        for op, name in (("and", self.and_), ("or", self.or_), ("not", self.not_)):
            if name not in FAMILIES[op]:
                raise OperatorError(f"unknown {op} family {name!r}; valid: {', '.join(FAMILIES[op])}.")

    @classmethod
    def parse(cls, spec: str) -> Operators:
        """``"and=min,or=max"``; unnamed operators keep their defaults."""
        chosen = dict(DEFAULTS)
        for part in filter(None, (p.strip() for p in spec.split(","))):
            op, sep, name = part.partition("=")
            op, name = op.strip().lower(), name.strip().lower()
            if not sep or op not in FAMILIES:
                raise OperatorError(f"cannot read {part!r}; write op=family with op in {list(FAMILIES)}, e.g. 'and=product,or=sum,not=complement'.")
            chosen[op] = name
        return cls(chosen["and"], chosen["or"], chosen["not"])

    def __str__(self) -> str:
        return f"and={self.and_},or={self.or_},not={self.not_}" + ("" if self.strict_not is None else f",strict_not={self.strict_not:g}")

    @classmethod
    def grid(cls) -> list[Operators]:
        """Every combination of families (the paper's operator ablation)."""
        return [cls(a, o, n) for a in AND_FAMILIES for o in OR_FAMILIES for n in NOT_FAMILIES]


def compile_query(node: Node, columns: Sequence[str], ops: Operators) -> Callable[[np.ndarray], np.ndarray]:
    """A function from an (n_docs x len(columns)) float matrix to n_docs composed scores.

    ``columns`` names the matrix's columns (term texts); every term of ``node`` must be one.
    The function also takes any array whose last axis is the columns (e.g. queries x docs x
    slots, to compose many queries of one shape at once).
    """
    index = {t: i for i, t in enumerate(columns)}
    missing = [t for t in node.terms() if t not in index]
    if missing:
        raise ValueError(f"compose: no score column for term(s) {missing}")
    and_f, or_f, not_f = AND_FAMILIES[ops.and_], OR_FAMILIES[ops.or_], NOT_FAMILIES[ops.not_]

    def build(n: Node) -> Callable[[np.ndarray], np.ndarray]:
        if isinstance(n, Term):
            j = index[n.text]
            return lambda S: S[..., j]  # last axis: a 2-d (docs x terms) or a stacked 3-d input
        if isinstance(n, Not):
            f = build(n.child)
            return lambda S: not_f(f(S))
        fs = [build(c) for c in n.children]  # type: ignore[attr-defined]
        combine = and_f if isinstance(n, And) else or_f
        return lambda S: combine([f(S) for f in fs])

    f = build(node)
    negated = [index[t] for t in negated_terms(node)]
    if ops.strict_not is not None and negated:
        threshold = ops.strict_not

        def strict(S: np.ndarray) -> np.ndarray:
            S = np.asarray(S)
            return np.where((S[..., negated] >= threshold).any(axis=-1), -np.inf, f(S)).astype(S.dtype, copy=False)

        return strict
    # composes in the matrix's own float type (float32 on the hot path), never copying it
    return lambda S: f(np.asarray(S))


def negated_terms(node: Node, negated: bool = False) -> list[str]:
    """The distinct terms that appear under an odd number of NOTs, in first-appearance order."""
    if isinstance(node, Term):
        return [node.text] if negated else []
    if isinstance(node, Not):
        return negated_terms(node.child, not negated)
    return list(dict.fromkeys(t for c in node.children for t in negated_terms(c, negated)))  # type: ignore[attr-defined]
