"""The tolerant comparison of the parity and determinism tests (tests/compare.py) accepts what
another CPU's kernels do and nothing more: a real change of behaviour still fails."""

import pyarrow as pa
import pytest

from tests.compare import assert_runs_close, assert_tables_close


def _run(rows, run_id="r"):
    return pa.table({
        "query_id": pa.array([q for q, _, _ in rows], pa.string()),
        "doc_id": pa.array([d for _, d, _ in rows], pa.string()),
        "rank": pa.array([i + 1 - min(j for j, r in enumerate(rows) if r[0] == q) for i, (q, _, _) in enumerate(rows)], pa.int32()),
        "score": pa.array([s for _, _, s in rows], pa.float64()),
        "method": pa.array(["m"] * len(rows), pa.string()),
        "run_id": pa.array([run_id] * len(rows), pa.string()),
    })


REF = [("q1", "a", 0.9), ("q1", "b", 0.7), ("q1", "c", 0.5), ("q2", "x", 2.0), ("q2", "y", 1.0)]


def test_another_cpus_last_bits_pass():
    assert_runs_close(_run([(q, d, s + 4.8e-7) for q, d, s in REF]), _run(REF))  # the AMD EPYC case of issue 23


@pytest.mark.parametrize("change, message", [
    (lambda rows: [(q, d, s * 1.001) for q, d, s in rows], "scores"),  # a real change of the score
    (lambda rows: [rows[1][:2] + (0.9,), rows[0][:2] + (0.7,), *rows[2:]], "not a tie"),  # a and b swapped, 0.2 apart
    (lambda rows: [rows[0], ("q1", "z", 0.7), *rows[2:]], "not tied at its cut"),  # another document, above the cut
    (lambda rows: [(q, d.upper() if q == "q2" else d, s) for q, d, s in rows], "not tied"),
])
def test_a_real_change_fails(change, message):
    with pytest.raises(AssertionError, match=message):
        assert_runs_close(_run(change(REF)), _run(REF))


def test_a_changed_row_count_method_or_schema_fails():
    with pytest.raises(AssertionError, match="rows"):
        assert_runs_close(_run(REF[:-1]), _run(REF))
    with pytest.raises(AssertionError, match="run_id"):
        assert_runs_close(_run(REF, run_id="other"), _run(REF))
    with pytest.raises(AssertionError, match="schema"):
        assert_runs_close(_run(REF).cast(_run(REF).schema.set(3, pa.field("score", pa.float32()))), _run(REF))


def test_a_swap_inside_a_tie_passes_and_a_document_at_a_tied_cut_is_reported():
    tied = [("q1", "a", 0.9), ("q1", "b", 0.5), ("q1", "c", 0.5 - 3e-7), ("q2", "x", 2.0), ("q2", "y", 1.0)]
    swapped = [tied[0], ("q1", "c", 0.5), ("q1", "b", 0.5 - 3e-7), *tied[3:]]
    assert assert_runs_close(_run(swapped), _run(tied)) == set()
    beyond = [tied[0], tied[1], ("q1", "d", 0.5 - 5e-7), *tied[3:]]  # the reference's 4th, tied at the cut
    assert assert_runs_close(_run(beyond), _run(tied)) == {("q1", "d"), ("q1", "c")}


def test_keyed_tables_compare_ids_exactly_and_floats_within_tolerance():
    old = pa.table({"query_id": ["q1", "q1"], "doc_id": ["a", "b"], "term_id": pa.array([0, 1], pa.int32()), "score": [0.25, 0.5]})
    new = pa.table({"query_id": ["q1", "q1"], "doc_id": ["b", "a"], "term_id": pa.array([1, 0], pa.int32()), "score": [0.5 + 1e-7, 0.25 - 1e-7]})
    assert_tables_close(new, old, ["query_id", "doc_id", "term_id"])
    with pytest.raises(AssertionError, match="values off"):
        assert_tables_close(old.set_column(3, "score", pa.array([0.25, 0.5001])), old, ["query_id", "doc_id", "term_id"])
    with pytest.raises(AssertionError, match="'doc_id' differs"):
        assert_tables_close(old.set_column(1, "doc_id", pa.array(["a", "c"])), old, ["query_id", "doc_id", "term_id"])
    assert_tables_close(old.slice(0, 1), old, ["query_id", "doc_id", "term_id"], may_differ={("q1", "b")})
