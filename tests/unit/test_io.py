import re

import pyarrow as pa
import pytest

from logicrank.pipelines.datasets import scifact
from logicrank.pipelines.io import TopicsError, read_qrels, read_queries, read_run, write_trec_run
from logicrank.pipelines.retrieval.methods.hybrid import rrf
from logicrank.pipelines.retrieval.methods.ranking import rank_pairs
from logicrank.schemas.tables import QRELS, RUN


def test_bundled_scifact_reads():
    d = scifact()
    q = read_queries(d.queries)
    assert q.num_rows == 300 and q.column("query_id")[0].as_py() == "1"
    qr = read_qrels(d.qrels)
    assert qr.schema == QRELS and qr.num_rows == 339


def test_qrels_lines_keep_one_layout_and_relevance_reads_as_trec_eval_reads_it(tmp_path):
    """A line missing its docno in a 4-column file (or an id with a space in a 3-column one)
    would be read as a judgement of another document: refused. A relevance is an integer as
    trec_eval reads one (the digits before any point); a form it reads otherwise (an exponent:
    atol reads 5E-1 as 5) is refused, not read as Python reads it."""
    path = tmp_path / "qrels.trec"
    path.write_text("301 0 d1 1\n301 0 1\n")
    with pytest.raises(TopicsError, match=r"line 2 has 3 fields and line 1 has 4; every line of a qrels file has the same fields"):
        read_qrels(path)
    path.write_text("q1\td1\t1\nq1\tdoc 7\t1\n")
    with pytest.raises(TopicsError, match=r"line 2 has 4 fields and line 1 has 3"):
        read_qrels(path)
    path.write_text("1 0 a 0.5\n1 0 b 1.0\n1 0 c -1\n1 0 d +2\n1 0 e 3.\n1 0 f .5\n")
    assert read_qrels(path).column("relevance").to_pylist() == [0, 1, -1, 2, 3, 0]
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1 \nq1\td2\t 2\n")  # a BEIR score's spaces
    assert read_qrels(path).column("relevance").to_pylist() == [1, 2]
    for rel, says in (("5E-1", "is not an integer"), ("1e3", "is not an integer"), ("1_0", "is not an integer"), ("inf", "is not an integer"),
                      ("3000000000", "is out of range")):
        path.write_text(f"1 0 a 1\n1 0 b {rel}\n")
        with pytest.raises(TopicsError, match=f"^qrels {re.escape(str(path))}: line 2: relevance '{rel}' {says}"):
            read_qrels(path)


