"""`logicrank experiment FILE` (jobs/experiment.py): a benchmark as a file. The runner gives
the table the jobs give when run by hand (the main job's retrieval section moved to
jobs/experiments/scifact.yaml), groups per-query figures, fails a missed reference after
writing its report (a bad file's one-line refusals: tests/unit/test_experiment_refusals.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.jobs.evaluate import run_evaluate
from logicrank.jobs.experiment import run_experiment
from logicrank.jobs.index import run_index
from logicrank.jobs.retrieve import run_retrieve
from logicrank.pipelines.config.retrieval import RetrieveConfig
from logicrank.pipelines.config.settings import EvaluateConfig, IndexConfig, RayConfig
from logicrank.pipelines.evaluation.experiment import ReferenceMissed, load
from logicrank.pipelines.evaluation.report import summary_frame
from tests.compare import assert_runs_close
from tests.conftest import write_jsonl
from tests.integration.conftest import RAY

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kept_engines")]  # jobs join the session's cluster, LLM pools kept between them (conftest.py)


@pytest.fixture(scope="module")
def beir(tmp_path_factory, docs300):
    """A BEIR directory: 300 SciFact documents, 40 title queries in two templates, their qrels."""
    root = tmp_path_factory.mktemp("beir")
    write_jsonl(root / "corpus.jsonl", docs300)
    picked = docs300[::7][:40]
    write_jsonl(root / "queries.jsonl", [{"_id": f"q{i}", "text": d["title"], "metadata": {"template": "AB"[i % 2]}} for i, d in enumerate(picked)])
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\t{d['_id']}\t1\n" for i, d in enumerate(picked)))
    return root


def _file(tmp_path, **over) -> dict:
    spec = {"name": "small", "title": "Small", "dataset": {"beir": str(over.pop("beir"))}, "presets": ["dense", "bm25", "hybrid"],
            "measures": ["nDCG@10", "P@1", "R@100", "MRR", "MAP", "F1@10"], "trec": True, **over}
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(spec))
    return spec


NOTEBOOK = """
import json, sys
import logicrank as lr

table = lr.open_table(sys.argv[1])
res = lr.run_experiment(sys.argv[2], sys.argv[3], table=table, set=["bm25.k=50"])
print(json.dumps({"ray": "ray" in sys.modules, "summary": res.summary.to_dict(), "groups": sorted(res.groups),
                  "bm25_rows": res.stages["bm25"][0]["rows"] if "rows" in res.stages["bm25"][0] else None, "report": str(res.report)}))
