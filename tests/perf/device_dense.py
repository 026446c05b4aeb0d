"""The dense engine's GPU path against its CPU engine, where an accelerator is available.

    python tests/perf/device_dense.py --docs 2000000 --queries 2000 --out runs/bench

Needs numpy, pyarrow and torch only (pipelines/engines/exact.py, pipelines/engines/vectors.py), so it runs on a
bare GPU machine with the repository copied. Generated unit vectors (384 dimensions, clustered
so that neighbours are close, with exact duplicates so that ties at the cut occur), searched
three ways: numpy on the CPU (the reference), torch on the GPU, and the GPU by shards merged.
Reports agreement (ids and ranks exactly; where they differ, whether the scores there are
within 1e-6, i.e. a near-tie ordered by a last-bit difference of the two products), the
largest score difference, and queries per second of each, float32 and float16.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, where nothing is installed (a bare GPU machine)


def _vectors(n: int, dim: int, seed: int, precision: str):
    from logicrank.pipelines.engines.vectors import Vectors, tiebreak_ranks

    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(1000, dim)).astype(np.float32)
    m = np.empty((n, dim), np.float32)
    for i in range(0, n, 1 << 18):
        block = centers[rng.integers(0, 1000, min(1 << 18, n - i))] + 0.7 * rng.normal(size=(min(1 << 18, n - i), dim)).astype(np.float32)
        m[i : i + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    m[rng.integers(0, n, 200)] = m[0]  # exact duplicates: ties
    ids = pa.array([f"d{i:08d}" for i in range(n)], pa.string())
    path = Path(tempfile.mkdtemp()) / f"vectors-{precision}.npy"  # saved and mapped, as a table version's are: the GPU copy is cached
    np.save(path, m.astype(precision))
    del m
    return Vectors(ids, np.load(path, mmap_mode="r"), tiebreak_ranks(ids), path.parent, uuid.uuid4().hex), rng


def _one(precision: str, args) -> dict:
    """One precision: the GPU's run, the CPU's on the first queries, the GPU's by shards merged."""
    from logicrank.pipelines.engines.exact import merge_top, shard_bounds, top_k

    v, rng = _vectors(args.docs, 384, 0, precision)
    q = v.matrix[rng.integers(0, args.docs, args.queries)].astype(np.float32) + 0.3 * rng.normal(size=(args.queries, 384)).astype(np.float32)
    q[0] = v.matrix[0]
    top_k(q[:8], v, args.k, product="torch")  # warm: the vectors copied to the GPU once (cached by path and save), kernels loaded
    start = time.perf_counter()
    g_rows, g_s = top_k(q, v, args.k, product="torch")
    g_t = time.perf_counter() - start
    n = args.cpu_queries
    start = time.perf_counter()
    c_rows, c_s = top_k(q[:n], v, args.k, product="numpy")
    c_t = time.perf_counter() - start
    start = time.perf_counter()
    # each shard copied to the GPU in turn (one process here; in a job each shard actor keeps its own)
    s_rows, _ = merge_top([top_k(q, v, args.k, shard=b, product="torch") for b in shard_bounds(len(v), args.shards)], v.tiebreak, args.k)
    s_t = time.perf_counter() - start
    same = (g_rows[:n] == c_rows).all(axis=1)
    diff = np.abs(g_s[:n].astype(np.float64) - c_s.astype(np.float64))
    near_ties = all(np.abs(np.sort(g_s[r]) - np.sort(c_s[r])).max() <= 1e-6 for r in np.flatnonzero(~same))
    recall = float(np.mean([len(set(g_rows[r]) & set(c_rows[r])) / args.k for r in range(n)]))
    return {"precision": precision, "gpu_qps": args.queries / g_t, "cpu_qps": n / c_t, "gpu_sharded_qps_with_copies": args.queries / s_t,
            "queries_identical_gpu_vs_cpu": int(same.sum()), "queries_compared": n, "differing_only_by_near_ties": bool(near_ties),
            "recall_at_k_gpu_vs_cpu": recall, "max_abs_score_diff": float(diff.max()),
            "sharded_equals_unsharded_gpu": bool((s_rows == g_rows).all()), "tie_row_0": v.ids.take(g_rows[0, :4]).to_pylist()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=2_000_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--cpu-queries", type=int, default=200, help="queries the CPU reference searches (it is slow)")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    import torch

    report = {"docs": args.docs, "k": args.k, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "runs": []}
    for precision in ("float32", "float16"):
        row = _one(precision, args)
        report["runs"].append(row)
        print(json.dumps(row), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "device_dense.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
