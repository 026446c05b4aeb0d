import gzip
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.corpus import (
    PARSED,
    CorpusError,
    check_sources,
    content_hash,
    iter_corpus,
    list_sources,
    validate_record,
)
from tests.conftest import write_jsonl


def _read_all(location, **kw) -> pa.Table:
    return pa.concat_tables(list(iter_corpus(location, **kw)))


ROWS = [{"_id": "a", "title": "T", "text": "alpha"}, {"_id": "b", "text": "beta", "metadata": {"k": 1}}]


def test_jsonl_plain_and_gzip_read_the_same(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", ROWS)
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in ROWS)
    plain, gz = _read_all(str(tmp_path / "c.jsonl")), _read_all(str(tmp_path / "c.jsonl.gz"))
    assert plain.schema == PARSED
    assert plain.drop(["_source"]).equals(gz.drop(["_source"]))
    assert plain.column("doc_id").to_pylist() == ["a", "b"]
    assert plain.column("metadata").to_pylist() == [None, '{"k": 1}']
    assert plain.column("_reason").to_pylist() == [None, None]
    assert plain.column("_location").to_pylist() == [1, 2]


def test_a_directorys_files_in_any_compression_arrow_reads_are_read_never_skipped(tmp_path):
    """In a directory read as `auto`, `part-1.jsonl.bz2` and `part-2.jsonl.zst` were files of no
    known kind and skipped without a word: every compression Arrow's streams undo is read."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_jsonl(mixed / "part-0.jsonl", [ROWS[0]])
    for i, (suffix, codec) in enumerate((("bz2", "bz2"), ("zst", "zstd"), ("lz4", "lz4"), ("gz", "gzip")), 1):
        with pa.CompressedOutputStream(str(mixed / f"part-{i}.jsonl.{suffix}"), codec) as out:
            out.write(json.dumps({"_id": f"d{i}", "text": f"text {i}"}).encode() + b"\n")
    assert _read_all(str(mixed)).column("doc_id").to_pylist() == ["a", "d1", "d2", "d3", "d4"]


def test_the_publishers_jsonl_layouts_give_each_record_its_own_id_and_text(tmp_path):
    """As their publishers write them: MS MARCO v2's passage files (``msmarco_passage_00.gz``,
    no format in the name: read with --format jsonl; each passage's ``pid`` beside its
    document's ``docid``), v2.1's segments (``docid`` and ``segment``), the Washington Post's
    ``.jl`` articles (TREC Core 2018: the text in ``contents`` items, only the
    ``sanitized_html`` and ``tweet`` ones), and a list of paragraphs. No passage takes its
    document's id (each would be a duplicate_id reject but the first)."""
    v2 = tmp_path / "msmarco_v2_passage"
    v2.mkdir()
    with gzip.open(v2 / "msmarco_passage_00.gz", "wt") as f:
        for pid, text in (("msmarco_passage_00_0", "The hero of the story."), ("msmarco_passage_00_49", "Another passage.")):
            f.write(json.dumps({"pid": pid, "passage": text, "spans": "(0,22)", "docid": "msmarco_doc_00_0"}) + "\n")
    with pytest.raises(CorpusError, match="no JSONL"):
        list_sources(str(v2))  # (its name marks no format)
    (v2 / "README").write_text("MS MARCO v2 passages\n")  # files beside them that are not compressed: not read
    (v2 / "qrels.dev").write_text("1 0 msmarco_passage_00_0 1\n")
    assert [s.path.rsplit("/", 1)[-1] for s in list_sources(str(v2), "jsonl")] == ["msmarco_passage_00.gz"]
    t = _read_all(str(v2), fmt="jsonl")
    assert list(zip(t.column("doc_id").to_pylist(), t.column("text").to_pylist(), t.column("_reason").to_pylist(), strict=True)) == [
        ("msmarco_passage_00_0", "The hero of the story.", None), ("msmarco_passage_00_49", "Another passage.", None)]

    segment = {"docid": "msmarco_v2.1_doc_00_0#0_0", "url": "http://x", "title": "T", "headings": "H", "segment": "seg", "start_char": 0}
    article = {"id": "b2e89334", "article_url": "https://www.washingtonpost.com/x", "title": "Danny Coale", "published_date": 1325376562000,
               "contents": [{"content": "Colleges", "type": "kicker"}, {"content": 1325376562000, "type": "date"}, None,
                            {"content": "<b>Virginia Tech</b> receivers &amp; more", "type": "sanitized_html", "subtype": "paragraph"},
                            {"type": "image", "imageURL": "x", "fullcaption": "a caption"},
                            {"content": "a <a href=\"x\">tweet</a>", "type": "tweet"}],
               "type": "article", "source": "The Washington Post"}
    article["contents"].append({"content": "an item without a type"})  # skipped, as Anserini skips it
    chunk = {"docid": "D1", "pid": 0, "text": "a chunk numbered by pid"}  # a pid that is not the passage's own id (no passage)
    assert validate_record({"_id": "a", "title": "T", "contents": [None]}, 100)[1] is None  # an article of null items: its title alone
    assert "a pid is an id only beside a passage" in validate_record({"pid": 7, "text": "x"}, 100)[2]
    write_jsonl(tmp_path / "wapo" / "TREC_Washington_Post_collection.v2.jl", [segment, article, {"_id": "k", "text": ["p1", "p2"]},
                                                                               {"_id": "n", "text": ["p1", 2]}, chunk])
    t = _read_all(str(tmp_path / "wapo"))
    got = list(zip(*(t.column(c).to_pylist() for c in ("doc_id", "title", "text", "_reason")), strict=True))
    assert got == [("msmarco_v2.1_doc_00_0#0_0", "T", "H\nseg", None), ("b2e89334", "Danny Coale", "Virginia Tech receivers & more\na tweet", None),
                   ("k", None, "p1\np2", None), ("n", None, None, "bad_field_type"), ("D1", None, "a chunk numbered by pid", None)]


