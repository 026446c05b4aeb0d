"""The cost curve of bulk retrieval from 10k to 10M documents, peers beside it (not a test).

    make bench-scale                                            # 10k, 100k, 1M and 10M documents
    python tests/perf/bench_scale.py --sizes 10000 --queries 300   # a smoke run

The corpora: passages of two or three sentences drawn (seeded) from bundled SciFact's
abstracts, titled by the abstract of their first sentence. Embedding 1M passages on 2 cores
would take hours, so the vectors are written straight into the table: each passage's vector
is the normalised mean of its sentences' real MiniLM vectors (OpenVINO, embedded once and
cached) plus Gaussian noise (sigma 0.02 per dimension), so neighbours are as real
vectors' are, not uniform. Queries: SciFact's 300 test queries repeated to ``--queries``,
k = 100, encoded once (encoding does not grow with the corpus; its rate is reported apart).

Each step runs in its own process, so its peak memory (max RSS) is its own:
  table        write the passages and vectors into a new LanceDB table (append, 100k rows a commit)
  fts          LanceDB's full-text indexes on title and text (what the index job still builds)
  ann          the ANN index (IVF_HNSW_SQ), only from the ANN threshold (100k) as the index job does
  bm25-build   the BM25 engine's index of the version, built from a table scan (pipelines/engines/bm25/)
  reindex-1%   1% of the passages edited (new text and vector) and upserted, then the engine's index
               patched from the previous version's, and, beside it, built anew (the decision)
  bm25         logicrank's bm25 over the batch of queries, in process (pipelines/retrieval/methods/bm25.py; its numba
               search loop compiled on 10 queries first), and beside it the engine alone (search_flat, no run
               table): each run 7 times to 100k, 3 at 1M, once at 10M, interleaved, the best of each
  bm25s        bm25s 0.3 over title + text (its own tokenizer with PyStemmer and English stop words),
               numpy backend (its default) and numba backend (JIT warmed on 10 queries first), 1 thread
  bm25-shards  `logicrank retrieve` with bm25 on 1, 2 and 4 search actors, each holding one shard of the
               mapped index: seconds, q/s, each actor's peak RSS and PSS, the node's PSS (_bm25_shards)
  shards-equal `logicrank retrieve` with bm25, dense and ITLR exact, in 4 shards and unsharded, over
               300 queries: the runs equal (ids, ranks, scores within 1e-6); up to 2M documents,
               where the table holds MiniLM-space vectors the bundled encoder queries
  dense-f16    the dense engine on float16 vectors; its recall@10 and @100 against float32
  dense        logicrank's exact dense engine (blocked product + partial sort) on the pre-encoded queries
  dense-ann    LanceDB's ANN search with refinement (where the table has the index), k = 100 as
               dense asks it; its recall@10 and @100 against the exact run over the 300 distinct queries
  numpy        the (queries x docs) product + argpartition top k over the table's vectors, in blocks of
               1,024 queries x 4,096 documents (the floor; unblocked, 1M documents stream from memory per query)
  hybrid       RRF of the bm25 and dense runs
  itlr-exact   ITLR exact mode (pipelines/retrieval/methods/itlr.py, score_exact: every document scored, top 10 kept)
               over --queries logical queries of three terms (four shapes with AND, OR, NOT, as in
               bench_itlr.py), the terms drawn (seeded) from SciFact's 300 queries, with their real vectors;
               beside it, the (unique terms x docs) numpy product alone, the floor under any exact scoring
  itlr-bm25    ITLR exact mode over BM25 evidence (pipelines/retrieval/methods/evidence.py: every unique term's BM25
               scores over the table from one sparse product, max-normalised, composed in blocks, top 10),
               the same logical queries; beside it, the bm25 engine searching the unique terms as queries
               (top 100 each), the peer a user would run instead
  itlr-ann     ITLR ann mode (each positive term's 100 nearest by the table's vector search, the union
               re-scored exactly), its recall@10 against itlr-exact
  orlog        OrLog's LLM-free composition: the exact posterior of each logical query (its shape over
               three atoms) over the bm25 run's top 100, given P(True)s (seeded uniform: the LLM's output,
               not its cost)
  evaluate     nDCG@10, R@100 of the bm25 run against pseudo-qrels (a SciFact query's relevant
               abstract -> the passages that open with one of its sentences)
  bm25-pool    `logicrank retrieve` (run_retrieve) with bm25 on a pool of 1, then 2 retrieval actors
               (Ray, 2 CPUs), the queries repeated 10 times (30,000 by default); the stage's seconds
               from the manifest (the actors' start and index load included, Ray's start not)
BLAS and the engines are limited to one thread in every step (per-core figures); bm25-pool's
actors are one thread each.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

K = 100
STEPS = ("table", "fts", "ann", "bm25-build", "reindex-1%", "bm25", "bm25s", "bm25-shards", "shards-equal", "dense", "dense-f16", "dense-ann", "numpy",
         "hybrid", "itlr-exact", "itlr-bm25", "itlr-ann", "orlog", "evaluate", "bm25-pool")
NOT_PLOTTED = {"bm25-pool", "bm25-shards", "shards-equal"}  # not one thread: the plot is per-core cost
F16_FROM = 2_000_000  # past this many documents the dense steps keep float16 vectors only (disk)
SMALL_DIM = 8  # the table's vector width past F16_FROM (disk: _table_dim)
BM25S_MAX_DOCS = 2_000_000  # bm25s peaked at 3.5 GiB at 1M documents here: past this it does not fit beside the rest
POOL_COPIES = 10  # bm25-pool runs the queries this many times over (30,000 by default)
TEMPLATES = ('"{0}" AND "{1}" AND NOT "{2}"', '"{0}" OR "{1}" AND "{2}"', '("{0}" OR "{1}") AND NOT "{2}"', '"{0}" AND "{1}" OR "{2}"')
ANN_THRESHOLD = 100_000  # IndexConfig's default


# -- the corpus ------------------------------------------------------------------------
def sentences(corpus: Path) -> tuple[list[str], list[int], list[str], list[str]]:
    """(sentences, the abstract each comes from, abstract ids, abstract titles)."""
    sents, owner, ids, titles = [], [], [], []
    with gzip.open(corpus, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            d = json.loads(line)
            ids.append(d["_id"])
            titles.append(d.get("title") or "")
            for s in re.split(r"(?<=[.!?])\s+", d["text"]):
                if len(s.split()) >= 4:
                    sents.append(s)
                    owner.append(i)
    return sents, owner, ids, titles


def _embedded(path: Path, texts: list[str], encoder: list) -> np.ndarray:
    """``texts``' MiniLM vectors (OpenVINO), embedded once and cached at ``path``.
    ``encoder`` holds the one Embedder of the process (a second one hung in a futex wait)."""
    if path.exists():
        v = np.load(path)
        if len(v) == len(texts):
            return v
    if not encoder:
        from logicrank.pipelines.config.settings import EmbedConfig
        from logicrank.pipelines.engines.embed import Embedder

        encoder.append(Embedder(EmbedConfig(backend="openvino")))
    t = time.perf_counter()
    v = encoder[0].encode(texts).astype(np.float32)
    print(f"embedded {len(texts):,} texts in {time.perf_counter() - t:.0f} s", flush=True)
    np.save(path, v)
    return v


def passages(n: int, seed: int, n_sent: int) -> list[list[int]]:
    """Sentence indexes of n passages: two or three sentences each, far apart in the pool
    (other abstracts); the first one's abstract titles the passage."""
    rng = np.random.default_rng(seed)
    lengths, starts = rng.integers(2, 4, n), rng.integers(0, n_sent, n)
    return [[(int(s) + j * 7919) % n_sent for j in range(int(m))] for s, m in zip(starts, lengths, strict=True)]