"""


def test_an_experiment_runs_in_a_notebook_without_ray_and_gives_the_jobs_figures(beir, tmp_path):
    """``lr.run_experiment(file, table=...)`` over the table the job indexed: in this process, Ray
    never imported, the same figures as the job's run of the same file and overrides."""
    _file(tmp_path, beir=beir, group_by=["template"])
    job = run_experiment(load(tmp_path / "e.yaml").model_copy(update={"set": {"bm25.k": 50}}), tmp_path / "job", ray=RAY, progress=False)
    out = subprocess.run([sys.executable, "-c", NOTEBOOK, str(tmp_path / "job" / "lancedb"), str(tmp_path / "e.yaml"), str(tmp_path / "nb")],
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ray"] is False and got["groups"] == ["template"]
    here = pd.DataFrame(got["summary"]).loc[list(job.summary.index), list(job.summary.columns)]
    np.testing.assert_allclose(here.to_numpy(), job.summary.to_numpy(), rtol=1e-6, atol=1e-9)
    report = Path(got["report"]).read_text()
    assert "By template:" in report and report.splitlines()[0] == job.report.read_text().splitlines()[0]


def test_an_experiment_gives_the_table_of_its_jobs_run_by_hand_groups_and_checks_references(beir, tmp_path):
    # by hand, as the main job ran its retrieval section before it became jobs/experiments/scifact.yaml
    db = str(tmp_path / "hand" / "lancedb")
    run_index(IndexConfig(corpus=str(beir), db=db, ray=RAY), tmp_path / "hand" / "index", progress=False)
    runs = run_retrieve(RetrieveConfig.preset(("dense", "bm25", "hybrid"), queries=str(beir / "queries.jsonl"), db=db, trec=True, ray=RAY),
                        tmp_path / "hand" / "retrieve")
    hand = summary_frame(run_evaluate(EvaluateConfig(qrels=str(beir / "qrels" / "test.tsv"), runs=tuple(map(str, runs.values()))),
                                      tmp_path / "hand" / "evaluate"))

    _file(tmp_path, beir=beir, group_by=["template"],
          references=[{"run": "bm25", "measure": "ndcg@10", "value": round(float(hand.loc["bm25", "nDCG@10"]), 4), "tolerance": 0.001,
                       "source": "the same jobs by hand"}], caveats=["A test corpus."])
    res = run_experiment(load(tmp_path / "e.yaml"), tmp_path / "exp", ray=RAY, progress=False)
    assert list(res.summary.index) == list(hand.index) and list(res.summary.columns) == list(hand.columns)
    np.testing.assert_allclose(res.summary.to_numpy(), hand.to_numpy(), rtol=1e-6, atol=1e-9)  # float kernels: same machine, same order
    for rid in runs:
        assert_runs_close(pq.read_table(res.runs[rid]), pq.read_table(runs[rid]), f"{rid}: experiment vs by hand")
        assert (tmp_path / "exp" / "retrieve" / "runs" / f"{rid}.trec").is_file()
    assert res.reproduced and res.checks[0].got == pytest.approx(hand.loc["bm25", "nDCG@10"], abs=1e-9)
    # retrieve reads the version the experiment's index run made, pinned, not the complete mark resolved again
    made = json.loads((tmp_path / "exp" / "index" / "manifest.json").read_text())["table"]["version"]
    assert json.loads((tmp_path / "exp" / "retrieve" / "manifest.json").read_text())["config"]["table_version"] == made
    by = res.groups["template"]
    assert set(by.index) == {(r, t) for r in runs for t in "AB"} and set(by["queries"]) == {20}
    per_query = res.metrics.to_pandas()
    a = per_query[(per_query.run_id == "dense") & (per_query.measure == "P@1") & per_query.query_id.isin([f"q{i}" for i in range(0, 40, 2)])]
    assert by.loc[("dense", "A"), "P@1"] == pytest.approx(a.value.mean(), abs=1e-12)
    report = res.report.read_text()
    assert re.search(r"^\| bm25 +\| nDCG@10 +\|", report, re.M) and "reproduced" in report and "By template:" in report and "**A test corpus.**" in report
    assert "- `bm25`: bm25" in report and "- `dense`: dense" in report  # each run's stages

    _file(tmp_path, beir=beir, references=[{"run": "dense", "measure": "nDCG@10", "value": 0.0, "tolerance": 0.01, "source": "wrong"}])
    with pytest.raises(ReferenceMissed, match=r"1 reference figure\(s\) missed: dense nDCG@10 \d\.\d{4} vs 0\.0 ± 0\.01"):
        run_experiment(load(tmp_path / "e.yaml"), tmp_path / "exp", ray=RAY, progress=False)  # a rerun: every job skipped, unchanged
    assert "**missed**" in (tmp_path / "exp" / "experiment.md").read_text()
    # the command: every run's line, the reference MISSED, exit 1 after the report; --set a key of the file
    res = CliRunner().invoke(app, ["experiment", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "exp"), "--no-progress"])
    assert res.exit_code == 1, res.output
    assert re.search(r"^reference dense nDCG@10: \d\.\d{4} vs 0\.0 ± 0\.01: MISSED$", res.output, re.M), res.output
    assert "error: experiment: 1 reference figure(s) missed: small dense nDCG@10" in res.output and "report: " in res.output
    res = CliRunner().invoke(app, ["experiment", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "exp"), "--no-progress",
                                   "--set", "references.0.value=" + f"{by.loc[('dense', 'A'), 'P@1']:.4f}", "--set", "references.0.measure=P@1",
                                   "--set", "references.0.tolerance=1"])
    assert res.exit_code == 0 and ": reproduced" in res.output, res.output


