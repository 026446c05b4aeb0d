"""Soak: the `generate itlr` integration case run many times in one process (not a test).

    make soak-generate            # 30 runs; RUNS=100 make soak-generate for more

Once, a `generate` run stopped with the driver waiting on a lock and its engines idle; it
was the second of two runs in one process (1 engine actor, then 2). This script repeats that
shape: one process and one local Ray cluster, runs alternating between 1 and 2 engine actors
(and wave sizes), on the tiny random Llama and the small synthetic index of the integration
tests. Each run is watched by ``faulthandler.dump_traceback_later``: a run that takes longer
than ``--timeout`` seconds writes every thread's stack to ``stacks.txt`` and ends the process
(exit 1). Every run appends a line to ``soak.jsonl`` (seconds, actors, wave, questions,
labels, whether its dataset equals the first run's of the same data).
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _digest(out: Path) -> str:
    h = hashlib.sha256()
    for name in ("queries.jsonl", "qrels/test.tsv"):
        h.update((out / name).read_bytes())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=600.0, help="Seconds one run may take before its stacks are dumped.")
    ap.add_argument("--out", default="runs/soak-generate")
    args = ap.parse_args()

    from logicrank.jobs.generate import run_generate
    from logicrank.jobs.index import run_index
    from logicrank.jobs.raysession import ray_session
    from logicrank.pipelines.config.settings import GenerateConfig, IndexConfig, LLMConfig, RayConfig
    from logicrank.pipelines.datasets import scifact
    from logicrank.pipelines.generate.synthetic import generate
    from tests.tiny_llm import build_tiny_llm

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="logicrank-soak-"))
    log = (out / "soak.jsonl").open("a", encoding="utf-8")
    stacks = (out / "stacks.txt").open("a", encoding="utf-8")
    ray = RayConfig(num_cpus=2, batch_rows=64)
    tiny = build_tiny_llm(work / "tiny-llama")
    first: str | None = None
    with ray_session(ray):
        generate(scifact().corpus, work / "syn", per_template=1, seed=3)
        run_index(IndexConfig(corpus=str(work / "syn" / "corpus.jsonl"), db=str(work / "db"), ray=ray), work / "index")
        for i in range(args.runs):
            actors = 1 + i % 2
            wave = (1, 2, 3)[i % 3]
            cfg = GenerateConfig(
                db=str(work / "db"), docs=24, shard_docs=4, questions_per_shard=6, candidate_k=3, wave_shards=wave, document_tokens=64,
                topic_tokens=24, question_tokens=24, ray=ray,
                llm=LLMConfig(model=str(tiny), max_model_len=1024, cache=None, max_num_seqs=64, actors=actors, cpus_per_actor=1.0),
            )
            stacks.write(f"--- run {i} ({time.strftime('%H:%M:%S')})\n")
            stacks.flush()
            faulthandler.dump_traceback_later(args.timeout, exit=True, file=stacks)
            t = time.perf_counter()
            c = run_generate(cfg, work / f"run-{i}", echo=lambda m: None)
            faulthandler.cancel_dump_traceback_later()
            digest = _digest(work / f"run-{i}")
            first = first or digest
            row = {"run": i, "seconds": round(time.perf_counter() - t, 1), "actors": actors, "wave": wave, "questions": c["questions"],
                   "labels": c["labels"]["pairs"], "same_dataset": digest == first}
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), flush=True)
    print(f"soak: {args.runs} runs finished, none hung (timeout {args.timeout:.0f} s each); {out / 'soak.jsonl'}")


if __name__ == "__main__":
    main()
