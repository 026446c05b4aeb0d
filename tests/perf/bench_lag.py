"""LAG stage throughput: rounds batched on the shared pool vs an engine call per question per step (not a test).

    make bench-lag     # 30 MuSiQue questions, SmolLM2 on one engine actor, LLM cache off

Indexes the bundled MuSiQue paragraphs, starts one LLM pool, then runs the same LAG stage
(same options, same prompts, greedy decoding) twice in one process:

- **shared pool** (the stage as it ships): each round is one batched call for all active
  questions (decomposition, each step's sub-answers, synthesis);
- **naive**: the same chain code with a client that sends every prompt as its own engine
  call, one question and one step at a time, as a loop over questions would.

The engine is started (and warmed by one prompt) before either is timed. The naive run goes
second, so vLLM's prefix cache already holds the shared run's prompts: the ratio is, if
anything, in the naive loop's favour. The report counts the questions whose answers agree.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logicrank.jobs.index import run_index  # noqa: E402
from logicrank.jobs.raysession import ray_session  # noqa: E402
from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig, LLMConfig, RayConfig  # noqa: E402
from logicrank.pipelines.datasets.qa import to_beir  # noqa: E402
from logicrank.pipelines.engines.embed import Embedder  # noqa: E402
from logicrank.pipelines.engines.store import DocStore  # noqa: E402
from logicrank.pipelines.evaluation.experiment import load  # noqa: E402
from logicrank.pipelines.files import write_text_atomic  # noqa: E402
from logicrank.pipelines.io import read_queries  # noqa: E402
from logicrank.pipelines.llm import prompts  # noqa: E402
from logicrank.pipelines.markdown import table  # noqa: E402
from logicrank.pipelines.retrieval.stages import Context  # noqa: E402
from logicrank.pipelines.retrieval.stages.lag import Lag, LagOptions  # noqa: E402
from tests.perf.report import write_report  # noqa: E402


class Client:
    """The stage's LLM client, counting engine calls: as shipped (one call per batch the stage
    sends), or naive (``per_prompt``: every prompt its own call, one question and one step at a time)."""

    def __init__(self, llm, per_prompt: bool):
        self.llm, self.per_prompt, self.calls = llm, per_prompt, 0

    @property
    def model_id(self):
        return self.llm.model_id

    def generate(self, template, values, *args, **kwargs):
        batches = [[v] for v in values] if self.per_prompt else [values]
        self.calls += len(batches)
        return [g for batch in batches for g in self.llm.generate(template, batch, *args, **kwargs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="logicrank-bench-lag-"))
    to_beir("musique", work / "beir")
    embed = EmbedConfig(backend="openvino", title_sep=load("lag").embed["title_sep"])
    ray = RayConfig(num_cpus=cpus)
    rows = (work / "beir" / "queries.jsonl").read_text(encoding="utf-8").splitlines()[: args.questions]
    queries = read_queries(write_text_atomic("\n".join(rows) + "\n", work / "queries.jsonl"))
    with ray_session(ray):
        from logicrank.jobs.llm_service import LLMService

        run_index(IndexConfig(corpus=str(work / "beir" / "corpus.jsonl"), db=str(work / "db"), embed=embed, ray=ray), work / "index", progress=False)
        llm = LLMService(LLMConfig(cache=None, cpus_per_actor=float(cpus)))
        embedder = Embedder(embed)
        llm.generate(prompts.load("lag_answer"), [{"passages": "[1] warm-up", "question": "warm-up?"}], max_tokens=4)  # engine start, untimed
        result: dict = {"questions": len(rows), "cpus": cpus, "llm": llm.model_id}
        outputs = {}
        for mode, client in (("shared pool", Client(llm, per_prompt=False)), ("naive: a call per question per step", Client(llm, per_prompt=True))):
            ctx = Context(DocStore(str(work / "db")), encoder=lambda: embedder, llm=lambda c=client: c, llm_model=str(llm.resolved.path))
            t = time.perf_counter()
            out = Lag(LagOptions()).run(ctx, queries, [])
            seconds = time.perf_counter() - t
            outputs[mode] = out.side["answers"].column("answer").to_pylist()
            result[mode] = {"seconds": seconds, "questions_per_s": len(rows) / seconds, "engine_calls": client.calls,
                            "steps": out.side["lag_steps"].num_rows, "stop_reasons": out.counts["stop_reasons"]}
        llm.close()
    shared, naive = result["shared pool"], result["naive: a call per question per step"]
    same = sum(a == b for a, b in zip(outputs["shared pool"], outputs["naive: a call per question per step"], strict=True))
    result["same_answers"] = same
    result["speedup"] = shared["questions_per_s"] / naive["questions_per_s"]
    lines = [
        f"# LAG stage: shared pool vs a call per question per step ({len(rows)} MuSiQue questions, SmolLM2, {cpus} CPUs, one run)",
        "",
        *table(["mode", "engine calls", "steps", "seconds", "questions/s"],
               [[m, str(c["engine_calls"]), str(c["steps"]), f"{c['seconds']:.1f}", f"{c['questions_per_s']:.2f}"]
                for m, c in (("shared pool", shared), ("naive", naive))], align="lrrrr"),
        "",
        f"Speed-up of the shared pool: {result['speedup']:.1f}x. Same prompts in both; equal answers: {same} of {len(rows)} "
        "(greedy decoding; a batch may round differently from a single prompt on some engines).",
    ]
    write_report(args.out, "bench_lag", result, lines)


if __name__ == "__main__":
    main()