def test_qrels_of_one_judgement_a_json_line_read_as_beirs_tsv(tmp_path):
    """BEIR's qrels as JSON lines (``query-id``, ``corpus-id``, ``score``), as LIMIT
    (google-deepmind/limit) and BEIR's sets on the Hugging Face hub publish them: each line one
    judgement, integer ids read as their decimal text. A line lacking a part, or with two
    spellings of one, is refused in one line."""
    import json

    path = tmp_path / "qrels.jsonl"
    rows = [{"query-id": "query_0", "corpus-id": "Geneva Durben", "score": 1}, {"query-id": "query_0", "corpus-id": "Dorathea Bastress", "score": 1},
            {"query-id": 7, "corpus-id": 12, "score": 0}, {"qid": "q9", "docid": "d1", "relevance": "2"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = read_qrels(path)
    assert got.schema == QRELS and got.to_pylist() == [
        {"query_id": "query_0", "doc_id": "Geneva Durben", "relevance": 1}, {"query_id": "query_0", "doc_id": "Dorathea Bastress", "relevance": 1},
        {"query_id": "7", "doc_id": "12", "relevance": 0}, {"query_id": "q9", "doc_id": "d1", "relevance": 2}]
    for row, says in (({"query-id": "q", "corpus-id": "d"}, "no relevance"), ({"query-id": "q", "corpus-id": "d", "score": 1, "label": 1}, "more than one relevance"),
                      ({"query-id": "q", "corpus-id": "d", "score": 0.5}, "score is 0.5; give an integer"),
                      ({"corpus-id": "d", "score": 1}, "no query_id")):
        path.write_text(json.dumps(row) + "\n")
        with pytest.raises(TopicsError, match=f"line 1: {says}") as info:
            read_qrels(path)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["query-id\tcorpus-id\tscore\nq2 \td2\t1\n", "query-id\tcorpus-id\tscore\n\td1\t1\n",
                                  "query-id\tcorpus-id\tscore\nq1\t d1\t1\n"])
def test_a_qrels_id_blank_or_with_surrounding_whitespace_is_refused(tmp_path, text):
    """A BEIR qrels line is split on tabs, so an id may keep a space: ``q2 `` matched no query of
    the run, which then scored 0 on it (nDCG@10 0.5 for a perfect run of two queries) while the
    run's ``q2`` was left out. Refused, as the queries' and the corpus's readers refuse such ids."""
    path = tmp_path / "qrels.tsv"
    path.write_text(text)
    with pytest.raises(TopicsError, match="blank or with surrounding whitespace"):
        read_qrels(path)


@pytest.mark.parametrize("ids", [[1.0e18, 2.0e18], [10.0, 11.0], [True, False]])
def test_a_parquet_run_whose_ids_are_floats_or_booleans_is_refused(tmp_path, ids):
    """A run's ids written as floats (numeric ids through numpy or pandas) were cast to their
    float text: 1e18 became '1e+18' and 10.0 '10', ids no qrels line names, and every measure
    read 0 without a word. Refused, as the Parquet qrels reader refuses them; integers stay
    their decimal text."""
    import pyarrow.parquet as pq

    path = tmp_path / "run.parquet"
    n = len(ids)
    table = {"query_id": ["q1"] * n, "doc_id": ids, "rank": pa.array(range(1, n + 1), pa.int32()), "score": [2.0, 1.0][:n],
             "method": ["m"] * n, "run_id": ["r"] * n}
    pq.write_table(pa.table(table), path)
    with pytest.raises(Exception, match="column 'doc_id' has type (double|bool); it holds text"):
        read_run(path)
    pq.write_table(pa.table(table | {"doc_id": [10, 11][:n]}), path)
    assert read_run(path).column("doc_id").to_pylist() == ["10", "11"][:n]
    # a column of nulls alone (pandas' float NaN of an empty column) is nulls as text, as before
    from logicrank.schemas.tables import QUERIES, conform

    empty = pa.table({"query_id": ["1"], "text": ["a"], "logical_query": pa.array([None], pa.float64())})
    assert conform(empty, QUERIES, "queries").column("logical_query").to_pylist() == [None]


def test_trec_formats_and_errors(tmp_path):
    (tmp_path / "q.trec").write_text("q1 0 d1 2\nq1 0 d2 0\n")
    assert read_qrels(tmp_path / "q.trec").column("relevance").to_pylist() == [2, 0]
    (tmp_path / "bad.tsv").write_text("q1 d1\n")
    with pytest.raises(TopicsError, match="line 1 has 2 fields"):
        read_qrels(tmp_path / "bad.tsv")
    (tmp_path / "dup.jsonl").write_text('{"_id": "1", "text": "a"}\n{"_id": "1", "text": "b"}\n')
    with pytest.raises(TopicsError, match="duplicate query ids"):
        read_queries(tmp_path / "dup.jsonl")


@pytest.mark.parametrize("line, says", [
    ('{"_id": null, "text": "a"}', "the query id is null"),
    ('{"_id": true, "text": "a"}', "the query id is true"),
    ('{"_id": 3.0, "text": "a"}', "the query id is 3.0"),
    ('{"_id": ["q"], "text": "a"}', 'the query id is ["q"]'),
    ('{"_id": " q6 ", "text": "a"}', "surrounding whitespace"),
    ('{"_id": "", "text": "a"}', "is blank"),
    ('{"_id": "\\ud800", "text": "a"}', "not text"),
    ('{"_id": "q", "text": null}', "the query text is null"),
    ('{"_id": "q", "text": 7}', "the query text is 7"),
    ('{"_id": "q", "text": "half \\ud800 a pair"}', "lone surrogate"),
    ('{"_id": "q", "text": "a", "logical_query": 5}', "the logical query is 5"),
    ('{"_id": "q", "text": "a", "logical_query": ["x"]}', 'the logical query is ["x"]'),
    ('{"_id": "q", "text": "a", "logical_query": "\\"\\ud800\\""}', "lone surrogate"),
])
def test_a_jsonl_query_whose_id_or_text_is_not_text_is_refused_naming_its_line(tmp_path, line, says):
    """Not read as "None", "True", "3.0" or a list's repr (ids no qrels line holds, or the word
    "None" searched for): refused in one line."""
    path = tmp_path / "q.jsonl"
    path.write_text('{"_id": "ok", "text": "fine"}\n' + line + "\n")
    with pytest.raises(TopicsError, match="line 2: ") as err:
        read_queries(path)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_jsonl_query_id_may_be_an_integer_and_a_text_blank(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"_id": 7, "text": "seven"}\n{"_id": "0001", "text": ""}\n')
    q = read_queries(path)
    assert q.column("query_id").to_pylist() == ["7", "0001"] and q.column("text").to_pylist() == ["seven", ""]


def test_rank_pairs_orders_and_breaks_ties_by_doc_id(tmp_path):
    import pandas as pd

    pairs = pd.DataFrame({"query_id": ["a"] * 4, "doc_id": ["z", "y", "x", "w"], "score": [0.5, 0.9, 0.5, 0.1]})
    run = rank_pairs(pairs, 3, "m", "r")
    assert run.schema == RUN
    assert run.column("doc_id").to_pylist() == ["y", "z", "x"]  # equal scores: doc_id descending, as trec_eval
    assert run.column("rank").to_pylist() == [1, 2, 3]
    path = write_trec_run(run, tmp_path / "r.trec")
    back = read_run(path)  # a TREC file is ranked as trec_eval ranks it: the same order
    assert back.column("doc_id").to_pylist() == ["y", "z", "x"] and back.column("run_id")[0].as_py() == "r"
    assert back.column("rank").to_pylist() == [1, 2, 3]


def test_scores_equal_in_32_bits_are_written_as_they_are_ranked():
    """Two RRF sums equal in 32 bits (trec_eval's key: doc_id descending breaks the tie) whose
    64 bits differ the other way: the run wrote the 64 bits, so ranx, which sorts by them,
    ranked the later row first (nDCG@262 0.124 against the run's 0). Scores tied in 32 bits
    are written as that 32-bit value; the others keep their 64 bits."""
    import numpy as np
    import pandas as pd

    low, high = 0.006211239844238258, 0.00621124002970593
    assert np.float32(low) == np.float32(high) and high > low
    pairs = pd.DataFrame({"query_id": ["q"] * 3, "doc_id": ["z", "a", "m"], "score": [low, high, 0.001]})
    run = rank_pairs(pairs, 10, "rrf", "r")
    assert run.column("doc_id").to_pylist() == ["z", "a", "m"]
    scores = run.column("score").to_pylist()
    assert scores[0] == scores[1] == float(np.float32(high)) and scores[2] == 0.001  # (0.001: no tie, its 64 bits)
    # a row whose score rounds to one a base-rank tie was lowered to: tied with it, never above it
    below = float(np.nextafter(np.float32(0.5), np.float32(0)))
    pairs = pd.DataFrame({"query_id": ["q"] * 3, "doc_id": ["a", "b", "0"], "score": [0.5, 0.5, below + 1e-12], "tiebreak": [1, 2, 3]})
    scores = rank_pairs(pairs, 10, "orlog", "r").column("score").to_pylist()
    assert scores == sorted(scores, reverse=True) and scores[1] == scores[2] == below, scores


def test_a_tie_broken_by_a_base_rank_keeps_its_order_in_the_trec_file(tmp_path):
    """OrLog and the reasoner break equal posteriors by the base run's rank, which trec_eval
    does not read: the run ranked a above b, its TREC file (equal scores) b above a, and
    `evaluate` gave the run MRR 1 and its file 0.5. A tied row placed against trec_eval's rule
    has its score lowered to the next 32-bit float, so the file ranks as the run does, and
    pytrec_eval (trec_eval's code) on the file gives the run's figures."""
    import numpy as np
    import pandas as pd
    import pytrec_eval

    from logicrank.pipelines.evaluation.core import run_metrics
    from logicrank.pipelines.evaluation.measures import parse_measures

    pairs = pd.DataFrame({"query_id": ["q1"] * 5 + ["q2"] * 2, "doc_id": ["a", "b", "c", "e", "d", "x", "y"],
                          "score": [0.99, 0.99, 0.99, 0.5, 0.5, 0.7, 0.7], "tiebreak": [1, 2, 3, 4, 5, 2, 1]})
    run = rank_pairs(pairs, 10, "orlog", "r")
    assert run.column("doc_id").to_pylist() == ["a", "b", "c", "e", "d", "y", "x"]  # the base rank's order
    scores = run.column("score").to_pylist()
    assert scores[0] == pytest.approx(0.99, abs=1e-6) and scores[0] > scores[1] > scores[2] > 0.5 and scores[2] == pytest.approx(0.99, abs=1e-6)
    # ties already in trec_eval's order (doc_id descending) keep their score, as its 32 bits (the key they are ranked by)
    assert scores[3:5] == [0.5, 0.5] and scores[5:] == [float(np.float32(0.7))] * 2
    back = read_run(write_trec_run(run, tmp_path / "r.trec"))
    assert back.column("doc_id").to_pylist() == run.column("doc_id").to_pylist()
    qrels = pa.table({"query_id": ["q1", "q2"], "doc_id": ["a", "y"], "relevance": [1, 1]})
    measures = parse_measures(["MRR", "P@1", "nDCG@10"])
    ours = [run_metrics(r, qrels, measures, run_id="r").column("value").to_pylist() for r in (run, back)]
    assert ours[0] == ours[1] and ours[0][-3:] == [1.0, 1.0, 1.0]
    lines = [line.split() for line in (tmp_path / "r.trec").read_text().splitlines()]
    trec = pytrec_eval.RelevanceEvaluator({"q1": {"a": 1}, "q2": {"y": 1}}, {"recip_rank"}).evaluate(
        {q: {d: float(s) for q2, _, d, _, s, _ in lines if q2 == q} for q in ("q1", "q2")})
    assert trec["q1"]["recip_rank"] == trec["q2"]["recip_rank"] == 1.0


def test_rrf_fuses_by_reciprocal_rank():
    def run(docs):
        return pa.table({"query_id": ["q"] * len(docs), "doc_id": docs, "rank": pa.array(range(1, len(docs) + 1), pa.int32())})

    fused = rrf([run(["a", "b", "c"]), run(["c", "a"])], k=10, rrf_k=60)
    assert fused.column("doc_id").to_pylist() == ["a", "c", "b"]
    assert fused.column("score")[0].as_py() == pytest.approx(1 / 61 + 1 / 62)


def test_a_queries_table_is_checked_as_a_queries_file_is(tmp_path):
    import pyarrow.parquet as pq

    from logicrank.pipelines.io import queries_table

    t = queries_table(pa.table({"qid": [1, 2], "text": ["a", "b"], "extra": [0, 0]}), "notebook")
    assert t.column_names == ["query_id", "text", "logical_query"] and t.column("query_id").to_pylist() == ["1", "2"]
    with pytest.raises(TopicsError, match=r"^notebook: duplicate query ids \['1'\]\.$"):
        queries_table(pa.table({"query_id": [1, 1, 2], "text": ["a", "b", "c"]}), "notebook")
    pq.write_table(pa.table({"query_id": ["x", "x"], "text": ["a", "b"]}), tmp_path / "q.parquet")
    with pytest.raises(TopicsError, match=r"duplicate query ids \['x'\]"):  # a Parquet file was read without this check
        read_queries(tmp_path / "q.parquet")
    pq.write_table(pa.table({"query_id": ["x"], "text": ["a"]}), tmp_path / "Q.PARQUET")  # (a name in capitals: Parquet still)
    assert read_queries(tmp_path / "Q.PARQUET").column("query_id").to_pylist() == ["x"]


@pytest.mark.parametrize("gzipped", [False, True])
def test_qrels_from_a_pipe_lose_none_of_their_first_bytes(gzipped):
    """`evaluate <(zcat qrels.gz) ...`: the file is a pipe, read once. Its first bytes are
    peeked at to tell gzip, never read and dropped (a first open to look at them swallowed a
    buffer's worth of judgements, 8 KB)."""
    import gzip

    data = "".join(f"301 0 DOC-{i} 1\n" for i in range(2000)).encode()  # 34 KB: held whole by the pipe (64 KB)
    qrels = _read_piped(gzip.compress(data) if gzipped else data, read_qrels)
    assert qrels.column("doc_id").to_pylist() == [f"DOC-{i}" for i in range(2000)]


def _read_piped(data: bytes, read):
    """``read`` of a pipe holding ``data`` (under the 64 KB a pipe holds), its write end closed."""
    import os

    r, w = os.pipe()
    try:
        os.write(w, data)
        os.close(w)
        return read(f"/dev/fd/{r}")
    finally:
        os.close(r)


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "trec"])
def test_queries_from_a_pipe_are_read_once(kind):
    """`retrieve --queries <(zcat queries.jsonl.gz)`: the file is a pipe, which cannot be rewound
    after its first character tells JSONL from TREC topics (a seek failed: "underlying stream is
    not seekable"), nor opened again to read its records."""
    import gzip

    if kind == "trec":
        data = "".join(f"<top>\n<num> Number: {i}\n<title> topic {i}\n</top>\n" for i in range(300, 900)).encode()
        ids = [str(i) for i in range(300, 900)]
    else:
        data = "".join(f'{{"_id": "q{i}", "text": "query {i}"}}\n' for i in range(1500)).encode()  # 52 KB: held whole by the pipe
        ids = [f"q{i}" for i in range(1500)]
    queries = _read_piped(gzip.compress(data) if kind.endswith(".gz") else data, read_queries)
    assert queries.column("query_id").to_pylist() == ids


