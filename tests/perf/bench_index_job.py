"""The index job end to end on corpora with precomputed vectors, as users run it (not a test).

    make bench-index-job                                  # 100k and 1M documents; workers vs driver writes at 1M
    python tests/perf/bench_index_job.py --sizes 20000    # a smoke run
    python tests/perf/bench_index_job.py --sizes 10000000 --runs "first build,1% re-index" --index-args "--bm25-workers 2"

The corpora: passages of two or three sentences drawn (seeded) from bundled SciFact's abstracts,
as tests/perf/bench_scale.py draws them, each with a random 384-dimensional vector (the index job
does not read a vector's meaning, only checks and stores it), in Parquet files of 100k rows.

Each run is the command a user runs, in a fresh process with its own Ray (cold):
``logicrank index DIR --vector-column vector --vector-dim 384``. Reported per run: wall time,
the seconds of each step the run's manifest records (``stream``: read, check, classify and
write every row; ``absent``; ``maintain``: compaction and the table's indexes; ``bm25_index``),
rows written per second of the stream, the driver's peak RSS, the peak of its Ray workers'
RSS summed and the largest one worker's peak (sampled every 0.2 s), and those two peaks per
step (the steps placed by the manifest's durations), and the bytes the stream brought to the driver. Runs per
size: the first build, a rerun of the same snapshot (nothing changes) and a 1% re-index (1% of
the passages with new text and vectors), placed as the job places them on this machine (one
node: the driver reads and checks); ``--runs`` picks some, ``--index-args`` adds options to each.
A corpus is written when a run first needs it and removed once no later run does.

``--side-by-side N``: two more first builds of N documents, one after the other in this run,
with the rows read and checked by a pool of one Ray worker (``ray: {embed_actors: 1}``):
``--writes workers`` (the worker writes new rows' data files, the driver commits them) against
``--writes driver`` (every row's text and vector sent to the driver, which writes them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

DIM = 384
FILE_ROWS = 100_000
BIN = Path(sys.executable).parent


def write_corpus(directory: Path, n: int, seed: int, edit: float = 0.0, dim: int = DIM) -> None:
    """``n`` passages with random ``dim``-dimensional vectors in Parquet files of ``FILE_ROWS``;
    ``edit``: the share of passages (seeded) given another text and vector, the rest as the first
    build's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from logicrank.pipelines.datasets import scifact
    from tests.perf.bench_scale import passages, sentences

    sents, owner, _, titles = sentences(scifact().corpus)
    plist = passages(n, seed, len(sents))
    edited = set(np.random.default_rng(seed + 2).choice(n, int(n * edit), replace=False).tolist()) if edit else set()
    directory.mkdir(parents=True, exist_ok=True)
    for f, start in enumerate(range(0, n, FILE_ROWS)):
        part = range(start, min(n, start + FILE_ROWS))
        vectors = np.random.default_rng([seed, f]).standard_normal((len(part), dim), dtype=np.float32)
        texts = [" ".join(sents[j] for j in plist[i]) for i in part]
        for k, i in enumerate(part):
            if i in edited:
                texts[k] += " (revised)"
                vectors[k] = -vectors[k]
        pq.write_table(pa.table({
            "doc_id": [f"p{i:08d}" for i in part], "title": [titles[owner[plist[i][0]]] for i in part], "text": texts,
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim),
        }), directory / f"part-{f:05d}.parquet")


def ray_workers(pid: int) -> list:
    """The Ray worker processes below process ``pid`` (psutil processes; none once it is gone)."""
    import psutil

    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for p in below:
        try:
            if "ray::" in " ".join(p.cmdline()[:1]) or "default_worker" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _index(corpus: Path, db: Path, out: Path, extra: tuple[str, ...] = ()) -> dict:
    """One `logicrank index` run in a fresh process: wall time, its manifest's figures, peak RSS."""
    import psutil

    cmd = [str(BIN / "logicrank"), "index", str(corpus), "--db", str(db), "--out", str(out), "--vector-column", "vector",
           "--vector-dim", str(DIM), "--no-progress", "--allow-mass-delete", *extra]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"driver": 0, "workers": 0, "worker": 0}
    samples: list[tuple[float, int, int]] = []  # (time, driver rss, largest worker rss)
    done = threading.Event()

    def sample():
        driver = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                rss = driver.memory_info().rss
                peak["driver"] = max(peak["driver"], rss)
            except psutil.NoSuchProcess:
                return
            total = largest = 0
            for p in ray_workers(proc.pid):
                with contextlib.suppress(psutil.Error):
                    one = p.memory_info().rss
                    total += one
                    largest = max(largest, one)
            peak["worker"] = max(peak["worker"], largest)
            peak["workers"] = max(peak["workers"], total)
            samples.append((time.time(), rss, largest))
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    done.set()
    sampler.join()
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {stderr[-2000:]}")
    m = json.loads((out / "manifest.json").read_text())
    c = m["counts"]
    stream = m["timings_s"].get("stream") or 0.0
    written = c["precomputed"]
    return {"wall_s": round(wall, 1), "steps_s": m["timings_s"], "maintenance_s": c["maintenance"].get("seconds"),
            "rows_read": c["rows_read"], "written": written, "unchanged": c["unchanged"], "rejected": c["rejected"],
            "written_per_s": round(written / stream) if stream and written else None,
            "driver_peak_gib": round(peak["driver"] / 2**30, 2), "workers_peak_gib": round(peak["workers"] / 2**30, 2),
            "largest_worker_peak_gib": round(peak["worker"] / 2**30, 2),
            "driver_received_mib": round(c["writes"]["driver_received_bytes"] / 2**20, 1), "files_committed": c["writes"]["files_committed"],
            "writes_s": c["writes"].get("seconds"), "merges": c["writes"].get("merges"), "bm25_steps_s": (c["maintenance"].get("bm25_index") or {}).get("seconds"),
            "step_peaks_gib": _step_peaks(samples, m),
            "summary": stdout.strip().splitlines()[-1][:300]}


