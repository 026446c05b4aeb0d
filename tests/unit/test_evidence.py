"""Term evidence from any scorer (pipelines/retrieval/methods/evidence.py): BM25 term scores equal the
bm25 engine's, each calibration maps to [0, 1] as documented, ITLR and OrLog compose them, and
the option pairs that cannot go together are refused in one line. A small in-memory table
stands in for LanceDB (its BM25 index is the real engine's, built from the same rows)."""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from scipy.special import ndtr

from logicrank.pipelines.engines.bm25 import BM25Index
from logicrank.pipelines.retrieval.logic.fuzzy import Operators
from logicrank.pipelines.retrieval.logic.query import parse
from logicrank.pipelines.retrieval.methods.evidence import (
    BM25Evidence,
    EvidenceError,
    calibrate_evidence,
    check_calibration,
    make_evidence,
)
from logicrank.pipelines.retrieval.methods.itlr import (
    Calibration,
    LogicalQuery,
    compose,
    score_exact,
    score_listed,
    term_scores_from,
)
from logicrank.pipelines.retrieval.methods.orlog import (
    OrlogQuery,
    atom_query,
    negative_atoms_as_questions,
    posteriors,
    retrieval_truth,
)

# a LIMIT-like table: who likes what; "Ada" likes apples and pears, "Bo" apples only, ...
LIKES = {
    "ada": "Ada likes Apples, Pears and Chess.",
    "bo": "Bo likes Apples, Tango Dancing and Chess.",
    "cy": "Cy likes Pears, Kites and Tea.",
    "di": "Di likes Apple Cider, Kites and Chess.",
    "ed": "Ed likes Tea and Tango Dancing.",
    "fay": "Fay likes Apples, Apples and more Apples.",
}


class TableStore:
    """The DocStore calls evidence makes, over in-memory rows (vectors: seeded unit vectors)."""

    def __init__(self, docs: dict[str, str], dim: int = 16):
        self.ids = np.array(list(docs), dtype=object)
        batch = pa.record_batch({"doc_id": list(docs), "content_hash": [f"h{i}" for i in range(len(docs))],
                                 "title": [""] * len(docs), "text": list(docs.values())})
        self.index = BM25Index.build([batch], version=1)
        v = np.random.default_rng(0).normal(size=(len(docs), dim)).astype(np.float32)
        self.V = v / np.linalg.norm(v, axis=1, keepdims=True)
        self.dim = dim

    def bm25_index(self):
        return self.index

    def vectors_for(self, doc_ids):
        row = {d: i for i, d in enumerate(self.ids)}
        return {d: self.V[row[d]] for d in doc_ids if d in row}

    def vector_blocks(self, block_rows=32768):
        for lo in range(0, len(self.ids), block_rows):
            yield self.ids[lo : lo + block_rows], self.V[lo : lo + block_rows]

    def sample_vectors(self, n, seed=0):
        return self.V[:n]


def _encode(texts):
    """Seeded unit vectors per text (a stand-in encoder: the same text, the same vector)."""
    out = []
    for t in texts:
        v = np.random.default_rng(zlib.crc32(t.encode())).normal(size=16)
        out.append(v / np.linalg.norm(v))
    return np.asarray(out, np.float32)


@pytest.fixture
def store():
    return TableStore(LIKES)


def test_bm25_term_scores_are_the_engines_search_scores(store):
    terms = ["Apples", "Tango Dancing", "Apple Cider", "zebra"]
    ev = BM25Evidence(store, terms)
    raw = ev.raw(list(store.ids))
    for j, (rows, scores) in enumerate(store.index.search(terms, k=len(store.ids))):
        got = raw[rows, j]
        np.testing.assert_allclose(got, scores, rtol=1e-6)
        others = np.setdiff1d(np.arange(len(store.ids)), rows)
        assert (raw[others, j] == 0).all()  # a document the term misses scores 0
    assert (raw[:, 3] == 0).all()  # a word the table lacks
    blocks = list(ev.blocks(4))
    assert [len(ids) for ids, _ in blocks] == [4, 2]
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), ev.raw(list(np.concatenate([i for i, _ in blocks]))))
    with pytest.raises(KeyError, match="nobody"):
        ev.raw(["ada", "nobody"])


