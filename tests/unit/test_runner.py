"""Pipelines run in any process (pipelines/retrieval/runner.py): no Ray, no job. The cache keys, the
on-disk stage cache, the per-query hook, the side-table contract, the batches' assembly."""

from __future__ import annotations

import sys
from typing import Literal

import numpy as np
import pyarrow as pa
import pytest

from logicrank.pipelines.config.settings import EmbedConfig
from logicrank.pipelines.retrieval.methods.hybrid import rrf
from logicrank.pipelines.retrieval.pipeline import Pipeline, build, parse_stages
from logicrank.pipelines.retrieval.runner import Hooks, Inputs, StageCache, StageRunner, assemble, in_process
from logicrank.pipelines.retrieval.stages import Context, Kind, Output, Stage, StageOptions
from logicrank.schemas.tables import RUN, TRUTH_SCORES


def _run(rows: list[tuple[str, str, int]], run_id: str) -> pa.Table:
    return pa.table({"query_id": [q for q, _, _ in rows], "doc_id": [d for _, d, _ in rows], "rank": pa.array([r for _, _, r in rows], pa.int32()),
                     "score": [1.0 / r for _, _, r in rows], "method": [run_id] * len(rows), "run_id": [run_id] * len(rows)}, schema=RUN)


@pytest.fixture
def two_runs(tmp_path):
    import pyarrow.parquet as pq

    a = _run([("q1", "d1", 1), ("q1", "d2", 2), ("q2", "d3", 1), ("q3", "d9", 1)], "a")
    b = _run([("q1", "d2", 1), ("q1", "d4", 2), ("q2", "d1", 1), ("q2", "d3", 2)], "b")
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet")
    queries = pa.table({"query_id": ["q1", "q2"], "text": ["first", "second"]})
    return queries, a, b, tmp_path


def test_a_pipeline_runs_in_process_and_a_second_process_reads_its_stages_from_the_cache(two_runs):
    queries, a, b, tmp = two_runs
    fused = Pipeline.parse("fused", [{"rrf": {"k": 3, "rrf_k": 10, "of": [[{"run_file": {"path": str(tmp / "a.parquet")}}],
                                                                         [{"run_file": {"path": str(tmp / "b.parquet")}}]]}}])
    inputs = Inputs.of(queries, _NoTable(), files=[str(tmp / "a.parquet"), str(tmp / "b.parquet")])
    first = fused.run(Context(store=_NoTable()), queries, StageCache(tmp / "stages"), inputs)
    q12 = lambda t: t.filter(pa.compute.is_in(t.column("query_id"), pa.array(["q1", "q2"])))  # noqa: E731 - q3 is not asked
    want = rrf([q12(a), q12(b)], 3, 10)
    assert first.run.drop(["run_id"]).equals(want.drop(["run_id"]))
    assert set(first.run.column("run_id").to_pylist()) == {"fused"}
    assert [s.get("cached") for s in first.steps] == [None, None, False]  # two children, then the fusion
    assert [s["cached"] for s in first.steps[0]["sub"] + first.steps[1]["sub"]] == [False, False]

    again = fused.run(Context(store=_NoTable()), queries, StageCache(tmp / "stages"), inputs)  # a new cache object: read from disk
    assert again.run.equals(first.run) and again.steps[-1]["cached"] and again.steps[0]["sub"][0]["cached"]
    changed = Inputs.of(queries.slice(0, 1), _NoTable(), files=inputs.files)  # other queries: other keys
    assert not fused.run(Context(store=_NoTable()), queries.slice(0, 1), StageCache(tmp / "stages"), changed).steps[-1]["cached"]
    # a stage's saved run removed by hand (a cache pruned): a miss, the stage runs again; it was read as a stage that
    # makes no run, and the run before it passed on as its own
    cut = Pipeline.parse("cut", [{"run_file": {"path": str(tmp / "a.parquet")}}, {"cut": {"k": 1}}])
    whole = cut.run(Context(store=_NoTable()), queries, StageCache(tmp / "stages"), inputs)
    (tmp / "stages" / whole.steps[-1]["digest"] / "run.parquet").unlink()
    pruned = cut.run(Context(store=_NoTable()), queries, StageCache(tmp / "stages"), inputs)
    assert pruned.run.equals(whole.run) and not pruned.steps[-1]["cached"]