def _batches(n: int, seed: int, data: dict, rows: int = 100_000, dim: int | None = None):
    """Record batches of the passages (doc_id, title, text, ..., vector); ``dim``: keep the
    vectors' first ``dim`` dimensions (renormalised)."""
    import pyarrow as pa

    from logicrank.pipelines.engines.embed import to_fixed_size_list

    sents, owner, titles, pool = data["sentences"], data["owner"], data["titles"], data["pool"]
    rng = np.random.default_rng(seed + 1)
    plist = passages(n, seed, len(sents))
    for i in range(0, n, rows):
        part = plist[i : i + rows]
        m = len(part)
        vec = np.stack([pool[p].mean(axis=0) for p in part]) + rng.normal(0, 0.02, size=(m, pool.shape[1]))
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        texts = [" ".join(sents[j] for j in p) for p in part]
        yield pa.table({
            "doc_id": [f"p{i + j:07d}" for j in range(m)], "title": [titles[owner[p[0]]] for p in part], "text": texts,
            "metadata": [None] * m, "content_hash": [str(hash(t)) for t in texts], "vector": to_fixed_size_list(_cut(vec, dim)),
        })


def _cut(vec: np.ndarray, dim: int | None) -> np.ndarray:
    if dim is not None and dim < vec.shape[1]:
        vec = vec[:, :dim] / np.linalg.norm(vec[:, :dim], axis=1, keepdims=True)
    return vec.astype(np.float32)


def _table_dim(n: int, data: dict) -> int:
    """The table's vector width: MiniLM's 384, or ``SMALL_DIM`` past ``F16_FROM`` documents,
    where 384 float32 dimensions (15 GiB at 10M) beside the text, the full-text and BM25
    indexes of two versions and a float16 copy would not fit this machine's disk; the dense
    engine is then measured on 384-dimensional float16 vectors written apart (dense-f16)."""
    return data["pool"].shape[1] if n <= F16_FROM else SMALL_DIM


