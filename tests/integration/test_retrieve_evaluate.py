"""index -> retrieve (dense, bm25, hybrid) -> evaluate, through the CLI and the jobs."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.jobs.evaluate import run_evaluate
from logicrank.jobs.retrieve import run_retrieve
from logicrank.pipelines.config.retrieval import RetrieveConfig
from logicrank.pipelines.config.settings import EvaluateConfig
from logicrank.schemas.tables import RUN
from tests.compare import assert_runs_close
from tests.conftest import write_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]  # jobs join the session's cluster (conftest.py)
runner = CliRunner()


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, docs300):
    """A 300-document index built through the CLI, with 40 title queries and their qrels."""
    root = tmp_path_factory.mktemp("e2e")
    corpus = write_jsonl(root / "corpus.jsonl", docs300)
    res = runner.invoke(app, ["index", str(corpus), "--db", str(root / "db"), "--out", str(root / "index"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "inserted 300" in res.output
    # the same snapshot, but one document's row in it cannot be read (neither title nor text): that document is kept as stored
    again = write_jsonl(root / "again.jsonl", [{"_id": docs300[0]["_id"], "title": "", "text": ""}, *docs300[1:]])
    again = runner.invoke(app, ["index", str(again), "--db", str(root / "db"), "--out", str(root / "index2"), "--no-progress"])
    said = " ".join(again.output.split())
    assert again.exit_code == 0 and "unchanged 299, deleted 0, rejected 1" in said and "(nothing changed)" in said, again.output
    assert f"index: 1 stored document kept as it was: its row in this snapshot was rejected (see {root / 'index2' / 'rejects.parquet'})" in said
    picked = docs300[::7][:40]
    write_jsonl(root / "queries.jsonl", [{"_id": f"q{i}", "text": d["title"]} for i, d in enumerate(picked)])
    (root / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\t{d['_id']}\t1\n" for i, d in enumerate(picked)))
    return root


def test_retrieve_and_evaluate_all_methods(indexed, tmp_path):
    cfg = RetrieveConfig.preset(queries=str(indexed / "queries.jsonl"), db=str(indexed / "db"), methods=("dense", "bm25", "hybrid"),
                                set={"dense.k": 20, "bm25.k": 20, "rrf.k": 20}, trec=True)
    runs = run_retrieve(cfg, tmp_path / "retrieve")
    assert set(runs) == {"dense", "bm25", "hybrid"}
    for rid, path in runs.items():
        run = pq.read_table(path)
        assert run.schema == RUN and set(run.column("run_id").to_pylist()) == {rid}
        per_query = run.group_by("query_id").aggregate([("doc_id", "count")]).column("doc_id_count").to_pylist()
        assert len(per_query) == 40 and max(per_query) == 20
        if rid == "dense":  # exact cosine ranks every document; BM25 only those sharing a term
            assert min(per_query) == 20
        assert (tmp_path / "retrieve" / "runs" / f"{rid}.trec").exists()

    # rerun with unchanged config, queries and table version: skipped, files untouched
    mtime = runs["dense"].stat().st_mtime_ns
    run_retrieve(cfg, tmp_path / "retrieve")
    assert runs["dense"].stat().st_mtime_ns == mtime

    metrics = run_evaluate(
        EvaluateConfig(qrels=str(indexed / "qrels.tsv"), runs=tuple(str(p) for p in runs.values()), measures=("P@1", "nDCG@10")),
        tmp_path / "eval",
    ).to_pandas()
    agg = metrics[metrics["query_id"] == "all"].set_index(["run_id", "measure"])["value"]
    # a title finds its own abstract: every method must rank it first almost always
    for rid in runs:
        assert agg[rid, "P@1"] >= 0.9, (rid, agg[rid, "P@1"])
    report = (tmp_path / "eval" / "report.md").read_text()
    assert re.search(r"^\| dense +\|", report, re.M) and "## Significance" in report and "plots/per_query.png" in report
    assert (tmp_path / "eval" / "plots" / "per_query.png").stat().st_size > 5000
    manifest = json.loads((tmp_path / "eval" / "manifest.json").read_text())
    assert manifest["measures"] == ["P@1", "nDCG@10"] and manifest["status"] == "ok"


def test_cli_errors_are_one_clear_line(indexed, tmp_path):
    res = runner.invoke(app, ["evaluate", str(indexed / "qrels.tsv"), "x.parquet", "--measure", "nDCG@1O"])
    assert res.exit_code == 2 and "unknown measure 'nDCG@1O'" in res.output and "Traceback" not in res.output

    res = runner.invoke(app, ["index", str(tmp_path / "nope"), "--db", str(tmp_path / "db"), "--no-progress"])
    assert res.exit_code == 2 and "nothing at" in res.output

    res = runner.invoke(app, ["retrieve", str(indexed / "queries.jsonl"), "--db", str(tmp_path / "empty"), "--method", "bm25"])
    assert res.exit_code == 2 and "run `logicrank index` first" in res.output
    assert not (tmp_path / "empty").exists()  # a mistyped --db is named, never created

    res = runner.invoke(app, ["retrieve", str(indexed / "queries.jsonl"), "--db", str(indexed / "db"), "--model", "no-such-model"])
    assert res.exit_code == 2 and "unknown model 'no-such-model'" in res.output and "all-MiniLM-L6-v2" in res.output


def test_an_actor_pool_too_big_for_the_cluster_fails_fast(indexed, tmp_path):
    res = runner.invoke(
        app, ["index", str(indexed / "corpus.jsonl"), "--db", str(indexed / "db"), "--actors", "2", "--no-progress", "--out", str(tmp_path)]
    )
    assert res.exit_code == 2 and "Lower --actors" in res.output


def test_hybrid_fuses_deep_enough_for_k(indexed, tmp_path):
    # the hybrid preset at k 250: both fused lists 250 deep, so the fused run holds 250 per query
    cfg = RetrieveConfig.preset(queries=str(indexed / "queries.jsonl"), db=str(indexed / "db"), methods=("hybrid",), set={"rrf.k": 250, "dense.k": 250, "bm25.k": 250})
    run = pq.read_table(run_retrieve(cfg, tmp_path / "r")["hybrid"])
    per_query = run.group_by("query_id").aggregate([("doc_id", "count")]).column("doc_id_count").to_pylist()
    assert len(per_query) == 40 and set(per_query) == {250}
    fused = json.loads((tmp_path / "r" / "manifest.json").read_text())["config"]["pipelines"]["hybrid"][0]
    assert fused["stage"] == "rrf" and [sub[0]["k"] for sub in fused["of"]] == [250, 250]


def test_k_sets_the_depth_of_every_run_retrieve_writes_and_evaluate_states_it(indexed, tmp_path):
    res = runner.invoke(app, ["retrieve", str(indexed / "queries.jsonl"), "--db", str(indexed / "db"), "--method", "dense", "--method", "hybrid",
                              "--k", "5", "--out", str(tmp_path / "r"), "--no-progress"])
    assert res.exit_code == 0, res.output
    for rid in ("dense", "hybrid"):
        per_query = pq.read_table(tmp_path / "r" / "runs" / f"{rid}.parquet").group_by("query_id").aggregate(
            [("doc_id", "count")]).column("doc_id_count").to_pylist()
        assert len(per_query) == 40 and set(per_query) == {5}, (rid, per_query)
    fused = json.loads((tmp_path / "r" / "manifest.json").read_text())["config"]["pipelines"]["hybrid"][0]
    assert fused["k"] == 5 and [sub[0]["k"] for sub in fused["of"]] == [5, 5]  # the fused lists as deep as the fused run
    runs = [str(tmp_path / "r" / "runs" / f"{rid}.parquet") for rid in ("dense", "hybrid")]
    res = runner.invoke(app, ["evaluate", str(indexed / "qrels.tsv"), *runs, "--measure", "MAP", "--out", str(tmp_path / "e")])
    assert res.exit_code == 0, res.output
    report = (tmp_path / "e" / "report.md").read_text()
    assert re.search(r"^\| dense +\| +5 \| ", report, re.M) and re.search(r"^\| hybrid +\| +5 \| ", report, re.M), report


def test_blank_queries_get_no_results_from_any_method_and_are_counted(indexed, tmp_path):
    # before: dense ranked 100 documents for the empty string, bm25 none, silently
    queries = write_jsonl(tmp_path / "q.jsonl", [{"_id": "ok", "text": "protein folding"}, {"_id": "blank", "text": "  "}])
    lines: list[str] = []
    cfg = RetrieveConfig.preset(queries=str(queries), db=str(indexed / "db"), methods=("dense", "bm25", "hybrid"), set={"dense.k": 10, "bm25.k": 10, "rrf.k": 10})
    for path in run_retrieve(cfg, tmp_path / "r", echo=lines.append).values():
        assert set(pq.read_table(path).column("query_id").to_pylist()) == {"ok"}
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert (manifest["queries"], manifest["blank_queries"], manifest["blank_query_ids"]) == (2, 1, ["blank"])
    assert any("1 query has a blank text" in line for line in lines)
    # a rerun that is skipped says so
    run_retrieve(cfg, tmp_path / "r", echo=lines.append)
    assert "skipped" in lines[-1]


def test_user_errors_are_one_line_and_bugs_keep_their_traceback(indexed, tmp_path, monkeypatch):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cases = [
        (["retrieve", str(empty), "--db", str(indexed / "db")], "no queries (the file is empty)"),
        (["retrieve", str(indexed / "queries.jsonl"), "--method", "splade"], "unknown method 'splade'; presets: bm25, dense, expansion, hybrid"),
        (["retrieve", str(indexed / "queries.jsonl"), "--set", "dense.k=0"], "--set dense.k=0: must be greater than or equal to 1"),
        (["retrieve", str(indexed / "queries.jsonl"), "--set", "dense.kk=5"], "--set dense.kk: stage 'dense' has no option 'kk'; its options: k,"),
        (["evaluate", str(indexed / "qrels.tsv"), "x.parquet", "--test", "wilcoxon"], "--test 'wilcoxon': must be 't-test' or 'randomisation'"),
        (["index", str(indexed / "corpus.jsonl"), "--actors", "0"], "--actors 0: must be greater than or equal to 1"),
        (["evaluate", str(tmp_path / "missing.tsv"), "x.parquet"], "no qrels file at"),
    ]
    for args, expected in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert expected in res.output and "Traceback" not in res.output, (args, res.output)
        assert len(res.output.strip().splitlines()) == 1, res.output  # one line, not a pydantic dump

    # an internal bug is not dressed up as a user error: its exception (and traceback) reaches the user
    import logicrank.jobs.retrieve

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(logicrank.jobs.retrieve, "run_retrieve", broken)
    res = runner.invoke(app, ["retrieve", str(indexed / "queries.jsonl"), "--db", str(indexed / "db")])
    assert res.exit_code == 1 and isinstance(res.exception, ValueError)


def test_default_output_is_the_jobs_own(tmp_path, docs300):
    """A real `logicrank index` process: no Ray/vLLM log lines unless --verbose (a disk Ray
    calls full: tests/integration/test_quiet_logs.py)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    corpus = write_jsonl(tmp_path / "c.jsonl", docs300[:20])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "LOGICRANK_VERBOSE"))}
    cli = [sys.executable, "-m", "logicrank.cli"]
    cwd = Path(__file__).resolve().parents[2]
    for name, placement in [("driver", []), ("pool", ["--actors", "1"])]:  # the default here, and the Ray Data pool
        quiet = subprocess.run([*cli, "index", str(corpus), "--db", str(tmp_path / f"db-{name}"), "--out", str(tmp_path / name), "--no-progress",
                                *placement], capture_output=True, text=True, env=env, cwd=cwd)
        assert quiet.returncode == 0, quiet.stderr
        assert quiet.stderr.strip() == "", quiet.stderr  # before: core_worker.cc, "Progress bars disabled", "Dataset ... finished"
        assert quiet.stdout.count("\n") == 1 and quiet.stdout.startswith("inserted 20")
    loud = subprocess.run([*cli, "--verbose", "index", str(corpus), "--db", str(tmp_path / "db2"), "--out", str(tmp_path / "j"), "--no-progress",
                           "--actors", "1"], capture_output=True, text=True, env=env, cwd=cwd)
    assert loud.returncode == 0 and "Started a local Ray instance" in loud.stderr and "execution finished" in loud.stderr + loud.stdout


