"""The notebook API (``import logicrank as lr``, docs/python-api.md) without Ray or a model:
queries in any form, stages composed with ``>>``, evaluation of runs in any form, and every
mistake as the project's one-line error. A small LanceDB table with generated vectors stands in
for an indexed corpus where a table is needed (search, doc, the encoder the table records)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import logicrank as lr
from logicrank.api import as_queries
from logicrank.pipelines.engines.embed import to_fixed_size_list
from logicrank.pipelines.engines.store import DocStore
from logicrank.schemas.tables import QUERIES, RUN

QRELS = pa.table({"query_id": ["1", "1", "2"], "doc_id": ["a", "b", "c"], "relevance": pa.array([1, 1, 1], pa.int32())})


def run(rid: str, rows: list[tuple[str, str]]) -> pa.Table:
    """A RUN table of (query_id, doc_id) rows, ranked in order within each query."""
    ranks, seen = [], {}
    for q, _ in rows:
        seen[q] = seen.get(q, 0) + 1
        ranks.append(seen[q])
    return pa.table({"query_id": [q for q, _ in rows], "doc_id": [d for _, d in rows], "rank": pa.array(ranks, pa.int32()),
                     "score": [10.0 - r for r in ranks], "method": [rid] * len(rows), "run_id": [rid] * len(rows)}, schema=RUN)


GOOD = run("good", [("1", "a"), ("1", "b"), ("2", "c")])
POOR = run("poor", [("1", "x"), ("1", "a"), ("2", "y")])


# -- queries in any form ---------------------------------------------------------------------
@pytest.mark.parametrize("queries", [
    pa.table({"query_id": [1, 2], "text": ["malaria", "fever"]}),
    pd.DataFrame({"query_id": [1, 2], "text": ["malaria", "fever"]}),
    [{"query_id": 1, "text": "malaria"}, {"query_id": "2", "text": "fever"}],
    [{"_id": "1", "text": "malaria"}, {"_id": "2", "text": "fever", "logical_query": '"fever"'}],
], ids=["arrow", "pandas", "dicts", "dicts-beir-ids"])
def test_queries_come_as_a_table_a_dataframe_or_dicts_with_ids_as_strings(queries):
    got = as_queries(queries)
    assert got.schema.equals(QUERIES) and got.column("query_id").to_pylist() == ["1", "2"]
    assert got.column("text").to_pylist() == ["malaria", "fever"]


def test_a_string_is_a_file_when_one_exists_else_one_querys_text(tmp_path):
    one = as_queries("malaria in children")
    assert one.to_pylist() == [{"query_id": "1", "text": "malaria in children", "logical_query": None}]
    assert as_queries("HIV/AIDS treatment").column("text").to_pylist() == ["HIV/AIDS treatment"]  # a slash is not a path
    long = "effects of vitamin D on bone health in older adults " * 10  # longer than a file name may be
    assert as_queries(long).column("text").to_pylist() == [long]
    path = tmp_path / "q.jsonl"
    path.write_text('{"_id": "q7", "text": "fever"}\n', encoding="utf-8")
    assert as_queries(str(path)).column("query_id").to_pylist() == ["q7"]
    assert as_queries(path).column("query_id").to_pylist() == ["q7"]
    (tmp_path / "malaria").mkdir()  # a folder named as the query, beside: not read for its queries.jsonl
    (tmp_path / "malaria" / "queries.jsonl").write_text('{"_id": "q9", "text": "something else"}\n', encoding="utf-8")
    with pytest.raises(lr.UserError, match=r"names a directory; give Path\(.*\) to read its queries.jsonl"):
        as_queries(str(tmp_path / "malaria"))
    assert as_queries(tmp_path / "malaria").column("query_id").to_pylist() == ["q9"]


@pytest.mark.parametrize(("queries", "match"), [
    ("runs/nope/queries.jsonl", r"no file at 'runs/nope/queries.jsonl' \(a string that looks like a path"),
    ("queries.tsv", "no file at 'queries.tsv'"),
    ("   ", "a blank string"),
    (5, "not int"),
    ({"query_id": "1"}, "not dict"),
    ([], "no queries"),
    (["malaria"], "item 0 is a str"),
    ([{"query_id": 1, "text": "a"}, {"query_id": "1", "text": "b"}], r"duplicate query ids \['1'\]"),
    (pd.DataFrame({"query_id": [1], "body": ["a"]}), "text"),
    (pa.table({"query_id": pa.array([], pa.string()), "text": pa.array([], pa.string())}), "no queries"),
])
def test_queries_that_cannot_be_read_are_one_line_user_errors(queries, match):
    with pytest.raises(lr.UserError, match=match) as exc:
        as_queries(queries)
    assert "\n" not in str(exc.value)


# -- stages compose ------------------------------------------------------------------------
def test_stages_compose_into_the_pipeline_a_file_makes():
    made = lr.bm25(k=100) >> lr.itlr(scorer="bm25")
    read = lr.read_pipelines({"x": [{"bm25": {"k": 100}}, {"itlr": {"scorer": "bm25"}}]})["x"]
    assert isinstance(made, lr.Pipeline) and made.stages == read.stages and made.name == "bm25-itlr"
    assert lr.bm25(k=100) == lr.BM25Options(k=100) == lr.stage("bm25", k=100)
    longer = made >> lr.cut(k=5)  # pipeline >> stage
    assert [o.stage for o in longer.stages] == ["bm25", "itlr", "cut"] and longer.name == "bm25-itlr-cut"
    before = lr.bm25(k=10) >> (lr.preset("itlr")["itlr"])  # stage >> pipeline
    assert before.stages[0] == lr.bm25(k=10) and before.stages[1:] == lr.preset("itlr")["itlr"].stages
    assert (lr.BM25Options(k=3) >> lr.MMROptions()).stages == (lr.bm25(k=3), lr.mmr())  # the options classes compose too
    assert "bm25" in dir(lr) and callable(lr.bm25) and "Options: k" in lr.bm25.__doc__


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: lr.bm25(kk=3), lr.PipelineError, r"lr\.bm25\(\): kk 3: no such option; options: k"),
    (lambda: lr.bm25(k="many"), lr.PipelineError, r"lr\.bm25\(\): k 'many'"),
    (lambda: lr.cut(k=5) >> lr.bm25(), lr.PipelineError, r"stage 1 \(cut\) reranks a run, but no stage before it produces one"),
    (lambda: lr.bm25() >> lr.orlog(), lr.PipelineError, r"needs query column\(s\) \['atoms'\]"),
    (lambda: lr.bm25() >> 5, lr.PipelineError, ">> joins stages and pipelines"),
    (lambda: "bm25" >> lr.bm25(), lr.PipelineError, ">> joins stages and pipelines"),
    (lambda: lr.bm52, lr.UnknownName, r"logicrank has no 'bm52'; .*stage factories: .*bm25"),
    (lambda: lr.stage("bm52"), lr.UnknownName, "no stage 'bm52'; stages: "),
    (lambda: lr.preset("bm52"), lr.PipelineError, "unknown preset 'bm52'; presets: .*bm25"),
    (lambda: lr.read_pipelines(5), lr.PipelineError, "give a mapping"),
])
def test_composition_mistakes_are_one_line_user_errors(make, error, match):
    with pytest.raises(error, match=match) as exc:
        make()
    assert isinstance(exc.value, lr.UserError) and "\n" not in str(exc.value)


def test_an_unknown_name_is_still_an_attribute_error_for_hasattr():
    assert not hasattr(lr, "bm52") and getattr(lr, "bm52", None) is None
    assert isinstance(lr.UnknownName("x"), AttributeError)


# -- evaluate takes runs in any form -------------------------------------------------------
@pytest.mark.parametrize("runs", [
    pa.concat_tables([GOOD, POOR]),
    [GOOD, POOR],
    [GOOD.to_pandas(), POOR.to_pandas()],
    {"good": GOOD, "poor": POOR.to_pandas()},
    {"good": lr.Result("good", GOOD, {}, []), "poor": lr.Result("poor", POOR, {}, [])},
], ids=["one-table", "list", "dataframes", "mapping", "results"])
def test_evaluate_takes_a_run_a_list_or_a_mapping(runs):
    ev = lr.evaluate(runs, QRELS, ["P@1", "R@100"])
    assert isinstance(ev, lr.Evaluation) and ev.run_ids == ["good", "poor"]
    assert list(ev.summary.index) == ["good", "poor"] and list(ev.summary.columns) == ["depth", "P@1", "R@100"]
    assert ev.summary.loc["good", "P@1"] == 1.0 and ev.summary.loc["poor", "P@1"] == 0.0
    assert list(ev.summary["depth"]) == [2, 2]  # each run's depth, as evaluate's report states it (query 1 holds 2 documents)
    assert ev.to_pandas().equals(ev.summary)
    assert set(ev.per_query["query_id"]) == {"1", "2"} and len(ev.per_query) == 2 * 2 * 2
    sig = ev.compare(baseline="good")
    assert list(sig["run_id"]) == ["poor", "poor"] and set(sig["measure"]) == {"P@1", "R@100"}
    assert lr.compare(ev, "good").to_pandas().equals(sig) and lr.compare(ev.metrics, "good").num_rows == 2  # both forms kept


def test_compare_refuses_runs_evaluated_over_other_queries():
    """Metrics of two evaluations put together, one run lacking some queries: its p-value was
    NaN, its mean NaN, and the NaN counted in Holm's family doubled the other run's adjusted p
    (under bh, scipy's error). Refused in one line naming the run."""
    ev = lr.evaluate([GOOD, POOR], QRELS, ["P@1"])
    other = lr.evaluate(GOOD.set_column(GOOD.schema.get_field_index("run_id"), "run_id", pa.array(["third"] * GOOD.num_rows)), QRELS, ["P@1"])
    partial = other.metrics.filter(pa.compute.not_equal(other.metrics.column("query_id"), "2"))
    with pytest.raises(lr.PipelineError, match=r"^compare: significance: run 'third' has no P@1 for 1 of the 2 queries .*\(e.g. '2'\)") as err:
        lr.compare(pa.concat_tables([ev.metrics, partial]), "good")
    assert "\n" not in str(err.value)
    assert lr.compare(pa.concat_tables([ev.metrics, other.metrics]), "good").num_rows == 2  # the same queries: compared


def test_qrels_with_integer_query_ids_evaluate_as_their_decimal_text():
    """A qrels table read with pandas gives integer ids; the run's are text: the same queries."""
    ints = QRELS.set_column(0, "query_id", pa.array([1, 1, 2], pa.int64()))
    assert lr.evaluate(GOOD, ints, ["P@1"]).summary.loc["good", "P@1"] == lr.evaluate(GOOD, QRELS, ["P@1"]).summary.loc["good", "P@1"] == 1.0
    # and its notes count the queries alike (they compared 1 with "1": every qrels query missing from the run)
    assert lr.evaluate(GOOD, ints, ["P@1"]).notes() == lr.evaluate(GOOD, QRELS, ["P@1"]).notes()


def test_a_mapping_names_its_runs_and_an_empty_run_scores_zero():
    results = lr.Results(good=lr.Result("good", GOOD, {}, []), nothing=lr.Result("nothing", RUN.empty_table(), {}, []))
    assert results.run.num_rows == GOOD.num_rows and len(results.to_pandas()) == GOOD.num_rows
    ev = lr.evaluate(results, QRELS, ["P@1"])
    assert ev.run_ids == ["good", "nothing"] and ev.summary.loc["nothing", "P@1"] == 0.0
    assert list(ev.summary["depth"]) == [2, 0]
    renamed = lr.evaluate({"mine": GOOD}, QRELS, ["P@1"])  # the key is the run id
    assert renamed.run_ids == ["mine"]


@pytest.mark.parametrize(("runs", "qrels", "match"), [
    ([GOOD, GOOD], QRELS, r"run id 'good' is in runs 1 and 2"),
    ([GOOD, lr.Result("good", RUN.empty_table(), {}, [])], QRELS, r"run id 'good' is in runs 1 and 2"),
    (5, QRELS, "a run is a RUN table, a DataFrame, a Result or a run file, not int"),
    ([GOOD, "nope.run"], QRELS, "nope.run"),
    ({"both": pa.concat_tables([GOOD, POOR])}, QRELS, r"run 'both' holds several run ids \['good', 'poor'\]"),
    (GOOD.drop_columns(["run_id"]), QRELS, "no run_id column; give a mapping"),
    (GOOD, 3.5, "qrels is a table .* not float"),
    ([], QRELS, "no runs given"),
    # its queries spelt otherwise than the qrels': every measure would read 0 (trec_eval refuses it without -c)
    (GOOD.set_column(GOOD.schema.get_field_index("query_id"), "query_id", pa.array(["q" + q for q in GOOD.column("query_id").to_pylist()])),
     QRELS, r"run good has no query the qrels judge \(its queries \['q1', 'q2'\]\.\.\., the qrels' \['1', '2'\]"),
    # one query spelt with other leading zeros ('02' for the qrels' '2': TREC pads its topics, NTCIR its qrels): it would score
    # 0 as a missed query while the other query matches
    (GOOD.set_column(GOOD.schema.get_field_index("query_id"), "query_id", pa.array([q.replace("2", "02") for q in GOOD.column("query_id").to_pylist()])),
     QRELS, r"run good's query '02' is the qrels' '2' with other leading zeros \(1 such"),
])
def test_evaluate_mistakes_are_one_line_user_errors(runs, qrels, match):
    with pytest.raises(lr.UserError, match=match) as exc:
        lr.evaluate(runs, qrels, ["P@1"])
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"measures": 5}, "measures is a list of names"),
    ({"measures": ["nope"]}, "unknown measure 'nope'"),
    ({"run_ids": "good"}, "run_ids is a list of run ids"),
])
def test_evaluate_refuses_bad_measures_and_run_ids(kwargs, match):
    with pytest.raises(lr.UserError, match=match):
        lr.evaluate(GOOD, QRELS, **kwargs)