# -- steps (each in a child process) ------------------------------------------------
def _child(args) -> dict:
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)
    os.environ["OMP_NUM_THREADS"] = "1"
    work = Path(args.work)
    data = _load_data(work)
    db = str(work / f"db-{args.size}")
    from logicrank.pipelines.engines.store import DocStore

    step, n = args.step, args.size
    queries, qvec = data["queries"], data["qvec"]
    t0 = time.perf_counter()
    out: dict = {}
    if step == "table":
        import shutil

        shutil.rmtree(db, ignore_errors=True)
        s = DocStore(db)
        from logicrank.pipelines.config.settings import EmbedConfig
        from logicrank.pipelines.engines.embed import model_id

        # MiniLM's space (sentence means + noise): retrieve encodes queries with the bundled encoder into it (shards-equal)
        s.open_or_create(_table_dim(n, data), model_id(EmbedConfig()) if _table_dim(n, data) == data["pool"].shape[1] else "bench-scale (MiniLM sentence means + noise, cut)")
        import pyarrow as pa

        for b in _batches(n, args.seed, data, dim=_table_dim(n, data)):
            now = pa.array(np.full(b.num_rows, np.datetime64("2026-01-01T00:00:00", "us")), pa.timestamp("us", tz="UTC"))
            s.table.add(b.append_column("indexed_at", now).select(s.table.schema.names).cast(s.table.schema))
        out["rows"] = s.count()
    elif step == "fts":
        DocStore(db)._build_fts()
    elif step == "ann":
        if n < ANN_THRESHOLD:
            return {"skipped": f"below the ANN threshold ({ANN_THRESHOLD:,})"}
        if n > 2_000_000:
            return {"skipped": "an option now (index --ann), not built by default; its build grows faster than the corpus (648 s at 1M)"}
        out["index"] = DocStore(db).build_ann()
    elif step == "bm25-build":
        from logicrank.pipelines.engines.bm25 import index_root, update_index

        s = DocStore(db)
        root = index_root(s)
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        done = update_index(s)
        out.update(done)
    elif step == "reindex-1%":
        from logicrank.pipelines.engines.bm25 import SOURCE_COLUMNS, BM25Index, update_index

        s = DocStore(db)
        m = max(1, n // 100)
        rng = np.random.default_rng(args.seed + 2)
        rows = np.sort(rng.choice(n, m, replace=False))
        old = s.table.to_lance().take(rows).to_pydict()
        import pyarrow as pa

        from logicrank.pipelines.engines.embed import to_fixed_size_list

        vec = np.asarray(old["vector"], np.float32) + rng.normal(0, 0.02, size=(m, s.dim)).astype(np.float32)
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        texts = [t + " (revised in the 1% re-index)" for t in old["text"]]
        t = time.perf_counter()
        s.upsert(pa.table({"doc_id": old["doc_id"], "title": old["title"], "text": texts, "metadata": [None] * m,
                           "content_hash": [str(hash(x)) for x in texts], "vector": to_fixed_size_list(vec)}))
        out["upsert_s"] = time.perf_counter() - t
        t = time.perf_counter()
        from datetime import timedelta

        s.maintain(None, timedelta(days=7))  # the index job's default: no ANN index (exact shards serve dense); an existing one updated in place
        out["maintain_s"] = time.perf_counter() - t
        t = time.perf_counter()
        done = update_index(s)
        out["bm25_patch_s"] = time.perf_counter() - t
        out["bm25"] = done
        t = time.perf_counter()
        s.vectors("float16" if n > F16_FROM else "float32")  # the dense engine's file of the new version (written on its first read)
        out["vectors_save_s"] = time.perf_counter() - t
        out["reindex_s"] = out["upsert_s"] + out["maintain_s"] + out["bm25_patch_s"] + out["vectors_save_s"]
        if n <= 1_000_000:  # the patch-or-rebuild decision, measured where a rebuild fits beside the patched index
            t = time.perf_counter()
            BM25Index.build(s.scan(SOURCE_COLUMNS, 8192, read_ahead=True), s.version)
            out["bm25_rebuild_s"] = time.perf_counter() - t
        out["changed"] = m
    elif step == "bm25":
        import pyarrow as pa

        from logicrank.pipelines.retrieval.methods.bm25 import bm25

        s = DocStore(db)
        t = time.perf_counter()
        s.bm25_index().search(queries[:10], K)  # the index loaded, its weights made, the search loop compiled (as bm25s numba is warmed)
        out["load_s"] = time.perf_counter() - t
        method_s, engine_s = [], []
        table = pa.table({"query_id": data["qids"], "text": queries})  # the method's input, as a caller hands it
        reps = 7 if n <= 100_000 else 3 if n <= 1_000_000 else 1  # a run of 0.1 s at 10k: more of them
        for _ in range(reps):  # interleaved, the best of each (the first also fills the query words' memo)
            t = time.perf_counter()
            run = bm25(table, s, K)
            method_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            s.bm25_index().search_flat(queries, K)  # the engine alone: the same search, no run table
            engine_s.append(time.perf_counter() - t)
        out["search_s"] = min(method_s)
        out["qps"] = len(queries) / out["search_s"]
        out["engine_qps"] = len(queries) / min(engine_s)
        out["rows_over_engine"] = out["qps"] / out["engine_qps"]  # the run table's cost: 1.0 is free
        import pyarrow.parquet as pq

        pq.write_table(run, work / f"run-bm25-{n}.parquet")
    elif step == "bm25s":
        import bm25s
        import Stemmer

        if n > BM25S_MAX_DOCS:
            return {"skipped": f"does not fit: bm25s holds its index and the corpus's tokens in memory (3.5 GiB peak at 1M "
                               f"documents, measured here; about 35 GiB at 10M) on a machine of {_mem_gib():.0f} GiB"}
        s = DocStore(db)
        t = time.perf_counter()
        docs = s.table.to_lance().to_table(columns=["title", "text"])
        texts = [f"{a or ''} {b}" for a, b in zip(docs.column("title").to_pylist(), docs.column("text").to_pylist(), strict=True)]
        del docs
        out["read_s"] = time.perf_counter() - t
        stem = Stemmer.Stemmer("english")
        t = time.perf_counter()
        tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False)
        del texts
        results = {}
        for backend in ("numpy", "numba"):
            r = bm25s.BM25(backend=backend)
            r.index(tokens, show_progress=False)
            if backend == "numpy":
                out["index_s"] = time.perf_counter() - t
            if backend == "numba":  # JIT compile outside the timing
                r.retrieve(bm25s.tokenize(queries[:10], stopwords="en", stemmer=stem, return_ids=False, show_progress=False), k=K, n_threads=1, show_progress=False)
            t1 = time.perf_counter()
            q = bm25s.tokenize(queries, stopwords="en", stemmer=stem, return_ids=False, show_progress=False)
            r.retrieve(q, k=K, n_threads=1, show_progress=False)
            results[backend] = len(queries) / (time.perf_counter() - t1)
            del r
        out["qps"], out["qps_numba"] = results["numpy"], results["numba"]
    elif step in ("dense", "dense-f16"):
        import shutil

        from logicrank.pipelines.engines import vectors
        from logicrank.pipelines.retrieval.methods.dense import exact_top_k

        precision = "float16" if step == "dense-f16" else "float32"
        if n > F16_FROM and precision == "float32":
            return {"skipped": f"float16 only past {F16_FROM:,} documents (a float32 copy, {n * 384 * 4 / 2**30:.0f} GiB, does not fit this "
                               "machine's disk beside the step's other files)"}
        if n > F16_FROM:
            out.update(_dense_apart(work, n, data, args.seed))
            out["seconds"] = time.perf_counter() - t0
            return out
        s = DocStore(db)
        shutil.rmtree(vectors.root(s) / f"v{s.version}" / precision, ignore_errors=True)  # the save is part of the step
        t = time.perf_counter()
        out["vectors_mib"] = s.vectors(precision).nbytes() / (1 << 20)
        out["load_s"] = time.perf_counter() - t  # the version's vectors read from the table and saved, then mapped
        t = time.perf_counter()
        run = exact_top_k(data["qids"], qvec, s, K, precision=precision, product="numpy")
        out["search_s"] = time.perf_counter() - t
        out["mode"] = f"exact (blocked product, {precision} vectors mapped)"
        out["qps"] = len(queries) / out["search_s"]
        import pyarrow.parquet as pq

        if precision == "float32":
            pq.write_table(run, work / f"run-dense-{n}.parquet")
        elif (work / f"run-dense-{n}.parquet").exists():  # float16's recall against float32's exact run
            exact = pq.read_table(work / f"run-dense-{n}.parquet").to_pandas()
            half = run.to_pandas()
            for depth in (10, K):
                want = exact[exact["rank"] <= depth].groupby("query_id")["doc_id"].apply(set)
                got = half[half["rank"] <= depth].groupby("query_id")["doc_id"].apply(set)
                out[f"recall@{depth}_vs_float32"] = float(np.mean([len(got[q] & want[q]) / depth for q in want.index]))
    elif step == "bm25-shards":
        out.update(_bm25_shards(work, db, n, data))
    elif step == "shards-equal":
        if _table_dim(n, data) != data["pool"].shape[1]:
            return {"skipped": f"past {F16_FROM:,} documents the table's vectors are cut to {SMALL_DIM} dimensions (disk): no encoder makes its queries"}
        out.update(_shards_equal(work, db, n, data))
    elif step == "dense-ann":
        import pyarrow.parquet as pq

        from logicrank.pipelines.retrieval.methods.dense import REFINE_FACTOR

        s = DocStore(db)
        if not s.has_ann_index():
            return {"skipped": f"no ANN index below {ANN_THRESHOLD:,}"}
        t = time.perf_counter()
        hits = s.vector_search(qvec, K, refine_factor=REFINE_FACTOR)
        out["search_s"] = time.perf_counter() - t
        out["qps"] = len(queries) / out["search_s"]
        out["mode"] = f"ANN (IVF_HNSW_SQ, refine {REFINE_FACTOR})"
        # recall of the timed search (k = K, as dense asks it) against the exact run, over the 300 distinct queries
        ann = hits.to_pandas()
        ann = ann[ann.query_index < 300].sort_values(["query_index", "score"], ascending=[True, False])
        exact = pq.read_table(work / f"run-dense-{n}.parquet").to_pandas()
        for depth in (10, K):
            want = {q: set(g.doc_id) for q, g in exact[exact["rank"] <= depth].groupby("query_id")}
            got = {i: set(g.doc_id.head(depth)) for i, g in ann.groupby("query_index")}
            out[f"recall@{depth}"] = float(np.mean([len(got.get(i, set()) & want[data["qids"][i]]) / depth for i in range(min(300, len(qvec)))]))
    elif step == "numpy":
        s = DocStore(db)
        t = time.perf_counter()
        ids = np.concatenate([b[0] for b in s.vector_blocks()])
        del ids
        m = np.concatenate([b[1] for b in s.vector_blocks()])
        out["load_s"] = time.perf_counter() - t
        t = time.perf_counter()
        qb, tile = 1024, (1 << 22) // 1024  # query blocks x document tiles: each block streams the vectors once
        for i in range(0, len(qvec), qb):
            best = None
            for j in range(0, len(m), tile):
                sc = qvec[i : i + qb] @ m[j : j + tile].T
                part = np.argpartition(-sc, K - 1, axis=1)[:, :K] if sc.shape[1] > K else np.broadcast_to(np.arange(sc.shape[1]), sc.shape)
                cand = (part + j, np.take_along_axis(sc, part, axis=1))
                if best is not None:
                    cand = (np.concatenate([best[0], cand[0]], axis=1), np.concatenate([best[1], cand[1]], axis=1))
                keep = np.argpartition(-cand[1], K - 1, axis=1)[:, :K] if cand[1].shape[1] > K else np.broadcast_to(np.arange(cand[1].shape[1]), cand[1].shape)
                best = (np.take_along_axis(cand[0], keep, axis=1), np.take_along_axis(cand[1], keep, axis=1))
            np.argsort(-best[1], axis=1)
        out["search_s"] = time.perf_counter() - t
        out["qps"] = len(queries) / out["search_s"]
    elif step == "hybrid":
        import pyarrow.parquet as pq

        from logicrank.pipelines.retrieval.methods.hybrid import rrf

        a, b = pq.read_table(work / f"run-bm25-{n}.parquet"), pq.read_table(work / f"run-dense-{n}.parquet")
        t = time.perf_counter()
        rrf([a, b], K)
        out["search_s"] = time.perf_counter() - t
        out["qps"] = len(queries) / out["search_s"]
    elif step in ("itlr-exact", "itlr-ann"):
        import pyarrow.parquet as pq

        from logicrank.pipelines.retrieval.logic.fuzzy import Operators
        from logicrank.pipelines.retrieval.methods.itlr import Calibration, ann_candidates, score_candidates, score_exact

        s = DocStore(db)
        parsed, terms, T = _logic_queries(data, args.seed)
        out["queries"], out["unique_terms"] = len(parsed), len(terms)
        ops, cal = Operators(), Calibration()
        if step == "itlr-exact":
            t = time.perf_counter()
            for _, v in s.vector_blocks(32768):
                v @ T.T
            out["numpy_product_s"] = time.perf_counter() - t
            t = time.perf_counter()
            run = score_exact(parsed, terms, T, s.vector_blocks(32768), 10, [ops], cal, threads=1)[ops]
            out["search_s"] = time.perf_counter() - t
            out["exact_vs_product"] = out["search_s"] / out["numpy_product_s"]
            pq.write_table(pa_table(run), work / f"run-itlr-{n}.parquet")
        else:
            t = time.perf_counter()
            cands, _ = ann_candidates(parsed, terms, T, lambda v, k: s.vector_search(v, k, with_vectors=True), 100)
            run = score_candidates(parsed, terms, T, cands, 10, ops, cal)
            out["search_s"] = time.perf_counter() - t
            out["mode"] = "ANN (IVF_HNSW_SQ)" if s.has_ann_index() else "exact neighbours (no ANN index below the threshold)"
            truth = pq.read_table(work / f"run-itlr-{n}.parquet").to_pandas().groupby("query_id")["doc_id"].apply(set)
            found = run.groupby("query_id")["doc_id"].apply(set)
            out["recall@10"] = float(np.mean([len(truth[q] & found.get(q, set())) / len(truth[q]) for q in truth.index]))
        out["qps"] = len(parsed) / out["search_s"]
    elif step == "itlr-bm25":
        from logicrank.pipelines.retrieval.logic.fuzzy import Operators
        from logicrank.pipelines.retrieval.logic.query import relabel
        from logicrank.pipelines.retrieval.methods.evidence import BM25Evidence, calibrate_evidence
        from logicrank.pipelines.retrieval.methods.itlr import LogicalQuery, score_exact, unique_terms

        s = DocStore(db)
        parsed, slots, _ = _logic_queries(data, args.seed)
        text = {t: data["queries"][j] for j, t in enumerate(slots)}  # slot t<j>: the j-th SciFact query's text
        parsed = [LogicalQuery(q.query_id, relabel(q.ast, text), q.status) for q in parsed]
        terms = unique_terms(parsed)
        out["queries"], out["unique_terms"] = len(parsed), len(terms)
        index = s.bm25_index()
        index.search(terms[:10], K)  # the index loaded, its weights made, the search loop compiled
        t = time.perf_counter()
        index.search(terms, K)
        out["term_search_s"] = time.perf_counter() - t
        t = time.perf_counter()
        evidence = BM25Evidence(s, terms)
        cal = calibrate_evidence(evidence, "max")
        out["evidence_s"] = time.perf_counter() - t
        out["evidence_nnz"] = int(evidence.by_doc.nnz)
        run = score_exact(parsed, terms, None, evidence.blocks(32768), 10, [Operators()], cal, threads=1)[Operators()]
        out["search_s"] = time.perf_counter() - t
        out["vs_term_search"] = out["search_s"] / out["term_search_s"]
        out["qps"] = len(parsed) / out["search_s"]
        out["rows"] = len(run)
    elif step == "orlog":
        import pandas as pd
        import pyarrow.parquet as pq

        from logicrank.pipelines.retrieval.logic.query import parse
        from logicrank.pipelines.retrieval.methods.orlog import OrlogQuery, posteriors

        base = pq.read_table(work / f"run-bm25-{n}.parquet").to_pandas()
        base = base.assign(query_id=base["query_id"].map({q: f"l{i}" for i, q in enumerate(data["qids"])}))
        rng = np.random.default_rng(args.seed + 4)
        t = time.perf_counter()
        # each query's atoms have its own ids (a0, a1, a2), as the decomposition writes them
        local = ("a0", "a1", "a2")
        queries = [OrlogQuery(f"l{i}", "", tuple((a, f"{{x}} is about {a}") for a in local), parse(TEMPLATES[i % len(TEMPLATES)].format(*local)), "ok")
                   for i in range(len(data["qids"]))]
        atoms = {q.query_id: [a for a, _ in q.atoms] for q in queries}
        cand = base[["query_id", "doc_id", "rank"]].rename(columns={"rank": "base_rank"})
        per = cand["query_id"].map(lambda q: len(atoms[q])).to_numpy()
        scored = cand.loc[cand.index.repeat(per)].reset_index(drop=True)
        scored["atom_id"] = [a for q in cand["query_id"] for a in atoms[q]]
        scored["p_calibrated"] = rng.uniform(size=len(scored))
        out["build_s"] = time.perf_counter() - t
        t = time.perf_counter()
        post = posteriors(queries, scored)
        out["search_s"] = time.perf_counter() - t
        out["pairs"], out["candidates"] = len(scored), len(post)
        out["us_per_candidate"] = 1e6 * out["search_s"] / len(post)
        out["qps"] = len(queries) / out["search_s"]
        assert isinstance(post, pd.DataFrame) and len(post) == len(cand)
    elif step == "evaluate":
        import pyarrow.parquet as pq

        from logicrank.pipelines.evaluation.core import run_metrics
        from logicrank.pipelines.evaluation.measures import parse_measures

        run = pq.read_table(work / f"run-bm25-{n}.parquet")
        qrels = _pseudo_qrels(n, args.seed, data)
        t = time.perf_counter()
        m = run_metrics(run, qrels, parse_measures(["nDCG@10", "R@100"]), "bm25").to_pandas()
        out["search_s"] = time.perf_counter() - t
        out["qps"] = len(queries) / out["search_s"]
        allq = m[m["query_id"] == "all"]
        out.update({r["measure"]: round(float(r["value"]), 4) for _, r in allq.iterrows()})
        out["qrels"] = qrels.num_rows
    elif step == "bm25-pool":
        import shutil

        from logicrank.jobs.retrieve import run_retrieve
        from logicrank.pipelines.config.retrieval import RetrieveConfig
        from logicrank.pipelines.config.settings import RayConfig

        DocStore(db).mark_complete()  # the table is built here, not by `logicrank index`: retrieve reads marked versions only
        qpath = work / f"pool-queries-{n}.jsonl"
        qpath.write_text("".join(json.dumps({"_id": f"{q}~{c}", "text": t}) + "\n"
                                 for c in range(POOL_COPIES) for q, t in zip(data["qids"], queries, strict=True)), encoding="utf-8")
        total = POOL_COPIES * len(queries)
        for actors in (1, 2):
            run_dir = work / f"pool-{n}-{actors}"
            shutil.rmtree(run_dir, ignore_errors=True)  # the job caches stages by digest: start clean
            cfg = RetrieveConfig.preset(("bm25",), queries=str(qpath), db=db, set={"bm25.k": K}, ray=RayConfig(num_cpus=2, retrieve_actors=actors))
            t = time.perf_counter()
            run_retrieve(cfg, run_dir, progress=False)
            wall = time.perf_counter() - t
            manifest = json.loads((run_dir / "manifest.json").read_text())
            stage_s = next(v for key, v in manifest["timings_s"].items() if key.startswith("bm25:"))
            assert manifest["pipelines"]["bm25"]["queries"] == total, manifest["pipelines"]
            out[f"actors_{actors}"] = {"stage_s": stage_s, "qps": total / stage_s, "wall_s": wall,
                                       "placement": manifest["pipelines"]["bm25"]["stages"][0]["placement"]}
            shutil.rmtree(run_dir, ignore_errors=True)
        out["queries"] = total
        out["qps"] = out["actors_2"]["qps"]
        out["two_over_one"] = out["actors_2"]["qps"] / out["actors_1"]["qps"]
    out["seconds"] = time.perf_counter() - t0
    return out


