"""The BM25 build's analysis step (``segments.analyze_segment``) on one segment of a table, with
this checkout's counting of terms (``index.field_counts``) and with another revision's, side by
side in one process, alternated (not a test).

    python tests/perf/bench_bm25_build.py --docs 10000000 --dim 4 --runs 2 --patch-runs "" --keep --work W
    python tests/perf/bench_bm25_analyze.py --work W --baseline-rev 48ef26d

``--work``: a directory a ``bench_bm25_build.py --keep`` run left (its table, ``W/db``). The
baseline's ``field_counts`` is loaded from ``git show REV:pipelines/engines/bm25/index.py``; the
rest of the step (reading the rows, the analyzer, writing the segment's files) is this
checkout's in both. Each goes first in turn (the first run of the process fills the analyzer's
memo of words). Reported: seconds per run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _baseline_field_counts(rev: str, into: Path):
    source = subprocess.run(["git", "show", f"{rev}:pipelines/engines/bm25/index.py"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    path = into / "baseline_index.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("logicrank.pipelines.engines.bm25.baseline_index", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.field_counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="a bench_bm25_build.py --keep run's work directory")
    ap.add_argument("--baseline-rev", required=True, help="the git revision whose field_counts is the baseline")
    ap.add_argument("--segment", type=int, default=3, help="which segment of the table (of 524,288 rows)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    from logicrank.pipelines.engines.bm25 import index, segments, storage
    from logicrank.pipelines.engines.store import DocStore

    store = DocStore(str(args.work / "db"))
    lo = args.segment * storage.SEGMENT_ROWS
    hi = min(lo + storage.SEGMENT_ROWS, store.count())
    if hi <= lo:
        raise SystemExit(f"--segment {args.segment}: the table has {store.count():,} rows, {-(-store.count() // storage.SEGMENT_ROWS)} segments")
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        runs = [("baseline", _baseline_field_counts(args.baseline_rev, Path(tmp))), ("this checkout", index.field_counts)]
        seconds: dict[str, list[float]] = {name: [] for name, _ in runs}
        for repeat in range(args.repeats):
            for name, counts in runs if repeat % 2 == 0 else runs[::-1]:  # each first in turn (the first run fills the analyzer's memo)
                segments.field_counts = counts  # the step's counting; the rest of it is this checkout's
                out = tempfile.mkdtemp(dir=tmp)
                t = time.perf_counter()
                segments.analyze_segment(segments.opener(store), lo, hi, out)
                seconds[name].append(round(time.perf_counter() - t, 1))
                print(name, seconds[name][-1], flush=True)
    print(json.dumps({"rows": hi - lo, "baseline_rev": args.baseline_rev, "seconds": seconds}))


if __name__ == "__main__":
    main()
