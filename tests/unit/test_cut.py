"""The cut stage (pipelines/retrieval/stages/cut.py): a fixed top k, a depth per query from a JSONL
file, and the refusals; the restrict stage: only the pairs a qrels file lists. Run in process
over a precomputed run."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.retrieval.pipeline import Pipeline
from logicrank.pipelines.retrieval.runner import Inputs
from logicrank.pipelines.retrieval.stages import Context
from logicrank.pipelines.retrieval.stages.cut import CutError
from logicrank.schemas.tables import RUN


@pytest.fixture
def run_file(tmp_path):
    rows = [(q, f"d{r}", r) for q in ("q1", "q2", "q3") for r in range(1, 8)]
    run = pa.table({"query_id": [q for q, _, _ in rows], "doc_id": [d for _, d, _ in rows], "rank": pa.array([r for *_, r in rows], pa.int32()),
                    "score": [10.0 - r for *_, r in rows], "method": ["dense"] * len(rows), "run_id": ["x"] * len(rows)}, schema=RUN)
    pq.write_table(run, tmp_path / "run.parquet")
    return tmp_path / "run.parquet"


def _cut(run_file, tmp_path, stage="cut", **options) -> dict[str, list[tuple[str, int, float]]]:
    queries = pa.table({"query_id": ["q1", "q2", "q3"], "text": ["a", "b", "c"]})
    files = {str(run_file): {"sha256": "r"}} | {options[f]: {"sha256": f} for f in ("depths", "pairs") if f in options}
    pipeline = Pipeline.parse("c", [{"run_file": {"path": str(run_file)}}, {stage: options}])
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


@pytest.mark.parametrize("options", [{}, {"k": 3, "depths": "d.jsonl"}], ids=["neither", "both"])
def test_a_cut_takes_k_or_depths(options):
    with pytest.raises(ValueError, match="give k or depths"):
        Pipeline.parse("c", ["dense", {"cut": options}])


def test_restrict_keeps_the_listed_pairs_in_run_order_ranked_again(run_file, tmp_path):
    pairs = tmp_path / "own.tsv"
    pairs.write_text("query-id\tcorpus-id\tscore\nq1\td6\t0\nq1\td2\t1\nq1\td9\t1\nq2\td7\t1\nq9\td1\t1\n")
    got = _cut(run_file, tmp_path, stage="restrict", pairs=str(pairs))
    # any relevance lists a pair; d9 is not in the run; q3 has no pair, so keeps nothing
    assert got == {"q1": [("d2", 1, 8.0), ("d6", 2, 4.0)], "q2": [("d7", 1, 3.0)], "q3": []}
    queries = pa.table({"query_id": ["q1", "q2", "q3"], "text": ["a", "b", "c"]})
    pipeline = Pipeline.parse("c", [{"run_file": {"path": str(run_file)}}, {"restrict": {"pairs": str(pairs)}}])
    steps = pipeline.run(Context(store=None), queries, inputs=Inputs("b", encoder="e", files={str(run_file): {"sha256": "r"}, str(pairs): {"sha256": "p"}})).steps
    assert {k: steps[-1][k] for k in ("rows_in", "rows_kept", "listed_not_in_run")} == {"rows_in": 21, "rows_kept": 3, "listed_not_in_run": 1}  # d9; q9 is not run