def _dense_apart(work: Path, n: int, data: dict, seed: int) -> dict:
    """The exact dense engine over ``n`` 384-dimensional float16 unit vectors written apart from
    the table (the table past ``F16_FROM`` holds ``SMALL_DIM`` dimensions): the passages'
    vectors as the table step makes them, streamed into a mapped ``.npy``, then every query's
    exact top k (pipelines/engines/exact.py, numpy, one thread). The write is reported apart."""
    import pyarrow as pa

    from logicrank.pipelines.engines.exact import top_k
    from logicrank.pipelines.engines.vectors import Vectors, tiebreak_ranks

    path = work / f"vectors-{n}-float16.npy"
    t = time.perf_counter()
    m = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(n, data["pool"].shape[1]))
    ids, at = [], 0
    for b in _batches(n, seed, data):
        block = np.asarray(b.column("vector").combine_chunks().flatten().to_numpy(), np.float32).reshape(b.num_rows, -1)
        m[at : at + len(block)] = block
        ids.append(b.column("doc_id").combine_chunks())
        at += len(block)
    m.flush()
    del m
    ids = pa.concat_arrays(ids)
    out = {"vectors_write_s": time.perf_counter() - t, "vectors_mib": path.stat().st_size / (1 << 20)}
    v = Vectors(ids, np.load(path, mmap_mode="r"), tiebreak_ranks(ids), path)
    t = time.perf_counter()
    top_k(data["qvec"], v, K, product="numpy")
    out["search_s"] = time.perf_counter() - t
    out["qps"] = len(data["qvec"]) / out["search_s"]
    out["mode"] = "exact (blocked product, float16 vectors mapped; written apart from the table)"
    path.unlink()
    return out


