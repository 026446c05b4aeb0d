"""A whole job's rerun check tells a run on a CPU from one on a GPU (``dtype: auto`` runs
float32 on a CPU, the GPU's own choice there: LLMConfig.engine_digest): a decompose or an
evaluate's Judge run again into the same --out on a shared file system, on the other kind of
machine, is not skipped as unchanged. (retrieve's check keys the same digest, in
jobs/retrieve.py's _fingerprint, which needs a whole job to call.)"""

import pytest

from logicrank.pipelines import torch_build
from logicrank.pipelines.config.retrieval import DecomposeConfig
from logicrank.pipelines.config.settings import EvaluateConfig, LLMConfig


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "llama"}')
    return path


def _on(monkeypatch, gpu: bool) -> None:
    monkeypatch.setattr(torch_build, "cpu_only", lambda: not gpu)


def test_a_decompose_on_a_gpu_is_not_the_cpu_runs_rerun(tmp_path, model, monkeypatch):
    from logicrank.jobs import decompose

    seen = []
    monkeypatch.setattr(decompose, "_decompose", lambda cfg, rundir, progress, echo, start, queries, inputs: seen.append(inputs))
    (tmp_path / "q.jsonl").write_text('{"_id": "q1", "text": "a or b"}\n')
    cfg = DecomposeConfig(queries=str(tmp_path / "q.jsonl"), llm=LLMConfig(model=str(model)))
    for gpu in (False, False, True):
        _on(monkeypatch, gpu)
        decompose.run_decompose(cfg, tmp_path / "out", echo=lambda m: None)
    assert seen[0] == seen[1] and seen[2] != seen[0]


def test_an_evaluates_judge_on_a_gpu_is_not_the_cpu_runs_rerun(tmp_path, model, monkeypatch):
    from logicrank.jobs import evaluate

    seen = []
    monkeypatch.setattr(evaluate, "_evaluate_into", lambda cfg, rundir, title, echo, measures, qa, inputs: seen.append(inputs))
    (tmp_path / "a.jsonl").write_text('{"query_id": "q1", "answer": "x"}\n')
    (tmp_path / "g.jsonl").write_text('{"query_id": "q1", "answers": ["x"]}\n')
    cfg = EvaluateConfig(answers=(str(tmp_path / "a.jsonl"),), gold=str(tmp_path / "g.jsonl"), qa_measures=("Judge",),
                         judge=LLMConfig(model=str(model)))
    for gpu in (False, False, True):
        _on(monkeypatch, gpu)
        evaluate.run_evaluate(cfg, tmp_path / "out")
    assert seen[0] == seen[1] and seen[2] != seen[0]


def test_a_decompose_under_another_vllm_is_not_the_last_runs_rerun(tmp_path, model, monkeypatch):
    """Another installed vLLM (an upgrade that fixes its logprobs) may answer otherwise: the rerun
    is run, not skipped as unchanged (old code keyed the engine's settings only, so the last
    vLLM's decompositions, stage outputs and runs were served as current)."""
    from logicrank.jobs import decompose
    from logicrank.pipelines.config import settings

    seen = []
    monkeypatch.setattr(decompose, "_decompose", lambda cfg, rundir, progress, echo, start, queries, inputs: seen.append(inputs))
    (tmp_path / "q.jsonl").write_text('{"_id": "q1", "text": "a or b"}\n')
    cfg = DecomposeConfig(queries=str(tmp_path / "q.jsonl"), llm=LLMConfig(model=str(model)))
    for version in ("0.32.0", "0.32.0", "0.33.0"):
        monkeypatch.setattr(settings, "engine_versions", lambda version=version: [f"vllm={version}"])
        decompose.run_decompose(cfg, tmp_path / "out", echo=lambda m: None)
    assert seen[0] == seen[1] and seen[2] != seen[0]


def test_a_retrieve_under_another_bm25_analyzer_is_not_the_last_runs_rerun(tmp_path, monkeypatch):
    """Another PyStemmer or regex analyzes otherwise: the table's BM25 index is rebuilt, so a
    retrieve run again into the same --out with BM25 stages is run, not skipped as unchanged;
    a dense-only run does not depend on it."""
    from types import SimpleNamespace

    from logicrank.jobs import retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.engines.bm25 import analyzer
    from logicrank.pipelines.io import read_queries
    from logicrank.pipelines.retrieval.pipeline import Pipeline

    (tmp_path / "q.jsonl").write_text('{"_id": "q1", "text": "a or b"}\n')
    store = SimpleNamespace(version=3, version_stamp=lambda: "t")

    def fingerprint(stages):
        cfg = RetrieveConfig(queries=str(tmp_path / "q.jsonl"), db=str(tmp_path / "db"), pipelines={"p": stages})
        pipelines = [Pipeline.parse(name, spec) for name, spec in cfg.pipelines.items()]
        needs = pipelines[0].validate(frozenset({"query_id", "text"}))
        queries = read_queries(cfg.queries)
        return retrieve._fingerprint(cfg, SimpleNamespace(store=store, needs=needs, pipelines=pipelines, llm=None, queries=queries))[0]

    before = {s: fingerprint([s]) for s in ("bm25", "dense")}
    monkeypatch.setattr(analyzer, "analyzer_digest", lambda: "another PyStemmer")
    assert fingerprint(["bm25"]) != before["bm25"] and fingerprint(["dense"]) == before["dense"]
