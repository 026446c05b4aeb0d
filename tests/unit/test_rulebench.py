"""RuleBench sets' conversion to the BEIR layout, on small sets written here in each layout the
upstream repository (llm-rule-following's dataset/) uses."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.pipelines.datasets.rulebench import RuleBenchError, to_beir
from logicrank.pipelines.evaluation.experiment import ExperimentError
from logicrank.pipelines.io import read_qrels, read_queries

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
    counts = to_beir(_write(tmp_path / "ulogic"), tmp_path / "beir")  # query ids: the directory's name
    assert _counts(counts) == (3, 2, 2, 0)  # a repeated gold id counts once; no outputs: no answers
    assert counts["no_answers"] == "record 0's output is missing" and counts["rules_file"].endswith("rules.json")
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
        (RULES, [{"input": "q", "rule": ["9"]}], r"1 record\(s\) of .*test_data.json name gold rules that are not in .*rules.json: record 0: \['9'\]"),
        (RULES, [*QUERIES, {"input": "q", "rule": [7, "0"]}, {"input": "q", "rule": "8"}], r"2 record\(s\) .*record 2: \['7'\]; record 3: \['8'\]"),
        (RULES, [{"input": " ", "rule": ["0"]}], "record 0 needs a non-empty 'input'"),
        (RULES, [{"input": "Context:\nQuestion:\n", "rule": ["0"]}], "record 0 needs a non-empty 'input'"),
        (RULES, [{"input": "q", "rule": [True]}], "record 0 needs .* a non-empty 'rule'"),
        (RULES, [], "a non-empty JSON list"),
        ({"0": {"NL": ""}}, QUERIES, "without an NL text"),
        ([], QUERIES, "maps rule ids to rules .*got list \\(empty\\)"),
    ],
)
def test_a_malformed_set_is_refused_and_nothing_is_written(tmp_path, rules, queries, message):
    with pytest.raises(RuleBenchError, match=message):
        to_beir(_write(tmp_path / "src", rules, queries), tmp_path / "beir")
    assert not (tmp_path / "beir" / "corpus.jsonl").exists()


def test_the_command_line_says_what_is_missing(tmp_path):
    res = CliRunner().invoke(app, ["prepare-rulebench", str(tmp_path), "--out", str(tmp_path / "beir")])
    assert res.exit_code == 2 and "lacks a rule base" in res.output and "rules.json" in res.output
    res = CliRunner().invoke(app, ["prepare-rulebench", str(_write(tmp_path / "src")), "--out", str(tmp_path / "beir")])
    assert res.exit_code == 0 and "2 qrels, no gold outputs (record 0's output is missing)" in res.output
    assert "3 rules (" in res.output and "rules.json), 2 queries (" in res.output


def _counts(counts: dict) -> tuple[int, int, int, int]:
    return counts["rules"], counts["queries"], counts["qrels"], counts["answers"]


def _records(beir):
    corpus = [json.loads(line) for line in (beir / "corpus.jsonl").read_text().splitlines()]
    qrels = {(r["query_id"], r["doc_id"]) for r in read_qrels(beir / "qrels" / "test.tsv").to_pylist()}
    return corpus, read_queries(beir / "queries.jsonl").column("query_id").to_pylist(), qrels


def test_deer_layout_test_rule_json_and_integer_rule_ids(tmp_path):
    """deer: test_rule.json, integer gold ids in test_data.json, outputs are option letters."""
    src = tmp_path / "deer"
    src.mkdir()
    (src / "test_rule.json").write_text(json.dumps({"0": {"NL": "If an animal lives in a cold area, then it has thick fur.", "FOL": "A"},
                                                    "1": {"NL": "If an animal has fins, then it is aquatic.", "FOL": "B"}}))
    (src / "test_data.json").write_text(json.dumps([
        {"instruction": "", "input": "Which animal has thick fur?\nA. Kangaroo\nB. Polar bear", "output": "b", "rule": [0]},
        {"instruction": "", "input": "Which animal is aquatic?\nA. Shark\nB. Eagle", "output": "a", "rule": [1]},
    ]))
    counts = to_beir(src, tmp_path / "beir")
    assert _counts(counts) == (2, 2, 2, 2) and counts["rules_file"].endswith("test_rule.json")
    corpus, qids, qrels = _records(tmp_path / "beir")
    assert [d["_id"] for d in corpus] == ["0", "1"] and qids == ["deer-0", "deer-1"]
    assert qrels == {("deer-0", "0"), ("deer-1", "1")}
    answers = [json.loads(line) for line in (tmp_path / "beir" / "answers.jsonl").read_text().splitlines()]
    assert [(a["query_id"], a["answers"]) for a in answers] == [("deer-0", ["b"]), ("deer-1", ["a"])]
    assert answers[0]["question"].startswith("Which animal has thick fur?\nA. Kangaroo")
    assert answers[0]["instruction"] == "Answer with the letter of the correct option."  # deer gives none; its outputs are letters
    (src / "test_data.json").write_text(json.dumps([{"input": "q", "output": "", "rule": [0]}, {"input": "q", "output": ["b"], "rule": 1}]))
    assert to_beir(src, tmp_path / "beir")["no_answers"] == "record 0's output is empty" and not (tmp_path / "beir" / "answers.jsonl").exists()


def test_theoremqa_layout_string_ids_and_a_single_gold_id(tmp_path):
    """theoremQA: test_rule.json, gold ids as strings; a bare id (not a list) is read as one gold rule."""
    src = tmp_path / "theoremQA"
    src.mkdir()
    (src / "test_rule.json").write_text(json.dumps({"153": {"NL": "If a dividend grows at rate g, then ...", "FOL": ""},
                                                    "227": "If 0 < x < 1, then (1 - x)^n >= 1/(1 + nx)."}))  # a rule as its text alone
    (src / "test_data.json").write_text(json.dumps([{"input": "What is the fair value?", "output": "d", "rule": ["153"]},
                                                    {"input": "Is (1 - x)^n >= 1/(1+nx)?", "output": "a", "rule": "227"}]))
    counts = to_beir(src, tmp_path / "beir")
    corpus, qids, qrels = _records(tmp_path / "beir")
    assert counts["qrels"] == 2 and qids == ["theoremqa-0", "theoremqa-1"] and qrels == {("theoremqa-0", "153"), ("theoremqa-1", "227")}
    assert corpus[1]["text"].startswith("If 0 < x < 1") and corpus[1]["metadata"]["fol"] is None


def test_a_split_other_than_test_and_explicit_files(tmp_path):
    """clutrr ships validation_data.json only: --split validation finds it (and validation_rule.json
    over rules.json); explicit --rules/--queries read any names, a rule base as a list (ids: positions)."""
    src = _write(tmp_path / "clutrr")
    (src / "test_data.json").unlink()
    with pytest.raises(RuleBenchError, match=r"lacks a query file \(test_data.json; found: rules.json\)"):
        to_beir(src, tmp_path / "beir")
    (src / "validation_rule.json").write_text(json.dumps({"5": "If A is B's son, then B is A's parent."}))
    (src / "validation_data.json").write_text(json.dumps([{"input": "Tom is Ann's son. Who is Ann?", "rule": 5, "output": "parent"}]))
    assert _counts(to_beir(src, tmp_path / "v", split="validation")) == (1, 1, 1, 1)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "base.json").write_text(json.dumps([{"NL": "If X, then Y."}, {"NL": "If Y, then Z."}]))
    (other / "qs.json").write_text(json.dumps([{"input": "Y holds. Does Z?", "rule": [1]}]))
    res = CliRunner().invoke(app, ["prepare-rulebench", "--rules", str(other / "base.json"), "--queries", str(other / "qs.json"),
                                   "--name", "mine", "--out", str(tmp_path / "e")])
    assert res.exit_code == 0, res.output
    corpus, qids, qrels = _records(tmp_path / "e")
    assert [d["_id"] for d in corpus] == ["0", "1"] and qids == ["mine-0"] and qrels == {("mine-0", "1")}
    res = CliRunner().invoke(app, ["prepare-rulebench", "--rules", str(other / "base.json")])
    assert res.exit_code == 2 and "both --rules and --queries" in res.output


def test_bench_rules_reads_a_raw_set_or_a_prepared_one(tmp_path):
    """bench-rules' experiment: a raw set converts in the run (with its options); a directory
    prepare-rulebench wrote is read as it is; ULogic's reference figures stay only on ULogic."""
    from logicrank.pipelines.evaluation import benchmarks

    src = _write(tmp_path / "deer")
    exp = benchmarks.rules(src, split="validation", queries=src / "test_data.json", vanilla=True)
    assert exp.name == "rulebench-vanilla" and exp.dataset.rulebench.split == "validation"
    assert exp.dataset.rulebench.queries == str(src / "test_data.json") and exp.references == ()
    assert exp.title == "RuleBench deer: vanilla sparse and dense rule retrieval" and not any("68.91" in c for c in exp.caveats)
    to_beir(src, tmp_path / "prepared")
    exp = benchmarks.rules(tmp_path / "prepared")
    assert exp.name == "rulebench-siar" and exp.dataset.beir == str(tmp_path / "prepared") and exp.dataset.rulebench is None
    assert exp.title.startswith("RuleBench deer:") and exp.references == ()  # the name read from the prepared query ids
    with pytest.raises(ExperimentError, match="prepared set .* drop --split"):
        benchmarks.rules(tmp_path / "prepared", split="train")
    ulogic = benchmarks.reasoning(_write(tmp_path / "ulogic"))
    assert ulogic.title.startswith("RuleBench ULogic:") and benchmarks.reasoning(src).title.startswith("RuleBench deer:")