def test_evaluate_tells_the_terminal_about_missing_queries_and_skips(indexed, tmp_path):
    run = pq.read_table(run_retrieve(RetrieveConfig.preset(queries=str(indexed / "queries.jsonl"), db=str(indexed / "db"), set={"dense.k": 10}),
                                     tmp_path / "r")["dense"])
    partial = tmp_path / "partial.parquet"
    pq.write_table(run.filter(pa.compute.not_equal(run.column("query_id"), "q0")), partial)
    args = ["evaluate", str(indexed / "qrels.tsv"), str(partial), "--out", str(tmp_path / "e")]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "has no results for 1 of 40 qrels queries" in res.output
    res = runner.invoke(app, args)
    assert "skipped" in res.output and "has no results for 1 of 40" in res.output


def test_a_rerun_is_not_skipped_when_the_query_encoder_would_run_otherwise(indexed, tmp_path, monkeypatch):
    """The skip check keyed the encoder by its model's name, the stage keys by how it runs
    (backend auto: OpenVINO where installed, else torch, whose vectors differ in their last
    bits): openvino removed, the rerun kept the runs of the other backend's vectors."""
    from logicrank.jobs import retrieve

    cfg = RetrieveConfig.preset(queries=str(indexed / "queries.jsonl"), db=str(indexed / "db"), set={"dense.k": 10})
    said = []
    run_retrieve(cfg, tmp_path / "r", echo=said.append)
    run_retrieve(cfg, tmp_path / "r", echo=said.append)
    assert sum("skipped" in line for line in said) == 1, said
    real = retrieve.encoder_digest
    monkeypatch.setattr(retrieve, "encoder_digest", lambda config: real(config.model_copy(update={"backend": "torch"}))
                        if config.backend == "auto" else real(config))
    said.clear()
    run_retrieve(cfg, tmp_path / "r", echo=said.append)
    assert not any("skipped" in line for line in said), said