def test_compare_refuses_what_is_not_metrics_and_an_unknown_baseline():
    ev = lr.evaluate([GOOD, POOR], QRELS, ["P@1"])
    with pytest.raises(lr.UserError, match="give lr.evaluate"):
        lr.compare([GOOD], "good")
    with pytest.raises(lr.UserError, match="baseline 'best' is not among the runs"):
        ev.compare(baseline="best")


# -- a table: search, doc, the encoder it records --------------------------------------------
@pytest.fixture(scope="module")
def table_db(tmp_path_factory):
    """Six documents with generated vectors, recorded as embedded by MiniLM with a 128-token window."""
    db = tmp_path_factory.mktemp("api") / "db"
    v = np.random.default_rng(0).normal(size=(6, 8)).astype(np.float32)
    texts = ["malaria in children", "malaria treatment in adults", "fever and malaria", "influenza vaccines", "children sleep", "bile acid"]
    store = DocStore(str(db))
    store.open_or_create(8, "all-MiniLM-L6-v2@seq128")
    store.upsert(pa.table({"doc_id": [f"d{i}" for i in range(6)], "title": [f"T{i}" for i in range(6)], "text": texts,
                           "metadata": ['{"year": 2020}'] + [None] * 5, "content_hash": ["h"] * 6,
                           "vector": to_fixed_size_list(v / np.linalg.norm(v, axis=1, keepdims=True))}))
    store.build_indexes(ann_threshold=10**9)
    store.mark_complete()
    return db


