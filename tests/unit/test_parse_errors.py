"""A logical query that does not parse is refused by default, in one line naming the query;
``on_parse_error: fallback`` scores its whole text as one term, as before, and names it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.jobs.retrieve_notes import fallback_notes, refuse_unparsed
from logicrank.pipelines.config.retrieval import RetrieveConfig
from logicrank.pipelines.retrieval.logic.query import UnparsedQueryError, quote
from logicrank.pipelines.retrieval.pipeline import Pipeline
from logicrank.pipelines.retrieval.runner import Inputs
from logicrank.pipelines.retrieval.stages import Context
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import DECOMPOSITIONS

# each bad form of the issue, and what its parse error says
BAD = {
    "unquoted terms": ("vitamin D AND NOT bone", "terms must be double-quoted"),
    "single quotes": ("'vitamin D' AND NOT 'bone'", "double quotes, not single"),
    "a minus for NOT": ('"vitamin D" -"bone"', "negate with NOT, not '-'"),
    "a dangling AND NOT": ('"vitamin D" AND NOT', "ends too early"),
}


def _unit(rng, n, d=16):
    v = rng.normal(size=(n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


RNG = np.random.default_rng(7)
DOCS = _unit(RNG, 40)
IDS = np.array([f"d{i}" for i in range(len(DOCS))], dtype=object)


class Store:
    version = 1

    def vector_blocks(self, batch_rows=32768, read_ahead=True):
        for i in range(0, len(DOCS), batch_rows):
            yield IDS[i : i + batch_rows], DOCS[i : i + batch_rows]

    def vectors_for(self, doc_ids):
        row = {d: i for i, d in enumerate(IDS)}
        return {d: DOCS[row[d]] for d in doc_ids if d in row}


class Encoder:
    """A fixed vector per text (any text: a fallback's whole text is one term)."""

    config, model_id = None, "fixed"

    def encode(self, texts):
        return np.stack([_unit(np.random.default_rng(abs(hash(t)) % 2**32), 1)[0] for t in texts])


def _queries(rows, **extra):
    data = {"query_id": [r[0] for r in rows], "text": [r[1] for r in rows], "logical_query": [r[2] for r in rows]}
    return pa.table({**data, **extra})


def _run(queries, stages, files=None):
    return Pipeline.parse("p", stages).run(Context(store=Store(), encoder=lambda: Encoder()), queries,
                                           inputs=Inputs("b", encoder="e", files=files or {}))


def _table(text: str):
    return _queries([("q1", "vitamin D", '"vitamin D" AND NOT "bone"'), ("q7", text, text), ("q9", "bones", None)])


@pytest.mark.parametrize("form", sorted(BAD))
def test_a_bad_form_is_refused_by_default_naming_the_query_and_the_parse_error(form):
    text, why = BAD[form]
    with pytest.raises(UnparsedQueryError) as exc:
        _run(_table(text), ["itlr"])
    message = str(exc.value)
    assert isinstance(exc.value, UserError) and "\n" not in message
    assert message.startswith(f"itlr: query q7's logical query {text!r} does not parse at position ")
    assert why in message and "--on-parse-error fallback" in message and '("vitamin D" AND NOT "bone")' in message


@pytest.mark.parametrize("form", sorted(BAD))
def test_with_fallback_a_bad_form_is_its_whole_text_as_one_term_and_is_named(form):
    text, _ = BAD[form]
    result = _run(_table(text), [{"itlr": {"k": 5, "on_parse_error": "fallback"}}])
    # scored as before this option: the whole text, one term (as a query of that one quoted term)
    same = _run(_queries([("q7", text, quote(text))]), [{"itlr": {"k": 5}}]).run.to_pandas()
    got = result.run.to_pandas()
    got = got[got["query_id"] == "q7"]
    assert got["doc_id"].tolist() == same["doc_id"].tolist() and got["score"].tolist() == pytest.approx(same["score"].tolist())
    step = result.steps[0]
    assert (step["unparsed"], step["unparsed_query_ids"]) == (1, ["q7"])
    assert (step["fallback"], step["fallback_query_ids"]) == (2, ["q7", "q9"])  # q9 has no logical query: its text, as always
    line, blank = fallback_notes("p", result.steps)
    assert line.startswith("retrieve: pipeline 'p', stage itlr: 1 query whose logical query does not parse") and line.endswith(": q7.")
    assert blank == "retrieve: pipeline 'p', stage itlr: 1 query whose logical query is blank scored as its text, one term: q9."


def test_several_bad_queries_are_counted_and_the_first_named():
    rows = [(f"q{i}", "t", f"term {i} AND NOT other") for i in range(7)] + [("ok", "t", '"a"'), ("blank", "t", "  ")]
    with pytest.raises(UnparsedQueryError, match=r"^itlr: 7 queries' logical queries do not parse \(q0, q1, q2, q3, q4 and 2 more\); "
                       r"q0's 'term 0 AND NOT other' does not parse at position 0"):
        _run(_queries(rows), ["itlr"])
    notes = fallback_notes("p", _run(_queries(rows), [{"itlr": {"on_parse_error": "fallback"}}]).steps)
    assert notes == ["retrieve: pipeline 'p', stage itlr: 7 queries whose logical query does not parse scored as their whole text, "
                     "one term (on_parse_error: fallback): q0, q1, q2, q3, q4, q5, q6.",
                     "retrieve: pipeline 'p', stage itlr: 1 query whose logical query is blank scored as its text, one term: blank."]


def test_a_blank_logical_query_is_no_parse_error_and_is_named():
    result = _run(_queries([("q1", "vitamin D", None), ("q2", "bone", ""), ("q3", "bone", " \t")]), ["itlr"])
    step = result.steps[0]
    assert (step["fallback"], step["unparsed"], step["blank_logical"], step["blank_logical_query_ids"]) == (3, 0, 2, ["q2", "q3"])
    assert fallback_notes("p", result.steps) == [
        "retrieve: pipeline 'p', stage itlr: 2 queries whose logical query is blank scored as their text, one term: q2, q3."]
    # a null one is named where other queries carry a logical query (the column is in use), not where none does
    used = _run(_queries([("q1", "vitamin D", None), ("q2", "bone", '"bone"')]), ["itlr"]).steps[0]
    assert (used["blank_logical"], used["blank_logical_query_ids"]) == (1, ["q1"])
    none = pa.table({"query_id": ["q1", "q2"], "text": ["vitamin D", "bone"], "logical_query": pa.array([None, None], pa.string())})
    unused = _run(none, ["itlr"]).steps[0]
    assert (unused["fallback"], unused["blank_logical"]) == (2, 0)


def test_a_logical_query_written_as_the_text_is_named_not_scored_silently():
    """A TSV or BEIR queries file holds only text: a formula written there is no logical query
    (the stage scores the text as one term, its NOT words raising what they negate); the
    terminal names those queries, and leaves plain words alone."""
    queries = pa.table({"query_id": ["q1", "q2", "q3", "q4"],
                        "text": ['"vitamin D" AND NOT "bone"', "vitamin D AND NOT bone", "vitamin D and bone health", '"a" OR "b"'],
                        "logical_query": pa.array([None, None, None, '"a" OR "b"'], pa.string())})
    step = _run(queries, ["itlr"]).steps[0]
    assert (step["logic_in_text"], step["logic_in_text_query_ids"]) == (2, ["q1", "q2"])
    assert fallback_notes("p", [step])[0] == (
        "retrieve: pipeline 'p', stage itlr: 2 queries with no logical query whose text reads as one ('\"a\" AND NOT \"b\"') scored "
        "as their whole text, one term, a NOT raising what it negates (give the form as logical_query, or decompose them): q1, q2.")


def _decompositions(path, rows):
    base = {"method": "itlr", "model": "hand", "prompt_sha": "-", "raw_output": None, "atoms": None, "expansion": None, "error": None,
            "finish_reason": None, "prompt_tokens": 0, "generated_tokens": 0, "cached": False}
    pq.write_table(pa.Table.from_pylist([{**base, "query_id": q, "logical_query": lq, "status": s} for q, lq, s in rows], schema=DECOMPOSITIONS), path)
    return str(path)


def test_a_decompositions_file_follows_the_same_rule_and_its_fallbacks_are_named(tmp_path):
    queries = _queries([("q1", "vitamin D", None), ("q2", "bone", None), ("q3", "vitamin D not bone", None)])
    path = _decompositions(tmp_path / "dec.parquet", [("q1", '"vitamin D" AND NOT "bone"', "ok"), ("q2", '"bone"', "fallback"),
                                                      ("q3", "vitamin D AND NOT bone", "ok")])
    files = {path: {"sha256": "x"}}
    stages = [{"decomposition": {"target": "itlr", "decompositions": path}}, "itlr"]
    with pytest.raises(UnparsedQueryError, match=r"^itlr: query q3's decomposition's logical query 'vitamin D AND NOT bone' does not parse"):
        _run(queries, stages, files)
    stages[1] = {"itlr": {"on_parse_error": "fallback"}}
    result = _run(queries, stages, files)
    step = result.steps[-1]
    assert (step["unparsed_query_ids"], step["fallback_decomposition_query_ids"]) == (["q3"], ["q2"])
    notes = fallback_notes("p", result.steps)
    assert len(notes) == 2 and notes[0].endswith(": q3.") and "1 query whose decomposition fell back" in notes[1] and notes[1].endswith(": q2.")


def test_orlog_refuses_a_form_that_does_not_parse_naming_the_query():
    from logicrank.pipelines.retrieval.stages.orlog import refuse_unparsed_forms

    atoms = [[{"id": "a1", "text": "{x} is"}, {"id": "a2", "text": "{x} has"}]] * 2
    ok = _queries([("q1", "t", '"a1" AND NOT "a2"'), ("q2", "t", '"a1"')], atoms=atoms)
    refuse_unparsed_forms(ok)
    bad = _queries([("q1", "t", '"a1" AND NOT "a2"'), ("q2", "t", "a1 AND NOT a2")], atoms=atoms)
    with pytest.raises(UnparsedQueryError, match=r"^orlog: query q2's decomposition's form 'a1 AND NOT a2' does not parse at position 0"):
        refuse_unparsed_forms(bad)


def test_the_run_wide_option_reaches_every_stage_that_takes_it():
    pipelines = {"itlr": ["itlr"], "fused": [{"rrf": {"of": [["dense"], [{"itlr": {"k": 10}}]]}}],
                 "own": [{"itlr": {"on_parse_error": "fallback"}}]}

    def policies(cfg):
        return {name: [getattr(o, "on_parse_error", None) for o in stages] + [getattr(o, "on_parse_error", None) for s in stages
                                                                            for sub in getattr(s, "of", ()) for o in sub]
                for name, stages in cfg.pipelines.items()}

    own = RetrieveConfig(queries="q.jsonl", db="db", pipelines=pipelines)
    assert policies(own) == {"itlr": ["refuse"], "fused": [None, None, "refuse"], "own": ["fallback"]}
    every = RetrieveConfig(queries="q.jsonl", db="db", pipelines=pipelines, on_parse_error="fallback")
    assert policies(every) == {"itlr": ["fallback"], "fused": [None, None, "fallback"], "own": ["fallback"]}
    assert every.pipelines["fused"][0].of[1][0].k == 10  # the rest of each stage's options kept
    assert RetrieveConfig.model_validate(every.model_dump(mode="json")) == every  # a manifest's config reads back the same
    assert own.digest() != every.digest()
    with pytest.raises(ValueError, match="on_parse_error"):
        RetrieveConfig(queries="q.jsonl", db="db", pipelines=pipelines, on_parse_error="ignore")


def test_the_retrieve_job_refuses_a_queries_file_before_anything_starts():
    queries = _table("vitamin D AND NOT bone")
    with pytest.raises(UnparsedQueryError, match="^itlr: query q7's logical query"):
        refuse_unparsed([Pipeline.parse("a", ["dense"]), Pipeline.parse("b", [{"rrf": {"of": [["bm25"], ["itlr"]]}}])], queries)
    refuse_unparsed([Pipeline.parse("a", ["dense"]), Pipeline.parse("b", [{"itlr": {"on_parse_error": "fallback"}}])], queries)
    # after a rewriter the stage sees other logical queries: it refuses them itself
    refuse_unparsed([Pipeline.parse("b", [{"decomposition": {"target": "itlr", "decompositions": "d.parquet"}}, "itlr"])], queries)


def test_the_cli_option_is_checked_with_the_config(tmp_path):
    from typer.testing import CliRunner

    from logicrank.cli import app

    res = CliRunner().invoke(app, ["retrieve", "q.jsonl", "--method", "itlr", "--on-parse-error", "ignore"])
    assert res.exit_code == 2 and "--on-parse-error 'ignore'" in res.output
    # --on-parse-error replaces every stage's: a --set of a stage's own that differs is refused, not silently overridden
    both = ["retrieve", "q.jsonl", "--method", "itlr", "--set", "itlr.on_parse_error=fallback", "--on-parse-error", "refuse"]
    refused = CliRunner().invoke(app, both)
    assert refused.exit_code == 2 and "--on-parse-error refuse and --set itlr.on_parse_error=fallback disagree" in " ".join(refused.output.split())
    queries, db = tmp_path / "q.jsonl", tmp_path / "no-db-here"
    queries.write_text('{"_id": "1", "text": "vitamin D"}\n')
    for other in (["--set", "itlr.k=50"], ["--k", "50"], ["--set", "itlr.on_parse_error=fallback"]):  # (the store is then refused: no db)
        res = CliRunner().invoke(app, ["retrieve", str(queries), "--method", "itlr", "--db", str(db), *other, "--on-parse-error", "fallback"])
        # (compared without whitespace: the terminal's width may wrap a long path)
        assert "disagree" not in res.output and "".join(f"no database at '{db}'".split()) in "".join(res.output.split()), (other, res.output)



def test_the_config_files_policy_and_a_stages_own_that_differs_are_refused(tmp_path):
    """A config file's on_parse_error beside --set itlr.on_parse_error: with --method the
    file's won silently; with --pipelines the stage kept the --set while the config said the
    file's, so the recorded config contradicted itself. Refused, as on the command line."""
    from typer.testing import CliRunner

    from logicrank.cli import app

    (tmp_path / "r.yaml").write_text("on_parse_error: fallback\n")
    (tmp_path / "p.yaml").write_text("itlr: [itlr]\n")
    for route in (["--method", "itlr"], ["--pipelines", str(tmp_path / "p.yaml")]):
        res = CliRunner().invoke(app, ["retrieve", "q.jsonl", *route, "--config", str(tmp_path / "r.yaml"), "--set", "itlr.on_parse_error=refuse"])
        assert res.exit_code == 2 and f"{tmp_path / 'r.yaml'}'s on_parse_error: fallback and --set itlr.on_parse_error=refuse disagree" in \
            "".join(res.output.split("\n")), (route, res.output)
