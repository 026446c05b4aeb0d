"""The BM25 index's build: in one scan, and in segments (one process, or Ray tasks on 1 and 2
workers), on one table, as the index job builds it (not a test).

    make bench-bm25-build                                 # 1M documents
    python tests/perf/bench_bm25_build.py --docs 100000   # a smoke run
    python tests/perf/bench_bm25_build.py --docs 10000000 --runs 2 --patch-runs in-process,1,2   # 10M: one build, the patches

The table: passages drawn (seeded) from bundled SciFact's abstracts, as
tests/perf/bench_index_job.py makes its corpora, with random vectors of ``--dim`` numbers (the
BM25 build never reads them), appended to a LanceDB table. Each build runs in
a fresh process (cold: the table read from disk, the kernels loaded) and saves the index of the
table's version, its earlier save removed first:

* ``one scan``: the build every version before segments made (``BM25Index.build`` over the
  whole table, then saved), the reference;
* ``segments, in process``: ``update_index`` with its default run, segment after segment (what
  the index job's child process runs, ``--bm25-workers 0``);
* ``segments, N Ray workers``: ``update_index`` with ``RayTasks(ray, N)`` on a local cluster of N
  CPUs (``--bm25-workers N``).

``--runs`` picks the builds (``one-scan,in-process,1,2`` by default); the first is the
reference. Reported: wall seconds of the build (Ray's start excluded, timed apart), the
process's peak RSS, the peak RSS of any one Ray worker and its peak less the file pages it maps
(``rss - shared``: the index files written and read through memory maps, the libraries),
sampled every 0.1 s, and whether every saved array equals the reference's. A Ray worker runs
one task after another, so its peak is that of the largest step it ran.

Then the patch (``--edit``, 1% by default): that share of the documents (seeded) given another
text and hash in one upsert, as a nightly re-index leaves the table, and the new version's
index made by ``update_index`` from the build's, once per ``--patch-runs`` (the same modes),
each in a fresh process with its own measures; the first patch is the reference of the others.
``--baseline DIR`` makes each patch run twice, with another checkout's code (its own ``.venv``)
and then with this one's, side by side on the same table: a change to the patch measured against
the code before it. ``--keep`` keeps the table, its build and its edit in ``--work``;
``--patches-only`` then runs only the patches on them (a 10M table is made and built once).
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

CHILD = r"""
import json, sys, time
from pathlib import Path
from logicrank.pipelines.engines import bm25
from logicrank.pipelines.engines.store import DocStore
db, mode, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
store = DocStore(db)
path = bm25.index_root(store) / f"v{store.version}"
result = {}
if mode == "one-scan":
    t = time.perf_counter()
    index = bm25.BM25Index.build(store.scan(bm25.SOURCE_COLUMNS, batch_rows=8192, read_ahead=True), store.version, stamp=store.version_stamp())
    index.save(out)
    result["build_s"] = time.perf_counter() - t
elif mode == "in-process":
    t = time.perf_counter()
    result["done"] = bm25.update_index(store)
    result["build_s"] = time.perf_counter() - t
else:
    from logicrank.jobs.raysession import RayTasks, ray_session
    from logicrank.pipelines.config.settings import RayConfig
    workers = int(mode)
    t = time.perf_counter()
    with ray_session(RayConfig(num_cpus=workers)) as ray:
        result["ray_start_s"] = time.perf_counter() - t
        t = time.perf_counter()
        result["done"] = bm25.update_index(store, run=RayTasks(ray, workers))
        result["build_s"] = time.perf_counter() - t
