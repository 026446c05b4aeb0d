"""The threshold algorithm behind BM25's repeated query terms: the exact top k of a sum of
ranked lists, whatever the lists."""

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.store import _summed_top_k


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 60), st.integers(1, 12), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_summed_top_k_equals_the_brute_force_sum(n_lists, n_docs, k, start, seed):
    rng = np.random.default_rng(seed)
    lists = []
    for _ in range(n_lists):  # each list scores a random subset, some scores tied
        members = rng.choice(n_docs, size=rng.integers(0, n_docs + 1), replace=False)
        lists.append({f"d{d}": float(rng.integers(1, 6)) / 2 for d in members})
    calls = []

    def search(scores):
        def top(m):
            calls.append(m)
            items = sorted(scores.items(), key=lambda kv: -kv[1])[:m]
            return pa.table({"doc_id": pa.array([d for d, _ in items], pa.string()), "score": pa.array([v for _, v in items], pa.float64())})
        return top

    got = _summed_top_k([search(s) for s in lists], k, start)
    total: dict[str, float] = {}
    for s in lists:
        for d, v in s.items():
            total[d] = total.get(d, 0.0) + v
    want = sorted(total.values(), reverse=True)[:k]
    assert got.column("score").to_pylist() == want
    assert len(set(got.column("doc_id").to_pylist())) == got.num_rows
    for d, v in zip(got.column("doc_id").to_pylist(), got.column("score").to_pylist(), strict=True):
        assert total[d] == v
