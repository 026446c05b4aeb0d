"""CombSUM / CombMNZ score fusion (pipelines/methods/comb.py, the `comb` stage): the figures of
a hand computation, the stage in a pipeline over precomputed runs, and the refusals."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.methods.comb import comb
from logicrank.pipelines.pipeline import Pipeline, PipelineError
from logicrank.pipelines.runner import Inputs
from logicrank.pipelines.stages import Context
from logicrank.schemas.tables import RUN


def _run(rows: list[tuple[str, str, float]], run_id: str) -> pa.Table:
    ranks = {}
    out = []
    for q, d, s in rows:
        ranks[q] = ranks.get(q, 0) + 1
        out.append((q, d, ranks[q], s))
    return pa.table({"query_id": [r[0] for r in out], "doc_id": [r[1] for r in out], "rank": pa.array([r[2] for r in out], pa.int32()),
                     "score": [r[3] for r in out], "method": ["x"] * len(out), "run_id": [run_id] * len(out)}, schema=RUN)


A = _run([("q1", "d1", 10.0), ("q1", "d2", 6.0), ("q1", "d3", 2.0), ("q2", "d1", 5.0), ("q2", "d4", 5.0)], "a")
B = _run([("q1", "d3", 0.9), ("q1", "d4", 0.5), ("q1", "d1", 0.1)], "b")


def _scores(run: pa.Table) -> dict[tuple[str, str], float]:
    return {(q, d): s for q, d, s in zip(*(run.column(c).to_pylist() for c in ("query_id", "doc_id", "score")), strict=True)}


def test_combsum_and_combmnz_are_the_hand_computed_figures():
    # q1, min-max: a: d1 1, d2 0.5, d3 0; b: d3 1, d4 0.5, d1 0; q2: a's two scores are equal, each 1
    mnz = comb([A, B], k=10, rule="mnz")
    want = {("q1", "d1"): (1 + 0) * 2, ("q1", "d2"): 0.5 * 1, ("q1", "d3"): (0 + 1) * 2, ("q1", "d4"): 0.5 * 1,
            ("q2", "d1"): 1.0, ("q2", "d4"): 1.0}
    assert _scores(mnz) == pytest.approx(want, abs=1e-12)
    # ties at 2.0 (d1, d3) and 0.5 (d2, d4) rank by doc_id descending (trec_eval's order); ranks 1..n per query
    assert [(q, d, r) for q, d, r in zip(*(mnz.column(c).to_pylist() for c in ("query_id", "doc_id", "rank")), strict=True)] == [
        ("q1", "d3", 1), ("q1", "d1", 2), ("q1", "d4", 3), ("q1", "d2", 4), ("q2", "d4", 1), ("q2", "d1", 2)]
    total = _scores(comb([A, B], k=10, rule="sum"))
    assert total[("q1", "d1")] == pytest.approx(1.0) and total[("q1", "d3")] == pytest.approx(1.0) and total[("q1", "d2")] == pytest.approx(0.5)
    assert comb([A, B], k=1, rule="mnz").num_rows == 2  # each query's top k
    with pytest.raises(ValueError, match="at least one run"):
        comb([], k=10)


def test_the_comb_stage_fuses_its_sub_pipelines(tmp_path):
    pq.write_table(A, tmp_path / "a.parquet")
    pq.write_table(B, tmp_path / "b.parquet")
    queries = pa.table({"query_id": ["q1", "q2"], "text": ["x", "y"]})
    spec = [{"comb": {"k": 3, "of": [[{"run_file": {"path": str(tmp_path / "a.parquet")}}], [{"run_file": {"path": str(tmp_path / "b.parquet")}}]]}}]
    files = {str(tmp_path / f): {"sha256": f} for f in ("a.parquet", "b.parquet")}
    out = Pipeline.parse("fused", spec).run(Context(store=None), queries, inputs=Inputs("t", encoder="e", files=files)).run
    assert out.column("run_id").unique().to_pylist() == ["fused"] and out.column("method").unique().to_pylist() == ["combmnz"]
    assert out.filter(pa.compute.equal(out.column("query_id"), "q1")).column("doc_id").to_pylist() == ["d3", "d1", "d4"]


@pytest.mark.parametrize(("options", "message"), [
    ({"of": []}, "give at least one sub-pipeline to fuse"),
    ({"rule": "max", "of": [["dense"]]}, "'sum' or 'mnz'"),
    ({"k": 0, "of": [["dense"]]}, "greater than or equal to 1"),
])
def test_a_bad_comb_stage_is_refused_in_one_line(options, message):
    with pytest.raises(PipelineError, match=message) as info:
        Pipeline.parse("x", [{"comb": options}])
    assert "\n" not in str(info.value)
