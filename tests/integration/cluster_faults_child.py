"""A three-node Ray cluster on this machine, a logicrank job on it, one worker node killed mid-job.

Run by tests/integration/test_cluster_faults.py in a child process (the integration
conftest starts a local Ray inside pytest; a cluster with several nodes needs its own
process). By hand, from the repository root (a private RAY_TMPDIR, short for Ray's socket
paths: Cluster records its address in <RAY_TMPDIR>/ray/ray_current_cluster, where any plain
``ray.init()`` on this machine would otherwise find and join it):

    RAY_TMPDIR=$(mktemp -d /tmp/lrcXXXX) .venv/bin/python -m tests.integration.cluster_faults_child index /tmp/lrc-index --n 600
    RAY_TMPDIR=$(mktemp -d /tmp/lrcXXXX) .venv/bin/python -m tests.integration.cluster_faults_child score /tmp/lrc-score --n 400

The cluster: a head node (the driver; 1 CPU and no ``worker`` resource, so no job actor
lands there) and two worker nodes, each with 3 CPUs and ``worker: 2`` (room for a second
actor after the other node dies). The job's actors ask for ``worker: 1`` each and Ray Data
spreads them: one per worker node (the index job's light reader task may run on any node).
Once the job is mid-stream (index: four table commits; score: 40 prompts back at the driver)
one worker node is killed (``remove_node(allow_graceful=False)``: SIGKILL to its raylet, object
store and workers; the reader's node if it is still running on a worker), then the job runs
on. If the job raises, the child records the error and what was written (for the
clean-failure checks) and reruns it on the surviving cluster.

Writes WORKDIR/result.json: outcome ("completed" or "failed-then-rerun"), what was seen at
the kill, placements, the job's summary, timings. The index table stays in WORKDIR/db; the
scores in WORKDIR/scores.parquet. The caller checks rows, ids and contents itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OBJECT_STORE = 1 << 28  # per node: memory is tight
WORKER_CPUS = 3  # one actor (1 CPU) + a reader task (0.5), or two actors after the other node dies
SYSTEM_CONFIG = {
    # a dead node noticed in ~4-5 s instead of Ray's default ~15-30 s
    "health_check_period_ms": 1000, "health_check_timeout_ms": 1000, "health_check_failure_threshold": 4,
    # no idle Python workers started ahead of need: 2 cores are shared by three nodes
    "prestart_worker_first_driver": False, "enable_worker_prestart": False,
}


def start_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1, "resources": {"head": 1}, "object_store_memory": OBJECT_STORE, "include_dashboard": False,
            "_system_config": SYSTEM_CONFIG,
        },
    )
    workers = [cluster.add_node(num_cpus=WORKER_CPUS, resources={"worker": 2}, object_store_memory=OBJECT_STORE) for _ in range(2)]
    cluster.wait_for_nodes()
    return cluster, workers


def pool_actors(cluster) -> list[dict]:
    """The pool actors on the cluster, from the GCS: Ray Data's (class _MapWorker) or the LLM service's (_EngineActor)."""
    return [a for a in cluster.global_state.actor_table(None).values() if any(n in a["ActorClassName"] for n in ("MapWorker", "EngineActor"))]


def placement(cluster, workers) -> dict | None:
    """{actor_id: worker index} once the pool's two actors are alive; else None."""
    by_node = {w.node_id: i for i, w in enumerate(workers)}
    alive = [a for a in pool_actors(cluster) if a["State"] == "ALIVE"]
    if len(alive) < 2:
        return None
    return {a["ActorID"]: by_node.get(a["Address"]["NodeID"], -1) for a in alive}


def nodes_running(cluster, workers, needle: str) -> list[str]:
    """Nodes ("head", "0", "1") with a worker process whose title (Ray sets ``ray::<task>``) contains ``needle``."""
    from ray._private import ray_constants

    labels = {"head": cluster.head_node, **{str(i): w for i, w in enumerate(workers)}}
    raylets = {}
    for label, node in labels.items():
        procs = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET) or []
        if procs:
            raylets[procs[0].process.pid] = label
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid in raylets and needle in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.add(raylets[ppid])
        except (OSError, ValueError, IndexError):
            continue
    return sorted(found)


