"""The BM25 batch engine (pipelines/engines/bm25/) against LanceDB's full-text search, the path it
replaces: the same analyzer token for token, the same scores within 1e-6 (absolute) +
1e-6 (relative), the same top k but for ties at the cut; a patched index equal to a built
one; every table version with its own index. Real LanceDB tables, generated vectors."""

from __future__ import annotations

import ast
import gzip
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from logicrank.pipelines.codedigest import code_definitions
from logicrank.pipelines.datasets import scifact
from logicrank.pipelines.engines import bm25
from logicrank.pipelines.engines.embed import to_fixed_size_list
from logicrank.pipelines.engines.store import DocStore
from tests.compare import assert_ranking_close

pytestmark = pytest.mark.integration
TOL = {"rtol": 1e-6, "atol": 1e-6}  # LanceDB scores in float32 (its idf of a term in nearly every document loses digits)
WORDS = ["person", "x", "owns", "animal", "y", "can", "feed", "rescue", "trained", "dog", "dogs", "cat", "owner", "owning", "has", "from",
         "which", "laptop", "engineer", "works", "coding", "runs", "running", "simulations", "the", "a", "of", "is", "and", "to", "it", "z"]
# what a tokenizer can get wrong: case, accents and ligatures, Greek, digits and fractions,
# underscores and apostrophes, tokens of 39, 40 and 41 bytes, stop words before and after stemming
TRICKY = ["Café naïve façade Œuvre STRASSE straße Ærø Łódź", "IL-1β NF-κB μg/ml 5 μm ¼ ½ 1⁄2 x²", "snake_case it's O'Neil don't",
          "a" * 39 + " " + "b" * 40 + " " + "c" * 41 + " " + "é" * 20 + " " + "é" * 19, "thes these there's theirs ands ors nots",
          "ΣΟΦΙΑ σοφία İstanbul ǅemal ﬁnance", "हिंदी मराठी كَتَبَ الولد", "", "   ", "the a of"]


def _store(path, docs: list[dict]) -> DocStore:
    n = len(docs)
    s = DocStore(str(path))
    s.open_or_create(4, "gen")
    s.upsert(pa.table({
        "doc_id": [str(d["_id"]) for d in docs], "title": [d.get("title") for d in docs], "text": [d["text"] for d in docs],
        "metadata": [None] * n, "content_hash": [str(hash((d.get("title"), d["text"]))) for d in docs],
        "vector": to_fixed_size_list(np.random.default_rng(0).normal(size=(n, 4)).astype(np.float32)),
    }))
    s.build_indexes(ann_threshold=10**9)
    return s


