"""The main job: index bundled SciFact, retrieve with dense / BM25 / hybrid, evaluate; then
ITLR's synthetic logical benchmark (base vs ITLR vs calibrated ITLR, both settings), the
LLM path on SmolLM2 over 4 of its questions, rule retrieval (SIAR + R3) on a 6-query sample of RuleBench ULogic
when its directory is given (``LOGICRANK_RULEBENCH``; the set is not bundled), and LAG on the
bundled MuSiQue set (the LLM-free oracle table on all 100 questions, then RAG vs LAG with
SmolLM2 on a sample), set-logic queries over LIMIT with exact gold (dense, bm25, ITLR with the
gold logical query, OrLog with gold atoms), and a small demo of ITLR's real-corpus dataset
generation over the SciFact index (SmolLM2: a demo, not a benchmark).

Every section but the generation demo (a `generate` job) is an experiment file
(jobs/experiments/: scifact.yaml, whose reference is dense nDCG@10 of all-MiniLM-L6-v2 on
SciFact, published by MTEB as 0.645; itlr-synthetic.yaml and itlr-synthetic-own.yaml with
Table 1's runs, itlr-llm.yaml, rulebench-siar.yaml, lag-oracle.yaml, lag.yaml and
setlogic.yaml on the samples below, as the bench commands run them: pipelines/evaluation/benchmarks.py).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from logicrank.jobs.experiment import run_experiment
from logicrank.jobs.raysession import ray_session
from logicrank.pipelines.config.settings import EmbedConfig, LLMConfig, RayConfig
from logicrank.pipelines.datasets import scifact
from logicrank.pipelines.evaluation import benchmarks
from logicrank.pipelines.evaluation.experiment import EXPERIMENTS, load
from logicrank.pipelines.files import write_text_atomic

# The SmolLM2 samples, small so that the job fits 15 minutes on 2 cores (docs/main-job.md); the
# LLM-free sections run whole, and the bench commands run the same experiment files on the whole sets.
RULES_SAMPLE = 6  # queries of the rules section (`logicrank bench-rules`: all 830)
RULES_R3_N = 10  # R3 reorders the top 10 here (20 in the benchmark)
SETLOGIC_PER_TEMPLATE = 2  # LIMIT set-logic queries per QUEST template (`logicrank bench-setlogic`: 20)
SETLOGIC_ORLOG_DEPTH = 5  # OrLog reranks bm25's top 5 here (20 in the benchmark): R@5 and F1@5 then compare 5 with 5
GENERATE_DOCS = 4  # the generation demo: one shard of 4 SciFact documents
GENERATE_QUESTIONS = 2  # ... and 2 questions drafted from it
LAG_SAMPLE = 3  # MuSiQue questions of the LAG section's RAG and LAG rows (the oracle table and `logicrank bench-lag`: all 100)


def run_main(out: str | Path, embed: EmbedConfig, ray: RayConfig, progress: bool = True, echo=print, rulebench: str | None = None) -> dict:
    """``rulebench``: RuleBench ULogic's directory (None or "": the rules section is skipped, and
    the report says how to get the set)."""
    with ray_session(ray):  # one cluster for every index run
        return _run_main(Path(out), embed, ray, progress, echo, rulebench or None)


def _run_main(out: Path, embed: EmbedConfig, ray: RayConfig, progress: bool, echo, rulebench: str | None) -> dict:
    exp = load(EXPERIMENTS / "scifact.yaml")
    db = str(out / "lancedb")
    marks = [("retrieval", time.perf_counter())]  # each section's start: the times printed at the end
    echo(f"[1/9] index {scifact().corpus} -> {db}; [2/9] retrieve 300 queries: dense, bm25, hybrid; [3/9] evaluate "
         "(experiment jobs/experiments/scifact.yaml)")
    res = run_experiment(exp, out, embed, ray, strict=False, progress=progress)
    summary = res.index
    echo(f"      {summary.inserted} inserted, {summary.updated} updated, {summary.unchanged} unchanged, "
         f"{summary.deleted} deleted, {summary.rejected} rejected in {summary.seconds:.1f} s (table v{summary.table_version})")
    ndcg = res.summary["nDCG@10"].to_dict()
    for rid, v in ndcg.items():
        echo(f"      nDCG@10 {rid:7s} {v:.4f}")
    check = res.checks[0]  # dense against MTEB's published figure
    reproduced = check.ok
    echo(f"      dense vs published MTEB {check.reference.value}: {check.got:.4f} -> "
         f"{'reproduced' if reproduced else 'NOT reproduced'} (tolerance {check.reference.tolerance})")
    marks.append(("itlr", time.perf_counter()))
    echo("[4/9] ITLR synthetic logical benchmark (32 templates x 10 queries from SciFact text), pooled and own settings "
         "(experiments jobs/experiments/itlr-synthetic.yaml, itlr-synthetic-own.yaml; the operator ablation: `logicrank bench-itlr`)")
    itlr = [run_experiment(exp, out / "itlr" / exp.name, embed, ray, strict=False, progress=False, index_dir=out / "itlr")
            for exp in benchmarks.itlr(operators=False)]
    for res in itlr:
        by = res.groups["negations"]["nDCG@10"]
        for rid in ("base", "itlr"):
            setting = "own" if res.experiment.name.endswith("-own") else "pooled"
            echo(f"      {setting:6s} {rid:5s} nDCG@10 by negations 0/1/2/3: " + "/".join(f"{by[rid, str(n)]:.3f}" for n in range(4)))
    marks.append(("llm", time.perf_counter()))
    echo("[5/9] LLM decomposition -> ITLR, OrLog and the reasoner on 4 of its questions (SmolLM2-135M on vLLM: plumbing, not quality) "
         "(experiment jobs/experiments/itlr-llm.yaml)")
    llm = run_experiment(load(EXPERIMENTS / "itlr-llm.yaml"), out / "llm", embed, ray, local_llm(), strict=False, progress=False, index_dir=out / "itlr")
    echo(f"      SmolLM2's logical queries by status: {llm.stages['llm-itlr'][0].get('by_status')} (a fallback keeps the question as one term)")
    for rid, v in llm.summary["nDCG@10"].items():
        echo(f"      nDCG@10 {rid:14s} {v:.4f}")
    marks.append(("rules", time.perf_counter()))
    rules = rules_section(out / "rules", rulebench, embed, ray, echo)
    marks.append(("lag", time.perf_counter()))
    lag = _lag(out / "lag", embed, ray, echo)
    marks.append(("set-logic", time.perf_counter()))
    setlogic, setlogic_all = _setlogic(out / "setlogic", embed, ray, echo)
    marks.append(("generate", time.perf_counter()))
    demo = _generate_demo(out / "generate", db, embed, ray, echo)
    marks.append(("", time.perf_counter()))
    write_entry_page(out, "\n".join(section_of(res.report) for res in (*itlr, llm)), rules, lag["report"], setlogic, demo)
    echo("time by section: " + ", ".join(f"{name} {end - start:.0f} s" for (name, start), (_, end) in zip(marks, marks[1:], strict=False)))
    echo(f"report: {out / 'report.md'}")
    if not lag["reproduced"]:
        echo("      LAG oracle: NOT reproduced (see the table above)")
    return {"index": asdict(summary), "ndcg@10": ndcg, "reproduced": reproduced and lag["reproduced"], "llm": llm.summary["nDCG@10"].to_dict(), "rules": rules,
            "lag_oracle": lag["oracle"], "setlogic": setlogic_all}


def local_llm() -> LLMConfig:
    """The embedded LLM (SmolLM2) as one engine on up to 8 of the running cluster's CPUs."""
    import ray

    cpus = float(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1.0
    return LLMConfig(cpus_per_actor=min(cpus, 8.0))


def rules_section(out: Path, rulebench: str | None, embed: EmbedConfig, ray: RayConfig, echo) -> str:
    """The main job's rules section (markdown): rulebench-siar.yaml on a sample of RuleBench
    ULogic at ``rulebench`` (its directory), or, when the set is not given or not found, one line
    saying why and how to get it (nothing is run and ``out`` is not made)."""
    from logicrank.pipelines.datasets.rulebench import ENV, OBTAIN, RuleBenchError, find_files

    echo(f"[6/9] rule retrieval (RuleBench, {RULES_SAMPLE}-query sample): vanilla, SIAR, SIAR + R3 with SmolLM2 "
         "(experiment jobs/experiments/rulebench-siar.yaml)")
    why = f"{ENV} is not set" if not rulebench else None
    if rulebench:
        try:
            find_files(rulebench)
        except RuleBenchError as exc:
            why = f"{ENV}={rulebench}: {exc}"
    if why:
        line = f"Rule retrieval (SIAR + R3): skipped, {why}. {OBTAIN} as {ENV}=DIR."
        echo(f"      {line}")
        return f"## Rule retrieval\n\n{line}\n"
    res = run_experiment(benchmarks.rules(rulebench, sample=RULES_SAMPLE, r3_n=RULES_R3_N), out, embed, ray, local_llm(), strict=False, progress=False)
    for rid, v in res.summary["R@1"].items():
        echo(f"      R@1 {rid:24s} {100 * v:.2f}")
    return section_of(res.report)


def _lag(out: Path, embed: EmbedConfig, ray: RayConfig, echo) -> dict:
    """The LAG section: the oracle table on every MuSiQue question (lag-oracle.yaml), RAG vs
    LAG with SmolLM2 on a sample (lag.yaml; the ablations are in `logicrank bench-lag`), over
    one index."""
    echo(f"[7/9] LAG on MuSiQue (bundled): gold-chain oracle (100 questions, no LLM), then RAG vs LAG with SmolLM2 ({LAG_SAMPLE} questions) "
         "(experiments jobs/experiments/lag-oracle.yaml, lag.yaml)")
    oracle, llm_rows = (run_experiment(exp, out / exp.name, embed, ray, local_llm(), strict=False, progress=False, index_dir=out)
                        for exp in benchmarks.lag("musique", sample=LAG_SAMPLE, runs=("rag", "lag")))
    for c in oracle.checks:
        echo(f"      oracle {c.reference.run:18s} recall {c.got:.4f} (reference {c.reference.value}: {'reproduced' if c.ok else 'NOT reproduced'})")
    table = llm_rows.summary
    for rid in table.index:
        echo(f"      {rid:18s} Acc {100 * table.loc[rid, 'Acc']:.1f}  EM {100 * table.loc[rid, 'EM']:.1f}  chain recall {table.loc[rid, 'R@100']:.4f}")
    return {"oracle": oracle.summary["R@100"].to_dict(), "reproduced": oracle.reproduced, "report": section_of(oracle.report) + "\n" + section_of(llm_rows.report)}


def _setlogic(out: Path, embed: EmbedConfig, ray: RayConfig, echo) -> tuple[str, dict]:
    """The set-logic section: setlogic.yaml on a sample (markdown, and each run's figures)."""
    echo(f"[8/9] set-logic queries over LIMIT (exact gold, {SETLOGIC_PER_TEMPLATE} per QUEST template): dense, bm25, ITLR (gold form) over "
         f"dense, BM25 and hybrid evidence, OrLog (gold atoms, P(True) from SmolLM2 and from BM25, top {SETLOGIC_ORLOG_DEPTH}) "
         "(experiment jobs/experiments/setlogic.yaml)")
    res = run_experiment(benchmarks.setlogic(per_template=SETLOGIC_PER_TEMPLATE, sets={f"{rid}/{stage}.k": SETLOGIC_ORLOG_DEPTH for rid in ("orlog", "orlog-bm25") for stage in ("bm25", "orlog")}), out, embed, ray, local_llm(),
                         strict=False, progress=False)
    for rid, row in res.summary.iterrows():
        echo(f"      {rid:6s} P@1 {row['P@1']:.3f}  R@5 {row['R@5']:.3f}  nDCG@10 {row['nDCG@10']:.3f}")
    return section_of(res.report), {f"{rid} {measure}": float(v) for rid, row in res.summary.iterrows() for measure, v in row.items()}


def _generate_demo(out: Path, db: str, embed: EmbedConfig, ray: RayConfig, echo) -> str:
    from logicrank.jobs.generate import DEMO_NOTE, run_generate
    from logicrank.pipelines.config.settings import GenerateConfig

    echo(f"[9/9] dataset generation demo: ITLR's real-corpus recipe on {GENERATE_DOCS} SciFact documents with SmolLM2 (a demo, not a benchmark)")
    cfg = GenerateConfig(db=db, docs=GENERATE_DOCS, shard_docs=GENERATE_DOCS, questions_per_shard=GENERATE_QUESTIONS, candidate_k=3, document_tokens=128,
                         embed=embed, ray=ray, llm=local_llm().model_copy(update={"cpus_per_actor": 1.0}),  # one CPU left for the retrievers: the pool stays up
                         demo_note=DEMO_NOTE)
    shutil.rmtree(out, ignore_errors=True)  # a demo: regenerated each run (a re-indexed table is a new version, which a resume refuses)
    c = run_generate(cfg, out, echo=lambda m: None)
    echo(f"      {c['questions']} questions, {c['labels']['pairs']} pairs judged, {c['labels']['relevant']} relevant; card: {out / 'card.md'}")
    return demo_section(out)


# ------------------------------------------------------------------ the entry page
def section_of(report: Path) -> str:
    """An experiment's report (its ``report.md``) as a section of the main job's entry page."""
    return report.read_text(encoding="utf-8").replace("# ", "## ", 1)


def demo_section(out: Path) -> str:
    """The generation demo's section of the entry page: the dataset's card at ``out`` and its
    first questions (logical form -> question)."""
    rows = [json.loads(line) for line in (out / "queries.jsonl").read_text(encoding="utf-8").splitlines()[:4]]
    examples = [f"- `{r['logical_query']}` -> {r['text']!r} ({r['status']})" for r in rows]
    card = (out / "card.md").read_text(encoding="utf-8").replace(f"# Generated dataset: {out.name}", "## Dataset generation demo", 1)
    return card + "\nFirst questions (logical form -> question):\n\n" + "\n".join(examples) + "\n"


def write_entry_page(out: Path, itlr: str, rules: str, lag: str, setlogic: str, demo: str) -> None:
    """One entry page, ``out/report.md``: the retrieval report (``out/evaluate/report.md``), the
    ITLR tables and the LLM path, rule retrieval, LAG, set-logic queries over LIMIT, the
    generation demo."""
    retrieval = (out / "evaluate" / "report.md").read_text(encoding="utf-8").replace("](plots/", "](evaluate/plots/")
    write_text_atomic("\n".join((retrieval, itlr, rules, lag, setlogic, demo)), out / "report.md")
