"""Reference run tables for the retrieval redesign's parity test.

Builds two small fixtures with the repository's public API (jobs.index.run_index,
jobs.retrieve.run_retrieve, pipelines.config.settings) and writes every run table, with the side
tables (term_scores, predicate_scores) retrieve writes beside them, to a flat layout:

    <out>/<fixture>/<run_id>.parquet
    <out>/<fixture>/term_scores-<run_id>.parquet, predicate_scores-<run_id>.parquet
    <out>/synthetic/decompositions.parquet   the hand-made decompositions the runs read
    <out>/manifest.json                      per run file: fixture, RetrieveConfig fields (minus paths), rows

Fixtures: "docs300" (the first 300 SciFact documents, 40 title queries, as
tests/integration/test_retrieve_evaluate.py) and "synthetic" (the ITLR benchmark at
per_template=1, seed=3, as tests/integration/conftest.py), the latter with ITLR (exact,
zscore, ann), decomposition-driven itlr/expansion, and OrLog/reasoner on the tiny test LLM.

Reference written at commit f87c36f (the pre-redesign retrieval code), run from a worktree:

    git worktree add /tmp/oldcode f87c36f
    cd /tmp/oldcode && PYTHONPATH=/tmp/oldcode /work/main/.venv/bin/python \\
        /work/main/tests/data/parity/make_reference.py --out /work/main/tests/data/parity/reference
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from logicrank.jobs.index import run_index
from logicrank.jobs.raysession import ray_session
from logicrank.jobs.retrieve import run_retrieve
from logicrank.pipelines.datasets import scifact
from logicrank.pipelines.generate.synthetic import generate
from logicrank.pipelines.logic.query import parse, relabel, to_text
from logicrank.pipelines.config.settings import IndexConfig, LLMConfig, RayConfig
from logicrank.pipelines.config.pipelines import RetrieveConfig
from logicrank.schemas.tables import DECOMPOSITIONS
from tests.conftest import scifact_docs, write_jsonl
from tests.tiny_llm import build_tiny_llm

RAY = RayConfig(num_cpus=2, batch_rows=64)
PATH_FIELDS = {"queries", "db", "decompositions", "labels"}


def build_docs300(root: Path) -> tuple[Path, Path]:
    """(queries, db): 300 SciFact documents indexed, 40 title queries q0..q39."""
    docs = scifact_docs(300)
    corpus = write_jsonl(root / "corpus.jsonl", docs)
    run_index(IndexConfig(corpus=str(corpus), db=str(root / "db")), root / "index")
    queries = write_jsonl(root / "queries.jsonl", [{"_id": f"q{i}", "text": d["title"]} for i, d in enumerate(docs[::7][:40])])
    return queries, root / "db"


def build_synthetic(root: Path) -> tuple[Path, Path]:
    """(queries, db): the ITLR benchmark, one query per template (32), indexed."""
    generate(scifact().corpus, root / "syn", per_template=1, seed=3)
    run_index(IndexConfig(corpus=str(root / "syn" / "corpus.jsonl"), db=str(root / "db")), root / "index")
    return root / "syn" / "queries.jsonl", root / "db"


def hand_decompositions(queries: list[dict]) -> pa.Table:
    """Deterministic decompositions from the gold logical queries: itlr = the gold form;
    reasoning = the text + " " + its first term; orlog = one atom per term, the gold formula
    over atom ids (as pipelines/generate/synthetic.py::gold_orlog_decompositions)."""
    blank = {"model": "hand", "prompt_sha": "-", "raw_output": None, "logical_query": None, "atoms": None, "expansion": None,
             "status": "ok", "error": None, "finish_reason": None, "prompt_tokens": 0, "generated_tokens": 0, "cached": False}
    rows = []
    for q in queries:
        ast = parse(q["logical_query"])
        ids = {t: f"a{i + 1}" for i, t in enumerate(ast.terms())}
        rows += [
            {**blank, "query_id": q["_id"], "method": "itlr", "logical_query": q["logical_query"]},
            {**blank, "query_id": q["_id"], "method": "reasoning", "expansion": f"{q['text']} {ast.terms()[0]}"},
            {**blank, "query_id": q["_id"], "method": "orlog", "logical_query": to_text(relabel(ast, ids)),
             "atoms": [{"id": a, "text": f"{{x}} discusses: {t}"} for t, a in ids.items()]},
        ]
    return pa.Table.from_pylist(rows, schema=DECOMPOSITIONS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    out: Path = ap.parse_args().out
    manifest: dict[str, dict] = {}

    def retrieve(fixture: str, work: Path, cfg: RetrieveConfig, inputs: dict) -> None:
        rdir = work / f"retrieve-{len(manifest)}"
        runs = run_retrieve(cfg, rdir, progress=False)
        fields = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in PATH_FIELDS}
        fields["llm"]["model"] = Path(fields["llm"]["model"]).name  # the tiny model's directory: its name only
        (out / fixture).mkdir(parents=True, exist_ok=True)
        for rid, path in runs.items():
            name = f"{fixture}/{rid}.parquet"
            shutil.copyfile(path, out / name)
            side = {}
            for kind in ("term_scores", "predicate_scores"):
                src, dst = rdir / kind / f"{rid}.parquet", out / fixture / f"{kind}-{rid}.parquet"
                if src.exists():
                    side[dst.name] = pq.read_metadata(shutil.copyfile(src, dst)).num_rows
            manifest[name] = {"fixture": fixture, "run_id": rid, "rows": pq.read_metadata(path).num_rows, "inputs": inputs,
                              "side_tables": side, "config": fields}

    with tempfile.TemporaryDirectory() as tmp, ray_session(RAY):
        work = Path(tmp)
        q, db = build_docs300(work / "docs300")
        retrieve("docs300", work, RetrieveConfig(queries=str(q), db=str(db), methods=("dense", "bm25", "hybrid"), k=20), {"queries": "queries.jsonl"})
        # hybrid fusing exactly the two k=20 runs above (the parity test fuses those with the rrf stage)
        retrieve("docs300", work, RetrieveConfig(queries=str(q), db=str(db), methods=("hybrid",), k=20, hybrid_depth=20, run_tag="depth20"),
                 {"queries": "queries.jsonl"})

        q, db = build_synthetic(work / "synthetic")
        syn = dict(queries=str(q), db=str(db))
        inputs = {"queries": "syn/queries.jsonl"}
        retrieve("synthetic", work, RetrieveConfig(**syn, methods=("itlr",), k=10, run_tag="itlr-none"), inputs)
        retrieve("synthetic", work, RetrieveConfig(**syn, methods=("itlr",), k=10, calibration="zscore", run_tag="itlr-zscore"), inputs)
        retrieve("synthetic", work, RetrieveConfig(**syn, methods=("itlr",), k=10, itlr_mode="ann", ann_k=20, run_tag="itlr-ann"), inputs)

        rows = [json.loads(line) for line in q.read_text(encoding="utf-8").splitlines()]
        (out / "synthetic").mkdir(parents=True, exist_ok=True)
        pq.write_table(hand_decompositions(rows), out / "synthetic" / "decompositions.parquet")
        dec = str(out / "synthetic" / "decompositions.parquet")
        inputs = {**inputs, "decompositions": "synthetic/decompositions.parquet"}
        retrieve("synthetic", work, RetrieveConfig(**syn, methods=("itlr", "expansion"), k=10, decompositions=dec, run_tag="dec"), inputs)

        q6 = write_jsonl(work / "q6.jsonl", rows[:6])
        llm = LLMConfig(model=str(build_tiny_llm(work / "models" / "tiny-llama")), max_model_len=1024, cache=None, max_num_seqs=64)
        small = dict(queries=str(q6), db=str(db), k=5, orlog_k=5, orlog_context_tokens=32, decompositions=dec, llm=llm, ray=RAY)
        inputs = {**inputs, "queries": "first 6 rows of syn/queries.jsonl", "llm": "tests/tiny_llm.py build_tiny_llm(seed=0)"}
        retrieve("synthetic", work, RetrieveConfig(**small, methods=("bm25", "orlog", "reasoner"), orlog_base="bm25", run_tag="llm"), inputs)
        retrieve("synthetic", work, RetrieveConfig(**small, methods=("orlog",), orlog_calibration="content-free", orlog_base="dense", run_tag="llm-cf"), inputs)

    (out / "manifest.json").write_text(json.dumps({"commit": "f87c36f", "runs": manifest}, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(manifest)} runs -> {out}")


if __name__ == "__main__":
    main()
