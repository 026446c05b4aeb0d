"""Dense retrieval: the batch's queries encoded together, then each one's exact cosine top k.

The operand is the table version's unit vectors, saved beside the table and mapped by each
process that searches (pipelines/vectors.py: the processes of a node share one copy), in
float32 or, as an option, float16 (half the bytes; its recall against float32 is measured in
docs/bulk-retrieval.md). The search is one blocked product of a block of queries with tiles
of ``_TILE`` documents and a partial sort per tile, merged into the exact top k under the run
order (score descending, then doc id descending). A search may cover one shard (a range of
rows): the shards' top k merge exactly (:func:`merge_top`), which is how a corpus past one
process's memory is searched (jobs/retrieve.py, ``--shards``). Shard bounds fall on tile
bounds (:func:`shard_bounds`), so each document is scored by the same product, sharded or not.

The product runs with numpy on CPUs, or with torch (``product="torch"``; ``"auto"`` picks
torch where a GPU is visible): on a GPU the shard's vectors are copied to its memory once per
process. CI runs the torch path on CPU; tests/perf/device_dense.py checks the GPU path
against the CPU engine where an accelerator is available.

LanceDB's ANN index (IVF_HNSW_SQ) is an option (``search="ann"``): ``REFINE_FACTOR * k``
candidates per query re-ranked by their full vectors; the table must have been indexed with
one (``logicrank index --ann``).
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

from pipelines.embed import Embedder
from pipelines.methods.ranking import rank_pairs
from pipelines.store import DocStore
from pipelines.vectors import Vectors
from schemas.errors import UserError
from schemas.tables import QUERIES, RUN, require_columns

REFINE_FACTOR = 4
_TILE = 4096  # documents per tile of the product; shard bounds are multiples of it
_QUERY_BLOCK = 1024  # queries per pass over the vectors: each pass streams them once from memory


class DenseError(UserError, ValueError):
    """A dense search that cannot run as asked."""


def dense(queries: pa.Table, store: DocStore, embedder: Embedder, k: int, run_id: str = "dense", search: str = "exact",
          precision: str = "float32", product: str = "auto") -> pa.Table:
    require_columns(queries, QUERIES.names[:2], "dense")
    qids = queries.column("query_id").to_pylist()
    vectors = embedder.encode(queries.column("text").to_pylist())
    if search == "ann":
        if not store.has_ann_index():
            raise DenseError(f"dense: search 'ann' needs an ANN index on table {store.name!r}; run `logicrank index --ann`, or search 'exact'.")
        hits = store.vector_search(vectors, k, refine_factor=REFINE_FACTOR).to_pandas()
        hits["query_id"] = [qids[i] for i in hits["query_index"]]
        return rank_pairs(hits, k, "dense", run_id)
    v = store.vectors(precision)
    rows, scores = top_k(vectors, v, k, product=product)
    return run_table(qids, v, rows, scores, run_id)


def exact_top_k(qids: list[str], vectors: np.ndarray, store: DocStore, k: int, run_id: str = "dense", precision: str = "float32",
                product: str = "auto") -> pa.Table:
    """Each query's exact cosine top ``k`` (ties at the cut by doc id descending, as
    :func:`rank_pairs` orders them) as a RUN table."""
    v = store.vectors(precision)
    rows, scores = top_k(vectors, v, k, product=product)
    return run_table(qids, v, rows, scores, run_id)


def run_table(qids: list[str], v: Vectors, rows: np.ndarray, scores: np.ndarray, run_id: str = "dense") -> pa.Table:
    """(queries x kk) document rows and scores -> a RUN table, built from the arrays."""
    nq, kk = rows.shape if rows.ndim == 2 else (len(qids), 0)
    total = nq * kk
    label = lambda value: pa.array([value], pa.string()).take(np.zeros(total, np.int32))  # noqa: E731
    return pa.table({
        "query_id": pa.array(qids, pa.string()).take(np.repeat(np.arange(nq), kk)),
        "doc_id": v.ids.take(rows.ravel()),
        "rank": pa.array(np.tile(np.arange(1, kk + 1, dtype=np.int32), nq), pa.int32()),
        "score": pa.array(scores.ravel().astype(np.float64), pa.float64()),
        "method": label("dense"),
        "run_id": label(run_id),
    }, schema=RUN)


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` ranges of rows covering ``[0, n)``, as even as tiles allow (bounds on tile
    bounds, so every document is scored by the product it gets unsharded); empty ranges
    where the corpus has fewer tiles than shards."""
    tiles = -(-n // _TILE)
    cuts = [min(n, (tiles * i // shards) * _TILE) for i in range(shards + 1)]
    cuts[-1] = n
    return list(zip(cuts[:-1], cuts[1:], strict=True))


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
    tile = max(_TILE, k + 8)
    product_fn = _torch_product(v, lo, hi) if _use_torch(product) else _numpy_product(v)
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
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _numpy_product(v: Vectors):
    def run(block: np.ndarray, j: int, end: int, k: int, tiebreak: np.ndarray):
        docs = v.matrix[j:end]
        s = block @ (docs if docs.dtype == np.float32 else docs.astype(np.float32)).T
        return _tile_top(s, j, k, tiebreak)

    return run


_DEVICE_VECTORS: dict = {}  # (path, precision, lo, hi) -> the shard's vectors on the GPU, once per process


def _torch_product(v: Vectors, lo: int, hi: int):
    """The product with torch: on the GPU where one is visible (the shard's vectors copied
    there once), else on the CPU (CI's check of this path). The per-tile selection keeps
    ``k + 8`` candidates on the device; ties at the cut wider than that are ranked on the host
    from the tile's row, as :func:`_tile_top` does."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    key = (str(v.path), v.matrix.dtype.str, lo, hi, device)
    if device == "cuda":
        if key not in _DEVICE_VECTORS:
            _DEVICE_VECTORS.clear()  # one shard per process at a time
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