def _mem_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)


def _bm25_shards(work: Path, db: str, n: int, data: dict) -> dict:
    """`logicrank retrieve` (run_retrieve) with bm25 over the queries on 1, 2 and 4 search actors,
    each holding one shard of the mapped index (a local Ray cluster of one node, as many logical
    CPUs as shards: on 2 cores, 4 shards share them). Per run: the stage's seconds (the actors'
    start and the index mapping included), q/s, each actor's memory (peak RSS, and PSS, where a
    page mapped by several processes counts once over them) and the node's (the actors' PSS summed)
    against one copy of the index's mapped files; the run equal to the unsharded one."""
    import shutil

    import pyarrow.parquet as pq

    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.config.settings import RayConfig
    from logicrank.pipelines.engines.store import DocStore

    s = DocStore(db)
    s.mark_complete()  # the table is built here, not by `logicrank index`: retrieve reads marked versions only
    index = s.bm25_index()
    out = {"index_mib": index.mapped_bytes() / (1 << 20)}
    qpath = work / f"shard-queries-{n}.jsonl"
    qpath.write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in zip(data["qids"], data["queries"], strict=True)), encoding="utf-8")
    reference = None
    for shards in (1, 2, 4):
        run_dir = work / f"shards-{n}-{shards}"
        shutil.rmtree(run_dir, ignore_errors=True)
        cfg = RetrieveConfig.preset(("bm25",), queries=str(qpath), db=db, set={"bm25.k": K},
                                    ray=RayConfig(num_cpus=max(2, shards), retrieve_shards=shards, retrieve_batch_rows=1024))
        run_retrieve(cfg, run_dir, progress=False)
        manifest = json.loads((run_dir / "manifest.json").read_text())
        stage_s = next(v for key, v in manifest["timings_s"].items() if key.startswith("bm25:"))
        actors = manifest["pipelines"]["bm25"]["stages"][0]["shards"]
        run = pq.read_table(run_dir / "runs" / "bm25.parquet").select(["query_id", "doc_id", "rank", "score"])
        if reference is None:
            reference = run
        same = run.select(["query_id", "doc_id", "rank"]).equals(reference.select(["query_id", "doc_id", "rank"])) and bool(
            np.abs(run.column("score").to_numpy() - reference.column("score").to_numpy()).max(initial=0) <= 1e-6)
        added = [a["pss_mib"] - a["pss_at_start_mib"] for a in actors]  # what mapping and searching the shard added to each actor
        out[f"shards_{shards}"] = {"stage_s": stage_s, "qps": len(data["queries"]) / stage_s, "equal_to_1_shard": same,
                                   "actor_peak_rss_mib": [a["peak_rss_mib"] for a in actors],
                                   "actor_peak_over_start_mib": [a["peak_rss_mib"] - a["rss_at_start_mib"] for a in actors],
                                   "actor_pss_mib": [a["pss_mib"] for a in actors], "node_pss_mib": sum(a["pss_mib"] for a in actors),
                                   "node_pss_added_mib": sum(added), "node_added_over_index": sum(added) / out["index_mib"]}
        shutil.rmtree(run_dir, ignore_errors=True)
    out["qps"] = out["shards_1"]["qps"]
    return out