print(json.dumps(result, default=str))
"""


def _table(db: Path, n: int, seed: int, work: Path, dim: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from logicrank.pipelines.engines.store import DocStore
    from tests.perf.bench_index_job import write_corpus

    write_corpus(work / "corpus", n, seed, dim=dim)
    store = DocStore(str(db))
    store.open_or_create(dim, "bench-bm25-build (random vectors)")
    for f in sorted((work / "corpus").glob("*.parquet")):
        t = pq.read_table(f)
        texts = t.column("text").to_pylist()
        store.append(t.append_column("metadata", pa.nulls(t.num_rows, pa.string()))
                     .append_column("content_hash", pa.array([str(hash(x)) for x in texts])))
    store.mark_complete()
    shutil.rmtree(work / "corpus")


ROOT = Path(__file__).resolve().parents[2]


def _run(db: Path, mode: str, out: Path, code: Path = ROOT) -> dict:
    """One build in a fresh process, with its peak RSS and its Ray workers' (each) sampled;
    ``code``: the checkout whose code runs it (its own ``.venv``; this one's by default)."""
    import psutil

    from tests.perf.bench_index_job import ray_workers

    python = sys.executable if code == ROOT else str(code / ".venv" / "bin" / "python")
    proc = subprocess.Popen([python, "-c", CHILD, str(db.resolve()), mode, str(out.resolve())], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=code)
    peak = {"process": 0, "worker": 0, "worker_anon": 0}
    done = threading.Event()

    def sample():
        me = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                peak["process"] = max(peak["process"], me.memory_info().rss)
                for p in ray_workers(proc.pid):
                    with contextlib.suppress(psutil.Error):
                        m = p.memory_info()
                        peak["worker"] = max(peak["worker"], m.rss)
                        peak["worker_anon"] = max(peak["worker_anon"], m.rss - m.shared)  # less the file pages mapped (memory maps, libraries)
            except psutil.NoSuchProcess:
                return
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"build {mode} failed ({proc.returncode}): {stderr[-3000:]}")
    return {**json.loads(stdout.strip().splitlines()[-1]), "process_peak_gib": round(peak["process"] / 2**30, 2),
            "worker_peak_gib": round(peak["worker"] / 2**30, 2), "worker_anon_peak_gib": round(peak["worker_anon"] / 2**30, 2)}