def test_open_table_reads_the_encoder_the_table_records(table_db):
    table = lr.open_table(table_db)
    assert table.embed == lr.EmbedConfig(model="all-MiniLM-L6-v2", max_seq_length=128)
    other = lr.open_table(table_db, embed=lr.EmbedConfig())  # an explicit encoder that disagrees is refused on first use
    with pytest.raises(lr.UserError, match=r"holds vectors from 'all-MiniLM-L6-v2@seq128', not 'all-MiniLM-L6-v2'"):
        other.search("malaria", "dense")
    with pytest.raises(lr.UserError, match="embed is an lr.EmbedConfig"):
        lr.open_table(table_db, embed="all-MiniLM-L6-v2")


def test_doc_returns_one_document_or_names_the_missing_id(table_db):
    table = lr.open_table(table_db)
    assert table.doc("d0") == {"doc_id": "d0", "title": "T0", "text": "malaria in children", "metadata": {"year": 2020}}
    with pytest.raises(lr.PipelineError, match=r"table.doc: no document 'd9' in table 'docs'"):
        table.doc("d9")


def test_search_answers_one_query_text_or_logical(table_db):
    table = lr.open_table(table_db)
    hits = table.search("malaria", lr.bm25(k=10))
    assert list(hits.columns) == ["query_id", "doc_id", "rank", "score", "title", "text"]
    assert set(hits["doc_id"]) == {"d0", "d1", "d2"} and list(hits["rank"]) == [1, 2, 3] and set(hits["query_id"]) == {"1"}
    assert len(table.search("malaria", "bm25", k=1)) == 1
    assert len(table.search("malaria", lr.bm25(k=2), k=3)) == 3  # deepened, as --k deepens a run: not cut at the stage's 2
    # a queries table has its own text: a NOT in its logical_query column is no reason to refuse a text-only pipeline
    own = lr.retrieve(table, [{"query_id": "1", "text": "malaria", "logical_query": '"malaria" AND NOT "children"'}], {"b": lr.bm25(k=10)})
    assert own["b"].run.column("doc_id").to_pylist() == hits["doc_id"].tolist()
    assert table.search("malaria", ["bm25"])["doc_id"].tolist() == hits["doc_id"].tolist()  # a list of stages
    logical = table.search('"malaria" AND NOT "children"', lr.bm25(k=10) >> lr.itlr(scorer="bm25", k=10))
    assert "d0" not in set(logical["doc_id"][:2]) and set(logical["doc_id"][:2]) == {"d1", "d2"}
    assert set(logical["doc_id"]) == {"d0", "d1", "d2"}  # bm25's candidates for "malaria and not children", rescored; d4
    # (children only: 0, no evidence for malaria) is no result unless padded
    padded = table.search('"malaria" AND NOT "children"', lr.bm25(k=10) >> lr.itlr(scorer="bm25", k=10, pad=True))
    assert set(padded["doc_id"]) == {"d0", "d1", "d2", "d4"}
    apart = table.search("malaria", lr.bm25(k=10) >> lr.itlr(scorer="bm25", k=10), logical_query='"malaria" AND NOT "children"')
    assert apart["doc_id"].tolist() == [d for d in logical["doc_id"] if d != "d4"]  # the text picks bm25's candidates: three here
    np.testing.assert_allclose(apart["score"], logical.set_index("doc_id").loc[apart["doc_id"], "score"], rtol=1e-6)
    # lr.retrieve reads one logical query's string as table.search does (not as one ITLR term)
    same = lr.retrieve(table, '"malaria" AND NOT "children"', {"i": lr.bm25(k=10) >> lr.itlr(scorer="bm25", k=10)})["i"].run
    assert same.column("doc_id").to_pylist() == logical["doc_id"].tolist()


