"""The LLM layer on real vLLM (CPU build) with a tiny random Llama built at test time."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.config.retrieval import DecomposeConfig
from logicrank.pipelines.llm import prompts
from logicrank.pipelines.llm.cache import LLMCache
from logicrank.pipelines.llm.decompose import FORM_PATTERN, orlog_schema, parse_output
from logicrank.pipelines.llm.engine import Constraint, Engine, LLMClient
from logicrank.pipelines.retrieval.logic.grammar import to_gbnf
from logicrank.pipelines.retrieval.logic.query import parse
from tests.conftest import write_jsonl
from tests.integration.conftest import RAY


@pytest.fixture(scope="session")
def engine(tiny_cfg):
    return Engine(tiny_cfg)


QUESTIONS = [f"question {i}: {w}" for i, w in enumerate(["vitamin D benefits other than bone", "museums in Paris but not art", "cells"] * 20)]


def test_grammar_constrained_itlr_outputs_parse(engine):
    # random sampling from a random model: the grammar alone makes outputs well formed.
    # Terms bounded at 24 characters: a random model rarely picks a closing quote itself.
    gens = engine.generate(QUESTIONS, Constraint("grammar", to_gbnf(24)), max_tokens=400, temperature=1.0, seed=7)
    finished = [g for g in gens if g.finish_reason == "stop"]
    assert len(finished) >= len(gens) // 2  # seeded: the check below covers many samples
    for g in finished:
        parse(g.text)  # raises if not
    for g in gens:
        parsed = parse_output("itlr", "q", g)  # a finished output parses: used, or refused as degenerate (a random NOT)
        assert parsed.status in (("ok", "degenerate") if g.finish_reason == "stop" else ("fallback",))
        if g.finish_reason != "stop":
            assert "max_tokens" in parsed.error


def test_json_regex_and_choice_constraints(engine):
    # seeded: a random model's outputs vary in length (the form's pattern is unbounded), so how
    # many finish within max_tokens is a property of the sample; every finished one must be valid
    gens = engine.generate(QUESTIONS[:20], Constraint("json", orlog_schema(max_atoms=3, max_chars=15)), max_tokens=600, temperature=1.0, seed=7)
    finished = [g for g in gens if g.finish_reason == "stop"]
    assert len(finished) >= 10
    for g in finished:
        obj = json.loads(g.text, strict=False)
        assert set(obj) == {"atoms", "form"} and 1 <= len(obj["atoms"]) <= 3
        assert all(re.fullmatch(r"a[0-9]{1,2}", a["id"]) for a in obj["atoms"])
        assert all(re.fullmatch(r"[^{}]{0,15}\{x\}[^{}]{0,15}", a["text"]) for a in obj["atoms"])  # the placeholder, once
        assert re.fullmatch(FORM_PATTERN, obj["form"])  # atom ids, AND / OR, NOTs and brackets only
    regex = engine.generate(QUESTIONS[:10], Constraint("regex", "[abc]{3}-[0-9]{2}"), max_tokens=20, temperature=1.0, seed=7)
    assert all(re.fullmatch(r"[abc]{3}-[0-9]{2}", g.text) for g in regex)
    choice = engine.generate(QUESTIONS[:10], Constraint("choice", ["yes", "no"]), max_tokens=5, temperature=1.0, seed=7)
    assert {g.text for g in choice} <= {"yes", "no"}


def test_truth_agrees_with_a_transformers_forward_pass(engine, tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    template = prompts.load("truth")
    texts = [template.render(context=f"Document {i}: some cells grow.\n", statement=f"thing {i} is {c}") for i, c in enumerate(["red", "blue", "a cell"] * 8)]
    got = engine.truth(texts)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    t_id, f_id = engine.label_ids
    for text, g in zip(texts, got, strict=True):
        with torch.no_grad():
            logits = model(**tok(text, return_tensors="pt")).logits[0, -1]
        zt, zf = float(logits[t_id]), float(logits[f_id])
        assert g.exact
        assert abs(g.logit_true - zt) < 1e-2 and abs(g.logit_false - zf) < 1e-2
        assert abs(g.p_true - 1 / (1 + np.exp(zf - zt))) < 1e-2
    assert np.std([g.p_true for g in got]) > 0.05  # the comparison is not between constants


def test_a_cached_rerun_makes_no_engine_call(tiny_cfg, engine, tmp_path):
    cfg = tiny_cfg.model_copy(update={"cache": str(tmp_path / "cache.sqlite")})
    template = prompts.load("itlr_decompose")
    values = [{"question": q} for q in QUESTIONS[:12]]
    first = LLMClient(cfg)
    first._engine = engine  # share the session's engine (one KV cache per process)
    a = first.generate(template, values, Constraint("grammar", to_gbnf(24)), max_tokens=64)
    assert first.stats["engine_calls"] == 1 and first.stats["prompts_run"] == 12
    again = LLMClient(cfg)  # a new process would see the same: the cache is on disk
    b = again.generate(template, values, Constraint("grammar", to_gbnf(24)), max_tokens=64)
    assert again.stats["engine_calls"] == 0 and again._engine is None and again.stats["cache_hits"] == 12
    assert [g.text for g in a] == [g.text for g in b] and all(g.cached for g in b)
    # another sampling parameter (or template, or model) is another key: a miss
    again._engine = engine
    again.generate(template, values[:2], Constraint("grammar", to_gbnf(24)), max_tokens=65)
    assert again.stats["engine_calls"] == 1 and again.stats["prompts_run"] == 2


def _decompose_cfg(tmp_path, tiny_cfg, n, **kw) -> DecomposeConfig:
    queries = write_jsonl(tmp_path / "queries.jsonl", [{"_id": f"q{i}", "text": QUESTIONS[i]} for i in range(n)])
    return DecomposeConfig(
        queries=str(queries), llm=tiny_cfg.model_copy(update={"cache": str(tmp_path / "cache.sqlite"), "batch_rows": 4}), ray=RAY,
        max_tokens={"itlr": 200, "orlog": 200, "reasoning": 16}, max_term_chars=16, **kw,
    )


@pytest.mark.usefixtures("kept_engines")  # the job joins the session's cluster; its LLM pool is kept for the next job (conftest.py)
def test_decompose_job_conserves_rows_and_counts_fallbacks(tmp_path, tiny_cfg):
    from logicrank.jobs.decompose import run_decompose

    cfg = _decompose_cfg(tmp_path, tiny_cfg, 10, constrained=False)
    s = run_decompose(cfg, tmp_path / "free")
    table = pq.read_table(s.path)
    assert table.num_rows == 30
    assert Counter(zip(table.column("query_id").to_pylist(), table.column("method").to_pylist(), strict=True)) == Counter(
        {(f"q{i}", m): 1 for i in range(10) for m in ("itlr", "orlog", "reasoning")}
    )
    rows = table.to_pylist()
    # a random model without a grammar does not write JSON: every orlog row falls back to the question
    orlog = [r for r in rows if r["method"] == "orlog"]
    assert all(r["status"] == "fallback" and r["error"] for r in orlog)
    assert all(r["atoms"][0]["text"].endswith(QUESTIONS[int(r["query_id"][1:])]) for r in orlog)
    manifest = json.loads((tmp_path / "free" / "manifest.json").read_text())
    assert manifest["by_status"]["orlog"] == {"fallback": 10}
    assert sum(manifest["by_status"]["itlr"].values()) == 10 and manifest["prompts_run"] == 30
    for r in rows:  # every row is usable downstream, fallback or not
        if r["method"] == "itlr":
            parse(r["logical_query"])
        assert r["model"].startswith("tiny-llama@") and len(r["prompt_sha"]) == 16


@pytest.mark.usefixtures("kept_engines")  # the job joins the session's cluster; its LLM pool is kept for the next job (conftest.py)
def test_constrained_decompose_then_rerun_from_cache(tmp_path, tiny_cfg):
    from logicrank.jobs.decompose import run_decompose

    cfg = _decompose_cfg(tmp_path, tiny_cfg, 8, methods=("itlr", "orlog"))
    first = run_decompose(cfg, tmp_path / "a")
    rows = pq.read_table(first.path).to_pylist()
    for r in rows:
        parse(r["logical_query"])
        if r["status"] == "fallback":
            assert r["method"] == "orlog" or "max_tokens" in r["error"]
    assert first.prompts_run == 16 and first.cache_hits == 0
    assert run_decompose(cfg, tmp_path / "a").skipped  # same inputs and config: nothing to do
    second = run_decompose(cfg, tmp_path / "b")  # a new run directory: every prompt from the cache
    assert second.prompts_run == 0 and second.cache_hits == 16
    assert pq.read_table(second.path).drop(["cached"]).equals(pq.read_table(first.path).drop(["cached"]))


@pytest.mark.usefixtures("ray_cluster")
def test_a_kept_pool_serves_the_next_job_for_the_same_engines_from_that_jobs_cache(tmp_path, tiny_cfg, monkeypatch):
    """Inside ``keep_engines`` (an experiment's jobs): a job's engine actor outlives it and the
    next job for the same engines takes it over, starting none. Each job answers from its own
    cache, opened for it: the cache file removed between two jobs is not read through the
    first job's handle (every prompt runs again, and lands in the new file), another file or
    none is that job's alone, and each job counts only the engines it loaded. A job for other
    engines ends the kept pool and starts its own; a job's Ray session that takes none, and the
    block's end, end what is kept."""
    import ray

    from logicrank.jobs import raysession
    from logicrank.jobs.decompose import run_decompose

    raysession.end_kept()  # this module's block (the kept_engines fixture) set aside: the block below is the test's own
    monkeypatch.setattr(raysession, "_kept", None)

    def kept_actor():
        assert raysession._kept and len(raysession._kept[0][2]) == 1, raysession._kept
        return raysession._kept[0][2][0]

    def ended(actor) -> bool:  # (ray.kill is asynchronous: a call sent just after it may still be answered)
        while True:
            try:
                ray.get(actor.ready.remote())
            except ray.exceptions.RayActorError:
                return True
            time.sleep(0.1)

    def run(cfg, out):
        table = pq.read_table(run_decompose(cfg, tmp_path / out).path).drop(["cached"])
        llm = json.loads((tmp_path / out / "manifest.json").read_text())["llm"]
        return table, (llm["actors_started"], llm["actors_adopted"], llm["engines_loaded"], llm["prompts_run"], llm["cache_hits"])

    cfg = _decompose_cfg(tmp_path, tiny_cfg, 4, methods=("reasoning",))
    cache = Path(cfg.llm.cache)
    with raysession.keep_engines():
        first, counts = run(cfg, "a")
        assert counts == (1, 0, 1, 4, 0)
        actor = kept_actor()
        for f in cache.parent.glob(cache.name + "*"):  # the cache, its WAL and shared memory
            f.unlink()
        table, counts = run(cfg, "b")
        assert counts == (0, 1, 0, 4, 0) and table.equals(first) and kept_actor() == actor
        assert len(LLMCache(cache)) == 4  # the second job's answers, in its own (new) file
        other_file = cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"cache": str(tmp_path / "other.sqlite")})})
        table, counts = run(other_file, "b2")
        assert counts == (0, 1, 0, 4, 0) and table.equals(first) and len(LLMCache(tmp_path / "other.sqlite")) == 4
        table, counts = run(cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"cache": None})}), "b3")
        assert counts == (0, 1, 0, 4, 0) and table.equals(first) and kept_actor() == actor
        assert len(LLMCache(cache)) == len(LLMCache(tmp_path / "other.sqlite")) == 4  # (the job without a cache wrote to neither)
        other = cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"max_num_seqs": 32})})
        assert run(other, "c")[1] == (1, 0, 0, 0, 4)  # its own actor; every answer from the cache: no engine loaded
        assert ended(actor)
        actor = kept_actor()
        with raysession.ray_session(RAY):  # a job that asks for no LLM
            assert ended(actor) and not raysession._kept
        run(cfg, "d")
        actor = kept_actor()
    assert ended(actor) and raysession._kept is None