def test_bench_setlogic_is_setlogic_yaml_whose_llm_free_rows_are_setlogic_exacts(tmp_path, tiny_cfg):
    """`bench-setlogic` (pipelines/evaluation/benchmarks.py) runs jobs/experiments/setlogic.yaml: its
    retrieval rows (dense, bm25, ITLR over each scorer), by template and overall, equal
    setlogic-exact.yaml's on the same queries; OrLog, with the LLM's P(True) and with BM25's,
    reorders exactly BM25's top 20 of each query, and both count their cost per pair; the
    LLM-free file's OrLog over BM25 reranks every person, as ITLR scores them."""
    from logicrank.pipelines.evaluation import benchmarks
    from logicrank.pipelines.generate.setlogic import TEMPLATE_NAMES

    res = run_experiment(benchmarks.setlogic(per_template=3), tmp_path / "bench", llm=tiny_cfg, ray=RAY, progress=False)
    exact = run_experiment(benchmarks.setlogic(per_template=3, orlog=False), tmp_path / "exact", ray=RAY, progress=False)
    retrieval = ["dense", "bm25", "itlr", "itlr-bm25", "itlr-hybrid"]
    assert {r: p for r, p in load("setlogic-exact").pipelines.items() if r in retrieval} == \
        {r: p for r, p in load("setlogic").pipelines.items() if r in retrieval}
    measures = ["P@1", "R@5", "F1@5", "nDCG@10"]
    grouped = res.groups["template"]
    assert len(grouped) == 7 * len(TEMPLATE_NAMES) and len(exact.groups["template"]) == 6 * len(TEMPLATE_NAMES)
    for (run, template), row in exact.groups["template"].iterrows():
        if run in retrieval:
            np.testing.assert_allclose(grouped.loc[(run, template), measures].to_numpy(float), row[measures].to_numpy(float), rtol=0, atol=1e-12)
    np.testing.assert_allclose(res.summary.loc[retrieval, measures].to_numpy(float),
                               exact.summary.loc[retrieval, measures].to_numpy(float), rtol=0, atol=1e-12)
    bm25 = pq.read_table(res.runs["bm25"]).to_pandas()
    top20 = bm25[bm25["rank"] <= 20].groupby("query_id")["doc_id"].apply(set)
    for rid in ("orlog", "orlog-bm25"):
        reranked = pq.read_table(res.runs[rid]).to_pandas()
        assert reranked.groupby("query_id")["doc_id"].apply(set).to_dict() == top20.to_dict()
        counts = res.stages[rid][-1]
        assert counts["pairs"] == len(reranked) and counts["seconds_per_pair"] > 0
    assert res.stages["orlog"][-1]["forward_passes"] > 0 and res.stages["orlog-bm25"][-1]["forward_passes"] == 0
    people = pq.read_table(exact.runs["orlog-bm25"]).to_pandas()
    assert (people.groupby("query_id").size() == 46).all() and exact.stages["orlog-bm25"][-1]["pairs"] == len(people)


