"""Fuzzy composition of per-term scores along a query's parse tree (ITLR).

Operator families are chosen by name and parsed once (``"and=product,or=sum,not=complement"``).
A compiled query maps an (n_docs x n_terms) score matrix to n_docs scores in one vectorised
pass. ITLR's default OR is the sum x + y, not the probabilistic p + q - pq (``or=prob``):
the two are separate, named families.

    >>> import numpy as np
    >>> from logicrank.pipelines.retrieval.logic.query import parse
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

from logicrank.pipelines.retrieval.logic.query import And, Node, Not, Term
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
        chosen, given = dict(DEFAULTS), set()
        for part in filter(None, (p.strip() for p in spec.split(","))):
            op, sep, name = part.partition("=")
            op, name = op.strip().lower(), name.strip().lower()
            if not sep or op not in FAMILIES:
                raise OperatorError(f"cannot read {part!r}; write op=family with op in {list(FAMILIES)}, e.g. 'and=product,or=sum,not=complement'.")
            if op in given:  # 'and=min,...,and=product': which one was meant?
                raise OperatorError(f"{spec!r} names {op} twice; give each operator once, e.g. 'and=product,or=sum,not=complement'.")
            given.add(op)
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
    excluded = exclusion(node, columns, ops.strict_not) if ops.strict_not is not None else None
    if excluded is not None:
        def strict(S: np.ndarray) -> np.ndarray:
            S = np.asarray(S)
            return np.where(excluded(S), -np.inf, f(S)).astype(S.dtype, copy=False)

        return strict
    # composes in the matrix's own float type (float32 on the hot path), never copying it
    return lambda S: f(np.asarray(S))


def negated_conjuncts(node: Node) -> list[Node]:
    """What a query excludes: the ``X`` of every ``NOT X`` that is one of the query's top-level
    conjuncts (the form is ``... AND NOT X AND ...``, or ``NOT X`` alone). A NOT inside an OR
    (``"a" OR NOT "b"``) excludes nothing: the other side may satisfy the query."""
    parts = list(node.children) if isinstance(node, And) else [node]  # type: ignore[attr-defined]
    out: list[Node] = []
    for part in parts:
        if isinstance(part, And):
            out += negated_conjuncts(part)
        elif isinstance(part, Not):
            out.append(part.child)
    return out


def exclusion(node: Node, columns: Sequence[str], threshold: float) -> Callable[[np.ndarray], np.ndarray] | None:
    """A function from an (... x len(columns)) evidence array to the documents the query
    excludes under strict NOT: those for which some negated conjunct ``X`` holds in Boolean
    logic, a term holding when its evidence is at least ``threshold`` (``NOT ("b" AND "c")``
    excludes a document holding both, not one holding b alone). None: the query negates no
    conjunct."""
    index = {t: i for i, t in enumerate(columns)}

    def holds(n: Node) -> Callable[[np.ndarray], np.ndarray]:
        if isinstance(n, Term):
            j = index[n.text]
            return lambda S: S[..., j] >= threshold
        if isinstance(n, Not):
            g = holds(n.child)
            return lambda S: ~g(S)
        gs = [holds(c) for c in n.children]  # type: ignore[attr-defined]
        combine = np.logical_and if isinstance(n, And) else np.logical_or
        return lambda S: reduce(combine, [g(S) for g in gs])

    tests = [holds(x) for x in negated_conjuncts(node)]
    if not tests:
        return None
    return lambda S: reduce(np.logical_or, [t(np.asarray(S)) for t in tests])
