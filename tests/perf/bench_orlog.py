"""OrLog end to end: (query, candidate) pairs per second through `retrieve --method orlog` (not a test).

    make bench-orlog     # 16 ITLR-benchmark questions x dense top 10 x 3 gold atoms, SmolLM2 scoring

Builds the ITLR benchmark's small layout (one question per template), indexes it, writes gold
OrLog decompositions (one atom per term), then times the whole `retrieve` call of the orlog
pipeline (Ray's start, its dense first stage and its decomposition stage included): candidate
fetch, truth prompts on the Ray actor pool (actor and engine start-up included), calibration,
exact posterior and ranking. Reports pairs/s and prompts/s, and the same for the reasoner.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logicrank.jobs.index import run_index  # noqa: E402
from logicrank.jobs.retrieve import run_retrieve  # noqa: E402
from logicrank.pipelines.config.retrieval import RetrieveConfig  # noqa: E402
from logicrank.pipelines.config.settings import IndexConfig, LLMConfig, RayConfig  # noqa: E402
from logicrank.pipelines.datasets import scifact  # noqa: E402
from logicrank.pipelines.files import write_parquet_atomic, write_text_atomic  # noqa: E402
from logicrank.pipelines.generate.synthetic import generate, gold_orlog_decompositions  # noqa: E402
from logicrank.pipelines.io import read_queries  # noqa: E402
from logicrank.pipelines.markdown import table  # noqa: E402
from tests.perf.report import write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="logicrank-bench-orlog-"))
    generate(scifact().corpus, work / "syn", per_template=1, seed=0)
    ray = RayConfig(num_cpus=cpus)
    run_index(IndexConfig(corpus=str(work / "syn" / "corpus.jsonl"), db=str(work / "db"), ray=ray), work / "index")
    rows = (work / "syn" / "queries.jsonl").read_text(encoding="utf-8").splitlines()[: args.queries]
    queries = write_text_atomic("\n".join(rows) + "\n", work / "queries.jsonl")
    dec = write_parquet_atomic(gold_orlog_decompositions(zip(*(read_queries(queries).column(c).to_pylist() for c in ("query_id", "logical_query")), strict=True)), work / "dec.parquet")
    result: dict = {"queries": args.queries, "k": args.k, "cpus": cpus}
    for method in ("orlog", "reasoner"):
        cfg = RetrieveConfig(
            queries=str(queries), db=str(work / "db"), pipelines={method: [{"dense": {"k": args.k}}, *([{"decomposition": {"target": "orlog", "decompositions": str(dec)}}] if method == "orlog" else []),
                                       {method: {"k": args.k, "context_tokens": 128}}]}, llm=LLMConfig(cache=None, cpus_per_actor=cpus), ray=ray,
        )
        t = time.perf_counter()
        run_retrieve(cfg, work / method)
        seconds = time.perf_counter() - t
        cost = json.loads((work / method / "manifest.json").read_text())[method]
        result[method] = {**cost, "seconds": seconds, "pairs_per_s": cost["pairs"] / seconds, "prompts_per_s": cost["forward_passes"] / seconds}
    o, r = result["orlog"], result["reasoner"]
    lines = [
        f"# OrLog end to end ({args.queries} questions x dense top {args.k}, SmolLM2 scoring, {cpus} CPUs, one run, start-up included)",
        "",
        *table(
            ["method", "pairs", "forward passes / pair", "seconds", "pairs/s", "prompts/s", "prefix-cached prompt tokens"],
            [
                [m, str(c["pairs"]), f"{c['forward_passes_per_pair']:.1f}", f"{c['seconds']:.1f}", f"{c['pairs_per_s']:.2f}",
                 f"{c['prompts_per_s']:.2f}", f"{c['prefix_cached_tokens'] / max(c['prompt_tokens'], 1):.0%}"]
                for m, c in (("orlog", o), ("reasoner", r))
            ],
            align="lrrrrrr",
        ),
    ]
    write_report(args.out, "bench_orlog", result, lines)


if __name__ == "__main__":
    main()
