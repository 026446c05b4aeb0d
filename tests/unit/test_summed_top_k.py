"""The threshold algorithm behind BM25's repeated query terms: the exact top k of a sum of
ranked lists, whatever the lists."""

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from logicrank.pipelines.engines.store.reading import summed_top_k


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 60), st.integers(1, 12), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_summed_top_k_equals_the_brute_force_sum(n_lists, n_docs, k, start, seed):
    rng = np.random.default_rng(seed)
    lists = []
    for _ in range(n_lists):  # each list scores a random subset, some scores tied
        members = rng.choice(n_docs, size=rng.integers(0, n_docs + 1), replace=False)
        lists.append({f"d{d}": float(rng.integers(1, 6)) / 2 for d in members})
    def table(items):
        return pa.table({"doc_id": pa.array([d for d, _ in items], pa.string()), "score": pa.array([v for _, v in items], pa.float64())})

    def search(scores):
        return lambda m: table(sorted(scores.items(), key=lambda kv: -kv[1])[:m])

    def lookup(scores):
        return lambda ids: table([(d, scores[d]) for d in ids if d in scores])

    got = summed_top_k([search(s) for s in lists], [lookup(s) for s in lists], k, start)
    total: dict[str, float] = {}
    for s in lists:
        for d, v in s.items():
            total[d] = total.get(d, 0.0) + v
    want = sorted(total.values(), reverse=True)[:k]
    assert got.column("score").to_pylist() == want
    assert len(set(got.column("doc_id").to_pylist())) == got.num_rows
    for d, v in zip(got.column("doc_id").to_pylist(), got.column("score").to_pylist(), strict=True):
        assert total[d] == v


def test_a_clear_winner_is_found_without_reading_the_long_lists():
    """One document far ahead in round 1 and absent from round 2: looked up there, not waited for."""
    r1 = {"top": 50.0, **{f"d{i}": 1.0 for i in range(5000)}}
    r2 = {f"d{i}": 0.5 for i in range(5000)}
    depths = []

    def search(scores):
        def top(m):
            depths.append(m)
            items = sorted(scores.items(), key=lambda kv: -kv[1])[:m]
            return pa.table({"doc_id": [d for d, _ in items], "score": pa.array([v for _, v in items], pa.float64())})
        return top

    def lookup(scores):
        return lambda ids: pa.table({"doc_id": [d for d in ids if d in scores], "score": pa.array([scores[d] for d in ids if d in scores], pa.float64())})

    got = summed_top_k([search(r1), search(r2)], [lookup(r1), lookup(r2)], 1, 64)
    assert got.column("doc_id").to_pylist() == ["top"] and got.column("score").to_pylist() == [50.0]
    assert max(depths) == 64
