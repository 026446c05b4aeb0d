"""OrLog's pure steps: prompts, calibration, posterior."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipelines.logic.query import parse
from pipelines.methods.orlog import OrlogQuery, calibrate, content_free_prompts, posteriors, truth_prompts

Q = OrlogQuery("q1", "books set in Paris, not French", (("a1", "{x} is set in Paris"), ("a2", "{x} is French")), parse('"a1" AND NOT "a2"'), "ok")


def test_truth_prompts_put_a_candidates_atoms_together_after_its_context():
    cands = pd.DataFrame({"query_id": ["q1", "q1"], "doc_id": ["d1", "d2"], "base_rank": [1, 2]})
    p = truth_prompts([Q], cands, {"d1": "Les Misérables", "d2": "Ulysses"}, {"d1": "Document: a novel\n"})
    assert list(p["statement"]) == ["Les Misérables is set in Paris", "Les Misérables is French", "Ulysses is set in Paris", "Ulysses is French"]
    assert list(p["context"]) == ["Document: a novel\n"] * 2 + [""] * 2 and p["prompt_id"].is_unique
    assert list(content_free_prompts([Q])["statement"]) == ["N/A is set in Paris", "N/A is French"]


def test_calibrations():
    scored = pd.DataFrame({"query_id": ["q1"] * 4, "atom_id": ["a1", "a2", "a1", "a2"], "logit_true": [2.0, 0.0, 1.0, 1.0], "logit_false": [0.0, 0.0, 0.0, 2.0]})
    sig = lambda d: 1 / (1 + np.exp(-np.asarray(d, dtype=float)))  # noqa: E731
    np.testing.assert_allclose(calibrate(scored, "none"), sig([2, 0, 1, -1]))
    np.testing.assert_allclose(calibrate(scored, "pool-mean"), sig([0.5, 0.5, -0.5, -0.5]))
    cf = pd.DataFrame({"query_id": ["q1", "q1"], "atom_id": ["a1", "a2"], "logit_true": [1.0, 0.0], "logit_false": [0.0, 1.0]})
    np.testing.assert_allclose(calibrate(scored, "content-free", cf), sig([1, 1, 0, 0]))
    with pytest.raises(ValueError, match="valid: none, content-free, pool-mean"):
        calibrate(scored, "platt")


def test_posteriors_per_candidate():
    scored = pd.DataFrame({
        "query_id": ["q1"] * 4, "doc_id": ["d1", "d1", "d2", "d2"], "base_rank": [1, 1, 2, 2],
        "atom_id": ["a1", "a2", "a1", "a2"], "p_calibrated": [0.9, 0.5, 0.6, 0.1],
    })
    post = posteriors([Q], scored).set_index("doc_id")["score"]
    np.testing.assert_allclose(post[["d1", "d2"]], [0.9 * 0.5, 0.6 * 0.9])
    reference = posteriors([Q], scored, reasoner="problog").set_index("doc_id")["score"]
    np.testing.assert_allclose(reference[["d1", "d2"]], post[["d1", "d2"]], atol=1e-12)