def test_a_logical_query_without_a_not_is_searched_by_its_words(table_db):
    """A quoted phrase, or terms joined by AND or OR, loses nothing to a pipeline that reads
    words: searched as the words, as before (only a NOT would be turned around)."""
    table = lr.open_table(table_db)
    for query, words in (('"malaria"', "malaria"), ('"malaria" AND "children"', "malaria and children")):
        assert table.search(query)["doc_id"].tolist() == table.search(words)["doc_id"].tolist()


@pytest.mark.parametrize(("call", "match"), [
    (lambda t: t.search("malaria", "nope"), "table.search: unknown preset 'nope'; presets: "),
    (lambda t: t.search("malaria", 5), "a pipeline is a Pipeline, a preset name, a stage"),
    (lambda t: t.search(5), "a query is a non-blank string"),
    (lambda t: t.search("malaria", k=0), "k is a positive integer, not 0"),
    (lambda t: t.search("malaria", logical_query=3), "logical_query is a string"),
    (lambda t: t.search("malaria", [{"bm25": {"kk": 1}}]), "no such option; options: k"),
    (lambda t: t.doc(["d0"]), "a document id is a string"),
    (lambda t: lr.retrieve(t, "malaria", "bm25", pandas=True), "retrieve: no option pandas"),
    (lambda t: lr.retrieve("db", "malaria", "bm25"), r"table is lr.open_table\(...\), not str"),
    (lambda t: lr.retrieve(t, "malaria", 5), "pipes is a mapping"),
    (lambda t: lr.retrieve(t, "malaria", ["bm25", lr.bm25(k=3)]), r"run ids repeat: \['bm25'\]"),
    # stages in a list: one pipeline to table.search, so never read as separate runs here
    (lambda t: lr.retrieve(t, "malaria", [lr.bm25(k=100), lr.itlr(scorer="bm25")]), "a list of stages is one pipeline to table.search"),
    # a logical query's string, or a logical_query given apart, to a pipeline that would search its words: refused as search refuses it
    (lambda t: lr.retrieve(t, '"malaria" AND NOT "children"', "bm25"), "retrieve: .* no stage of pipeline 'bm25' reads its logic"),
    (lambda t: t.search("malaria", logical_query='"malaria" AND NOT "children"'), "no stage of the pipeline reads its logic"),
    (lambda t: lr.retrieve(t, "malaria", {"a b": "bm25"}), "run ids"),
    (lambda t: lr.retrieve(t, "malaria", {}), "at least one pipeline"),
    (lambda t: lr.retrieve(t, "malaria", "bm25", cache=5), "cache is a directory or a StageCache, not int"),
    (lambda t: t.search("malaria", "bm25", cache=5), "cache is a directory or a StageCache, not int"),
    # a logical query to a pipeline that would search its words (NOT raising the documents about children): refused
    (lambda t: t.search('"malaria" AND NOT "children"'), "negates a term, and no stage of the pipeline reads its logic"),
    (lambda t: t.search('"malaria" AND NOT "children"', lr.bm25(k=10) >> lr.cut(k=5)), "no stage of the pipeline reads its logic"),
])
def test_table_mistakes_are_one_line_user_errors(table_db, call, match):
    with pytest.raises(lr.UserError, match=match) as exc:
        call(lr.open_table(table_db))
    assert "\n" not in str(exc.value)


