"""Bulk retrieval benchmark: the Ray job against single-process references, one run (not a test).

    make bench-retrieval     # SciFact's 300 test queries repeated 100 times: 30,000 queries
    python tests/perf/bench_retrieval.py --repeat 2 --db runs/scifact/lancedb   # a smoke run

On one SciFact table (indexed once into <out>/retrieval/lancedb, or --db) and the same queries
(ids ``<qid>#<copy>``):
  job bm25 / dense   `logicrank retrieve` (run_retrieve) with 1 and 2 retrieval actors, each in
                     a fresh run directory; wall = the whole call (Ray start, actor start, model
                     load), stage = the stage's own timing from the manifest (no Ray start);
  bm25s              bm25s over title + " " + text (English stop words, Snowball stemmer),
                     n_threads=1, numpy (its default) and numba backends; index time apart,
                     retrieval includes query tokenisation;
  engine, warm       logicrank's BM25 engine in this process as bm25s numba is measured: the
                     index opened and the search loop loaded on 10 queries first (apart), then
                     every query analysed, searched and written as a run table;
  numpy floor        the table's vectors as one matrix, queries encoded by the same Embedder;
                     Q @ D.T in chunks + argpartition top k, BLAS limited to one thread.
nDCG@10 beside each, on the first copy of each query, whose text is the query's own (each later
copy's ends in a token no document holds, so that every copy is encoded, as distinct queries
are: the job's driver encodes a text once however often it comes).
Goals (issue 24): job bm25 per core >= 0.8x bm25s per core (its faster backend, numba) with
nDCG@10 0.6851 unchanged; job dense q/s >= 0.8x the numpy floor's (encode + product).
The encoder (OpenVINO) may use every core in the driver and in each actor: per-core figures
divide by actors (the job) or by one (the references) all the same.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logicrank.jobs.index import run_index  # noqa: E402
from logicrank.jobs.retrieve import run_retrieve  # noqa: E402
from logicrank.pipelines.config.retrieval import RetrieveConfig  # noqa: E402
from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig, RayConfig  # noqa: E402
from logicrank.pipelines.datasets import scifact  # noqa: E402
from logicrank.pipelines.engines.embed import Embedder  # noqa: E402
from logicrank.pipelines.engines.store import DocStore  # noqa: E402
from logicrank.pipelines.evaluation.core import run_metrics  # noqa: E402
from logicrank.pipelines.evaluation.measures import parse_measures  # noqa: E402
from logicrank.pipelines.io import read_qrels  # noqa: E402
from logicrank.pipelines.markdown import table  # noqa: E402
from logicrank.pipelines.retrieval.methods.ranking import rank_pairs  # noqa: E402
from logicrank.schemas.tables import AGGREGATE_QUERY_ID  # noqa: E402
from tests.perf.report import write_report  # noqa: E402

K = 100


def _timed(fn):
    t = time.perf_counter()
    result = fn()
    return time.perf_counter() - t, result


def _ndcg10(run: pa.Table, qrels: pa.Table, run_id: str) -> float:
    """nDCG@10 of the first copy of each query (``<qid>#0``), under its original id."""
    df = run.select(["query_id", "doc_id", "score"]).to_pandas()
    df = df[df["query_id"].str.endswith("#0")].assign(query_id=lambda d: d["query_id"].str[:-2])
    m = run_metrics(rank_pairs(df, K, run_id, run_id), qrels, parse_measures(["nDCG@10"]), run_id).to_pandas()
    return float(m.loc[m["query_id"] == AGGREGATE_QUERY_ID, "value"].iloc[0])


def _pairs(qids: list[str], docs: np.ndarray, scores: np.ndarray, doc_ids: np.ndarray) -> pa.Table:
    """(query, doc, score) rows of (queries x k) results, as a table."""
    return pa.table({"query_id": np.repeat(qids, docs.shape[1]), "doc_id": doc_ids[docs.ravel()], "score": scores.ravel().astype(np.float64)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench")
    ap.add_argument("--repeat", type=int, default=100, help="copies of the 300 queries (100: 30,000 queries)")
    ap.add_argument("--backend", default="openvino", choices=("openvino", "torch"), help="encoder backend (the main job's)")
    ap.add_argument("--db", default=None, help="an existing SciFact LanceDB directory (default: index into <out>/retrieval/lancedb)")
    ap.add_argument("--actors", default="auto,1,2", help="retrieval actor pool sizes to run (auto: the default placement)")
    ap.add_argument("--batch-rows", type=int, default=None, help="queries per Ray batch (default: RayConfig's)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    work = Path(args.out) / "retrieval"
    work.mkdir(parents=True, exist_ok=True)
    data, embed = scifact(), EmbedConfig(backend=args.backend)
    qrels = read_qrels(data.qrels)
    db = args.db or str(work / "lancedb")
    if not DocStore(db).exists():
        print(f"indexing {data.corpus} -> {db}", flush=True)
        run_index(IndexConfig(corpus=str(data.corpus), db=db, embed=embed, ray=RayConfig()), work / "index")

    base = [json.loads(line) for line in data.queries.read_text(encoding="utf-8").splitlines() if line.strip()]
    qids = [f"{q['_id']}#{r}" for r in range(args.repeat) for q in base]  # copy-major: the first copy comes first
    # each copy's text its own (a token no document holds, which BM25 and bm25s drop): the job's driver encodes each distinct
    # text once (MemoEncoder), so 100 copies of one text were 1 encoding in the job and 100 in the numpy floor
    texts = [q["text"] + (f" zq{r}x" if r else "") for r in range(args.repeat) for q in base]
    n = len(qids)
    queries_path = work / "queries.jsonl"
    queries_path.write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in zip(qids, texts, strict=True)))
    rows = []

    # -- bm25s, one thread -----------------------------------------------------------
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    with gzip.open(data.corpus, "rt", encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    doc_ids = np.array([d["_id"] for d in corpus], dtype=object)

    for backend in ("numpy", "numba"):  # numpy: bm25s.BM25()'s default; numba: its fastest (JIT warmed on 10 queries first)

        def bm25s_index(backend=backend):
            tokens = bm25s.tokenize([f"{d.get('title') or ''} {d['text']}" for d in corpus], stopwords="en", stemmer=stemmer, show_progress=False)
            retriever = bm25s.BM25(backend=backend)
            retriever.index(tokens, show_progress=False)
            if backend == "numba":
                retriever.retrieve(bm25s.tokenize(texts[:10], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False),
                                   k=K, n_threads=1, show_progress=False)
            return retriever

        index_s, retriever = _timed(bm25s_index)

        def bm25s_retrieve(retriever=retriever):
            tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)
            return retriever.retrieve(tokens, k=K, n_threads=1, show_progress=False)

        s, (docs, scores) = _timed(bm25s_retrieve)
        rows.append({"system": f"bm25s {backend} (1 thread)", "method": "bm25", "cores": 1, "seconds": s, "qps": n / s, "index_s": index_s,
                     "ndcg@10": _ndcg10(_pairs(qids[:300], docs[:300], scores[:300], doc_ids), qrels, "bm25s")})
        print(rows[-1], flush=True)

    # -- logicrank's BM25 engine in this process, warm as bm25s numba is ---------------
    from logicrank.pipelines.retrieval.methods.bm25 import bm25

    store = DocStore(db)
    open_s, _ = _timed(lambda: store.bm25_index().search(texts[:10], K))  # the index opened, the loop loaded
    topics = pa.table({"query_id": qids, "text": texts})
    s, run = _timed(lambda: bm25(topics, store, K))
    rows.append({"system": "logicrank bm25 engine, warm (1 thread)", "method": "bm25", "cores": 1, "seconds": s, "qps": n / s,
                 "index_s": open_s, "ndcg@10": _ndcg10(run, qrels, "bm25"), "ratio": (n / s) / max(rows[0]["qps"], rows[1]["qps"])})
    print(rows[-1], flush=True)
    del run

    # -- numpy floor: one (queries x docs) product + top k ----------------------------
    from threadpoolctl import threadpool_limits

    load_s, blocks = _timed(lambda: list(DocStore(db).vector_blocks()))
    ids = np.concatenate([b[0] for b in blocks])
    D = np.ascontiguousarray(np.concatenate([b[1] for b in blocks]))
    model_s, encoder = _timed(lambda: Embedder(embed))
    encode_s, Q = _timed(lambda: encoder.encode(texts))

    def product_topk():
        top_d, top_s = np.empty((n, K), np.int64), np.empty((n, K), np.float32)
        with threadpool_limits(limits=1):
            for i in range(0, n, 2048):
                S = Q[i : i + 2048] @ D.T
                part = np.argpartition(-S, K - 1, axis=1)[:, :K]
                ps = np.take_along_axis(S, part, axis=1)
                order = np.argsort(-ps, axis=1)
                top_d[i : i + 2048], top_s[i : i + 2048] = np.take_along_axis(part, order, axis=1), np.take_along_axis(ps, order, axis=1)
        return top_d, top_s

    prod_s, (docs, scores) = _timed(product_topk)
    ndcg = _ndcg10(_pairs(qids[:300], docs[:300], scores[:300], ids), qrels, "numpy")
    floor_qps = n / (encode_s + prod_s)
    rows.append({"system": "numpy product + top-k (1 thread)", "method": "dense", "cores": 1, "seconds": prod_s, "qps": n / prod_s,
                 "ndcg@10": ndcg, "vectors_load_s": load_s, "docs": len(ids)})
    rows.append({"system": f"encode ({args.backend}) + numpy product + top-k", "method": "dense", "cores": 1, "seconds": encode_s + prod_s,
                 "qps": floor_qps, "ndcg@10": ndcg, "encode_s": encode_s, "model_load_s": model_s})
    print(rows[-2], rows[-1], sep="\n", flush=True)
    bm25s_per_core = max(rows[0]["qps"], rows[1]["qps"])  # the faster backend is the peer

    # -- the Ray job --------------------------------------------------------------------
    for method in ("bm25", "dense"):
        for spec in args.actors.split(","):
            auto = spec == "auto"
            actors = 1 if auto else int(spec)  # (auto: per-core figures divide by the cores the placement used, read below)
            ray = RayConfig(num_cpus=max(2, actors), retrieve_actors=None if auto else actors,
                            **({"retrieve_batch_rows": args.batch_rows} if args.batch_rows else {}))
            cfg = RetrieveConfig.preset((method,), queries=str(queries_path), db=db, set={f"{method}.k": K}, embed=embed, ray=ray)
            out = work / f"job-{method}-{actors}"
            shutil.rmtree(out, ignore_errors=True)  # the job caches stages by digest: start clean
            wall_s, paths = _timed(lambda cfg=cfg, out=out: run_retrieve(cfg, out, progress=False))
            manifest = json.loads((out / "manifest.json").read_text())
            stage_s = next(v for key, v in manifest["timings_s"].items() if key.startswith(f"{method}:"))
            placement = manifest["pipelines"][method]["stages"][0]["placement"]
            if auto and placement.startswith("pool of "):
                actors = int(placement.split()[2])
            run = pq.read_table(paths[method])
            assert manifest["pipelines"][method]["queries"] == n, manifest["pipelines"]
            qps = n / stage_s
            name = f"job, default placement ({placement})" if auto else f"job, {actors} actor{'s' * (actors > 1)}"
            rows.append({"system": name, "method": method, "cores": actors, "seconds": stage_s,
                         "qps": qps, "wall_s": wall_s, "wall_qps": n / wall_s, "ndcg@10": _ndcg10(run, qrels, method),
                         "ratio": (qps / actors) / bm25s_per_core if method == "bm25" else qps / floor_qps,
                         "ratio_wall": (n / wall_s / actors) / bm25s_per_core if method == "bm25" else (n / wall_s) / floor_qps})
            print(rows[-1], flush=True)
            del run

    total_s = time.perf_counter() - t_start
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), platform.processor())
    machine = {"cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu": cpu, "loadavg_at_end": os.getloadavg()}
    lines = [
        f"# Bulk retrieval benchmark (SciFact: {len(base)} queries x {args.repeat} = {n:,}, {len(ids):,} docs, k={K}, "
        f"encoder {args.backend}; {machine['cpu_count']} cores ({cpu}), load average {machine['loadavg_at_end'][0]:.2f} at the end; one run, {total_s:.0f} s)",
        "",
        "Job rows: q/s from the stage's own timing (actor start and model load included, Ray start not); "
        "wall: the whole run_retrieve call. Ratio: bm25 per core / the faster bm25s backend per core (goal >= 0.8, nDCG@10 0.6851); "
        "dense q/s / encode+product q/s (goal >= 0.8). Default placement: in the driver when the job is small (its probe says).",
        "",
    ]
    cells = []
    for r in rows:
        opt = {key: format(r[key], fmt) if key in r else "" for key, fmt in (("wall_s", ".1f"), ("wall_qps", ".0f"), ("ratio", ".2f"), ("ratio_wall", ".2f"))}
        cells.append([str(r["system"]), str(r["method"]), str(r["cores"]), f"{r['seconds']:.2f}", f"{r['qps']:.0f}", f"{r['qps'] / r['cores']:.0f}",
                      f"{r['ndcg@10']:.4f}", opt["wall_s"], opt["wall_qps"], opt["ratio"], opt["ratio_wall"]])
    lines += table(["system", "method", "cores", "s", "q/s", "q/s per core", "nDCG@10", "wall s", "wall q/s", "ratio", "ratio (wall)"],
                   cells, align="llrrrrrrrrr")
    lines += ["", f"bm25s index: {rows[0]['index_s']:.1f} s; engine index open + loop load: {rows[2]['index_s']:.2f} s; table vectors load: {load_s:.2f} s; encoder load: {model_s:.1f} s; "
                  f"encode alone: {encode_s:.1f} s ({n / encode_s:.0f} q/s)."]
    write_report(args.out, "bench_retrieval", {"machine": machine, "queries": n, "repeat": args.repeat, "backend": args.backend,
                                               "db": db, "total_s": total_s, "rows": rows}, lines)


if __name__ == "__main__":
    main()