def test_ms_marco_v2_documents_keep_their_headings_as_text_and_their_url(tmp_path):
    """MS MARCO v2's and v2.1's documents (``msmarco_doc_00.gz``: docid, url, title, headings,
    body) and v2.1's segments: the headings are text, as Anserini indexes them, before the
    body; the URL is kept in the metadata, as v1's documents keep it. Blank headings add nothing."""
    rows = [{"url": "http://a.example/x", "title": "Hero", "headings": "Hero\nEarly life\n", "body": "Born in 1900.", "docid": "msmarco_doc_00_0"},
            {"url": "http://b.example/", "title": "B", "headings": " ", "body": "Body only.", "docid": "msmarco_doc_00_1"},
            {"url": "http://c.example/", "title": "C", "headings": "Heading", "segment": "A segment.", "start_char": 0, "end_char": 10,
             "docid": "msmarco_v2.1_doc_00_2#0_0"}]
    d = tmp_path / "msmarco_v2_doc"
    d.mkdir()
    with gzip.open(d / "msmarco_doc_00.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    t = _read_all(str(d), fmt="jsonl")
    got = list(zip(*(t.column(c).to_pylist() for c in ("doc_id", "title", "text", "metadata", "_reason")), strict=True))
    assert got == [("msmarco_doc_00_0", "Hero", "Hero\nEarly life\n\nBorn in 1900.", '{"url": "http://a.example/x"}', None),
                   ("msmarco_doc_00_1", "B", "Body only.", '{"url": "http://b.example/"}', None),
                   ("msmarco_v2.1_doc_00_2#0_0", "C", "Heading\nA segment.", '{"url": "http://c.example/"}', None)]


def test_a_directory_whose_files_include_queries_is_refused_not_indexed_with_them(tmp_path):
    """A directory of JSONL files where one is a query file (`queries.dev.jsonl` beside the
    collection), or of BEIR sets one per subdirectory (CQADupStack's layout): its queries would
    be indexed as documents; it is refused naming them."""
    mixed = tmp_path / "mixed"
    write_jsonl(mixed / "collection.jsonl", ROWS)
    write_jsonl(mixed / "queries.dev.jsonl", [{"_id": "q1", "text": "a query"}])
    with pytest.raises(CorpusError, match=r"holds query or relevance files \(queries.dev.jsonl\), not documents"):
        list_sources(str(mixed))
    cqa = tmp_path / "cqadupstack"
    for forum in ("android", "english"):
        write_jsonl(cqa / forum / "corpus.jsonl", ROWS)
        write_jsonl(cqa / forum / "queries.jsonl", [{"_id": "q1", "text": "a query"}])
    with pytest.raises(CorpusError, match=r"holds query or relevance files \(android/queries.jsonl, english/queries.jsonl\)"):
        list_sources(str(cqa))
    assert [s.path.rsplit("/", 2)[-2:] for s in list_sources(str(cqa / "android"))] == [["android", "corpus.jsonl"]]
    # Hugging Face's layout of a BEIR set: the queries in a folder of their own, under a file name of no meaning
    hf = tmp_path / "hf"
    for part in ("corpus", "queries"):
        (hf / part / part).mkdir(parents=True)
        pq.write_table(pa.table({"_id": ["1"], "title": [""], "text": [f"a {part} row"]}), hf / part / part / "0000.parquet")
    with pytest.raises(CorpusError, match=r"holds query or relevance files \(queries/queries/0000.parquet\)"):
        list_sources(str(hf))
    assert _read_all(str(hf / "corpus")).column("text").to_pylist() == ["a corpus row"]


def test_beir_dir_parquet_and_uri(tmp_path):
    beir = tmp_path / "beir"
    write_jsonl(beir / "corpus.jsonl", ROWS)
    write_jsonl(beir / "queries.jsonl", [{"_id": "q", "text": "x"}])  # must be ignored
    assert [s.kind for s in list_sources(str(beir))] == ["jsonl"]
    assert _read_all(str(beir)).num_rows == 2

    pq.write_table(pa.table({"doc_id": ["x", "y"], "text": ["one", ""]}), tmp_path / "p.parquet")
    t = _read_all(str(tmp_path / "p.parquet"))
    assert t.column("_reason").to_pylist() == [None, "empty_text"]
    assert t.column("_location").to_pylist() == [0, 1]

    uri = (tmp_path / "beir").as_uri()  # a pyarrow filesystem URI
    via_uri = _read_all(uri)
    assert via_uri.column("doc_id").to_pylist() == ["a", "b"]
    assert via_uri.column("_source")[0].as_py().startswith("file://")


def test_a_title_alone_is_a_document_and_a_lone_surrogate_is_a_reject_not_a_crash(tmp_path):
    """BEIR corpora hold documents with a title and no text (an abstract missing): they are
    documents, with empty text; a record with neither is ``empty_text``. JSON can escape half of
    a surrogate pair, which is no character: that record is ``invalid_utf8`` (its id kept where
    the id is text) and the lines around it are read."""
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join([
        '{"_id": "t1", "title": "Only a title", "text": ""}',
        '{"_id": "t2", "title": "No text key"}',
        '{"_id": "e1", "title": "  ", "text": ""}',
        '{"_id": "s1", "text": "lone \\ud800 surrogate"}',
        '{"_id": "s2", "title": "\\udc00", "text": "t"}',
        '{"_id": "\\ud800x", "text": "t"}',
        '{"_id": "ok", "text": "a pair \\ud83d\\ude00 is fine"}',
        '{"doc_id": "c1", "title": "CORD-19", "doi": "10.1/x", "abstract": "its text"}',  # ir_datasets' exports: the abstract is the text
        '{"doc_id": "n1", "title": "A trial", "summary": "its text", "url": "http://x"}',  # a text under a name not read: no title-only document
    ]) + "\n")
    t = _read_all(str(path))
    got = list(zip(*(t.column(c).to_pylist() for c in ("doc_id", "title", "text", "_reason")), strict=True))
    assert got == [("t1", "Only a title", "", None), ("t2", "No text key", "", None), ("e1", None, None, "empty_text"),
                   ("s1", None, None, "invalid_utf8"), ("s2", None, None, "invalid_utf8"), (None, None, None, "invalid_utf8"),
                   ("ok", None, "a pair \U0001F600 is fine", None), ("c1", "CORD-19", "its text", None), ("n1", None, None, "empty_text")]
    assert "its other text fields (summary, url) are not read" in t.column("_detail").to_pylist()[-1]
    trec = tmp_path / "c.trec"
    trec.write_text("<DOC>\n<DOCNO>T</DOCNO>\n<TITLE>Title only</TITLE>\n<TEXT>\n</TEXT>\n</DOC>\n")
    assert _read_all(str(trec)).select(["doc_id", "title", "text", "_reason"]).to_pylist() == [
        {"doc_id": "T", "title": "Title only", "text": "", "_reason": None}]


