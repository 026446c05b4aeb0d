import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from logicrank.jobs.retrieve_notes import fallback_notes
from logicrank.pipelines.datasets import scifact
from logicrank.pipelines.generate.synthetic import TEMPLATES, generate, scifact_topics
from logicrank.pipelines.retrieval.logic.fuzzy import Operators, compile_query
from logicrank.pipelines.retrieval.logic.query import holds, parse
from logicrank.pipelines.retrieval.methods.itlr import (
    Calibration,
    LogicalQuery,
    ScoreError,
    ann_candidates,
    compose,
    parse_queries,
    positive_terms,
    score_candidates,
    score_exact,
    score_listed,
    term_scores,
    unfitted_terms,
)


def _unit(rng, n, d=16):
    v = rng.normal(size=(n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _queries(rows):
    return pa.table(
        {"query_id": [r[0] for r in rows], "text": [r[1] for r in rows], "logical_query": [r[2] for r in rows]},
    )


@pytest.fixture
def setup():
    rng = np.random.default_rng(3)
    docs, terms = _unit(rng, 237), ["a", "b", "c", "d"]
    T = _unit(rng, 4)
    qs = parse_queries(_queries([
        ("q1", "x", '"a" AND NOT "b"'),
        ("q2", "x", '("a" OR "c") AND "d"'),
        ("q3", "x", 'NOT "c"'),
        ("q4", "plain text", None),
        ("q5", "broken", '"a" AND'),
    ]))
    return docs, np.array([f"d{i}" for i in range(len(docs))], dtype=object), terms, T, qs


def test_parse_queries_falls_back_and_keeps_every_row(setup):
    *_, qs = setup
    assert [q.status for q in qs] == ["ok", "ok", "ok", "fallback", "fallback"]
    assert qs[3].ast == parse('"plain text"') and "no logical_query" in qs[3].error
    assert "position 7" in qs[4].error


@pytest.mark.parametrize(("block", "threads", "copies"), [(50, 1, 1), (50, 3, 1), (7, 2, 1), (237, 4, 1), (50, 2, 3)])
def test_exact_streaming_equals_brute_force(setup, block, threads, copies):
    # blocks narrower than k, one block for everything, more threads than a block's columns;
    # copies > 1: terms repeat across queries, so the product runs over unique terms + a gather
    docs, ids, terms, T, qs = setup
    qs = [dataclasses.replace(q, query_id=f"{q.query_id}-{c}") for c in range(copies) for q in qs[:3]]
    ops = [Operators(), Operators("min", "max", "reciprocal")]
    blocks = [(ids[i : i + block], docs[i : i + block]) for i in range(0, len(docs), block)]
    got = score_exact(qs, terms, T, blocks, 10, ops, Calibration(), threads=threads)
    S = docs @ T.T
    for o in ops:
        for q in qs:
            full = compose([q], terms, S, o, Calibration())[0]  # the method's own composition
            top = got[o][got[o]["query_id"] == q.query_id]
            # the k best scores, each on the document that has it (NOT = reciprocal ties at 1/eps)
            np.testing.assert_allclose(np.sort(top["score"].to_numpy())[::-1], np.sort(full)[::-1][:10], rtol=1e-5)
            row = {d: i for i, d in enumerate(ids)}
            np.testing.assert_allclose(full[[row[d] for d in top["doc_id"]]], top["score"].to_numpy(), rtol=1e-5)
            assert top["doc_id"].is_unique


@pytest.mark.parametrize("threads", [1, 2])
def test_a_nan_score_is_refused_not_ranked_below_every_document(setup, threads):
    """A document whose vector holds a NaN composes to NaN: it used to count as -inf and leave
    the run silently (the exact pass and the candidates' re-scoring alike). It is refused, the
    query and document named."""
    docs, ids, terms, T, qs = setup
    docs = docs.copy()
    docs[123, 0] = np.nan
    with pytest.raises(ScoreError, match=r"composed score\(s\) are NaN, e\.g\. query 'q1', doc 'd123'"):
        score_exact(qs[:2], terms, T, [(ids[i : i + 50], docs[i : i + 50]) for i in range(0, len(docs), 50)], 10, [Operators()],
                    Calibration(), threads=threads)
    with pytest.raises(ScoreError, match=r"query 'q1', doc 'd123'"):
        score_candidates(qs[:1], terms, T, {"q1": (ids[120:130], docs[120:130])}, 5, Operators(), Calibration())
    # the other documents score as before: only the NaN is refused
    assert len(score_exact(qs[:2], terms, T, [(np.delete(ids, 123), np.delete(docs, 123, axis=0))], 10, [Operators()],
                           Calibration())[Operators()]) == 20


def test_a_reciprocal_not_past_float32_is_refused_not_dropped():
    """not=reciprocal gives 1/1e-6 for each negated term a document misses: seven overflow
    float32 to +inf, and the filters that drop strict NOT's exclusions (-inf) dropped the very
    documents that hold none of the negated terms, leaving the one that holds one. Refused."""
    terms = ["a"] + [f"n{i}" for i in range(7)]
    q = LogicalQuery("q1", parse('"a" AND ' + " AND ".join(f'NOT "{t}"' for t in terms[1:])), "ok")
    raw = np.array([[5.0] + [0.0] * 7, [5.0, 3.0] + [0.0] * 6, [2.0] + [0.0] * 7], np.float32)  # d_good, d_bad (holds n0), d_ok
    ids = np.array(["d_good", "d_bad", "d_ok"], dtype=object)
    ops, cal = Operators.parse("not=reciprocal"), Calibration.divide("max", terms, np.array([5.0] + [3.0] * 7))
    with pytest.warns(RuntimeWarning), pytest.raises(ScoreError, match=r"2 composed score\(s\) are infinite, e\.g\. query 'q1', doc 'd_good'.*not=reciprocal"):
        score_listed([q], terms, lambda i, p: raw, {"q1": (ids, None)}, 10, ops, cal, drop_unsupported=True)
    with pytest.warns(RuntimeWarning), pytest.raises(ScoreError, match=r"are infinite"):
        score_exact([q], terms, None, iter([(ids, raw)]), 10, [ops], cal, drop_unsupported=True)
    # six negations stay in range and rank as the operator says
    q6 = LogicalQuery("q1", parse('"a" AND ' + " AND ".join(f'NOT "{t}"' for t in terms[1:7])), "ok")
    top = score_listed([q6], terms[:7], lambda i, p: raw[:, :7], {"q1": (ids, None)}, 10, ops, cal, drop_unsupported=True)
    assert top["doc_id"].tolist() == ["d_good", "d_ok", "d_bad"]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_a_reciprocal_not_overflowing_to_minus_inf_is_refused_not_read_as_strict_nots_exclusion():
    """Over raw scores below 0 (cosines), not=reciprocal's 1/1e-6 per missed negated term times
    a negative score overflows float32 to -inf: the filters that drop strict NOT's exclusions
    dropped that document, though no strict NOT was asked for. Refused; with strict_not set,
    -inf stays its exclusion."""
    terms = ["a"] + [f"n{i}" for i in range(7)]
    q = LogicalQuery("q1", parse('"a" AND ' + " AND ".join(f'NOT "{t}"' for t in terms[1:])), "ok")
    raw = np.array([[-0.1] + [-0.05] * 7, [0.6] + [0.3] * 7], np.float32)
    ids = np.array(["d1", "d2"], dtype=object)
    ops = Operators.parse("not=reciprocal")
    with np.errstate(over="ignore"), pytest.raises(ScoreError, match=r"1 composed score\(s\) are infinite, e\.g\. query 'q1', doc 'd1'"):
        score_listed([q], terms, lambda i, p: raw, {"q1": (ids, None)}, 10, ops, Calibration())
    with np.errstate(over="ignore"), pytest.raises(ScoreError, match=r"query 'q1', doc 'd1'"):
        score_exact([q], terms, None, iter([(ids, raw)]), 10, [ops], Calibration())
    strict = dataclasses.replace(ops, strict_not=0.5)
    with np.errstate(over="ignore"):  # a strict NOT: every -inf is an exclusion, as before
        kept = score_listed([q], terms, lambda i, p: raw, {"q1": (ids, None)}, 10, strict, Calibration())
    assert "d1" not in kept["doc_id"].tolist()


def test_positive_terms_and_ann_candidates(setup):
    docs, ids, terms, T, qs = setup
    assert positive_terms(parse('"a" AND NOT ("b" OR NOT "c")')) == {"a", "c"}
    assert positive_terms(parse('NOT "c"')) == set()

    def search(vectors, k):  # exact nearest neighbours, the store's contract
        sims = vectors @ docs.T
        top = np.argsort(-sims, axis=1)[:, :k]
        return pa.table({
            "query_index": np.repeat(np.arange(len(vectors)), k).astype(np.int32),
            "doc_id": ids[top].reshape(-1),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(docs[top].reshape(-1)), docs.shape[1]),
        })

    cands, exact = ann_candidates(qs[:3], terms, T, search, 20)
    assert [q.query_id for q in exact] == ["q3"]
    a_top = set(ids[np.argsort(-(docs @ T[0]))[:20]])
    c_top = set(ids[np.argsort(-(docs @ T[2]))[:20]])
    d_top = set(ids[np.argsort(-(docs @ T[3]))[:20]])
    assert set(cands["q1"][0]) == a_top  # NOT "b" adds no candidates
    assert set(cands["q2"][0]) == a_top | c_top | d_top
    # re-scoring candidates exactly gives the exact scores of those documents
    run = score_candidates(qs[:2], terms, T, cands, 5, Operators(), Calibration())
    S = docs @ T.T
    for q in qs[:2]:
        full = dict(zip(ids, compile_query(q.ast, terms, Operators())(S), strict=True))
        for r in run[run["query_id"] == q.query_id].itertuples():
            assert r.score == pytest.approx(full[r.doc_id], rel=1e-5)


def test_calibrations():
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(0.6, 0.05, 400), rng.normal(0.3, 0.05, 400)
    cal = Calibration.fit_sigmoid({"t": (pos, neg)})
    tau, lam = cal.params["t"]
    assert 0.4 < tau < 0.5 and lam > 20  # the boundary sits between the classes
    out = cal.apply(np.array([[0.3], [0.45], [0.6]]), ["t"])[:, 0]
    assert out[0] < 0.05 and 0.2 < out[1] < 0.8 and out[2] > 0.95
    z = Calibration.zscore(["t", "u"], np.c_[rng.normal(0.2, 0.1, 1000), rng.normal(0.5, 0.01, 1000)])
    got = z.apply(np.array([[0.2, 0.5], [0.4, 0.52]]), ["t", "u"])
    np.testing.assert_allclose(got[0], [0.5, 0.5], atol=0.05)
    assert got[1, 0] > 0.95 and got[1, 1] > 0.95  # two standard deviations up, whatever the scale
    with pytest.raises(ValueError, match="valid: none, zscore, sigmoid"):
        Calibration("platt")


def test_a_sigmoid_left_unfitted_for_a_composed_term_is_named():
    """Labels that never hold a term beside one that does fit no sigmoid for it: composed with
    calibrated terms, its raw scores (BM25's 12, a NOT of it -11) leave [0, 1], so the run names
    it. A one-term query (a fallback's text) ranks by its raw score alike, and a term no
    document holds is 0 whatever the calibration: neither is named."""
    queries = pa.table({"query_id": ["q1", "q2"], "text": ["t", "whole text of a fallback"],
                        "logical_query": pa.array(['"a" AND NOT "b"', None], pa.string())})
    parsed = parse_queries(queries)
    fitted = Calibration("sigmoid", {"a": (0.5, 4.0)})
    assert unfitted_terms(fitted, parsed) == ["b"]
    assert unfitted_terms(fitted, parsed, {"b": "no document holds it"}) == []
    assert unfitted_terms(Calibration("sigmoid", {"a": (0.5, 4.0), "b": (0.5, 4.0)}), parsed) == []
    assert unfitted_terms(Calibration("max", {}), parsed) == []  # (another calibration: nothing to fit)
    line = fallback_notes("p", [{"stage": "itlr", "uncalibrated_terms": 1, "uncalibrated_term_names": ["b"]}])
    assert line == ["retrieve: pipeline 'p', stage itlr: sigmoid calibration fitted no sigmoid for 1 composed term (no labelled document "
                    "holds it beside one that does not), composed raw beside calibrated ones: 'b'; add labels for it, or use another "
                    "calibration."]


def test_term_scores_table(setup):
    docs, ids, terms, T, qs = setup
    run = score_exact(qs[:1], terms, T, [(ids, docs)], 3, [Operators()], Calibration())[Operators()]
    table = term_scores(run, qs[:1], terms, T, dict(zip(ids, docs, strict=True)), Calibration())
    assert table.num_rows == 3 * 2 and set(table.column("term").to_pylist()) == {"a", "b"}
    d0 = table.column("doc_id")[0].as_py()
    assert table.column("score")[0].as_py() == pytest.approx(float(docs[list(ids).index(d0)] @ T[0]), rel=1e-5)
    with pytest.raises(KeyError, match=f"no vector for document\\(s\\) \\['{d0}'\\] of query q1"):  # never another document's vector
        term_scores(run, qs[:1], terms, T, {d: v for d, v in zip(ids, docs, strict=True) if d != d0}, Calibration())


def test_generator_is_deterministic_and_correct(tmp_path):
    assert len(TEMPLATES) == 32 and len({t.name for t in TEMPLATES}) == 32
    assert sorted(t.negations for t in TEMPLATES).count(0) == 4
    a = generate(scifact().corpus, tmp_path / "a", per_template=2, seed=7)
    generate(scifact().corpus, tmp_path / "b", per_template=2, seed=7)
    for name in ("corpus.jsonl", "queries.jsonl", "labels.jsonl", "qrels/test.tsv", "qrels/own.tsv", "qrels/pooled.tsv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert a["queries"] == 64
    queries = {q["_id"]: q for q in map(json.loads, (tmp_path / "a" / "queries.jsonl").read_text().splitlines())}
    labels = [json.loads(x) for x in (tmp_path / "a" / "labels.jsonl").read_text().splitlines()]
    relevant = {tuple(x.split("\t")[:2]) for x in (tmp_path / "a" / "qrels" / "test.tsv").read_text().splitlines()[1:]}
    by_query = {}
    for r in labels:
        by_query.setdefault(r["query_id"], []).append(r)
    for qid, rows in by_query.items():
        ast = parse(queries[qid]["logical_query"])
        terms = set(queries[qid]["terms"])
        pos = [set(r["present"]) & terms for r in rows if (qid, r["doc_id"]) in relevant]
        neg = [set(r["present"]) & terms for r in rows if (qid, r["doc_id"]) not in relevant]
        assert 1 <= len(pos) <= 3 and len(neg) <= 3
        assert all(holds(ast, p) for p in pos) and not any(holds(ast, n) for n in neg)
        # each negative is a positive with exactly one term moved to the other side
        assert all(any(len(n ^ p) == 1 for p in pos) for n in neg)
        assert queries[qid]["negations"] == ast.negations()
    # a document's labels name every topic whose sentence it holds, the unrelated sentence of
    # an empty set's document included (it may be another query's term: pooled.tsv reads it)
    sentence = dict(scifact_topics(Path(scifact().corpus), 55))
    corpus = {d["_id"]: d["text"] for d in map(json.loads, (tmp_path / "a" / "corpus.jsonl").read_text().splitlines())}
    for r in labels:
        assert sorted(" ".join(sentence[t] for t in r["present"]).split()) == sorted(corpus[r["doc_id"]].split()), r
    words = [len(json.loads(x)["text"].split()) for x in (tmp_path / "a" / "corpus.jsonl").read_text().splitlines()]
    assert max(words) <= 3 * 55
    # own.tsv lists each query's own documents; pooled.tsv judges every document against every
    # query: relevant exactly when the query holds for the query's topics the document contains
    own = {tuple(x.split("\t")[:2]) for x in (tmp_path / "a" / "qrels" / "own.tsv").read_text().splitlines()[1:]}
    assert own == {(r["query_id"], r["doc_id"]) for r in labels}
    pooled = {tuple(x.split("\t")[:2]) for x in (tmp_path / "a" / "qrels" / "pooled.tsv").read_text().splitlines()[1:]}
    want = {(qid, r["doc_id"]) for qid, q in queries.items() for r in labels
            if holds(parse(q["logical_query"]), set(q["terms"]) & set(r["present"]))}
    assert pooled == want and relevant < pooled and a["pooled_positives"] == len(pooled)
    assert any(qid != doc.rsplit("-", 1)[0] for qid, doc in pooled)  # other queries' documents count too


def test_every_template_is_satisfiable_by_some_topic_set():
    for t in TEMPLATES:
        ast = parse(t.logical(("a", "b", "c")))
        sets = [set(s) for r in range(4) for s in itertools.combinations("abc", r)]
        assert any(holds(ast, s) for s in sets)


def test_a_memo_encoder_encodes_each_distinct_text_once_and_returns_its_first_vector():
    from logicrank.pipelines.engines.embed import MemoEncoder

    class Counting:
        dim, model_id = 2, "counting"

        def __init__(self):
            self.seen = []

        def encode(self, texts):
            self.seen.append(list(texts))
            return np.array([[len(t), float(len(self.seen))] for t in texts], dtype=np.float32).reshape(-1, 2)

    inner = Counting()
    memo = MemoEncoder(inner, max_texts=3)
    first = memo.encode(["a", "bb", "a"])
    assert inner.seen == [["a", "bb"]] and first.tolist() == [[1, 1], [2, 1], [1, 1]]
    again = memo.encode(["bb", "ccc", "bb"])
    assert inner.seen[-1] == ["ccc"] and again.tolist() == [[2, 1], [3, 2], [2, 1]]  # bb: its first vector
    assert (memo.misses, memo.hits, memo.model_id, memo.encode([]).shape) == (3, 1, "counting", (0, 2))  # distinct texts: bb reused once
    memo.encode(["a"])  # used again: "bb" is now the least recently used
    memo.encode(["dddd"])  # a fourth text: "bb" goes
    assert inner.seen[-1] == ["dddd"]
    memo.encode(["a", "bb"])
    assert inner.seen[-1] == ["bb"]


def test_listed_mode_scores_only_each_querys_listed_documents(setup, tmp_path):
    """ITLR ``mode: listed`` in process: the exact scores of the listed pairs, ranked; a listed
    document the table lacks and a query with no pair are counted, not guessed."""
    from logicrank.pipelines.retrieval.pipeline import Pipeline
    from logicrank.pipelines.retrieval.runner import Inputs
    from logicrank.pipelines.retrieval.stages import Context

    docs, ids, terms, T, _ = setup
    vectors = dict(zip(ids, docs, strict=True))

    class Store:
        def vectors_for(self, doc_ids):
            return {d: vectors[d] for d in doc_ids if d in vectors}

    class Encoder:
        config, model_id = None, "fixed"

        def encode(self, texts):
            return np.stack([T[terms.index(t)] for t in texts])

    pairs = tmp_path / "own.tsv"
    pairs.write_text("query-id\tcorpus-id\tscore\nq1\td5\t0\nq1\td9\t1\nq1\tgone\t1\nq2\td1\t1\nq2\td2\t0\nq2\td3\t1\n")
    queries = _queries([("q1", "x", '"a" AND NOT "b"'), ("q2", "x", '("a" OR "c") AND "d"'), ("q3", "x", '"a"')])
    pipeline = Pipeline.parse("l", [{"itlr": {"k": 2, "mode": "listed", "pairs": str(pairs)}}])
    result = pipeline.run(Context(store=Store(), encoder=lambda: Encoder()), queries, inputs=Inputs("b", encoder="e", files={str(pairs): {"sha256": "p"}}))
    run = result.run.to_pandas()
    for qid, listed in (("q1", ["d5", "d9"]), ("q2", ["d1", "d2", "d3"])):
        want = compose([q for q in parse_queries(queries) if q.query_id == qid], terms, np.stack([vectors[d] for d in listed]) @ T.T,
                       Operators(), Calibration())[0]
        top = [listed[i] for i in np.argsort(-want, kind="stable")[:2]]
        got = run[run["query_id"] == qid].sort_values("rank")
        assert got["doc_id"].tolist() == top and got["score"].to_numpy() == pytest.approx(np.sort(want)[::-1][:2], rel=1e-6)
    assert "q3" not in set(run["query_id"])
    counts = result.steps[0]
    assert (counts["listed_pairs_not_in_table"], counts["queries_without_pairs"]) == (1, 1)
    with pytest.raises(ValueError, match="mode 'listed' reads its candidates from pairs"):
        Pipeline.parse("l", [{"itlr": {"mode": "listed"}}])


def test_a_hybrid_weight_without_the_hybrid_scorer_is_refused_not_ignored():
    """`--set itlr.hybrid_weight=0.7` on the dense preset ran plain dense evidence under the
    ITLR name, the weight read by the hybrid scorer alone: refused, as other options a stage
    would not use are; a config dumped with every default (a manifest's) still reads."""
    from logicrank.pipelines.retrieval.pipeline import Pipeline

    with pytest.raises(ValueError, match="hybrid_weight is the hybrid scorer's share of BM25 evidence; with scorer dense it is not used"):
        Pipeline.parse("i", [{"itlr": {"hybrid_weight": 0.7}}])
    assert Pipeline.parse("i", [{"itlr": {"scorer": "hybrid", "hybrid_weight": 0.7}}]).stages[0].hybrid_weight == 0.7
    dumped = Pipeline.parse("i", [{"itlr": {}}]).stages[0].model_dump()
    assert Pipeline.parse("i", [{"itlr": dumped}]).stages[0].scorer == "dense"


@pytest.mark.parametrize("shards", [2, 3, 7])
def test_exact_scoring_in_shards_merges_into_the_one_pass_pairs(setup, shards):
    """Each shard scores its rows (``first_row``: the table's row numbers) and keeps its top k;
    merge_exact gives one pass's pairs, in one pass's layout (queries in order, each by score
    then row), ties at the cut included (duplicated documents)."""
    from logicrank.pipelines.retrieval.methods.itlr import merge_exact

    docs, ids, terms, T, qs = setup
    qs = qs[:3]  # the parsed logical queries (over terms a-d)
    docs = np.vstack([docs, docs[:40]])  # exact ties: each of the first 40 documents twice
    ids = np.concatenate([ids, np.array([f"{d}-twin" for d in ids[:40]], dtype=object)])
    ops = Operators()
    whole = score_exact(qs, terms, T, [(ids, docs)], 10, [ops], Calibration())[ops].reset_index(drop=True)
    bounds = np.linspace(0, len(docs), shards + 1).astype(int)
    parts = [score_exact(qs, terms, T, [(ids[lo:hi], docs[lo:hi])], 10, [ops], Calibration(), first_row=int(lo), with_rows=True)[ops]
             for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    merged = merge_exact(parts, 10, [q.query_id for q in qs])
    assert merged[["query_id", "doc_id"]].equals(whole[["query_id", "doc_id"]])
    np.testing.assert_allclose(merged["score"], whole["score"], rtol=1e-6, atol=1e-7)


def test_exact_scoring_in_shards_with_a_strict_not_that_leaves_a_shard_short_of_k():
    """A strict NOT that excludes all but two documents leaves most shards fewer than k pairs;
    their empty slots are no pairs (they once mapped row 0 outside the shard: an IndexError),
    and the shards merge into the one pass's pairs."""
    from logicrank.pipelines.retrieval.methods.itlr import merge_exact

    qs = [LogicalQuery("q1", parse('"a" AND NOT "b"'), "ok"), LogicalQuery("q2", parse('"a"'), "ok")]
    raw = np.random.default_rng(1).random((300, 2)).astype(np.float32)
    raw[:, 1] = 0.9  # every document holds b, so q1 excludes it
    raw[[5, 250], 1] = 0.1  # but two
    ids = np.array([f"d{i:05d}" for i in range(300)], dtype=object)
    ops = dataclasses.replace(Operators(), strict_not=0.5)
    whole = score_exact(qs, ["a", "b"], None, [(ids, raw)], 10, [ops], Calibration())[ops].reset_index(drop=True)
    blocks = lambda lo: [(ids[b:min(b + 40, lo + 100)], raw[b:min(b + 40, lo + 100)]) for b in range(lo, lo + 100, 40)]  # noqa: E731 - a shard in blocks
    parts = [score_exact(qs, ["a", "b"], None, blocks(lo), 10, [ops], Calibration(), first_row=lo, with_rows=True)[ops] for lo in (0, 100, 200)]
    assert [len(p[p["query_id"] == "q1"]) for p in parts] == [1, 0, 1]
    merged = merge_exact(parts, 10, ["q1", "q2"])
    assert merged[["query_id", "doc_id"]].equals(whole[["query_id", "doc_id"]])
    assert sorted(merged[merged["query_id"] == "q1"]["doc_id"]) == ["d00005", "d00250"]
    np.testing.assert_allclose(merged["score"], whole["score"], rtol=1e-6, atol=1e-7)