@pytest.mark.usefixtures("kept_engines")
def test_decomposed_queries_flow_into_itlr_and_expansion(tmp_path, tiny_cfg, synthetic):
    from logicrank.jobs.decompose import run_decompose
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig

    queries = synthetic / "syn" / "queries.jsonl"
    cfg = DecomposeConfig(
        queries=str(queries), llm=tiny_cfg.model_copy(update={"cache": str(tmp_path / "c.sqlite"), "batch_rows": 16}), ray=RAY,
        methods=("itlr", "reasoning"), max_tokens={"itlr": 120, "reasoning": 12}, max_term_chars=12,
    )
    dec = run_decompose(cfg, tmp_path / "dec")
    table = pq.read_table(dec.path).to_pylist()
    logical = {r["query_id"]: r["logical_query"] for r in table if r["method"] == "itlr"}
    runs = run_retrieve(
        RetrieveConfig.preset(queries=str(queries), db=str(synthetic / "db"), methods=("itlr-llm", "expansion"),
                              set={"itlr.k": 5, "dense.k": 5, "decomposition.decompositions": str(dec.path), "expansion.decompositions": str(dec.path)}),
        tmp_path / "r",
    )
    assert pq.read_table(runs["itlr-llm"]).num_rows == 32 * 5 and pq.read_table(runs["expansion"]).num_rows == 32 * 5
    # the ITLR run scored the model's terms, not the gold ones in queries.jsonl
    scores = pq.read_table(tmp_path / "r" / "term_scores" / "itlr-llm.parquet").to_pandas()
    for qid, group in scores.groupby("query_id"):
        assert set(group["term"]) == set(parse(logical[qid]).terms())


