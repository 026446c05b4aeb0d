"""The main job's LLM stage: decompose ITLR benchmark questions with the embedded SmolLM2,
then retrieve with ITLR on the model's logical queries, beside ITLR on the gold logical
queries, dense retrieval of the question and the reasoning-expansion baseline.

SmolLM2-135M is here to run the whole path (prepare -> vLLM on a Ray actor -> grammar-
constrained decoding -> decompositions table -> ITLR) on a laptop. Its numbers measure the
plumbing, not what an LLM decomposition is worth: for that, point ``--model`` at a real
instruction model on a GPU cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.decompose import run_decompose
from jobs.evaluate import run_evaluate
from jobs.retrieve import run_retrieve
from pipelines.config import RetrieveConfig
from pipelines.evaluate.report import summary_frame
from pipelines.files import write_parquet_atomic, write_text_atomic
from pipelines.logic.query import parse, relabel, to_text
from pipelines.topics import read_queries
from schemas.config import DecomposeConfig, EmbedConfig, EvaluateConfig, LLMConfig, RayConfig
from schemas.tables import DECOMPOSITIONS

# the main job's sample, small for the job's 15 minutes (SmolLM2 runs the path here, it measures nothing)
# the first question of 8 of the ITLR benchmark's 32 templates (pipelines/generate/synthetic.py, TEMPLATES:
# 8 per operator pair, in the order AND AND, AND OR, OR AND, OR OR): two per operator pair, 0 to 3 negations
QUESTION_TEMPLATES = (0, 7, 9, 14, 19, 20, 24, 31)
RERANK_DEPTH = 5  # OrLog and the LLM-as-reasoner rerank dense's top 5: each of those runs is a 5-document list
METHODS = ("itlr", "reasoning")  # the kinds the runs below read (OrLog's rows use gold atoms: SmolLM2 writes no usable ones)


def run_llm_demo(out: Path, syn: Path, db: Path, embed: EmbedConfig, ray: RayConfig, templates: tuple[int, ...] = QUESTION_TEMPLATES,
                 echo=print) -> dict:
    """``syn``: the ITLR benchmark's generated set (pipelines/generate/synthetic.py), ``db``
    its LanceDB table; the first question of each template numbered in ``templates`` is asked."""
    rows = [json.loads(line) for line in (syn / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    keep = [r for r in rows if r["_id"].endswith("-000") and int(r["_id"].split("-")[1]) in templates]  # syn-TT-RRR
    queries = out / "queries.jsonl"
    write_text_atomic("".join(json.dumps(r) + "\n" for r in keep), queries)
    # ground truth over the pooled corpus (the benchmark's "pooled" setting): a document is
    # relevant when the gold formula holds for the topics it contains, whichever question made it
    asked = {r["_id"] for r in keep}
    pooled = (syn / "qrels" / "pooled.tsv").read_text(encoding="utf-8").splitlines()
    qrels = out / "qrels.tsv"
    write_text_atomic("\n".join([pooled[0], *(line for line in pooled[1:] if line.split("\t")[0] in asked)]) + "\n", qrels)

    llm_cfg = local_llm()
    cfg = DecomposeConfig(queries=str(queries), llm=llm_cfg, ray=ray, methods=METHODS, max_tokens={"itlr": 160, "reasoning": 128})
    echo(f"      decompose {len(keep)} questions with {cfg.llm.model} ({', '.join(METHODS)})")
    dec = run_decompose(cfg, out / "decompose", echo=echo)
    echo(f"      {dec.by_status}; " + ("unchanged inputs: skipped" if dec.skipped else f"{dec.prompts_run} prompts run, {dec.cache_hits} from cache"))
    db = str(db)
    gold = run_retrieve(RetrieveConfig.preset(("dense", "itlr"), "gold", queries=str(queries), db=db, k=100, embed=embed, ray=ray), out / "retrieve-gold")
    llm = run_retrieve(
        RetrieveConfig.preset(("itlr", "expansion"), "smollm2", queries=str(queries), db=db, k=100, embed=embed, decompositions=str(dec.path), ray=ray),
        out / "retrieve-llm",
    )
    # OrLog with gold atoms (one per benchmark term; SmolLM2 writes no usable atoms) and the
    # LLM-as-reasoner baseline, both reranking dense's top RERANK_DEPTH, SmolLM2 as the scorer
    gold_dec = write_parquet_atomic(gold_orlog_decompositions(read_queries(queries)), out / "orlog_gold_decompositions.parquet")
    echo(f"      OrLog (gold atoms) and LLM-as-reasoner over dense's top {RERANK_DEPTH}, P(True) from {cfg.llm.model}")
    top = f"top{RERANK_DEPTH}"
    orl = run_retrieve(
        RetrieveConfig.preset(
            ("dense", "orlog", "reasoner"), top, queries=str(queries), db=db, k=RERANK_DEPTH, embed=embed,
            decompositions=str(gold_dec), orlog_base="dense", orlog_k=RERANK_DEPTH, orlog_context_tokens=128, llm=llm_cfg, ray=ray,
        ),
        out / "retrieve-orlog",
    )
    runs = [gold["gold-dense"], gold["gold-itlr"], llm["smollm2-itlr"], llm["smollm2-expansion"], *(orl[f"{top}-{m}"] for m in ("dense", "orlog", "reasoner"))]
    metrics = run_evaluate(
        EvaluateConfig(qrels=str(qrels), runs=tuple(str(p) for p in runs)), out / "evaluate",
        title="LLM decomposition -> ITLR (SmolLM2-135M, plumbing only)",
    )
    ndcg = summary_frame(metrics)["nDCG@10"].to_dict()
    manifest = json.loads((out / "retrieve-orlog" / "manifest.json").read_text())
    report = _report(len(keep), dec, ndcg, cfg) + _orlog_report(ndcg, manifest)
    write_text_atomic(report, out / "llm_report.md")
    return {"ndcg@10": ndcg, "by_status": dec.by_status, "report": out / "llm_report.md"}


def local_llm() -> LLMConfig:
    """The embedded LLM (SmolLM2) as one engine on up to 8 of the running cluster's CPUs."""
    import ray

    cpus = float(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1.0
    return LLMConfig(cpus_per_actor=min(cpus, 8.0))


def gold_orlog_decompositions(queries: pa.Table) -> pa.Table:
    """OrLog rows from the benchmark's gold logical queries: one atom per term
    ("{x} discusses: <term>") and the same formula over the atom ids."""
    rows = []
    for qid, logical in zip(queries.column("query_id").to_pylist(), queries.column("logical_query").to_pylist(), strict=True):
        ast = parse(logical)
        ids = {t: f"a{i + 1}" for i, t in enumerate(ast.terms())}
        rows.append({
            "query_id": qid, "method": "orlog", "model": "gold", "prompt_sha": "-", "raw_output": None,
            "logical_query": to_text(relabel(ast, ids)), "atoms": [{"id": a, "text": f"{{x}} discusses: {t}"} for t, a in ids.items()],
            "expansion": None, "status": "ok", "error": None, "finish_reason": None, "prompt_tokens": 0, "generated_tokens": 0, "cached": False,
        })
    return pa.Table.from_pylist(rows, schema=DECOMPOSITIONS)


def _orlog_report(ndcg: dict[str, float], manifest: dict) -> str:
    top = f"top{RERANK_DEPTH}"
    o, r = (manifest["pipelines"][f"{top}-{m}"]["stages"][-1] for m in ("orlog", "reasoner"))  # the reranker's cost counts
    lines = [
        "",
        "### OrLog (gold atoms) and LLM-as-reasoner, SmolLM2 as the True/False scorer",
        "",
        f"Both rerank dense's top {RERANK_DEPTH} of each question (so each of these three runs is a {RERANK_DEPTH}-document list, "
        "scored by nDCG@10 against the same ground truth as the rows above); OrLog's atoms are the benchmark's gold terms "
        "(`{x} discusses: <term>`), its form the gold formula, its posterior exact. SmolLM2's True/False "
        "judgements are near chance, so **quality needs a real model**; the cost columns are what this shows.",
        "",
        "| run | nDCG@10 |",
        "|---|---:|",
        *[f"| {rid} | {ndcg[rid]:.3f} |" for rid in (f"{top}-dense", f"{top}-orlog", f"{top}-reasoner") if rid in ndcg],
        "",
        "| cost per (question, candidate) pair | OrLog | LLM-as-reasoner |",
        "|---|---:|---:|",
        f"| forward passes | {o['forward_passes_per_pair']:.1f} | {r['forward_passes_per_pair']:.1f} |",
        f"| generated tokens (paper: OrLog 5.8, reasoner 35-55) | {o['generated_tokens_per_pair']:.1f} | {r['generated_tokens_per_pair']:.1f} |",
        f"| prompt tokens | {o['prompt_tokens'] / o['pairs']:.0f} | {r['prompt_tokens'] / r['pairs']:.0f} |",
        f"| of which from vLLM's prefix cache | {o['prefix_cached_tokens'] / max(o['prompt_tokens'], 1):.0%} | "
        f"{r['prefix_cached_tokens'] / max(r['prompt_tokens'], 1):.0%} |",
        "",
        "Our reasoner baseline reads one True/False token per pair instead of generating a rationale, so it is "
        "cheaper than the paper's; OrLog's cost is one pass per atom.",
    ]
    return "\n".join(lines) + "\n"


def _report(n: int, dec, ndcg: dict[str, float], cfg: DecomposeConfig) -> str:
    manifest = json.loads((dec.path.parent / "manifest.json").read_text())
    table = pq.read_table(dec.path).to_pandas()
    status = table.groupby(["method", "status"]).size().unstack(fill_value=0)
    labels = {
        "gold-dense": "dense retrieval of the question (base)",
        "gold-itlr": "ITLR on the gold logical queries",
        "smollm2-itlr": "ITLR on SmolLM2's logical queries",
        "smollm2-expansion": "dense retrieval of SmolLM2's reasoning (expansion baseline)",
    }
    lines = [
        "## LLM decomposition -> ITLR (SmolLM2-135M-Instruct: plumbing and demo only)",
        "",
        f"{n} questions of the ITLR benchmark above (the first of each of {n} templates: two per operator pair, 0 to 3 negations), decomposed by `{manifest['model']}` on vLLM "
        f"(CPU, one Ray actor), then retrieved over the pooled benchmark corpus and judged by its ground truth "
        "(a document is relevant when the gold formula holds for the topics it contains). A 135M model copies its prompt's "
        "examples more than it reads the question: **these numbers show that the path runs end to end, not what "
        "an LLM decomposition is worth.** Point `--model` at a real instruction model (e.g. Qwen2.5-7B-Instruct "
        "on a GPU node) for that.",
        "",
        "| run | nDCG@10 |",
        "|---|---:|",
        *[f"| {labels[rid]} | {v:.3f} |" for rid, v in ndcg.items() if rid in labels],
        "",
        "Decomposition rows by status (a fallback carries the raw question; none is dropped):",
        "",
        "| method | " + " | ".join(status.columns) + " |",
        "|---|" + "---:|" * len(status.columns),
        *[f"| {m} | " + " | ".join(str(int(v)) for v in row) + " |" for m, row in status.iterrows()],
        "",
        f"Tokens: {manifest['prompt_tokens']} prompt, {manifest['generated_tokens']} generated, "
        f"{manifest['prompts_run']} prompts run, {manifest['cache_hits']} from the LLM cache; decompose stage "
        f"{manifest['timings_s'].get('decompose', 0):.0f} s. Templates: "
        + ", ".join(f"`{m}` {sha}" for m, sha in manifest["prompt_sha"].items()) + ".",
        "",
        "Examples (first three questions):",
        "",
    ]
    for qid in table["query_id"].drop_duplicates().head(3):
        r = table[(table["query_id"] == qid) & (table["method"] == "itlr")].iloc[0]
        lines.append(f"- `{qid}` itlr ({r['status']}): `{str(r['logical_query'])[:200]}`")
    return "\n".join(lines) + "\n"
