"""The LLM path measured (not a test): `make bench-llm`, sections chosen with ``--sections``.

    make bench-llm                                   # every section, the default samples (docs/llm.md has the figures)
    .venv/bin/python tests/perf/bench_llm.py --sections decomposition --per-template 10

decomposition  The LLM's ITLR forms for natural-language set-logic questions over LIMIT (exact
               gold; jobs/experiments/setlogic-llm.yaml), per model (``--models``: the real
               instruct model, `make models`, and SmolLM2 beside it, the same prompts), on a dev
               split (seed 1: where prompts and examples are designed) and a test split (seed 2,
               questions also in dev removed: only reported). Per split and model: parse rate
               (the raw output parses), form accuracy (equal to the gold form up to term order,
               quoting and case), statuses (ok, degenerate: a term from the prompt's examples or
               a conjunct beside its own negation, fallback: unparsed or cut), then P@1 and
               nDCG@10 of ITLR over BM25 with the model's forms, with the gold forms and BM25 on
               the question, overall and per template; seconds per question. LLM cache off.
throughput     True/False scoring with SmolLM2 on the same prompts (SciFact abstract as context,
               then a statement about it):
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
import pyarrow.parquet as pq

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
    ap.add_argument("--sections", default="decomposition,throughput", help="comma-separated: decomposition, throughput")
    ap.add_argument("--models", default="qwen2.5-coder-1.5b-instruct,smollm2-135m-instruct", help="decomposition: registered models or checkpoints")
    ap.add_argument("--per-template", type=int, default=10, help="decomposition: questions per template and split (7 templates)")
    ap.add_argument("--splits", default="dev,test", help="decomposition: dev (seed 1), test (seed 2)")
    ap.add_argument("--docs", type=int, default=128, help="throughput: documents (x 4 statements)")
    ap.add_argument("--hf-prompts", type=int, default=64, help="throughput: pairs scored by the per-pair transformers loop")
    ap.add_argument("--no-compiled", action="store_true", help="throughput: skip the compiled start-up (minutes on CPU)")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = set(sections) - {"decomposition", "throughput"}
    if unknown:
        raise SystemExit(f"bench_llm: unknown section(s) {sorted(unknown)}; choose from decomposition, throughput")
    if "decomposition" in sections:
        decomposition(args)
    if "throughput" in sections:
        throughput(args)


SPLITS = {"dev": 1, "test": 2}  # seeds of the set-logic generator


def canonical(node):
    """A form up to term order, quoting and case: AND/OR children as a sorted tuple."""
    from logicrank.pipelines.logic.query import Not, Term

    if isinstance(node, Term):
        return ("term", " ".join(node.text.casefold().split()))
    if isinstance(node, Not):
        return ("not", canonical(node.child))
    return (type(node).__name__, tuple(sorted(canonical(c) for c in node.children)))


def form_figures(decompositions: pa.Table, gold: dict[str, str]) -> dict:
    """Parse rate, form accuracy and statuses of one model's ITLR decompositions."""
    from collections import Counter

    from logicrank.pipelines.logic.query import QueryParseError, parse

    rows = decompositions.to_pylist()
    parsed = correct = 0
    for r in rows:
        try:
            node = parse((r["raw_output"] or "").strip())
        except QueryParseError:
            continue
        parsed += 1
        correct += canonical(node) == canonical(parse(gold[r["query_id"]]))
    n = len(rows)
    return {"questions": n, "parse_rate": parsed / n if n else None, "form_accuracy": correct / n if n else None,
            "status": dict(Counter(r["status"] for r in rows)),
            "examples": [{"query_id": r["query_id"], "status": r["status"], "raw_output": r["raw_output"], "error": r["error"]}
                         for r in rows if r["status"] != "ok"][:5]}


def decomposition(args) -> None:
    from logicrank.jobs.experiment import run_experiment
    from logicrank.pipelines.experiment import load, override
    from logicrank.pipelines.files import read_jsonl
    from logicrank.pipelines.generate.setlogic import generate

    out = Path(args.out) / "bench_llm_decomposition"
    splits = [x.strip() for x in args.splits.split(",") if x.strip()]
    questions = {}
    for split in splits:
        generate(out / f"setlogic-{split}", args.per_template, SPLITS[split])
        questions[split] = [r for _, r in read_jsonl(out / f"setlogic-{split}" / "queries.jsonl", "queries", ValueError)]
    dev_texts = {q["text"] for q in questions.get("dev", [])}
    kept = {split: [q for q in qs if split == "dev" or q["text"] not in dev_texts] for split, qs in questions.items()}
    result: dict = {"per_template": args.per_template, "splits": {s: {"seed": SPLITS[s], "questions": len(kept[s]),
                                                                      "dropped_as_in_dev": len(questions[s]) - len(kept[s])} for s in splits},
                    "rows": []}
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        for split in splits:
            exp = override(load("setlogic-llm"), {"dataset.setlogic": {"per_template": args.per_template, "seed": SPLITS[split]},
                                                  "dataset.query_ids": [q["_id"] for q in kept[split]]})
            where = out / f"{model.replace('/', '_')}-{split}"
            t = time.perf_counter()
            res = run_experiment(exp, where, llm=LLMConfig(model=model, cache=None), ray=RayConfig(num_cpus=len(os.sched_getaffinity(0))),
                                 progress=False)
            seconds = time.perf_counter() - t
            [path] = list((where / "retrieve").rglob("decompositions/itlr-llm.parquet")) or [None]
            if path is None:
                raise SystemExit(f"bench_llm: no decompositions table under {where / 'retrieve'}")
            gold = {q["_id"]: q["logical_query"] for q in kept[split]}
            forms = form_figures(pq.read_table(path), gold)
            summary = res.summary
            by_template = res.groups.get("template")
            timings = json.loads((where / "retrieve" / "manifest.json").read_text())["timings_s"]
            stage_s = sum(v for key, v in timings.items() if key.startswith("decomposition:"))
            row = {"model": model, "split": split, **forms, "seconds": seconds, "decomposition_s": stage_s,
                   "runs": {rid: {m: float(summary.loc[rid, m]) for m in summary.columns} for rid in summary.index},
                   "by_template": None if by_template is None else by_template.reset_index().to_dict(orient="records")}
            result["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("by_template",)}, indent=1), flush=True)
    lines = [f"# LLM decomposition into ITLR forms: LIMIT set-logic, {args.per_template} per template and split", ""]
    lines += markdown.table(
        ["model", "split", "questions", "parse rate", "form accuracy", "ok / degenerate / fallback", "P@1 llm", "P@1 gold", "P@1 bm25",
         "nDCG@10 llm", "nDCG@10 gold", "nDCG@10 bm25", "decomposition s"],
        [[r["model"], r["split"], str(r["questions"]), f"{r['parse_rate']:.2f}", f"{r['form_accuracy']:.2f}",
          " / ".join(str(r["status"].get(k, 0)) for k in ("ok", "degenerate", "fallback")),
          *(f"{r['runs'][rid]['P@1']:.3f}" for rid in ("itlr-llm", "itlr-gold", "bm25")),
          *(f"{r['runs'][rid]['nDCG@10']:.3f}" for rid in ("itlr-llm", "itlr-gold", "bm25")),
          f"{r['decomposition_s']:.0f}"] for r in result["rows"]],
        align="llrrrrrrrrrrr")
    write_report(args.out, "bench_llm_decomposition", result, lines)


def throughput(args) -> None:
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
