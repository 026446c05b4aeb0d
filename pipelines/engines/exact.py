"""The exact top k of a cosine product over saved unit vectors, by shard (pipelines/engines/vectors.py):
the dense engine's search (pipelines/retrieval/methods/dense.py) and ITLR's exact scoring's first step.
Only numpy (and torch, for the product on a GPU) are needed here, so that the device check
(tests/perf/device_dense.py) runs where the rest of the stack is not installed.

A block of queries meets tiles of ``_TILE`` documents; each tile keeps its k best under the
run order (score descending, then doc id descending) and the tiles merge exactly, as the
shards' top k do (:func:`merge_top`). The product picks each tile's candidates; a BLAS kernel
sums a dot product in an order that depends on where the document sits in the tile, so two
identical vectors could score a few float32 units apart and rank by their place, not by doc
id. Each candidate that may make the k best is therefore scored again as one float64 sum of
its products, rounded to float32 (:func:`pair_scores`): a document's score is the same
whatever tile, shard or product (numpy, torch, a GPU) found it, and identical vectors tie and
rank by doc id; a tile whose cut has more documents within ``_MARGIN`` of it than its
candidates hands on the best of all of them (:func:`_near_cut`). The product
runs with numpy, or with torch (``product="torch"``; ``"auto"`` picks torch where a GPU is
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
# how far below the k-th product score a candidate may be and still make the top k once scored exactly: far past a BLAS
# kernel's error on a dot product of unit vectors (a few float32 units, 1e-7 each near 1)
_MARGIN = 1e-5


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
    q = unit_queries(queries)
    kk = min(k, hi - lo)
    out_rows, out_scores = np.zeros((len(q), kk), np.int64), np.zeros((len(q), kk), np.float32)
    if kk == 0:
        return out_rows, out_scores
    # a query of zeros scores every document 0: its k best are the first by doc id descending, without a product (in one
    # it would tie every document of every tile at the cut, each tile scored exactly)
    zero = np.flatnonzero(~q.any(axis=1))
    out_rows[zero] = lo + np.argsort(v.tiebreak[lo:hi], kind="stable")[:kk]
    live = np.flatnonzero(q.any(axis=1))
    torch_product = _use_torch(product)
    # on a GPU, tiles of 64 CPU tiles: the host's per-tile work (the ranked merge) stays small beside the product
    tile = max(_TILE * (64 if torch_product and _gpu_visible() else 1), k + 8)
    product_fn = _torch_product(v, lo, hi) if torch_product else _numpy_product(v)
    for i in range(0, len(live), _QUERY_BLOCK):
        block = q[live[i : i + _QUERY_BLOCK]]
        best = best_s = None
        for j in range(lo, hi, tile):
            t_rows, t_s = product_fn(block, j, min(hi, j + tile), kk, v.tiebreak)  # the tile's candidates, product scores
            # each candidate that may still make the k best scored exactly (pair_scores); the others cannot (-inf). A NaN
            # at the cut (a NaN vector) is no cut: every candidate scored
            cut = best_s[:, -1:] if best is not None else -np.partition(-t_s, kk - 1, axis=1)[:, kk - 1 : kk]
            qi, ci = np.nonzero(t_s >= np.where(np.isnan(cut), -np.inf, cut) - _MARGIN)
            exact = np.full(t_s.shape, -np.inf, np.float32)
            exact[qi, ci] = pair_scores(block, qi, v.matrix, t_rows[qi, ci])
            if best is not None:
                t_rows, exact = np.concatenate([best, t_rows], axis=1), np.concatenate([best_s, exact], axis=1)
            best, best_s = _best(t_rows, exact, v.tiebreak, kk)  # the k best under the run order (score, then doc id descending)
        out_rows[live[i : i + _QUERY_BLOCK]], out_scores[live[i : i + _QUERY_BLOCK]] = best, best_s
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


def unit_queries(queries: np.ndarray) -> np.ndarray:
    """The query vectors as float32 of unit length (a query of zeros stays zeros): what every
    dense score is a product with."""
    q = np.asarray(queries, np.float32)
    return q / np.where((norm := np.linalg.norm(q, axis=1, keepdims=True)) > 0, norm, 1)


def pair_scores(block: np.ndarray, queries: np.ndarray, matrix: np.ndarray, rows: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """The scores of (query, document) pairs, the ``queries`` (rows of ``block``) beside the
    ``rows`` of ``matrix``: each one float64 sum of float64 products, in one order whatever the
    document's place, rounded to float32; ``chunk`` pairs at a time (their vectors gathered)."""
    out = np.empty(len(rows), np.float32)
    for i in range(0, len(rows), chunk):
        out[i : i + chunk] = np.einsum("pd,pd->p", block[queries[i : i + chunk]], matrix[rows[i : i + chunk]], dtype=np.float64)
    return out


