"""OrLog's truth scoring killed and resumed on a cluster of several nodes on this machine
(tests/integration/test_llm_shards.py runs it in a child process).

Run as ``python -m tests.integration.llm_shards_child WORK SYNTHETIC TINY_MODEL``. Starts a head
node (the driver, no CPUs for actors) and two worker nodes with ``ray.cluster_utils.Cluster``
(the LLM pool's engine runs on a worker node), then runs `retrieve`'s orlog over 8 queries x 4
candidates x 2 atoms = 64 prompts in 4 shards three times: whole; stopped once two shard files
are on disk (the job's driver raises from its progress hook); resumed. Writes
``WORK/result.json``: each run's manifest, the progress lines, where the engines ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.integration.cluster_faults_child import OBJECT_STORE, SYSTEM_CONFIG


class Killed(Exception):
    """The job stopped from outside, once enough shards were on disk."""


def kill_at_two_shards(stages: Path, seen: list[str]):
    """A progress hook that stops the job (raises :class:`Killed`) once two shard files are on
    disk under ``stages`` (the event: any progress line after them), keeping the lines seen."""

    def hook(line: str) -> None:
        seen.append(line)
        if len(list(stages.glob("*.partial/shard-?????.parquet"))) >= 2:
            raise Killed(line)

    return hook


def orlog_config(work: Path, synthetic: Path, llm, ray):
    """The test's job: 8 of the synthetic set's queries with hand-written atoms (``a1 AND NOT
    a2``), orlog over bm25's top 4, in shards of 2 queries sent one shard per wave: 8 x 4 x 2 =
    64 prompts in 4 shards. Writes its queries and decompositions into ``work``."""
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.schemas.tables import DECOMPOSITIONS
    from tests.conftest import write_jsonl

    rows = [json.loads(line) for line in (synthetic / "syn" / "queries.jsonl").read_text().splitlines()[:8]]
    write_jsonl(work / "q.jsonl", rows)
    atoms = [{"id": "a1", "text": "{x} mentions cells"}, {"id": "a2", "text": "{x} is about cancer"}]
    pq.write_table(pa.Table.from_pylist([
        {"query_id": r["_id"], "method": "orlog", "model": "hand", "prompt_sha": "-", "raw_output": None, "logical_query": '"a1" AND NOT "a2"',
         "atoms": atoms, "expansion": None, "status": "ok", "error": None, "finish_reason": None, "prompt_tokens": 0,
         "generated_tokens": 0, "cached": False} for r in rows
    ], schema=DECOMPOSITIONS), work / "dec.parquet")
    llm = llm.model_copy(update={"cache": None, "shard_queries": 2, "wave_shards": 1, "batch_rows": 8})
    return RetrieveConfig.preset(queries=str(work / "q.jsonl"), db=str(synthetic / "db"), methods=("orlog",), llm=llm, ray=ray,
                                 set={"bm25.k": 4, "orlog.k": 4, "orlog.context_tokens": 32, "decomposition.decompositions": str(work / "dec.parquet")})


def main() -> None:
    work, synthetic, model = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    from ray.cluster_utils import Cluster

    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.settings import LLMConfig, RayConfig

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": OBJECT_STORE, "include_dashboard": False,
                                                            "_system_config": SYSTEM_CONFIG})
    for _ in range(2):
        cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE)
    cluster.wait_for_nodes()
    llm = LLMConfig(model=model, max_model_len=1024, cache=None, max_num_seqs=64)
    cfg = orlog_config(work, synthetic, llm, RayConfig(address=cluster.address))
    result: dict = {"head": cluster.head_node.node_id}
    run_retrieve(cfg, work / "whole", progress=False)
    seen: list[str] = []
    try:
        run_retrieve(cfg, work / "resumed", echo=kill_at_two_shards(work / "resumed" / "stages", seen))
        result["killed"] = None
    except Killed as stop:
        result["killed"] = str(stop)
    result["killed_lines"] = seen
    killed_manifest = work / "resumed" / "manifest.json"  # (a first run's: it says it is running until it finishes)
    result["manifest_after_kill"] = json.loads(killed_manifest.read_text())["status"] if killed_manifest.exists() else None
    lines: list[str] = []
    run_retrieve(cfg, work / "resumed", echo=lines.append)
    result["resumed_lines"] = lines
    result["partials_left"] = [str(p) for p in (work / "resumed" / "stages").glob("*.partial")]
    result["manifests"] = {name: json.loads((work / name / "manifest.json").read_text()) for name in ("whole", "resumed")}
    result["engine_nodes"] = sorted({a["Address"]["NodeID"] for a in cluster.global_state.actor_table(None).values()
                                     if "EngineActor" in a["ActorClassName"]})
    (work / "result.json").write_text(json.dumps(result, default=str))
    cluster.shutdown()


if __name__ == "__main__":
    main()