class Killer:
    """Kills one worker node (allow_graceful=False: SIGKILL to its raylet, object store and workers)."""

    def __init__(self, cluster, workers, t0: float):
        self.cluster, self.workers, self.t0 = cluster, workers, t0
        self.info: dict = {}
        self.lock = threading.Lock()

    @property
    def done(self) -> bool:
        return bool(self.info)

    def kill(self, placed: dict, prefer: list[str] = (), **seen) -> None:
        """Kill a worker node hosting a pool actor; of those, one in ``prefer`` if any (e.g. the reader's)."""
        with self.lock:
            if self.info:
                return
            hosts = sorted(set(placed.values()) - {-1})
            victim = next((int(p) for p in prefer if p.isdigit() and int(p) in hosts), hosts[0])
            t = time.perf_counter()
            node_id = self.workers[victim].node_id
            self.cluster.remove_node(self.workers[victim], allow_graceful=False)
            # SIGKILL returns at once; wait until the cluster sees the node dead, so that the job
            # cannot finish on it in the meantime (a fast job once did: nothing was lost, nothing tested)
            _wait_dead(node_id)
            self.info = {
                "victim": victim, "victim_node": node_id, "placement": placed,
                "spread": sorted(placed.values()) == [0, 1], "at_s": round(t - self.t0, 2),
                "kill_s": round(time.perf_counter() - t, 2), **seen,
            }
            print(f"[cluster_faults] killed worker node {victim} at {self.info['at_s']} s: {seen}", file=sys.stderr, flush=True)


def _wait_dead(node_id: str) -> None:
    """Poll the GCS until ``node_id`` is no longer alive. No deadline (tests/integration/children.py):
    a node never seen dead holds the test until pytest's timeout; this child exits once that test is gone."""
    import ray

    parent = os.getppid()
    while any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
        if os.getppid() != parent:
            sys.exit("cluster_faults_child: the test that started this child is gone")
        time.sleep(0.05)


def actors_after(cluster) -> list[dict]:
    return [{"state": a["State"], "restarts": a["NumRestarts"], "node": a["Address"]["NodeID"]} for a in pool_actors(cluster)]


# ---------------------------------------------------------------------------- index


def run_index_case(work: Path, n: int, kill: bool, cluster, workers) -> dict:
    from logicrank.jobs.index import run_index
    from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig, RayConfig
    from logicrank.pipelines.engines.store import DocStore
    from tests.conftest import scifact_docs, write_jsonl

    corpus = write_jsonl(work / "corpus.jsonl", scifact_docs(n, text_chars=200))
    db = work / "db"
    cfg = IndexConfig(
        corpus=str(corpus), db=str(db), write_batch_rows=32,
        embed=EmbedConfig(threads=1),  # one encoder thread per actor (torch or OpenVINO): two actors share the 2 cores
        ray=RayConfig(address=cluster.address, embed_actors=2, embed_num_cpus=1, embed_resources={"worker": 1}, batch_rows=16,
                      block_bytes=1 << 12),  # small blocks: a stream of batches over both actors, not one block
    )
    t0 = time.perf_counter()
    killer = Killer(cluster, workers, t0)
    versions = db / "docs.lance" / "_versions"
    stop = threading.Event()

    def watch():
        # mid-stream: both embed actors up, one per worker, and a few chunks committed (create + 3 upserts)
        while not stop.is_set() and not killer.done:
            if versions.is_dir() and len(list(versions.glob("*.manifest"))) >= 4 and (placed := placement(cluster, workers)):
                reader = nodes_running(cluster, workers, "_ReadSources")  # kill the reader's node too, if it is a worker
                rows = DocStore(str(db)).count()
                killer.kill(placed, prefer=reader, rows_at_kill=rows, reader_nodes=reader)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    if kill:
        watcher.start()
    result: dict = {"job": "index", "n": n}
    try:
        s = run_index(cfg, work / "run")
        result["outcome"] = "completed"
    except Exception as e:  # a clean failure: record it, what was written, then rerun on the survivors
        result["outcome"] = "failed-then-rerun"
        result["error"] = "".join(traceback.format_exception_only(e)).strip()[-2000:]
        t = DocStore(str(db)).table.to_arrow() if DocStore(str(db)).exists() else None
        ids = t.column("doc_id").to_pylist() if t is not None else []
        result["partial"] = {"rows": len(ids), "distinct": len(set(ids))}
        s = run_index(cfg, work / "rerun")
    finally:
        stop.set()
    t_end = time.perf_counter()
    from dataclasses import asdict

    result["summary"] = {k: v for k, v in asdict(s).items() if k not in ("maintenance",)}
    result["kill"] = killer.info
    result["job_s"] = round(t_end - t0, 2)
    if killer.info:
        result["after_kill_s"] = round(t_end - t0 - killer.info["at_s"], 2)
    result["actors_after"] = actors_after(cluster)
    return result