def _numpy_product(v: Vectors):
    def run(block: np.ndarray, j: int, end: int, k: int, tiebreak: np.ndarray):
        docs = v.matrix[j:end]
        s = block @ (docs if docs.dtype == np.float32 else docs.astype(np.float32)).T
        return _tile_top(s, j, k, tiebreak, block, v.matrix)

    return run


_DEVICE_VECTORS: dict = {}  # (saved path, save id, dtype, lo, hi) -> the shard's vectors on the GPU, once per process


def _torch_product(v: Vectors, lo: int, hi: int):
    """The product with torch: on the GPU where one is visible (the shard's vectors copied
    there once), else on the CPU (CI's check of this path). The per-tile selection keeps
    ``k + 8`` candidates on the device; near ties at the cut wider than that are scored and
    ranked on the host, as :func:`_tile_top` does."""
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
        low = vals[:, min(k, take) - 1 : min(k, take)] - _MARGIN
        wide = torch.nonzero((s >= low).sum(dim=1) > take).flatten().cpu().numpy() if take < n else np.zeros(0, np.int64)
        top, top_s = idx.cpu().numpy(), vals.cpu().numpy()
        for r in wide:  # more documents near the cut than the candidates taken: the best of all of them, scored exactly
            cand = torch.nonzero(s[r] >= low[r, 0]).flatten().cpu().numpy()
            top[r], top_s[r] = _near_cut(block[r], cand, j, take, tiebreak, v.matrix)
        return top + j, top_s

    return run


def _tile_top(s: np.ndarray, offset: int, k: int, tiebreak: np.ndarray, block: np.ndarray, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A (queries x documents) tile of product scores -> each query's candidates for its k best,
    (document rows offset by ``offset``, product scores): its ``k + 8`` best products; where
    more documents than that lie within ``_MARGIN`` of the k-th (identical vectors, whose
    products differ by their place), the ``k + 8`` best of all of those, scored exactly
    (:func:`_near_cut`: ``block``'s query, ``matrix``'s rows)."""
    n = s.shape[1]
    take = min(n, k + 8)  # candidates per query: a few past k, so that near ties at the cut are usually among them
    part = np.argpartition(-s, take - 1, axis=1)[:, :take] if take < n else np.broadcast_to(np.arange(n), s.shape)
    ps = np.take_along_axis(s, part, axis=1)
    if take < n:
        part = np.array(part)
        low = -np.partition(-ps, k - 1, axis=1)[:, k - 1 : k] - _MARGIN
        for r in np.flatnonzero((s >= low).sum(axis=1) > take):
            part[r], ps[r] = _near_cut(block[r], np.flatnonzero(s[r] >= low[r, 0]), offset, take, tiebreak, matrix)
    return part + offset, ps


def _near_cut(query: np.ndarray, cand: np.ndarray, offset: int, take: int, tiebreak: np.ndarray, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of a tile's documents ``cand`` (rows from ``offset``) near its cut, the ``take`` best under
    the run order, scored exactly: (their rows in the tile, their scores)."""
    scores = pair_scores(query[None, :], np.zeros(len(cand), np.intp), matrix, cand + offset)
    pick = np.lexsort((tiebreak[cand + offset], -scores))[:take]
    return cand[pick], scores[pick]
