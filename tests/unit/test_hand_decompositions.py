"""Hand-written decompositions (pipelines/llm/decompose.py ``read_decompositions``): JSON Lines
read as the LLM's output is, for orlog, itlr and reasoning; the queries they give; refusals
naming the line."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.llm.decompose import DecompositionsError, apply_to_queries, read_decompositions
from logicrank.pipelines.retrieval.pipeline import Pipeline
from logicrank.pipelines.retrieval.runner import Inputs
from logicrank.pipelines.retrieval.stages import Context
from logicrank.schemas.tables import DECOMPOSITIONS


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


QUERIES = pa.table({"query_id": ["q1", "q2"], "text": ["museums in Paris but not art museums", "malaria, not in children"]})


def test_orlog_atoms_as_a_mapping_or_a_list_and_a_form_quoted_or_bare(tmp_path):
    path = _jsonl(tmp_path / "gold.jsonl", [
        {"query_id": "q1", "logical_query": "a1 AND NOT a2", "atoms": {"a1": "{x} is a museum in Paris", "a2": "{x} is an art museum"}},
        {"query_id": "q2", "logical_query": '"a1" AND NOT "a2"',
         "atoms": [{"id": "a1", "text": "{x} is about malaria"}, {"id": "a2", "text": "{x} is about children"}]},
    ])
    table = read_decompositions(str(path), "orlog")
    assert table.schema == DECOMPOSITIONS and table.column("status").to_pylist() == ["ok", "ok"]
    out = apply_to_queries(QUERIES, table, "orlog")
    assert out.column("logical_query").to_pylist() == ['"a1" AND NOT "a2"', '"a1" AND NOT "a2"']
    assert out.column("atoms").to_pylist()[1] == [{"id": "a1", "text": "{x} is about malaria"}, {"id": "a2", "text": "{x} is about children"}]
    assert out.column("decomposition_status").to_pylist() == ["ok", "ok"]


def test_itlr_and_reasoning_read_their_one_field(tmp_path):
    itlr = read_decompositions(str(_jsonl(tmp_path / "i.jsonl", [{"query_id": "q1", "logical_query": '"museum" AND NOT "art"'},
                                                                  {"query_id": "q2", "logical_query": '"malaria" AND NOT "children"'}])), "itlr")
    assert apply_to_queries(QUERIES, itlr, "itlr").column("logical_query").to_pylist() == ['"museum" AND NOT "art"', '"malaria" AND NOT "children"']
    why = read_decompositions(str(_jsonl(tmp_path / "r.jsonl", [{"query_id": 1, "expansion": "An answer names a museum."}])), "reasoning")
    assert why.column("query_id").to_pylist() == ["1"] and why.column("expansion").to_pylist() == ["An answer names a museum."]


@pytest.mark.parametrize(("records", "method", "message"), [
    ([{"query_id": "q1", "logical_query": "a1 AND a3", "atoms": {"a1": "{x} is red"}}], "orlog", r"line 1 \(query q1\): .*undefined atoms \['a3'\]"),
    ([{"query_id": "q1", "logical_query": "a1", "atoms": {"a1": "it is red"}}], "orlog", r"line 1 \(query q1\): .*every atom the form uses must mention \{x\}"),
    ([{"query_id": "q1", "logical_query": "a1", "atoms": ["{x} is red"]}], "orlog", r"line 1 \(query q1\): atoms: a list of"),
    ([{"query_id": "q1", "logical_query": "malaria AND"}], "itlr", r"line 1 \(query q1\): "),
    ([{"query_id": "q1"}], "itlr", r"line 1 \(query q1\): logical_query: a non-empty string is required, got null"),
    ([{"query_id": "q1", "expansion": "x"}, {"query_id": "q1", "expansion": "y"}], "reasoning", r"line 2: query_id must be a string given once"),
    ([{"logical_query": '"a"'}], "itlr", r"line 1: query_id must be a string given once, got null"),
])
def test_a_bad_record_is_refused_in_one_line_naming_its_line(tmp_path, records, method, message):
    with pytest.raises(DecompositionsError, match=message) as info:
        read_decompositions(str(_jsonl(tmp_path / "bad.jsonl", records)), method)
    assert "\n" not in str(info.value)


def test_a_decomposition_stage_reads_hand_written_atoms_and_keeps_a_parquet_table_working(tmp_path):
    path = _jsonl(tmp_path / "gold.jsonl", [{"query_id": q, "logical_query": "a1 AND NOT a2", "atoms": {"a1": "{x} is A", "a2": "{x} is B"}}
                                            for q in ("q1", "q2")])
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    files = {str(path): {"sha256": "x"}, str(tmp_path / "qrels.tsv"): {"sha256": "y"}}
    got = Pipeline.parse("d", [{"decomposition": {"target": "orlog", "decompositions": str(path)}},
                               {"qrels": {"path": str(tmp_path / "qrels.tsv")}}]).run(Context(store=None), QUERIES,
                                                                                     inputs=Inputs("t", encoder="e", files=files))
    assert got.steps[0]["by_status"] == {"ok": 2} and got.run.num_rows == 2
    pq.write_table(read_decompositions(str(path), "orlog"), tmp_path / "gold.parquet")  # the table `logicrank decompose` writes
    assert read_decompositions(str(tmp_path / "gold.parquet"), "orlog").equals(read_decompositions(str(path), "orlog"))


def test_a_decomposition_stage_names_its_unusable_outputs_on_the_terminal(tmp_path):
    """The LLM's degenerate or unparsed forms (the question used instead) are named, as blank
    queries are, and counted by status in the manifest."""
    rows = [{"query_id": "q1", "method": "itlr", "model": "m", "prompt_sha": "p", "raw_output": '"x" AND NOT "x"',
             "logical_query": '"museums in Paris but not art museums"', "status": "degenerate",
             "error": 'degenerate: "x" AND NOT "x" can match no document', "prompt_tokens": 1, "generated_tokens": 1, "cached": False},
            {"query_id": "q2", "method": "itlr", "model": "m", "prompt_sha": "p", "raw_output": '"malaria" AND NOT "children"',
             "logical_query": '"malaria" AND NOT "children"', "status": "ok", "prompt_tokens": 1, "generated_tokens": 1, "cached": False}]
    # `logicrank decompose` writes every kind, maybe for more queries: neither is this stage's to count
    rows += [dict(rows[0], method="orlog", status="fallback", error="not JSON"), dict(rows[0], query_id="q3", status="fallback", error="x")]
    pq.write_table(pa.Table.from_pylist(rows, schema=DECOMPOSITIONS), tmp_path / "d.parquet")
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    files = {str(tmp_path / "d.parquet"): {"sha256": "x"}, str(tmp_path / "qrels.tsv"): {"sha256": "y"}}
    said = []
    got = Pipeline.parse("d", [{"decomposition": {"target": "itlr", "decompositions": str(tmp_path / "d.parquet")}},
                               {"qrels": {"path": str(tmp_path / "qrels.tsv")}}]).run(Context(store=None, echo=said.append), QUERIES,
                                                                                     inputs=Inputs("t", encoder="e", files=files))
    assert got.steps[0]["by_status"] == {"degenerate": 1, "ok": 1}
    assert said == ['decomposition: 1 of 2 outputs unusable (unparsed, degenerate or failed), the question used instead '
                    '(e.g. q1: degenerate: "x" AND NOT "x" can match no document); counts in the manifest\'s by_status']
    with pytest.raises(DecompositionsError, match=r"^decompositions: 1 queries have more than one itlr row \(e\.g\. \['q2'\]\)"):
        apply_to_queries(QUERIES, pa.Table.from_pylist(rows + [rows[1]], schema=DECOMPOSITIONS), "itlr")  # two runs' tables concatenated


def test_a_row_made_for_another_question_under_the_same_id_is_refused():
    """`logicrank decompose` records the text each row was made for (question_sha): a table of
    another query set whose ids overlap (BEIR's "1", "2", ...) is refused, never applied to
    other questions; a row without it (hand-written, or an older table) is applied as before."""
    from logicrank.schemas.tables import question_sha

    made = [{"query_id": q, "method": "itlr", "model": "m", "prompt_sha": "p", "question_sha": question_sha(t), "logical_query": f'"{t}"',
             "status": "ok", "prompt_tokens": 1, "generated_tokens": 1, "cached": False}
            for q, t in zip(QUERIES.column("query_id").to_pylist(), QUERIES.column("text").to_pylist(), strict=True)]
    got = apply_to_queries(QUERIES, pa.Table.from_pylist(made, schema=DECOMPOSITIONS), "itlr")
    assert got.column("logical_query").to_pylist() == ['"museums in Paris but not art museums"', '"malaria, not in children"']
    other = [made[0], dict(made[1], question_sha=question_sha("dengue in adults"))]
    with pytest.raises(DecompositionsError, match=r"^decompositions: 1 of 2 queries' itlr rows were made for another question text under "
                                                  r"the same id \(e\.g\. q2: 'malaria, not in children'\): a table of another"):
        apply_to_queries(QUERIES, pa.Table.from_pylist(other, schema=DECOMPOSITIONS), "itlr")
    rewritten = QUERIES.set_column(1, "text", pa.array(["rule one", "rule two"])).append_column("original_text", QUERIES.column("text"))
    assert apply_to_queries(rewritten, pa.Table.from_pylist(made, schema=DECOMPOSITIONS), "itlr").num_rows == 2  # siar kept the question
    unchecked = [made[0], dict(made[1], question_sha=None)]
    assert apply_to_queries(QUERIES, pa.Table.from_pylist(unchecked, schema=DECOMPOSITIONS), "itlr").num_rows == 2
    older = pa.Table.from_pylist(other, schema=DECOMPOSITIONS).drop(["question_sha"])  # a table written before the column
    assert apply_to_queries(QUERIES, older, "itlr").num_rows == 2
