"""The index job's keyed merge of changed documents, side by side with LanceDB's (not a test).

    python tests/perf/bench_upsert.py                                    # 1M documents, 1% in 4 merges
    python tests/perf/bench_upsert.py --docs 10000000 --rows 100000 --merges 4

A table of ``--docs`` documents as a first build leaves it after compaction (texts of 40 words
drawn from 20,000, random 384-dimensional vectors, fragments of
``COMPACT_TARGET_ROWS``, the id index (BTREE); the full-text indexes are left out: neither
write reads them), then ``--rows`` of its documents (uniform, seeded per trial) given a new text,
hash and vector and written in ``--merges`` keyed merges of equal size in id order (each merge
the changed rows of a quarter of the table with 4 merges), as the index job's writer sends a 1%
re-index's updates in the corpus's order: by ``DocStore.upsert``
(pipelines/engines/store/writing.py: its own Update commit) and by LanceDB's ``merge_insert``
(when matched update all, when not matched insert all: the upsert before it). Each trial runs
in a fresh process on the table restored to the built version, trial k of both ways on the
same rows, in the order upsert then merge_insert for even k and the reverse for odd k;
printed per trial: the merges' seconds, the versions they made, the rows after, and the
process's peak RSS rise while merging (``ru_maxrss`` after less before). The rows to write are
read before the clock starts; results are appended to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

DIM = 384
WORDS = 40
VOCAB = 20_000
BATCH = 1 << 16


def _rows(ids: np.ndarray, seed: int, schema: pa.Schema) -> pa.Table:
    """Documents ``ids`` (numbers) with texts, hashes and vectors drawn from ``seed``."""
    from logicrank.schemas.tables import as_stored

    rng = np.random.default_rng(seed)
    words = rng.integers(0, VOCAB, size=(len(ids), WORDS))
    vectors = rng.standard_normal((len(ids), DIM), dtype=np.float32)
    return as_stored(pa.table({
        "doc_id": [f"d{i:09d}" for i in ids], "title": pa.nulls(len(ids), pa.string()),
        "text": [" ".join(f"w{w}" for w in row) for row in words], "metadata": pa.nulls(len(ids), pa.string()),
        "content_hash": [f"h{seed}-{i}" for i in ids], "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), DIM),
    }), schema)


def build(db: Path, docs: int) -> int:
    """The table (module doc); returns its version."""
    import lance
    import lancedb

    from logicrank.pipelines.engines.store.writing import COMPACT_TARGET_ROWS
    from logicrank.schemas.tables import docs_schema

    schema = docs_schema(DIM)
    batches = (_rows(np.arange(lo, min(docs, lo + BATCH)), lo, schema).to_batches()[0] for lo in range(0, docs, BATCH))
    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches), str(db / "docs.lance"), max_rows_per_file=COMPACT_TARGET_ROWS)
    table = lancedb.connect(str(db)).open_table("docs")
    table.create_scalar_index("doc_id", index_type="BTREE", replace=True)
    return table.version


def trial(db: Path, docs: int, version: int, how: str, rows: int, merges: int, seed: int) -> dict:
    """One trial, in this process (module doc)."""
    from logicrank.pipelines.engines.store import DocStore

    store = DocStore(str(db), "docs")
    store.table.restore(version)
    ids = np.sort(np.random.default_rng(seed).choice(docs, rows, replace=False))
    parts = [_rows(part, 10_000 + seed, store.table.schema) for part in np.array_split(ids, merges)]
    before, rss = store.version, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    for part in parts:
        if how == "upsert":
            store.upsert(part)
        else:
            store.table.merge_insert("doc_id").when_matched_update_all().when_not_matched_insert_all().execute(part)
    seconds = time.perf_counter() - start
    store.table.checkout_latest()
    changed = store.table.to_lance().count_rows(filter=pc.field("content_hash").isin(pa.concat_tables(parts).column("content_hash")))
    return {"how": how, "docs": docs, "rows": rows, "merges": merges, "seed": seed, "seconds": round(seconds, 2),
            "versions": store.version - before, "rows_after": store.table.count_rows(), "changed_rows": changed,
            "peak_rss_rise_mib": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--rows", type=int, default=0, help="documents changed (default: 1%% of --docs)")
    ap.add_argument("--merges", type=int, default=4)
    ap.add_argument("--trials", type=int, default=2, help="trials of each way")
    ap.add_argument("--work", type=Path, default=Path("runs/bench/upsert-work"), help="the table (removed at the end)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench/upsert.jsonl"))
    ap.add_argument("--trial", nargs=4, metavar=("VERSION", "HOW", "ROWS", "SEED"), help=argparse.SUPPRESS)  # a child's
    args = ap.parse_args()
    db = args.work.resolve() / "db"
    if args.trial:
        version, how, rows, seed = args.trial
        print(json.dumps(trial(db, args.docs, int(version), how, int(rows), args.merges, int(seed))))
        return
    rows = args.rows or max(1, args.docs // 100)
    shutil.rmtree(args.work, ignore_errors=True)
    db.mkdir(parents=True)
    try:
        t = time.perf_counter()
        version = build(db, args.docs)
        print(f"built {args.docs:,} documents in {time.perf_counter() - t:.1f} s", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for k in range(args.trials):
            for how in ("upsert", "merge_insert")[:: 1 if k % 2 == 0 else -1]:  # the first of a pair warms the page cache
                out = subprocess.run([sys.executable, __file__, "--docs", str(args.docs), "--merges", str(args.merges), "--work", str(args.work),
                                      "--trial", str(version), how, str(rows), str(k)], check=True, capture_output=True, text=True).stdout
                result = json.loads(out.strip().splitlines()[-1])
                print(json.dumps(result), flush=True)
                with args.out.open("a") as f:
                    f.write(json.dumps(result) + "\n")
    finally:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
