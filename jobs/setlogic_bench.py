"""Set-logic queries over LIMIT with exact gold: generate, index, retrieve, evaluate by template.

Everything runs through logicrank's own jobs: ``generate setlogic`` (no LLM), ``index`` (46
people), ``retrieve`` (dense, bm25, ITLR with the gold logical query, OrLog with the gold
atoms over bm25's top 20; one LLM pool) and ``evaluate``; the report breaks every measure
down by QUEST template. Measures: P@1, R@k and F1@k (QUEST's set view of a ranking's top k),
nDCG@10. ITLR and OrLog get the gold logical form, so they measure the logic layer alone (the
LLM's decomposition is not in the loop); OrLog's P(True) comes from the LLM, so with
SmolLM2 its row is plumbing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from jobs.evaluate import run_evaluate
from jobs.index import run_index
from jobs.retrieve import run_retrieve
from pipelines.config import RetrieveConfig
from pipelines.files import write_text_atomic
from pipelines.generate.setlogic import TEMPLATE_NAMES, generate
from pipelines.pipeline import parse_stages
from schemas.config import EmbedConfig, EvaluateConfig, IndexConfig, LLMConfig, RayConfig

RUNS = ("dense", "bm25", "itlr", "orlog")
ORLOG_DEPTH = 20  # the paper's top-20 candidates


def measures(k: int) -> tuple[str, ...]:
    return ("P@1", f"R@{k}", f"F1@{k}", "nDCG@10")


def run_setlogic_bench(out: str | Path, embed: EmbedConfig, ray: RayConfig, llm: LLMConfig | None, per_template: int = 20, seed: int = 0,
                       k: int = 5, orlog_depth: int = ORLOG_DEPTH, echo=print) -> dict:
    """``llm`` None: dense, bm25 and ITLR only (no OrLog row)."""
    out = Path(out)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    data = out / "data"
    counts = generate(data, per_template=per_template, seed=seed)
    echo(f"      {counts['queries']} queries ({per_template} per template), {counts['qrels']} gold pairs over {counts['people']} people")
    db = str(out / "lancedb")
    s = run_index(IndexConfig(corpus=str(data / "corpus.jsonl"), db=db, embed=embed, ray=ray), out / "index", progress=False)
    timings["index"] = s.seconds
    pipelines = {
        "dense": [{"dense": {"k": 100}}],
        "bm25": [{"bm25": {"k": 100}}],
        "itlr": [{"itlr": {"k": 100}}],
        "orlog": [{"bm25": {"k": orlog_depth}}, {"decomposition": {"target": "orlog", "decompositions": str(data / "decompositions.parquet")}},
                  {"orlog": {"k": orlog_depth, "context_tokens": 512}}],
    }
    runs_ids = [r for r in RUNS if r != "orlog" or llm is not None]
    t = time.perf_counter()
    cfg = RetrieveConfig(queries=str(data / "queries.jsonl"), db=db, embed=embed, ray=ray, **({"llm": llm} if llm else {}),
                         pipelines={rid: parse_stages(pipelines[rid]) for rid in runs_ids})
    runs = run_retrieve(cfg, out / "retrieve", echo=echo)
    timings["retrieve"] = time.perf_counter() - t
    metrics = run_evaluate(EvaluateConfig(qrels=str(data), runs=tuple(str(runs[r]) for r in runs_ids), measures=measures(k), baseline="dense"),
                           out / "evaluate", title="LIMIT set-logic queries (exact gold)")
    table = by_template(metrics.to_pandas(), data / "queries.jsonl")
    timings["all"] = time.perf_counter() - t0
    manifest = json.loads((out / "retrieve" / "manifest.json").read_text(encoding="utf-8"))
    report = _report(counts, table, measures(k), manifest, llm, timings, orlog_depth, embed.model)
    write_text_atomic(report, out / "setlogic_report.md")
    return {"counts": counts, "table": table, "report": out / "setlogic_report.md", "seconds": timings["all"]}


def by_template(metrics: pd.DataFrame, queries: Path) -> pd.DataFrame:
    """Mean of each (run, measure) per template, plus 'all' (every query): rows (run_id,
    template), columns measures."""
    template = {json.loads(line)["_id"]: json.loads(line)["template"] for line in queries.read_text(encoding="utf-8").splitlines()}
    per_query = metrics[metrics["query_id"] != "all"].copy()
    per_query["template"] = per_query["query_id"].map(template)
    if per_query["template"].isna().any():
        raise RuntimeError("setlogic: a metrics row for a query the set does not hold (a bug)")
    rows = per_query.groupby(["run_id", "template", "measure"], sort=False)["value"].mean().unstack("measure")
    overall = per_query.groupby(["run_id", "measure"], sort=False)["value"].mean().unstack("measure")
    overall.index = pd.MultiIndex.from_arrays([overall.index, ["all"] * len(overall)], names=["run_id", "template"])
    out = pd.concat([rows, overall])
    order = {t: i for i, t in enumerate((*TEMPLATE_NAMES, "all"))}
    runs = list(dict.fromkeys(metrics["run_id"]))
    return out.sort_index(key=lambda idx: idx.map(order) if idx.name == "template" else idx.map(runs.index))


def _report(counts: dict, table: pd.DataFrame, names: tuple[str, ...], manifest: dict, llm: LLMConfig | None, timings: dict, orlog_depth: int, model: str) -> str:
    lines = [
        "## Set-logic queries over LIMIT (exact gold)",
        "",
        f"LIMIT-small's {counts['people']} people and their like-lists ({counts['items']:,} items; bundled, CC BY 4.0): "
        f"{counts['queries']} QUEST-style queries ({counts['config']['per_template']} per template, seed {counts['config']['seed']}), "
        "each with its exact gold set computed from the lists (mean size per template: "
        + ", ".join(f"{t} {v}" for t, v in counts["gold_size"].items()) + "). "
        f"ITLR scores the gold logical query ({model} term cosines, product/sum/complement); OrLog reranks bm25's top "
        f"{orlog_depth} with the gold atoms (`{{x}} likes A`) and form, P(True) from the LLM with the person's like-list as context. "
        f"{names[1]} and {names[2]} read the top k as the predicted set (QUEST's set view); a gold set of one caps {names[2]} at "
        f"{2 / (1 + int(names[2].split('@')[1])):.2f}.",
        "",
    ]
    if counts.get("negation_bites"):
        lines += ["Queries whose NOT takes someone out of the positive part's answers: " + ", ".join(
            f"{t} {n} of {counts['per_template'][t]}" for t, n in counts["negation_bites"].items()) + ". (On LIMIT-small no two people share "
            "two items, so \"A and B\" has one answer at most and \"A and B but not C\" can only keep it: that template tests its AND part.)", ""]
    if counts["short"]:
        lines += ["Templates short of their count (too few valid draws): " + ", ".join(f"{t} {n} short" for t, n in counts["short"].items()) + ".", ""]
    if counts["rejected"]:
        lines += ["Draws rejected (empty gold set, whole corpus or a repeat): " + ", ".join(f"{k} {v}" for k, v in counts["rejected"].items()) + ".", ""]
    for measure in names:
        lines += [f"### {measure}", "", "| run | " + " | ".join((*TEMPLATE_NAMES, "all")) + " |", "|---|" + "---:|" * (len(TEMPLATE_NAMES) + 1)]
        for rid in dict.fromkeys(table.index.get_level_values("run_id")):
            block = table.loc[rid][measure]
            lines.append(f"| {rid} | " + " | ".join(f"{block.get(t, float('nan')):.3f}" for t in (*TEMPLATE_NAMES, "all")) + " |")
        lines.append("")
    if "orlog" in manifest.get("pipelines", {}):
        c = manifest["pipelines"]["orlog"]["stages"][-1]
        lines += [f"OrLog: {c.get('pairs', 0):,} (query, candidate) pairs, {c.get('forward_passes', 0):,} forward passes, "
                  f"{c.get('prompt_tokens', 0):,} prompt tokens ({c.get('prefix_cached_tokens', 0):,} from the prefix cache).", ""]
    if llm is not None and "smollm2" in llm.model.lower():
        lines += ["**OrLog's row uses SmolLM2-135M's P(True) (near chance on true/false): plumbing, not a claim about OrLog.** "
                  "With a real scorer: `logicrank bench-setlogic --llm-model <checkpoint dir> --gpus-per-actor 1` on a GPU node.", ""]
    lines += ["Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ".", ""]
    return "\n".join(lines)
