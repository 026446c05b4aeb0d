"""The LLM path measured (not a test): `make bench-llm`, sections chosen with ``--sections``.

    make bench-llm                                   # every section, the default samples (docs/llm.md has the figures)
    .venv/bin/python tests/perf/bench_llm.py --sections decomposition --per-template 10

decomposition  The LLM's ITLR forms for natural-language set-logic questions over LIMIT (exact
               gold; jobs/experiments/setlogic-llm.yaml), and for ITLR's synthetic benchmark's
               questions over SciFact text (one per template, pooled judgements, ITLR over
               dense; jobs/experiments/synthetic-llm.yaml), per model (``--models``: the real
               instruct model, `make models`, and SmolLM2 beside it, the same prompts), on a dev
               split (seed 1: where prompts and examples are designed) and a test split (seed 2,
               questions also in dev removed: only reported). Per split and model: parse rate
               (the raw output parses), form accuracy (equal to the gold form up to term order,
               quoting and case), statuses (ok, degenerate: a term from the prompt's examples or
               a conjunct beside its own negation, fallback: unparsed or cut), then P@1 and
               nDCG@10 of ITLR over BM25 with the model's forms, with the gold forms and BM25 on
               the question, overall and per template; seconds per question. LLM cache off.
truth          Predicate truth scoring where truth is exact (jobs/experiments/setlogic-truth.yaml):
               (candidate, atom) pairs of set-logic questions over LIMIT, BM25's top 10 people,
               "{x} likes <item>" true exactly when the item is on the person's like-list; per
               model and split: ROC AUC and accuracy at 0.5 of P(True) from the LLM and from
               BM25's calibrated score (no LLM) on the same pairs; OrLog's P@1 and nDCG@10 with
               each (the gold atoms and form), OrLog with the LLM's own atom decomposition
               (statuses: ok, degenerate, fallback), the LLM as reasoner, BM25; by template.
labels         The generation recipe's relevance labels (pipelines/generate/realcorpus.py: the
               gen_relevance prompt, documents cut to 320 tokens) on SciFact's own test questions,
               whose qrels give the truth: each sampled question's qrels documents and BM25's top
               3 (bm25s; unjudged documents count as not relevant, SciFact's convention). Per
               model: ROC AUC of P(True), the P(True) range, accuracy and F1 at the recipe's 0.5,
               and a threshold calibrated on half the questions (best F1) and reported on the
               other half.
pool           The job's LLM pool (jobs/llm_service.py, its cache off, its default placement) against
               vLLM's own offline ``LLM.generate`` in a process of its own, the same engine settings
               and prompts, each after its engine started, per model (``--pool-models``): truth
               scoring (SciFact abstracts, 4 statements each: a document's prompts share it as
               a prefix) and ITLR decomposition (set-logic questions, the grammar, greedy).
               Seconds, prompt and generated tokens per second, prefix-cached prompt tokens;
               goal: the pool at 0.9x vLLM's speed or better.
rules          SIAR + R3 on RuleBench's ULogic probing subset (not bundled: ``--rulebench DIR``,
               default $LOGICRANK_RULEBENCH; without it the section is reported not run): rule
               retrieval R@1/R@5 per retriever and the reasoning table (no rule, the gold rule,
               each retriever's top 1), through `logicrank bench-rules --reasoning` in a fresh
               process, the real model (``--rules-sample`` queries).
lag            RAG against LAG on the bundled MuSiQue questions through `logicrank bench-lag`
               in a fresh process, the real model (``--lag-sample`` questions).
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
import pandas as pd
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
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated: {', '.join(SECTIONS)}")
    ap.add_argument("--models", default="qwen2.5-coder-1.5b-instruct,smollm2-135m-instruct", help="decomposition: registered models or checkpoints")
    ap.add_argument("--per-template", type=int, default=10, help="decomposition: questions per template and split (7 templates)")
    ap.add_argument("--splits", default="dev,test", help="decomposition: dev (seed 1), test (seed 2)")
    ap.add_argument("--no-synthetic", dest="synthetic", action="store_false",
                    help="decomposition: skip ITLR's synthetic benchmark (jobs/experiments/synthetic-llm.yaml)")
    ap.add_argument("--truth-per-template", type=int, default=3, help="truth: questions per template and split (7 templates)")
    ap.add_argument("--truth-splits", default="test", help="truth: dev (seed 1), test (seed 2); the test split alone by default (16 min)")
    ap.add_argument("--label-questions", type=int, default=24, help="labels: SciFact test questions (half calibrate, half report)")
    ap.add_argument("--pool-models", default="smollm2-135m-instruct,qwen2.5-coder-1.5b-instruct", help="pool: registered models or checkpoints")
    ap.add_argument("--pool-two-engines", default="smollm2-135m-instruct",
                    help="pool: models also timed on two engines of one core each (each engine holds the whole model)")
    ap.add_argument("--pool-docs", type=int, default=32, help="pool: SciFact documents (x 4 statements) for truth scoring")
    ap.add_argument("--pool-questions", type=int, default=4, help="pool: set-logic questions per template (7 templates) to decompose")
    ap.add_argument("--docs", type=int, default=64, help="throughput: documents (x 4 statements)")
    ap.add_argument("--hf-prompts", type=int, default=64, help="throughput: pairs scored by the per-pair transformers loop")
    ap.add_argument("--no-compiled", action="store_true", help="throughput: skip the compiled start-up (minutes on CPU)")
    ap.add_argument("--rulebench", default=os.environ.get("LOGICRANK_RULEBENCH"),
                    help="rules: RuleBench's ULogic directory as published (default $LOGICRANK_RULEBENCH)")
    ap.add_argument("--rules-sample", type=int, default=8, help="rules: ULogic queries (seed 0)")
    ap.add_argument("--lag-sample", type=int, default=4, help="lag: MuSiQue questions")
    ap.add_argument("--methods-model", default="qwen2.5-coder-1.5b-instruct", help="rules, lag: the model")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"bench_llm: unknown section(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    timed: list[dict] = []
    start = time.perf_counter()
    for name in [s for s in SECTIONS if s in sections]:
        t0 = time.perf_counter()
        note = SECTIONS[name](args)  # why the section did not run or failed, else None
        timed.append({"section": name, "seconds": round(time.perf_counter() - t0, 1), "note": note or ""})
        print(f"bench_llm: {name} {note or 'done'} ({timed[-1]['seconds']:.0f} s)", flush=True)
    timed.append({"section": "total", "seconds": round(time.perf_counter() - start, 1), "note": ""})
    write_report(args.out, "bench_llm_sections", {"sections": timed},
                 ["# `make bench-llm`: each section's wall time, one run", "",
                  *markdown.table(["section", "seconds", "note"], [[t["section"], f"{t['seconds']:.0f}", t["note"]] for t in timed])])


SPLITS = {"dev": 1, "test": 2}  # seeds of the set-logic generator


def canonical(node):
    """A form up to term order, quoting and case: AND/OR children as a sorted tuple."""
    from logicrank.pipelines.retrieval.logic.query import Not, Term

    if isinstance(node, Term):
        return ("term", " ".join(node.text.casefold().split()))
    if isinstance(node, Not):
        return ("not", canonical(node.child))
    return (type(node).__name__, tuple(sorted(canonical(c) for c in node.children)))


def form_figures(decompositions: pa.Table, gold: dict[str, str]) -> dict:
    """Parse rate, form accuracy and statuses of one model's ITLR decompositions."""
    from collections import Counter

    from logicrank.pipelines.retrieval.logic.query import QueryParseError, parse

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