def test_a_rerun_is_fresh_only_with_the_queries_it_read_and_its_trec_files(indexed, tmp_path, monkeypatch):
    """A queries file replaced while a retrieve starts (read, then fingerprinted after the
    table and the LLM are prepared): the manifest recorded the new file beside runs of the old
    queries, and a rerun on the new file was skipped as fresh. What was read is recorded too.
    And `--trec` files removed since: the rerun was skipped and left them missing."""
    import logicrank.jobs.retrieve as job

    new = tmp_path / "queries.jsonl"
    new.write_text("".join(line + "\n" for line in (indexed / "queries.jsonl").read_text().splitlines()[:10]))
    cfg = RetrieveConfig.preset(queries=str(new), db=str(indexed / "db"), methods=("bm25",), set={"bm25.k": 5}, trec=True)
    read = job.read_queries
    with monkeypatch.context() as m:  # read before the file was replaced: the 40 queries it held then
        m.setattr(job, "read_queries", lambda path, field=None: read(str(indexed / "queries.jsonl"), field))
        first = run_retrieve(cfg, tmp_path / "r")["bm25"]
    assert len(set(pq.read_table(first).column("query_id").to_pylist())) == 40
    again = run_retrieve(cfg, tmp_path / "r")["bm25"]  # the file as it is: run, not skipped
    assert len(set(pq.read_table(again).column("query_id").to_pylist())) == 10
    (tmp_path / "r" / "runs" / "bm25.trec").unlink()
    run_retrieve(cfg, tmp_path / "r")
    assert (tmp_path / "r" / "runs" / "bm25.trec").is_file()