def _shards_equal(work: Path, db: str, n: int, data: dict, n_queries: int = 300, shards: int = 4) -> dict:
    """`logicrank retrieve` (run_retrieve) with bm25, dense (exact) and ITLR exact (dense terms)
    over SciFact's 300 queries, each with a logical query of three words of the queries, in
    ``shards`` search actors and again unsharded (one process searches the whole index): per
    method, whether the runs hold the same ids and ranks with scores within 1e-6, and the
    sharded stage's seconds."""
    import shutil

    import pyarrow.parquet as pq

    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.config.settings import RayConfig
    from logicrank.pipelines.engines.store import DocStore
    from logicrank.pipelines.retrieval.stages.itlr import ITLROptions
    from logicrank.pipelines.retrieval.stages.retrievers import BM25Options, DenseOptions

    DocStore(db).mark_complete()
    texts = data["queries"][:n_queries]
    # ITLR's terms: words of the queries (not whole query texts, whose vectors the run's encoder memo would hand
    # over from dense's batches: the encoder's vectors move by ~2e-7 with the batch a text is padded in)
    words = sorted({w for t in texts for w in re.findall(r"[A-Za-z]{6,}", t)})
    rng = np.random.default_rng(7)
    qpath = work / f"equal-queries-{n}.jsonl"
    with qpath.open("w", encoding="utf-8") as f:
        for i, (qid, text) in enumerate(zip(data["qids"][:n_queries], texts, strict=True)):
            terms = [words[j] for j in rng.choice(len(words), 3, replace=False)]
            f.write(json.dumps({"_id": qid, "text": text, "logical_query": TEMPLATES[i % len(TEMPLATES)].format(*terms)}) + "\n")
    pipelines = {"bm25": [BM25Options(k=K)], "dense": [DenseOptions(k=K)], "itlr": [ITLROptions(k=K, mode="exact", scorer="dense")]}
    runs, out = {}, {"queries": n_queries, "shards": shards}
    for count in (None, shards):
        run_dir = work / f"equal-{n}-{count or 1}"
        shutil.rmtree(run_dir, ignore_errors=True)
        # retrieve_local_s 0: unsharded, bm25 and dense run on the pool in batches of 100 queries, as the shards do: the same
        # batches encoded, the same query vectors
        cfg = RetrieveConfig(queries=str(qpath), db=db, pipelines=pipelines,
                             ray=RayConfig(num_cpus=max(2, shards), retrieve_shards=count, retrieve_batch_rows=100, retrieve_local_s=0))
        run_retrieve(cfg, run_dir, progress=False)
        manifest = json.loads((run_dir / "manifest.json").read_text())
        for name in pipelines:
            runs[(name, count)] = pq.read_table(run_dir / "runs" / f"{name}.parquet").select(["query_id", "doc_id", "rank", "score"])
            if count:
                out[f"{name}_stage_s"] = next(v for key, v in manifest["timings_s"].items() if key.startswith(f"{name}:"))
        shutil.rmtree(run_dir, ignore_errors=True)
    for name in pipelines:
        a, b = runs[(name, None)], runs[(name, shards)]
        out[f"{name}_rows"] = a.num_rows
        same_rows = a.num_rows == b.num_rows and a.select(["query_id", "doc_id", "rank"]).equals(b.select(["query_id", "doc_id", "rank"]))
        diff = np.abs(a.column("score").to_numpy() - b.column("score").to_numpy()).max(initial=0) if a.num_rows == b.num_rows else np.inf
        out[f"{name}_equal"] = bool(same_rows and diff <= 1e-6)
        if not out[f"{name}_equal"]:  # what differs, for the report
            a_df, b_df = a.to_pandas(), b.to_pandas()
            bad = (a_df["doc_id"] != b_df["doc_id"]) | (a_df["rank"] != b_df["rank"]) if len(a_df) == len(b_df) else a_df["doc_id"].notna()
            out[f"{name}_differing_rows"] = int(bad.sum())
            out[f"{name}_max_score_diff"] = float(diff)
            out[f"{name}_first_differing"] = [a_df[bad].head(3).to_dict("records"), b_df[bad].head(3).to_dict("records")]
    return out


