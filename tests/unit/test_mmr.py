"""The mmr stage (pipelines/retrieval/stages/mmr.py): the greedy order, and the stage in a pipeline
run in process over a stand-in table and encoder (the Store and Encoder protocols)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.retrieval.pipeline import Pipeline
from logicrank.pipelines.retrieval.runner import Inputs
from logicrank.pipelines.retrieval.stages import Context
from logicrank.pipelines.retrieval.stages.mmr import select
from logicrank.schemas.tables import RUN

Q = np.array([1.0, 0.0])
DOCS = {"d0": np.array([1.0, 0.1]), "d1": np.array([1.0, 0.1]), "d2": np.array([0.8, 0.6]), "d3": np.array([0.0, 1.0])}


def test_relevance_alone_keeps_the_cosine_order_and_novelty_moves_a_duplicate_down():
    docs = np.stack([DOCS[d] for d in ("d0", "d1", "d2")])
    assert select(Q, docs, 1.0) == [0, 1, 2]  # d0 and d1 tie: the earlier first
    assert select(Q, docs, 0.3) == [0, 2, 1]  # d1 repeats d0: d2 before it
    assert select(Q, docs[[2, 0, 1]], 0.3) == [1, 0, 2]


class _Table:
    uri, name, version = "stand-in", "docs", 1

    def vectors_for(self, doc_ids):
        return {d: DOCS[d] for d in doc_ids if d in DOCS}  # as the table: an id it lacks is left out


class _Encoder:
    def encode(self, texts):
        return np.stack([Q for _ in texts])


def test_mmr_reranks_the_top_depth_of_the_run_before_it_and_keeps_the_rest_in_order(tmp_path):
    rows = [("q1", d, r) for r, d in enumerate(["d0", "d1", "d2", "d3"], 1)] + [("q2", "d3", 1)]
    run = pa.table({"query_id": [q for q, _, _ in rows], "doc_id": [d for _, d, _ in rows], "rank": pa.array([r for *_, r in rows], pa.int32()),
                    "score": [1.0 / r for *_, r in rows], "method": ["x"] * len(rows), "run_id": ["x"] * len(rows)}, schema=RUN)
    pq.write_table(run, tmp_path / "run.parquet")
    queries = pa.table({"query_id": ["q1", "q2"], "text": ["first", "second"]})
    pipeline = Pipeline.parse("m", [{"run_file": {"path": str(tmp_path / "run.parquet")}}, {"mmr": {"depth": 3, "relevance": 0.3, "k": 10}}])
    ctx = Context(store=_Table(), encoder=_Encoder)
    out = pipeline.run(ctx, queries, inputs=Inputs("b", encoder="e", files={str(tmp_path / "run.parquet"): {"sha256": "r"}})).run
    q1 = out.filter(pa.compute.equal(out.column("query_id"), "q1"))
    assert q1.column("doc_id").to_pylist() == ["d0", "d2", "d1", "d3"] and q1.column("rank").to_pylist() == [1, 2, 3, 4]
    assert out.filter(pa.compute.equal(out.column("query_id"), "q2")).column("doc_id").to_pylist() == ["d3"]
    assert set(out.column("method").to_pylist()) == {"mmr"}
    with pytest.raises(ValueError, match="reranks a run, but no stage before it produces one"):
        Pipeline.parse("bad", ["mmr"])


def test_a_document_the_table_has_no_vector_for_follows_the_reranked_head(tmp_path):
    """A run_file naming a document outside the table ("x", rank 2): the stage failed with a
    bare KeyError. It keeps its incoming order after the reranked head, and is counted."""
    rows = [("q1", d, r) for r, d in enumerate(["d0", "x", "d1", "d2", "d3"], 1)]
    run = pa.table({"query_id": [q for q, _, _ in rows], "doc_id": [d for _, d, _ in rows], "rank": pa.array([r for *_, r in rows], pa.int32()),
                    "score": [1.0 / r for *_, r in rows], "method": ["x"] * len(rows), "run_id": ["x"] * len(rows)}, schema=RUN)
    pq.write_table(run, tmp_path / "run.parquet")
    pipeline = Pipeline.parse("m", [{"run_file": {"path": str(tmp_path / "run.parquet")}}, {"mmr": {"depth": 4, "relevance": 0.3, "k": 10}}])
    res = pipeline.run(Context(store=_Table(), encoder=_Encoder), pa.table({"query_id": ["q1"], "text": ["first"]}),
                       inputs=Inputs("b", encoder="e", files={str(tmp_path / "run.parquet"): {"sha256": "r"}}))
    assert res.run.column("doc_id").to_pylist() == ["d0", "d2", "d1", "x", "d3"]
    counts = res.steps[-1]
    assert counts["docs_without_vector"] == 1 and counts["docs_without_vector_ids"] == ["x"], res.steps