def _edit(db: Path, share: float, seed: int) -> int:
    """``share`` of the table's documents (seeded) upserted with another text and content hash;
    returns how many."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from logicrank.pipelines.engines.store import DocStore

    store = DocStore(str(db))
    ids = store.hashes().column("doc_id")
    chosen = np.sort(np.random.default_rng(seed + 7).choice(len(ids), int(len(ids) * share), replace=False))
    rows = store.rows_for(ids.take(pa.array(chosen)).to_pylist(), ["title", "text", "metadata", "content_hash", "vector"])
    text = pc.binary_join_element_wise(rows.column("text"), pa.scalar(" (edited)"), "")
    rows = rows.set_column(rows.schema.get_field_index("text"), "text", text)
    rows = rows.set_column(rows.schema.get_field_index("content_hash"), "content_hash",
                           pc.binary_join_element_wise(rows.column("content_hash"), pa.scalar("e"), ""))
    store.upsert(rows)
    store.mark_complete()
    return rows.num_rows


def _same(a: Path, b: Path) -> bool:
    """Whether two saved indexes hold the same arrays: search files, counts, ids and terms."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import scipy.sparse as sp

    for f in sorted((a / "search").glob("*.npy")):
        if not np.array_equal(np.load(f, mmap_mode="r"), np.load(b / "search" / f.name, mmap_mode="r")):
            return False
    for name in ("title", "text"):
        if (sp.load_npz(a / f"{name}.npz") != sp.load_npz(b / f"{name}.npz")).nnz:
            return False
    ids = [pa.ipc.open_file(pa.memory_map(str(d / "search" / "doc_ids.arrow"))).read_all().column("doc_id") for d in (a, b)]
    tables = [[pq.read_table(d / n).replace_schema_metadata(None) for n in ("docs.parquet", "vocab.parquet")] for d in (a, b)]
    return ids[0].equals(ids[1]) and all(x.equals(y) for x, y in zip(*tables, strict=True))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("runs/bench/bm25-build-work"), help="the table and the saved indexes (removed after)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    ap.add_argument("--dim", type=int, default=384, help="the table's vectors' width (the build never reads them)")
    ap.add_argument("--runs", default="one-scan,in-process,1,2", help="builds, the first the reference: one-scan, in-process, or N Ray workers")
    ap.add_argument("--edit", type=float, default=0.01, help="the share of the documents edited before the patches")
    ap.add_argument("--patch-runs", default="in-process,1,2", help="patches after the edit (empty: none), the first the reference")
    ap.add_argument("--baseline", type=Path, help="another checkout (with its own .venv): each patch run is made with its code, "
                                                   "then with this one's, side by side on the same table")
    ap.add_argument("--keep", action="store_true", help="keep --work (the table, the build's index, the edit) for --patches-only")
    ap.add_argument("--patches-only", action="store_true", help="only the patch runs, on the table and build a --keep run left in --work")
    args = ap.parse_args(argv)
    from logicrank.pipelines.engines import bm25
    from logicrank.pipelines.engines.store import DocStore

    names = {"one-scan": "one scan", "in-process": "segments, in process"}
    db = args.work / "db"
    made = None
    if args.patches_only:
        if not (args.work / "edited").exists():
            raise SystemExit(f"--patches-only: {args.work} holds no table a --keep run built and edited")
    else:
        shutil.rmtree(args.work, ignore_errors=True)
        t = time.perf_counter()
        _table(db, args.docs, args.seed, args.work, args.dim)
        made = round(time.perf_counter() - t, 1)
    store = DocStore(str(db))
    saved = bm25.index_root(store) / f"v{store.version}"
    reference = args.work / "reference"
    rows = []
    for i, mode in enumerate([] if args.patches_only else args.runs.split(",")):
        shutil.rmtree(saved, ignore_errors=True)
        rows.append({"run": names.get(mode, f"segments, {mode} Ray worker{'s' if mode != '1' else ''}"), **_run(db, mode, saved)})
        if i == 0:
            shutil.copytree(saved, reference)
        else:
            rows[-1]["same_arrays"] = _same(reference, saved)
        print(json.dumps(rows[-1], default=str), flush=True)
    patches, edited = [], 0
    if args.patch_runs:
        if args.patches_only:
            edited = int((args.work / "edited").read_text())
            shutil.rmtree(args.work / "patch-reference", ignore_errors=True)
        else:
            built = bm25.saved_versions(bm25.index_root(store))
            edited = _edit(db, args.edit, args.seed)
            (args.work / "edited").write_text(str(edited))
            store = DocStore(str(db))
            assert built and built[-1] < store.version, (built, store.version)
        saved_patch = bm25.index_root(store) / f"v{store.version}"
        codes = [(args.baseline.resolve(), " (baseline)"), (ROOT, "")] if args.baseline else [(ROOT, "")]
        for mode in args.patch_runs.split(","):
            for code, tag in codes:
                shutil.rmtree(saved_patch, ignore_errors=True)
                name = (names.get(mode) or f"segments, {mode} Ray worker{'s' if mode != '1' else ''}").removeprefix("segments, ")
                patches.append({"run": f"patch, {name}{tag}", **_run(db, mode, saved_patch, code)})
                if len(patches) == 1:
                    shutil.copytree(saved_patch, args.work / "patch-reference")
                else:
                    patches[-1]["same_arrays"] = _same(args.work / "patch-reference", saved_patch)
                print(json.dumps(patches[-1], default=str), flush=True)
    done = next((r["done"] for r in rows + patches if "done" in r), {})
    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "docs": args.docs, "table_made_s": made,
              "segment_rows": done.get("segment_rows"), "segments": done.get("segments"), "rows": rows, "edited": edited, "patches": patches}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_bm25_build.json").write_text(json.dumps(report, indent=1, default=str))
    if not (args.keep or args.patches_only):  # a --patches-only run leaves the kept table for the next
        shutil.rmtree(args.work, ignore_errors=True)
    print(f"{done.get('docs', args.docs):,} documents, {report['segments']} segments of {report['segment_rows']} rows"
          + (f"; table made in {made} s" if made is not None else ""))
    print("| build | seconds | process peak GiB | largest Ray worker peak GiB (of it not file pages) | arrays equal to the first of its kind | "
          "steps' seconds |")
    print("|:--|--:|--:|--:|:--|:--|")
    for r in rows + patches:
        worker = f"{r['worker_peak_gib']} ({r['worker_anon_peak_gib']})" if r["worker_peak_gib"] else "-"
        steps = ", ".join(f"{k} {v:.1f}" for k, v in ((r.get("done") or {}).get("seconds") or {}).items())
        print(f"| {r['run']} | {r['build_s']:.1f} | {r['process_peak_gib']} | {worker} | "
              f"{'reference' if 'same_arrays' not in r else ('yes' if r['same_arrays'] else 'NO')} | {steps or '-'} |")
    if patches:
        print(f"patches: {edited:,} documents edited ({args.edit:.0%}) after the builds")


if __name__ == "__main__":
    main()