def _step_peaks(samples: list[tuple[float, int, int]], manifest: dict) -> dict:
    """Per step of the run, the driver's and the largest worker's peak RSS (GiB): the steps
    placed back to back by the manifest's durations, ending when it says the run finished (the
    tag and the manifest after them take well under a second)."""
    from datetime import datetime

    end = datetime.fromisoformat(manifest["finished_at"]).timestamp()
    out = {}
    for step, seconds in reversed(list(manifest["timings_s"].items())):
        start = end - float(seconds)
        inside = [(d, w) for t, d, w in samples if start <= t <= end]
        if inside:
            out[step] = {"driver": round(max(d for d, _ in inside) / 2**30, 2), "worker": round(max(w for _, w in inside) / 2**30, 2)}
        end = start
    return dict(reversed(list(out.items())))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("runs/bench/index-job-work"), help="corpora and tables (removed after each size)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    ap.add_argument("--side-by-side", type=int, default=0, help="documents of the workers-write vs driver-writes first builds (0: none)")
    ap.add_argument("--runs", default="first build,same snapshot,1% re-index", help="the runs per size, in order")
    ap.add_argument("--index-args", default="", help="more options of every `logicrank index` run, e.g. '--bm25-workers 2'")
    args = ap.parse_args(argv)
    rows = []
    t0 = time.perf_counter()
    if args.side_by_side:
        n, work = args.side_by_side, args.work / "side-by-side"
        shutil.rmtree(work, ignore_errors=True)
        write_corpus(work / "corpus", n, args.seed)
        config = work / "pool.yaml"
        config.write_text("ray:\n  embed_actors: 1\n")
        for writes in ("workers", "driver"):
            r = _index(work / "corpus", work / f"db-{writes}", work / f"run-{writes}", ("--config", str(config), "--writes", writes))
            rows.append({"docs": n, "run": f"first build, pool of 1, --writes {writes}", **r})
            print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(work, ignore_errors=True)
    corpora = {"first build": "corpus", "same snapshot": "corpus", "1% re-index": "corpus-1pct"}
    for n in (int(s) for s in args.sizes.split(",") if s):
        work = args.work / str(n)
        shutil.rmtree(work, ignore_errors=True)
        runs = [r.strip() for r in args.runs.split(",") if r.strip()]
        for i, run in enumerate(runs):
            corpus, made = work / corpora[run], None
            if not corpus.exists():  # written when first needed; one removed once no run left needs it (10M: 15 GiB of vectors each)
                t = time.perf_counter()
                write_corpus(corpus, n, args.seed, edit=0.01 if corpus.name.endswith("1pct") else 0.0)
                made = round(time.perf_counter() - t, 1)
            r = _index(corpus, work / "db", work / "runs" / run.replace(" ", "-").replace("%", "pct"), tuple(args.index_args.split()))
            rows.append({"docs": n, "run": run, **r, "corpus_made_s": made})
            print(json.dumps(rows[-1]), flush=True)
            if corpora[run] not in (corpora[later] for later in runs[i + 1 :]):
                shutil.rmtree(corpus, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "total_s": round(time.perf_counter() - t0),
              "rows": rows}
    (args.out / "bench_index_job.json").write_text(json.dumps(report, indent=1))
    print("| documents | run | wall s | stream s | maintain s | bm25 s | written/s (stream) | driver received MiB | driver peak GiB "
          "| workers peak GiB (largest one) |")
    print("|--:|:--|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        s = r["steps_s"]
        print(f"| {r['docs']:,} | {r['run']} | {r['wall_s']} | {s.get('stream')} | {s.get('maintain')} | {s.get('bm25_index')} | "
              f"{r['written_per_s'] or '-'} | {r['driver_received_mib']} | {r['driver_peak_gib']} | {r['workers_peak_gib']} "
              f"({r['largest_worker_peak_gib']}) |")


if __name__ == "__main__":
    main()