def test_retrieve_returns_results_by_run_id_keeping_empty_runs(table_db):
    table = lr.open_table(table_db)
    results = lr.retrieve(table, [{"query_id": 1, "text": "malaria"}, {"query_id": 2, "text": "zebra"}],
                          {"bm25": "bm25", "top1": lr.bm25() >> lr.cut(k=1)})
    assert isinstance(results, lr.Results) and list(results) == ["bm25", "top1"]
    assert results["top1"].run.column("doc_id").to_pylist() == [results["bm25"].run.column("doc_id")[0].as_py()]
    assert results.run.num_rows == sum(r.run.num_rows for r in results.values())
    nothing = lr.retrieve(table, "zebra", lr.bm25())
    assert list(nothing) == ["bm25"] and nothing["bm25"].run.num_rows == 0
    ev = lr.evaluate(nothing, pa.table({"query_id": ["1"], "doc_id": ["d0"], "relevance": pa.array([1], pa.int32())}), ["P@1"])
    assert ev.summary.loc["bm25", "P@1"] == 0.0


def test_run_experiment_refuses_a_table_of_another_encoder_than_the_file_fixes(tmp_path):
    """A file that names its encoder is run on a table of that encoder only (a file that names
    none is run on any, its references unchecked on another: test_experiment_files.py)."""
    import types

    from logicrank.pipelines.config.settings import EmbedConfig
    from logicrank.pipelines.evaluation.experiment import load, override

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    exp = override(load("scifact"), {"embed.model": str(tmp_path / "a")})
    with pytest.raises(lr.PipelineError, match=r"^run_experiment: experiment scifact fixes embed .*open the table with open_table\(embed=\.\.\.\)"):
        lr.run_experiment(exp, table=types.SimpleNamespace(embed=EmbedConfig(model=str(tmp_path / "b"))))


