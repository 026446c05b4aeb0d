"""Exact posterior of a logical form (OrLog) against ProbLog itself."""

from __future__ import annotations

import importlib
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logicrank.pipelines.retrieval.logic.probability import (
    compile_probability,
    is_read_once,
    problog_probability,
    problog_program,
)
from logicrank.pipelines.retrieval.logic.query import And, Not, Or, Term, parse

# ProbLog raises the recursion limit when it is first imported; imported here, not inside a hypothesis test (which warns
# that the limit changed under it, in whichever worker runs this file before any other test imports ProbLog)
importlib.import_module("problog")

# atom texts that would break a program pasted together from text
ADVERSARIAL = ["{x} is 'quoted'", 'a "b"', "p :- q", "\\+ r", "50% off", "line\nbreak", "'; drop", "X", "evidence(q, false)."]
ATOMS = [f"a{i}" for i in range(8)]


def _forms(names):
    leaves = st.sampled_from(names).map(Term)

    def extend(children):
        group = st.lists(children, min_size=2, max_size=3).map(tuple)
        return st.one_of(st.builds(Not, children), st.builds(And, group), st.builds(Or, group))

    return st.recursive(leaves, extend, max_leaves=10)


@settings(max_examples=1000, deadline=None)
@given(form=_forms(ATOMS), probs=st.lists(st.floats(0.0, 1.0), min_size=8, max_size=8))
def test_posterior_equals_problog(form, probs):
    # up to 8 atoms, repeated atoms, nested NOT, OR of ANDs: exact to 1e-9
    p = dict(zip(ATOMS, probs, strict=True))
    got = compile_probability(form, ATOMS)(np.array([probs]))[0]
    assert abs(got - problog_probability(form, p)) < 1e-9


@settings(max_examples=100, deadline=None)
@given(form=_forms(ADVERSARIAL), probs=st.lists(st.floats(0.01, 0.99), min_size=len(ADVERSARIAL), max_size=len(ADVERSARIAL)))
def test_atom_text_never_reaches_problog(form, probs):
    p = dict(zip(ADVERSARIAL, probs, strict=True))
    source = problog_program(form, p)
    for line in source.splitlines():  # only generated identifiers, operators and float literals
        assert re.fullmatch(r"[0-9.e-]+::a\d+\.|(n\d+|q) :- (\\\+)?[an]\d+(, (\\\+)?[an]\d+)*\.|query\(q\)\.", line), line
    got = compile_probability(form, ADVERSARIAL)(np.array([probs]))[0]
    assert abs(got - problog_probability(form, p)) < 1e-9


def test_closed_forms_and_vectorised_candidates():
    f = parse('"a" AND ("b" OR NOT "c")')
    assert is_read_once(f) and not is_read_once(parse('"a" AND ("a" OR "b")'))
    P = np.random.default_rng(0).uniform(size=(50, 3))
    a, b, c = P.T
    np.testing.assert_allclose(compile_probability(f, ["a", "b", "c"])(P), a * (1 - (1 - b) * c))
    # a repeated atom: P(a AND (a OR b)) = P(a), not p_a * (p_a + p_b - p_a p_b)
    np.testing.assert_allclose(compile_probability(parse('"a" AND ("a" OR "b")'), ["a", "b"])(P[:, :2]), P[:, 0])
    assert compile_probability(parse('"a" AND NOT "a"'), ["a"])(P[:, :1]).max() == 0.0
    with pytest.raises(ValueError, match="no column"):
        compile_probability(f, ["a", "b"])
