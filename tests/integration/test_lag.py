"""LAG end to end on a slice of the bundled MuSiQue set, through prepare-qa's loader, index,
retrieve and evaluate: the oracle chain against a brute-force recomputation of its recipe,
and the LLM chain on the tiny random model (outputs are random, so the assertions are on
structure: every question one answer row, the step budget, the counts)."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.retrieval.methods.lag import LAG_ANSWERS, LAG_STEPS
from tests.compare import close
from tests.integration.conftest import RAY

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kept_engines")]  # jobs join the session's cluster, LLM pools kept between them (conftest.py)

QUESTIONS = 8
SEP = ". "


@pytest.fixture(scope="module")
def musique_slice(tmp_path_factory):
    """The first 8 questions, over their gold paragraphs plus the corpus's first 150."""
    from logicrank.jobs.index import run_index
    from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig
    from logicrank.pipelines.datasets.qa import to_beir

    root = tmp_path_factory.mktemp("musique")
    to_beir("musique", root / "full")
    answers = [json.loads(line) for line in (root / "full" / "answers.jsonl").read_text().splitlines()[:QUESTIONS]]
    keep_q = {a["query_id"] for a in answers}
    gold_docs = {s["doc_id"] for a in answers for s in a["decomposition"]}
    docs = [json.loads(line) for line in (root / "full" / "corpus.jsonl").read_text().splitlines()]
    docs = [d for i, d in enumerate(docs) if i < 150 or d["_id"] in gold_docs]
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (beir / "answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    queries = [line for line in (root / "full" / "queries.jsonl").read_text().splitlines() if json.loads(line)["_id"] in keep_q]
    (beir / "queries.jsonl").write_text("\n".join(queries) + "\n")
    qrels = (root / "full" / "qrels" / "test.tsv").read_text().splitlines()
    (beir / "qrels" / "test.tsv").write_text("\n".join([qrels[0], *(r for r in qrels[1:] if r.split("\t")[0] in keep_q)]) + "\n")
    embed = EmbedConfig(title_sep=SEP)
    run_index(IndexConfig(corpus=str(beir / "corpus.jsonl"), db=str(root / "db"), embed=embed, ray=RAY), root / "index")
    return root, beir, embed, answers, docs


ORACLE = {"plan": "gold", "sub_answers": "gold", "synthesis": False, "min_support": None, "redundancy": None, "t_max": None}


def test_the_oracle_chain_retrieves_what_its_recipe_says(musique_slice, tmp_path):
    """Gold sub-questions and answers through the stage equal a brute-force recomputation:
    exact cosine top 5 per step over every document, with 'A_i: <answer>, Q_{i+1}: <filled>'
    (or the sub-question as written), the union in the order found."""
    import re

    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.engines.embed import Embedder
    from logicrank.pipelines.retrieval.pipeline import parse_stages

    root, beir, embed, answers, docs = musique_slice
    gold = str(beir / "answers.jsonl")
    pipelines = {"chain": [{"lag": dict(ORACLE, gold=gold)}], "no-answer": [{"lag": dict(ORACLE, gold=gold, retrieval_text="question")}]}
    cfg = RetrieveConfig(queries=str(beir / "queries.jsonl"), db=str(root / "db"), embed=embed, ray=RAY,
                         pipelines={rid: parse_stages(st) for rid, st in pipelines.items()})
    out = tmp_path / "r"
    runs = run_retrieve(cfg, out)
    assert json.loads((out / "manifest.json").read_text())["llm"] is None

    enc = Embedder(embed)
    mat = enc.encode([f"{d['title']}{SEP}{d['text']}" if d["title"] else d["text"] for d in docs])
    ids = [d["_id"] for d in docs]
    for rid, with_answer in (("chain", True), ("no-answer", False)):
        run = pq.read_table(runs[rid]).to_pylist()
        for a in answers:
            steps, found, step_scores = a["decomposition"], [], []
            for i, st in enumerate(steps):
                filled = re.sub(r"#(\d+)", lambda m, s=steps: s[int(m.group(1)) - 1]["answer"], st["question"])
                text = (filled if i == 0 else f"A_{i}: {steps[i - 1]['answer']}, Q_{i + 1}: {filled}") if with_answer else st["question"]
                scores = mat @ enc.encode([text])[0]
                new = [ids[j] for j in np.argsort(-scores, kind="stable")[:5] if ids[j] not in found]
                found += new
                step_scores += [dict(zip(ids, scores.tolist(), strict=True))] * len(new)
            got = [r["doc_id"] for r in sorted((r for r in run if r["query_id"] == a["query_id"]), key=lambda r: r["rank"])]
            assert len(got) == len(found), (rid, a["query_id"])
            for g, f, sc in zip(got, found, step_scores, strict=True):  # a swap only inside a tie (the encoders' batches differ)
                assert g == f or close(sc[g], sc[f]), (rid, a["query_id"], g, f)
        steps_table = pq.read_table(out / "lag_steps" / f"{rid}.parquet")
        assert steps_table.schema == LAG_STEPS and steps_table.num_rows == sum(len(a["decomposition"]) for a in answers)
        assert set(steps_table.column("status").to_pylist()) == {"answered"}

    # supporting-paragraph recall through evaluate equals the share of gold paragraphs in the chain
    from logicrank.jobs.evaluate import run_evaluate
    from logicrank.pipelines.config.settings import EvaluateConfig
    from logicrank.pipelines.evaluation.report import summary_frame

    metrics = summary_frame(run_evaluate(EvaluateConfig(qrels=str(beir), runs=(str(runs["chain"]),), measures=("R@100",)), tmp_path / "e"))
    run = pq.read_table(runs["chain"]).to_pylist()
    expected = np.mean([len({s["doc_id"] for s in a["decomposition"]} & {r["doc_id"] for r in run if r["query_id"] == a["query_id"]})
                        / len({s["doc_id"] for s in a["decomposition"]}) for a in answers])
    assert metrics.loc["chain", "R@100"] == pytest.approx(expected)


def test_the_llm_chain_on_the_tiny_model_keeps_every_question_and_its_budget(musique_slice, tiny_cfg, tmp_path):
    from logicrank.jobs.evaluate import run_evaluate
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.config.settings import EvaluateConfig
    from logicrank.pipelines.evaluation.report import summary_frame
    from logicrank.pipelines.retrieval.pipeline import parse_stages

    root, beir, embed, answers, _ = musique_slice
    short = {"decompose_tokens": 64, "answer_tokens": 8, "passage_tokens": 32}
    pipelines = {
        "lag": [{"lag": dict(short, t_max=2)}],
        "rag": [{"lag": dict(short, plan="question", synthesis=False, min_support=None)}],
        # gold plan, LLM answers, one step allowed, no stop but the budget: every (2+ hop) chain stops there
        "budget": [{"lag": dict(short, plan="gold", gold=str(beir / "answers.jsonl"), t_max=1, min_support=None, redundancy=None,
                                stop_unanswerable=False, synthesis=False)}],
    }
    cfg = RetrieveConfig(queries=str(beir / "queries.jsonl"), db=str(root / "db"), embed=embed, ray=RAY, llm=tiny_cfg,
                         pipelines={rid: parse_stages(st) for rid, st in pipelines.items()})
    out = tmp_path / "r"
    run_retrieve(cfg, out)
    qids = [a["query_id"] for a in answers]
    order = sorted(qids)  # queries.jsonl's order
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["llm"]["pools"] == 1  # one pool for the three pipelines
    for rid in pipelines:
        ans = pq.read_table(out / "answers" / f"{rid}.parquet")
        steps = pq.read_table(out / "lag_steps" / f"{rid}.parquet")
        assert ans.schema == LAG_ANSWERS and sorted(ans.column("query_id").to_pylist()) == order  # one row each, whatever stopped it
        assert steps.num_rows == sum(ans.column("steps").to_pylist())
        assert set(ans.column("stop_reason").to_pylist()) <= {"done", "no_support", "unanswerable", "redundant", "budget", "error"}
        assert all(a is not None for a in ans.column("answer").to_pylist())
        counts = next(s for s in manifest["pipelines"][rid]["stages"] if s["stage"] == "lag")
        assert sum(counts["stop_reasons"].values()) == len(qids)
    lag_ans = pq.read_table(out / "answers" / "lag.parquet").to_pylist()
    assert max(a["steps"] for a in lag_ans) <= 2 and {a["plan_status"] for a in lag_ans} <= {"ok", "fallback"}
    rag = pq.read_table(out / "answers" / "rag.parquet").to_pylist()
    assert all(a["steps"] == 1 and a["stop_reason"] == "done" for a in rag)
    budget = pq.read_table(out / "answers" / "budget.parquet").to_pylist()
    assert all(a["steps"] == 1 and a["stop_reason"] == "budget" for a in budget)  # every question here has 2+ hops
    # a later step retrieves with the previous answer
    for st in pq.read_table(out / "lag_steps" / "lag.parquet").to_pylist():
        if st["step"] > 1:
            assert st["retrieval_text"].startswith("A_")

    # QA and retrieval measures on the same run ids, in one evaluation
    metrics = summary_frame(run_evaluate(
        EvaluateConfig(qrels=str(beir), runs=(str(out / "runs" / "lag.parquet"), str(out / "runs" / "rag.parquet")), measures=("R@100",),
                       answers=(str(out / "answers" / "lag.parquet"), str(out / "answers" / "rag.parquet")), gold=str(beir),
                       qa_measures=("EM", "TokenF1", "Acc", "Judge"), judge=tiny_cfg, ray=RAY),
        tmp_path / "e"))
    assert list(metrics.index) == ["lag", "rag"] and list(metrics.columns) == ["R@100", "EM", "TokenF1", "Acc", "Judge"]
    assert metrics.notna().all().all()
    judged = pq.read_table(tmp_path / "e" / "metrics.parquet").to_pandas()
    judged = judged[(judged.measure == "Judge") & (judged.query_id != "all")]
    assert len(judged) == 2 * len(qids) and set(judged.value) <= {0.0, 1.0}  # one True/False verdict per question and run
    # the judge's engine: the retrieve job's, kept for it (the module's jobs run as an experiment runs them)
    judge = json.loads((tmp_path / "e" / "manifest.json").read_text())["llm"]
    asked = sum(bool(a.strip()) for rid in ("lag", "rag") for a in pq.read_table(out / "answers" / f"{rid}.parquet").column("answer").to_pylist())
    assert (judge["actors_started"], judge["actors_adopted"]) == (0, 1) and judge["prompts_run"] == asked > 0, judge  # (a blank answer: 0, unasked)