@pytest.mark.parametrize(("query", "words"), [
    ('"malaria" AND NOT "children"', "malaria and not children"),
    ('"cancer" AND NOT ("breast" OR "lung")', "cancer and not (breast or lung)"),
    ('"a" AND NOT ("b" AND "c")', "a and not (b and c)"),
    ('("dog" OR "cat") AND "mouse"', "(dog or cat) and mouse"),
    ('"dog" OR "cat" AND "mouse"', "dog or cat and mouse"),
    ('NOT ("x" OR "y")', "not (x or y)"),
])
def test_a_logical_querys_words_keep_its_groups(table_db, monkeypatch, query, words):
    """The text an LLM stage reads for a logical query given to table.search or lr.retrieve
    (OrLog's decomposition, the reasoner) means what the query does: a group under NOT or
    AND keeps its parentheses (``cancer and not breast or lung`` would read the OR last)."""
    from logicrank.pipelines.retrieval.pipeline import Pipeline

    seen, run = [], Pipeline.run

    def recording(self, context, queries, *a, **kw):
        seen.append((queries.column("text")[0].as_py(), queries.column("logical_query")[0].as_py()))
        return run(self, context, queries, *a, **kw)

    monkeypatch.setattr(Pipeline, "run", recording)
    table = lr.open_table(table_db)
    table.search(query, lr.bm25(k=10) >> lr.itlr(scorer="bm25", k=10, empty_not="hold"))
    lr.retrieve(table, query, {"i": lr.bm25(k=10) >> lr.itlr(scorer="bm25", k=10, empty_not="hold")})
    assert seen == [(words, query)] * 2


