"""The rule-retrieval benchmark (RuleBench ULogic): vanilla sparse and dense retrieval of the
raw query over the rule base, SIAR in both modes with both retrievers, and SIAR + R3, laid
out like the SIAR paper's table (rows: sparse / dense x vanilla / +SIAR / +SIAR+R3; R@1, R@5,
MRR), with the paper's figures beside and R3's ceiling (its first stage's R@n).

The set declares no licence and is not bundled: it is read from a path (``logicrank
bench-rules PATH``; the main job's rules section reads ``LOGICRANK_RULEBENCH``). Everything
runs through logicrank's own jobs: prepare-rulebench, index, retrieve (one LLM pool for every
SIAR and R3 stage), evaluate.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from jobs.evaluate import run_evaluate
from jobs.index import run_index
from jobs.retrieve import run_retrieve
from pipelines.config import RetrieveConfig
from pipelines.datasets.rulebench import to_beir
from pipelines.evaluate.report import summary_frame
from pipelines.files import write_text_atomic
from pipelines.pipeline import parse_stages
from schemas.config import EmbedConfig, EvaluateConfig, IndexConfig, LLMConfig, RayConfig
from schemas.errors import UserError

ENV = "LOGICRANK_RULEBENCH"
OBTAIN = ("RuleBench ULogic is not bundled (no licence declared): get `dataset/ulogic/` (rules.json, test_data.json) from the "
          "llm-rule-following repository and give its directory")
# SIAR paper (ACL 2025), ULogic, Qwen2.5-72B: R@1 of vanilla / +SIAR / +SIAR+R3 (its dense model is not ours)
PAPER_R1 = {"sparse": (68.91, 74.82, 92.17), "dense": (30.36, 64.82, 88.19)}
# the reference computations on the full set (bm25s with Porter stemming and English
# stop words; all-MiniLM-L6-v2), vanilla R@1
REFERENCE_R1 = {"sparse": 68.67, "dense": 57.11}
# the SIAR mode the paper found best per retriever, the one R3 reranks
BEST_MODE = {"sparse": "rule+query", "dense": "rule"}
RETRIEVER = {"sparse": "bm25", "dense": "dense"}
MEASURES = ("R@1", "R@5", "R@10", "R@20", "MRR")


def run_rules_bench(src: str | Path, out: str | Path, embed: EmbedConfig, ray: RayConfig, llm: LLMConfig, sample: int | None = None,
                    seed: int = 0, r3: str = "both", r3_n: int = 20, echo=print) -> dict:
    """``sample``: that many queries drawn with ``seed`` (None: all 830). ``r3``: rerank the
    best-mode SIAR run of ``both`` retrievers, or the ``better`` of the two (the higher R@n:
    R3's ceiling), or ``none``."""
    out = Path(out)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    counts = to_beir(src, out / "beir")
    queries, qrels = sample_queries(out / "beir", sample, seed, job="bench-rules")
    n_queries = len(queries.read_text(encoding="utf-8").splitlines())
    echo(f"      {counts['rules']} rules, {n_queries} of {counts['queries']} queries" + (f" (sample, seed {seed})" if sample else ""))
    db = str(out / "lancedb")
    s = run_index(IndexConfig(corpus=str(out / "beir"), db=db, embed=embed, ray=ray), out / "index")
    timings["index"] = s.seconds
    depth = max(20, r3_n)

    t = time.perf_counter()
    vanilla = {name: [{RETRIEVER[name]: {"k": depth}}] for name in ("sparse", "dense")}
    runs = run_retrieve(_cfg(queries, db, embed, ray, llm, vanilla), out / "retrieve-vanilla")
    timings["retrieve vanilla"] = time.perf_counter() - t

    siar = {}
    for name in ("sparse", "dense"):
        for mode in ("rule", "rule+query"):
            siar[f"{name}-siar-{mode}"] = [{"siar": {"mode": mode}}, {RETRIEVER[name]: {"k": depth}}]
    r3_of = {name: [*siar[f"{name}-siar-{BEST_MODE[name]}"], {"r3": {"k": depth, "n": r3_n}}] for name in ("sparse", "dense")}
    echo(f"      SIAR ({llm.model}) in both modes with both retrievers, then R3 (n {r3_n}) over {r3}")
    t = time.perf_counter()
    rerank = {"both": ["sparse", "dense"], "better": [], "none": []}[r3]
    if r3 == "better":  # R3's first stage: the SIAR run (each retriever's best mode) with the higher R@n, R3's ceiling
        first = run_retrieve(_cfg(queries, db, embed, ray, llm, siar), out / "retrieve-llm", echo=echo)
        ceiling = summary_frame(run_evaluate(
            EvaluateConfig(qrels=str(qrels), runs=tuple(str(first[f"{n}-siar-{BEST_MODE[n]}"]) for n in ("sparse", "dense")), measures=(f"R@{r3_n}",)),
            out / "evaluate-siar", title="SIAR first stages",
        ))[f"R@{r3_n}"]
        rerank = [max(("sparse", "dense"), key=lambda n: ceiling[f"{n}-siar-{BEST_MODE[n]}"])]
    # one job for all (again in the same directory: the SIAR stages come from its stage cache)
    runs.update(run_retrieve(_cfg(queries, db, embed, ray, llm, {**siar, **{f"{n}-siar-r3": r3_of[n] for n in rerank}}),
                             out / "retrieve-llm", echo=echo))
    timings["retrieve SIAR + R3"] = time.perf_counter() - t
    metrics = run_evaluate(
        EvaluateConfig(qrels=str(qrels), runs=tuple(map(str, runs.values())), measures=tuple(dict.fromkeys((*MEASURES, f"R@{r3_n}"))),
                       baseline="sparse"),
        out / "evaluate", title="RuleBench ULogic: vanilla, SIAR, SIAR + R3",
    )
    table = summary_frame(metrics)
    manifest = json.loads((out / "retrieve-llm" / "manifest.json").read_text(encoding="utf-8"))
    timings["all"] = time.perf_counter() - t0
    report = _report(table, manifest, out, llm, n_queries, counts, sample, seed, r3_n, rerank, timings)
    write_text_atomic(report, out / "rules_report.md")
    return {"table": table, "report": out / "rules_report.md", "seconds": timings["all"]}


def _cfg(queries: Path, db: str, embed, ray, llm, pipelines: dict) -> RetrieveConfig:
    return RetrieveConfig(queries=str(queries), db=db, embed=embed, ray=ray, llm=llm,
                          pipelines={name: parse_stages(stages) for name, stages in pipelines.items()})


def sample_queries(beir: Path, n: int | None, seed: int, job: str, out: Path | None = None, qrels: str = "qrels/test.tsv") -> tuple[Path, Path]:
    """The queries and qrels of a BEIR directory to run: all of them, or ``n`` drawn with
    ``seed`` (both files cut to the same queries, in ``out``, by default ``<beir>/../sample/``:
    evaluation averages over the qrels' queries)."""
    queries, qrels = beir / "queries.jsonl", beir / qrels
    if n is None:
        return queries, qrels
    rows = qrels.read_text(encoding="utf-8").splitlines()
    judged = {r.split("\t")[0] for r in rows[1:] if r.strip()}
    # drawn among the queries the qrels judge (evaluation averages over those): a BEIR queries
    # file may hold other splits' queries too
    lines = [line for line in queries.read_text(encoding="utf-8").splitlines() if line.strip() and str(json.loads(line)["_id"]) in judged]
    if not 1 <= n <= len(lines):
        flag = "--sample" if job.startswith("bench") else "sample"
        raise UserError(f"{job}: {flag} {n}: must be between 1 and {len(lines)} (the queries the qrels judge)")
    picked = sorted(random.Random(seed).sample(range(len(lines)), n))
    keep = {str(json.loads(lines[i])["_id"]) for i in picked}
    out = out or beir.parent / "sample"
    out_q, out_r = out / "queries.jsonl", out / "qrels.tsv"
    write_text_atomic("".join(lines[i] + "\n" for i in picked), out_q)
    write_text_atomic("\n".join([rows[0], *(r for r in rows[1:] if r.split("\t")[0] in keep)]) + "\n", out_r)
    return out_q, out_r


def _report(table: pd.DataFrame, manifest: dict, out: Path, llm: LLMConfig, n: int, counts: dict, sample, seed, r3_n: int,
            rerank: list[str], timings: dict) -> str:
    def pct(run: str, measure: str) -> str:
        return f"{100 * table.loc[run, measure]:.2f}" if run in table.index else "-"

    lines = [
        "## Rule retrieval: RuleBench ULogic, vanilla / SIAR / SIAR + R3",
        "",
        f"{n} of {counts['queries']} queries" + (f" (a sample drawn with seed {seed})" if sample else "") + f", {counts['rules']:,} rules; "
        f"LLM `{manifest['inputs']['llm']['model']}`. "
        "R@k: the fraction of a query's gold rules in the top k (the paper's main figure is R@1). "
        f"R@{r3_n} of R3's first stage is its ceiling: R3 only reorders the top {r3_n} it is given.",
        "",
        f"| retriever | method | R@1 | R@5 | MRR | R@{r3_n} | paper R@1 (Qwen2.5-72B) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in ("sparse", "dense"):
        p = PAPER_R1[name]
        rows = [
            ("vanilla", name, f"{p[0]:.2f}"),
            ("+SIAR (rule)", f"{name}-siar-rule", f"{p[1]:.2f}" if BEST_MODE[name] == "rule" else ""),
            ("+SIAR (rule + query)", f"{name}-siar-rule+query", f"{p[1]:.2f}" if BEST_MODE[name] == "rule+query" else ""),
        ]
        if name in rerank:
            rows.append((f"+SIAR ({BEST_MODE[name]}) +R3", f"{name}-siar-r3", f"{p[2]:.2f}"))
        for label, run, paper in rows:
            lines.append(f"| {name} | {label} | {pct(run, 'R@1')} | {pct(run, 'R@5')} | {pct(run, 'MRR')} | {pct(run, f'R@{r3_n}')} | {paper} |")
    lines += [
        "",
        f"Vanilla references on the full set (R@1): sparse {REFERENCE_R1['sparse']} (bm25s, Porter stemming, English stop words; "
        f"the paper's sparse: {PAPER_R1['sparse'][0]}), dense {REFERENCE_R1['dense']} (all-MiniLM-L6-v2; the paper's dense model, "
        f"another one, gave {PAPER_R1['dense'][0]}).",
        "",
    ]
    pipes = manifest["pipelines"]
    c = pipes["sparse-siar-rule"]["stages"][0]  # one induction per query, shared by every SIAR pipeline
    lines.append(f"SIAR: {c['by_status']} (a fallback retrieves with the query; none is dropped); "
                 f"{c['prompt_tokens']} prompt tokens, {c['generated_tokens']} generated, {c['llm_cache_hits']} from the LLM cache.")
    for name in rerank:
        c = pipes[f"{name}-siar-r3"]["stages"][-1]
        pq_ = c["per_query"]
        lines.append(f"R3 over {name}: per query {pq_['windows']:g} window(s), {pq_['prompt_tokens']:.0f} prompt tokens "
                     f"({pq_['cached_prompt_tokens']:.0f} from vLLM's prefix cache), {pq_['generated_tokens']:.0f} generated; "
                     f"{c['repaired_windows']} of {c['windows']} windows repaired ({c['duplicate_ids']} repeated, {c['unknown_ids']} unknown, "
                     f"{c['missing_ids']} missing identifiers), {c['error_windows']} failed (kept their order).")
    example = out / "retrieve-llm" / "induced_rules" / "sparse-siar-rule.parquet"
    if example.is_file():
        rows = pq.read_table(example).to_pylist()[:3]
        lines += ["", "Induced rules (first three queries):", ""]
        lines += [f"- `{r['query_id']}` ({r['status']}): {(r['rule'] or r['raw_output'] or '')[:200]!r}" for r in rows]
    lines += [
        "",
        "Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ".",
        "",
    ]
    if "smollm2" in llm.model.lower():
        lines += [
            "**SmolLM2-135M runs the whole path end to end; it is not a rule inducer or a reranker.** The paper's gains "
            "(sparse 68.91 -> 74.82 -> 92.17 and dense 30.36 -> 64.82 -> 88.19 R@1) come from Qwen2.5-72B; measure them with "
            "`logicrank bench-rules PATH --llm-model <checkpoint dir>` on a GPU cluster (docs/rules.md).",
            "",
        ]
    return "\n".join(lines)