def test_a_blank_query_gets_no_results_and_the_pipeline_validates_first(two_runs):
    queries, a, b, tmp = two_runs
    with pytest.raises(ValueError, match="reranks a run, but no stage before it produces one"):
        Pipeline("bad", parse_stages([{"orlog": {}}])).run(Context(store=_NoTable()), queries)
    with pytest.raises(ValueError, match="'e' encodes queries: give its Context an encoder"):
        Pipeline.parse("e", ["dense"]).run(Context(store=_NoTable()), queries)
    with pytest.raises(ValueError, match="'o' asks the LLM: give its Context an LLM"):
        Pipeline.parse("o", [{"decomposition": {"target": "orlog"}}, "bm25", "orlog"]).run(Context(store=_NoTable()), queries)
    from logicrank.pipelines.retrieval.stages.fusion import RRFOptions

    with pytest.raises(ValueError, match=r"stage 1 \(rrf\) fuses no sub-pipelines"):
        Pipeline("f", (RRFOptions.model_construct(k=10, rrf_k=60, of=()),)).validate()
    blank = pa.table({"query_id": ["q1", "q2"], "text": ["   ", "second"]})
    dense = Pipeline.parse("d", ["dense"])
    seen = []
    encoder = Context(store=_NoTable(), encoder=lambda: None)  # never called: the hook below does the work

    def hook(stage, ctx, qs):  # the per-query hook sees only the queries with text
        seen.append(qs.column("query_id").to_pylist())
        return Output(run=RUN.empty_table())

    out = dense.run(encoder, blank, inputs=Inputs("b", encoder="e"), hooks=Hooks(map_queries=hook))
    assert seen == [["q2"]] and out.run.num_rows == 0
    # inside a fusion too: the fusion's queries are those with content in any child's columns (a run file's beside
    # dense), and each child runs only those with content in its own (dense ranked the corpus for "   ", fused first)
    seen.clear()
    fused = Pipeline.parse("f", [{"rrf": {"k": 3, "rrf_k": 10, "of": [[{"run_file": {"path": str(tmp / "a.parquet")}}], ["dense"]]}}])
    out = fused.run(encoder, blank, inputs=Inputs("b", encoder="e", files={str(tmp / "a.parquet"): "fp"}), hooks=Hooks(map_queries=hook))
    assert seen == [["q2"]], seen
    assert out.run.filter(pa.compute.equal(out.run.column("query_id"), "q1")).column("doc_id").to_pylist() == ["d1", "d2"]  # the file's


def test_a_blank_query_asks_a_stage_after_a_run_for_nothing(tmp_path):
    """A pipeline whose first stage reads only query ids (a run file) keeps a blank query; a
    stage after it that scores the run's candidates by the text read it as a first stage does
    not: dense ranked the blank query's candidates by the empty string's vector (bm25 returned
    none). Such a stage now sees only the queries with text, as a first stage does."""
    import pyarrow.parquet as pq

    class Vectors:
        ids, matrix = pa.array(["d1", "d5", "d9", "d3"]), np.eye(4, dtype=np.float32)

    class Store(_NoTable):
        def version_stamp(self):
            return "x"

        def vectors(self, precision="float32"):
            return Vectors()

    class Encoder:
        model_id = "fake"

        def encode(self, texts):
            return np.array([[1.0, 0.5, 0.2, 0.1] if not t.strip() else [0.1, 0.2, 0.5, 1.0] for t in texts], np.float32)

    pq.write_table(_run([("q1", "d1", 1), ("q1", "d3", 2), ("q2", "d1", 1), ("q2", "d3", 2)], "f"), tmp_path / "run.parquet")
    queries = pa.table({"query_id": ["q1", "q2"], "text": ["a", "   "]})
    pipeline = Pipeline.parse("rd", [{"run_file": {"path": str(tmp_path / "run.parquet")}}, {"dense": {"k": 10}}])
    out = pipeline.run(Context(store=Store(), encoder=lambda: Encoder()), queries, inputs=Inputs("b", encoder="e", files={str(tmp_path / "run.parquet"): "x"}))
    assert out.run.column("query_id").to_pylist() == ["q1", "q1"] and out.run.column("doc_id").to_pylist() == ["d3", "d1"]


