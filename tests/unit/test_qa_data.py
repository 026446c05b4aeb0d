"""The bundled MuSiQue and HotpotQA sets in the BEIR layout: counts, gold paragraphs in the
corpus, decompositions pointing at qrels documents, and loud failures on a broken file."""

import gzip
import json

import pytest

from pipelines.datasets import qa
from pipelines.topics import read_qrels, read_queries


def _lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_musique_keeps_every_question_and_gold_paragraph(tmp_path):
    assert qa.to_beir("musique", tmp_path) == {"docs": 1890, "queries": 100, "qrels": 237}  # 68 x 2 + 27 x 3 + 5 x 4 hops
    docs = {d["_id"] for d in _lines(tmp_path / "corpus.jsonl")}
    qrels = read_qrels(tmp_path)
    assert set(qrels.column("doc_id").to_pylist()) <= docs
    answers = _lines(tmp_path / "answers.jsonl")
    assert [a["query_id"] for a in answers] == read_queries(tmp_path).column("query_id").to_pylist()
    pairs = set(zip(qrels.column("query_id").to_pylist(), qrels.column("doc_id").to_pylist(), strict=True))
    first = answers[0]
    assert first["answers"] == ["G. Stanley Hall", "Stanley Hall"] and first["question"].startswith("Who was the first president")
    assert first["decomposition"][1]["question"] == "Who was the first president of #1 ?"
    for a in answers:  # every step's supporting paragraph is a gold paragraph of its question
        assert all((a["query_id"], s["doc_id"]) in pairs for s in a["decomposition"])
        assert a["type"] == f"{len(a['decomposition'])}hop"


def test_hotpotqa_corpus_is_the_union_of_context_paragraphs(tmp_path):
    counts = qa.to_beir("hotpotqa", tmp_path)
    assert counts["queries"] == 100 and counts["qrels"] == 200  # two gold paragraphs each
    docs = _lines(tmp_path / "corpus.jsonl")
    assert len({(d["title"], d["text"]) for d in docs}) == len(docs) == counts["docs"]
    first = _lines(tmp_path / "answers.jsonl")[0]
    assert first == {"query_id": "hotpotqa-0", "question": "Were Scott Derrickson and Ed Wood of the same nationality?", "answers": ["yes"], "type": "comparison"}
    qrels = read_qrels(tmp_path)
    gold_ids = {d for q, d in zip(qrels.column("query_id").to_pylist(), qrels.column("doc_id").to_pylist(), strict=True) if q == "hotpotqa-0"}
    assert {d["title"] for d in docs if d["_id"] in gold_ids} == {"Scott Derrickson", "Ed Wood"}  # its supporting_facts titles


def test_a_gold_paragraph_missing_from_the_corpus_fails_the_conversion(tmp_path):
    questions = json.loads(gzip.decompress(qa._BUNDLED["musique"][0].read_bytes()))[:2]
    corpus = json.loads(gzip.decompress(qa._BUNDLED["musique"][1].read_bytes()))
    gold = next(p for p in questions[0]["paragraphs"] if p["is_supporting"])
    (tmp_path / "q.json").write_text(json.dumps(questions))
    (tmp_path / "c.json").write_text(json.dumps([p for p in corpus if p["text"] != gold["paragraph_text"]]))
    with pytest.raises(qa.QADataError, match=f"gold paragraph {gold['title']!r} is not in the corpus"):
        qa.to_beir("musique", tmp_path / "out", tmp_path / "q.json", tmp_path / "c.json")
    assert not (tmp_path / "out").exists()  # nothing half-written
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(qa.QADataError, match="not a readable JSON file"):
        qa.to_beir("hotpotqa", tmp_path / "out", tmp_path / "bad.json")
    with pytest.raises(qa.QADataError, match="unknown QA set"):
        qa.to_beir("2wiki", tmp_path / "out")


def test_hotpotqa_reads_the_official_layout_too(tmp_path):
    """context as [[title, [sentences]], ...] and supporting_facts as [[title, sent_id], ...]."""
    bundled = json.loads(gzip.decompress(qa._BUNDLED["hotpotqa"][0].read_bytes()))[:5]
    official = [dict(q, context=[[t, s] for t, s in zip(q["context"]["title"], q["context"]["sentences"], strict=True)],
                     supporting_facts=[[t, i] for t, i in zip(q["supporting_facts"]["title"], q["supporting_facts"]["sent_id"], strict=True)])
                for q in bundled]
    (tmp_path / "hf.json").write_text(json.dumps(bundled))
    (tmp_path / "official.json").write_text(json.dumps(official))
    assert qa.hotpotqa(tmp_path / "hf.json") == qa.hotpotqa(tmp_path / "official.json")
    (tmp_path / "broken.json").write_text(json.dumps([{"question": "q", "answer": "a", "context": 3, "supporting_facts": []}]))
    with pytest.raises(qa.QADataError, match="question 0 is not in HotpotQA's shape"):
        qa.hotpotqa(tmp_path / "broken.json")