def test_an_evaluations_markdown_holds_the_significance_the_cli_report_holds():
    """lr.evaluate computed no significance, so Evaluation.markdown() had no significance
    section, where the CLI's report.md of the same runs has one."""
    from logicrank.pipelines.evaluation.runs import evaluate_runs

    ev = lr.evaluate([GOOD, POOR], QRELS, ["P@1"])
    cli = evaluate_runs([GOOD, POOR], QRELS, ["P@1"]).markdown("Evaluation", None)
    assert "## Significance" in cli and ev.markdown(plot=None) == cli
    assert "## Significance" not in lr.evaluate(GOOD, QRELS, ["P@1"]).markdown(plot=None)  # one run: nothing to compare


def test_search_with_k_deepens_a_fusions_inputs_and_cuts_an_unset_depth_by_rank(table_db, tmp_path, monkeypatch):
    """table.search(k=3) over a fusion of 1-deep lists gave 1 row where the job's --k 3 gives
    3 (only the fusion's own k was weighed); over a stage whose depth is left unset (a run file,
    a cut by a depths file) it raised a TypeError. Deepened as --k deepens, or cut by rank."""
    table = lr.open_table(table_db)
    fused = lr.rrf(k=100, of=[[lr.bm25(k=1)], [lr.bm25(k=1)]])
    assert len(table.search("malaria children fever", fused, k=3)) == 3
    # k within the run's depth (one fused list deep enough): the pipeline runs as given, its run cut by rank
    from logicrank.pipelines.retrieval.pipeline import Pipeline

    ran, real_run = [], Pipeline.run
    monkeypatch.setattr(Pipeline, "run", lambda self, *a, **kw: ran.append(self.stages) or real_run(self, *a, **kw))
    deep = lr.rrf(k=100, of=[[lr.bm25(k=100)], [lr.bm25(k=1)]])
    whole = table.search("malaria children fever", deep)
    assert table.search("malaria children fever", deep, k=2)["doc_id"].tolist() == whole["doc_id"].tolist()[:2]
    assert ran[0] == ran[1] == (deep,)
    run = tmp_path / "run.trec"
    run.write_text("".join(f"1 Q0 d{i} {i + 1} {6 - i} r\n" for i in range(5)))
    assert table.search("malaria", lr.run_file(path=str(run)), k=2)["doc_id"].tolist() == ["d0", "d1"]