def pa_table(df):
    import pyarrow as pa

    return pa.Table.from_pandas(df, preserve_index=False)


def _logic_queries(data: dict, seed: int):
    """One logical query per benchmark query (``l<i>``, the i-th query's id mapped in orlog):
    three distinct terms of SciFact's 300 queries in one of four shapes; the terms' vectors
    are those queries' real vectors."""
    import pyarrow as pa

    from logicrank.pipelines.retrieval.methods.itlr import parse_queries

    distinct = min(300, len(data["qvec"]))
    rng = np.random.default_rng(seed + 3)
    rows = []
    for i in range(len(data["qids"])):
        picks = rng.choice(distinct, 3, replace=False)
        rows.append({"query_id": f"l{i}", "text": "x", "logical_query": TEMPLATES[i % len(TEMPLATES)].format(*(f"t{j}" for j in picks))})
    return parse_queries(pa.Table.from_pylist(rows)), [f"t{j}" for j in range(distinct)], np.ascontiguousarray(data["qvec"][:distinct])


def _pseudo_qrels(n: int, seed: int, data: dict):
    import pyarrow as pa

    from logicrank.pipelines.datasets import scifact
    from logicrank.pipelines.io import read_qrels

    base = read_qrels(scifact().qrels).to_pandas()
    rel = {}
    for q, d in zip(base["query_id"], base["doc_id"], strict=True):
        rel.setdefault(str(d), set()).add(str(q))
    owner, ids = data["owner"], data["abstract_ids"]
    rows = {"query_id": [], "doc_id": [], "relevance": []}
    copies = len(data["qids"]) // 300 if len(data["qids"]) >= 300 else 1
    for i, p in enumerate(passages(n, seed, len(data["sentences"]))):
        for q in rel.get(str(ids[owner[p[0]]]), ()):
            for c in range(copies):
                rows["query_id"].append(f"{q}#{c}")
                rows["doc_id"].append(f"p{i:07d}")
                rows["relevance"].append(1)
    return pa.table({"query_id": pa.array(rows["query_id"], pa.string()), "doc_id": pa.array(rows["doc_id"], pa.string()),
                     "relevance": pa.array(rows["relevance"], pa.int32())})


