"""A retriever after a stage that produced a run (PyTerrier's ``a >> b``: b works on a's output,
docs/pipelines.md, "A retriever after a run"): dense, bm25 and itlr score only that run's
candidates, with the scores they give those documents alone, and any other retriever (or a
fusion) there is refused in one line naming both stages; ``>>`` and the pipelines-file form
alike. A real LanceDB table of 120 generated documents; queries are embedded by a test double
(a vector drawn from the text's hash), so no model loads."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import logicrank as lr
from logicrank.pipelines.engines.embed import to_fixed_size_list
from logicrank.pipelines.engines.store import DocStore
from logicrank.pipelines.retrieval.pipeline import Pipeline, read_pipelines
from logicrank.pipelines.retrieval.runner import Inputs
from logicrank.pipelines.retrieval.stages import Context
from logicrank.schemas.tables import DECOMPOSITIONS, QUERIES
from tests.compare import ATOL, RTOL

DIM = 16
WORDS = ["apple", "river", "stone", "cloud", "forest", "engine", "violin", "garden", "planet", "copper",
         "desert", "harbor", "lantern", "meadow", "orbit", "pepper", "quartz", "saddle", "tunnel", "velvet"]
LOGICAL = {"q1": '"apple" AND NOT "river"', "q2": '("stone" OR "cloud") AND NOT "forest"', "q3": '"engine" AND "violin"',
           "q4": '"garden" AND NOT ("planet" OR "copper")', "q5": '"desert" OR "harbor"'}
DEPTH = 10  # the first stage's candidates per query
ALL = 1000  # past the table's size: a stage's full ranking


def _vector(text: str) -> np.ndarray:
    v = np.random.default_rng(int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)).normal(size=DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


class _Encoder:
    """A query's vector drawn from its text's hash (the encoder's place, without a model)."""

    def encode(self, texts):
        return np.stack([_vector(t) for t in texts])


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    rng = np.random.default_rng(7)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 7)))) for _ in range(120)]
    store = DocStore(str(tmp_path_factory.mktemp("after-run") / "db"))
    store.open_or_create(DIM, "test-encoder")
    store.upsert(pa.table({"doc_id": [f"d{i:03d}" for i in range(120)], "title": [None] * 120, "text": texts, "metadata": [None] * 120,
                           "content_hash": [f"h{i}" for i in range(120)], "vector": to_fixed_size_list(np.stack([_vector(t) for t in texts]))}))
    store.build_indexes(ann_threshold=10**9)
    store.mark_complete()
    return Context(store, encoder=_Encoder)


QUERIES_TABLE = pa.table({"query_id": list(LOGICAL), "text": [q.replace('"', "").replace("(", "").replace(")", "").lower() for q in LOGICAL.values()],
                          "logical_query": list(LOGICAL.values())}, schema=QUERIES)


def _run(ctx: Context, pipeline) -> pd.DataFrame:
    """The pipeline's run (a composition, or one stage's options), as a DataFrame by query and rank."""
    pipeline = pipeline if isinstance(pipeline, Pipeline) else Pipeline(pipeline.stage, (pipeline,))
    result = pipeline.run(ctx, QUERIES_TABLE, inputs=Inputs.of(QUERIES_TABLE, ctx.store, "test-encoder"))
    return result.run.to_pandas()[["query_id", "doc_id", "rank", "score"]].sort_values(["query_id", "rank"]).reset_index(drop=True)


def _restricted(full: pd.DataFrame, first: pd.DataFrame, k: int) -> pd.DataFrame:
    """``full`` ranking cut to the documents ``first`` holds for each query, ranked again, top ``k``."""
    kept = full.merge(first[["query_id", "doc_id"]], on=["query_id", "doc_id"]).sort_values(["query_id", "rank"])
    kept["rank"] = kept.groupby("query_id").cumcount() + 1
    return kept[kept["rank"] <= k].reset_index(drop=True)


def _ids(run: pd.DataFrame) -> dict[str, list[str]]:
    return {q: list(g["doc_id"]) for q, g in run.groupby("query_id")}