def test_the_per_query_hook_runs_batches_and_its_run_must_stay_keyed_by_the_queries(two_runs):
    queries, *_ = two_runs
    bm25 = Pipeline.parse("b", ["bm25"])

    def stray(stage, ctx, qs):
        return Output(run=_run([("q1", "d1", 1), ("qX", "d1", 1)], "bm25"))

    with pytest.raises(RuntimeError, match="not keyed by the input queries.*1 unknown query ids"):
        bm25.run(Context(store=_NoTable()), queries, inputs=Inputs("b"), hooks=Hooks(map_queries=stray))

    def gap(stage, ctx, qs):  # ranks 1, 3: a batch lost a row
        return Output(run=_run([("q1", "d1", 1), ("q1", "d2", 3)], "bm25"))

    with pytest.raises(RuntimeError, match="ranks contiguous: False"):
        bm25.run(Context(store=_NoTable()), queries, inputs=Inputs("b"), hooks=Hooks(map_queries=gap))


class _SideOptions(StageOptions):
    stage: Literal["side_test"] = "side_test"
    kind: str = "truth"


class _Side(Stage):
    """Not registered: a stage that writes one side table, declared or not."""

    name, kind, Options = "side_test", Kind.RERANKER, _SideOptions
    side_tables = {"truth": TRUTH_SCORES}

    def run(self, ctx, queries, runs):
        table = pa.table({"prompt_id": [1], "p_true": [0.5], "logit_true": [0.0], "logit_false": [0.0], "exact": [True],
                          "prompt_tokens": [3], "cached_prompt_tokens": [0], "cached": [False], "extra": ["dropped"]})
        return Output(run=runs[0], side={self.options.kind: table})


def test_a_stages_side_tables_are_conformed_to_their_declared_schemas_and_an_undeclared_one_is_a_bug(two_runs):
    queries, a, *_ = two_runs
    a = a.filter(pa.compute.not_equal(a.column("query_id"), "q3"))
    runner = StageRunner(Context(store=_NoTable()), Inputs("b"), StageCache(), Hooks())
    out, cached = runner.run_stage("k1", _Side(_SideOptions()), queries, [a])
    assert not cached and out.side["truth"].schema.equals(TRUTH_SCORES)  # "extra" dropped, types cast
    with pytest.raises(RuntimeError, match=r"side table\(s\) \['other'\] not declared"):
        runner.run_stage("k2", _Side(_SideOptions(kind="other")), queries, [a])


def test_a_stage_cache_key_covers_its_prefix_options_inputs_and_sub_pipelines():
    def key(inputs, spec, prev="p", subs=()) -> str:
        return inputs.key(prev, build(parse_stages([spec])[0]), list(subs))

    from logicrank.pipelines.engines.embed import encoder_digest

    torch, openvino = (Inputs("b", encoder=encoder_digest(EmbedConfig(backend=b)), files={"r.trec": {"sha256": "1"}}) for b in ("torch", "openvino"))
    auto = Inputs("b", encoder=encoder_digest(EmbedConfig()), files={"r.trec": {"sha256": "1"}})
    assert key(auto, "dense") == key(Inputs("b", encoder=encoder_digest(EmbedConfig())), "dense")  # stable
    assert len({key(auto, "dense"), key(auto, {"dense": {"k": 10}}), key(auto, "dense", prev="other"), key(auto, "bm25")}) == 4
    assert key(torch, "dense") != key(openvino, "dense")  # the encoder's backend
    assert key(auto, "dense") in {key(torch, "dense"), key(openvino, "dense")}  # auto is keyed as what it resolves to
    assert key(auto, "bm25") == key(openvino, "bm25")  # bm25 does not embed
    rrf_ = {"rrf": {"of": [["dense"], ["bm25"]]}}
    assert key(auto, rrf_, subs=["a", "b"]) != key(auto, rrf_, subs=["a", "c"])  # a fusion covers what its inputs depend on
    run_file = {"run_file": {"path": "r.trec"}}
    assert key(auto, run_file) != key(Inputs("b", files={"r.trec": {"sha256": "2"}}), run_file)  # the files a stage reads
    llm = {"orlog": {}}
    assert key(Inputs("b", llm=("m", "e", "t1")), llm) != key(Inputs("b", llm=("m", "e", "t2")), llm)  # the prompts
    # no pinned keys: a key changes whenever its stage's code does (pipelines/codedigest.py); the same code and
    # options give the same key, and another digest of the code or another manual version another key
    bm25 = build(parse_stages(["bm25"])[0])
    before = key(auto, "bm25")
    assert before == auto.key("p", bm25, []) and bm25.code() == type(bm25).code()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(bm25), "code", classmethod(lambda cls: "edited"))
        assert auto.key("p", bm25, []) != before
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(bm25), "version", type(bm25).version + 1)  # the manual override
        assert auto.key("p", bm25, []) != before
    assert auto.key("p", bm25, []) == before
    from logicrank.pipelines.engines.bm25 import analyzer

    dense = key(auto, "dense")
    with pytest.MonkeyPatch.context() as mp:  # another PyStemmer or regex: the BM25 index is rebuilt, and bm25's output is not reused
        mp.setattr(analyzer, "analyzer_digest", lambda: "another PyStemmer")
        assert auto.key("p", bm25, []) != before and key(auto, "dense") == dense  # (dense reads no BM25 index)
    with pytest.raises(ValueError, match="give Inputs an encoder digest"):
        key(Inputs("b"), "dense")