def test_bench_lag_is_lag_oracle_and_lag_yaml_over_one_index(tmp_path, tiny_cfg):
    """`bench-lag musique` (pipelines/evaluation/benchmarks.py): lag-oracle.yaml on every question reproduces
    its three references, and lag.yaml's LLM rows on a sample score every sampled question
    (QA measures and chain recall), over the same index, not encoded twice."""
    from logicrank.pipelines.evaluation import benchmarks

    oracle_exp, llm_exp = benchmarks.lag("musique", sample=2, seed=3)
    # the index read in the job's default batches (512 rows), not the tests' 64: each call to the encoder runs a
    # batch per length of tokens, filled with empty texts (engines/embed.py, fixed_shape_batches), and MuSiQue's
    # 1,890 paragraphs in 64-row calls ran 2.5 times the rows, most of this test's time
    oracle = run_experiment(oracle_exp, tmp_path / "oracle", ray=RayConfig(num_cpus=2), progress=False, index_dir=tmp_path)
    assert list(oracle.summary.index) == ["question", "gold-chain", "gold-no-answer", "gold-random-order"]
    assert oracle.reproduced and [c.reference.run for c in oracle.checks] == ["question", "gold-chain", "gold-no-answer"]
    assert oracle.index.inserted == 1890

    res = run_experiment(llm_exp, tmp_path / "llm", llm=tiny_cfg, ray=RAY, progress=False, index_dir=tmp_path)
    assert res.index.inserted == 0 and res.index.unchanged == 1890  # the oracle's table
    assert list(res.summary.index) == ["rag", "lag", "lag-no-answer", "lag-random-order"]
    assert {"EM", "TokenF1", "Acc", "R@100"} <= set(res.summary.columns) and res.summary.notna().all().all()
    scored = res.metrics.to_pandas()
    asked = {json.loads(x)["_id"] for x in (tmp_path / "llm" / "sample" / "queries.jsonl").read_text().splitlines()}
    assert len(asked) == 2
    for measure in ("EM", "R@100"):
        per_run = scored[(scored["measure"] == measure) & (scored["query_id"] != "all")].groupby("run_id")["query_id"].apply(set)
        assert all(q == asked for q in per_run), measure  # every sampled question scored, no other
    gold = [json.loads(x)["query_id"] for x in (tmp_path / "llm" / "sample" / "answers.jsonl").read_text().splitlines()]
    assert sorted(gold) == sorted(asked)  # the gold cut to the sample
    rag = res.stages["rag"][0]
    assert rag["questions"] == 2 and rag["stage"] == "lag"

    hotpot = benchmarks.lag("hotpotqa", runs=("rag",), judge=True)
    assert len(hotpot) == 1 and hotpot[0].dataset.qa == "hotpotqa" and hotpot[0].qa_measures[-1] == "Judge"
    assert list(hotpot[0].pipelines) == ["rag"] and not any("MuSiQue" in c for c in hotpot[0].caveats)