# ---------------------------------------------------------------------------- score


def prompts_table(n: int):
    import pyarrow as pa

    subjects = ["the cell", "vitamin D", "the protein", "a mouse", "the tumour", "insulin", "the study", "bone"]
    return pa.table({
        "prompt_id": [f"p{i:04d}" for i in range(n)],
        "context": [f"Document {i}: {subjects[i % 8]} was measured in trial {i}.\n" for i in range(n)],
        "statement": [f"{subjects[(i * 3) % 8]} is linked to outcome {i % 13}" for i in range(n)],
    })


def run_score_case(work: Path, n: int, kill: bool, cluster, workers, kill_after: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from logicrank.jobs.llm_service import LLMService
    from logicrank.jobs.raysession import ray_session
    from logicrank.pipelines.config.settings import LLMConfig, RayConfig
    from logicrank.pipelines.llm import prompts
    from logicrank.pipelines.llm.engine import truth_table
    from tests.tiny_llm import build_tiny_llm

    model = work / "tiny-llama"
    if not (model / "config.json").exists():
        build_tiny_llm(model)
    llm = LLMConfig(model=str(model), max_model_len=1024, cache=None, max_num_seqs=64, actors=2, cpus_per_actor=1, resources={"worker": 1}, batch_rows=4)
    table = prompts_table(n)
    ray_cfg = RayConfig(address=cluster.address)
    t0 = time.perf_counter()
    killer = Killer(cluster, workers, t0)
    progress: list[tuple[float, int]] = []

    def echo(line: str) -> None:
        # called on the driver between batches: the kill lands while the rest are pending
        done = int(line.split(": ")[-1].split("/")[0])
        progress.append((round(time.perf_counter() - t0, 2), done))
        if kill and not killer.done and done >= kill_after and (placed := placement(cluster, workers)):
            killer.kill(placed, done_at_kill=done)

    def score() -> pa.Table:
        """The job's LLM service, as OrLog's scoring uses it, keeping its counts."""
        values = [{"context": c, "statement": s} for c, s in zip(table.column("context").to_pylist(), table.column("statement").to_pylist(), strict=True)]
        with ray_session(ray_cfg):
            service = LLMService(llm, echo=echo)
            try:
                res = service.truth(prompts.load("truth"), values, label="score")
            finally:
                result["pool"] = service.close()
        return truth_table(table.column("prompt_id"), res)

    result: dict = {"job": "score", "n": n}
    try:
        out = score()
        result["outcome"] = "completed"
    except Exception as e:
        result["outcome"] = "failed-then-rerun"
        result["error"] = "".join(traceback.format_exception_only(e)).strip()[-2000:]
        out = score()
    t_end = time.perf_counter()
    pq.write_table(out, work / "scores.parquet")
    result["kill"] = killer.info
    result["job_s"] = round(t_end - t0, 2)
    if killer.info:
        result["after_kill_s"] = round(t_end - t0 - killer.info["at_s"], 2)
    result["first_batch_s"] = progress[0][0] if progress else None
    result["batches"] = len(progress)
    result["actors_after"] = actors_after(cluster)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("job", choices=["index", "score"])
    ap.add_argument("work", type=Path)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--kill-after", type=int, default=40, help="score: prompts scored before the kill")
    ap.add_argument("--no-kill", action="store_true")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    t0 = time.perf_counter()
    # the cluster first: its processes start before lance is imported (lance is not fork-safe)
    cluster, workers = start_cluster()
    cluster_s = round(time.perf_counter() - t0, 2)
    try:
        if args.job == "index":
            result = run_index_case(args.work, args.n or 600, not args.no_kill, cluster, workers)
        else:
            result = run_score_case(args.work, args.n or 400, not args.no_kill, cluster, workers, args.kill_after)
        result["cluster_start_s"] = cluster_s
        result["total_s"] = round(time.perf_counter() - t0, 2)
        (args.work / "result.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result), flush=True)
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