def test_calibrations_map_bm25_to_the_unit_interval(store):
    terms = ["Apples", "Pears", "Tango Dancing", "zebra"]
    ev = BM25Evidence(store, terms)
    raw = ev.raw(list(store.ids)).astype(np.float64)
    mx = calibrate_evidence(ev, "max").apply(raw, terms)
    np.testing.assert_allclose(mx.max(axis=0), [1, 1, 1, 0])  # the term's best document is 1; an absent term 0
    np.testing.assert_allclose(mx[:, :3], raw[:, :3] / raw[:, :3].max(axis=0))
    sat = calibrate_evidence(ev, "saturation").apply(raw, terms)
    bounds = ev.bounds()
    assert (bounds[:3] > raw[:, :3].max(axis=0)).all() and bounds[3] == 0  # never reached: tf/(tf + norm) < 1
    np.testing.assert_allclose(sat[:, :3], raw[:, :3] / bounds[:3])
    assert (sat[:, 3] == 0).all()
    z = calibrate_evidence(ev, "zscore").apply(raw, terms)
    mean, std = raw.mean(axis=0), np.maximum(raw.std(axis=0), 1e-6)
    np.testing.assert_allclose(z, ndtr((raw - mean) / std), rtol=1e-5)
    for cal in (mx, sat, z):
        assert cal.min() >= 0 and cal.max() <= 1
        # monotone per term: a single term ranks as BM25 does
        for j in range(3):
            assert (np.diff(cal[np.argsort(raw[:, j], kind="stable"), j]) >= -1e-12).all()


def test_itlr_over_bm25_reads_the_not(store):
    """'Apples but not Pears': BM25 of the words ranks Ada (both) with Bo (apples only); ITLR
    over calibrated BM25 puts the apple likers without pears first and Ada below them."""
    q = LogicalQuery("q", parse('"Apples" AND NOT "Pears"'), "ok")
    terms = ["Apples", "Pears"]
    ev = BM25Evidence(store, terms)
    for name in ("max", "saturation"):
        cal = calibrate_evidence(ev, name)
        run = score_exact([q], terms, None, ev.blocks(4), 6, [Operators()], cal)[Operators()]
        ranked = run.sort_values("score", ascending=False, kind="stable")["doc_id"].tolist()
        # (Di's "Apple Cider" stems to apples too: Bo and Di tie, in the run's order by doc id descending)
        assert set(ranked[:3]) == {"bo", "di", "fay"} and ranked.index("di") < ranked.index("bo") < ranked.index("ada")
        assert "cy" not in ranked[:3]  # pears without apples


def test_exact_blocks_and_listed_candidates_compose_alike(store):
    qs = [LogicalQuery("q1", parse('("Apples" OR "Kites") AND NOT "Chess"'), "ok"), LogicalQuery("q2", parse('"Tea"'), "ok")]
    terms = ["Apples", "Kites", "Chess", "Tea"]
    ev = BM25Evidence(store, terms)
    cal = calibrate_evidence(ev, "max")
    full = compose(qs, terms, ev.raw(list(store.ids)), Operators(), cal)
    for block in (1, 4, 100):
        got = score_exact(qs, terms, None, ev.blocks(block), 6, [Operators()], cal)[Operators()]
        for qi, q in enumerate(qs):
            s = got[got["query_id"] == q.query_id].set_index("doc_id")["score"]
            np.testing.assert_allclose(s.to_numpy(), full[qi][[list(store.ids).index(d) for d in s.index]], rtol=1e-6)
    cands = {"q1": (np.array(["ada", "di", "cy"], dtype=object), None)}
    listed = score_listed(qs, terms, lambda ids, _p: ev.raw(ids), cands, 10, Operators(), cal)
    assert listed["query_id"].tolist() == ["q1"] * 3  # q2 has no candidates: no rows
    side = term_scores_from(listed, qs, terms, lambda ids, idx, _q: ev.raw(ids)[:, idx], cal).to_pandas()
    assert len(side) == 3 * 3 and side["calibrated"].between(0, 1).all()
    d = side[(side["doc_id"] == "di") & (side["term"] == "Kites")]
    np.testing.assert_allclose(d["score"], ev.raw(["di"])[:, 1])


