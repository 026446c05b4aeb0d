"""How fast the index job reads a corpus (MS MARCO's collection.tsv layout, BEIR's
corpus.jsonl, and Parquet), against the reader a user would pick instead (not a test).

    make bench-corpus-read                                   # 500,000 documents, 3 runs each
    python tests/perf/bench_corpus_read.py --docs 2000000 --runs 5

A corpus of ``--docs`` synthetic passages (about 100 bytes of text each) is written once to a
temporary directory. Each run is a fresh interpreter that reads every document and counts
them, as users run it (cold for Python, warm for the page cache): ``iter_corpus`` (the index
job's reader: lines split, each record parsed, checked and batched into Arrow tables) against
pyarrow's own readers over the same bytes (``pyarrow.csv`` with tabs and no quoting for the
TSV, ``pyarrow.json`` for the JSONL, ``pyarrow.parquet``), which parse but check nothing.
Reported: documents per second of each (the median of the runs' wall times, the interpreter's
start included) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]

OURS = """
import sys
from logicrank.pipelines.corpus import iter_corpus
print(sum(t.num_rows for t in iter_corpus(sys.argv[1], batch_rows=65536)))
"""

PEER = {
    "tsv": """
import sys
import pyarrow.csv as csv
opts = csv.ParseOptions(delimiter="\\t", quote_char=False)
read = csv.ReadOptions(column_names=["id", "text"])
print(csv.read_csv(sys.argv[1], read_options=read, parse_options=opts).num_rows)
""",
    "jsonl": """
import sys
import pyarrow.json as pj
print(pj.read_json(sys.argv[1]).num_rows)
""",
    "parquet": """
import sys
import pyarrow.parquet as pq
print(pq.read_table(sys.argv[1]).num_rows)
""",
}


def write_corpus(root: Path, docs: int) -> dict[str, Path]:
    words = ["retrieval", "logic", "vitamin", "museum", "paris", "query", "negation", "bone", "health", "index"]
    tsv, jsonl, parquet = root / "collection.tsv", root / "corpus.jsonl", root / "corpus.parquet"
    texts = [" ".join(words[(i * k) % len(words)] for k in range(1, 14)) for i in range(docs)]
    with open(tsv, "w", encoding="utf-8") as t, open(jsonl, "w", encoding="utf-8") as j:
        for i, text in enumerate(texts):
            t.write(f"{i}\t{text}\n")
            j.write(json.dumps({"_id": str(i), "title": "", "text": text}) + "\n")
    pq.write_table(pa.table({"_id": [str(i) for i in range(docs)], "title": [""] * docs, "text": texts}), parquet)
    return {"tsv": tsv, "jsonl": jsonl, "parquet": parquet}


def timed(code: str, path: Path) -> tuple[float, int]:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT, check=True)
    return time.perf_counter() - t, int(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=500_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-corpus-") as tmp:
        files = write_corpus(Path(tmp), args.docs)
        print(f"{args.docs:,} documents; {args.runs} fresh processes each (median)")
        print("| layout | file MB | iter_corpus docs/s | pyarrow docs/s | iter_corpus / pyarrow |")
        print("|:--|--:|--:|--:|--:|")
        for layout, path in files.items():
            mb = path.stat().st_size / 1e6
            ours, peer = [], []
            for _ in range(args.runs):
                s, n = timed(OURS, path)
                assert n == args.docs, (layout, n)
                ours.append(s)
                s, n = timed(PEER[layout], path)
                assert n == args.docs, (layout, n)
                peer.append(s)
            a, b = args.docs / statistics.median(ours), args.docs / statistics.median(peer)
            print(f"| {layout} | {mb:,.1f} | {a:,.0f} | {b:,.0f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
