"""Dataset generation throughput: `generate itlr` with 1 and 2 engine actors (not a test).

    make bench-generate     # SciFact (bundled), 48 documents, SmolLM2, LLM cache off

Indexes bundled SciFact once, then runs the same generation config twice, each in its own
process and local Ray cluster, with one engine actor (1 CPU) and with two (1 CPU each); everything else is equal, so the two
datasets must be equal too (the report checks it). Questions/s: drafted questions over the
topics + questions phase; labels/s: judged pairs over the labelling phase; each phase's time
includes starting its engines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logicrank.jobs.index import run_index  # noqa: E402
from logicrank.jobs.raysession import ray_session  # noqa: E402
from logicrank.pipelines.config.settings import EmbedConfig, GenerateConfig, IndexConfig, LLMConfig, RayConfig  # noqa: E402
from logicrank.pipelines.datasets import scifact  # noqa: E402
from logicrank.pipelines.markdown import table  # noqa: E402
from tests.perf.report import write_report  # noqa: E402

CHILD = """
import faulthandler, json, sys
faulthandler.dump_traceback_later(1500, exit=True)  # a hung run prints every thread's stack and stops
from logicrank.jobs.generate import run_generate
from logicrank.pipelines.config.settings import GenerateConfig
c = run_generate(GenerateConfig.model_validate_json(sys.argv[1]), sys.argv[2], echo=lambda m: None)
open(sys.argv[2] + "/counts.json", "w").write(json.dumps(c))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=48)
    ap.add_argument("--candidate-k", type=int, default=5)
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="logicrank-bench-generate-"))
    embed = EmbedConfig(backend="openvino")
    ray = RayConfig(num_cpus=cpus)
    result: dict = {"docs": args.docs, "cpus": cpus}
    with ray_session(ray):
        run_index(IndexConfig(corpus=str(scifact().corpus), db=str(work / "db"), embed=embed, ray=ray), work / "index", progress=False)
    for actors in (1, 2):  # each run in its own process and Ray cluster, as a user runs the job
        cfg = GenerateConfig(db=str(work / "db"), docs=args.docs, shard_docs=8, questions_per_shard=8, candidate_k=args.candidate_k, document_tokens=160,
                             embed=embed, ray=ray, llm=LLMConfig(cache=None, actors=actors, cpus_per_actor=1.0))
        subprocess.run([sys.executable, "-X", "faulthandler", "-c", CHILD, cfg.model_dump_json(), str(work / f"actors-{actors}")],
                       check=True, cwd=Path(__file__).resolve().parents[2])
        c = json.loads((work / f"actors-{actors}" / "counts.json").read_text())
        t = c["timings"]
        result[f"{actors} actor(s)"] = {
            "questions": c["drafted"], "labels": c["labels"]["pairs"], "seconds": c["seconds"], "timings": t,
            "questions_per_s": c["drafted"] / t["questions"], "labels_per_s": c["labels"]["pairs"] / t["labels"],
            "engines_loaded": c["llm"]["engines_loaded"],
        }
    one, two = result["1 actor(s)"], result["2 actor(s)"]
    same = all((work / "actors-1" / f).read_bytes() == (work / "actors-2" / f).read_bytes() for f in ("queries.jsonl", "qrels/test.tsv"))
    result["same_dataset"] = same
    result["speedup_questions"] = two["questions_per_s"] / one["questions_per_s"]
    result["speedup_labels"] = two["labels_per_s"] / one["labels_per_s"]
    lines = [
        f"# Dataset generation (`generate itlr`): 1 vs 2 engine actors ({args.docs} SciFact documents, SmolLM2, {cpus} CPUs, one run)",
        "",
        *table(["engine actors", "questions", "questions/s", "labels", "labels/s", "job seconds"],
               [[str(n), str(r["questions"]), f"{r['questions_per_s']:.2f}", str(r["labels"]), f"{r['labels_per_s']:.2f}", f"{r['seconds']:.0f}"]
                for n, r in ((1, one), (2, two))], align="rrrrrr"),
        "",
        f"2 actors vs 1: questions/s x{result['speedup_questions']:.2f}, labels/s x{result['speedup_labels']:.2f}. "
        f"Same dataset from both: {same}. Each phase's time includes starting its engines (the pool is released while the "
        "retrievers run, as two engines hold both CPUs).",
        "",
        "On a GPU cluster: one engine per GPU (`--gpus-per-actor 1`, or `tensor_parallel_size` GPUs for a large model), spread over "
        "the nodes, with the retrievers on the CPUs beside them, so the pool is never released; the label phase (one forward pass "
        "per pair, no decoding) is bound by prefill, and vLLM's prefix cache serves the document prefix shared by every question "
        "that has the same candidate (prompts are sorted so those share an engine batch). Here two engines share two cores with "
        "the driver, so the second engine adds little.",
        "",
        json.dumps({k: v["timings"] for k, v in result.items() if isinstance(v, dict) and "timings" in v}),
    ]
    write_report(args.out, "bench_generate", result, lines)


if __name__ == "__main__":
    main()