def test_evaluate_refuses_a_run_file_of_an_unfinished_retrieve_and_notes_what_the_job_says(tmp_path):
    """lr.evaluate scored a runs/ file beside a killed retrieve's manifest (another run's
    leftover), which `logicrank evaluate` refuses; and said nothing of rows whose document is
    their query (BEIR's ArguAna), of runs from two table versions, nor took ignore_identical_ids."""
    import json

    import pyarrow.parquet as pq

    from logicrank.schemas.errors import UserError

    for name, status, version in (("a", "running", 3), ("b", "ok", 3), ("c", "ok", 4)):
        (tmp_path / name / "runs").mkdir(parents=True)
        pq.write_table(GOOD, tmp_path / name / "runs" / "good.parquet")
        (tmp_path / name / "manifest.json").write_text(json.dumps(
            {"stage": "retrieve", "status": status, "inputs": {"table": {"name": "docs", "version": version, "made": "t"}}}))
    with pytest.raises(UserError, match="is an output of a retrieve run that has not finished"):
        lr.evaluate(str(tmp_path / "a" / "runs" / "good.parquet"), QRELS, ["P@1"])
    ev = lr.evaluate({"b": tmp_path / "b" / "runs" / "good.parquet", "c": str(tmp_path / "c" / "runs" / "good.parquet")}, QRELS, ["P@1"])
    assert any("retrieved from 2 table versions" in n for n in ev.notes()) and "2 table versions" in ev.markdown()
    own = run("own", [("1", "1"), ("1", "a"), ("2", "c")])  # query 1 retrieves the document "1" first
    kept = lr.evaluate(own, QRELS, ["P@1"])
    assert kept.summary.loc["own", "P@1"] == 0.5 and any("1 row(s) have a document id equal to their query's id" in n for n in kept.notes())
    dropped = lr.evaluate(own, QRELS, ["P@1"], ignore_identical_ids=True)
    assert dropped.summary.loc["own", "P@1"] == 1.0 and any("dropped before measuring" in n for n in dropped.notes())
    with pytest.raises(UserError, match="alpha 5: must be between 0 and 1"):
        kept.compare(alpha=5)
    with pytest.raises(UserError, match="test 'wilcoxon': must be one of"):
        lr.compare(lr.evaluate([GOOD, own], QRELS, ["P@1"]), "good", test="wilcoxon")


def test_run_experiment_checks_its_placement_before_ray_and_its_encoder_beats_the_files(monkeypatch):
    """A mapping given as ``ray`` reached the job unchecked (an AttributeError once Ray was
    starting), and ``embed=`` lost to the file's embed where the CLI's --model wins."""
    from logicrank.jobs import experiment as job
    from logicrank.pipelines.evaluation.experiment import load, override
    from logicrank.schemas.errors import UserError

    with pytest.raises(UserError, match=r"run_experiment: ray: adress .*no such option; options: address"):
        lr.run_experiment("scifact", ray={"adress": "ray://head:10001"})
    with pytest.raises(UserError, match="run_experiment: no option bogus; the jobs take embed, ray, llm, progress, echo, index_dir"):
        lr.run_experiment("scifact", bogus=1)
    ran = {}
    monkeypatch.setattr(job, "run_experiment", lambda exp, out, strict, **placement: ran.update(exp=exp, **placement))
    fixed = override(load("scifact"), {"embed.title_sep": " | "})
    lr.run_experiment(fixed, out="unused", embed=lr.EmbedConfig(title_sep=". "), ray={"num_cpus": 2})
    assert ran["exp"].embed["title_sep"] == ". " and ran["ray"].num_cpus == 2, ran
    lr.run_experiment(fixed, out="unused", embed=lr.EmbedConfig(max_seq_length=128))  # a field the file leaves alone: the file's stays
    assert ran["exp"].embed["title_sep"] == " | " and ran["embed"].max_seq_length == 128, ran
    lr.run_experiment(fixed, out="unused", ray=None, index_dir="shared", progress=False)  # the job's other keywords pass as they are
    assert (ran["ray"], ran["index_dir"], ran["progress"]) == (None, "shared", False), ran