def test_law_layout_test_rules_beside_train_data_and_theoremqa_its_one_rule_base(tmp_path):
    """law ships test_rule.json beside train_data.json (--split train); theoremQA train_rule.json
    beside test_data.json: the one rule base a directory holds is read; with several and none
    of the split's, the set is refused with what it holds."""
    law = tmp_path / "law"
    law.mkdir()
    (law / "test_rule.json").write_text(json.dumps({"0": {"NL": "If one steals, then one is punished."}}))
    (law / "train_data.json").write_text(json.dumps([{"input": "Tom stole a car. Is Tom punished?", "rule": [0], "output": "yes"}]))
    counts = to_beir(law, tmp_path / "law-beir", split="train")
    assert _counts(counts) == (1, 1, 1, 1) and counts["rules_file"].endswith("test_rule.json") and counts["queries_file"].endswith("train_data.json")
    tq = tmp_path / "theoremQA"
    tq.mkdir()
    (tq / "train_rule.json").write_text(json.dumps({"7": "If a triangle is right, then a^2 + b^2 = c^2."}))
    (tq / "test_data.json").write_text(json.dumps([{"input": "Legs 3 and 4: hypotenuse?", "rule": ["7"], "output": "c"}]))
    counts = to_beir(tq, tmp_path / "tq-beir")
    assert counts["rules_file"].endswith("train_rule.json") and _records(tmp_path / "tq-beir")[2] == {("theoremqa-0", "7")}
    (tq / "validation_rule.json").write_text("{}")
    with pytest.raises(RuleBenchError, match=r"lacks a rule base .*found: test_data.json, train_rule.json, validation_rule.json"):
        to_beir(tq, tmp_path / "tq2")


def test_files_starting_with_a_byte_order_mark_read_as_without_it(tmp_path):
    """A rule base and a query file saved with a UTF-8 BOM (as Windows tools write them), and a
    prepared set whose queries.jsonl starts with one: the same ids and names as without it."""
    from logicrank.pipelines.datasets.rulebench import prepared_name

    bom = b"\xef\xbb\xbf"
    plain, marked = _write(tmp_path / "plain" / "deer"), _write(tmp_path / "marked" / "deer")
    for name in ("rules.json", "test_data.json"):
        (marked / name).write_bytes(bom + (marked / name).read_bytes())
    want, got = to_beir(plain, tmp_path / "want"), to_beir(marked, tmp_path / "got")
    assert _counts(got) == _counts(want) == (3, 2, 2, 0)
    assert _records(tmp_path / "got") == _records(tmp_path / "want")
    assert read_queries(tmp_path / "got").column("query_id").to_pylist() == ["deer-0", "deer-1"]
    queries = tmp_path / "got" / "queries.jsonl"
    queries.write_bytes(bom + queries.read_bytes())
    assert prepared_name(tmp_path / "got") == "deer"