def test_text_files_are_gunzipped_by_their_first_bytes_whatever_their_names(tmp_path):
    """Queries, qrels and TREC runs gzipped under a plain name (a download saved without .gz),
    or plain under a .gz name, read as what their bytes are."""
    import gzip

    with gzip.open(tmp_path / "queries.jsonl", "wt") as f:
        f.write('{"_id": "1", "text": "a query"}\n')
    with gzip.open(tmp_path / "qrels.txt", "wt") as f:
        f.write("1 0 d1 1\n")
    with gzip.open(tmp_path / "run.trec", "wt") as f:
        f.write("1 Q0 d1 1 2.0 r\n")
    (tmp_path / "queries.tsv.gz").write_text("2\tplain text\n")
    assert read_queries(tmp_path / "queries.jsonl").column("text").to_pylist() == ["a query"]
    assert read_queries(tmp_path / "queries.tsv.gz").column("query_id").to_pylist() == ["2"]
    assert read_qrels(tmp_path / "qrels.txt").to_pylist() == [{"query_id": "1", "doc_id": "d1", "relevance": 1}]
    assert read_run(tmp_path / "run.trec").column("doc_id").to_pylist() == ["d1"]


def test_ids_that_are_not_text_or_integers_are_refused_in_any_form_not_written_as_no_qrels_writes_them(tmp_path):
    """A Parquet file, an Arrow table, a DataFrame or dicts: ids checked as a JSONL query's are.
    Integers read as their decimal text; 1048585.0 (a float id column), a decimal, a bool, a
    blank or space-padded id or a text that is not text are refused, never '1048585.0'."""
    import decimal

    import pandas as pd
    import pyarrow.parquet as pq

    from logicrank.api import as_queries

    assert as_queries(pd.DataFrame({"query_id": [1048585], "text": ["a"]})).column("query_id").to_pylist() == ["1048585"]
    assert as_queries(pd.DataFrame({"qid": ["q1", 2], "text": ["a", "b"]})).column("query_id").to_pylist() == ["q1", "2"]
    # numpy's integers, a Categorical (dictionary) column, Arrow's string_view: read as they were before the checks
    import numpy as np

    assert as_queries([{"query_id": np.int64(1), "text": "a"}, {"query_id": "x", "text": "b"}]).column("query_id").to_pylist() == ["1", "x"]
    assert as_queries(pd.DataFrame({"query_id": pd.Categorical(["a", "b"]), "text": ["x", "y"]})).column("query_id").to_pylist() == ["a", "b"]
    view = pa.table({"query_id": pa.array(["a"], pa.string_view()), "text": pa.array(["x"], pa.string_view())})
    assert as_queries(view).to_pylist() == [{"query_id": "a", "text": "x", "logical_query": None}]
    refused = [
        (pd.DataFrame({"query_id": [1048585.0], "text": ["a"]}), "column 'query_id' is double"),
        ([{"query_id": 1.0, "text": "a"}], "column 'query_id' is double"),
        ([{"_id": True, "text": "a"}], "column 'query_id' is bool"),
        (pa.table({"query_id": pa.array([decimal.Decimal("1.00")]), "text": ["a"]}), "column 'query_id' is decimal128(3, 2)"),
        (pa.table({"query_id": [" 1"], "text": ["a"]}), "the query id ' 1' is blank or has surrounding whitespace"),
        (pa.table({"query_id": [""], "text": ["a"]}), "the query id '' is blank"),
        (pa.table({"query_id": ["1"], "text": [5]}), "column 'text' is int64; give strings"),
    ]
    for queries, says in refused:
        with pytest.raises(TopicsError) as exc:
            as_queries(queries)
        assert says in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    pq.write_table(pa.table({"query_id": [1.0], "text": ["a"]}), tmp_path / "q.parquet")
    with pytest.raises(TopicsError, match=r"q.parquet: column 'query_id' is double"):
        read_queries(tmp_path / "q.parquet")


