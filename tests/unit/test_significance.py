import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from logicrank.pipelines.evaluation.significance import adjust, compare, paired_p_value


def test_holm_matches_hand_computation():
    # p sorted: 0.01, 0.02, 0.04 -> 3*0.01=0.03, max(0.03, 2*0.02=0.04)=0.04, max(0.04, 1*0.04)=0.04
    np.testing.assert_allclose(adjust([0.04, 0.01, 0.02], "holm"), [0.04, 0.03, 0.04])
    np.testing.assert_allclose(adjust([0.5, 0.6], "holm"), [1.0, 1.0])
    np.testing.assert_allclose(adjust([0.01, 0.2], "bonferroni"), [0.02, 0.4])
    np.testing.assert_allclose(adjust([0.01, 0.04, 0.03], "bh"), stats.false_discovery_control([0.01, 0.04, 0.03]))
    with pytest.raises(ValueError, match="valid"):
        adjust([0.1], "sidak")


def test_paired_tests_see_a_real_difference_and_not_a_null_one():
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, 200)
    better = np.clip(a + 0.1 + rng.normal(0, 0.05, 200), 0, 1)
    assert paired_p_value(a, a) == 1.0
    for test in ("t-test", "randomisation"):
        assert paired_p_value(a, better, test) < 0.001
        noise = a + rng.normal(0, 0.05, 200)
        assert paired_p_value(a, noise, test) > 0.01
    assert paired_p_value(a, better) == pytest.approx(stats.ttest_rel(better, a).pvalue)


def test_a_constant_shift_is_p_zero_whatever_the_float_noise_and_without_a_warning():
    """Every query moved by the same amount (e.g. 1 -> 0 on a small sample): zero variance, so
    the t-test's p is 0, also when the differences differ in their last bits, where scipy
    warns of precision loss and answers by the noise (1e-32 here)."""
    import warnings

    a = np.array([0.8333333333333334, 0.5, 0.1])
    assert np.ptp((a - 0.1) - a) > 0  # the float noise is there
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert paired_p_value(a, a - 0.1) == 0.0 == paired_p_value(np.zeros(3), np.ones(3))
        assert paired_p_value(a, a - 0.1, "randomisation") == pytest.approx(0.25)  # 2 of the 2^3 sign flips as extreme


def _metrics(values: dict[str, list[float]]) -> pa.Table:
    rows = []
    for run_id, vals in values.items():
        rows += [{"run_id": run_id, "query_id": f"q{i}", "measure": "nDCG@10", "value": v} for i, v in enumerate(vals)]
        rows.append({"run_id": run_id, "query_id": "all", "measure": "nDCG@10", "value": float(np.mean(vals))})
    return pa.Table.from_pylist(rows)


def test_compare_corrects_within_each_measure():
    rng = np.random.default_rng(2)
    base = rng.uniform(0, 1, 100)
    t = compare(_metrics({"base": base, "good": base + 0.2, "same": base + rng.normal(0, 0.01, 100)}), "base")
    d = t.to_pandas().set_index("run_id")
    assert list(d.index) == ["good", "same"]
    assert (d["p_adjusted"] >= d["p_value"]).all()
    assert bool(d.loc["good", "significant"]) and d.loc["good", "mean_run"] > d.loc["good", "mean_baseline"]
    with pytest.raises(ValueError, match="baseline 'nope'"):
        compare(_metrics({"base": base}), "nope")
