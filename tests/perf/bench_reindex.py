"""The cost of a 1% re-index, and the index job driver's memory in change detection (not a test).

    make bench-reindex                                              # 100k documents, ANN off, then on
    python tests/perf/bench_reindex.py --docs 100000 --ann on       # one size, one setting
    python tests/perf/bench_reindex.py --diff 100000,1000000        # the driver's change detection

Re-index (``--docs``): a synthetic table as the index job's first run leaves it (random unit
vectors of 384 dimensions, texts of 40 words drawn from 20,000, the scalar and full-text
indexes, the ANN index with ``--ann on``, the BM25 engine's index), then 1% of the documents
edited (new text and vector), upserted, the table maintained (pipelines/engines/store/writing.py,
``DocStore.maintain``) and the BM25 index patched (``pipelines.engines.bm25.update_index``). Prints
the seconds of each part, and those of the first build beside them. ``--like-bench-scale``:
the table's indexes made as tests/perf/bench_scale.py makes them (the full-text and ANN
indexes, no doc_id index), where the issue measured 66 s of maintenance at 100k.

Change detection (``--diff``): a table of N ids, hashes and tiny vectors, and a snapshot of the
same N ids (1% changed, 0.5% gone, 0.5% new) streamed in batches of 512 through what the index
job runs: classify each batch against the stored hashes (pipelines/operations/indexing.py, ``EmbedStage``
with an embedder that returns zeros), the writer's dedup of ids (``IndexWriter`` over a store
that keeps nothing), and the count of stored ids the snapshot lacks. Each size runs in its own
process; printed: its peak RSS (``ru_maxrss``) and the rise over the process's RSS once the
table was opened. (The snapshot is generated batch by batch, so the process holds no list of it.)

Before and after: the script runs on the code before the change too (it takes the old
``EmbedStage(config, stored_table)`` API when ``StoredHashes`` is absent; ``--ann on`` is the
old default): ``git archive e55375d pipelines schemas jobs | tar -x -C /tmp/before``, copy
this file to /tmp/before/tests/perf/, and run it there with ``PYTHONPATH=/tmp/before``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

DIM = 384
WORDS = 40
VOCAB = 20_000


def _texts(rng: np.random.Generator, n: int) -> list[str]:
    ids = rng.integers(0, VOCAB, size=(n, WORDS))
    return [" ".join(f"w{w}" for w in row) for row in ids]


def _vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _rows(rng: np.random.Generator, ids: list[str], dim: int, texts: list[str] | None = None) -> pa.Table:
    from logicrank.pipelines.engines.embed import to_fixed_size_list

    n = len(ids)
    texts = texts if texts is not None else _texts(rng, n)
    return pa.table({"doc_id": ids, "title": [f"title {i}" for i in ids], "text": texts, "metadata": [None] * n,
                     "content_hash": [str(hash(t)) for t in texts], "vector": to_fixed_size_list(_vectors(rng, n, dim))})


def reindex(n: int, ann: str, work: Path, dim: int = DIM, like_bench_scale: bool = False) -> dict:
    from logicrank.pipelines.engines import bm25
    from logicrank.pipelines.engines.store import DocStore

    db = work / f"db-{n}-{ann}"
    shutil.rmtree(db, ignore_errors=True)
    s = DocStore(str(db))
    s.open_or_create(dim, "bench-reindex (random vectors)")
    rng = np.random.default_rng(0)
    out: dict = {"docs": n, "ann": ann, "like_bench_scale": like_bench_scale}
    t = time.perf_counter()
    for start in range(0, n, 100_000):
        s.upsert(_rows(rng, [f"d{i:09d}" for i in range(start, min(n, start + 100_000))], dim))
    out["build_table_s"] = time.perf_counter() - t
    # ann on: from 100k rows, as the job's ann_threshold; off: None (only the new maintain knows it)
    threshold = 100_000 if ann == "on" else None
    t = time.perf_counter()
    if like_bench_scale:  # its table step writes no doc_id index; its fts and ann steps build the others
        out["build"] = {**s._build_fts(), **({"vector": s.build_ann()} if ann == "on" else {})}
    else:
        out["build"] = s.maintain(threshold, timedelta(days=7))
    out["build_indexes_s"] = time.perf_counter() - t
    t = time.perf_counter()
    bm25.update_index(s)
    out["build_bm25_s"] = time.perf_counter() - t

    m = max(1, n // 100)
    rows = np.sort(rng.choice(n, m, replace=False))
    t = time.perf_counter()
    s.upsert(_rows(rng, [f"d{i:09d}" for i in rows], dim))
    out["upsert_s"] = time.perf_counter() - t
    t = time.perf_counter()
    out["maintenance"] = s.maintain(threshold, timedelta(days=7))
    out["maintain_s"] = time.perf_counter() - t
    t = time.perf_counter()
    out["bm25"] = bm25.update_index(s)
    out["bm25_patch_s"] = time.perf_counter() - t
    out["reindex_s"] = out["upsert_s"] + out["maintain_s"] + out["bm25_patch_s"]
    out["build_s"] = out["build_table_s"] + out["build_indexes_s"] + out["build_bm25_s"]
    out["changed"] = m
    return out


# -- the driver's change detection ---------------------------------------------------
def _diff_table(n: int, work: Path) -> str:
    """A table of ``n`` ids, hashes and 4-dimensional vectors, indexed as the job leaves it (made once)."""
    from logicrank.pipelines.engines.store import DocStore

    db = work / f"diff-db-{n}"
    if (db / "done").exists():
        return str(db)
    shutil.rmtree(db, ignore_errors=True)
    s = DocStore(str(db))
    s.open_or_create(4, "bench-reindex (tiny vectors)")
    for start in range(0, n, 200_000):
        ids = [f"d{i:09d}" for i in range(start, min(n, start + 200_000))]
        k = len(ids)
        s.upsert(pa.table({"doc_id": ids, "title": [None] * k, "text": ["x"] * k, "metadata": [None] * k,
                           "content_hash": [f"h{i}" for i in ids], "vector": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(4 * k, np.float32)), 4)}))
    s.table.create_scalar_index("doc_id", index_type="BTREE", replace=True)
    (db / "done").touch()
    return str(db)


def _snapshot(n: int, batch_rows: int = 512):
    """PARSED batches of the snapshot: ids 0..n (every 200th gone, every 100th changed), then n/200 new ones."""
    from logicrank.pipelines.corpus import PARSED

    def numbers():  # made batch by batch: the generator holds no list of the snapshot's ids
        part = []
        for i in range(n + n // 200):
            if i >= n or i % 200 != 7:
                part.append(i)
                if len(part) == batch_rows:
                    yield part
                    part = []
        if part:
            yield part

    for part in numbers():
        doc_ids = [f"d{i:09d}" for i in part]
        hashes = [f"hd{i:09d}" if i % 100 != 3 else f"changed{i}" for i in part]
        k = len(part)
        yield pa.Table.from_pydict({"doc_id": doc_ids, "title": [None] * k, "text": ["x"] * k, "metadata": [None] * k, "content_hash": hashes,
                                    "_source": ["snap.jsonl"] * k, "_location": part, "_record": part, "_reason": [None] * k, "_detail": [None] * k}, schema=PARSED)


class _ZeroEmbedder:
    class config:  # noqa: N801 - what EmbedStage reads of an embedder
        title_sep = " "

    def encode(self, texts):
        return np.zeros((len(texts), 4), np.float32)


class _NoStore:
    def open_or_create(self, *a, **k):
        pass

    def exists(self) -> bool:
        return True

    def upsert(self, docs):
        pass

    def append(self, docs):
        pass


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def diff_child(n: int, work: Path) -> dict:
    """Run the job's change detection over the synthetic snapshot (this process: one size)."""
    import tempfile

    from logicrank.pipelines.config.settings import EmbedConfig
    from logicrank.pipelines.engines.store import DocStore
    from logicrank.pipelines.operations import indexing

    store = DocStore(_diff_table(n, work))
    store.count()
    base = _rss_kib()
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        sink = indexing.RejectSink(Path(tmp) / "rejects.parquet")
        if hasattr(indexing, "StoredHashes"):  # the streamed change detection
            stored = indexing.StoredHashes(store.uri, store.name, store.version)
            stage = indexing.EmbedStage(EmbedConfig(), stored, lambda c: _ZeroEmbedder())
            writer = indexing.IndexWriter(_NoStore(), "m", sink, seen_dir=Path(tmp))
            for b in _snapshot(n):
                writer.consume(stage(b))
            absent = indexing.IdSpill(Path(tmp) / "absent.parquet").write(writer.seen.absent(stored.ids()))
            writer.close()
        else:  # before: every stored id and hash in a dict, every id read in a set, absent by a scan in Python
            stage = indexing.EmbedStage(EmbedConfig(), store.hashes(), lambda c: _ZeroEmbedder())
            writer = indexing.IndexWriter(_NoStore(), "m", sink)
            for b in _snapshot(n):
                writer.consume(stage(b))
            absent = sum(d not in writer.seen for d in store.hashes().column("doc_id").to_pylist())
        sink.close()
    c = writer.counts
    return {"docs": n, "seconds": round(time.perf_counter() - t, 2), "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "rise_mib": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024, 1),
            "counts": {"insert": c["insert"], "update": c["update"], "unchanged": c["unchanged"], "absent": absent}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", default="100000", help="comma-separated sizes of the re-index run")
    ap.add_argument("--ann", default="off", help="off, on, or off,on")
    ap.add_argument("--diff", default=None, help="comma-separated sizes: measure the driver's change detection instead")
    ap.add_argument("--like-bench-scale", action="store_true", help="build the table's indexes as tests/perf/bench_scale.py does "
                    "(no doc_id index), the table behind the issue's 66 s at 100k")
    ap.add_argument("--work", default="runs/bench/reindex")
    ap.add_argument("--out", default=None, help="append each result as a JSON line to this file")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.child is not None:
        print(json.dumps(diff_child(args.child, work)))
        return
    results = []
    if args.diff:
        for n in (int(x) for x in args.diff.split(",")):
            _diff_table(n, work)  # made outside the measured process
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))}
            res = subprocess.run([sys.executable, __file__, "--work", str(work), "--child", str(n)], capture_output=True, text=True, env=env, check=True)
            results.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    else:
        for n in (int(x) for x in args.docs.split(",")):
            for ann in args.ann.split(","):
                r = reindex(n, ann, work, like_bench_scale=args.like_bench_scale)
                results.append(r)
                parts = {k: round(v, 2) for k, v in r.items() if k.endswith("_s")}
                print(json.dumps({"docs": n, "ann": ann, **parts, "maintenance": r["maintenance"], "bm25": r["bm25"]}, default=str), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for r in results:
                f.write(json.dumps(r, default=str) + "\n")


if __name__ == "__main__":
    main()
