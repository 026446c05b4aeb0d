"""QUEST (Malaviya et al., 2023) as Google publishes it: ``documents.jsonl`` (``title``,
``text``: an entity's page, known by its title) and the examples files (``query``, ``docs``:
the relevant titles, no id), which are queries and qrels at once. Written here in the
publisher's layout (the collection is not bundled): the corpus keyed by title, the examples
read as queries and qrels with one id rule (made from the question's text, as QUEST's
evaluation matches predictions by it), and a run over titles evaluated as QUEST's recall is
computed by hand."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.pipelines.corpus import iter_corpus
from logicrank.pipelines.io import TopicsError, quest_query_id, read_qrels, read_queries
from logicrank.schemas.tables import RUN

DOCUMENTS = [
    {"title": "The Matrix", "text": "The Matrix is a 1999 science fiction action film."},
    {"title": "Amélie", "text": "Amélie is a 2001 French romantic comedy film."},
    {"title": "Ponyo", "text": "Ponyo is a 2008 Japanese animated fantasy film."},
]
EXAMPLES = [
    {"query": "1999 science fiction films or French comedies", "docs": ["The Matrix", "Amélie", "The Matrix"],
     "original_query": "<mark>1999 science fiction films</mark> or <mark>French comedy films</mark>", "scores": None,
     "metadata": {"template": "_ or _", "domain": "films", "fluency": [True], "relevance_ratings": None}},
    {"query": "Japanese animated films", "docs": ["Ponyo"], "original_query": "<mark>Japanese animated films</mark>",
     "scores": None, "metadata": {"template": "_", "domain": "films"}},
]


def _write(path, rows, blank_after: int | None = None):
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    if blank_after is not None:
        lines.insert(blank_after, "")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_quests_documents_are_known_by_their_titles(tmp_path):
    path = _write(tmp_path / "documents.jsonl", [*DOCUMENTS, {"title": "Unnamed", "text": "a page", "url": "https://x"}])
    table = pa.concat_tables(list(iter_corpus(str(path))))
    assert table.column("doc_id").to_pylist() == ["The Matrix", "Amélie", "Ponyo", None]
    assert table.column("title").to_pylist()[:3] == [d["title"] for d in DOCUMENTS]
    assert table.column("text").to_pylist()[:3] == [d["text"] for d in DOCUMENTS]
    # only QUEST's two keys make the title an id: a record with other keys and no id is still refused
    assert table.column("_reason").to_pylist() == [None, None, None, "missing_id"]


def test_quests_examples_are_its_queries_and_qrels_under_one_id(tmp_path):
    path = _write(tmp_path / "test.jsonl", EXAMPLES, blank_after=1)
    q1, q2 = (quest_query_id(e["query"]) for e in EXAMPLES)
    assert q1 == "quest-" + hashlib.sha256(EXAMPLES[0]["query"].encode()).hexdigest()[:16] and q1 != q2
    queries = read_queries(path)
    assert queries.column("query_id").to_pylist() == [q1, q2]
    assert queries.column("text").to_pylist() == [e["query"] for e in EXAMPLES]
    qrels = read_qrels(path)
    assert list(zip(*(qrels.column(c).to_pylist() for c in ("query_id", "doc_id", "relevance")), strict=True)) == [
        (q1, "The Matrix", 1), (q1, "Amélie", 1), (q2, "Ponyo", 1)]  # a title listed twice: one judgement, as QUEST's set
    # the same question has its id in every file: another split's examples share none of this one's
    other = _write(tmp_path / "val.jsonl", [dict(EXAMPLES[1], query="Korean war films"), EXAMPLES[0]])
    assert read_queries(other).column("query_id").to_pylist() == [quest_query_id("Korean war films"), q1]


@pytest.mark.parametrize("docs", [[], None, ["Ponyo", ""], ["Ponyo", 3]])
def test_an_example_without_its_titles_is_refused_naming_the_line(tmp_path, docs):
    bad = dict(EXAMPLES[1], docs=docs)
    path = _write(tmp_path / "test.jsonl", [EXAMPLES[0], bad])
    with pytest.raises(TopicsError, match=r"test.jsonl: line 2"):
        read_qrels(path)


def test_a_run_over_titles_is_evaluated_against_quests_examples(tmp_path):
    """Recall@2 as QUEST's evaluation computes it over the top 2 (|gold ∩ top 2| / |gold|):
    example 1 finds The Matrix of its two titles (0.5), example 2 finds Ponyo (1.0)."""
    examples = _write(tmp_path / "test.jsonl", EXAMPLES)
    q1, q2 = (quest_query_id(e["query"]) for e in EXAMPLES)
    rows = [(q1, "The Matrix", 3.0), (q1, "Ponyo", 2.0), (q1, "Amélie", 1.0), (q2, "Ponyo", 2.0), (q2, "Amélie", 1.0)]
    run = pa.table({"query_id": [r[0] for r in rows], "doc_id": [r[1] for r in rows], "rank": pa.array([1, 2, 3, 1, 2], pa.int32()),
                    "score": [r[2] for r in rows], "method": ["dense"] * 5, "run_id": ["dense"] * 5}, schema=RUN)
    pq.write_table(run, tmp_path / "dense.parquet")
    res = CliRunner().invoke(app, ["evaluate", str(examples), str(tmp_path / "dense.parquet"),
                                   "--measure", "R@2", "--out", str(tmp_path / "ev")])
    assert res.exit_code == 0, res.output
    metrics = pq.read_table(tmp_path / "ev" / "metrics.parquet").to_pylist()
    got = {m["query_id"]: m["value"] for m in metrics if m["measure"] == "R@2"}
    assert got == pytest.approx({q1: 0.5, q2: 1.0, "all": 0.75}, abs=1e-9)


def test_lottes_answer_lists_are_qrels(tmp_path):
    """LoTTE's ``qas.search.jsonl`` (``qid``, ``query``, ``answer_pids``, ``url``): each listed
    passage relevant to its question, ids as its collection.tsv and questions.search.tsv write them."""
    path = _write(tmp_path / "qas.search.jsonl", [{"qid": 0, "query": "how to fix a flat", "answer_pids": [12, 34, 12], "url": "https://x"},
                                                   {"qid": 1, "query": "best tent", "answer_pids": [7]}])
    qrels = read_qrels(path)
    assert list(zip(qrels.column("query_id").to_pylist(), qrels.column("doc_id").to_pylist(), strict=True)) == [("0", "12"), ("0", "34"), ("1", "7")]
    _write(path, [{"qid": 0, "query": "q", "answer_pids": []}])
    with pytest.raises(TopicsError, match=r"line 1: answer_pids is \[\]"):
        read_qrels(path)


def test_an_experiments_dataset_takes_quests_files_and_topics_named_txt(tmp_path):
    """`dataset: {corpus, queries, qrels}` over QUEST's files, and over a qid<TAB>text topics file
    named .txt (read as retrieve reads it): the BEIR queries and qrels written for the run."""
    from logicrank.pipelines.evaluation.experiment import Dataset, prepare_dataset

    docs, examples = _write(tmp_path / "documents.jsonl", DOCUMENTS), _write(tmp_path / "test.jsonl", EXAMPLES)
    _, queries, qrels = prepare_dataset(Dataset(corpus=str(docs), queries=str(examples), qrels=str(examples)), tmp_path / "quest")
    q1, q2 = (quest_query_id(e["query"]) for e in EXAMPLES)
    assert [json.loads(line)["_id"] for line in queries.read_text().splitlines()] == [q1, q2]
    assert qrels.read_text().splitlines()[1:] == [f"{q1}\tThe Matrix\t1", f"{q1}\tAmélie\t1", f"{q2}\tPonyo\t1"]
    topics = tmp_path / "topics.quest.txt"
    topics.write_text(f"{q1}\t1999 science fiction films or French comedies\n{q2}\tJapanese animated films\n")
    _, queries, _ = prepare_dataset(Dataset(corpus=str(docs), queries=str(topics), qrels=str(examples)), tmp_path / "txt")
    assert [json.loads(line)["text"] for line in queries.read_text().splitlines()] == [e["query"] for e in EXAMPLES]