@pytest.mark.usefixtures("kept_engines")
def test_orlog_reranks_by_exact_posterior_and_conserves_rows(tmp_path, tiny_cfg, synthetic):
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.retrieval.methods.orlog import PREDICATE_SCORES
    from logicrank.schemas.tables import DECOMPOSITIONS

    queries = synthetic / "syn" / "queries.jsonl"
    qids = [json.loads(line)["_id"] for line in queries.read_text().splitlines()][:6]
    write_jsonl(tmp_path / "q.jsonl", [json.loads(line) for line in queries.read_text().splitlines()][:6])
    atoms = [{"id": "a1", "text": "{x} mentions cells"}, {"id": "a2", "text": "{x} is about 'cancer' :- \\+ %"}]
    dec = pa.Table.from_pylist([
        {"query_id": q, "method": "orlog", "model": "hand", "prompt_sha": "-", "raw_output": None, "logical_query": '"a1" AND NOT "a2"',
         "atoms": atoms, "expansion": None, "status": "ok", "error": None, "finish_reason": None, "prompt_tokens": 0,
         "generated_tokens": 0, "cached": False} for q in qids
    ], schema=DECOMPOSITIONS)
    pq.write_table(dec, tmp_path / "dec.parquet")
    k = 5
    cfg = RetrieveConfig.preset(
        queries=str(tmp_path / "q.jsonl"), db=str(synthetic / "db"), methods=("bm25", "orlog", "reasoner"), llm=tiny_cfg, ray=RAY,
        set={"bm25.k": k, "orlog.k": k, "reasoner.k": k, "orlog.context_tokens": 32, "decomposition.decompositions": str(tmp_path / "dec.parquet")},
    )
    runs = run_retrieve(cfg, tmp_path / "r")
    preds = pq.read_table(tmp_path / "r" / "predicate_scores" / "orlog.parquet")
    assert preds.schema == PREDICATE_SCORES and preds.num_rows == 6 * k * 2  # k candidates x 2 atoms per query
    p = preds.to_pandas().pivot_table(index=["query_id", "doc_id"], columns="atom_id", values="p_true")
    run = pq.read_table(runs["orlog"]).to_pandas()
    base = pq.read_table(runs["bm25"]).to_pandas().set_index(["query_id", "doc_id"])["rank"]
    assert len(run) == 6 * k and set(zip(run["query_id"], run["doc_id"], strict=True)) == set(base.index)
    for qid, r in run.groupby("query_id"):
        r = r.sort_values("rank")
        expected = (p.loc[qid, "a1"] * (1 - p.loc[qid, "a2"])).loc[r["doc_id"]].to_numpy()
        np.testing.assert_allclose(r["score"].to_numpy(), expected, atol=1e-9)  # the exact posterior
        assert (np.diff(r["score"].to_numpy()) <= 0).all() and r["score"].between(0, 1).all()
        ties = r[r["score"].duplicated(keep=False)]
        for _, group in ties.groupby("score"):  # ties keep the base order
            assert list(base.loc[[(qid, d) for d in group["doc_id"]]]) == sorted(base.loc[[(qid, d) for d in group["doc_id"]]])
    assert len(pq.read_table(runs["reasoner"])) == 6 * k
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    orlog, reasoner = (manifest["pipelines"][m]["stages"][-1] for m in ("orlog", "reasoner"))
    assert orlog["forward_passes_per_pair"] == 2.0 and reasoner["forward_passes_per_pair"] == 1.0
    assert orlog["pairs"] == 6 * k and orlog["generated_tokens_per_pair"] == 2.0
    # one LLM pool for the job, shared by orlog and the reasoner: one engine, started or taken over from the previous job
    assert manifest["llm"]["pools"] == 1 and manifest["llm"]["actors_started"] + manifest["llm"]["actors_adopted"] == 1
    assert manifest["llm"]["engines_loaded"] == manifest["llm"]["actors_started"]  # (a kept engine ran the previous job's prompts)
    # its threads (torch's count in the engine) cover the cluster's CPUs (cpu_threads unset), though Ray reserved one CPU for it
    assert tiny_cfg.cpu_threads is None and tiny_cfg.cpus_per_actor == 1.0
    assert manifest["llm"]["engine_threads"] == min(RAY.num_cpus, len(os.sched_getaffinity(0)))


