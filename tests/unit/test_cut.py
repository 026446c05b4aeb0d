"""The cut stage (pipelines/stages/cut.py): a fixed top k, a depth per query from a JSONL
file, and the refusals, run in process over a precomputed run."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipelines.pipeline import Pipeline
from pipelines.runner import Inputs
from pipelines.stages import Context
from pipelines.stages.cut import CutError
from schemas.tables import RUN


@pytest.fixture
def run_file(tmp_path):
    rows = [(q, f"d{r}", r) for q in ("q1", "q2", "q3") for r in range(1, 8)]
    run = pa.table({"query_id": [q for q, _, _ in rows], "doc_id": [d for _, d, _ in rows], "rank": pa.array([r for *_, r in rows], pa.int32()),
                    "score": [10.0 - r for *_, r in rows], "method": ["dense"] * len(rows), "run_id": ["x"] * len(rows)}, schema=RUN)
    pq.write_table(run, tmp_path / "run.parquet")
    return tmp_path / "run.parquet"


def _cut(run_file, tmp_path, **options) -> dict[str, list[tuple[str, int, float]]]:
    queries = pa.table({"query_id": ["q1", "q2", "q3"], "text": ["a", "b", "c"]})
    files = {str(run_file): {"sha256": "r"}} | ({options["depths"]: {"sha256": "d"}} if "depths" in options else {})
    pipeline = Pipeline.parse("c", [{"run_file": {"path": str(run_file)}}, {"cut": options}])
    out = pipeline.run(Context(store=None), queries, inputs=Inputs("b", encoder="e", files=files)).run
    return {q: list(zip(out.filter(pc.equal(out.column("query_id"), q)).column("doc_id").to_pylist(),
                        out.filter(pc.equal(out.column("query_id"), q)).column("rank").to_pylist(),
                        out.filter(pc.equal(out.column("query_id"), q)).column("score").to_pylist(), strict=True)) for q in ("q1", "q2", "q3")}


def test_a_fixed_k_keeps_each_querys_top_k_with_its_ranks_and_scores(run_file, tmp_path):
    got = _cut(run_file, tmp_path, k=2)
    assert got == {q: [("d1", 1, 9.0), ("d2", 2, 8.0)] for q in ("q1", "q2", "q3")}


def test_depths_from_a_file_a_number_or_a_lists_length_times_a_factor(run_file, tmp_path):
    depths = tmp_path / "answers.jsonl"
    depths.write_text("\n".join(json.dumps(r) for r in [
        {"query_id": "q1", "decomposition": [{"question": "x"}, {"question": "y"}]},  # 2 hops
        {"_id": "q2", "decomposition": 1},
        {"query_id": "q3", "decomposition": [{"question": "x"}, {"question": "y"}, {"question": "z"}]},
    ]) + "\n")
    got = _cut(run_file, tmp_path, depths=str(depths), field="decomposition", times=2)
    assert [len(got[q]) for q in ("q1", "q2", "q3")] == [4, 2, 6]
    assert [r for _, r, _ in got["q3"]] == [1, 2, 3, 4, 5, 6]


def test_a_query_without_a_depth_and_a_bad_line_are_refused_in_one_line(run_file, tmp_path):
    depths = tmp_path / "d.jsonl"
    depths.write_text(json.dumps({"query_id": "q1", "k": 3}) + "\n")
    with pytest.raises(CutError, match=r"gives no 'k' for 2 quer\(ies\) of the run \(e.g. \['q2', 'q3'\]\)"):
        _cut(run_file, tmp_path, depths=str(depths))
    depths.write_text(json.dumps({"query_id": "q1", "hops": 3}) + "\n")
    with pytest.raises(CutError, match="line 1 has no query id"):
        _cut(run_file, tmp_path, depths=str(depths))
    for options in ({}, {"k": 3, "depths": str(depths)}):
        with pytest.raises(ValueError, match="give k or depths"):
            Pipeline.parse("c", ["dense", {"cut": options}])
