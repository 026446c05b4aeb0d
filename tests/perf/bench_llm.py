"""LLM True/False scoring benchmark: ratios measured side by side in one run (not a test).

    make bench-llm      # SmolLM2-135M-Instruct, 512 truth prompts (128 documents x 4 statements)

On the same prompts (SciFact abstract as context, then a statement about it):
  ray      truth() through the job's LLM service (jobs/llm_service.py): one actor, one vLLM engine, batched,
           prefix caching on; timed end to end (actor and engine start included) and, in a
           second figure, in process after the engine has started;
  hf       one unbatched transformers forward pass per (candidate, predicate) pair, the way
           the OrLog code scores pairs (on a subset; prompts/s is a rate);
  startup  vLLM engine start-up, eager vs compiled (each in a fresh process).
Goal (issue 4): prompts/s through the Ray job >= 10x the per-pair transformers loop.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logicrank.pipelines import markdown  # noqa: E402
from logicrank.pipelines.config.settings import LLMConfig, RayConfig  # noqa: E402
from logicrank.pipelines.datasets import scifact  # noqa: E402
from logicrank.pipelines.llm import prompts  # noqa: E402
from logicrank.pipelines.llm.models import resolve  # noqa: E402
from tests.perf.report import write_report  # noqa: E402

STATEMENTS = ["{t} reports a clinical trial", "{t} is about cancer", "{t} studies mice", "{t} is a review article"]


def truth_prompts(n_docs: int) -> pa.Table:
    rows = []
    with gzip.open(scifact().corpus, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            context = f"Document: {d['title']}. {d['text'][:400]}\n"
            for j, s in enumerate(STATEMENTS):
                rows.append({"prompt_id": f"{d['_id']}-{j}", "context": context, "statement": s.format(t="The document")})
            if len(rows) >= n_docs * len(STATEMENTS):
                break
    return pa.Table.from_pylist(rows)


def _startup(cfg: LLMConfig) -> float:
    code = (
        "import json,sys; from logicrank.pipelines.config.settings import LLMConfig; from logicrank.pipelines.llm.engine import Engine; "
        f"e=Engine(LLMConfig.model_validate_json({cfg.model_dump_json()!r})).start(); print(json.dumps(e.startup_s))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2])
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=128)
    ap.add_argument("--hf-prompts", type=int, default=64, help="pairs scored by the per-pair transformers loop")
    ap.add_argument("--no-compiled", action="store_true", help="skip the compiled start-up (minutes on CPU)")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    table = truth_prompts(args.docs)
    n = table.num_rows
    cpus = len(os.sched_getaffinity(0))
    cfg = LLMConfig(cache=None)
    resolved = resolve(cfg.model)
    template = prompts.load("truth")
    texts = [template.render(context=c, statement=s) for c, s in zip(table.column("context").to_pylist(), table.column("statement").to_pylist(), strict=True)]

    # (1) the job's LLM service on Ray, end to end (Ray, actor and engine start included)
    from logicrank.jobs.llm_service import LLMService
    from logicrank.jobs.raysession import ray_session
    from logicrank.pipelines.llm.engine import truth_table

    t = time.perf_counter()
    with ray_session(RayConfig(num_cpus=cpus)):
        service = LLMService(cfg.model_copy(update={"cpus_per_actor": float(cpus), "batch_rows": 256}))
        values = [{"context": c, "statement": s} for c, s in zip(table.column("context").to_pylist(), table.column("statement").to_pylist(), strict=True)]
        ray_scores = truth_table(table.column("prompt_id"), service.truth(template, values))
        service.close()
    ray_s = time.perf_counter() - t

    # (2) the same engine in process, after start-up (the steady state of a long job)
    from logicrank.pipelines.llm.engine import Engine

    engine = Engine(cfg, resolved).start()
    t = time.perf_counter()
    inproc = engine.truth(texts)
    inproc_s = time.perf_counter() - t
    prompt_tokens = sum(r.prompt_tokens for r in inproc)
    cached_tokens = sum(r.cached_prompt_tokens for r in inproc)

    # (3) per-pair transformers forward passes (OrLog's way), same prompts
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(cpus)
    tok = AutoTokenizer.from_pretrained(resolved.path)
    model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch.float32).eval()
    t_id, f_id = engine.label_ids
    hf_p = []
    t = time.perf_counter()
    for text in texts[: args.hf_prompts]:
        with torch.no_grad():
            logits = model(**tok(text, return_tensors="pt")).logits[0, -1]
        hf_p.append(float(torch.sigmoid(logits[t_id] - logits[f_id])))
    hf_s = time.perf_counter() - t
    diff = float(np.max(np.abs(np.array(hf_p) - ray_scores.column("p_true").to_numpy()[: len(hf_p)])))
    del engine

    # (4) engine start-up, eager vs compiled, each in a fresh process
    eager_s = _startup(cfg)
    compiled_s = None if args.no_compiled else _startup(cfg.model_copy(update={"enforce_eager": False}))

    ray_rate, inproc_rate, hf_rate = n / ray_s, n / inproc_s, len(hf_p) / hf_s
    result = {
        "model": resolved.model_id, "prompts": n, "cpus": cpus, "hf_prompts": len(hf_p),
        "ray_job_s": ray_s, "ray_prompts_per_s": ray_rate, "in_process_s": inproc_s, "in_process_prompts_per_s": inproc_rate,
        "hf_per_pair_s": hf_s, "hf_prompts_per_s": hf_rate,
        "ratio_ray_vs_hf": ray_rate / hf_rate, "ratio_in_process_vs_hf": inproc_rate / hf_rate,
        "max_abs_p_true_diff_vs_hf": diff, "prompt_tokens": prompt_tokens, "prefix_cached_tokens": cached_tokens,
        "startup_eager_s": eager_s, "startup_compiled_s": compiled_s,
    }
    lines = [
        f"# LLM True/False scoring benchmark ({resolved.model_id}, {n} prompts, {cpus} CPUs, one run)",
        "",
        *markdown.table(["Ray job prompts/s (start-up incl.)", "in process prompts/s", "per-pair transformers prompts/s", "Ray / per-pair (goal >= 10)",
                         "in process / per-pair", "max abs P(True) diff", "prefix-cached prompt tokens", "start-up eager s", "start-up compiled s"],
                        [[f"{ray_rate:.1f}", f"{inproc_rate:.1f}", f"{hf_rate:.2f}", f"{ray_rate / hf_rate:.1f}", f"{inproc_rate / hf_rate:.1f}",
                          f"{diff:.1e}", f"{cached_tokens} / {prompt_tokens}", f"{eager_s:.1f}",
                          "None" if compiled_s is None else f"{compiled_s:.1f}"]],
                        align="rrrrrrrrr"),
    ]
    write_report(args.out, "bench_llm", result, lines)


if __name__ == "__main__":
    main()