@pytest.mark.usefixtures("kept_engines")
def test_reasoner_over_a_dense_base_then_a_retriever_that_needs_the_llm_pools_cpus(tmp_path, tiny_cfg, synthetic):
    """Two engines take both of the cluster's CPUs; the bm25 pipeline after the reasoner needs
    one for its retrieval actor: the LLM pool gives its CPUs back instead of the job hanging."""
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig

    rows = (synthetic / "syn" / "queries.jsonl").read_text().splitlines()[:2]
    write_jsonl(tmp_path / "q.jsonl", [json.loads(r) for r in rows])
    llm = tiny_cfg.model_copy(update={"actors": 2, "cpus_per_actor": 1.0, "batch_rows": 2})
    cfg = RetrieveConfig.preset(queries=str(tmp_path / "q.jsonl"), db=str(synthetic / "db"), methods=("reasoner", "bm25"), llm=llm, ray=RAY,
                                set={"bm25.k": 3, "reasoner.k": 3, "reasoner.context": False})
    runs = run_retrieve(cfg, tmp_path / "r")
    assert pq.read_table(runs["reasoner"]).num_rows == 2 * 3 and pq.read_table(runs["bm25"]).num_rows == 2 * 3
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["llm"]["pools"] == 1 and manifest["llm"]["actors_started"] == 2
    assert manifest["llm"]["engine_threads"] == 1  # two engines on one node of two CPUs: one thread each


