"""The LAG benchmark on a bundled multi-hop set (MuSiQue, HotpotQA): everything through
logicrank's own jobs (prepare-qa, index, retrieve with one LLM pool for every LAG stage,
evaluate with QA and retrieval measures).

- **Oracle** (MuSiQue; no LLM): the gold sub-questions and sub-answers through the same
  chain code, measuring LAG's retrieval mechanism alone: the whole question's top 5 x hops,
  the gold chain with previous answers in the retrieval text, without them (placeholders left
  in), and in random order; supporting-paragraph recall (the share of a question's gold
  paragraphs in the chain's passages), beside the issue's reference computation.
- **LLM** (any set): standard RAG (top 5 for the whole question, one answer), LAG, and the
  paper's two ablations (no previous answer in the retrieval text; random sub-question
  order): EM, token F1, contain-match accuracy (and the LLM judge when asked), chain recall,
  stop reasons and steps per question.

Documents are embedded as "title. text" (``title_sep ". "``), the recipe of the reference
computation (a space, logicrank's BEIR default, gives 0.7125 / 0.9008 / 0.6792 there).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.evaluate import run_evaluate
from jobs.index import run_index
from jobs.retrieve import run_retrieve
from jobs.rules_bench import sample_queries
from pipelines.config import RetrieveConfig
from pipelines.datasets.qa import to_beir
from pipelines.evaluate.report import summary_frame
from pipelines.files import write_parquet_atomic, write_text_atomic
from pipelines.pipeline import parse_stages
from schemas.config import EmbedConfig, EvaluateConfig, IndexConfig, LLMConfig, RayConfig

TITLE_SEP = ". "
# the reference computation (all-MiniLM-L6-v2 over MuSiQue's 1,890 paragraphs)
REFERENCE = {"question": 0.697, "gold-chain": 0.894, "gold-no-answer": 0.677}
TOLERANCE = 0.01  # the issue's: reproduce each within 0.01
# the paper (GPT-4o-mini): contain-match / judged accuracy, LAG and plain top-5 retrieval; MuSiQue ablations (accuracy)
PAPER = {"hotpotqa": {"lag": (68.3, 69.4), "rag": (54.6, 56.8)}, "musique": {"lag": (42.8, 43.5), "rag": (25.6, 29.0)}}
PAPER_ABLATIONS = {"lag-random-order": 35.1, "lag-no-answer": 33.5}
RECALL = "R@100"  # every chain holds fewer than 100 passages: the whole chain's supporting-paragraph recall
ORACLE = {"plan": "gold", "sub_answers": "gold", "synthesis": False, "min_support": None, "redundancy": None, "t_max": None}
LLM_RUNS = ("rag", "lag", "lag-no-answer", "lag-random-order")


def run_lag_bench(name: str, out: str | Path, embed: EmbedConfig, ray: RayConfig, llm: LLMConfig | None, sample: int | None = None,
                  seed: int = 0, judge: bool = False, llm_runs: tuple[str, ...] = LLM_RUNS, echo=print) -> dict:
    """``llm`` None: the oracle table alone (MuSiQue). ``sample``: the LLM rows on that many
    questions drawn with ``seed`` (the oracle always runs on every question). ``llm_runs``:
    which of RAG, LAG and the ablations to run."""
    out = Path(out)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    beir = out / "beir"
    counts = to_beir(name, beir)
    embed = embed.model_copy(update={"title_sep": TITLE_SEP})
    db = str(out / "lancedb")
    s = run_index(IndexConfig(corpus=str(beir / "corpus.jsonl"), db=db, embed=embed, ray=ray), out / "index", progress=False)
    timings["index"] = s.seconds
    echo(f"      {counts['docs']:,} paragraphs indexed, {counts['queries']} questions")
    oracle = None
    if name == "musique":
        t = time.perf_counter()
        oracle = _oracle(beir, db, embed, ray, out)
        timings["oracle"] = time.perf_counter() - t
        for rid, v in oracle.items():
            echo(f"      oracle {rid:22s} recall {v:.4f}" + (f" (reference {REFERENCE[rid]}: {_verdict(v, REFERENCE[rid])})" if rid in REFERENCE else ""))
    table = manifest = None
    n_llm = 0
    if llm is not None:
        t = time.perf_counter()
        queries, qrels = sample_queries(beir, sample, seed, job="bench-lag")
        n_llm = len(queries.read_text(encoding="utf-8").splitlines())
        gold = _cut_gold(beir / "answers.jsonl", queries, out / "sample" / "answers.jsonl") if sample else beir / "answers.jsonl"
        pipelines = {
            "rag": [{"lag": {"plan": "question", "synthesis": False, "min_support": None}}],
            "lag": [{"lag": {}}],
            "lag-no-answer": [{"lag": {"retrieval_text": "question"}}],
            "lag-random-order": [{"lag": {"order": "random", "seed": seed}}],
        }
        pipelines = {rid: pipelines[rid] for rid in llm_runs}
        echo(f"      {', '.join(llm_runs)} with {llm.model} on {n_llm} questions")
        cfg = RetrieveConfig(queries=str(queries), db=db, embed=embed, ray=ray, llm=llm,
                             pipelines={rid: parse_stages(stages) for rid, stages in pipelines.items()})
        runs = run_retrieve(cfg, out / "retrieve-llm", echo=echo)
        timings["LAG (LLM)"] = time.perf_counter() - t
        answers = tuple(str(out / "retrieve-llm" / "answers" / f"{rid}.parquet") for rid in llm_runs)
        metrics = run_evaluate(
            EvaluateConfig(qrels=str(qrels), runs=tuple(str(runs[r]) for r in llm_runs), measures=(RECALL,), answers=answers, gold=str(gold),
                           qa_measures=("EM", "TokenF1", "Acc", *(("Judge",) if judge else ())), judge=llm if judge else None, ray=ray, baseline="rag"),
            out / "evaluate-llm", title=f"{name}: RAG vs LAG ({llm.model})",
        )
        table = summary_frame(metrics)
        manifest = json.loads((out / "retrieve-llm" / "manifest.json").read_text(encoding="utf-8"))
    timings["all"] = time.perf_counter() - t0
    report = _report(name, counts, oracle, table, manifest, out, llm, n_llm, sample, seed, timings)
    write_text_atomic(report, out / "lag_report.md")
    reproduced = None if oracle is None else all(abs(oracle[r] - ref) <= TOLERANCE for r, ref in REFERENCE.items())
    return {"oracle": oracle, "reproduced": reproduced, "table": table, "report": out / "lag_report.md", "seconds": timings["all"]}


def _verdict(value: float, reference: float) -> str:
    return "reproduced" if abs(value - reference) <= TOLERANCE else f"NOT reproduced (tolerance {TOLERANCE})"


def _oracle(beir: Path, db: str, embed: EmbedConfig, ray: RayConfig, out: Path) -> dict[str, float]:
    """Supporting-paragraph recall of the LLM-free chains on every question."""
    pipelines = {
        "question": [{"dense": {"k": 20}}],  # cut below to 5 x hops per question
        "gold-chain": [{"lag": dict(ORACLE, gold=str(beir / "answers.jsonl"))}],
        "gold-no-answer": [{"lag": dict(ORACLE, gold=str(beir / "answers.jsonl"), retrieval_text="question")}],
        "gold-random-order": [{"lag": dict(ORACLE, gold=str(beir / "answers.jsonl"), order="random")}],
    }
    runs = run_retrieve(RetrieveConfig(queries=str(beir / "queries.jsonl"), db=db, embed=embed, ray=ray,
                                       pipelines={rid: parse_stages(st) for rid, st in pipelines.items()}), out / "retrieve-oracle")
    hops = {}
    for line in (beir / "answers.jsonl").read_text(encoding="utf-8").splitlines():
        a = json.loads(line)
        hops[a["query_id"]] = len(a["decomposition"])
    question = pq.read_table(runs["question"])
    keep = pc.less_equal(question.column("rank"), pa.array([5 * hops[q] for q in question.column("query_id").to_pylist()], pa.int32()))
    cut = out / "retrieve-oracle" / "runs" / "question-top5xhops.parquet"
    write_parquet_atomic(question.filter(keep), cut)
    paths = {"question": cut, **{rid: runs[rid] for rid in pipelines if rid != "question"}}
    metrics = run_evaluate(EvaluateConfig(qrels=str(beir), runs=tuple(str(p) for p in paths.values()), measures=(RECALL,), baseline="question"),
                           out / "evaluate-oracle", title="MuSiQue: LAG's retrieval with gold sub-questions and answers (no LLM)")
    return summary_frame(metrics)[RECALL].to_dict()


def _cut_gold(gold: Path, queries: Path, to: Path) -> Path:
    keep = {json.loads(line)["_id"] for line in queries.read_text(encoding="utf-8").splitlines()}
    lines = [line for line in gold.read_text(encoding="utf-8").splitlines() if json.loads(line)["query_id"] in keep]
    write_text_atomic("".join(line + "\n" for line in lines), to)
    return to


def _report(name: str, counts: dict, oracle: dict | None, table: pd.DataFrame | None, manifest: dict | None, out: Path,
            llm: LLMConfig | None, n_llm: int, sample, seed, timings: dict) -> str:
    title = {"musique": "MuSiQue", "hotpotqa": "HotpotQA"}[name]
    lines = [f"## LAG: {title} ({counts['queries']} questions, {counts['docs']:,} paragraphs)", ""]
    if oracle is not None:
        lines += [
            "### Retrieval with gold sub-questions and answers (no LLM)",
            "",
            "The gold decomposition fed through the LAG stage's own chain code (`plan: gold, sub_answers: gold`, terminators off): "
            "the ceiling a model's decomposition can reach. Supporting-paragraph recall: the share of a question's gold paragraphs "
            "among the chain's passages (top 5 per step, union), averaged over all questions; all-MiniLM-L6-v2, documents embedded as "
            "\"title. text\".",
            "",
            f"| retrieval | recall | reference | within {TOLERANCE} |",
            "|---|---:|---:|---|",
        ]
        labels = {"question": "whole question, top 5 x hops", "gold-chain": "gold chain, previous answer in the retrieval text (LAG)",
                  "gold-no-answer": "gold sub-questions, placeholders left in, no answers", "gold-random-order": "gold chain in random order"}
        for rid, label in labels.items():
            ref = REFERENCE.get(rid)
            lines.append(f"| {label} | {oracle[rid]:.4f} | {ref if ref is not None else ''} | {_verdict(oracle[rid], ref) if ref is not None else ''} |")
        lines.append("")
    if table is not None:
        stops, steps = _chain_stats(out / "retrieve-llm", list(table.index))
        paper_acc = {rid: acc for rid, (acc, _judged) in PAPER.get(name, {}).items()} | (PAPER_ABLATIONS if name == "musique" else {})
        lines += [
            f"### RAG vs LAG with `{manifest['inputs']['llm']['model']}`",
            "",
            f"{n_llm} questions" + (f" (a sample drawn with seed {seed})" if sample else "") + ". EM and token F1 after SQuAD's "
            "normalisation; Acc: contain-match accuracy (the paper's); recall: supporting-paragraph recall of the whole chain.",
            "",
            "| run | EM | TokenF1 | Acc | " + ("Judge | " if "Judge" in table.columns else "") + "recall | steps / question | stop reasons | paper Acc |",
            "|---|---:|---:|---:|" + ("---:|" if "Judge" in table.columns else "") + "---:|---:|---|---:|",
        ]
        for rid in table.index:
            row = table.loc[rid]
            judge = f"{100 * row['Judge']:.1f} | " if "Judge" in table.columns else ""
            ref = paper_acc.get(rid)
            lines.append(f"| {rid} | {100 * row['EM']:.1f} | {100 * row['TokenF1']:.1f} | {100 * row['Acc']:.1f} | {judge}{row[RECALL]:.4f} | "
                         f"{steps[rid]:.2f} | {_fmt_counts(stops[rid])} | {ref if ref is not None else ''} |")
        lines.append("")
        if "lag" in manifest["pipelines"]:
            lag_counts = manifest["pipelines"]["lag"]["stages"][0]
            lines += [f"LAG's plans: {lag_counts['plan_status']}; steps: {lag_counts['step_status']}.", ""]
        example = out / "retrieve-llm" / "lag_steps" / "lag.parquet"
        if example.is_file():
            rows = pq.read_table(example).to_pylist()[:4]
            lines += ["Steps (first rows):", ""]
            lines += [f"- `{r['query_id']}` step {r['step']}: {r['sub_question'][:120]!r} -> {r['sub_answer']!r} ({r['status']})" for r in rows]
            lines.append("")
        if llm is not None and "smollm2" in llm.model.lower():
            lines += [
                "**SmolLM2-135M runs the whole path end to end (plumbing); it is not a multi-hop reader, so no quality claim comes "
                "from these rows.** The paper's figures (GPT-4o-mini, contain-match / judged accuracy: HotpotQA 68.3 / 69.4, 2Wiki "
                "71.3 / 64.0, MuSiQue 42.8 / 43.5; plain top-5 retrieval 54.6 / 56.8, 46.6 / 45.3, 25.6 / 29.0) need a real model: "
                f"`logicrank bench-lag {name} --llm-model <checkpoint dir> --gpus-per-actor 1 --judge` on a GPU node (docs/lag.md)."
                + (" As a judge, SmolLM2 says True to most pairs whatever they hold: its Judge column is plumbing too." if "Judge" in table.columns else ""),
                "",
            ]
    lines += ["Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ".", ""]
    return "\n".join(lines)


def _chain_stats(rundir: Path, run_ids: list[str]) -> tuple[dict[str, Counter], dict[str, float]]:
    stops, steps = {}, {}
    for rid in run_ids:
        t = pq.read_table(rundir / "answers" / f"{rid}.parquet", columns=["stop_reason", "steps"])
        stops[rid] = Counter(t.column("stop_reason").to_pylist())
        steps[rid] = float(pc.mean(t.column("steps")).as_py() or 0.0)
    return stops, steps


def _fmt_counts(c: Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in c.most_common())