def test_the_topics_field_picks_a_jsonl_key_or_parquet_column_and_is_refused_where_there_is_none(tmp_path):
    """ir_datasets exports TREC topics as JSONL (query_id, title, description, narrative): the
    topics field desc reads the description, not silently the title; a file without that
    field, or a TSV file (one text a query), is refused in one line."""
    import json

    import pyarrow.parquet as pq

    robust = tmp_path / "robust04.jsonl"
    robust.write_text(json.dumps({"query_id": "301", "title": "International Organized Crime", "description": "Identify organizations.",
                                  "narrative": "A relevant document must name one."}) + "\n")
    assert [read_queries(robust, f).column("text").to_pylist() for f in ("title", "desc", "narr")] == [
        ["International Organized Crime"], ["Identify organizations."], ["A relevant document must name one."]]
    beir = tmp_path / "queries.jsonl"
    beir.write_text('{"_id": "1", "text": "a query"}\n')
    with pytest.raises(TopicsError, match=r"line 1 is not a JSON object .*the topics field desc"):
        read_queries(beir, "desc")
    pq.write_table(pa.table({"query_id": ["1"], "text": ["t"], "description": ["d"]}), tmp_path / "q.parquet")
    assert read_queries(tmp_path / "q.parquet", "desc").column("text").to_pylist() == ["d"]
    with pytest.raises(TopicsError, match=r"topics field 'narr', but no column narr or narrative"):
        read_queries(tmp_path / "q.parquet", "narr")
    pq.write_table(pa.table({"query_id": ["301"], "title": ["crime"], "description": ["d"]}), tmp_path / "topics.parquet")
    assert [read_queries(tmp_path / "topics.parquet", f).column("text").to_pylist() for f in ("title", "desc")] == [["crime"], ["d"]]
    (tmp_path / "q.tsv").write_text("1\ta query\n")
    with pytest.raises(TopicsError, match=r"a TSV query file holds one text a query"):
        read_queries(tmp_path / "q.tsv", "desc")


BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, as Windows tools write one at the start of a file


def test_a_byte_order_mark_is_not_part_of_the_first_id_or_header(tmp_path):
    """Queries (JSONL plain and gzipped, TSV), qrels (BEIR TSV with its header, TREC, gzipped)
    and a TREC run starting with a BOM read as the same files without it: ids exact."""
    import gzip

    queries = b'{"_id": "q1", "text": "first"}\n{"_id": "q2", "text": "second"}\n'
    (tmp_path / "queries.jsonl").write_bytes(BOM + queries)
    (tmp_path / "queries.jsonl.gz").write_bytes(gzip.compress(BOM + queries))
    (tmp_path / "queries.tsv").write_bytes(BOM + b"q1\tfirst\nq2\tsecond\n")
    for name in ("queries.jsonl", "queries.jsonl.gz", "queries.tsv"):
        q = read_queries(tmp_path / name)
        assert q.column("query_id").to_pylist() == ["q1", "q2"] and q.column("text").to_pylist() == ["first", "second"], name
    beir = b"query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\n"
    (tmp_path / "beir.tsv").write_bytes(BOM + beir)
    (tmp_path / "beir.tsv.gz").write_bytes(gzip.compress(BOM + beir))
    (tmp_path / "qrels.trec").write_bytes(BOM + b"q1 0 d1 1\nq2 0 d2 2\n")
    for name in ("beir.tsv", "beir.tsv.gz", "qrels.trec"):
        assert read_qrels(tmp_path / name).to_pylist() == [{"query_id": "q1", "doc_id": "d1", "relevance": 1},
                                                           {"query_id": "q2", "doc_id": "d2", "relevance": 2}], name