def _load_data(work: Path) -> dict:
    import pickle

    with open(work / "data.pkl", "rb") as f:
        return pickle.load(f)


def _prepare(work: Path, n_queries: int) -> dict:
    """Sentences, their vectors, the queries and their vectors (cached in ``work``)."""
    import pickle

    from logicrank.pipelines.datasets import scifact

    data_path = work / "data.pkl"
    data = scifact()
    sents, owner, ids, titles = sentences(data.corpus)
    encoder: list = []
    pool = _embedded(work / "sentence-vectors.npy", sents, encoder)
    base = [json.loads(line) for line in data.queries.read_text(encoding="utf-8").splitlines() if line.strip()]
    copies = max(1, n_queries // len(base))
    queries = [q["text"] for _ in range(copies) for q in base][:n_queries]
    qids = [f"{q['_id']}#{c}" for c in range(copies) for q in base][:n_queries]
    qbase = _embedded(work / "query-vectors.npy", [q["text"] for q in base], encoder)
    out = {"sentences": sents, "owner": owner, "abstract_ids": ids, "titles": titles, "pool": pool, "queries": queries, "qids": qids,
           "qvec": np.tile(qbase, (copies, 1))[:n_queries]}
    with open(data_path, "wb") as f:
        pickle.dump(out, f)
    return out


def _run_step(work: Path, size: int, step: str, seed: int, timeout: int) -> dict:
    """Run one step in a child process; its JSON result plus its peak RSS."""
    cmd = [sys.executable, __file__, "--child", step, "--size", str(size), "--work", str(work), "--seed", str(seed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.perf_counter()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"timed out after {timeout} s"}
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": (stderr.strip().splitlines() or ["?"])[-1][:300], "wall_s": wall}
    res = json.loads(stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000,10000000")
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--out", default="runs/bench")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per step")
    ap.add_argument("--merge", action="store_true", help="keep the earlier report's rows of the steps and sizes not run now "
                    "(each row says when it was measured); the tables in <out>/scale must be the earlier run's")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.step = args.child
        res = _child(args)
        # VmHWM: this process image's peak (getrusage's maxrss would carry the parent's over the fork)
        hwm = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
        res["peak_rss_mib"] = int(hwm.split()[1]) / 1024
        print(json.dumps(res, default=float))
        return
    t_all = time.perf_counter()
    report = Path(args.out) / "bench_scale.json"
    if args.merge and report.exists() and json.loads(report.read_text()).get("queries") != args.queries:
        sys.exit(f"bench_scale: --merge needs the earlier run's --queries ({json.loads(report.read_text()).get('queries')})")
    work = Path(args.out) / "scale"
    work.mkdir(parents=True, exist_ok=True)
    _prepare(work, args.queries)
    rows = []
    today = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    sizes, steps = [int(x) for x in args.sizes.split(",")], args.steps.split(",")
    for size in sizes:
        for step in steps:
            res = _run_step(work, size, step, args.seed, args.timeout)
            rows.append({"size": size, "step": step, "measured": today, **res})
            print(json.dumps(rows[-1], default=float), flush=True)
    total_s = time.perf_counter() - t_all
    if args.merge and (Path(args.out) / "bench_scale.json").exists():
        report = Path(args.out) / "bench_scale.json"
        earlier = json.loads(report.read_text())
        when = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(report.stat().st_mtime))  # the earlier run's end
        done = {(r["size"], r["step"]) for r in rows}
        kept = [{"measured": when, **r} for r in earlier["rows"] if (r["size"], r["step"]) not in done]
        rows = sorted(kept + rows, key=lambda r: (r["size"], STEPS.index(r["step"]) if r["step"] in STEPS else len(STEPS)))
        total_s += earlier.get("total_s", 0.0)
    _report(args, rows, total_s)


def _report(args, rows: list[dict], total_s: float) -> None:
    from logicrank.pipelines.markdown import table
    from tests.perf.report import write_report

    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), platform.processor())
    runs = "one run" if len({r.get("measured") for r in rows}) <= 1 else "rows from more than one run, each dated"
    lines = [f"# Bulk retrieval cost curve ({args.queries:,} queries, k={K}; {os.cpu_count()} cores, {cpu}; {runs}, {total_s:.0f} s; one thread per step)", ""]
    cells = []
    for r in rows:
        notes = {k: v for k, v in r.items() if k not in ("size", "step", "seconds", "qps", "peak_rss_mib", "wall_s")}
        qps = f"{r['qps']:.0f}" if "qps" in r else ""
        secs = f"{r['seconds']:.2f}" if "seconds" in r else ""
        peak = f"{r['peak_rss_mib']:.0f}" if "peak_rss_mib" in r else ""
        cells.append([f"{r['size']:,}", str(r["step"]), secs, qps, peak, json.dumps(notes, default=lambda x: round(float(x), 3))])
    lines += table(["docs", "step", "s", "q/s", "peak RSS MiB", "notes"], cells, align="rlrrrl")
    write_report(args.out, "bench_scale", {"queries": args.queries, "k": K, "cpu": cpu, "total_s": total_s, "rows": rows}, lines)
    _plot(rows, Path(args.out) / "bench_scale.png")


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for step in STEPS:
        if step in NOT_PLOTTED:
            continue
        pts = sorted((r["size"], r["seconds"]) for r in rows if r["step"] == step and "seconds" in r and "skipped" not in r)
        if len(pts) >= 2:
            ax.plot(*zip(*pts, strict=True), marker="o", label=step)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("documents")
    ax.set_ylabel("seconds (one thread)")
    ax.set_title("Bulk retrieval cost against corpus size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