def test_hidden_files_and_folders_are_not_read_and_metadata_of_any_parquet_type_is_kept(tmp_path):
    """A notebook's `.ipynb_checkpoints/` copy of a part sorted first, so its stale rows were
    indexed and the real ones became duplicate_id rejects: hidden files and folders are not
    read, in any format. A Parquet metadata struct holding a timestamp or a decimal was a
    TypeError's traceback: such values are kept as text (ISO 8601, the decimal as written)."""
    import datetime
    import decimal

    parts = tmp_path / "parts"
    write_jsonl(parts / "part-0.jsonl", [{"_id": "a", "text": "new text"}])
    write_jsonl(parts / ".ipynb_checkpoints" / "part-0-checkpoint.jsonl", [{"_id": "a", "text": "stale text"}])
    write_jsonl(parts / ".part-1.jsonl", [{"_id": "b", "text": "hidden"}])
    for fmt in ("auto", "jsonl"):
        t = _read_all(str(parts), fmt=fmt)
        assert t.column("text").to_pylist() == ["new text"] and t.column("_reason").to_pylist() == [None], fmt
    when = datetime.datetime(2020, 3, 1, 12, 30, tzinfo=datetime.UTC)
    meta = pa.array([{"published": when, "price": decimal.Decimal("1.50")}],
                    pa.struct([("published", pa.timestamp("us", tz="UTC")), ("price", pa.decimal128(5, 2))]))
    pq.write_table(pa.table({"_id": ["m"], "text": ["t"], "metadata": meta}), tmp_path / "m.parquet")
    t = _read_all(str(tmp_path / "m.parquet"))
    assert t.column("_reason").to_pylist() == [None]
    assert json.loads(t.column("metadata")[0].as_py()) == {"price": "1.50", "published": "2020-03-01T12:30:00+00:00"}


def test_a_line_not_utf8_names_its_id_where_the_id_is(tmp_path):
    """A Latin-1 byte in a record's text: the line is an `invalid_utf8` reject that names its
    id, so a re-index holds the stored document of that id instead of deleting it as absent; a
    line whose id holds the byte names none (an id is never guessed)."""
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"_id": "ok", "text": "fine"}\n'
                     b'{"title": "caf\xe9", "_id": "x1", "text": "t"}\n'  # the id after the bad byte
                     b'{"_id": "caf\xe9", "text": "t"}\n'
                     b'{"_id": "x2", "text": "caf\xe9", \n')  # not JSON either: the id its record starts with, as a line not JSON
    t = _read_all(str(path))
    assert list(zip(t.column("doc_id").to_pylist(), t.column("_reason").to_pylist(), strict=True)) == [
        ("ok", None), ("x1", "invalid_utf8"), (None, "invalid_utf8"), ("x2", "invalid_utf8")]
    binary = pa.table({"_id": pa.array([b"ok", b"x1", b"caf\xe9"], pa.binary()), "text": pa.array([b"fine", b"caf\xe9", b"t"], pa.binary())})
    pq.write_table(binary, tmp_path / "b.parquet")  # Parquet binary columns, as some writers leave text
    t = _read_all(str(tmp_path / "b.parquet"))
    assert list(zip(t.column("doc_id").to_pylist(), t.column("text").to_pylist(), t.column("_reason").to_pylist(), strict=True)) == [
        ("ok", "fine", None), ("x1", None, "invalid_utf8"), (None, None, "invalid_utf8")]