@pytest.fixture(scope="module")
def scifact_store(tmp_path_factory):
    data = scifact()
    with gzip.open(data.corpus, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    queries = [json.loads(line)["text"] for line in data.queries.read_text(encoding="utf-8").splitlines() if line.strip()]
    return _store(tmp_path_factory.mktemp("scifact") / "db", docs), docs, queries


def _rules(n: int = 300, seed: int = 0) -> list[dict]:
    """Rule-like documents without titles; some all stop words, some empty after analysis."""
    rng = np.random.default_rng(seed)
    docs = [{"_id": f"d{i}", "title": None, "text": " ".join(rng.choice(WORDS, size=rng.integers(1, 25)))} for i in range(n)]
    docs += [{"_id": "stop-only", "title": None, "text": "the a of is"}, {"_id": "titled", "title": "Dog owner", "text": "x feeds y"}]
    return docs


def _assert_same_as_lancedb(store: DocStore, index: bm25.BM25Index, queries: list[str], k: int) -> int:
    """Every query's top k from the engine against LanceDB's; returns how many ranked anything."""
    ranked = 0
    for q, (rows, scores) in zip(queries, index.search(queries, k), strict=True):
        ref = store.text_search(q, k)
        want, want_s = ref.column("doc_id").to_pylist(), ref.column("score").to_pylist()
        got = [(d, s) for d, s in sorted(zip(index.doc_ids[rows].tolist(), scores.tolist(), strict=True), key=lambda p: (-p[1], p[0]))][:k]
        assert_ranking_close([d for d, _ in got], want, [s for _, s in got], want_s, what=q[:60], **TOL)
        ranked += bool(want)
    return ranked


def test_the_analyzer_is_lancedbs_token_for_token(scifact_store):
    store, docs, queries = scifact_store
    analyze = bm25.Analyzer()
    texts = [d["text"] for d in docs] + [d["title"] for d in docs] + queries + TRICKY + [" ".join(WORDS)]
    differ = [t for t in texts if analyze(t) != [tok.text for tok in store.table.tokenize(t, column="text")]]
    assert not differ, f"{len(differ)} of {len(texts)} texts analyzed otherwise than LanceDB, e.g. {differ[:2]}"
    assert analyze("The dog's owners were running") == ["dog", "s", "owner", "were", "run"]  # a real check that it analyzes


def test_engine_scores_equal_lancedb_on_scifact(scifact_store):
    store, _, queries = scifact_store
    index = store.bm25_index()
    assert len(index) == 5183
    assert _assert_same_as_lancedb(store, index, queries, 100) == 300
    w = index.weights()
    assert store.held_bytes() >= index.nbytes() >= w.data.nbytes + w.indices.nbytes + index.title.data.nbytes + index.text.data.nbytes


def test_engine_scores_equal_lancedb_on_rules_with_repeated_query_terms(tmp_path):
    store = _store(tmp_path / "db", _rules())
    rng = np.random.default_rng(1)
    queries = ["Person X owns dog; the dog's owner feeds the dog. Can person X feed the dog?", "laptop laptop laptop engineer coding",
               "x x z can has from which", "the of a", "unseenword", *TRICKY]
    queries += [" ".join(rng.choice(WORDS, size=12)) for _ in range(40)]  # repeats by chance
    assert _assert_same_as_lancedb(store, store.bm25_index(), queries, 10) >= 40
    # and the whole product path: the bm25 method's run equals one query at a time through LanceDB
    from logicrank.pipelines.retrieval.methods.bm25 import bm25

    run = bm25(pa.table({"query_id": [f"q{i}" for i in range(len(queries))], "text": queries}), store, 10)
    for i, q in enumerate(queries):
        mine = run.filter(pa.compute.equal(run.column("query_id"), f"q{i}"))
        ref = store.text_search(q, 10)
        assert_ranking_close(mine.column("doc_id").to_pylist(), ref.column("doc_id").to_pylist(),
                             mine.column("score").to_pylist(), ref.column("score").to_pylist(), what=q[:60], **TOL)
        assert mine.column("rank").to_pylist() == list(range(1, mine.num_rows + 1))


def _equal_indexes(a: bm25.BM25Index, b: bm25.BM25Index) -> None:
    """The same documents with the same term counts per field (term ids may differ)."""
    assert sorted(a.doc_ids.tolist()) == sorted(b.doc_ids.tolist())
    for field in ("title", "text"):
        rows = lambda ix, m: {  # noqa: E731
            d: sorted((ix.vocab.terms[t], int(c)) for t, c in zip(m[i].indices, m[i].data, strict=True))
            for i, d in enumerate(ix.doc_ids.tolist())}
        assert rows(a, getattr(a, field)) == rows(b, getattr(b, field)), field
    sa, sb = a.stats(), b.stats()
    assert (sa["docs"], sa["avgdl"]) == (sb["docs"], sb["avgdl"])


def test_each_version_has_its_index_and_a_patch_equals_a_build(tmp_path):
    docs = _rules(400)
    store = _store(tmp_path / "db", docs)
    v1 = store.version
    first = bm25.update_index(store)
    assert first["how"] == "built" and first["docs"] == 402
    assert bm25.update_index(store)["how"] == "current"  # nothing to do twice
    store.tag("first")

    changed = [dict(d, text=d["text"] + " laptop rescue") for d in docs[:10]]
    added = [{"_id": f"new{i}", "title": "Cat", "text": "a trained cat can rescue a dog"} for i in range(5)]
    store.upsert(pa.table({
        "doc_id": [d["_id"] for d in changed + added], "title": [d.get("title") for d in changed + added],
        "text": [d["text"] for d in changed + added], "metadata": [None] * 15,
        "content_hash": [str(hash((d.get("title"), d["text"]))) for d in changed + added],
        "vector": to_fixed_size_list(np.ones((15, 4), np.float32)),
    }))
    keep = [d["_id"] for d in docs[5:]] + [d["_id"] for d in added]  # docs[:5] deleted (5 of the changed among them)
    assert store.delete_absent(pa.array(keep)) == 5
    store.maintain(10**9, prune_older_than=timedelta(days=1))
    second = bm25.update_index(store)
    assert second["how"] == "patched" and second["from_version"] == v1
    assert (second["kept"], second["dropped"], second["analyzed"]) == (392, 10, 10)  # 5 changed + 5 added analyzed
    latest = DocStore(str(tmp_path / "db"))
    patched = latest.bm25_index()
    assert patched.version == latest.version and len(patched) == 402
    built = bm25.BM25Index.build(latest.scan(bm25.SOURCE_COLUMNS), latest.version)
    _equal_indexes(patched, built)
    queries = ["laptop rescue", "trained cat rescue dog", "person x owns animal y"]
    # LanceDB's full-text index, updated in place, still counts the replaced and deleted rows
    # in its statistics (as Lucene does until a merge); the engine's are the version's own
    # documents, which LanceDB agrees with once its index is rebuilt
    with pytest.raises(AssertionError, match="scores"):
        _assert_same_as_lancedb(latest, patched, queries, 20)
    rebuilt = DocStore(str(tmp_path / "db"))
    rebuilt._build_fts()
    rebuilt.table.checkout_latest()
    assert _assert_same_as_lancedb(rebuilt, patched, queries, 20) == 3

    # an earlier version (by tag) reads its own index: the documents as they were
    past = DocStore(str(tmp_path / "db"), version="first")
    old = past.bm25_index()
    assert old.version == v1 and len(old) == 402 and "new0" not in set(old.doc_ids.tolist())
    assert _assert_same_as_lancedb(past, old, queries, 20) == 3

    # pruning a version removes its index; a tagged one keeps it
    store.table.tags.delete("first")
    store.maintain(10**9, prune_older_than=timedelta(0), changed=False)
    kept = bm25.saved_versions(bm25.index_root(store))
    assert v1 not in kept and kept and set(kept) <= {v["version"] for v in store.table.list_versions()}


def test_an_index_the_table_lacks_is_built_and_a_damaged_one_rebuilt(tmp_path):
    store = _store(tmp_path / "db", _rules(50))
    path = bm25.index_root(store) / f"v{store.version}"
    assert not path.exists()
    a = store.bm25_index()  # made on first use (a table indexed before the engine existed) and saved
    a.stats()  # its counts read now: the saves below replace the files it was opened from
    assert (path / "meta.json").is_file()
    (path / "text.npz").write_bytes(b"damaged")
    assert bm25.BM25Index.load(path) is None
    b = DocStore(str(tmp_path / "db")).bm25_index()
    _equal_indexes(a, b)
    whole = (path / "title.npz").read_bytes()
    (path / "title.npz").write_bytes(whole[: len(whole) // 2])  # cut off: a zip without its directory
    assert bm25.BM25Index.load(path) is None
    _equal_indexes(a, DocStore(str(tmp_path / "db")).bm25_index())
    assert bm25.BM25Index.load(path) is not None  # saved again, whole
    for name in ("data.npy", "doc_ids.arrow"):  # the mapped search files too
        whole = (path / "search" / name).read_bytes()
        (path / "search" / name).write_bytes(whole[: len(whole) // 2])
        assert bm25.MappedBM25.open(path) is None
        _equal_indexes(a, DocStore(str(tmp_path / "db")).bm25_index())
        assert bm25.MappedBM25.open(path) is not None  # saved again, whole
    indptr = np.load(path / "search" / "indptr.npy")
    indptr[0, 0] = 7  # whole in size, wrong in content: the segments' offsets no longer start at 0
    np.save(path / "search" / "indptr.npy", indptr)
    assert bm25.MappedBM25.open(path) is None
    _equal_indexes(a, DocStore(str(tmp_path / "db")).bm25_index())
    assert bm25.MappedBM25.open(path) is not None


def test_weights_other_weighting_code_computed_are_made_again_from_their_counts(tmp_path):
    """A saved index records the digest of the code its weights come from (K1, b, the combined
    statistics, the formula: storage.WEIGHTING). Weights a release computed otherwise are not
    searched (an edit of the formula was answered from the old weights, and the stage's new
    key cached them); their term counts, which no weighting changes, are weighed again."""
    from logicrank.pipelines.engines.bm25 import storage

    store = _store(tmp_path / "db", _rules(50))
    a = store.bm25_index()
    a.stats()  # (its counts read before the save below replaces its files)
    path = bm25.index_root(store) / f"v{store.version}"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["weighting"] == storage.weighting_digest()
    (path / "meta.json").write_text(json.dumps({**meta, "weighting": "another"}))  # as a release with other weights saved it
    assert bm25.MappedBM25.open(path) is None and storage.counts_meta(path) is not None
    done = bm25.update_index(store)
    assert done["how"] == "patched" and done["analyzed"] == 0 and done["kept"] == len(a)
    assert json.loads((path / "meta.json").read_text())["weighting"] == storage.weighting_digest()
    _equal_indexes(a, DocStore(str(tmp_path / "db")).bm25_index())
    # the digest follows the code of the definitions named, not their docstrings or comments
    source = ast.parse('def weigh(a):\n    """doc"""\n    return a * 2\n')
    edited = ast.parse('def weigh(a):\n    """another doc"""\n    # a comment\n    return a * 2\n')
    other = ast.parse("def weigh(a):\n    return a * 3\n")
    assert code_definitions(source) == code_definitions(edited) != code_definitions(other)


def test_counts_other_counting_code_made_or_of_another_save_are_not_searched_or_patched(tmp_path):
    """A saved index records the digest of the code its term counts come from besides the
    analyzer (storage.COUNTING: the counting, the vocabulary's numbering, the rows a build or a
    patch reads): an edit there changed neither the analyzer's digest nor the weighting's, and
    every later patch reused the counts the earlier code made. Counts of other code are built
    again. And a counts file of another save, of the same shape, is told by its postings
    (recorded in meta.json): a patch weighed it under this save's ids before."""
    import scipy.sparse as sp

    from logicrank.pipelines.engines.bm25 import storage

    store = _store(tmp_path / "db", _rules(50))
    a = store.bm25_index()
    a.stats()
    path = bm25.index_root(store) / f"v{store.version}"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["counting"] == storage.counting_digest() and meta["nnz"]["text"] == a.text.nnz
    (path / "meta.json").write_text(json.dumps({**meta, "counting": "another"}))  # as a release that counted otherwise saved it
    assert bm25.MappedBM25.open(path) is None and storage.counts_meta(path) is None
    done = bm25.update_index(store)
    assert done["how"] == "built" and done["analyzed"] == len(a)
    _equal_indexes(a, DocStore(str(tmp_path / "db")).bm25_index())
    text = sp.load_npz(path / "text.npz").tolil()  # another save's counts of the same shape: one posting fewer
    row, col = text.nonzero()
    text[row[0], col[0]] = 0
    sp.save_npz(path / "text.npz", text.tocsr(), compressed=False)
    assert storage.counts_meta(path) is None and bm25.BM25Index.load(path) is None


def test_an_index_of_the_previous_format_is_saved_again_from_its_counts(tmp_path):
    """An index saved before the search files were cut in segments (format 2) is not searched,
    and not re-analyzed either: its term counts (unchanged since) make this format's files."""
    store = _store(tmp_path / "db", _rules(50))
    a = store.bm25_index()
    a.stats()
    path = bm25.index_root(store) / f"v{store.version}"
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "format": 2}))
    assert bm25.MappedBM25.open(path) is None and bm25.BM25Index.load(path) is not None
    done = bm25.update_index(store)
    assert done["how"] == "patched" and done["analyzed"] == 0 and done["kept"] == len(a)
    b = DocStore(str(tmp_path / "db")).bm25_index()
    assert isinstance(b, bm25.MappedBM25) and json.loads((path / "meta.json").read_text())["format"] == bm25.FORMAT
    _equal_indexes(a, b)


def test_ties_rank_by_doc_id_descending_as_runs_do(tmp_path):
    """Documents with one text score alike: the engine ranks them by doc id descending
    (trec_eval's order, rank_pairs'), at the cut too."""
    docs = [{"_id": f"t{i:02d}", "title": None, "text": "dog owner feeds the dog"} for i in range(12)]
    docs += [{"_id": f"o{i}", "title": None, "text": f"cat number {i} runs"} for i in range(30)]
    store = _store(tmp_path / "db", docs)
    from logicrank.pipelines.retrieval.methods.bm25 import bm25

    run = bm25(pa.table({"query_id": ["q"], "text": ["dog owner"]}), store, 5)
    assert run.column("doc_id").to_pylist() == ["t11", "t10", "t09", "t08", "t07"]
    assert len(set(run.column("score").to_pylist())) == 1


def test_an_index_of_a_dropped_table_is_not_reused_by_its_successor(tmp_path):
    """A table dropped and made again reuses version numbers: its saved index must not."""
    store = _store(tmp_path / "db", _rules(40))
    first = store.bm25_index()
    version = store.version
    store.db.drop_table(store.name)  # (dropped behind logicrank's back: the index stays on disk)
    again = _store(tmp_path / "db", [{"_id": "z1", "title": None, "text": "zebra crossing"}])
    assert again.version == version  # the same number ...
    index = again.bm25_index()  # ... but not the same table: rebuilt
    assert index.doc_ids.tolist() == ["z1"] and len(first) == 42
    again.drop()  # logicrank's own drop takes the indexes with it
    assert not bm25.index_root(again).exists()


def test_the_compiled_search_equals_the_sparse_product_with_ties_by_doc_id_descending(tmp_path):
    """The search loop against the definition it compiles: ``Q @ W.T`` with scipy, then score
    descending and doc id descending; identical documents tie exactly, so the cut at k is decided
    by doc id alone."""
    docs = _rules(200, seed=3) + [{"_id": f"twin{i:02d}", "title": None, "text": "dog owner feeds the cat"} for i in range(30)]
    index = _store(tmp_path / "db", docs).bm25_index()
    queries = ["dog owner", "cat", "feeds feeds dog", "unseenword", "", *[" ".join(WORDS[i : i + 4]) for i in range(0, 28, 3)]]
    product = (index.query_matrix(queries) @ index.weights()).toarray()
    ids = index.doc_ids.astype(str)
    for k in (12, len(index) + 5):  # a cut inside the hits, and more room than documents
        for q, row, (rows, scores) in zip(queries, product, index.search(queries, k), strict=True):
            hit = np.flatnonzero(row > 0)
            want = sorted(sorted(hit.tolist(), key=lambda d: ids[d], reverse=True), key=lambda d: -row[d])[:k]  # stable: ties keep id order
            assert ids[rows].tolist() == ids[want].tolist(), (q, k)
            np.testing.assert_allclose(scores, row[want], rtol=1e-6, atol=0)
    twins = index.search(["dog owner feeds cat"], 5)[0][0]
    assert ids[twins].tolist() == ["twin29", "twin28", "twin27", "twin26", "twin25"]


SEARCH_FIRST = (
    "import os; os.environ['LOGICRANK_BM25_COMPILED'] = '0'  # the JIT loop (the compiled one never loads numba)\n"
    "import numpy as np, scipy.sparse as sp\n"
    "from logicrank.pipelines.engines.bm25 import decode_keys, loading\n"
    "w = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], np.float32))\n"
    "q = sp.csr_matrix(np.array([[1.0, 1.0]], np.float32))\n"
    "keys, found = loading.kernels().top_k(q.indptr, q.indices, q.data, w.indptr[None, :].astype(np.int64), w.indices, w.data,\n"
    "                                      3, np.arange(3), 2, np.zeros(3, np.float32), np.empty(7, np.int64), 0, 3)\n"
    "docs, scores = decode_keys(keys[0, :found[0]])\n"
    "assert docs.tolist() == [1, 2] and scores.tolist() == [3.0, 2.0]\n"
    "from llvmlite.binding import ffi\n"
    "assert isinstance(vars(ffi.lib), dict) and not isinstance(getattr(ffi.lib._lib, '__dict__'), dict)  # wrapped; the raw handle is not scannable\n"
)
NUMBA_FIRST = "import numba\n"  # numba loaded by something else (bm25s's numba backend): the engine wraps the handle itself


@pytest.mark.parametrize("before", [SEARCH_FIRST, NUMBA_FIRST], ids=["search", "bare-numba"])
def test_a_vllm_engine_starts_in_a_process_that_loaded_numba_first(before, tiny_cfg):
    """numba loaded first (the search loop, or anything else), then a vLLM engine in the same
    process. vLLM's engine start reads ``vars()`` of every module attribute, which llvmlite's
    library handle answered with a function wrapper: the scan raised and no engine started.
    pipelines/llvmlite_compat.py wraps the handle (when the BM25 engine loads numba, and
    before an LLM engine starts)."""
    child = before + (
        "import sys\n"
        "from logicrank.pipelines.llm.engine import Engine\n"
        "from logicrank.pipelines.config.settings import LLMConfig\n"
        "engine = Engine(LLMConfig.model_validate_json(sys.argv[1]))\n"
        "assert len(engine.generate(['hello'], max_tokens=4, temperature=0.0, seed=0)) == 1\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", child, tiny_cfg.model_dump_json()], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
