"""Sharded search on a cluster of four nodes on this machine (tests/integration/test_shards.py).

Run as ``python -m tests.integration.shards_child WORK``. Starts a head node (the driver, no
CPUs for actors) and three worker nodes with ``ray.cluster_utils.Cluster``, writes a table of
SciFact documents with generated unit vectors (the bundled encoder's model id and width, so
`retrieve` encodes the queries with the real encoder), builds its BM25 index in segments with
tasks on the worker nodes (and once in one scan, to compare: ``bm25_build``), and runs `logicrank retrieve`'s job with
bm25, dense and ITLR exact three times on the one cluster: in 3 shards (one search actor per
worker node), unsharded (the driver's search over the whole index), and in 3 shards again with
one worker node killed (SIGKILL to its raylet) as soon as the first batch has been merged from
the shards (last: the cluster has lost a node after it); then builds the BM25 index once more
in segments, killing the node of the first segment to be weighed while its task runs
(``bm25_killed_build``). Writes ``WORK/result.json``: the runs' paths (``runs``: ``"3"``,
``"1"``, ``"3-killed"``), each stage's counts from the manifests, whether a node was killed and
how many batches were merged before; an error of the killed run or build is recorded
(``kill_error``, ``bm25_killed_build["error"]``), not raised, so the equality tests still read
the others.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np
import pyarrow as pa

from tests.integration.cluster_faults_child import OBJECT_STORE, SYSTEM_CONFIG

N_DOCS, N_QUERIES, BATCH = 900, 120, 20


def _table(db: Path) -> None:
    from logicrank.pipelines.config.settings import EmbedConfig
    from logicrank.pipelines.engines.embed import model_id, to_fixed_size_list
    from logicrank.pipelines.engines.store import DocStore
    from tests.conftest import scifact_docs

    docs = scifact_docs(N_DOCS, text_chars=300)
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(len(docs), 384)).astype(np.float32)
    vectors[[10, 500, 880]] = vectors[3]  # one vector four times, across shards: a tie the merge must order by doc id
    store = DocStore(str(db))
    store.open_or_create(384, model_id(EmbedConfig()))
    store.upsert(pa.table({"doc_id": [d["_id"] for d in docs], "title": [d.get("title") for d in docs], "text": [d["text"] for d in docs],
                           "metadata": [None] * len(docs), "content_hash": [f"h{i}" for i in range(len(docs))],
                           "vector": to_fixed_size_list(vectors)}))
    store.build_indexes(ann_threshold=10**9)
    store.mark_complete()


def _queries(path: Path) -> None:
    from tests.conftest import scifact_docs

    docs = scifact_docs(N_QUERIES, text_chars=120)
    words = [w for d in docs for w in d["text"].split() if w.isalpha() and len(w) > 5][:3 * N_QUERIES]
    shapes = ('"{0}" AND "{1}" AND NOT "{2}"', '"{0}" OR "{1}" AND "{2}"', '("{0}" OR "{1}") AND NOT "{2}"')
    path.write_text("".join(json.dumps({"_id": f"q{i}", "text": d["text"][:80], "logical_query": shapes[i % 3].format(*words[3 * i : 3 * i + 3])})
                            + "\n" for i, d in enumerate(docs)))


def _bm25_on_cluster(work: Path, address: str) -> dict:
    """The table's BM25 index built in segments by tasks on the worker nodes (the index job's
    ``--bm25-workers``), saved where `retrieve` then maps it from; and a build in one scan in this
    process beside it. Returns what the build did, the nodes its tasks ran on and the arrays
    whose files differ between the two (none, for the test to pass)."""
    from logicrank.jobs.raysession import RayTasks, ray_session
    from logicrank.pipelines.config.settings import RayConfig
    from logicrank.pipelines.engines import bm25
    from logicrank.pipelines.engines.store import DocStore

    store = DocStore(str(work / "db"))
    with ray_session(RayConfig(address=address)) as ray:
        tasks = RayTasks(ray, at_once=3)
        done = bm25.update_index(store, run=tasks)
    whole = work / "one-process"
    bm25.BM25Index.build(store.scan(bm25.SOURCE_COLUMNS), store.version, stamp=store.version_stamp()).save(whole)
    return {"done": done, "nodes": len(tasks.nodes), "differ": _differ(whole, bm25.index_root(store) / f"v{store.version}")}


def _differ(whole: Path, saved: Path) -> list[str]:
    """The files whose arrays differ between two saved BM25 indexes."""
    from logicrank.pipelines.engines import bm25

    differ = [str(f.relative_to(whole)) for f in sorted(whole.rglob("*.npy")) if not np.array_equal(np.load(f), np.load(saved / f.relative_to(whole)))]
    a, b = (bm25.BM25Index.load(d) for d in (whole, saved))
    differ += [f"{field}.npz" for field in ("title", "text") if (getattr(a, field) != getattr(b, field)).nnz]
    differ += [what for what, x, y in (("vocab.parquet", a.vocab.terms, b.vocab.terms), ("docs.parquet", a.doc_ids.tolist(), b.doc_ids.tolist()),
                                       ("hashes", a.hashes.tolist(), b.hashes.tolist())) if x != y]
    return differ


def _held(marker: str, step, *args):
    """A step's task (a function of this module: sent to the workers by value) that, the first of
    all to run, writes its arguments' second (a segment's number), its node's id and its process
    id to ``marker`` and waits for the file ``go`` beside it (its node is killed meanwhile, so it
    never returns there); every other task, and that one's rerun on another node, runs the step.
    Each task that returns appends its segment and node to ``done`` beside it."""
    import os
    import time

    import ray

    node = ray.get_runtime_context().get_node_id()
    claim = Path(marker).with_suffix(".claim")
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        pass
    else:
        Path(f"{marker}.tmp").write_text(f"{args[1]} {node} {os.getpid()}")
        os.replace(f"{marker}.tmp", marker)
        while not (Path(marker).parent / "go").exists():
            time.sleep(0.05)
    out = step(*args)
    with open(Path(marker).parent / "done", "a") as f:
        f.write(f"{args[1]} {node}\n")
    return out


def _bm25_build_with_a_node_killed(work: Path, cluster, workers: list) -> dict:
    """The table's BM25 index built again in segments by tasks on the worker nodes, into a
    directory of its own, the node of the first segment to be weighed killed (SIGKILL to its
    raylet) while its task runs: Ray runs that task again on a node left. Returns what the build
    did, the node killed, whether the index existed when it was killed, and the arrays whose
    files differ from the build in one scan (:func:`_bm25_on_cluster`'s)."""
    import contextlib
    import os
    import signal
    import threading
    import time

    from logicrank.jobs.raysession import RayTasks, ray_session
    from logicrank.pipelines.config.settings import RayConfig
    from logicrank.pipelines.engines.bm25 import segments
    from logicrank.pipelines.engines.store import DocStore

    store = DocStore(str(work / "db"))
    marker = work / "held" / "node"
    marker.parent.mkdir()
    out = work / "killed-build" / f"v{store.version}"
    killed: dict = {}

    def kill_the_held_node():
        while not marker.exists():  # the held task has started
            time.sleep(0.05)
        try:
            segment, node, pid = marker.read_text().split()
            killed["segment"] = int(segment)
            killed["saved_before"] = out.exists()
            cluster.remove_node(next(w for w in workers if w.node_id == node), allow_graceful=False)  # no rerun lands there
            with contextlib.suppress(ProcessLookupError):  # the node's processes die with it (a worker outlives its raylet's SIGKILL a while)
                os.kill(int(pid), signal.SIGKILL)
            killed["node"] = node
        finally:
            (marker.parent / "go").write_text("")  # never a task waiting for ever

    with ray_session(RayConfig(address=cluster.address)) as ray:
        tasks, weighing = RayTasks(ray, at_once=3), RayTasks(ray, at_once=3)

        def run(step, args):
            if step is segments.weigh_segment:
                return weighing(_held, [(str(marker), step, *a) for a in args])
            return tasks(step, args)

        threading.Thread(target=kill_the_held_node, daemon=True).start()
        done = segments.build(store, out, run=run)
    weighed = [line.split() for line in (marker.parent / "done").read_text().splitlines()]
    held = sorted({node for segment, node in weighed if int(segment) == killed["segment"]})
    return {"done": done, **killed, "held_weighed_on": held, "differ": _differ(work / "one-process", out)}


def main() -> None:
    work = Path(sys.argv[1])
    from ray.cluster_utils import Cluster

    from logicrank.pipelines.engines.bm25 import storage

    storage.SEGMENT_ROWS = 300  # the BM25 index saved in 3 segments: each bm25 shard maps one whole segment (the actors read it from the index)

    import logicrank.jobs.retrieve as job
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.config.settings import RayConfig
    from logicrank.pipelines.retrieval.stages.itlr import ITLROptions
    from logicrank.pipelines.retrieval.stages.retrievers import BM25Options, DenseOptions

    _table(work / "db")
    _queries(work / "queries.jsonl")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": OBJECT_STORE, "include_dashboard": False,
                                                            "_system_config": SYSTEM_CONFIG})
    workers = [cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE) for _ in range(3)]
    cluster.wait_for_nodes()
    result = {"runs": {}, "bm25_build": _bm25_on_cluster(work, cluster.address)}
    killed = {"node": None, "batches_before": 0}

    def searched_then_kill():
        killed["batches_before"] += 0 if killed["node"] else 1
        if killed["node"] is None:
            killed["shard_nodes_before"] = sorted(a["Address"]["NodeID"] for a in cluster.global_state.actor_table(None).values()
                                                  if "ShardSearch" in a["ActorClassName"] and a["State"] == "ALIVE")
            cluster.remove_node(workers[0], allow_graceful=False)
            killed["node"] = workers[0].node_id

    pipelines = {"bm25": [BM25Options(k=50)], "dense": [DenseOptions(k=50)], "itlr": [ITLROptions(k=50, block_rows=128)]}
    sharded_calls: list[bool] = []
    shard_map = job._Host._shard_map

    def counting(self, task, merge):  # whether ITLR's exact scoring ran in shards (None: in the driver)
        out = shard_map(self, task, merge)
        sharded_calls.append(out is not None)
        return out

    job._Host._shard_map = counting
    for name, shards, hook in (("3", 3, lambda: None), ("1", None, lambda: None), ("3-killed", 3, searched_then_kill)):
        sharded_calls.clear()  # None: the index fits one process (retrieve_shard_bytes): searched whole, in the driver
        job.shard_searched = hook
        cfg = RetrieveConfig(queries=str(work / "queries.jsonl"), db=str(work / "db"), pipelines=pipelines,
                             ray=RayConfig(address=cluster.address, retrieve_shards=shards, retrieve_batch_rows=BATCH, retrieve_local_s=10**6))
        out = work / f"shards{name}"
        try:
            paths = run_retrieve(cfg, out, progress=False)
        except Exception:
            if name != "3-killed":
                raise
            result["kill_error"] = traceback.format_exc()
            break
        manifest = json.loads((out / "manifest.json").read_text())
        result["runs"][name] = {"paths": {k: str(v) for k, v in paths.items()}, "manifest": manifest, "itlr_shards_scored": any(sharded_calls)}
    result["killed"] = killed
    try:  # last: a second worker node is killed
        result["bm25_killed_build"] = _bm25_build_with_a_node_killed(work, cluster, workers)
    except Exception:
        result["bm25_killed_build"] = {"error": traceback.format_exc()}
    (work / "result.json").write_text(json.dumps(result, default=str))
    cluster.shutdown()

if __name__ == "__main__":
    main()