def test_a_scoring_pool_too_big_for_the_cluster_fails_fast(tmp_path, tiny_dir, synthetic):
    from typer.testing import CliRunner

    from logicrank.cli import app

    rows = (synthetic / "syn" / "queries.jsonl").read_text().splitlines()[:1]
    write_jsonl(tmp_path / "q.jsonl", [json.loads(r) for r in rows])
    res = CliRunner().invoke(app, [
        "retrieve", str(tmp_path / "q.jsonl"), "--db", str(synthetic / "db"), "--method", "reasoner",
        "--llm-model", str(tiny_dir), "--actors", "3", "--out", str(tmp_path / "r"),
    ])
    assert res.exit_code == 2, res.output
    assert "llm: 3 actor(s) x (1.0 CPU, 0.0 GPU) need 3.0 CPU" in res.output and "Lower --actors" in res.output
    assert not (tmp_path / "r" / "runs" / "reasoner.parquet").exists()


@pytest.mark.usefixtures("kept_engines")
def test_orlog_with_problog_as_the_reasoner_gives_the_compiled_posteriors(tmp_path, tiny_cfg, synthetic):
    """The reference reasoner on the same predicate scores (served from the LLM cache on the second run)."""
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.schemas.tables import DECOMPOSITIONS

    rows = [json.loads(line) for line in (synthetic / "syn" / "queries.jsonl").read_text().splitlines()[:3]]
    write_jsonl(tmp_path / "q.jsonl", rows)
    atoms = [{"id": "a1", "text": "{x} mentions cells"}, {"id": "a2", "text": "{x} is about cancer"}, {"id": "a3", "text": "{x} is a study"}]
    dec = pa.Table.from_pylist([
        {"query_id": r["_id"], "method": "orlog", "model": "hand", "prompt_sha": "-", "raw_output": None,
         "logical_query": '("a1" AND NOT "a2") OR ("a2" AND "a3") OR NOT "a1"', "atoms": atoms, "expansion": None, "status": "ok",
         "error": None, "finish_reason": None, "prompt_tokens": 0, "generated_tokens": 0, "cached": False} for r in rows
    ], schema=DECOMPOSITIONS)
    pq.write_table(dec, tmp_path / "dec.parquet")
    llm = tiny_cfg.model_copy(update={"cache": str(tmp_path / "cache.sqlite")})
    scores = {}
    for reasoner in ("compiled", "problog"):
        cfg = RetrieveConfig.preset(
            queries=str(tmp_path / "q.jsonl"), db=str(synthetic / "db"), methods=("orlog",), llm=llm, ray=RAY,
            set={"bm25.k": 4, "orlog.k": 4, "orlog.context_tokens": 32, "orlog.calibration": "pool-mean", "orlog.reasoner": reasoner,
                 "decomposition.decompositions": str(tmp_path / "dec.parquet")},
        )
        lines: list[str] = []
        run = pq.read_table(run_retrieve(cfg, tmp_path / reasoner, echo=lines.append)["orlog"]).to_pandas()
        scores[reasoner] = run.set_index(["query_id", "doc_id"])["score"].sort_index()
        assert "orlog: 36/36 prompts scored" in lines  # progress, per batch
        assert "orlog: shard 1 of 1 written (1 of 1 done)" in lines  # and per shard written (3 queries: one shard)
    assert len(scores["compiled"]) == 3 * 4 and scores["compiled"].index.equals(scores["problog"].index)
    np.testing.assert_allclose(scores["problog"].to_numpy(), scores["compiled"].to_numpy(), atol=1e-9)
    manifest = json.loads((tmp_path / "problog" / "manifest.json").read_text())
    counts = manifest["pipelines"]["orlog"]["stages"][-1]
    assert counts["llm_cache_hits"] == counts["forward_passes"] == 3 * 4 * 3