def test_pipelines_share_prefixes_and_a_rerun_reuses_unchanged_stages(indexed, tmp_path):
    """A pipelines file through the CLI: dense and bm25 are computed once for three pipelines;
    a rerun that changes only the fusion reruns only the fusion."""
    from logicrank.pipelines.config.settings import RayConfig

    spec = {"dense": ["dense"], "bm25": ["bm25"], "hybrid": [{"rrf": {"k": 20, "of": [["dense"], ["bm25"]]}}]}
    f = tmp_path / "p.yaml"
    f.write_text(json.dumps(spec))  # JSON is YAML
    args = ["retrieve", str(indexed / "queries.jsonl"), "--db", str(indexed / "db"), "--pipelines", str(f), "--out", str(tmp_path / "r")]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    fused = manifest["pipelines"]["hybrid"]["stages"]
    assert [s["sub"][0]["cached"] for s in fused[:2]] == [True, True] and fused[2]["cached"] is False
    assert [s["stages"][0]["cached"] for s in (manifest["pipelines"]["dense"], manifest["pipelines"]["bm25"])] == [False, False]
    assert manifest["llm"] is None  # no stage needed the LLM: no pool started
    # 40 queries by default: timed on a probe, small enough to finish in the driver (no pool started)
    assert [manifest["pipelines"][r]["stages"][0]["placement"] for r in ("dense", "bm25")] == ["driver", "driver"]

    spec["hybrid"][0]["rrf"]["rrf_k"] = 10
    f.write_text(json.dumps(spec))
    assert runner.invoke(app, args).exit_code == 0
    again = json.loads((tmp_path / "r" / "manifest.json").read_text())["pipelines"]
    assert again["dense"]["stages"][0]["cached"] and again["bm25"]["stages"][0]["cached"] and not again["hybrid"]["stages"][2]["cached"]
    assert pq.read_table(tmp_path / "r" / "runs" / "dense.parquet").num_rows == 40 * 100

    # the same pipelines on a pool of two retrieval actors: the same runs
    cfg = RetrieveConfig(queries=str(indexed / "queries.jsonl"), db=str(indexed / "db"), pipelines={"dense": ["dense"], "bm25": ["bm25"]},
                         ray=RayConfig(num_cpus=2, retrieve_actors=2, retrieve_batch_rows=7))
    runs = run_retrieve(cfg, tmp_path / "two")
    for rid in ("dense", "bm25"):
        a, b = pq.read_table(runs[rid]), pq.read_table(tmp_path / "r" / "runs" / f"{rid}.parquet")
        assert_runs_close(a, b, f"{rid}: two actors, batches of 7 vs the driver")  # same documents, ranks and order; scores to 1e-5
    placed = json.loads((tmp_path / "two" / "manifest.json").read_text())["pipelines"]
    assert placed["bm25"]["stages"][0]["placement"] == "pool of 2"

    # no pool size given and a job too big for the driver (by its probe): a pool sized to the cluster takes the rest
    cfg = cfg.model_copy(update={"ray": RayConfig(num_cpus=2, retrieve_batch_rows=8, retrieve_local_s=1e-9)})
    runs = run_retrieve(cfg, tmp_path / "auto")
    placed = json.loads((tmp_path / "auto" / "manifest.json").read_text())["pipelines"]
    assert placed["bm25"]["stages"][0]["placement"] == "pool of 2 after 3 in the driver"
    # ... but not for an encoder on one CPU node: the driver's encoder already uses every core
    import torch

    on_gpu = torch.cuda.device_count() > 0  # Ray counts the same GPUs
    want = "pool of 2 after 3 in the driver" if on_gpu else "driver (one CPU node: its encoder uses every core)"
    assert placed["dense"]["stages"][0]["placement"] == want
    for rid in ("dense", "bm25"):
        assert_runs_close(pq.read_table(runs[rid]), pq.read_table(tmp_path / "r" / "runs" / f"{rid}.parquet"), f"{rid}: probe + pool vs the driver")