def test_hybrid_mixes_calibrated_evidence(store):
    terms = ["Apples", "Tea"]
    docs = list(store.ids)
    for w in (0.0, 0.3, 1.0):
        hy = make_evidence("hybrid", store, terms, _encode, hybrid_weight=w)
        b = calibrate_evidence(make_evidence("bm25", store, terms), "max").apply(hy.bm25.raw(docs), terms)
        d = calibrate_evidence(make_evidence("dense", store, terms, _encode), "zscore").apply(hy.dense.raw(docs), terms)
        np.testing.assert_allclose(hy.raw(docs), w * b + (1 - w) * d, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.concatenate([x for _, x in hy.blocks(4)]), hy.raw(docs), rtol=1e-6)
    assert "0.3 x bm25 (max)" in make_evidence("hybrid", store, terms, _encode, hybrid_weight=0.3).describe()


def test_refusals_name_what_goes_together():
    assert check_calibration("bm25", None, "itlr") == "max" and check_calibration("dense", None, "itlr") == "none"
    with pytest.raises(EvidenceError, match="scorer 'dense' takes calibration none, zscore, sigmoid, not 'max'"):
        check_calibration("dense", "max", "itlr")
    with pytest.raises(EvidenceError, match="leave calibration unset"):
        check_calibration("hybrid", "zscore", "itlr")
    with pytest.raises(EvidenceError, match="unknown scorer 'splade'"):
        check_calibration("splade", None, "itlr")
    from logicrank.pipelines.retrieval.stages.itlr import ITLROptions
    from logicrank.pipelines.retrieval.stages.orlog import OrlogOptions

    with pytest.raises(ValueError, match="scorer 'dense' takes calibration"):
        ITLROptions(calibration="saturation")
    with pytest.raises(ValueError, match="takes score_calibration"):
        OrlogOptions(scorer="bm25", calibration="content-free")
    with pytest.raises(ValueError, match="for the bm25 and dense scorers"):
        OrlogOptions(score_calibration="max")
    with pytest.raises(ValueError, match="scorer 'dense' takes score_calibration zscore, not 'max'"):
        OrlogOptions(scorer="dense", score_calibration="max")
    assert ITLROptions().scorer == "dense" and ITLROptions().calibration is None and OrlogOptions().scorer == "llm"


def test_orlog_over_bm25_is_the_exact_posterior_of_calibrated_scores(store):
    assert atom_query("{x} likes Apples") == "likes Apples" and atom_query("Is {x}  French?") == "Is French?"
    q = OrlogQuery("q", "who likes apples but not pears", (("a1", "{x} likes Apples"), ("a2", "{x} likes Pears")),
                   parse('"a1" AND NOT "a2"'), "ok")
    cands = pd.DataFrame({"query_id": ["q"] * 4, "doc_id": ["ada", "bo", "cy", "ed"], "base_rank": [1, 2, 3, 4]})
    res = retrieval_truth([q], cands, "bm25", "max", store)
    assert len(res) == 8 and res["p_true"].between(0, 1).all()
    np.testing.assert_allclose(1 / (1 + np.exp(-(res["logit_true"] - res["logit_false"]))), res["p_true"], atol=1e-9)
    ev = BM25Evidence(store, ["likes Apples", "likes Pears"])
    expect = calibrate_evidence(ev, "max").apply(ev.raw(["ada", "bo", "cy", "ed"]), ev.terms)
    p = res.set_index(["doc_id", "atom_id"])["p_true"]
    np.testing.assert_allclose([p["bo", "a1"], p["ada", "a2"], p["ed", "a1"]], [expect[1, 0], expect[0, 1], expect[3, 0]], rtol=1e-6)
    post = posteriors([q], res).set_index("doc_id")["score"]
    np.testing.assert_allclose(post["bo"], p["bo", "a1"] * (1 - p["bo", "a2"]))
    assert post.idxmax() == "bo" and post["ada"] < post["bo"]
    dense = retrieval_truth([q], cands, "dense", "zscore", store, _encode)
    assert dense["p_true"].between(0, 1).all() and len(dense) == 8


