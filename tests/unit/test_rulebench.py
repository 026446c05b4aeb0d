"""RuleBench ULogic's conversion to the BEIR layout, on a small rule set written here."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipelines.datasets.rulebench import RuleBenchError, to_beir
from pipelines.topics import read_qrels, read_queries

RULES = {
    "0": {"NL": "If Person X owns Animal Y, then Person X can feed Animal Y.", "FOL": "Own(Person X, Animal Y) => CanFeed(Person X, Animal Y)"},
    "1": {"NL": "If Person X works with Electronic Device Y, then Person X needs to use Electronic Device Y.", "FOL": "F"},
    "2": {"NL": "If City X is in Country Y, then Country Y contains City X.", "FOL": "G"},
}
QUERIES = [
    {"input": "Context:\nAlice owns a cat named Tom.\nQuestion:\nCan Alice feed Tom?", "rule": ["0"], "depth": 0},
    {"input": "Context:\nBob works with his laptop.\nQuestion:\nDoes Bob need to use his laptop?", "rule": ["1", "1"]},
]


def _write(root, rules=RULES, queries=QUERIES):
    root.mkdir(parents=True, exist_ok=True)
    (root / "rules.json").write_text(json.dumps(rules))
    (root / "test_data.json").write_text(json.dumps(queries))
    return root


def test_rules_become_the_corpus_and_gold_ids_the_qrels(tmp_path):
    counts = to_beir(_write(tmp_path / "src"), tmp_path / "beir")
    assert counts == {"rules": 3, "queries": 2, "qrels": 2}  # a repeated gold id counts once
    corpus = [json.loads(line) for line in (tmp_path / "beir" / "corpus.jsonl").read_text().splitlines()]
    assert [d["_id"] for d in corpus] == ["0", "1", "2"] and corpus[0]["text"] == RULES["0"]["NL"] and corpus[0]["metadata"]["fol"].startswith("Own(")
    queries = read_queries(tmp_path / "beir" / "queries.jsonl")
    assert queries.column("query_id").to_pylist() == ["ulogic-0", "ulogic-1"]
    assert queries.column("text").to_pylist()[0] == "Alice owns a cat named Tom.\nCan Alice feed Tom?"  # labels gone
    qrels = read_qrels(tmp_path / "beir" / "qrels" / "test.tsv").to_pylist()
    assert {(r["query_id"], r["doc_id"], r["relevance"]) for r in qrels} == {("ulogic-0", "0", 1), ("ulogic-1", "1", 1)}


@pytest.mark.parametrize(
    ("rules", "queries", "message"),
    [
        (RULES, [{"input": "q", "rule": ["9"]}], r"query 0's gold rule\(s\) \['9'\] are not in rules.json"),
        (RULES, [{"input": " ", "rule": ["0"]}], "query 0 needs a non-empty 'input'"),
        (RULES, [{"input": "Context:\nQuestion:\n", "rule": ["0"]}], "query 0 needs a non-empty 'input'"),
        ({"0": {"NL": ""}}, QUERIES, "without an NL text"),
        ([], QUERIES, "must map rule ids to rules"),
    ],
)
def test_a_malformed_set_is_refused_and_nothing_is_written(tmp_path, rules, queries, message):
    with pytest.raises(RuleBenchError, match=message):
        to_beir(_write(tmp_path / "src", rules, queries), tmp_path / "beir")
    assert not (tmp_path / "beir" / "corpus.jsonl").exists()


def test_the_command_line_says_what_is_missing(tmp_path):
    res = CliRunner().invoke(app, ["prepare-rulebench", str(tmp_path), "--out", str(tmp_path / "beir")])
    assert res.exit_code == 2 and "lacks" in res.output and "rules.json" in res.output
    res = CliRunner().invoke(app, ["prepare-rulebench", str(_write(tmp_path / "src")), "--out", str(tmp_path / "beir")])
    assert res.exit_code == 0 and "3 rules, 2 queries, 2 qrels" in res.output