@pytest.mark.parametrize("header", ["qid\tquery", "query_id\ttext", "QID\tTEXT"])
def test_a_tsv_queries_files_header_is_refused_not_read_as_a_query(tmp_path, header):
    (tmp_path / "q.tsv").write_text(f"{header}\nq1\tfirst\n")
    with pytest.raises(TopicsError, match=r"line 1 is a header .*remove it"):
        read_queries(tmp_path / "q.tsv")
    (tmp_path / "q.tsv").write_text("q1\tfirst\nid\tthe query named id, after the first\n")  # only a first line is a header
    assert read_queries(tmp_path / "q.tsv").column("query_id").to_pylist() == ["q1", "id"]
    (tmp_path / "run.trec").write_bytes(BOM + b"q1 Q0 d1 1 2.5 tag\nq1 Q0 d2 2 1.5 tag\n")
    run = read_run(tmp_path / "run.trec")
    assert run.column("query_id").to_pylist() == ["q1", "q1"] and run.column("doc_id").to_pylist() == ["d1", "d2"]


def test_a_bad_line_of_a_file_with_a_byte_order_mark_is_named(tmp_path):
    (tmp_path / "qrels.tsv").write_bytes(BOM + b"query-id\tcorpus-id\tscore\nq1\td1\n")
    with pytest.raises(TopicsError) as exc:
        read_qrels(tmp_path / "qrels.tsv")
    assert str(exc.value).startswith(f"qrels {tmp_path / 'qrels.tsv'}: line 2 has 2 tab-separated field(s)")
    (tmp_path / "q.jsonl").write_bytes(BOM + b'{"_id": "q1"}\n')
    with pytest.raises(TopicsError) as exc:
        read_queries(tmp_path / "q.jsonl")
    assert str(exc.value).startswith(f"queries {tmp_path / 'q.jsonl'}: line 1 is not a JSON object with an id")