def test_batches_are_assembled_as_sort_by_query_id_then_rank_would():
    """assemble sorts on integer codes; Arrow's string sort is the definition (byte order:
    upper case before lower, digits before letters, non-ASCII last, "q10" before "q2")."""
    rng = np.random.default_rng(7)
    ids = ["q10", "q2", "Q1", "q1", "é1", "e1", "10", "q1 ", "ß", "z"] + [f"q{i}" for i in rng.permutation(40)]
    parts = []
    for chunk in np.array_split(rng.permutation(len(ids)), 6):  # batches in any order, each query's ranks shuffled
        rows = [(ids[q], f"d{rng.integers(1000)}", int(r)) for q in chunk for r in rng.permutation(np.arange(1, rng.integers(1, 6) + 1))]
        parts.append(_run(rows, "bm25"))
    got = assemble(parts, "bm25")
    want = pa.concat_tables(parts).sort_by([("query_id", "ascending"), ("rank", "ascending")])
    assert got.equals(want)
    assert assemble([], "bm25").num_rows == 0
    assert in_process(2)(_Echo(_SideOptions()), Context(store=_NoTable()), pa.table({"query_id": ["b", "a", "c"]})).run.column("query_id").to_pylist() == ["a", "b", "c"]


class _Echo(_Side):
    def run(self, ctx, queries, runs):
        return Output(run=_run([(q, "d", 1) for q in queries.column("query_id").to_pylist()], "echo"))


class _NoTable:
    """A table of no documents at version 1: for pipelines that read only files."""

    uri, name, version = "none", "docs", 1


class _NaNOptions(StageOptions):
    stage: Literal["nan_test"] = "nan_test"


class _NaN(Stage):
    """Not registered: a reranker whose second row of its input gets a NaN score (as OrLog's
    calibration of two -inf label logits gives)."""

    name, kind, Options = "nan_test", Kind.RERANKER, _NaNOptions

    def run(self, ctx, queries, runs):
        score = runs[0].column("score").to_numpy().copy()
        score[1] = np.nan
        return Output(run=runs[0].set_column(runs[0].schema.get_field_index("score"), "score", pa.array(score)))


def test_a_run_with_a_nan_score_is_refused_before_it_is_cached(two_runs, tmp_path):
    from logicrank.schemas.errors import JobFailed

    queries, a, *_ = two_runs
    a = a.filter(pa.compute.not_equal(a.column("query_id"), "q3"))
    cache = StageCache(tmp_path / "stages")
    runner = StageRunner(Context(store=_NoTable()), Inputs("b"), cache, Hooks())
    with pytest.raises(JobFailed, match=r"^nan_test: 1 score\(s\) are missing, NaN or infinite, e.g. nan for query 'q1', doc 'd2'; nothing"):
        runner.run_stage("k1", _NaN(_NaNOptions()), queries, [a])
    assert cache.get("k1") is None
    out, cached = runner.run_stage("k2", _Side(_SideOptions()), queries, [a])  # finite scores pass
    assert not cached and out.run.equals(a)


def test_the_runner_imports_neither_ray_nor_a_job():
    import subprocess

    code = "import sys, pipelines.retrieval.pipeline, pipelines.retrieval.runner; print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('jobs')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