def split_questions(out: Path, splits: list[str], per_template: int) -> dict[str, list[dict]]:
    """Each split's set-logic questions (seed per split); the test split without any question
    text also in dev (only reported, never designed on)."""
    from logicrank.pipelines.files import read_jsonl
    from logicrank.pipelines.generate.setlogic import generate

    questions = {}
    for split in splits:
        generate(out / f"setlogic-{split}", per_template, SPLITS[split])
        questions[split] = [r for _, r in read_jsonl(out / f"setlogic-{split}" / "queries.jsonl", "queries", ValueError)]
    if "test" in splits:  # dev's texts, drawn with its seed even when dev itself is not run
        generate(out / "setlogic-dev", per_template, SPLITS["dev"])
        dev = {r["text"] for _, r in read_jsonl(out / "setlogic-dev" / "queries.jsonl", "queries", ValueError)}
        questions["test"] = [q for q in questions["test"] if q["text"] not in dev]
    return questions


def decomposition(args) -> None:
    from logicrank.jobs.experiment import run_experiment
    from logicrank.pipelines.evaluation.experiment import load, override

    out = Path(args.out) / "bench_llm_decomposition"
    splits = [x.strip() for x in args.splits.split(",") if x.strip()]
    kept = split_questions(out, splits, args.per_template)
    result: dict = {"per_template": args.per_template, "splits": {s: {"seed": SPLITS[s], "questions": len(kept[s])} for s in splits},
                    "rows": []}
    from logicrank.pipelines.files import read_jsonl

    cases = [(split, "setlogic-llm", {"dataset.setlogic": {"per_template": args.per_template, "seed": SPLITS[split]},
                                      "dataset.query_ids": [q["_id"] for q in kept[split]]}, "bm25") for split in splits]
    if args.synthetic:  # ITLR's synthetic benchmark over SciFact text, one question per template, against dense on the question
        cases.append(("synthetic", "synthetic-llm", {}, "dense"))
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        for split, name, changes, question_run in cases:
            exp = override(load(name), changes) if changes else load(name)
            where = out / f"{model.replace('/', '_')}-{split}"
            t = time.perf_counter()
            res = run_experiment(exp, where, llm=LLMConfig(model=model, cache=None), ray=RayConfig(num_cpus=len(os.sched_getaffinity(0))),
                                 progress=False)
            seconds = time.perf_counter() - t
            [path] = list((where / "retrieve").rglob("decompositions/itlr-llm.parquet")) or [None]
            if path is None:
                raise SystemExit(f"bench_llm: no decompositions table under {where / 'retrieve'}")
            gold = {str(q["_id"]): q["logical_query"] for _, q in read_jsonl(where / "data" / "queries.jsonl", "queries", ValueError)}
            forms = form_figures(pq.read_table(path), gold)
            summary = res.summary
            by_template = res.groups.get("template") if "template" in res.groups else res.groups.get("negations")
            timings = json.loads((where / "retrieve" / "manifest.json").read_text())["timings_s"]
            stage_s = sum(v for key, v in timings.items() if key.startswith("decomposition:"))
            row = {"model": model, "split": split, "question_run": question_run, **forms, "seconds": seconds, "decomposition_s": stage_s,
                   "runs": {rid: {m: float(summary.loc[rid, m]) for m in summary.columns} for rid in summary.index},
                   "by_template": None if by_template is None else by_template.reset_index().to_dict(orient="records")}
            result["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("by_template",)}, indent=1), flush=True)
    lines = [f"# LLM decomposition into ITLR forms: LIMIT set-logic, {args.per_template} per template and split"
             + ("; ITLR's synthetic benchmark, one question per template" if args.synthetic else ""), ""]
    lines += markdown.table(
        ["model", "split", "questions", "parse rate", "form accuracy", "ok / degenerate / fallback", "P@1 llm", "P@1 gold",
         "P@1 question (bm25 / dense)", "nDCG@10 llm", "nDCG@10 gold", "nDCG@10 question", "decomposition s"],
        [[r["model"], r["split"], str(r["questions"]), f"{r['parse_rate']:.2f}", f"{r['form_accuracy']:.2f}",
          " / ".join(str(r["status"].get(k, 0)) for k in ("ok", "degenerate", "fallback")),
          *(f"{r['runs'][rid]['P@1']:.3f}" for rid in ("itlr-llm", "itlr-gold", r["question_run"])),
          *(f"{r['runs'][rid]['nDCG@10']:.3f}" for rid in ("itlr-llm", "itlr-gold", r["question_run"])),
          f"{r['decomposition_s']:.0f}"] for r in result["rows"]],
        align="llrrrrrrrrrrr")
    write_report(args.out, "bench_llm_decomposition", result, lines)


def roc_auc(scores, labels) -> float | None:
    """P(a true pair scores above a false one), ties counting half (Mann-Whitney U); None
    without both classes."""
    from scipy.stats import rankdata

    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if not pos or not neg:
        return None
    return float((rankdata(scores)[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def pair_truth(scores: pa.Table, data: Path) -> pd.DataFrame:
    """The predicate scores of gold atoms ("{x} likes <item>") with their exact truth: the item
    is on the candidate's like-list (the set-logic corpus, verbatim LIMIT)."""
    from logicrank.pipelines.files import read_jsonl
    from logicrank.pipelines.generate.setlogic import parse_likes

    likes = {d["_id"]: set(parse_likes(d["title"], d["text"])) for _, d in read_jsonl(data / "corpus.jsonl", "corpus", ValueError)}
    df = scores.to_pandas()
    items = df["atom"].str.removeprefix("{x} likes ")
    if (items == df["atom"]).any():
        raise SystemExit(f"bench_llm: an atom that is not '{{x}} likes <item>': {df['atom'][items == df['atom']].iloc[0]!r}")
    return df.assign(true=[item in likes[d] for d, item in zip(df["doc_id"], items, strict=True)])


TRUTH_RUNS = ("orlog-llm", "orlog-llm-atoms", "orlog-bm25", "reasoner", "bm25")


def truth(args) -> None:
    from collections import Counter

    from logicrank.jobs.experiment import run_experiment
    from logicrank.pipelines.evaluation.experiment import load, override

    out = Path(args.out) / "bench_llm_truth"
    splits = [x.strip() for x in args.truth_splits.split(",") if x.strip()]
    kept = split_questions(out, splits, args.truth_per_template)
    result: dict = {"per_template": args.truth_per_template, "depth": 10,
                    "splits": {s: {"seed": SPLITS[s], "questions": len(kept[s])} for s in splits}, "rows": []}
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        for split in splits:
            exp = override(load("setlogic-truth"), {"dataset.setlogic": {"per_template": args.truth_per_template, "seed": SPLITS[split]},
                                                    "dataset.query_ids": [q["_id"] for q in kept[split]]})
            where = out / f"{model.replace('/', '_')}-{split}"
            t = time.perf_counter()
            res = run_experiment(exp, where, llm=LLMConfig(model=model, cache=None), ray=RayConfig(num_cpus=len(os.sched_getaffinity(0))),
                                 progress=False)
            seconds = time.perf_counter() - t
            pairs = {}
            for rid, scorer in (("orlog-llm", "llm"), ("orlog-bm25", "bm25")):
                df = pair_truth(pq.read_table(where / "retrieve" / "predicate_scores" / f"{rid}.parquet"), where / "data")
                pairs[scorer] = {"pairs": len(df), "true": int(df["true"].sum()), "auc": roc_auc(df["p_true"], df["true"]),
                                 "accuracy_at_0.5": float(((df["p_true"] > 0.5) == df["true"]).mean())}
            atoms = pq.read_table(where / "retrieve" / "decompositions" / "orlog-llm-atoms.parquet").to_pylist()
            timings = json.loads((where / "retrieve" / "manifest.json").read_text())["timings_s"]
            by_template = res.groups.get("template")
            row = {"model": model, "split": split, "questions": len(kept[split]), "seconds": seconds, "pairs": pairs,
                   "atoms_status": dict(Counter(r["status"] for r in atoms)),
                   "atoms_examples": [{"query_id": r["query_id"], "status": r["status"], "raw_output": r["raw_output"], "error": r["error"]}
                                      for r in atoms if r["status"] != "ok"][:5],
                   "runs": {rid: {m: float(res.summary.loc[rid, m]) for m in res.summary.columns} for rid in res.summary.index},
                   "by_template": None if by_template is None else by_template.reset_index().to_dict(orient="records"),
                   "stage_s": {k: v for k, v in timings.items() if k.split(":")[0] in ("orlog", "reasoner", "decomposition")}}
            result["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "by_template"}, indent=1), flush=True)
    lines = [f"# LLM truth scoring: LIMIT set-logic, {args.truth_per_template} per template and split, BM25's top 10", ""]
    lines += markdown.table(
        ["model", "split", "questions", "pairs (true)", "AUC llm", "AUC bm25", "acc@0.5 llm", "acc@0.5 bm25",
         *(f"P@1 {rid}" for rid in TRUTH_RUNS), "atoms ok / degenerate / fallback", "seconds"],
        [[r["model"], r["split"], str(r["questions"]), f"{r['pairs']['llm']['pairs']} ({r['pairs']['llm']['true']})",
          *(f"{r['pairs'][s]['auc']:.3f}" if r["pairs"][s]["auc"] is not None else "-" for s in ("llm", "bm25")),
          *(f"{r['pairs'][s]['accuracy_at_0.5']:.3f}" for s in ("llm", "bm25")),
          *(f"{r['runs'][rid]['P@1']:.3f}" for rid in TRUTH_RUNS),
          " / ".join(str(r["atoms_status"].get(k, 0)) for k in ("ok", "degenerate", "fallback")), f"{r['seconds']:.0f}"]
         for r in result["rows"]],
        align="llrrrrrrrrrrrrr")
    for r in result["rows"]:
        if r["by_template"]:
            p1 = pd.DataFrame(r["by_template"]).pivot_table(index="template", columns="run_id", values="P@1", sort=False)
            n = pd.DataFrame(r["by_template"]).groupby("template", sort=False)["queries"].max()
            lines += ["", f"## {r['model']}, {r['split']}: P@1 by template", ""]
            lines += markdown.table(["template", "questions", *TRUTH_RUNS],
                                    [[t, str(n[t]), *(f"{p1.loc[t, rid]:.3f}" for rid in TRUTH_RUNS)] for t in p1.index],
                                    align="lr" + "r" * len(TRUTH_RUNS))
    write_report(args.out, "bench_llm_truth", result, lines)


def label_pairs(n_questions: int, depth: int = 3, seed: int = 0) -> pd.DataFrame:
    """(question, document, relevant) pairs on SciFact's test questions: each sampled
    question's qrels documents and BM25's top ``depth``; half the questions (``half``) calibrate."""
    import random

    import bm25s

    from logicrank.pipelines.files import read_jsonl
    from logicrank.pipelines.io import read_qrels

    data = scifact()
    docs = {}
    with gzip.open(data.corpus, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            docs[d["_id"]] = f"{d.get('title') or ''}. {d['text']}".strip(". ")
    qrels = read_qrels(data.qrels).to_pandas()
    relevant = qrels[qrels["relevance"] > 0].groupby("query_id")["doc_id"].apply(set).to_dict()
    questions = {str(r["_id"]): r["text"] for _, r in read_jsonl(data.queries, "queries", ValueError) if str(r["_id"]) in relevant}
    chosen = random.Random(seed).sample(sorted(questions), min(n_questions, len(questions)))
    ids = list(docs)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([docs[d] for d in ids], stopwords="en", show_progress=False), show_progress=False)
    hits, _ = retriever.retrieve(bm25s.tokenize([questions[q] for q in chosen], stopwords="en", show_progress=False), k=depth,
                                 show_progress=False)
    rows = []
    for n, (q, top) in enumerate(zip(chosen, hits, strict=True)):
        for d in sorted(relevant[q] | {ids[i] for i in top}):
            rows.append({"query_id": q, "question": questions[q], "doc_id": d, "document": docs[d], "relevant": d in relevant[q],
                         "half": "calibrate" if n % 2 == 0 else "report"})
    return pd.DataFrame(rows)


def _f1(pred, gold) -> float:
    tp = int((pred & gold).sum())
    return 2 * tp / max(int(pred.sum()) + int(gold.sum()), 1)


def labels(args) -> None:
    from logicrank.jobs.llm_service import LLMService
    from logicrank.jobs.raysession import ray_session

    pairs = label_pairs(args.label_questions)
    template = prompts.load("gen_relevance")
    cpus = len(os.sched_getaffinity(0))
    rows = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        cfg = LLMConfig(model=model, cache=None)
        resolved = resolve(cfg.model)
        cut = prompts.cut_to_tokens(str(resolved.path), dict(zip(pairs["doc_id"], pairs["document"], strict=True)), 320)  # the recipe's document_tokens
        t = time.perf_counter()
        with ray_session(RayConfig(num_cpus=cpus)):
            service = LLMService(cfg)
            res = service.truth(template, [{"document": cut[d], "question": q} for d, q in zip(pairs["doc_id"], pairs["question"], strict=True)])
            service.close()
        seconds = time.perf_counter() - t
        df = pairs.assign(p_true=[r.p_true for r in res])
        cal, rep = df[df["half"] == "calibrate"], df[df["half"] == "report"]
        grid = sorted(set(cal["p_true"]))
        best = max(grid, key=lambda th: (_f1(cal["p_true"].to_numpy() >= th, cal["relevant"].to_numpy()), -th))
        gold = rep["relevant"].to_numpy()
        row = {"model": resolved.model_id, "questions": int(df["query_id"].nunique()), "pairs": len(df), "relevant": int(df["relevant"].sum()),
               "auc": roc_auc(df["p_true"], df["relevant"]), "p_true_min": float(df["p_true"].min()),
               "p_true_median": float(df["p_true"].median()), "p_true_max": float(df["p_true"].max()),
               "judged_relevant_at_0.5": int((df["p_true"] >= 0.5).sum()), "threshold": float(best), "seconds": seconds,
               "report_pairs": len(rep), "report_relevant": int(gold.sum())}
        for name, th in (("0.5", 0.5), ("calibrated", best)):
            pred = rep["p_true"].to_numpy() >= th
            row[f"report_accuracy_{name}"] = float((pred == gold).mean())
            row[f"report_f1_{name}"] = _f1(pred, gold)
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
    lines = [f"# Relevance labels against SciFact's qrels ({args.label_questions} test questions: qrels documents + BM25's top 3)", ""]
    lines += markdown.table(
        ["model", "pairs (relevant)", "AUC", "P(True) min / median / max", "relevant at 0.5", "calibrated threshold",
         "acc 0.5 / calibrated", "F1 0.5 / calibrated", "seconds"],
        [[r["model"], f"{r['pairs']} ({r['relevant']})", f"{r['auc']:.3f}",
          f"{r['p_true_min']:.2f} / {r['p_true_median']:.2f} / {r['p_true_max']:.2f}", str(r["judged_relevant_at_0.5"]), f"{r['threshold']:.3f}",
          f"{r['report_accuracy_0.5']:.3f} / {r['report_accuracy_calibrated']:.3f}", f"{r['report_f1_0.5']:.3f} / {r['report_f1_calibrated']:.3f}",
          f"{r['seconds']:.0f}"] for r in rows],
        align="lrrrrrrrr")
    lines += ["", "Threshold: best F1 on the calibrating half of the questions; accuracy and F1 on the other half."]
    write_report(args.out, "bench_llm_labels", {"rows": rows, "questions": args.label_questions}, lines)


def _rates(seconds: float, results) -> dict:
    prompt = sum(r.prompt_tokens for r in results)
    generated = sum(getattr(r, "generated_tokens", 1) for r in results)  # a truth prompt: one forward pass, no decoding
    return {"seconds": seconds, "prompts": len(results), "prompt_tokens": prompt, "generated_tokens": generated,
            "cached_prompt_tokens": sum(r.cached_prompt_tokens for r in results),
            "prompt_tokens_per_s": prompt / seconds, "generated_tokens_per_s": generated / seconds}


def _bare_vllm(cfg: LLMConfig, truth_texts: list[str], decompose_texts: list[str], max_tokens: int) -> dict:
    """vLLM's own ``LLM.generate`` on the pool's prompts, in this process (a fresh one: see
    :func:`pool`): the rates of each task after the engine started, the outputs to compare."""
    from logicrank.pipelines.llm.engine import Constraint, Engine, label_logits, p_true
    from logicrank.pipelines.retrieval.logic.grammar import to_gbnf

    resolved = resolve(cfg.model)
    engine = Engine(cfg.model_copy(update={"model": str(resolved.path)}), resolved).start()
    from vllm import SamplingParams  # after the engine set vLLM's environment (configure_vllm_env)

    llm = engine.llm
    llm.generate(truth_texts[:1], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    t = time.perf_counter()
    outs = llm.generate(truth_texts, SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(engine.label_ids)), use_tqdm=False)
    seconds = time.perf_counter() - t
    truth = [{"prompt_tokens": len(o.prompt_token_ids), "cached_prompt_tokens": int(o.num_cached_tokens or 0), "generated_tokens": 1}
             for o in outs]
    p = [p_true(*label_logits({tid: lp.logprob for tid, lp in o.outputs[0].logprobs[0].items()}, engine.label_ids)[:2]) for o in outs]
    chats = [engine.wrap(text) for text in decompose_texts]
    grammar = Constraint("grammar", to_gbnf(None))
    t = time.perf_counter()
    outs = llm.generate(chats, SamplingParams(max_tokens=max_tokens, temperature=0.0, structured_outputs=grammar.to_vllm()), use_tqdm=False)
    gen_seconds = time.perf_counter() - t
    gen = [{"prompt_tokens": len(o.prompt_token_ids), "cached_prompt_tokens": int(o.num_cached_tokens or 0),
            "generated_tokens": len(o.outputs[0].token_ids)} for o in outs]
    return {"truth": (seconds, truth), "p_true": p, "decompose": (gen_seconds, gen), "texts": [o.outputs[0].text for o in outs]}


def _in_fresh_process(fn, *args):
    """``fn(*args)`` in a spawned process, which returns its memory when it exits. A vLLM
    engine deleted in a process keeps most of its memory there, so a bare engine measured in
    the bench's own process left the next model's pool to run beside it, short of memory."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        return ex.submit(fn, *args).result()


def pool(args) -> None:
    """The pool against bare vLLM, per model and task (module docstring). Each side runs in
    its own processes (the pool's engine in its actor, vLLM's in a spawned process), one after
    the other, so neither runs beside the other's memory."""
    from logicrank.jobs.llm_service import LLMService
    from logicrank.jobs.raysession import ray_session
    from logicrank.pipelines.llm.engine import Constraint
    from logicrank.pipelines.retrieval.logic.grammar import to_gbnf

    out = Path(args.out) / "bench_llm_pool"
    questions = split_questions(out, ["dev"], args.pool_questions)["dev"]
    table = truth_prompts(args.pool_docs)
    truth_values = [{"context": c, "statement": s} for c, s in zip(table.column("context").to_pylist(), table.column("statement").to_pylist(), strict=True)]
    decompose_values = [{"question": q["text"]} for q in questions]
    truth_t, decompose_t = prompts.load("truth"), prompts.load("itlr_decompose")
    grammar = Constraint("grammar", to_gbnf(None))
    max_tokens = 96  # jobs/experiments/setlogic-llm.yaml's
    cpus = len(os.sched_getaffinity(0))
    rows = []
    for model in [m.strip() for m in args.pool_models.split(",") if m.strip()]:
        cfg = LLMConfig(model=model, cache=None)
        resolved = resolve(cfg.model)
        row: dict = {"model": resolved.model_id, "truth_prompts": len(truth_values), "decompositions": len(decompose_values)}
        for actors in (1, 2) if model in args.pool_two_engines.split(",") else (1,):
            with ray_session(RayConfig(num_cpus=cpus)):
                service = LLMService(cfg.model_copy(update={"actors": actors}))
                service.truth(truth_t, truth_values[:1])  # the pool placed and one engine started
                import ray

                ray.get([a.call.remote("truth", truth_t, truth_values[:1], {}, service.cfg.cache, "bench") for a in service._actors])  # every engine started, untimed
                t = time.perf_counter()
                truth_out = service.truth(truth_t, truth_values)
                truth_s = time.perf_counter() - t
                t = time.perf_counter()
                gen_out = service.generate(decompose_t, decompose_values, constraint=grammar, max_tokens=max_tokens)
                gen_s = time.perf_counter() - t
                stats = service.close()
            side = "pool" if actors == 1 else "pool2"  # pool2: two engines, the cores shared between them
            row[f"{side}_truth"], row[f"{side}_decompose"], row[side] = _rates(truth_s, truth_out), _rates(gen_s, gen_out), stats
            if actors == 1:
                pool_truth, pool_gen = truth_out, gen_out
        bare = _in_fresh_process(_bare_vllm, cfg, [truth_t.render(**v) for v in truth_values],
                                 [decompose_t.render(**v) for v in decompose_values], max_tokens)
        for task in ("truth", "decompose"):
            seconds, results = bare[task]
            row[f"bare_{task}"] = _rates(seconds, [type("R", (), r)() for r in results])
        row["same_decompositions"] = sum(g.text == text for g, text in zip(pool_gen, bare["texts"], strict=True))
        row["max_abs_p_true_diff"] = float(max(abs(r.p_true - p) for r, p in zip(pool_truth, bare["p_true"], strict=True)))
        for task in ("truth", "decompose"):
            row[f"ratio_{task}"] = row[f"bare_{task}"]["seconds"] / row[f"pool_{task}"]["seconds"]  # the pool's speed over vLLM's
            if f"pool2_{task}" in row:
                row[f"ratio2_{task}"] = row[f"bare_{task}"]["seconds"] / row[f"pool2_{task}"]["seconds"]
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
    lines = [f"# The LLM pool against vLLM's own LLM.generate ({cpus} CPUs; each after its engine started; one run)", ""]
    lines += markdown.table(
        ["model", "task", "prompts", "pool s", "vLLM s", "pool / vLLM speed (goal >= 0.9)", "prompt tok/s pool", "prompt tok/s vLLM",
         "generated tok/s pool", "generated tok/s vLLM", "prefix-cached prompt tokens pool / vLLM"],
        [[r["model"], task, str(r[f"pool_{task}"]["prompts"]), f"{r[f'pool_{task}']['seconds']:.1f}", f"{r[f'bare_{task}']['seconds']:.1f}",
          f"{r[f'ratio_{task}']:.2f}", *(f"{r[f'{side}_{task}'][k]:.0f}" for k in ("prompt_tokens_per_s",) for side in ("pool", "bare")),
          *(f"{r[f'{side}_{task}']['generated_tokens_per_s']:.1f}" for side in ("pool", "bare")),
          f"{r[f'pool_{task}']['cached_prompt_tokens']} / {r[f'bare_{task}']['cached_prompt_tokens']}"]
         for r in rows for task in ("truth", "decompose")],
        align="llrrrrrrrrr")
    two = [r for r in rows if "pool2_truth" in r]
    if two:
        lines += ["", "Two engines of one core each (the same pool, actors 2) against the same vLLM figures: " + "; ".join(
            f"{r['model']}: truth {r['pool2_truth']['seconds']:.1f} s ({r['ratio2_truth']:.2f}x vLLM), decompose "
            f"{r['pool2_decompose']['seconds']:.1f} s ({r['ratio2_decompose']:.2f}x)" for r in two)]
    lines += ["", "Same outputs: " + "; ".join(f"{r['model']}: {r['same_decompositions']} of {r['decompositions']} decompositions equal, "
                                               f"max |P(True) pool - vLLM| {r['max_abs_p_true_diff']:.1e}" for r in rows)]
    write_report(args.out, "bench_llm_pool", {"rows": rows, "cpus": cpus}, lines)


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


def _cli(*argv: str) -> str | None:
    """A logicrank command in a fresh process, as a user runs it; its output passes through.
    Returns why it failed (its exit status), or None: the bench goes on to its other sections."""
    done = subprocess.run([str(Path(sys.executable).with_name("logicrank")), *argv])
    return f"failed: `logicrank {argv[0]}` exited {done.returncode}" if done.returncode else None


def rules(args) -> str | None:
    if not args.rulebench:
        return "not run: set LOGICRANK_RULEBENCH (or --rulebench) to RuleBench's ULogic directory (not bundled: docs/llm.md)"
    return _cli("bench-rules", args.rulebench, "--sample", str(args.rules_sample), "--reasoning", "--llm-model", args.methods_model,
                "--llm-cache", "none", "--out", str(Path(args.out) / "bench_llm_rules"))


def lag(args) -> str | None:
    return _cli("bench-lag", "musique", "--sample", str(args.lag_sample), "--llm-model", args.methods_model,
                "--llm-cache", "none", "--out", str(Path(args.out) / "bench_llm_lag"))


# section name -> function (in the order they run); a function returns why it did not run or failed, or None
SECTIONS = {"decomposition": decomposition, "truth": truth, "labels": labels, "pool": pool, "rules": rules, "lag": lag,
            "throughput": throughput}


if __name__ == "__main__":
    main()