def test_a_trec_collection_runs_as_an_experiment_with_no_converter(tmp_path):
    """A TREC collection as its publishers lay it out: SGML documents in files whose names mark
    no format, a topics file, a qrels file (SciFact written so: 40 of its test claims as
    topics, their judged abstracts among 300). `logicrank experiment` reads them as `index`,
    `retrieve` and `evaluate` do, and reports trec_eval's map, ndcg_cut_10 and bpref for bm25,
    dense, hybrid and a ranx fusion, each equal to trec_eval's own code (pytrec_eval) over the
    TREC run files it wrote."""
    import gzip

    import ncompress
    import pytrec_eval

    from logicrank.pipelines.datasets import scifact

    data = scifact()
    judged = [line.split("\t") for line in data.qrels.read_text().splitlines()[1:]]
    topics = sorted({q for q, _, _ in judged}, key=int)[:40]
    relevant = {(q, d) for q, d, _ in judged if q in topics}
    claims = {str(r["_id"]): r["text"] for r in map(json.loads, data.queries.read_text().splitlines())}
    wanted = {d for _, d in relevant}
    docs = []
    with gzip.open(data.corpus, "rt", encoding="utf-8") as f:  # the judged abstracts, then others up to 300
        for line in f:
            d = json.loads(line)
            if d["_id"] in wanted or len(docs) < 300 - len(wanted) + sum(x["_id"] in wanted for x in docs):
                docs.append({"_id": d["_id"], "title": d["title"], "text": d["text"][:600]})
    root = tmp_path / "trec"
    (root / "docs").mkdir(parents=True)
    for part in range(3):  # like TREC's fr940104 or la010189: no suffix; the first compressed as TREC's disks ship it (fr940104.0z)
        sgml = "".join(f"<DOC>\n<DOCNO> {d['_id']} </DOCNO>\n<HEAD>{d['title']}</HEAD>\n<TEXT>\n{d['text']}\n</TEXT>\n</DOC>\n"
                       for d in docs[part::3]).encode()
        (root / "docs" / f"sf{part:04d}{'.0z' if part == 0 else ''}").write_bytes(ncompress.compress(sgml) if part == 0 else sgml)
    (root / "docs" / "readme").write_text("SciFact's abstracts as TREC SGML.\n")  # beside them, as on TREC's disks: never read
    (root / "docs" / "dtds").mkdir()
    (root / "docs" / "dtds" / "sf.dtd").write_text("<!ELEMENT DOC - - (DOCNO, HEAD, TEXT)>\n")
    (root / "topics.1-40").write_text("".join(
        f"<top>\n<num> Number: {q}\n<title> {claims[q]}\n<desc> Description:\nEvidence about: {claims[q]}\n</top>\n\n" for q in topics))
    nonrelevant = [d["_id"] for d in docs if d["_id"] not in wanted]
    (root / "qrels.1-40").write_text("".join(f"{q} 0 {d} 1\n" for q, d in sorted(relevant))
                                     + "".join(f"{q} 0 {nonrelevant[i]} 0\n" for i, q in enumerate(topics)))  # judged non-relevant too
    spec = {"name": "trec-small", "title": "A TREC collection",
            "dataset": {"corpus": str(root / "docs"), "queries": str(root / "topics.1-40"), "qrels": str(root / "qrels.1-40"), "format": "trec"},
            "presets": ["bm25", "dense", "hybrid"],
            "pipelines": {"fused": [{"fuse": {"method": "wsum", "norm": "zmuv", "weights": [0.5, 0.5], "of": [["dense"], ["bm25"]]}}]},
            "measures": ["map", "ndcg_cut_10", "bpref"], "trec": True}
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(spec))
    r = CliRunner().invoke(app, ["experiment", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "exp"), "--no-progress"])
    assert r.exit_code == 0, r.output
    report = (tmp_path / "exp" / "experiment.md").read_text()
    counts = json.loads((tmp_path / "exp" / "index" / "manifest.json").read_text())["counts"]
    assert (counts["inserted"], counts["rejected"]) == (len(docs), 0)
    assert sorted(Path(f).relative_to(root / "docs").as_posix() for f in counts["not_read"]) == ["dtds/sf.dtd", "readme"]
    assert re.search(r"^\| run +\| +depth \| +MAP \| +nDCG@10 \| +Bpref \|$", report, re.M), report  # trec_eval's names, the project's spellings
    assert re.search(r"^\| dense +\| +100 \|", report, re.M), report  # the preset's depth, stated: MAP is MAP at 100
    qrels = {}
    for line in (root / "qrels.1-40").read_text().splitlines():
        q, _, d, rel = line.split()
        qrels.setdefault(q, {})[d] = int(rel)
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"map", "ndcg_cut_10", "bpref"})
    metrics = pq.read_table(tmp_path / "exp" / "evaluate" / "metrics.parquet").to_pandas()
    for run in ("bm25", "dense", "hybrid", "fused"):
        trec = {}
        for line in (tmp_path / "exp" / "retrieve" / "runs" / f"{run}.trec").read_text().splitlines():
            q, _, d, _, score, _ = line.split()
            trec.setdefault(q, {})[d] = float(score)
        ref = evaluator.evaluate(trec)
        for ours, theirs in (("MAP", "map"), ("nDCG@10", "ndcg_cut_10"), ("Bpref", "bpref")):
            got = metrics[(metrics.run_id == run) & (metrics.measure == ours) & (metrics.query_id == "all")].value.item()
            want = np.mean([ref.get(q, {}).get(theirs, 0.0) for q in qrels])  # a topic a run misses scores 0 (trec_eval -c)
            assert got == pytest.approx(want, abs=1e-4), (run, ours)
    means = metrics[(metrics.query_id == "all") & (metrics.measure == "MAP")].set_index("run_id").value
    assert means.min() > 0.3 and means.max() < 1.0  # real claims: the runs find most judged abstracts, not all