def test_every_bad_row_is_kept_with_reason_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [
        b'{"_id": "ok1", "text": "fine"}',
        b'{"_id": "x", "text": "unterminated',
        b'{"text": "no id"}',
        b'{"_id": "  ", "text": "blank id"}',
        b'{"_id": "e", "text": "   "}',
        b'{"_id": "u", "text": "bad \xff\xfe bytes"}',
        b'["not", "an", "object"]',
        b'{"_id": ["list"], "text": "t"}',
        b'{"_id": "big", "text": "' + b"y" * 200 + b'"}',
        b"",
        b'{"_id": 7, "text": "int ids are fine"}',
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    t = _read_all(str(path), max_doc_bytes=100, batch_rows=3)
    got = list(zip(t.column("_location").to_pylist(), t.column("_reason").to_pylist(), strict=True))
    assert got == [
        (1, None),
        (2, "malformed_json"),
        (3, "missing_id"),
        (4, "missing_id"),
        (5, "empty_text"),
        (6, "invalid_utf8"),
        (7, "malformed_json"),
        (8, "bad_field_type"),
        (9, "oversized"),
        (11, None),
    ]
    assert t.column("doc_id").to_pylist()[-1] == "7"
    assert all(d for d in t.column("_detail").to_pylist()[1:-1])
    # a line that is not JSON names the id its record starts with, as an overlong line does: the stored document of that
    # id is held by the re-index, not taken for absent and deleted (its id was dropped); an object that is no record names none
    assert t.column("doc_id").to_pylist()[1] == "x" and t.column("doc_id").to_pylist()[6] is None


def test_a_json_integer_past_pythons_limit_is_a_reject_not_a_crash(tmp_path):
    """json.loads raises a plain ValueError (not JSONDecodeError) for an integer of more than
    4,300 digits: the run failed with a traceback, reading none of the file's other lines."""
    path = tmp_path / "c.jsonl"
    path.write_text('{"_id": "a", "text": "fine"}\n{"_id": "b", "text": "x", "n": ' + "9" * 5000 + '}\n{"_id": "c", "text": "ok"}\n')
    t = _read_all(str(path))
    assert list(zip(t.column("doc_id").to_pylist(), t.column("_reason").to_pylist(), strict=True)) == [
        ("a", None), ("b", "malformed_json"), ("c", None)]
    assert "4300" in t.column("_detail").to_pylist()[1]
    # the same in a line that is not UTF-8 (a Latin-1 byte), and a nesting too deep: rejects naming their ids, not a traceback
    # (under Python's default recursion limit: a plugin or library that raised it lets 5,000 levels parse)
    path.write_bytes(b'{"_id": "a", "text": "caf\xe9", "n": ' + b"9" * 5000 + b'}\n{"_id": "d", "text": "x", "n": ' + b"[" * 5000
                     + b"]" * 5000 + b'}\n{"_id": "e", "text": "caf\xe9", "n": ' + b"[" * 5000 + b"]" * 5000 + b"}\n")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        t = _read_all(str(path))
    finally:
        sys.setrecursionlimit(limit)
    assert list(zip(t.column("doc_id").to_pylist(), t.column("_reason").to_pylist(), strict=True)) == [
        ("a", "invalid_utf8"), ("d", "malformed_json"), ("e", "invalid_utf8")]


def test_a_tsv_line_of_other_fields_names_its_first_field_as_its_id(tmp_path):
    """A TSV corpus line whose text holds a tab is a ``bad_tsv_row``; it names its first field,
    so that the stored document of that id is held by a re-index, not deleted as absent."""
    path = tmp_path / "c.tsv"
    path.write_text("a\tfine\nl\tnew\ttext\nnotab\n", encoding="utf-8")
    t = _read_all(str(path), fmt="tsv")
    assert list(zip(t.column("doc_id").to_pylist(), t.column("_reason").to_pylist(), strict=True)) == [
        ("a", None), ("l", "bad_tsv_row"), (None, "bad_tsv_row")]


def test_a_corpus_directory_holding_a_link_to_nothing_is_refused(tmp_path):
    """A link to nothing (git-annex or DVC content never fetched) was left out of Arrow's listing
    without a word: its documents were read as absent and deleted. Refused, naming it; a link to
    a directory is followed, a hidden one is not read."""
    d = tmp_path / "d"
    (tmp_path / "real").mkdir()
    write_jsonl(tmp_path / "real" / "b.jsonl", [{"_id": "b", "text": "t"}])
    d.mkdir()
    write_jsonl(d / "a.jsonl", [{"_id": "a", "text": "t"}])
    (d / "sub").symlink_to(tmp_path / "real")
    (d / ".hidden.jsonl").symlink_to(tmp_path / "nowhere-hidden")
    assert sorted(s.path.rsplit("/", 1)[-1] for s in list_sources(str(d))) == ["a.jsonl", "b.jsonl"]
    (d / "README.md").symlink_to(tmp_path / "nowhere-readme")  # a file the reader would not read: no matter
    (d / "queries.tsv").symlink_to(tmp_path / "nowhere-queries")
    assert sorted(s.path.rsplit("/", 1)[-1] for s in list_sources(str(d))) == ["a.jsonl", "b.jsonl"]
    (d / "broken.jsonl").symlink_to(tmp_path / "nowhere")
    with pytest.raises(CorpusError, match=r"broken.jsonl is a link to nothing"):
        list_sources(str(d))


def test_an_overlong_line_is_skipped_without_losing_the_next_and_names_the_id_it_starts_with(tmp_path):
    """A line past the reader's limit is never read whole, but the id its record starts with is
    read from its head: the reject names it, so a stored document of that id is held, as one
    rejected for its size within the limit is, not taken for absent and deleted (a helper's
    audit). Where the head cannot tell the id (no id key first, two id keys, an id with
    spaces), none is named."""
    path = tmp_path / "long.jsonl"
    text = b"z" * 3_000_000  # past the limit, and past the reader's 1 MiB reads
    lines = [b'{"_id": "h", "text": "' + text + b'"}', b'{"_id": "after", "text": "kept"}', b'{"docno": 12, "text": "' + text + b'"}',
             b'{"text": "' + text + b'", "_id": "late"}', b'{"id": "a", "_id": "b", "text": "' + text + b'"}',
             b'{"_id": " padded", "text": "' + text + b'"}', b'{"_id": "short", "text": "' + b"y" * 2000 + b'"}']
    path.write_bytes(b"\n".join(lines) + b"\n")
    t = _read_all(str(path), max_doc_bytes=1000)
    assert t.column("_reason").to_pylist() == ["oversized", None, "oversized", "oversized", "oversized", "oversized", "oversized"]
    assert t.column("doc_id").to_pylist() == ["h", "after", "12", None, None, None, "short"]
    tsv = tmp_path / "long.tsv"
    tsv.write_bytes(b"t1\t" + text + b"\nt2\tkept\n" + text + b"\n")
    t = _read_all(str(tsv), max_doc_bytes=1000)
    assert t.column("_reason").to_pylist() == ["oversized", None, "oversized"]
    assert t.column("doc_id").to_pylist() == ["t1", "t2", None]


def test_every_line_of_a_file_of_several_read_chunks_is_read_once_in_order(tmp_path):
    """Lines cut by the reader's 1 MiB reads, of every length up to the limit and past it."""
    path = tmp_path / "many.tsv"
    texts = ["w" * (1 + (i * 7919) % 700) for i in range(6000)]  # about 2 MiB: two cuts, at lines of any length
    texts[3000] = "v" * 5000  # past the limit: oversized, its neighbours read
    path.write_bytes(b"".join(f"d{i}\t{t}\n".encode() for i, t in enumerate(texts)))
    t = _read_all(str(path), max_doc_bytes=1000, batch_rows=4096)
    assert t.column("_location").to_pylist() == list(range(1, 6001))
    assert t.column("doc_id").to_pylist() == [f"d{i}" for i in range(6000)]  # (the oversized one named by its id)
    assert t.column("text").to_pylist() == [x if i != 3000 else None for i, x in enumerate(texts)]
    assert [r for r in t.column("_reason").to_pylist() if r] == ["oversized"]


@pytest.mark.parametrize("layout", ["jsonl", "tsv"])
def test_a_byte_order_mark_starting_any_line_is_dropped(tmp_path, layout):
    """Two files written with a byte order mark and joined with cat: the second's first record
    is read whole, its id without the mark (qrels name it "2")."""
    bom = b"\xef\xbb\xbf"
    one, two = (b'{"_id": "1", "text": "a"}\n', b'{"_id": "2", "text": "b"}\n') if layout == "jsonl" else (b"1\ta\n", b"2\tb\n")
    path = tmp_path / f"joined.{layout}"
    path.write_bytes(bom + one + bom + two)
    t = _read_all(str(path))
    assert t.column("doc_id").to_pylist() == ["1", "2"] and t.column("_reason").to_pylist() == [None, None]


def test_batches_are_bounded(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", [{"_id": str(i), "text": "t"} for i in range(25)])
    sizes = [b.num_rows for b in iter_corpus(str(tmp_path / "c.jsonl"), batch_rows=10)]
    assert sizes == [10, 10, 5]


def test_content_hash_tracks_content_only():
    # its definition, which every table's hashes were made by (a re-index compares them): the
    # SHA-256 of the compact JSON list [title, text, metadata], characters as they are
    import hashlib
    import json

    tricky = ["", "x", 'a "quoted" \\ back\\slash', "tab\there\nnewline\r", "\x00\x1f\x7f\x9f", "café ß 漢字 😀", "\u2028\u2029\ufeff",
              "</script>", "null"]
    for title in (None, *tricky):
        for text in tricky:
            for metadata in (None, '{"a": 1}', "é"):
                blob = json.dumps([title, text, metadata], ensure_ascii=False, separators=(",", ":")).encode("utf-8")
                assert content_hash(title, text, metadata) == hashlib.sha256(blob).hexdigest(), (title, text, metadata)
    assert content_hash("t", "x", None) == "0e6cdcfa117d53a10743c9e5946f16f5afc9c691f6aec72f94ee828a2a3ccd13"  # (as tables hold it)
    assert content_hash("t", "x", None) != content_hash("t", "x ", None)
    assert content_hash(None, "x", None) != content_hash("", "x", None)
    fields, reason, _ = validate_record({"_id": "a", "text": "x", "metadata": {"b": 1, "a": 2}}, 100)
    assert reason is None and fields["metadata"] == '{"a": 2, "b": 1}'


def test_bad_locations_fail_clearly(tmp_path):
    with pytest.raises(CorpusError, match="nothing at"):
        list_sources(str(tmp_path / "missing"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CorpusError, match="cannot tell the format"):
        list_sources(str(tmp_path / "notes.txt"))
    mixed = tmp_path / "mixed"
    write_jsonl(mixed / "a.jsonl", ROWS)
    pq.write_table(pa.table({"doc_id": ["x"], "text": ["t"]}), mixed / "b.parquet")
    with pytest.raises(CorpusError, match="mixes JSONL and Parquet"):
        list_sources(str(mixed))


def test_a_beir_directory_without_its_corpus_file_is_refused(tmp_path):
    # before: the directory's queries.jsonl was indexed as the corpus
    beir = tmp_path / "beir"
    write_jsonl(beir / "queries.jsonl", [{"_id": "q", "text": "x"}])
    (beir / "qrels").mkdir()
    with pytest.raises(CorpusError, match=r"BEIR directory but holds no corpus.jsonl .*found: qrels, queries.jsonl"):
        list_sources(str(beir))
    with pytest.raises(CorpusError, match="holds no corpus.jsonl"):
        list_sources(str(beir), "beir")
    # a plain directory of JSONL files is still a corpus
    write_jsonl(tmp_path / "plain" / "part-1.jsonl", ROWS)
    assert len(list_sources(str(tmp_path / "plain"))) == 1


@pytest.mark.parametrize(
    ("doc_id", "reason"),
    [(" spaced ", "bad_id"), ("spaced ", "bad_id"), ("tab\there", "bad_id"), ("line\nbreak", "bad_id"), ("   ", "missing_id"),
     ("inner space", None), ("spaced", None), (7, None)],
)
def test_ids_are_kept_exactly_or_refused(doc_id, reason):
    # before: ' spaced ' was silently stored as 'spaced', colliding with another document's id
    fields, got, _ = validate_record({"_id": doc_id, "text": "t"}, 1 << 20)
    assert got == reason
    if reason is None:
        assert fields["doc_id"] == str(doc_id)


BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, as Windows tools write one at the start of a file


def test_a_byte_order_mark_is_not_part_of_the_first_id(tmp_path):
    """A JSONL corpus (plain, gzipped, a BEIR corpus.jsonl) or a TSV corpus starting with a BOM
    reads as the same file without it: the first id exact, the content hashes equal."""
    text = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    (tmp_path / "bom.jsonl").write_bytes(BOM + text)
    (tmp_path / "bom.jsonl.gz").write_bytes(gzip.compress(BOM + text))
    (tmp_path / "beir").mkdir()
    (tmp_path / "beir" / "corpus.jsonl").write_bytes(BOM + text)
    want = _read_all(str(write_jsonl(tmp_path / "plain.jsonl", ROWS))).drop(["_source"])
    for name in ("bom.jsonl", "bom.jsonl.gz", "beir"):
        got = _read_all(str(tmp_path / name))
        assert got.column("doc_id").to_pylist() == ["a", "b"], name
        assert got.drop(["_source"]).equals(want), name
    (tmp_path / "bom.tsv.gz").write_bytes(gzip.compress(BOM + b"a\talpha\nb\tbeta\n"))
    tsv = _read_all(str(tmp_path / "bom.tsv.gz"))
    assert tsv.column("doc_id").to_pylist() == ["a", "b"] and tsv.column("_reason").to_pylist() == [None, None]


def test_a_first_record_that_cannot_be_read_is_still_a_reject_after_a_byte_order_mark(tmp_path):
    """The BOM goes, the record stays: a reject naming its line and the field at fault."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(BOM + b'{"text": "no id"}\n{"_id": "c", "text": "ok"}\n')
    t = _read_all(str(path))
    assert t.column("_reason").to_pylist() == ["missing_id", None]
    assert t.column("_location").to_pylist() == [1, 2] and t.column("doc_id").to_pylist() == [None, "c"]
    assert "holds a non-empty id" in t.column("_detail")[0].as_py()
    path.write_bytes(BOM + b'{"_id": "d", "text": 5}\n')
    t = _read_all(str(path))
    assert (t.column("_reason")[0].as_py(), t.column("_detail")[0].as_py()) == ("bad_field_type", "text must be a string, got int")


# --- precomputed vectors (--vector-column) --------------------------------------------------


def _vector_rows(location, dim=3, name="emb") -> list[dict]:
    from logicrank.pipelines.corpus import VectorColumn, read_source

    rows = []
    for src in list_sources(str(location)):
        for t in read_source(src, batch_rows=2, vectors=VectorColumn(name, dim)):
            rows += t.select(["doc_id", "_location", "_reason", "_detail", "vector", "content_hash"]).to_pylist()
    return rows


def test_a_jsonl_vector_field_is_checked_row_by_row_and_kept_at_unit_length(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [
        {"_id": "a", "text": "alpha", "emb": [3, 4, 0]},
        {"_id": "b", "text": "beta", "emb": [1, 2]},
        {"_id": "c", "text": "gamma", "emb": None},
        {"_id": "d", "text": "delta"},
        {"_id": "e", "text": "epsilon", "emb": [0, 0, 0]},
        {"_id": "f", "text": "phi", "emb": ["1", 2, 3]},
        {"_id": "g", "text": "gamma2", "emb": [1e39, 1, 1]},  # finite in float64, not in float32
        {"_id": "h", "text": "", "emb": [1, 1, 1]},  # the text's own reason comes first
        {"_id": "i", "text": "iota", "emb": [True, 1, 1]},
        {"_id": "j", "text": "kappa", "emb": "0.1 0.2 0.3"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in lines) + '\n{"_id": "n", "text": "nan", "emb": [NaN, 1, 1]}\n')
    rows = _vector_rows(path)
    assert [(r["doc_id"], r["_reason"]) for r in rows] == [
        ("a", None), ("b", "vector_dim"), ("c", "missing_vector"), ("d", "missing_vector"), ("e", "bad_vector"), ("f", "bad_vector"),
        ("g", "bad_vector"), ("h", "empty_text"), ("i", "bad_vector"), ("j", "bad_vector"), ("n", "bad_vector")]
    assert [r["_location"] for r in rows] == list(range(1, 12))
    assert rows[0]["vector"] == pytest.approx([0.6, 0.8, 0.0], abs=1e-7) and all(r["vector"] is None for r in rows[1:])
    assert rows[1]["_detail"] == "field 'emb': 2 numbers, expected 3"
    assert rows[6]["_detail"] == "field 'emb': number 1 of 3 is 1e+39, not a finite float32"
    assert rows[10]["_detail"] == "field 'emb': number 1 of 3 is nan, not a finite float32"
    assert all(r["content_hash"] is None for r in rows[1:])


def test_vectors_at_the_edges_of_float32_are_normalised_exactly_or_rejected_never_crash():
    from logicrank.pipelines.corpus import check_vector

    big, _, _ = check_vector([3e38, 3e38, 0], 3)  # finite in float32; its float32 norm would overflow
    assert big.unit == pytest.approx([2**-0.5, 2**-0.5, 0.0], abs=1e-7)
    tiny, _, _ = check_vector([1e-44, 1e-44, 0.0], 3)  # subnormal in float32
    assert float((tiny.unit.astype("float64") ** 2).sum()) == pytest.approx(1.0, abs=1e-6)
    assert check_vector([int("1" + "0" * 400), 1, 1], 3)[1] == "bad_vector"  # an integer past any float: a reject
    assert check_vector([1, 2, 3], 3)[0].given.tolist() == [1.0, 2.0, 3.0]


def test_vector_options_without_a_vector_column_are_refused():
    from pydantic import ValidationError

    from logicrank.pipelines.config.settings import IndexConfig

    for bad in ({"vector_dim": 3}, {"vector_model": "all-MiniLM-L6-v2"}, {"vector_column": ""}):
        with pytest.raises(ValidationError):
            IndexConfig(corpus="c", db="d", **bad)
    assert IndexConfig(corpus="c", db="d", vector_column="emb", vector_dim=3).vector_dim == 3


def test_a_parquet_vector_column_of_any_list_type_reads_as_the_same_vectors(tmp_path):
    import numpy as np

    values = [[3.0, 4.0, 0.0], [1.0, 2.0], None, [0.0, float("inf"), 1.0], [0.0, 0.0, 2.0]]
    ids, texts = ["a", "b", "c", "d", "e"], ["x", "y", "z", "w", "v"]
    pq.write_table(pa.table({"doc_id": ids, "text": texts, "emb": pa.array(values, pa.list_(pa.float64()))}), tmp_path / "l.parquet")
    pq.write_table(pa.table({"doc_id": ids, "text": texts, "emb": pa.array(values, pa.large_list(pa.float32()))}), tmp_path / "g.parquet")
    rows = _vector_rows(tmp_path / "l.parquet")
    assert [(r["doc_id"], r["_reason"]) for r in rows] == [("a", None), ("b", "vector_dim"), ("c", "missing_vector"), ("d", "bad_vector"), ("e", None)]
    assert [r["_location"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[3]["_detail"] == "column 'emb': number 2 of 3 is inf, not a finite float32"
    assert [r["vector"] for r in rows] == [r["vector"] for r in _vector_rows(tmp_path / "g.parquet")]
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(np.array([3, 4, 0, 0, 0, 2], np.float32)), 3)
    pq.write_table(pa.table({"doc_id": ["a", "e"], "text": ["x", "v"], "emb": fixed}), tmp_path / "f.parquet")
    assert [r["vector"] for r in _vector_rows(tmp_path / "f.parquet")] == [rows[0]["vector"], rows[4]["vector"]]
    # the same document with the same numbers from JSONL: the same content hash; other numbers (even in the same
    # direction, so the same unit vector), another hash
    write_jsonl(tmp_path / "j" / "c.jsonl", [{"_id": "a", "text": "x", "emb": [3, 4, 0]}, {"_id": "e", "text": "v", "emb": [0, 0, 4]}])
    from_jsonl = _vector_rows(tmp_path / "j" / "c.jsonl")
    assert from_jsonl[0]["content_hash"] == rows[0]["content_hash"] and from_jsonl[1]["content_hash"] != rows[4]["content_hash"]
    assert from_jsonl[1]["vector"] == rows[4]["vector"] == [0.0, 0.0, 1.0]
    assert rows[0]["content_hash"] != content_hash(None, "x", None)  # the vector is part of the content


def test_files_that_carry_no_vectors_are_refused_before_reading(tmp_path):
    from logicrank.pipelines.corpus import SourceError, check_sources

    (tmp_path / "c.tsv").write_text("a\talpha\n")
    with pytest.raises(SourceError, match=r"c.tsv: a TSV file carries no vectors; --vector-column emb reads JSONL .* or Parquet"):
        check_sources(list_sources(str(tmp_path / "c.tsv")), "emb")
    pq.write_table(pa.table({"doc_id": ["a"], "text": ["x"], "vec": [[1.0]]}), tmp_path / "p.parquet")
    with pytest.raises(SourceError, match=r"p.parquet: no column 'emb' \(--vector-column\); its columns: doc_id, text, vec\."):
        check_sources(list_sources(str(tmp_path / "p.parquet")), "emb")
    pq.write_table(pa.table({"doc_id": ["a"], "text": ["x"], "emb": ["1 2 3"]}), tmp_path / "s.parquet")
    assert [(r["_reason"], r["_detail"]) for r in _vector_rows(tmp_path / "s.parquet")] == [
        ("bad_vector", "column 'emb' holds string, not a list of numbers")]


def test_jsonl_and_parquet_give_the_same_vectors_and_hashes_bit_for_bit(tmp_path):
    """The Parquet reader checks a batch's vectors together, the JSONL reader one by one: the same
    arithmetic, so a corpus moved from one format to the other reads as unchanged."""
    import numpy as np

    rng = np.random.default_rng(7)
    vecs = (rng.standard_normal((50, 384)) * rng.choice([1e-30, 1.0, 1e30], size=(50, 1))).astype(np.float32)
    ids, texts = [f"d{i}" for i in range(50)], [f"text {i}" for i in range(50)]
    write_jsonl(tmp_path / "j" / "c.jsonl", [{"_id": d, "text": t, "emb": v.tolist()} for d, t, v in zip(ids, texts, vecs, strict=True)])
    pq.write_table(pa.table({"doc_id": ids, "text": texts, "emb": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1)), 384)}),
                   tmp_path / "c.parquet")
    a, b = _vector_rows(tmp_path / "j" / "c.jsonl", dim=384), _vector_rows(tmp_path / "c.parquet", dim=384)
    assert [r["_reason"] for r in a] == [None] * 50
    assert [(r["vector"], r["content_hash"]) for r in a] == [(r["vector"], r["content_hash"]) for r in b]


def test_a_text_or_id_key_that_holds_nothing_gives_way_to_the_next_one(tmp_path):
    """A Parquet file merged from two exports fills `text` on some rows and `contents` on the
    others, the other column null: each row's body was read from the null (a title-only
    document, every `contents` body lost without a word). The first key that holds a value is
    read; a record whose every text key is empty stays a title-only document."""
    pq.write_table(pa.table({"_id": ["a", "b", "c"], "title": ["A", "B", "C"], "text": ["one", None, ""],
                             "contents": [None, "two", None]}), tmp_path / "merged.parquet")
    t = _read_all(str(tmp_path / "merged.parquet"))
    assert t.column("text").to_pylist() == ["one", "two", ""] and t.column("_reason").to_pylist() == [None, None, None]
    fields, reason, _ = validate_record({"_id": None, "id": "x", "text": "body"}, 1 << 20)
    assert (fields["doc_id"], reason) == ("x", None)  # a null `_id` beside an `id`: not a missing id
    fields, reason, _ = validate_record({"_id": "", "id": "", "text": "body"}, 1 << 20)
    assert reason == "missing_id"


def test_a_beir_directorys_other_document_files_are_named_not_read(tmp_path):
    """A directory holding corpus.jsonl is read as BEIR lays it out, its corpus that file alone:
    a corpus-2.jsonl or a Parquet export beside it was skipped without a word. They are listed
    as not read, with the rule; queries, qrels and QA answers are not documents and not listed."""
    beir = tmp_path / "beir"
    write_jsonl(beir / "corpus.jsonl", ROWS)
    write_jsonl(beir / "corpus-2.jsonl", [{"_id": "c", "text": "three"}])
    write_jsonl(beir / "queries.jsonl", [{"_id": "q", "text": "x"}])
    write_jsonl(beir / "answers.jsonl", [{"query_id": "q", "answers": ["x"]}])
    pq.write_table(pa.table({"query_id": ["q"]}), beir / "decompositions.parquet")  # a set-logic set's gold, beside its corpus
    (beir / "more").mkdir()
    pq.write_table(pa.table({"_id": ["d"], "text": ["four"]}), beir / "more" / "part.parquet")
    sources = list_sources(str(beir))
    assert [s.path for s in sources] == [str(beir / "corpus.jsonl")]
    assert [u.rsplit("/beir/", 1)[1] for u in sources.not_read] == ["corpus-2.jsonl", "more/part.parquet"]
    assert "corpus.jsonl alone" in sources.why_not_read
    write_jsonl(tmp_path / "plain" / "corpus.jsonl", ROWS)
    assert list_sources(str(tmp_path / "plain")).not_read == ()


def test_a_compressed_files_name_is_read_in_any_case(tmp_path):
    """`C.JSONL.GZ` was taken for its kind by the lower-cased name but opened by Arrow's own
    detection, which knows `.gz` only: refused as "not UTF-8 text", each line a reject."""
    with gzip.open(tmp_path / "C.JSONL.GZ", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in ROWS)
    check_sources(list_sources(str(tmp_path / "C.JSONL.GZ")))
    t = _read_all(str(tmp_path / "C.JSONL.GZ"))
    assert t.column("doc_id").to_pylist() == ["a", "b"] and t.column("_reason").to_pylist() == [None, None]


def test_a_directorys_document_file_in_a_compression_not_read_is_refused_not_skipped(tmp_path):
    """`b.jsonl.xz` beside `a.jsonl` was a file of no known kind, skipped without a word (the
    same file given alone is refused): the directory is refused, naming it."""
    write_jsonl(tmp_path / "d" / "a.jsonl", ROWS)
    (tmp_path / "d" / "b.jsonl.xz").write_bytes(b"\xfd7zXZ\x00")
    (tmp_path / "d" / "README.zip").write_bytes(b"PK")  # not named as documents: not refused
    with pytest.raises(CorpusError, match=r"1 document file\(s\) in a compression that is not read \(b.jsonl.xz\)"):
        list_sources(str(tmp_path / "d"))
    with pytest.raises(CorpusError, match="not read"):
        list_sources(str(tmp_path / "d"), "jsonl")
    (tmp_path / "d" / "b.jsonl.xz").unlink()
    for name in ("queries.jsonl.xz", "topics.tsv.zip", "collection.tsv.xz"):  # no documents here (a .tsv one only with --format tsv)
        (tmp_path / "d" / name).write_bytes(b"\xfd7zXZ\x00")
    assert [s.path for s in list_sources(str(tmp_path / "d"))] == [str(tmp_path / "d" / "a.jsonl")]
    assert [s.path for s in list_sources(str(tmp_path / "d"))] == [str(tmp_path / "d" / "a.jsonl")]