def test_orlog_over_bm25_reads_a_negative_atom_as_the_question_not_its_opposite(store):
    """"{x} does not like Pears" is "like Pears" to BM25 ("not" is a stop word): the query
    "a1 AND a2" ranked the pear lovers first, selecting what it excludes. Under a retrieval
    scorer such a query falls back to the question as its one atom, and is named."""
    neg = OrlogQuery("q", "who likes apples but not pears", (("a1", "{x} likes Apples"), ("a2", "{x} does not like Pears")),
                     parse('"a1" AND "a2"'), "ok")
    pos = OrlogQuery("p", "who likes apples but not pears", (("a1", "{x} likes Apples"), ("a2", "{x} likes Pears")),
                     parse('"a1" AND NOT "a2"'), "ok")
    titles = OrlogQuery("t", "films like Don't Look Up but not Not Fade Away", (("a1", "{x} is like Don't Look Up"), ("a2", "{x} is Not Fade Away"),
                                                                                 ("a3", "{x} funds Doctors Without Borders")), parse('"a1" AND NOT "a2" AND "a3"'), "ok")
    qs, fell = negative_atoms_as_questions([neg, pos, titles])
    assert fell == ["q"] and qs[1] is pos and qs[2] is titles  # titles keep their capitals: no negation
    assert qs[0].status == "negative-atom" and qs[0].atoms == (("a1", "{x} answers the question: who likes apples but not pears"),)
    cands = pd.DataFrame({"query_id": ["q"] * 2, "doc_id": ["ada", "bo"], "base_rank": [1, 2]})
    post = posteriors([neg], retrieval_truth([neg], cands, "bm25", "max", store)).set_index("doc_id")["score"]
    assert post["ada"] > post["bo"]  # what the fallback prevents: Ada likes pears, yet ranks first for "not pears"


@pytest.mark.parametrize("calibration", ["zscore", "max"])
def test_orlog_over_bm25_holds_an_atom_no_document_holds_false(store, calibration):
    """An atom whose text no document holds is false of every candidate (P(True) 0, as ITLR's
    empty terms), not what the calibration makes of a zero score (z-score: 0.5)."""
    q = OrlogQuery("q", "who likes apples but not zebras", (("a1", "{x} likes Apples"), ("a2", "{x} Zebras")),
                   parse('"a1" AND NOT "a2"'), "ok")
    cands = pd.DataFrame({"query_id": ["q"] * 3, "doc_id": ["ada", "bo", "cy"], "base_rank": [1, 2, 3]})
    res = retrieval_truth([q], cands, "bm25", calibration, store)
    assert res[res["atom_id"] == "a2"]["p_true"].tolist() == [0.0, 0.0, 0.0]
    assert res[res["atom_id"] == "a1"]["p_true"].gt(0).any()


def test_an_empty_table_and_no_candidates_give_empty_results():
    empty = TableStore({})
    ev = BM25Evidence(empty, ["Apples"])
    assert ev.maxima().tolist() == [0.0] and list(ev.blocks(4)) == [] and ev.raw([]).shape == (0, 1)
    q = LogicalQuery("q", parse('"Apples"'), "ok")
    assert score_exact([q], ["Apples"], None, ev.blocks(4), 5, [Operators()], calibrate_evidence(ev, "max"))[Operators()].empty
    oq = OrlogQuery("q", "", (("a1", "{x} likes Apples"),), parse('"a1"'), "ok")
    none = pd.DataFrame({"query_id": [], "doc_id": [], "base_rank": []})
    res = retrieval_truth([oq], none, "bm25", "max", TableStore(LIKES))
    assert res.empty and posteriors([oq], res).empty


@pytest.mark.parametrize("k", [1, 3, 5])
def test_ties_at_the_cut_go_to_the_largest_doc_ids_whatever_the_blocks_and_threads(store, k):
    """Over BM25 evidence ties are everywhere (NOT "Apples": every document without apples
    scores 1). The kept set is the first k in the run's order (score descending, then doc id
    descending: rank_pairs', and a `bm25 >> itlr` run's) for every block size and thread
    count, so a run is the same on any machine and its top k the first k of a deeper run's
    (before: the earliest table rows, an order of the table's layout)."""
    qs = [LogicalQuery("q1", parse('NOT "Apples"'), "ok"), LogicalQuery("q2", parse('"Chess" OR "Tea"'), "ok"),
          LogicalQuery("q3", parse('"zebra"'), "ok")]
    terms = ["Apples", "Chess", "Tea", "zebra"]
    ev = BM25Evidence(store, terms)
    cal = calibrate_evidence(ev, "max")
    full = compose(qs, terms, ev.raw(list(store.ids)), Operators(), cal)
    by_id = sorted(range(len(store.ids)), key=lambda j: store.ids[j], reverse=True)  # doc id descending, then (stable) by score
    want = {q.query_id: [store.ids[j] for j in sorted(by_id, key=lambda j: -full[i, j])[:k]] for i, q in enumerate(qs)}
    for threads in (1, 2, 3):
        for block in (1, 2, 4, 100):
            got = score_exact(qs, terms, None, ev.blocks(block), k, [Operators()], cal, threads=threads)[Operators()]
            have = {q: sorted(g["doc_id"]) for q, g in got.groupby("query_id")}
            assert have == {q: sorted(d) for q, d in want.items()}, (threads, block)


