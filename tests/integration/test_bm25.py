"""logicrank's BM25 (DocStore.text_search) against bm25s, the reference the issues measure
against: the same analyzer (Snowball English stemming, Lucene's English stop words), the same
formula (Lucene's idf, k1 1.2, b 0.75; times k1 + 1) and the query's repeated terms counted as often as
they occur. Real LanceDB tables, no model (generated vectors)."""

import bm25s
import numpy as np
import pyarrow as pa
import pytest
import Stemmer

from pipelines.embed import to_fixed_size_list
from pipelines.store import ENGLISH_STOP_WORDS, DocStore, StoreError

pytestmark = pytest.mark.integration

WORDS = ["person", "x", "owns", "animal", "y", "can", "feed", "rescue", "trained", "dog", "dogs", "cat", "owner", "owning", "has", "from", "which", "laptop", "engineer", "works", "coding", "runs", "running", "simulations", "the", "a", "of", "is", "and", "to", "in", "it", "z"]


def _table(path, n=300, seed=0):
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(3, 25))) for _ in range(n)]
    titles = [None] * n  # (with titles, LanceDB's combined-field statistics are not the concatenation's)
    v = rng.normal(size=(n, 4)).astype(np.float32)
    s = DocStore(str(path))
    s.open_or_create(4, "gen")
    s.upsert(pa.table({
        "doc_id": [f"d{i}" for i in range(n)], "title": titles, "text": texts,
        "metadata": [None] * n, "content_hash": ["h"] * n, "vector": to_fixed_size_list(v),
    }))
    return s, [f"{t or ''} {x}".strip() for t, x in zip(titles, texts, strict=True)]


def test_bm25_is_lucenes_with_repeated_query_terms_counted(tmp_path):
    s, docs = _table(tmp_path / "db")
    s.build_indexes(ann_threshold=10**9)
    stemmer = Stemmer.Stemmer("english")

    def tok(texts):  # the simple tokenizer keeps one-letter words ("Person X")
        return bm25s.tokenize(texts, stopwords=list(ENGLISH_STOP_WORDS), stemmer=stemmer, token_pattern=r"(?u)\b\w+\b",
                              return_ids=False, show_progress=False)

    ref = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
    ref.index(tok(docs), show_progress=False)
    rng = np.random.default_rng(1)
    queries = ["Person X owns dog; the dog's owner feeds the dog. Can person X feed the dog?",
               "laptop laptop laptop engineer coding", "x x z can has from which"]
    queries += [" ".join(rng.choice(WORDS, size=12)) for _ in range(20)]  # repeats by chance
    for q in queries:
        got = s.text_search(q, 10)
        ids, scores = ref.retrieve(tok([q]), k=10, show_progress=False, n_threads=1)
        # (Lucene leaves out BM25's constant factor k1 + 1, which LanceDB keeps; the order is the same)
        want = dict(zip((f"d{i}" for i in ids[0]), (2.2 * scores[0]).tolist(), strict=True))
        want = {d: v for d, v in want.items() if v > 0}
        np.testing.assert_allclose(got.column("score").to_numpy(), sorted(want.values(), reverse=True), rtol=1e-4, err_msg=q)
        clear = min(want.values()) if len(want) < 10 else sorted(want.values())[0] + 1e-3  # ties at the cut may differ
        assert {d for d, v in want.items() if v > clear} <= set(got.column("doc_id").to_pylist()), q


def test_a_table_indexed_with_another_analyzer_is_refused_then_reindexed(tmp_path):
    s, _ = _table(tmp_path / "db", n=20)
    s.build_indexes(ann_threshold=10**9)
    assert s.fts_current()
    for col in ("title", "text"):  # what logicrank before Lucene's stop words built
        s.table.create_fts_index(col, replace=True, with_position=False, language="English", stem=True, remove_stop_words=True)
    assert not s.fts_current()
    with pytest.raises(StoreError, match="run `logicrank index` on it again"):
        s.require_fts("retrieve")
    report = s.maintain(10**9, prune_older_than=__import__("datetime").timedelta(days=1), changed=False)
    assert report["indexes_rebuilt"] == ["text", "title"] and s.fts_current()
