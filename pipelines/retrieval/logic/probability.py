"""Exact probability that a logical form holds, given independent atom probabilities
(ProbLog's semantics: each atom is an independent probabilistic fact; the query is the form).

OrLog scores every candidate against one query's form: the form is compiled once and every
candidate is evaluated in one vectorised pass over a (candidates x atoms) matrix.

- Read-once forms (every atom appears once) have a closed form: AND = product,
  OR = 1 - prod(1 - p) (the probabilistic OR p + q - pq, not ITLR's sum), NOT = 1 - p.
- Otherwise, Shannon expansion on the atoms that repeat: fixing all of them to True/False
  leaves a read-once form in the others, so P(form) = sum over the 2^r assignments of the
  repeated atoms of P(assignment) x P(read-once rest | assignment). All assignments and all
  candidates go through the one closed form in a single (2^r x candidates x atoms) call.
  Exact; r <= 16.

:func:`problog_probability` runs ProbLog itself, for reference. User or LLM text never
reaches ProbLog source: atoms become generated identifiers ``a0, a1, ...`` and rules
``n0, n1, ...``; only those and the probabilities (``repr`` of floats) are written.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from functools import reduce

import numpy as np

from logicrank.pipelines.retrieval.logic.query import And, Node, Not, Term

MAX_REPEATED = 16  # 2^16 read-once evaluations per candidate block: the exact method's limit


def _count(node: Node, out: Counter) -> Counter:
    if isinstance(node, Term):
        out[node.text] += 1
    elif isinstance(node, Not):
        _count(node.child, out)
    else:
        for c in node.children:  # type: ignore[attr-defined]
            _count(c, out)
    return out


def _closed_form(node: Node, index: dict[str, int]) -> Callable[[np.ndarray], np.ndarray]:
    """The read-once closed form, reading each occurrence of an atom as independent. Exact
    when every atom appears once, or when the repeated atoms' columns hold 0 or 1."""
    if isinstance(node, Term):
        j = index[node.text]
        return lambda P: P[..., j]
    if isinstance(node, Not):
        f = _closed_form(node.child, index)
        return lambda P: 1.0 - f(P)
    fs = [_closed_form(c, index) for c in node.children]  # type: ignore[attr-defined]
    if isinstance(node, And):
        return lambda P: reduce(np.multiply, [f(P) for f in fs])
    return lambda P: 1.0 - reduce(np.multiply, [1.0 - f(P) for f in fs])


def compile_probability(node: Node, atoms: Sequence[str]) -> Callable[[np.ndarray], np.ndarray]:
    """A function from a (candidates x len(atoms)) matrix of atom probabilities to the exact
    probability of ``node`` per candidate. ``atoms`` names the columns (the form's terms)."""
    index = {a: i for i, a in enumerate(atoms)}
    counts = _count(node, Counter())
    missing = sorted(set(counts) - set(index))
    if missing:
        raise ValueError(f"probability: no column for atom(s) {missing}")
    f = _closed_form(node, index)
    repeated = [index[a] for a in sorted(a for a, n in counts.items() if n > 1)]
    if not repeated:
        return lambda P: f(np.asarray(P, dtype=np.float64))
    if len(repeated) > MAX_REPEATED:
        raise ValueError(f"probability: {len(repeated)} repeated atoms; exact expansion supports {MAX_REPEATED}")
    # every True/False assignment of the repeated atoms: (2^r, r)
    A = np.array(list(itertools.product((1.0, 0.0), repeat=len(repeated))))

    def expand(P):
        P = np.asarray(P, dtype=np.float64)
        X = np.repeat(P[None], len(A), axis=0)  # (2^r, candidates, atoms)
        X[..., repeated] = A[:, None, :]
        Pr = P[None, ..., repeated]
        weight = np.prod(A[:, None, :] * Pr + (1.0 - A[:, None, :]) * (1.0 - Pr), axis=-1)  # P(assignment)
        return (weight * f(X)).sum(axis=0)

    return expand


def is_read_once(node: Node) -> bool:
    return all(n == 1 for n in _count(node, Counter()).values())


# -- ProbLog, for reference ------------------------------------------------------------------
def problog_program(node: Node, probabilities: dict[str, float]) -> str:
    """ProbLog source for ``node`` with the given atom probabilities. Atom texts are mapped
    to generated identifiers and never written: the source holds only ``a<i>``, ``n<i>``,
    ``q`` and float literals."""
    ids = {a: f"a{i}" for i, a in enumerate(dict.fromkeys(_terms_in_order(node)))}
    lines = [f"{float(probabilities[a])!r}::{ident}." for a, ident in ids.items()]
    counter = itertools.count()

    def rule(n: Node) -> str:
        if isinstance(n, Term):
            return ids[n.text]
        name = f"n{next(counter)}"
        if isinstance(n, Not):
            lines.append(f"{name} :- \\+{rule(n.child)}.")
        elif isinstance(n, And):
            lines.append(f"{name} :- {', '.join(rule(c) for c in n.children)}.")
        else:
            for c in n.children:  # type: ignore[attr-defined]
                lines.append(f"{name} :- {rule(c)}.")
        return name

    lines.append(f"q :- {rule(node)}.")
    lines.append("query(q).")
    return "\n".join(lines) + "\n"


def _terms_in_order(node: Node) -> list[str]:
    if isinstance(node, Term):
        return [node.text]
    if isinstance(node, Not):
        return _terms_in_order(node.child)
    return [t for c in node.children for t in _terms_in_order(c)]  # type: ignore[attr-defined]


def problog_probability(node: Node, probabilities: dict[str, float]) -> float:
    """P(node) by building and solving one ProbLog program (ProbLog's default knowledge compilation)."""
    from problog import get_evaluatable
    from problog.program import PrologString

    result = get_evaluatable().create_from(PrologString(problog_program(node, probabilities))).evaluate()
    return float(next(iter(result.values())))

