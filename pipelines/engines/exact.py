"""The exact top k of a cosine product over saved unit vectors, by shard (pipelines/engines/vectors.py):
the dense engine's search (pipelines/retrieval/methods/dense.py) and ITLR's exact scoring's first step.
Only numpy (and torch, for the product on a GPU) are needed here, so that the device check
(tests/perf/device_dense.py) runs where the rest of the stack is not installed.

A block of queries meets tiles of ``_TILE`` documents; each tile keeps its k best under the
run order (score descending, then doc id descending) and the tiles merge exactly, as the
shards' top k do (:func:`merge_top`). A document's score is one dot product whatever tile or
shard holds it, up to the order in which a BLAS kernel sums: scores agree within 1e-6. The product runs
with numpy, or with torch (``product="torch"``; ``"auto"`` picks torch where a GPU is
visible): on a GPU the shard's vectors are copied to its memory once per process.

Beside it, the placement arithmetic of the retrieve job's actors (pure functions): how many
fit the cluster's memory (:func:`pool_within_memory`) and each shard's share of a GPU
(:func:`gpu_share`).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from logicrank.pipelines.engines.vectors import Vectors

_TILE = 4096  # documents per tile of the product
_ALIGN = 128  # shard bounds are multiples of it (whole cache lines of rows)
_QUERY_BLOCK = 1024  # queries per pass over the vectors: each pass streams them once from memory


def shard_bounds(n: int, shards: int, align: int = _ALIGN) -> list[tuple[int, int]]:
    """``shards`` ranges of rows covering ``[0, n)``, as even as blocks of ``align`` rows allow
    (empty ranges where the corpus has fewer blocks than shards). ``align``: whole cache lines
    of vectors by default; a saved BM25 index's segments (each shard then maps only its own)."""
    blocks = -(-n // align)
    cuts = [min(n, (blocks * i // shards) * align) for i in range(shards + 1)]
    cuts[-1] = n
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def segment_bounds(n: int, shards: int, seg_rows: int, slack: float = 1.1) -> list[tuple[int, int]]:
    """``shards`` ranges over an index saved in segments of ``seg_rows`` rows: whole segments per
    shard (each shard's actor then maps only its own) where that keeps the largest shard within
    ``slack`` of an even share; else even ranges (a shard then shares a segment with each
    neighbour)."""
    aligned = shard_bounds(n, shards, seg_rows)
    even = shard_bounds(n, shards)
    widest = lambda bounds: max((hi - lo for lo, hi in bounds), default=0)  # noqa: E731
    return aligned if widest(aligned) <= slack * widest(even) else even


ACTOR_BASE_BYTES = 1 << 30  # an actor's own footprint beside the engine's data: Python, torch, the encoder, a batch


def pool_within_memory(actors: int, engine_bytes: int, cluster_bytes: float) -> int:
    """At most as many retrieval actors as the cluster's memory holds, each with its own copy
    of the engine's data (``engine_bytes``, as the driver held it) plus ``ACTOR_BASE_BYTES``;
    at least one. Unknown cluster memory (0): no cap."""
    if cluster_bytes <= 0:
        return actors
    return max(1, min(actors, int(cluster_bytes // (engine_bytes + ACTOR_BASE_BYTES))))


def gpu_share(shards: int, gpus: int) -> float:
    """The GPU each of ``shards`` actors asks for on a cluster of ``gpus`` whole GPUs: one where
    there are enough, else an equal share of one, in hundredths, so that the actors sharing a GPU
    fit on it (Ray places a fractional request on a single GPU); 0 without GPUs."""
    if gpus <= 0:
        return 0.0
    per_gpu = -(-shards // gpus)
    return 1.0 if per_gpu <= 1 else (100 // per_gpu) / 100


def top_k(queries: np.ndarray, v: Vectors, k: int, shard: tuple[int, int] | None = None, product: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """Each query's exact cosine top ``k`` among the rows ``shard = (lo, hi)`` (all by default),
    as (queries x kk) global document rows and float32 scores, kk = min(k, rows searched), in
    the run order."""
    lo, hi = (0, len(v)) if shard is None else shard
    if k < 1:
        raise ValueError(f"dense: k must be at least 1, got {k}")
    q = np.asarray(queries, np.float32)
    q = q / np.where((norm := np.linalg.norm(q, axis=1, keepdims=True)) > 0, norm, 1)
    kk = min(k, hi - lo)
    out_rows, out_scores = np.zeros((len(q), kk), np.int64), np.zeros((len(q), kk), np.float32)
    if kk == 0:
        return out_rows, out_scores
    torch_product = _use_torch(product)
    # on a GPU, tiles of 64 CPU tiles: the host's per-tile work (the ranked merge) stays small beside the product
    tile = max(_TILE * (64 if torch_product and _gpu_visible() else 1), k + 8)
    product_fn = _torch_product(v, lo, hi) if torch_product else _numpy_product(v)
    for i in range(0, len(q), _QUERY_BLOCK):
        block = q[i : i + _QUERY_BLOCK]
        best = best_s = None
        for j in range(lo, hi, tile):
            t_rows, t_s = product_fn(block, j, min(hi, j + tile), kk, v.tiebreak)
            if best is None:
                best, best_s = t_rows, t_s
            else:  # the k best of both under the run order (score, then doc id descending): exact
                best, best_s = _best(np.concatenate([best, t_rows], axis=1), np.concatenate([best_s, t_s], axis=1), v.tiebreak, kk)
        out_rows[i : i + len(block)], out_scores[i : i + len(block)] = best, best_s
    return out_rows, out_scores


def merge_top(parts: list[tuple[np.ndarray, np.ndarray]], tiebreak: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The shards' (rows, scores) of one batch of queries -> the top ``k`` over all of them, in
    the run order. Exact: each shard kept its own k best under the same order."""
    parts = [p for p in parts if p[0].shape[1]]
    if not parts:
        return np.zeros((0, 0), np.int64), np.zeros((0, 0), np.float32)
    if len(parts) == 1:
        return parts[0]
    rows, scores = np.concatenate([p[0] for p in parts], axis=1), np.concatenate([p[1] for p in parts], axis=1)
    return _best(rows, scores, tiebreak, min(k, rows.shape[1]))


def _best(rows: np.ndarray, scores: np.ndarray, tiebreak: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((tiebreak[rows], -scores), axis=1)[:, :k]
    return np.take_along_axis(rows, order, axis=1), np.take_along_axis(scores, order, axis=1)


def _use_torch(product: str) -> bool:
    if product == "numpy":
        return False
    if product == "torch":
        return True
    if product != "auto":
        raise ValueError(f"dense: product must be auto, numpy or torch, got {product!r}")
    return _gpu_visible()


@functools.cache
def _gpu_visible() -> bool:
    """Whether torch sees a GPU in this process. A torch built for the CPU alone sees none,
    which is known without importing torch (:func:`logicrank.pipelines.torch_build.cpu_only`),
    so a search on a CPU node does not pay torch's import (docs/bulk-retrieval.md)."""
    import sys

    from logicrank.pipelines.torch_build import cpu_only

    if "torch" not in sys.modules and cpu_only():
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except (ImportError, AttributeError):  # a torch that does not import: the numpy product
        return False


def _numpy_product(v: Vectors):
    def run(block: np.ndarray, j: int, end: int, k: int, tiebreak: np.ndarray):
        docs = v.matrix[j:end]
        s = block @ (docs if docs.dtype == np.float32 else docs.astype(np.float32)).T
        return _tile_top(s, j, k, tiebreak)

    return run


_DEVICE_VECTORS: dict = {}  # (saved path, save id, dtype, lo, hi) -> the shard's vectors on the GPU, once per process


def _torch_product(v: Vectors, lo: int, hi: int):
    """The product with torch: on the GPU where one is visible (the shard's vectors copied
    there once), else on the CPU (CI's check of this path). The per-tile selection keeps
    ``k + 8`` candidates on the device; ties at the cut wider than that are ranked on the host
    from the tile's row, as :func:`_tile_top` does."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products in float32 (TF32 would move scores by ~1e-3)
    key = (str(v.path), v.save_id, v.matrix.dtype.str, lo, hi)
    if device == "cuda" and v.path is None:  # vectors in memory (not a saved version): copied per call, never cached by a key
        held, base = torch.from_numpy(np.ascontiguousarray(v.matrix[lo:hi])).to(device), lo
    elif device == "cuda":
        if key not in _DEVICE_VECTORS:
            _DEVICE_VECTORS.clear()  # one shard per process at a time
            with warnings.catch_warnings():  # a read-only mapping: torch only reads it, to copy it to the GPU
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                _DEVICE_VECTORS[key] = torch.from_numpy(np.ascontiguousarray(v.matrix[lo:hi])).to(device)
        held, base = _DEVICE_VECTORS[key], lo
    else:
        held, base = None, lo

    def run(block: np.ndarray, j: int, end: int, k: int, tiebreak: np.ndarray):
        docs = held[j - base : end - base] if held is not None else torch.from_numpy(np.array(v.matrix[j:end]))
        s = torch.from_numpy(block).to(docs.device) @ docs.float().T
        n = s.shape[1]
        take = min(n, k + 8)
        vals, idx = torch.topk(s, take, dim=1)
        kth = vals[:, min(k, take) - 1 : min(k, take)]
        wide = torch.nonzero((s >= kth).sum(dim=1) > take).flatten().cpu().numpy() if take < n else np.zeros(0, np.int64)
        part, ps = idx.cpu().numpy(), vals.cpu().numpy()
        order = np.lexsort((tiebreak[part + j], -ps), axis=1)[:, :k]
        top, top_s = np.take_along_axis(part, order, axis=1), np.take_along_axis(ps, order, axis=1)
        for r in wide:  # a tie at the cut wider than the candidates taken: that query's whole tie, ranked
            row = s[r].cpu().numpy()
            cand = np.flatnonzero(row >= kth[r, 0].item())
            pick = cand[np.lexsort((tiebreak[cand + j], -row[cand]))[:k]]
            top[r], top_s[r] = pick, row[pick]
        return top + j, top_s

    return run


def _tile_top(s: np.ndarray, offset: int, k: int, tiebreak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The k best of a (queries x documents) tile of scores under the run order (score, then
    doc id descending), as (document rows offset by ``offset``, scores)."""
    n = s.shape[1]
    take = min(n, k + 8)  # candidates per query: a few past k, so that ties at the cut are usually among them
    part = np.argpartition(-s, take - 1, axis=1)[:, :take] if take < n else np.broadcast_to(np.arange(n), s.shape)
    ps = np.take_along_axis(s, part, axis=1)
    order = np.lexsort((tiebreak[part + offset], -ps), axis=1)[:, :k]
    top, top_s = np.take_along_axis(part, order, axis=1), np.take_along_axis(ps, order, axis=1)
    if take < n and top_s.shape[1]:  # a tie at the cut wider than the candidates taken: that query's whole tie, ranked
        kth = top_s[:, -1:]
        for r in np.flatnonzero((s >= kth).sum(axis=1) > take):
            cand = np.flatnonzero(s[r] >= kth[r, 0])
            pick = cand[np.lexsort((tiebreak[cand + offset], -s[r, cand]))[:k]]
            top[r], top_s[r] = pick, s[r, pick]
    return top + offset, top_s