def _assert_same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Ids and ranks exactly, scores within tests/compare.py's tolerance (one document's score computed
    by two paths, a blocked product and one per candidate, may differ in its last float32 bits)."""
    assert _ids(got) == _ids(want)
    assert got["rank"].tolist() == want["rank"].tolist()
    np.testing.assert_allclose(got["score"], want["score"], rtol=RTOL, atol=ATOL)


def test_itlr_after_bm25_rescores_bm25s_candidates_as_itlr_scores_them(ctx):
    first = _run(ctx, lr.bm25(k=DEPTH))
    alone = _run(ctx, lr.itlr(scorer="bm25", k=ALL))
    # the finding: standalone ITLR's top DEPTH holds documents outside BM25's top DEPTH, which bm25 >> itlr used to return
    top = alone[alone["rank"] <= DEPTH]
    assert any(set(top[top["query_id"] == q]["doc_id"]) - set(ids) for q, ids in _ids(first).items())
    got = _run(ctx, lr.bm25(k=DEPTH) >> lr.itlr(scorer="bm25"))
    assert set(_ids(got)) == set(LOGICAL)
    for q, ids in _ids(got).items():
        assert set(ids) <= set(_ids(first)[q])  # BM25's candidates only
    _assert_same(got, _restricted(alone, first, ALL))  # each with its standalone ITLR score, in standalone ITLR's order


def test_bm25_after_dense_ranks_denses_candidates_by_bm25(ctx):
    first = _run(ctx, lr.dense(k=DEPTH))
    got = _run(ctx, lr.dense(k=DEPTH) >> lr.bm25(k=3))
    for q, ids in _ids(got).items():
        assert set(ids) <= set(_ids(first)[q])
    _assert_same(got, _restricted(_run(ctx, lr.bm25(k=ALL)), first, 3))  # candidates sharing no word are not returned, as bm25's
    assert _ids(got) != _ids(_run(ctx, lr.bm25(k=3)))  # not BM25 alone


def test_dense_after_bm25_ranks_bm25s_candidates_by_cosine(ctx):
    first = _run(ctx, lr.bm25(k=DEPTH))
    got = _run(ctx, lr.bm25(k=DEPTH) >> lr.dense(k=5))
    _assert_same(got, _restricted(_run(ctx, lr.dense(k=ALL)), first, 5))
    assert _ids(got) != _ids(_run(ctx, lr.dense(k=5)))  # not dense alone


def test_bm25_after_a_run_scores_only_the_candidates_columns(ctx, monkeypatch):
    """The index's scores are asked for the candidates alone (before: every document for a block
    of 256 queries, which ran the driver out of memory on a large table); the same scores."""
    index = ctx.store.bm25_index()
    texts = QUERIES_TABLE.column("text").to_pylist()
    rows = np.array([7, 3, 99, 3 + 40])
    np.testing.assert_array_equal(index.term_scores(texts, rows=rows).toarray(), index.term_scores(texts).toarray()[:, rows])
    asked = []

    class _Spy:  # the index, recording the shape of every score matrix it is asked for
        def __getattr__(self, name):
            return getattr(index, name)

        def term_scores(self, texts, **options):
            scores = index.term_scores(texts, **options)
            asked.append(scores.shape)
            return scores

    first = _run(ctx, lr.dense(k=DEPTH))
    monkeypatch.setattr(ctx.store, "bm25_index", lambda: _Spy())
    got = _run(ctx, lr.dense(k=DEPTH) >> lr.bm25(k=DEPTH))
    monkeypatch.undo()
    assert asked and all(cols <= len(first) < 120 for _, cols in asked)  # at most the candidates, never the table's 120 documents
    _assert_same(got, _restricted(_run(ctx, lr.bm25(k=ALL)), first, DEPTH))


def test_a_retriever_after_a_fusion_or_a_rewriter_scores_the_run_it_is_given(ctx, tmp_path):
    fused = lr.rrf(k=DEPTH, of=[["dense"], ["bm25"]])
    first = _run(ctx, fused)
    _assert_same(_run(ctx, fused >> lr.bm25(k=4)), _restricted(_run(ctx, lr.bm25(k=ALL)), first, 4))
    # a rewriter passes the run through: itlr after a decomposition scores bm25's candidates with the decomposition's form
    path = str(tmp_path / "d.parquet")
    forms = {q: '"apple" OR "stone" OR "garden"' for q in LOGICAL}  # wider than each query's own words: documents beyond bm25's
    base = {"method": "itlr", "model": "hand", "prompt_sha": "-", "raw_output": None, "atoms": None, "expansion": None, "error": None,
            "finish_reason": None, "prompt_tokens": 0, "generated_tokens": 0, "cached": False, "status": "ok"}
    pq.write_table(pa.Table.from_pylist([{**base, "query_id": q, "logical_query": f} for q, f in forms.items()], schema=DECOMPOSITIONS), path)
    inputs = Inputs.of(QUERIES_TABLE, ctx.store, "test-encoder", files=[path])

    def run(stages):
        result = read_pipelines({"x": stages})["x"].run(ctx, QUERIES_TABLE, inputs=inputs)
        return _ids(result.run.to_pandas().sort_values(["query_id", "rank"]))

    decomposition = {"decomposition": {"target": "itlr", "decompositions": path}}
    candidates = _ids(_run(ctx, lr.bm25(k=DEPTH)))
    alone = run([decomposition, {"itlr": {"scorer": "bm25", "k": DEPTH}}])
    assert any(set(ids) - set(candidates[q]) for q, ids in alone.items())  # the form alone finds documents bm25 did not
    got = run([{"bm25": {"k": DEPTH}}, decomposition, {"itlr": {"scorer": "bm25", "k": DEPTH}}])
    assert set(got) == set(LOGICAL) and all(got[q] and set(ids) <= set(candidates[q]) for q, ids in got.items())


def test_the_file_form_runs_as_the_composition(ctx):
    made = lr.bm25(k=DEPTH) >> lr.itlr(scorer="bm25")
    read = read_pipelines({"bm25-itlr": [{"bm25": {"k": DEPTH}}, {"itlr": {"scorer": "bm25"}}]})["bm25-itlr"]
    assert read.stages == made.stages
    pd.testing.assert_frame_equal(_run(ctx, read), _run(ctx, made))


REFUSED = [
    (lambda: lr.bm25() >> lr.run_file(path="x.trec"), [{"bm25": {}}, {"run_file": {"path": "x.trec"}}],
     r"stage 2 \(run_file\) comes after stage 1 \(bm25\), which produced a run, but it reads its own run from a file"),
    (lambda: lr.dense() >> lr.qrels(path="q.tsv"), ["dense", {"qrels": {"path": "q.tsv"}}],
     r"stage 2 \(qrels\) comes after stage 1 \(dense\), which produced a run, but it reads its own run from a qrels file"),
    (lambda: lr.bm25() >> lr.itlr(mode="listed", pairs="p.tsv"), ["bm25", {"itlr": {"mode": "listed", "pairs": "p.tsv"}}],
     r"stage 2 \(itlr\) comes after stage 1 \(bm25\), which produced a run, but its mode 'listed' picks its own candidates"),
    (lambda: lr.bm25() >> lr.dense(search="ann"), ["bm25", {"dense": {"search": "ann"}}],
     r"stage 2 \(dense\) comes after stage 1 \(bm25\), which produced a run, but its search 'ann' searches the table's ANN index"),
    (lambda: lr.bm25() >> lr.rrf(of=[["dense"], ["bm25"]]), ["bm25", {"rrf": {"of": [["dense"], ["bm25"]]}}],
     r"stage 2 \(rrf\) comes after stage 1 \(bm25\), which produced a run, but it fuses the runs of its own sub-pipelines"),
    (lambda: lr.bm25() >> lr.mmr() >> lr.run_file(path="x.trec"), ["bm25", "mmr", {"run_file": {"path": "x.trec"}}],
     r"stage 3 \(run_file\) comes after stage 2 \(mmr\), which produced a run"),
]


@pytest.mark.parametrize(("compose", "spec", "match"), REFUSED, ids=["run_file", "qrels", "itlr-listed", "dense-ann", "rrf", "after-reranker"])
def test_a_retriever_that_would_discard_the_run_is_refused_in_one_line_naming_both_stages(compose, spec, match):
    with pytest.raises(lr.PipelineError, match=match) as composed:
        compose()
    with pytest.raises(lr.PipelineError, match=match) as filed:
        read_pipelines({"p": spec})
    for exc in (composed, filed):
        assert "\n" not in str(exc.value) and "would discard that run" in str(exc.value)
