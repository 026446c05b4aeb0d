"""The retrieve job's bm25 stage against the engine alone and against bm25s, side by side (not a test).

    make bench-bm25-stage      # SciFact's 5,183 documents, its 300 test queries x 10 = 3,000, k = 100

One process, one thread for the engines (the job's own Ray session is given 2 CPUs; its bm25
stage runs in the driver at this size). Each figure is the best of ``--repeat`` runs:
  bm25s numba     bm25s over title + " " + text (English stop words, Snowball stemmer), index apart,
                  retrieval (query tokenisation included) after a warm-up on 10 queries;
  engine          logicrank's BM25 engine searching the same queries (pipelines/engines/bm25/,
                  ``search_flat``: rows and scores, no run table);
  method          pipelines/retrieval/methods/bm25.py: the engine and the run table built from its arrays;
  job stage       `logicrank retrieve` (run_retrieve) with bm25, the stage's own seconds from the
                  manifest (Ray's start not counted; each run in a fresh run directory).
Goals (issue 40): the job's stage >= 0.8x bm25s numba; >= 0.9x the engine alone.

Then cold, as users run it: each row a fresh process (``--cold-repeat`` times, the median),
its first search and its second. "machine's first process" starts from an empty cache root
(``LOGICRANK_CACHE``: no compiled search loop, no numba cache): what the first process after
an install pays; every other row finds the loop compiled by an earlier process. The CLI row is `logicrank retrieve --method
bm25` in a fresh process (Ray's start, reading and writing not counted: the stage's seconds
from the manifest). Goals (issue 50): a fresh process's first engine search at most 3x its
second; the CLI's stage, cold, at least 0.8x bm25s.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

K = 100


def _table(db: Path):
    from logicrank.pipelines.datasets import scifact
    from logicrank.pipelines.engines.embed import to_fixed_size_list
    from logicrank.pipelines.engines.store import DocStore

    with gzip.open(scifact().corpus, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    store = DocStore(str(db))
    store.open_or_create(4, "bench (no vectors)")
    store.upsert(pa.table({"doc_id": [str(d["_id"]) for d in docs], "title": [d.get("title") for d in docs], "text": [d["text"] for d in docs],
                           "metadata": [None] * len(docs), "content_hash": [str(i) for i in range(len(docs))],
                           "vector": to_fixed_size_list(np.ones((len(docs), 4), np.float32))}))
    store.mark_complete()
    return store, docs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=10, help="copies of the 300 test queries")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold-repeat", type=int, default=3, help="fresh processes per cold row (the median is reported)")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)
    import bm25s
    import Stemmer

    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.config.settings import RayConfig
    from logicrank.pipelines.datasets import scifact
    from logicrank.pipelines.markdown import table
    from logicrank.pipelines.retrieval.methods.bm25 import bm25

    work = Path(tempfile.mkdtemp(prefix="bm25-stage-"))
    try:
        store, docs = _table(work / "db")
        base = [json.loads(line) for line in scifact().queries.read_text(encoding="utf-8").splitlines() if line.strip()]
        qids = [f"{q['_id']}#{c}" for c in range(args.copies) for q in base]
        texts = [q["text"] for _ in range(args.copies) for q in base]
        (work / "q.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in zip(qids, texts, strict=True)), encoding="utf-8")
        queries = pa.table({"query_id": qids, "text": texts})

        stem = Stemmer.Stemmer("english")
        corpus = bm25s.tokenize([f"{d.get('title') or ''} {d['text']}" for d in docs], stopwords="en", stemmer=stem, show_progress=False)
        retriever = bm25s.BM25(backend="numba")
        retriever.index(corpus, show_progress=False)
        retriever.retrieve(bm25s.tokenize(texts[:10], stopwords="en", stemmer=stem, return_ids=False, show_progress=False), k=K, n_threads=1,
                           show_progress=False)
        index = store.bm25_index()
        index.search(texts[:10], K)  # the index mapped, the search loop loaded

        def bm25s_run():
            q = bm25s.tokenize(texts, stopwords="en", stemmer=stem, return_ids=False, show_progress=False)
            retriever.retrieve(q, k=K, n_threads=1, show_progress=False)

        def job_run(i: int) -> float:
            out = work / f"job{i}"
            cfg = RetrieveConfig.preset(("bm25",), queries=str(work / "q.jsonl"), db=str(work / "db"), set={"bm25.k": K}, ray=RayConfig(num_cpus=2))
            run_retrieve(cfg, out, progress=False)
            manifest = json.loads((out / "manifest.json").read_text())
            shutil.rmtree(out)
            return next(v for key, v in manifest["timings_s"].items() if key.startswith("bm25:"))

        best: dict[str, float] = {}
        for i in range(args.repeat):
            for name, fn in (("bm25s numba", bm25s_run), ("engine", lambda: index.search_flat(texts, K)),
                             ("method", lambda: bm25(queries, store, K))):
                t = time.perf_counter()
                fn()
                best[name] = min(best.get(name, np.inf), time.perf_counter() - t)
            best["job stage"] = min(best.get("job stage", np.inf), job_run(i))
        n = len(texts)
        rows = {name: {"s": s, "qps": n / s} for name, s in best.items()}
        cold = _cold(work, args.cold_repeat)
        report = {"queries": n, "k": K, "repeat": args.repeat, "rows": rows,
                  "job_over_bm25s": best["bm25s numba"] / best["job stage"], "job_over_engine": best["engine"] / best["job stage"],
                  "method_over_engine": best["engine"] / best["method"], "cold": cold,
                  "cold_job_over_bm25s_warm": best["bm25s numba"] / cold["CLI retrieve --method bm25"]["first"],
                  "cold_job_over_bm25s_cold": cold["bm25s numba"]["first"] / cold["CLI retrieve --method bm25"]["first"],
                  "engine_first_over_second": cold["engine"]["first"] / cold["engine"]["second"]}
        lines = [f"# bm25: the job's stage, the method, the engine and bm25s ({n:,} SciFact queries, k={K}, best of {args.repeat}, one thread)", ""]
        lines += table(["what", "s", "q/s"], [[name, f"{r['s']:.3f}", f"{r['qps']:,.0f}"] for name, r in rows.items()], align="lrr")
        lines += ["", f"job / bm25s numba: {report['job_over_bm25s']:.2f}x; job / engine: {report['job_over_engine']:.2f}x; "
                      f"method / engine: {report['method_over_engine']:.2f}x", "",
                  f"## Cold: a fresh process's first and second search (median of {args.cold_repeat} processes)", ""]
        lines += table(["what", "first s", "second s", "first / second", "first q/s"],
                       [[name, f"{r['first']:.3f}", "" if r.get("second") is None else f"{r['second']:.3f}",
                         "" if r.get("second") is None else f"{r['first'] / r['second']:.1f}x", f"{n / r['first']:,.0f}"] for name, r in cold.items()],
                       align="lrrrr")
        lines += ["", f"engine, fresh process: first / second {report['engine_first_over_second']:.1f}x; "
                      f"CLI stage cold / bm25s warm: {report['cold_job_over_bm25s_warm']:.2f}x; "
                      f"CLI stage cold / bm25s cold (its first retrieve): {report['cold_job_over_bm25s_cold']:.2f}x"]
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_bm25_stage.json").write_text(json.dumps(report, indent=1))
        (out / "bench_bm25_stage.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# What a fresh process times (run as ``python -c CHILD WORK WHAT``): its first search and its second.
CHILD = r"""
import json, sys, time
from pathlib import Path
from threadpoolctl import threadpool_limits
threadpool_limits(limits=1)
work, what = Path(sys.argv[1]), sys.argv[2]
texts = [json.loads(line)["text"] for line in (work / "q.jsonl").read_text().splitlines()]
if what == "bm25s":
    import gzip, bm25s, Stemmer
    from logicrank.pipelines.datasets import scifact
    with gzip.open(scifact().corpus, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    stem = Stemmer.Stemmer("english")
    retriever = bm25s.BM25(backend="numba")
    retriever.index(bm25s.tokenize([f"{d.get('title') or ''} {d['text']}" for d in docs], stopwords="en", stemmer=stem, show_progress=False),
                    show_progress=False)
    def search():
        q = bm25s.tokenize(texts, stopwords="en", stemmer=stem, return_ids=False, show_progress=False)
        retriever.retrieve(q, k=100, n_threads=1, show_progress=False)
else:
    from logicrank.pipelines.engines.store import DocStore
    index = DocStore(str(work / "db")).bm25_index()
    def search():
        index.search_flat(texts, 100)
times = []
for _ in range(2):
    t = time.perf_counter()
    search()
    times.append(time.perf_counter() - t)
print(json.dumps({"first": times[0], "second": times[1]}))
"""


def _env(cache: Path | None) -> dict:
    """This process's environment; with ``cache``, an empty cache root (no numba cache elsewhere)."""
    if cache is None:
        return dict(os.environ)
    return {**{k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}, "LOGICRANK_CACHE": str(cache)}


def _fresh(work: Path, what: str, cache: Path | None = None) -> dict:
    env = _env(cache)
    done = subprocess.run([sys.executable, "-c", CHILD, str(work), what], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"bench_bm25_stage: the fresh process ({what}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fresh_cli(work: Path, i: int, cache: Path | None = None) -> dict:
    """`logicrank retrieve --method bm25` in a fresh process: the stage's seconds from its manifest."""
    out = work / f"cli{i}"
    env = _env(cache)
    done = subprocess.run([sys.executable, "-m", "logicrank.cli", "retrieve", str(work / "q.jsonl"), "--db", str(work / "db"), "--method", "bm25",
                           "--k", str(K), "--out", str(out), "--no-progress"], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"bench_bm25_stage: logicrank retrieve failed:\n{done.stderr[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    shutil.rmtree(out)
    return {"first": next(v for key, v in manifest["timings_s"].items() if key.startswith("bm25:")), "second": None}


def _cold(work: Path, repeat: int) -> dict[str, dict]:
    """Each row's median over ``repeat`` fresh processes (first and second search apart)."""
    def median(runs: list[dict]) -> dict:
        return {key: None if runs[0][key] is None else statistics.median(r[key] for r in runs) for key in runs[0]}

    def empty_cache(i: int) -> Path:
        path = work / f"cache-empty-{i}"
        shutil.rmtree(path, ignore_errors=True)
        return path

    _fresh(work, "engine")  # the machine's kernels compiled once, as after `make venv`
    return {
        "engine, the machine's first process (empty cache root)": median([_fresh(work, "engine", empty_cache(i)) for i in range(repeat)]),
        "engine": median([_fresh(work, "engine") for _ in range(repeat)]),
        "bm25s numba": median([_fresh(work, "bm25s") for _ in range(repeat)]),
        "CLI retrieve --method bm25, the machine's first process": median([_fresh_cli(work, i, empty_cache(i)) for i in range(repeat)]),
        "CLI retrieve --method bm25": median([_fresh_cli(work, i) for i in range(repeat)]),
    }


if __name__ == "__main__":
    main()