@pytest.mark.cluster  # the command starts a Ray cluster of its own
def test_an_llm_job_prints_only_its_own_progress_and_summary(tiny_dir, tmp_path):
    """A real `logicrank decompose` process on the tiny model: before, every engine actor
    printed vLLM's WARNING lines, torch's warnings and a checkpoint-loading bar."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps({"_id": f"q{i}", "text": f"question {i} about cells"}) + "\n" for i in range(4)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "TORCH_", "TQDM_", "LOGICRANK_VERBOSE"))}
    res = subprocess.run(
        [sys.executable, "-m", "logicrank.cli", "decompose", str(queries), "--model", str(tiny_dir), "--method", "reasoning",
         "--cache", "none", "--out", str(tmp_path / "d")],
        capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[2],
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == "", res.stderr
    assert res.stdout.splitlines()[-1].startswith("4 rows {'reasoning'")


@pytest.mark.cluster  # a Ray session of its own
def test_a_prompt_longer_than_the_window_is_named_not_sent(tiny_cfg, tmp_path):
    """A truth prompt over max_model_len stops the call in one line naming it (by key) before
    any prompt reaches the engine; a generation prompt over it gets the error in its slot and
    the others are generated as they would be alone (no batch failure, no one-by-one retries)."""
    from logicrank.jobs.llm_service import LLMService
    from logicrank.jobs.raysession import ray_session
    from logicrank.pipelines.llm.engine import LocalLLM, PromptTooLong
    from logicrank.pipelines.llm.prompts import Template

    cfg = tiny_cfg.model_copy(update={"max_model_len": 128})
    template = Template("probe", "$text")
    values = [{"text": "a short prompt"}, {"text": "word " * 400}, {"text": "another short one"}]
    local = LocalLLM(cfg)
    with pytest.raises(PromptTooLong, match=r"^orlog: the prompt of query q2 is [0-9,]+ tokens, leaving no room to answer in .*window of 128 \(max_model_len\)"):
        local.truth(template, values, label="orlog", keys=["of query q1", "of query q2", "of query q3"])
    assert local.client._engine is None  # refused before the engine was started
    out = local.generate(template, values, max_tokens=4)
    assert isinstance(out[1], PromptTooLong) and "prompt 2 of 3" in str(out[1])
    alone = local.generate(template, [values[0], values[2]], max_tokens=4)
    assert [o.text for o in (out[0], out[2])] == [a.text for a in alone]
    with ray_session(RAY):
        service = LLMService(cfg)
        with pytest.raises(PromptTooLong, match="the prompt 2 of 3 is"):
            service.truth(template, values)
        assert service.actors_started == 0  # nothing was sent
        got = service.generate(template, values, max_tokens=4)
        assert isinstance(got[1], PromptTooLong) and [g.text for g in (got[0], got[2])] == [a.text for a in alone]
        service.close()
