"""logicrank's BM25 (DocStore.text_search) against bm25s, the reference the issues measure
against: the same analyzer (Snowball English stemming, Lucene's English stop words), the same
formula (Lucene's idf, k1 1.2, b 0.75; times k1 + 1) and the query's repeated terms counted as often as
they occur. Real LanceDB tables, no model (generated vectors)."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from logicrank.pipelines.engines.embed import to_fixed_size_list
from logicrank.pipelines.engines.store import ENGLISH_STOP_WORDS, DocStore, StoreError

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


_REFERENCE = """
import json, sys
import bm25s, Stemmer
args = json.load(sys.stdin)
stemmer = Stemmer.Stemmer("english")
def tok(texts):  # the simple tokenizer keeps one-letter words ("Person X")
    return bm25s.tokenize(texts, stopwords=args["stop"], stemmer=stemmer, token_pattern=r"(?u)\\b\\w+\\b", return_ids=False, show_progress=False)
ref = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
ref.index(tok(args["docs"]), show_progress=False)
out = []
for q in args["queries"]:
    ids, scores = ref.retrieve(tok([q]), k=args["k"], show_progress=False, n_threads=1)
    out.append([ids[0].tolist(), scores[0].tolist()])
print(json.dumps(out))
"""


def _bm25s(docs: list[str], queries: list[str], k: int) -> list:
    """bm25s's top k per query, computed in a child process: bm25s imports numba, whose
    llvmlite objects break vLLM's kernel rebinding (``vllm.triton_utils.dispatcher``) in any
    engine started later in this test process."""
    args = json.dumps({"docs": docs, "queries": queries, "k": k, "stop": list(ENGLISH_STOP_WORDS)})
    done = subprocess.run([sys.executable, "-c", _REFERENCE], input=args, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_bm25_is_lucenes_with_repeated_query_terms_counted(tmp_path):
    s, docs = _table(tmp_path / "db")
    s.build_indexes(ann_threshold=10**9)
    rng = np.random.default_rng(1)
    queries = ["Person X owns dog; the dog's owner feeds the dog. Can person X feed the dog?",
               "laptop laptop laptop engineer coding", "x x z can has from which"]
    queries += [" ".join(rng.choice(WORDS, size=12)) for _ in range(20)]  # repeats by chance
    for q, (ids, scores) in zip(queries, _bm25s(docs, queries, 10), strict=True):
        got = s.text_search(q, 10)
        # (Lucene leaves out BM25's constant factor k1 + 1, which LanceDB keeps; the order is the same)
        want = {f"d{i}": 2.2 * v for i, v in zip(ids, scores, strict=True) if v > 0}
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


def test_ascii_text_splits_into_the_simple_tokenizers_words():
    """ASCII text is split by the standard library's engine (faster) into the words the
    tokenizer's Unicode pattern finds: every ASCII character, and random ASCII strings; a text
    with any other character goes to the Unicode pattern."""
    from logicrank.pipelines.engines.bm25.analyzer import WORD, split_words

    every = "".join(map(chr, range(128)))
    rng = np.random.default_rng(3)
    texts = [every, every[::-1], "snake_case x-ray C3PO 42nd", "", "___", *("".join(rng.choice(list(every), 60)) for _ in range(200))]
    for text in texts:
        assert split_words(text) == WORD.findall(text), text
    assert split_words("naïve café 12") == ["naïve", "café", "12"]
    hindi = "नमस्ते दुनिया"
    assert split_words(hindi) == WORD.findall(hindi) and "दुनिया" in split_words(hindi)  # its vowel signs inside the word


def test_an_analyzer_subclass_analyzes_the_documents_as_its_queries():
    """A subclass that changes its call, or its words, makes the documents' terms as it makes a
    query's: an index whose documents were analyzed otherwise finds nothing it should."""
    from logicrank.pipelines.engines.bm25 import Analyzer, BM25Index

    class Prefixed(Analyzer):  # its own call; words and term inherited
        def __call__(self, text):
            return ["en:" + t for t in super().__call__(text)]

    class Spaces(Analyzer):  # its own words (split at spaces only); the call inherited
        def words(self, text):
            return text.split() if text else []

    batch = pa.record_batch({"doc_id": ["d1", "d2"], "content_hash": ["h", "h"], "title": ["X-ray dogs", None],
                             "text": ["dogs run", "cats sleep"]})
    for analyzer, query, terms in ((Prefixed(), "running dogs", {"en:dog", "en:run", "en:cat", "en:sleep", "en:x", "en:ray"}),
                                   (Spaces(), "x-ray", {"x-ray", "dog", "run", "cat", "sleep"})):
        index = BM25Index.build([batch], 1, analyze=analyzer)
        assert set(index.vocab.ids) == terms
        q = index.query_matrix([query], analyze=analyzer)
        assert q.nnz == len(analyzer(query)) > 0  # every query term is one of the documents'


def test_every_definition_the_weighting_digest_names_exists_and_a_missing_one_is_an_error(monkeypatch):
    """storage.WEIGHTING names the code a saved index's weights come from; a name left behind by
    a rename would leave that code out of the digest (or fail every search process with a bare
    KeyError), so each one must be found, and one that is not is said in one line."""
    from logicrank.pipelines.codedigest import code_definitions
    from logicrank.pipelines.engines.bm25 import storage

    for table in (storage.WEIGHTING, storage.COUNTING):  # (the counts' code: COUNTING)
        for file, names in table.items():
            found = code_definitions(ast.parse((Path(storage.__file__).with_name(file)).read_text(encoding="utf-8")))
            assert [n for n in names if n not in found] == [], file
    # the code of the tie-break ranks (search/tiebreak.npy, saved beside the weights) is the search files' too: an
    # edit to it left indexes saved before it ordering their ties as they did
    assert "tiebreak_ranks" in storage.WEIGHTING["index.py"]
    storage.weighting_digest.cache_clear()
    monkeypatch.setitem(storage.WEIGHTING, "kernels.py", ("weight_postings", "weight_postings_renamed"))
    with pytest.raises(RuntimeError, match=r"names 'weight_postings_renamed' in kernels.py, which defines no such thing"):
        storage.weighting_digest()
    monkeypatch.undo()
    storage.weighting_digest.cache_clear()
    storage.counting_digest.cache_clear()
    monkeypatch.setitem(storage.COUNTING, "index.py", ("field_counts_renamed",))
    with pytest.raises(RuntimeError, match=r"storage.COUNTING names 'field_counts_renamed' in index.py"):
        storage.counting_digest()
    monkeypatch.undo()
    storage.counting_digest.cache_clear()


def test_an_index_built_with_its_own_analyzer_reads_queries_through_it():
    """``BM25Index.build(analyze=A)`` made the documents' terms with A while ``search``,
    ``term_scores`` and ``score_bounds`` read queries through the project's analyzer: an index
    of unstemmed words found nothing for the words it holds."""
    from logicrank.pipelines.engines.bm25 import Analyzer, BM25Index

    class NoStem(Analyzer):
        def __call__(self, text):
            return [w.lower() for w in self.words(text)]

    batch = pa.record_batch({"doc_id": ["d1", "d2"], "content_hash": ["h", "h"], "title": [None, None], "text": ["running dogs", "a runner"]})
    index = BM25Index.build([batch], 1, analyze=NoStem())
    assert sorted(index.vocab.ids) == ["a", "dogs", "runner", "running"]
    [(rows, scores)] = index.search(["running dogs"], 5)
    assert rows.tolist() == [0] and scores[0] > 0
    assert index.term_scores(["running dogs"]).nnz == 1 and index.score_bounds(["running dogs"])[0] > 0