def test_trec_files_split_on_ascii_spaces_only_as_trec_eval_does(tmp_path):
    """Python's str.split splits on (and strips) Unicode spaces too: a docno ending in a
    no-break space, or holding an ideographic space, was read as another id than trec_eval
    reads. TREC runs and qrels split on ASCII spaces and tabs only."""
    run = tmp_path / "r.trec"
    run.write_text("q1 Q0 d1\u00a0 1 2.0 r\nq1 Q0 d\u3000two 2 1.0 r\nq1\tQ0\td3\t3\t0.5\tr\n", encoding="utf-8")
    assert read_run(run).column("doc_id").to_pylist() == ["d1\u00a0", "d\u3000two", "d3"]
    qrels = tmp_path / "q.trec"
    qrels.write_text("q1 0 d1\u00a0 1\nq1 0 d\u3000two 0\n", encoding="utf-8")
    assert read_qrels(qrels).column("doc_id").to_pylist() == ["d1\u00a0", "d\u3000two"]
    back = read_run(write_trec_run(read_run(run), tmp_path / "again.trec"))  # such an id is one field of a TREC line: written
    assert back.column("doc_id").to_pylist() == ["d1\u00a0", "d\u3000two", "d3"]
    # an ASCII line too: str.split splits on the separator controls \x1c-\x1f, which trec_eval leaves in an id (every
    # column after it moved: the docno read "doc", the score the rank)
    ascii_run = tmp_path / "a.trec"
    ascii_run.write_text("q1 Q0 doc\x1fx 1 2.0 r\n", encoding="utf-8")
    assert read_run(ascii_run).column("doc_id").to_pylist() == ["doc\x1fx"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), None])
def test_a_score_that_is_no_number_is_refused_even_where_k_would_cut_it_away(bad):
    """OrLog at k=3 over four candidates, one posterior NaN: the NaN sorted last and was cut
    away with the run's k, the base run's top document gone from the run without a word (the
    run's own check sees only the rows kept). Refused, the query and document named."""
    import pandas as pd

    from logicrank.schemas.errors import JobFailed

    pairs = pd.DataFrame({"query_id": ["q"] * 4, "doc_id": ["d1", "d2", "d3", "d4"], "score": [bad, 0.5, 0.4, 0.3],
                          "tiebreak": [1, 2, 3, 4]})
    with pytest.raises(JobFailed, match=r"^orlog: 1 score\(s\) are missing, NaN or infinite, e\.g\. .* for query 'q', doc 'd1'"):
        rank_pairs(pairs, 3, "orlog", "orlog")
    assert rank_pairs(pairs.iloc[1:], 3, "orlog", "orlog").column("doc_id").to_pylist() == ["d2", "d3", "d4"]
