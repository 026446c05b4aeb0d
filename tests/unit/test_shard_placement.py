"""How many shards a bulk retriever searches in (pipelines/engines/placement.py, ``shard_count``) and the
row ranges they hold: the per-actor memory budget (``ray.retrieve_shard_bytes``) decides unless
``ray.retrieve_shards`` is given; only bm25 and dense's exact search shard."""

from __future__ import annotations

import pytest

from logicrank.pipelines.config.settings import RayConfig
from logicrank.pipelines.engines.exact import segment_bounds, shard_bounds
from logicrank.pipelines.engines.placement import shard_count
from logicrank.pipelines.retrieval.pipeline import build
from logicrank.pipelines.retrieval.stages.itlr import ITLROptions
from logicrank.pipelines.retrieval.stages.retrievers import BM25Options, DenseOptions

GIB = 1 << 30


class _Index:
    def __init__(self, mapped: int):
        self.mapped = mapped

    def mapped_bytes(self) -> int:
        return self.mapped


class _Vectors:
    def __init__(self, size: int):
        self.size = size

    def nbytes(self) -> int:
        return self.size


class _Store:
    uri, name = "/tmp/lancedb", "docs"  # a local directory: its engines are saved and mapped

    def __init__(self, index_bytes: int):
        self.index_bytes = index_bytes

    def bm25_index(self):
        return _Index(self.index_bytes)

    def vectors(self, precision: str = "float32"):
        return _Vectors(self.index_bytes // (2 if precision == "float16" else 1))


def _shards(options, index_bytes: int, **ray) -> int | None:
    return shard_count(build(options), _Store(index_bytes), RayConfig(**ray))


@pytest.mark.parametrize(("index_bytes", "budget", "want"), [
    (GIB, 4 * GIB, None),  # fits one actor: not sharded (the driver or the pool)
    (4 * GIB, 4 * GIB, None),
    (4 * GIB + 1, 4 * GIB, 2),
    (30 * GIB, 4 * GIB, 8),
    (30 * GIB, 16 * GIB, 2),
])
def test_an_index_past_the_per_actor_budget_is_sharded_to_fit_it(index_bytes, budget, want):
    assert _shards(BM25Options(), index_bytes, retrieve_shard_bytes=budget) == want
    assert _shards(DenseOptions(), index_bytes, retrieve_shard_bytes=budget) == want


def test_float16_vectors_count_half_the_bytes():
    assert _shards(DenseOptions(), 6 * GIB) == 2
    assert _shards(DenseOptions(precision="float16"), 6 * GIB) is None


def test_given_shards_decide_and_other_stages_never_shard():
    assert _shards(BM25Options(), GIB, retrieve_shards=3) == 3
    assert _shards(BM25Options(), 100 * GIB, retrieve_shards=1) == 1  # one actor holding the whole index
    assert _shards(DenseOptions(search="ann"), 100 * GIB) is None  # the ANN index is searched whole
    assert _shards(ITLROptions(), 100 * GIB) is None  # ITLR shards through Context.shards, not as a per-query retriever


@pytest.mark.parametrize("n", [0, 1, 127, 128, 129, 1000, 4096 * 3 + 5])
@pytest.mark.parametrize("shards", [1, 2, 3, 7])
@pytest.mark.parametrize("align", [1, 128, 1000])
def test_shard_ranges_cover_every_row_once(n, shards, align):
    """Whole blocks of ``align`` rows per shard (a saved BM25 index's segments, cache lines of
    vectors), as even as the blocks allow."""
    bounds = shard_bounds(n, shards, align)
    assert len(bounds) == shards and bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(lo <= hi for lo, hi in bounds) and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert all(lo % align == 0 for lo, _ in bounds)
    blocks = [-(-(hi - lo) // align) for lo, hi in bounds]
    assert max(blocks) - min(blocks) <= 1 or n < align * shards


@pytest.mark.parametrize(("n", "shards", "seg_rows", "aligned"), [
    (40 * 128, 4, 10 * 128, True),  # a segment each
    (38 * 128, 4, 2 * 128, True),  # 19 segments: 4, 5, 5, 5 of them, the largest within 10% of an even share
    (95 * 128, 4, 10 * 128, False),  # 9.5 segments: whole ones would make one shard 3 of them (1.26x): even ranges
    (10_000_000, 4, 1 << 20, False),
    (10_000_000, 4, 1 << 19, True),
])
def test_bm25_shards_take_whole_segments_unless_that_makes_one_much_larger(n, shards, seg_rows, aligned):
    """Whole segments per shard (its actor maps only those) while the largest shard stays within
    10% of an even share; else the even ranges of every other engine."""
    got = segment_bounds(n, shards, seg_rows)
    assert got[0][0] == 0 and got[-1][1] == n and all(a[1] == b[0] for a, b in zip(got, got[1:], strict=False))
    if aligned:
        assert all(lo % seg_rows == 0 for lo, _ in got)
        assert max(hi - lo for lo, hi in got) <= 1.1 * max(hi - lo for lo, hi in shard_bounds(n, shards))
    else:
        assert got == shard_bounds(n, shards)


@pytest.mark.parametrize(("shards", "gpus", "want"), [(4, 0, 0.0), (1, 1, 1.0), (4, 4, 1.0), (3, 8, 1.0), (2, 1, 0.5), (4, 1, 0.25),
                                                      (3, 2, 0.5), (4, 3, 0.5), (7, 2, 0.25), (3, 1, 0.33)])
def test_a_gpu_share_fits_on_one_gpu(shards, gpus, want):
    """Ray places a fractional GPU request on a single GPU: the shares of the shards that share
    a GPU must add up to at most one (2 GPUs, 3 shards: 0.5 each, not 0.66)."""
    from logicrank.pipelines.engines.exact import gpu_share

    share = gpu_share(shards, gpus)
    assert share == want
    if gpus:
        per_gpu = -(-shards // gpus)
        assert per_gpu * share <= 1.0 and shards * share <= gpus


def test_shards_of_a_database_that_is_not_a_local_directory_are_refused_or_not_made():
    """Shards map the saved index; a remote database keeps none, so each shard would read the
    whole index: --shards is refused in one line, and no automatic sharding happens."""
    from logicrank.pipelines.engines.placement import ShardError

    remote = _Store(100 * GIB)
    remote.uri, remote.name = "s3://bucket/lancedb", "docs"
    assert shard_count(build(BM25Options()), remote, RayConfig()) is None
    with pytest.raises(ShardError, match=r"--shards needs a database in a local directory"):
        shard_count(build(BM25Options()), remote, RayConfig(retrieve_shards=4))