def test_a_reused_out_holds_only_this_runs_outputs(indexed, tmp_path):
    """Before: a second retrieve into the same --out left the first one's dense run beside the
    new ones, and `evaluate runs/*.parquet` scored it too. Now it is moved aside, said in one
    line; the rerun still reuses the stage cache."""
    import glob

    out = tmp_path / "r"
    q, db = str(indexed / "queries.jsonl"), str(indexed / "db")
    first = runner.invoke(app, ["retrieve", q, "--db", db, "--method", "dense", "--method", "bm25", "--set", "dense.k=10", "--set", "bm25.k=10", "--trec", "--out", str(out)])
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, ["retrieve", q, "--db", db, "--method", "bm25", "--set", "bm25.k=10", "--out", str(out)])
    assert second.exit_code == 0, second.output
    (aside,) = (out / "previous").iterdir()
    line = next(x for x in second.output.splitlines() if "earlier output" in x)
    assert line == (f"retrieve: moved 3 earlier output(s) of {out} that this run does not make to {aside}: "
                    "runs/bm25.trec, runs/dense.parquet, runs/dense.trec")
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["bm25.parquet"]
    assert sorted(p.name for p in (aside / "runs").iterdir()) == ["bm25.trec", "dense.parquet", "dense.trec"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["set_aside"]["files"] == ["runs/bm25.trec", "runs/dense.parquet", "runs/dense.trec"]
    assert [s["cached"] for s in manifest["pipelines"]["bm25"]["stages"]] == [True]  # the prefix cache is kept
    ev = runner.invoke(app, ["evaluate", str(indexed / "qrels.tsv"), *sorted(glob.glob(str(out / "runs" / "*.parquet"))),
                             "--out", str(tmp_path / "ev")])
    assert ev.exit_code == 0 and "bm25" in ev.output and "dense" not in ev.output, ev.output
    # the same command again: skipped, nothing moved
    third = runner.invoke(app, ["retrieve", q, "--db", db, "--method", "bm25", "--set", "bm25.k=10", "--out", str(out)])
    assert third.exit_code == 0 and "skipped" in third.output and "earlier output" not in third.output, third.output
    # a run file this run reads is never moved, even in its own runs/: a pipeline that reranks the bm25 run in place
    pipelines = tmp_path / "p.yaml"
    pipelines.write_text(f"again:\n  - stage: run_file\n    path: {out / 'runs' / 'bm25.parquet'}\n")
    reads = runner.invoke(app, ["retrieve", q, "--db", db, "--pipelines", str(pipelines), "--out", str(out)])
    assert reads.exit_code == 0, reads.output
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["again.parquet", "bm25.parquet"]
    # files no retrieve run wrote (no manifest): refused in one line, left where they are
    mine = tmp_path / "mine"
    (mine / "runs").mkdir(parents=True)
    (mine / "runs" / "x.parquet").write_bytes((out / "runs" / "bm25.parquet").read_bytes())
    refused = runner.invoke(app, ["retrieve", q, "--db", db, "--method", "bm25", "--out", str(mine)])
    assert refused.exit_code == 2 and refused.stderr.strip() == (
        f"error: retrieve: --out {mine} holds files that no retrieve run wrote there (runs/x.parquet; no manifest.json); they would "
        "be read as this run's outputs: choose another --out, or move them."), refused.output
    assert (mine / "runs" / "x.parquet").is_file() and not (mine / "previous").exists()


def _pipe(data: bytes) -> int:
    """A pipe's read end holding ``data`` (under the 64 KB a pipe holds), its write end closed."""
    import os

    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    return r


def test_pipes_are_read_once_and_never_taken_for_an_unchanged_input(indexed, tmp_path):
    """`retrieve <(zcat queries.jsonl.gz)` and `evaluate <(zcat qrels.gz) <(cat run.trec)`: a
    pipe is read by the job alone, once. Fingerprinting it for the rerun check read it first,
    so evaluate was left no judgements, and retrieve (whose queries are read before) found
    every pipe "unchanged" (the digest of nothing), and a rerun with other queries kept the
    last run's runs."""
    import os

    lines = (indexed / "queries.jsonl").read_bytes().splitlines(keepends=True)
    out, got = tmp_path / "r", []
    for part in (lines[:5], lines[5:12]):
        fd = _pipe(b"".join(part))
        try:
            res = runner.invoke(app, ["retrieve", f"/dev/fd/{fd}", "--db", str(indexed / "db"), "--method", "bm25", "--out", str(out), "--trec"])
        finally:
            os.close(fd)
        assert res.exit_code == 0 and "skipped" not in res.output, res.output
        got.append(sorted(set(pq.read_table(out / "runs" / "bm25.parquet").column("query_id").to_pylist())))
    assert got == [sorted(f"q{i}" for i in range(5)), sorted(f"q{i}" for i in range(5, 12))]

    run, qrels = (out / "runs" / "bm25.trec").read_bytes(), (indexed / "qrels.tsv").read_bytes()
    by_pipe = []
    head, *judgements = qrels.splitlines(keepends=True)
    for judged in (qrels, b"".join([head, *judgements[5:9]])):  # every query's judgement, then q5-q8's alone (the run's q5-q11)
        fds = _pipe(judged), _pipe(run)
        try:
            res = runner.invoke(app, ["evaluate", *(f"/dev/fd/{fd}" for fd in fds), "--measure", "P@1", "--out", str(tmp_path / "e")])
        finally:
            for fd in fds:
                os.close(fd)
        assert res.exit_code == 0 and "skipped" not in res.output, res.output
        by_pipe.append(pq.read_table(tmp_path / "e" / "metrics.parquet").to_pylist())
    (tmp_path / "qrels.tsv").write_bytes(qrels)
    (tmp_path / "run.trec").write_bytes(run)
    from_files = run_evaluate(EvaluateConfig(qrels=str(tmp_path / "qrels.tsv"), runs=(str(tmp_path / "run.trec"),), measures=("P@1",)), tmp_path / "f")
    assert by_pipe[0] == from_files.to_pylist() and by_pipe[1] != by_pipe[0]
