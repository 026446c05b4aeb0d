"""retrieve --method itlr on a real LanceDB table with the real MiniLM encoder."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from jobs.retrieve import run_retrieve
from pipelines.config import RetrieveConfig
from pipelines.methods.itlr import TERM_SCORES
from pipelines.store import DocStore
from schemas.tables import RUN

pytestmark = pytest.mark.integration


def _cfg(root, **kw) -> RetrieveConfig:
    return RetrieveConfig.preset(queries=str(root / "syn" / "queries.jsonl"), db=str(root / "db"), **kw)


def test_exact_and_ann_agree_on_the_candidates_ann_finds(synthetic, tmp_path):
    n_docs = DocStore(str(synthetic / "db")).count()
    exact = run_retrieve(_cfg(synthetic, methods=("itlr",), k=n_docs, run_tag="exact"), tmp_path / "exact")
    ann = run_retrieve(_cfg(synthetic, methods=("itlr",), k=n_docs, itlr_mode="ann", ann_k=10, run_tag="ann"), tmp_path / "ann")
    e = pq.read_table(exact["exact-itlr"]).to_pandas().set_index(["query_id", "doc_id"])["score"]
    a = pq.read_table(ann["ann-itlr"]).to_pandas().set_index(["query_id", "doc_id"])["score"]
    assert len(a) < len(e)  # ann saw a subset
    assert a.index.isin(e.index).all()
    assert (a - e.loc[a.index]).abs().max() < 1e-5
    manifest = json.loads((tmp_path / "ann" / "manifest.json").read_text())
    distinct = {t for line in (synthetic / "syn" / "queries.jsonl").read_text().splitlines() for t in json.loads(line)["terms"]}
    counts = manifest["pipelines"]["ann-itlr"]["stages"][-1]
    assert counts["mode"] == "ann" and counts["fallback"] == 0
    assert counts["unique_terms"] == len(distinct)  # each distinct term embedded once


def test_itlr_run_and_term_scores_conserve_rows(synthetic, tmp_path):
    runs = run_retrieve(_cfg(synthetic, methods=("dense", "itlr"), k=5, calibration="zscore"), tmp_path / "r")
    run = pq.read_table(runs["itlr"])
    assert run.schema == RUN and run.num_rows == 32 * 5
    scores = pq.read_table(tmp_path / "r" / "term_scores" / "itlr.parquet")
    assert scores.schema == TERM_SCORES
    assert scores.num_rows == 32 * 5 * 3  # every ranked pair, each of its query's 3 terms
    assert min(scores.column("calibrated").to_pylist()) >= 0 and max(scores.column("calibrated").to_pylist()) <= 1


def test_sigmoid_calibration_needs_and_uses_labels(synthetic, tmp_path):
    with pytest.raises(ValueError, match="give labels"):
        run_retrieve(_cfg(synthetic, methods=("itlr",), calibration="sigmoid"), tmp_path / "x")
    runs = run_retrieve(
        _cfg(synthetic, methods=("itlr",), k=5, calibration="sigmoid", labels=str(synthetic / "syn" / "labels.jsonl")), tmp_path / "s"
    )
    assert pq.read_table(runs["itlr"]).num_rows == 32 * 5


def test_side_tables_of_a_fused_sub_pipeline_are_kept(synthetic, tmp_path):
    from pipelines.config import RetrieveConfig as Config

    cfg = Config(queries=str(synthetic / "syn" / "queries.jsonl"), db=str(synthetic / "db"),
                 pipelines={"fused": [{"rrf": {"k": 5, "of": [[{"itlr": {"k": 10}}], [{"dense": {"k": 10}}]]}}]})
    run = pq.read_table(run_retrieve(cfg, tmp_path / "r")["fused"])
    assert run.num_rows == 32 * 5
    scores = pq.read_table(tmp_path / "r" / "term_scores" / "fused@1-rrf1.parquet")
    assert scores.schema == TERM_SCORES and scores.num_rows == 32 * 10 * 3
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert "term_scores/fused@1-rrf1.parquet" in manifest["outputs"]
    assert manifest["inputs"]["stages"] == [["dense", 1], ["itlr", 1], ["rrf", 1]]