def test_ties_past_a_blocks_leading_sample_never_enter():
    """Blocks wider than the top-k's leading sample (4,096 columns), scores in few distinct
    values: the kept set is still the first k by (score descending, doc id descending),
    whatever the rows' order in the table."""
    rng = np.random.default_rng(7)
    n, terms = 12_000, ["a", "b"]
    raw = rng.integers(0, 3, size=(n, 2)).astype(np.float32) / 2  # 0, 0.5, 1: ties everywhere
    ids = np.array([f"d{i:05d}" for i in range(n)], dtype=object)
    qs = [LogicalQuery("q1", parse('"a" AND NOT "b"'), "ok"), LogicalQuery("q2", parse('"a" OR "b"'), "ok"),
          LogicalQuery("q3", parse('NOT "b"'), "ok")]  # (q3: a third of every block ties at 1, the cut's score)
    full = compose(qs, terms, raw, Operators(), Calibration())
    shuffled = rng.permutation(n)  # the table's rows in another order: the same top k
    for k in (10, 100):
        want = {q.query_id: set(ids[np.lexsort((-np.arange(n), -full[i]))[:k]]) for i, q in enumerate(qs)}  # ("d%05d": id order is i's)
        for threads, block, rows in ((1, n, np.arange(n)), (2, 5_000, np.arange(n)), (3, 9_000, shuffled), (2, 4_000, shuffled)):
            blocks = [(ids[rows][lo : lo + block], raw[rows][lo : lo + block]) for lo in range(0, n, block)]
            got = score_exact(qs, terms, None, blocks, k, [Operators()], Calibration(), threads=threads)[Operators()]
            assert {q: set(g["doc_id"]) for q, g in got.groupby("query_id")} == want, (k, threads, block)
            deeper = score_exact(qs, terms, None, blocks, 3 * k, [Operators()], Calibration(), threads=threads)[Operators()]
            assert got.reset_index(drop=True).equals(deeper.groupby("query_id", sort=False).head(k).reset_index(drop=True))


def test_bm25_evidence_over_a_mapped_index_never_loads_it_whole(store, tmp_path, monkeypatch):
    """A mapped index's ``doc_ids`` loads the whole saved index (its ids, hashes and counts: at
    10M documents about 6 GiB) into the process; BM25 evidence reads the mapped id column
    instead, and scores, blocks, samples, maxima and per-term tops equal the in-memory index's."""
    from logicrank.pipelines.engines.bm25 import MappedBM25, storage

    terms = ["Apples", "Pears", "Tango Dancing", "zebra"]
    monkeypatch.setattr(storage, "SEGMENT_ROWS", 4)  # two segments
    mapped = MappedBM25.open(store.index.save(tmp_path / "v1"))

    def whole(self):
        raise AssertionError("the whole saved index was loaded")

    monkeypatch.setattr(MappedBM25, "_full", whole)
    in_memory, on_map = BM25Evidence(store, terms), BM25Evidence(type("Mapped", (), {"bm25_index": lambda self: mapped})(), terms)
    ids = list(store.ids)
    np.testing.assert_allclose(on_map.raw(ids), in_memory.raw(ids), rtol=1e-6)
    assert on_map.has(["ada", "nobody"]).tolist() == [True, False]
    for (a_ids, a), (b_ids, b) in zip(on_map.blocks(4), in_memory.blocks(4), strict=True):
        assert list(a_ids) == list(b_ids)
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(on_map.sample(3), in_memory.sample(3), rtol=1e-6)
    np.testing.assert_allclose(on_map.maxima(), in_memory.maxima(), rtol=1e-6)
    assert on_map.top(terms, 3) == in_memory.top(terms, 3)
