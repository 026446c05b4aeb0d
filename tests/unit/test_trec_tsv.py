"""TREC SGML and TSV corpora, TREC topics and TSV queries: read as users have them.

Round trips through small writers, the first 300 SciFact documents as a gzipped TREC file
(equal to the JSONL they came from, hashes included), the tag rules, every malformed input a
reject with its reason while the documents around it are read, and the topics readers'
one-line refusals."""

from __future__ import annotations

import gzip
import html
import io
import itertools
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from logicrank.pipelines.config.settings import IndexConfig
from logicrank.pipelines.corpus import iter_corpus, list_sources, trec_raw_limit, trec_units
from logicrank.pipelines.datasets import scifact
from logicrank.pipelines.io import TopicsError, read_queries
from logicrank.schemas.tables import REJECT_REASONS


def _read_all(location, **kw) -> pa.Table:
    return pa.concat_tables(list(iter_corpus(str(location), **kw)))


def _rows(table: pa.Table) -> list[tuple]:
    return list(zip(*(table.column(c).to_pylist() for c in ("doc_id", "title", "text")), strict=True))


def _open(path: Path):
    return gzip.open(path, "wt", encoding="utf-8", newline="") if path.suffix == ".gz" else open(path, "w", encoding="utf-8", newline="")


def _sgml(value: str) -> str:
    """A field's value as TREC SGML: &, <, > escaped; surrounding whitespace, which a reader
    strips as layout, kept as character references."""
    body = html.escape(value, quote=False)
    core = body.strip()
    start = body.index(core) if core else len(body)
    ref = "".join(f"&#{ord(c)};" for c in body[:start]), "".join(f"&#{ord(c)};" for c in body[start + len(core):])
    return ref[0] + core + ref[1]


def write_trec(path: Path, docs: list[dict], date: bool = False) -> Path:
    """TREC SGML, one DOC per document: DOCNO, an optional DATE, HEAD (the title), TEXT."""
    with _open(path) as f:
        for d in docs:
            f.write(f"<DOC>\n<DOCNO> {d['_id']} </DOCNO>\n")
            if date:
                f.write("<DATE>\nJanuary 2, 1989, Monday\n</DATE>\n")
            if d.get("title") is not None:
                f.write(f"<HEAD>{_sgml(d['title'])}</HEAD>\n")
            f.write(f"<TEXT>\n{_sgml(d['text'])}\n</TEXT>\n</DOC>\n")
    return path


def write_tsv(path: Path, docs: list[dict]) -> Path:
    with _open(path) as f:
        f.writelines(f"{d['_id']}\t{d['text']}\n" for d in docs)
    return path


DOCS = [
    {"_id": "d1", "title": "A & B <c>", "text": "alpha\nsecond line, with  two spaces"},
    {"_id": "FR940104-0-00001", "title": None, "text": "beta 5 < 6 > 4 &amp; literal"},
    {"_id": "d 3", "title": " padded title ", "text": " leading and trailing space\t"},
    {"_id": "ü-4", "title": "Ünïcode", "text": "ℵ₀ text ✓"},
]


@pytest.mark.parametrize("name", ["c.trec", "c.trec.gz", "c.sgml", "c.sgm.gz", "c.trectext"])
def test_trec_round_trip(tmp_path, name):
    t = _read_all(write_trec(tmp_path / name, DOCS, date=True))
    assert _rows(t) == [(d["_id"], d["title"], d["text"]) for d in DOCS]
    assert t.column("_reason").to_pylist() == [None] * 4
    assert t.column("_location").to_pylist() == [1, 12, 21, 31]  # the line of each <DOC>
    assert t.column("metadata").to_pylist() == [None] * 4


def test_the_docs_of_one_line_share_their_location_and_each_has_its_own_record(tmp_path):
    """A file with several DOCs on a line (a reject and stray text among them): every DOC is
    a row, located at its <DOC>'s line, numbered in the file's order across batches."""
    path = tmp_path / "c.trec"
    path.write_text("<DOC><DOCNO>A</DOCNO><TEXT>first</TEXT></DOC>\n"
                    "<DOC><DOCNO>X1</DOCNO><TEXT></TEXT></DOC><DOC><DOCNO>X2</DOCNO><TEXT>two on a line</TEXT></DOC>\n"
                    "junk <DOC><DOCNO>X3</DOCNO><TEXT>after junk</TEXT></DOC>\n")
    t = _read_all(path, batch_rows=2)
    got = list(zip(*(t.column(c).to_pylist() for c in ("doc_id", "_location", "_record", "_reason")), strict=True))
    assert got == [("A", 1, 0, None), ("X1", 2, 1, "empty_text"), ("X2", 2, 2, None), (None, 3, 3, "outside_doc"), ("X3", 3, 4, None)]


@pytest.mark.parametrize("name", ["c.tsv", "c.tsv.gz"])
def test_tsv_round_trip(tmp_path, name):
    docs = [{"_id": d["_id"], "text": d["text"].replace("\n", " ").replace("\t", " ")} for d in DOCS]
    t = _read_all(write_tsv(tmp_path / name, docs))
    assert _rows(t) == [(d["_id"], None, d["text"]) for d in docs]
    assert t.column("_location").to_pylist() == [1, 2, 3, 4]
    assert list_sources(str(tmp_path / name))[0].kind == "tsv"


def test_scifact_as_gzipped_trec_equals_its_jsonl(tmp_path):
    """The first 300 SciFact documents written as TREC (DOCNO, DATE, HEAD, TEXT; gzip) read
    back exactly as the JSONL they came from: ids, titles, texts and content hashes."""
    with gzip.open(scifact().corpus, "rt", encoding="utf-8") as f:
        lines = list(itertools.islice(f, 300))
    docs = [json.loads(line) for line in lines]
    jsonl = tmp_path / "corpus.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as f:
        f.writelines(lines)
    trec = write_trec(tmp_path / "scifact.trec.gz", docs, date=True)
    assert [s.kind for s in list_sources(str(trec))] == ["trec"]
    want, got = _read_all(jsonl, batch_rows=64), _read_all(trec, batch_rows=64)
    assert got.num_rows == want.num_rows == 300
    assert got.column("_reason").null_count == 300
    assert _rows(got) == _rows(want)
    assert got.column("content_hash").to_pylist() == want.column("content_hash").to_pylist()
    # what the test covers: entities, and titles whose trailing space only a character reference carries
    assert sum("<" in d["text"] or "&" in d["text"] for d in docs) > 5 and sum(d["title"] != d["title"].strip() for d in docs) == 3


def test_the_tag_rules(tmp_path):
    path = tmp_path / "rules.trec"
    path.write_text(
        "<doc>\n<DocNo>\n  AP880212-0001\n</DocNo>\n<FILEID>AP-NR-02-12-88</FILEID>\n"
        "<HEAD>First head</HEAD>\n<HEAD>Second &amp; last</HEAD>\n<DATE>880212</DATE>\n<BYLINE>By a writer</BYLINE>\n"
        "<Text Type='body'>\n  <P>\n  Para <B>one</B> &lt;tag&gt; &eacute;t&eacute;.\n  </P>\n  <P>Para two\n</TEXT>\n"
        "untagged, dropped\n<TEXT>\nsecond TEXT<!-- a comment -->\n</TEXT>\n</DOC>\n"
        "<DOC>\n<DOCNO>LA010189-0001</DOCNO>\n<HEAD>a head</HEAD>\n<TITLE>The title</TITLE>\n"
        "<DATE>January 1, 1989</DATE>\nNo TEXT tag: <F P=105>this</F> text <P>and the date\n</DOC>\n",
        encoding="utf-8",
    )
    t = _read_all(path)
    assert t.column("_reason").to_pylist() == [None, None]
    assert _rows(t) == [
        # TITLE else every HEAD, joined by a space; every TEXT, joined by a newline; other tags dropped beside a TEXT
        ("AP880212-0001", "First head Second & last", "Para one <tag> été.\n  \n  Para two\nsecond TEXT"),
        # no TEXT: all the text outside DOCNO, TITLE and HEAD, other tags' (DATE) included
        ("LA010189-0001", "The title", "January 1, 1989\nNo TEXT tag: this text and the date"),
    ]


def test_the_federal_registers_blank_entity_is_a_space_and_its_own_entities_stay(tmp_path):
    """FR94 writes ``&blank;`` for a blank (HTML5 names U+2423, the symbol for one) and
    entities of its own (``&hyph;``), which stay as written."""
    path = tmp_path / "fr940104.trec"
    path.write_text("<DOC>\n<DOCNO> FR940104-0-00001 </DOCNO>\n<TEXT>\nNo. 2 &blank;/&blank;Tuesday, non&hyph;profit &sect; 3\n</TEXT>\n</DOC>\n")
    assert _rows(_read_all(path)) == [("FR940104-0-00001", None, "No. 2  / Tuesday, non&hyph;profit \u00a7 3")]


def test_reading_is_the_same_whatever_the_read_boundaries():
    data = b"stray\n" + "".join(f"<DOC><DOCNO>n{i}</DOCNO><TEXT>{'x' * (i * 37)}</TEXT></DOC>\n" for i in range(12)).encode()
    data += b"<DOC attr='1'><DOCNO>open</DOCNO>\n<doc>\n<DOCNO>last</DOCNO><TEXT>t</TEXT>\n</Doc >\ntail\n"
    want = list(trec_units(io.BytesIO(data), 300))
    assert [u[0] for u in want] == ["outside_doc"] + ["doc"] * 8 + ["oversized"] * 4 + ["unclosed_doc", "doc", "outside_doc"]
    for chunk in (1, 2, 5, 63, 64, 300, 301, 4096):
        assert list(trec_units(io.BytesIO(data), 300, chunk=chunk)) == want, chunk


def test_an_oversized_doc_is_skipped_not_held_and_the_next_one_read(tmp_path):
    path = tmp_path / "big.trec"
    with open(path, "wb") as f:
        f.write(b"<DOC><DOCNO>huge</DOCNO><TEXT>" + b"z" * 3_000_000 + b"</TEXT></DOC>\n")
        f.write(b"<DOC><DOCNO>after</DOCNO><TEXT>kept</TEXT></DOC>\n")
    assert trec_raw_limit(1000) < 3_000_000
    t = _read_all(path, max_doc_bytes=1000)
    assert list(zip(t.column("doc_id").to_pylist(), t.column("_reason").to_pylist(), strict=True)) == [("huge", "oversized"), ("after", None)]


GOOD = "<DOC>\n<DOCNO>{0}</DOCNO>\n<TEXT>\ntext of {0}\n</TEXT>\n</DOC>\n"


def test_malformed_trec_and_tsv_are_rejects_and_every_good_document_is_read(tmp_path):
    trec = tmp_path / "bad.trec"
    parts = [
        GOOD.format("g1").encode(),
        b"<DOC>\n<TEXT>no docno</TEXT>\n</DOC>\n",  # missing_id
        GOOD.format("g2").encode(),
        b"<DOC>\n<DOCNO>e1</DOCNO>\n<TEXT>\n  \n</TEXT>\n</DOC>\n",  # empty_text
        b"<DOC>\n<DOCNO>u1</DOCNO>\n<TEXT>never closed</TEXT>\n",  # unclosed_doc, followed by a good DOC
        GOOD.format("g3").encode(),
        b"<DOC>\n<DOCNO>big</DOCNO>\n<TEXT>" + b"y" * 300 + b"</TEXT>\n</DOC>\n",  # oversized (title + text)
        b"<DOC>\n<DOCNO>ut\xe9</DOCNO>\n<TEXT>bad \xff\xfe bytes</TEXT>\n</DOC>\n",  # invalid_utf8: its id is not UTF-8
        GOOD.format("g4").encode(),
        b"a stray line between documents\n",  # outside_doc
        b"<DOC>\n<DOCNO>raw</DOCNO>\n<TEXT>" + b"<P>" * 30_000 + b"</TEXT>\n</DOC>\n",  # oversized: the raw DOC, never held
        GOOD.format("g5").encode(),
    ]
    trec.write_bytes(b"".join(parts))
    t = _read_all(trec, max_doc_bytes=100, batch_rows=4)
    reasons = t.column("_reason").to_pylist()
    valid = [d for d, r in zip(t.column("doc_id").to_pylist(), reasons, strict=True) if r is None]
    assert valid == ["g1", "g2", "g3", "g4", "g5"]
    assert Counter(r for r in reasons if r) == {
        "missing_id": 1, "empty_text": 1, "unclosed_doc": 1, "oversized": 2, "invalid_utf8": 1, "outside_doc": 1}
    rejects = [(loc, d, r) for loc, d, r in zip(*(t.column(c).to_pylist() for c in ("_location", "doc_id", "_reason")), strict=True) if r]
    assert rejects == [(7, None, "missing_id"), (16, "e1", "empty_text"), (22, "u1", "unclosed_doc"), (31, "big", "oversized"),
                       (35, None, "invalid_utf8"), (45, None, "outside_doc"), (46, "raw", "oversized")]
    assert all(t.column("_detail").to_pylist()[i] for i, r in enumerate(reasons) if r)
    assert t.column("content_hash").null_count == len(rejects)

    tsv = tmp_path / "bad.tsv"
    tsv.write_bytes(b"1\tgood one\r\nno tab here\n\tempty id\n3\t   \n4\ttitle\ttext\n5\tbad \xff bytes\n\n 6\tspaced id\n7\tgood two\n")
    t = _read_all(tsv, batch_rows=3)
    got = list(zip(t.column("_location").to_pylist(), t.column("doc_id").to_pylist(), t.column("_reason").to_pylist(), strict=True))
    assert got == [(1, "1", None), (2, None, "bad_tsv_row"), (3, None, "missing_id"), (4, "3", "empty_text"), (5, "4", "bad_tsv_row"),
                   (6, "5", "invalid_utf8"), (8, " 6", "bad_id"), (9, "7", None)]  # (5, 6: their ids are read, so their stored copies are held)
    assert t.column("text").to_pylist()[0] == "good one"  # the \r of a CRLF line is dropped
    assert Counter(r for _, _, r in got if r) == {"bad_tsv_row": 2, "missing_id": 1, "empty_text": 1, "invalid_utf8": 1, "bad_id": 1}
    assert {"unclosed_doc", "outside_doc", "bad_tsv_row"} <= set(REJECT_REASONS)


def test_a_trec_doc_with_bytes_that_are_not_utf8_is_read_as_anserini_reads_it(tmp_path):
    """Latin-1 bytes (older TREC collections) read as U+FFFD, as Anserini's and ir_datasets' TREC
    readers read them: the document is kept, its note counting the bytes replaced (a U+FFFD
    the file wrote in UTF-8 is text, not counted). A DOCNO not UTF-8 is rejected: no id is guessed."""
    trec = tmp_path / "ft.trec"
    trec.write_bytes(
        b"<DOC>\n<DOCNO>FT911-1</DOCNO>\n<HEADLINE>Caf\xe9 prices</HEADLINE>\n<TEXT>\nUp 5\xa3 \xef\xbf\xbd and \xff\xfe\n</TEXT>\n</DOC>\n"
        b"<DOC>\n<DOCNO>FT911-\xe9</DOCNO>\n<TEXT>ok</TEXT>\n</DOC>\n"
        + GOOD.format("FT911-3").encode()
    )
    t = _read_all(trec)
    got = list(zip(*(t.column(c).to_pylist() for c in ("doc_id", "title", "text", "_reason", "_detail")), strict=True))
    assert got[0] == ("FT911-1", "Caf\ufffd prices", "Up 5\ufffd \ufffd and \ufffd\ufffd", None, "bytes not UTF-8: 4 byte sequence(s) read as U+FFFD")
    assert got[1][0] is None and got[1][3] == "invalid_utf8" and "DOCNO holds U+FFFD in a DOC with bytes that are not UTF-8" in got[1][4]
    assert got[2] == ("FT911-3", None, "text of FT911-3", None, None)
    assert t.column("content_hash").to_pylist()[0] is not None


def test_dpr_passages_tsv_is_read_as_dpr_reads_it(tmp_path):
    """DPR's Wikipedia passages (psgs_w100.tsv, gzipped as published): a header id<TAB>text<TAB>title,
    then fields in double quotes where they hold one, "" a quote inside (DPR reads them with
    Python's csv). Without that header a TSV stays id<TAB>text, unquoted."""
    path = tmp_path / "psgs_w100.tsv.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'id\ttext\ttitle\r\n1\t"Aaron Aaron ( or ; ""Ah\xc3\xa4r\xc3\xb4n"") is a prophet"\tAaron\r\n'
                b'2\t"a text\twith a tab"\t"Title, quoted"\n3\tplain text\tPlain\n4\t"unclosed\tT\n5\ttwo fields\n6\t"abc"def\tT\n')
    t = _read_all(path)
    got = list(zip(*(t.column(c).to_pylist() for c in ("_location", "doc_id", "title", "text", "_reason")), strict=True))
    assert got == [(2, "1", "Aaron", 'Aaron Aaron ( or ; "Ah\u00e4r\u00f4n") is a prophet', None), (3, "2", "Title, quoted", "a text\twith a tab", None),
                   (4, "3", "Plain", "plain text", None), (5, "4", None, None, "bad_tsv_row"), (6, "5", None, None, "bad_tsv_row"),
                   (7, "6", "T", "abcdef", None)]  # (DPR's csv is not strict: text after a closing quote is kept)
    plain = tmp_path / "collection.tsv"
    plain.write_bytes(b'id\ttext\n1\t"quoted"\n')  # MS MARCO's layout: no header, no quoting (this first line is a document)
    assert _rows(_read_all(plain)) == [("id", None, "text"), ("1", None, '"quoted"')]


def test_ms_marco_v1_documents_tsv_is_read_as_published(tmp_path):
    """MS MARCO v1's documents (msmarco-docs.tsv.gz as published): docid<TAB>url<TAB>title<TAB>body,
    no header, no quoting; a title may be blank or ".". Each was a bad_tsv_row (four fields)
    and the file indexed nothing. The body is the text, the URL kept in the metadata."""
    import json

    path = tmp_path / "msmarco-docs.tsv.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"D1555982\thttps://answers.yahoo.com/question/index?qid=20071007114826AAwCFvR\tThe hot glowing surfaces of stars\t"
                b"Science & Mathematics Physics The hot glowing surfaces of stars emit energy\r\n"
                b"D301595\thttp://childparenting.about.com/od/physicalemotionalgrowth/tp/Child-Development.htm\t\tChild development \"stages\"\n"
                b"D1359209\thttp://example.org/\t.\t\n"  # (a title alone is a document: "." here)
                b"D5\thttp://example.org/five\ttitle only\n"  # three fields: not this file's layout
                b"\thttp://example.org/x\tT\tbody of no id\n"
                b"D7\thttp://example.org/seven\t\t \n")
    t = _read_all(path)
    got = list(zip(*(t.column(c).to_pylist() for c in ("_location", "doc_id", "title", "text", "_reason")), strict=True))
    assert got == [(1, "D1555982", "The hot glowing surfaces of stars", "Science & Mathematics Physics The hot glowing surfaces of stars emit energy", None),
                   (2, "D301595", None, 'Child development "stages"', None), (3, "D1359209", ".", "", None),
                   (4, "D5", None, None, "bad_tsv_row"), (5, None, None, None, "missing_id"), (6, "D7", None, None, "empty_text")]
    assert [json.loads(m) if m else None for m in t.column("metadata").to_pylist()[:3]] == [
        {"url": "https://answers.yahoo.com/question/index?qid=20071007114826AAwCFvR"},
        {"url": "http://childparenting.about.com/od/physicalemotionalgrowth/tp/Child-Development.htm"}, {"url": "http://example.org/"}]
    assert "docid<TAB>url<TAB>title<TAB>body" in t.column("_detail").to_pylist()[3]
    plain = tmp_path / "collection.tsv"  # four fields whose second is no URL: MS MARCO passages' layout, each line a bad row
    plain.write_bytes(b"1\tnot a url\tT\tbody\n")
    assert _read_all(plain).column("_reason").to_pylist() == ["bad_tsv_row"]


def test_list_sources_picks_trec_and_reads_suffixless_files_with_format_trec(tmp_path):
    write_trec(tmp_path / "a.trec.gz", DOCS[:1])
    assert [s.kind for s in list_sources(str(tmp_path / "a.trec.gz"))] == ["trec"]
    disk = tmp_path / "disk"
    disk.mkdir()
    write_trec(disk / "la010189", DOCS[:2])
    write_trec(disk / "fr940104.0", DOCS[2:])
    (disk / ".hidden").write_text("not read")
    from logicrank.pipelines.corpus import CorpusError

    with pytest.raises(CorpusError, match="cannot tell the format .*--format jsonl, parquet, trec or tsv"):
        list_sources(str(disk / "la010189"))
    with pytest.raises(CorpusError, match="no JSONL"):
        list_sources(str(disk))
    assert [s.kind for s in list_sources(str(disk / "la010189"), "trec")] == ["trec"]
    assert _rows(_read_all(disk / "la010189", fmt="trec")) == [(d["_id"], d["title"], d["text"]) for d in DOCS[:2]]
    sources = list_sources(str(disk), "trec")  # a directory of a TREC collection's files: every one not hidden
    assert [Path(s.path).name for s in sources] == ["fr940104.0", "la010189"]
    assert sorted(_read_all(disk, fmt="trec").column("doc_id").to_pylist()) == sorted(d["_id"] for d in DOCS)
    (tmp_path / "mixed").mkdir()
    write_tsv(tmp_path / "mixed" / "a.tsv", DOCS[:1])
    write_trec(tmp_path / "mixed" / "b.trec", DOCS[:1])
    assert [s.kind for s in list_sources(str(tmp_path / "mixed"))] == ["trec"]  # a directory's .tsv: only when told
    assert [s.kind for s in list_sources(str(tmp_path / "mixed"), "tsv")] == ["tsv"]


def test_trec_disks_as_published_are_read_as_anserinis_trec_collection_reads_them(tmp_path):
    """TREC's disks 4 and 5 as NIST ships them: files compressed by Unix compress (``.0z``,
    ``.z``, any case) beside plain ones, READMEs, DTDs and the Congressional Record. With
    ``--format trec`` the compressed files are decompressed and read as their plain copies are;
    the READMEs, ``dtds/`` and ``cr/`` are left out, as Anserini's TrecCollection leaves them out
    (Robust04's collection), and named in ``not_read``."""
    import ncompress

    from logicrank.pipelines.corpus import check_sources

    plain, disks = tmp_path / "plain", tmp_path / "disks"
    for root in (plain, disks):
        for sub in ("disk4/fr94/01", "disk4/ft/ft911", "disk4/fr94/dtds", "disk4/cr/hfiles", "disk5/latimes"):
            (root / sub).mkdir(parents=True)
    write_trec(plain / "disk4/fr94/01/fr940104", DOCS[:2])
    write_trec(plain / "disk4/ft/ft911/ft911_1", DOCS[2:3])
    write_trec(plain / "disk5/latimes/la010189", DOCS[3:])
    for name, packed in (("disk4/fr94/01/fr940104", "disk4/fr94/01/fr940104.0z"), ("disk4/ft/ft911/ft911_1", "disk4/ft/ft911/ft911_1"),
                         ("disk5/latimes/la010189", "disk5/latimes/LA010189.Z")):
        data = (plain / name).read_bytes()
        (disks / packed).write_bytes(ncompress.compress(data) if packed != name else data)
    write_trec(disks / "disk4/cr/hfiles/cr93h1.1z", [{"_id": "CR93H-1", "title": None, "text": "the record"}])
    (disks / "disk4/fr94/dtds/fr94.dtd").write_text("<!ELEMENT DOC - - (DOCNO, TEXT)>\n")
    (disks / "disk4/readmefr").write_text("Federal Register, 1994\n")
    sources = list_sources(str(disks), "trec")
    assert [Path(s.path).relative_to(disks).as_posix() for s in sources] == [
        "disk4/fr94/01/fr940104.0z", "disk4/ft/ft911/ft911_1", "disk5/latimes/LA010189.Z"]
    assert sorted(Path(u).relative_to(disks).as_posix() for u in sources.not_read) == [
        "disk4/cr/hfiles/cr93h1.1z", "disk4/fr94/dtds/fr94.dtd", "disk4/readmefr"]
    check_sources(sources)
    got, want = _read_all(disks, fmt="trec"), _read_all(plain, fmt="trec")
    assert got.column("_reason").null_count == got.num_rows == len(DOCS)
    assert _rows(got) == _rows(want) == [(d["_id"], d["title"], d["text"]) for d in DOCS]
    assert got.column("content_hash").to_pylist() == want.column("content_hash").to_pylist()
    assert [s.kind for s in list_sources(str(disks / "disk5/latimes/LA010189.Z"), "trec")] == ["trec"]
    (tmp_path / "one.trec.Z").write_bytes((disks / "disk5/latimes/LA010189.Z").read_bytes())
    assert [s.kind for s in list_sources(str(tmp_path / "one.trec.Z"))] == ["trec"]  # (.trec under .Z: auto tells it)


def test_a_compress_name_or_compress_data_that_do_not_match_are_refused_in_one_line(tmp_path):
    import ncompress

    from logicrank.pipelines.corpus import SourceError, check_sources, read_source

    doc = b"<DOC><DOCNO>d1</DOCNO><TEXT>text</TEXT></DOC>\n"
    (tmp_path / "plain.0z").write_bytes(doc)  # a .0z name over plain text
    with pytest.raises(SourceError, match=r"plain.0z: a name ending .0z is Unix compress \(.Z\) data, and this file is not"):
        check_sources(list_sources(str(tmp_path / "plain.0z"), "trec"))
    (tmp_path / "packed.trec").write_bytes(ncompress.compress(doc))  # compress data under a plain name
    with pytest.raises(SourceError, match=r"packed.trec: Unix compress \(.Z\) data under a name without .Z; name the file packed.trec.Z"):
        check_sources(list_sources(str(tmp_path / "packed.trec")))
    (tmp_path / "jsonl").mkdir()  # 7-Zip's .7z is no Unix compress name: not read as a compressed JSONL file
    (tmp_path / "jsonl" / "part_00.gz").write_bytes(gzip.compress(b'{"_id": "d1", "text": "x"}\n'))
    (tmp_path / "jsonl" / "backup.7z").write_bytes(b"7z\xbc\xaf\x27\x1c")
    assert [Path(s.path).name for s in list_sources(str(tmp_path / "jsonl"), "jsonl")] == ["part_00.gz"]
    (tmp_path / "corrupt.z").write_bytes(b"\x1f\x9d\x90" + b"\xff" * 64)  # compress's header over codes that decode to nothing
    sources = list_sources(str(tmp_path / "corrupt.z"), "trec")
    check_sources(sources)  # (its first bytes are compress's)
    with pytest.raises(SourceError, match=r"corrupt.z: unreadable: not Unix compress \(.Z\) data or corrupt") as info:
        list(read_source(sources[0]))
    assert "\n" not in str(info.value)


def test_aquaint2_and_gigaword_docs_are_known_by_their_doc_tags_id(tmp_path):
    """AQUAINT-2 and Gigaword write no DOCNO: the id is the DOC tag's ``id`` attribute (quoted
    either way, or not); a DOCNO, where a DOC has one, is its id; a DOC with neither is a
    ``missing_id`` reject naming both."""
    path = tmp_path / "apw_eng_200410"
    path.write_text(
        '<DOC id="APW_ENG_20041001.0001" type="story" >\n<HEADLINE>\nQuake &amp; aftershocks\n</HEADLINE>\n'
        "<DATELINE>TOKYO (AP) -- </DATELINE>\n<TEXT>\n<P>\nA strong quake shook Tokyo.\n</P>\n<P>\nNo damage.\n</P>\n</TEXT>\n</DOC>\n"
        "<DOC type='story' id='APW_ENG_20041001.0002'>\n<TEXT>\n<P>Second.</P>\n</TEXT>\n</DOC>\n"
        "<doc data-id='x' id=XIN_ENG_20041001.0003>\n<TEXT>Third.</TEXT>\n</doc>\n"
        '<DOC id="ignored">\n<DOCNO> FT911-9 </DOCNO>\n<TEXT>Fourth.</TEXT>\n</DOC>\n'
        '<DOC type="story" data-id="not-its-id">\n<TEXT>No id.</TEXT>\n</DOC>\n',
        encoding="utf-8",
    )
    table = _read_all(path, fmt="trec")
    assert _rows(table) == [("APW_ENG_20041001.0001", "Quake & aftershocks", "A strong quake shook Tokyo.\n\n\nNo damage."),
                            ("APW_ENG_20041001.0002", None, "Second."), ("XIN_ENG_20041001.0003", None, "Third."),
                            ("FT911-9", None, "Fourth."), (None, None, None)]
    assert table.column("_reason").to_pylist() == [None, None, None, None, "missing_id"]
    assert "nor an id attribute of its <DOC> tag" in table.column("_detail").to_pylist()[4]


def test_a_directory_in_ms_marcos_layout_never_indexes_its_queries_or_qrels(tmp_path):
    """collection.tsv beside queries.dev.tsv and qrels.dev.tsv (MS MARCO's layout): a directory's
    .tsv files are read only with --format tsv, which refuses the queries and qrels files; the
    collection file given itself is read."""
    from logicrank.pipelines.corpus import CorpusError

    (tmp_path / "collection.tsv").write_text("7187158\tthe first passage\n1048585\tthe second passage\n")
    (tmp_path / "queries.dev.tsv").write_text("1048585\twhat is a query\n")
    (tmp_path / "qrels.dev.small.tsv").write_text("1048585\t0\t7187158\t1\n")
    with pytest.raises(CorpusError, match="read only with --format tsv"):
        list_sources(str(tmp_path))
    with pytest.raises(CorpusError, match=r"holds query or relevance files \(qrels.dev.small.tsv, queries.dev.tsv\)"):
        list_sources(str(tmp_path), "tsv")
    assert _rows(_read_all(tmp_path / "collection.tsv")) == [("7187158", None, "the first passage"), ("1048585", None, "the second passage")]


def test_index_takes_format_trec(tmp_path):
    """``--format trec`` reaches the reader: a suffix-less binary file is refused as a TREC
    corpus before anything starts (a real run is in the integration tests' index job)."""
    from logicrank.cli import app

    assert IndexConfig(corpus="c", db="d", format="trec").format == "trec"
    path = tmp_path / "la010189"
    path.write_bytes(b"<DOC>\x00\x01\x02")
    res = CliRunner().invoke(app, ["index", str(path), "--format", "trec", "--db", str(tmp_path / "db"), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "a TREC SGML corpus is UTF-8 text" in " ".join(res.output.split()), res.output
    res = CliRunner().invoke(app, ["index", str(path), "--format", "sgml", "--db", str(tmp_path / "db")])
    assert res.exit_code == 2 and "--format 'sgml'" in res.output, res.output


TOPICS = """<top>
<num> Number: 301
<title> International Organized Crime

<desc> Description:
Identify organizations that participate in international criminal
activity.

<narr> Narrative:
A relevant document must as a minimum identify the organization &amp; activity.
</top>

<top>
<num> Number: 051 </num>
<title> Topic: Airbus Subsidies </title>
<desc> Description: Document will discuss government assistance to Airbus. </desc>
<narr> Narrative: To be relevant, a document must cite assistance. </narr>
</top>
"""


def test_trec_topics_by_field_and_gzip(tmp_path):
    path = tmp_path / "topics.301-350"
    path.write_text(TOPICS)
    q = read_queries(path)
    assert q.column("query_id").to_pylist() == ["301", "51"]  # Number: 051 is topic 51, as qrels write it
    assert q.column("text").to_pylist() == ["International Organized Crime", "Airbus Subsidies"]
    assert read_queries(path, "desc").column("text").to_pylist() == [
        "Identify organizations that participate in international criminal activity.",
        "Document will discuss government assistance to Airbus."]
    assert read_queries(path, "narr").column("text")[0].as_py() == "A relevant document must as a minimum identify the organization & activity."
    gz = tmp_path / "topics.txt.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(TOPICS)
    assert read_queries(gz, "desc").equals(read_queries(path, "desc"))


def test_xml_topics(tmp_path):
    path = tmp_path / "topics-rnd5.xml"
    path.write_text('<?xml version="1.0" encoding="UTF-8"?>\n<topics>\n'
                    '<topic number="1">\n  <query>coronavirus origin</query>\n  <question>what is the origin of COVID-19</question>\n'
                    '  <narrative>seeking range of information</narrative>\n</topic>\n'
                    '<topic number="2"><query>coronavirus response to weather changes</query>'
                    '<question>how does the coronavirus respond?</question><narrative>seeking data</narrative></topic>\n</topics>\n')
    assert read_queries(path).column("text").to_pylist() == ["coronavirus origin", "coronavirus response to weather changes"]
    assert read_queries(path, "desc").column("text").to_pylist() == ["what is the origin of COVID-19", "how does the coronavirus respond?"]
    assert read_queries(path, "narr").column("query_id").to_pylist() == ["1", "2"]
    path.write_text('<topics><topic number="0001"><query>padded</query></topic></topics>')
    assert read_queries(path).column("query_id").to_pylist() == ["0001"]  # an attribute's id is kept as written
    path.write_text('<top number="0001">\n<title> padded\n</top>\n')
    assert read_queries(path).column("query_id").to_pylist() == ["0001"]  # an attribute's id, even on <top>
    # NTCIR's topics: <TOPIC><NUM>0001</NUM>, its qrels writing 0001 (only TREC's <top> blocks drop the zeros)
    path.write_text("<TOPIC>\n<NUM>0001</NUM>\n<SLANG>EN</SLANG>\n<TITLE>Emergency Room Service</TITLE>\n</TOPIC>\n")
    assert read_queries(path).to_pylist() == [{"query_id": "0001", "text": "Emergency Room Service", "logical_query": None}]
    # a topic commented out is not read; a CDATA section is its characters, taken literally
    path.write_text('<topics>\n<!-- retired:\n<topic number="99"><query>old</query></topic> -->\n'
                    '<topic number="1"><query><![CDATA[salt & pepper <b> <!--]]></query></topic>\n'
                    '<topic number="2"><query>fish &amp; chips</query></topic>\n<topic number="3"></topic>\n</topics>\n')
    with pytest.raises(TopicsError, match=r"topic 3 \(line 6\) has no <title>"):  # (the comment's lines still counted)
        read_queries(path)
    path.write_text(path.read_text().replace('<topic number="3"></topic>\n', ""))
    assert read_queries(path).to_pylist() == [{"query_id": "1", "text": "salt & pepper <b> <!--", "logical_query": None},
                                              {"query_id": "2", "text": "fish & chips", "logical_query": None}]


def test_clef_and_trec_genomics_topics_as_published(tmp_path):
    """CLEF's ad hoc topics (``<num> C041 </num>``, ``<EN-title>``, ``<EN-desc>``, ``<EN-narr>``)
    and TREC Genomics 2004's (``<TOPIC><ID>1</ID><TITLE>``): their fields and numbers, ids kept
    as written."""
    clef = tmp_path / "Top-en03.txt"
    clef.write_text("<top>\n<num> C141 </num>\n<EN-title> Letter Bomb for Kiesbauer </EN-title>\n"
                    "<EN-desc> Find information on the explosion of a letter bomb. </EN-desc>\n"
                    "<EN-narr> Relevant documents report the attack. </EN-narr>\n</top>\n")
    assert read_queries(clef).to_pylist() == [{"query_id": "C141", "text": "Letter Bomb for Kiesbauer", "logical_query": None}]
    assert read_queries(clef, "desc").column("text").to_pylist() == ["Find information on the explosion of a letter bomb."]
    assert read_queries(clef, "narr").column("text").to_pylist() == ["Relevant documents report the attack."]
    genomics = tmp_path / "2004_TREC_ASCII_ADHOC_TOPICS.txt"
    genomics.write_text("<TOPIC>\n<ID>1</ID>\n<TITLE>Ferroportin-1 in humans</TITLE>\n<NEED>Find articles about Ferroportin-1.</NEED>\n"
                        "</TOPIC>\n<TOPIC>\n<ID>2</ID>\n<TITLE>Generating transgenic mice</TITLE>\n</TOPIC>\n")
    assert read_queries(genomics).to_pylist() == [{"query_id": "1", "text": "Ferroportin-1 in humans", "logical_query": None},
                                                  {"query_id": "2", "text": "Generating transgenic mice", "logical_query": None}]


def test_ntcir_www_topics_as_published(tmp_path):
    """NTCIR WWW's topics (``<queries><query><qid>0001</qid><content>``): the content is the
    title, the description the desc, ids as written (its qrels write 0001)."""
    path = tmp_path / "www3topics-E.xml"
    path.write_text('<?xml version="1.0" encoding="UTF-8"?>\n<queries>\n<query>\n<qid>0001</qid>\n<content>ascii code</content>\n'
                    "<description>I want to look up the ASCII code table &amp; its history.</description>\n</query>\n"
                    "<query><qid>0002</qid><content>\n  hotel booking\n</content></query>\n</queries>\n")
    assert read_queries(path).to_pylist() == [{"query_id": "0001", "text": "ascii code", "logical_query": None},
                                              {"query_id": "0002", "text": "hotel booking", "logical_query": None}]
    with pytest.raises(TopicsError, match=r"query 0002 \(line 8\) has no <description>"):
        read_queries(path, "desc")


def test_topics_refusals_name_the_topic_and_the_fix(tmp_path):
    path = tmp_path / "topics.trec"
    path.write_text(TOPICS + "<top>\n<num> Number: 399\n<title> Only a title\n</top>\n")
    assert read_queries(path).num_rows == 3
    with pytest.raises(TopicsError, match=r"^queries .*topics.trec: topic 399 \(line 19\) has no <desc> .*pick a field it has \(title\)"):
        read_queries(path, "desc")
    with pytest.raises(TopicsError, match="topics field 'summary'; use one of title, desc, narr"):
        read_queries(path, "summary")  # type: ignore[arg-type]
    path.write_text("<top>\n<title> no number\n</top>\n")
    with pytest.raises(TopicsError, match=r"topic at line 1 has no number"):
        read_queries(path)
    path.write_text(TOPICS + TOPICS)
    with pytest.raises(TopicsError, match=r"duplicate query ids \['301', '51'\]"):
        read_queries(path)
    path.write_text("<top>\n<num> Number: 301\n<title> one\n\n<num> Number: 302\n<title> two\n</top>\n")  # a </top><top> missing
    with pytest.raises(TopicsError, match=r"the topic at line 1 holds two <num> fields"):
        read_queries(path)
    path.write_text("<html>not topics</html>")
    with pytest.raises(TopicsError, match="holds no <top> or <topic> element"):
        read_queries(path)


def test_tsv_queries(tmp_path):
    path = tmp_path / "queries.dev.tsv"
    path.write_text("1048585\twhat is paula deen's brother\r\n2\t  )what was the immediate impact  \n\n")
    q = read_queries(path)
    assert q.column("query_id").to_pylist() == ["1048585", "2"]
    assert q.column("text").to_pylist() == ["what is paula deen's brother", ")what was the immediate impact"]
    gz = tmp_path / "queries.tsv.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write("1048585\twhat is paula deen's brother\n2\t)what was the immediate impact\n")
    assert read_queries(gz).equals(q)
    # named otherwise, told by its first line (Anserini's topics.*.txt, TREC RAG 2024's topics.rag24.test.txt)
    path = tmp_path / "topics.rag24.test.txt"
    path.write_text("\n2024-105741\tdo abortion rights vary by state\n2024-127349\thow does a solar panel work\n")
    assert read_queries(path).column("query_id").to_pylist() == ["2024-105741", "2024-127349"]
    with gzip.open(tmp_path / "topics.dl19.txt.gz", "wt", encoding="utf-8") as f:
        f.write("1048585\twhat is paula deen's brother\n2\t)what was the immediate impact\n")
    assert read_queries(tmp_path / "topics.dl19.txt.gz").equals(q)
    path = tmp_path / "queries.txt"  # a JSONL file with a tab inside a line is JSONL
    path.write_text('{"_id":\t"1", "text": "a\\tb"}\n')  # (a tab between JSON's tokens, and JSON's escape of one)
    assert read_queries(path).column("text").to_pylist() == ["a\tb"]
    path.write_text('{"_id": "1", "text": "a"}\n2\tno JSON\n')
    with pytest.raises(TopicsError, match=r"line 2 .*a TSV query file holds only such lines"):
        read_queries(path)


@pytest.mark.parametrize(("bad", "words"), [("1\tok\nno tab\n", "line 2 has no tab"), ("1\ta\tb\n", "line 1 has 3 tab-separated fields"),
                                            ("\tno id\n", "line 1 has an empty query id")])
def test_bad_tsv_queries_are_refused_naming_the_line(tmp_path, bad, words):
    path = tmp_path / "queries.dev.tsv"
    path.write_text(bad)
    with pytest.raises(TopicsError, match=f"^queries {path}: {words}"):
        read_queries(path)


def test_a_byte_order_mark_is_not_text(tmp_path):
    trec = tmp_path / "bom.trec"
    trec.write_bytes(b"\xef\xbb\xbf" + GOOD.format("b1").encode())
    tsv = tmp_path / "bom.tsv"
    tsv.write_bytes(b"\xef\xbb\xbf1\tone\n")
    assert _rows(_read_all(trec)) == [("b1", None, "text of b1")]
    assert _rows(_read_all(tsv)) == [("1", None, "one")]
    (tmp_path / "q.tsv").write_bytes(b"\xef\xbb\xbf1\tone\n")
    assert read_queries(tmp_path / "q.tsv").column("query_id").to_pylist() == ["1"]


def test_the_topics_field_reaches_retrieve_and_decompose(tmp_path):
    """retrieve's --topics-field (and topics_field: of a decompose config) picks the field:
    a topic without it is refused in one line before anything starts."""
    from pydantic import ValidationError

    from logicrank.cli import app
    from logicrank.pipelines.config.retrieval import DecomposeConfig

    topics = tmp_path / "topics.txt"
    topics.write_text("<top>\n<num> Number: 7\n<title> only a title\n</top>\n")
    res = CliRunner().invoke(app, ["retrieve", str(topics), "--topics-field", "narr", "--db", str(tmp_path / "db"), "--method", "bm25",
                                   "--out", str(tmp_path / "out")])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "topic 7 (line 1) has no <narr>" in lines[0], res.output
    res = CliRunner().invoke(app, ["retrieve", str(topics), "--topics-field", "body", "--db", str(tmp_path / "db")])
    assert res.exit_code == 2 and "--topics-field 'body'" in res.output, res.output
    assert DecomposeConfig(queries="q", topics_field="desc").topics_field == "desc"
    with pytest.raises(ValidationError):
        DecomposeConfig(queries="q", topics_field="body")


def test_a_doc_just_under_or_over_the_limit_is_judged_the_same_whatever_the_read_boundaries():
    """Whether a DOC is oversized depends on its size alone, never on where a read cut a
    </DOC> tag: bodies from 4 under to 4 over the limit, every chunk size up to 3 x the tag."""
    cap = 100
    for size in range(cap - 4, cap + 5):
        data = f"<DOC><DOCNO>x</DOCNO><TEXT>{'y' * (size - len('<DOCNO>x</DOCNO><TEXT></TEXT>'))}</TEXT></DOC>\n".encode()
        want = [u[0] for u in trec_units(io.BytesIO(data), cap)]
        assert want == ["doc" if size <= cap else "oversized"], size
        for chunk in range(1, 3 * 256):
            assert [u[0] for u in trec_units(io.BytesIO(data), cap, chunk=chunk)] == want, (size, chunk)


def _classic(shape: str, n: int, title: str, text: str) -> str:
    """One document shaped as the classic TREC collections ship them (Disks 4-5, WSJ)."""
    body = text.split(". ")
    paras = "".join(f"<P>\n{html.escape(p, quote=False)}\n</P>\n" for p in body)
    if shape == "latimes":
        return (f"<DOC>\n<DOCNO> LA0101{n:02d}-0{n:03d} </DOCNO>\n<DOCID> {n} </DOCID>\n<DATE>\n<P>\nDATEMARK 1989\n</P>\n</DATE>\n"
                f"<SECTION>\n<P>\nPart A\n</P>\n</SECTION>\n<LENGTH>\n<P>\n120 words\n</P>\n</LENGTH>\n"
                f"<HEADLINE>\n<P>\n{html.escape(title, quote=False)}\n</P>\n</HEADLINE>\n<BYLINE>\n<P>\nBYLINEMARK\n</P>\n</BYLINE>\n"
                f"<TEXT>\n{paras}</TEXT>\n<TYPE>\n<P>\nWire\n</P>\n</TYPE>\n</DOC>\n")
    if shape == "fbis":
        return (f"<DOC>\n<DOCNO> FBIS3-{n} </DOCNO>\n<HT>  \"drweu001_a_94001\" </HT>\n<HEADER>\n<AU>   FBIS-WEU-94-001 </AU>\n"
                f"Document Type:Daily Report \n<DATE1>  3 January 1994 </DATE1>\n<H2>  WEST EUROPE </H2>\n"
                f"<TI> {html.escape(title, quote=False)} </TI>\n</HEADER>\n"
                f"<TEXT>\nLanguage: <F P=105> English </F>\nArticle Type:BFN \n{paras}</TEXT>\n</DOC>\n")
    if shape == "fr94":
        return (f"<DOC>\n<DOCNO> FR940104-0-{n:05d} </DOCNO>\n<PARENT> FR940104-0-00001 </PARENT>\n<TEXT>\n"
                f"<!-- PJG FTAG 4700 -->\n<!-- PJG STAG 4700 -->\n<!-- PJG ITAG l=94 g=1 f=1 -->\n"
                f"<USDEPT>Department of Agriculture</USDEPT>\n{paras}<!-- PJG 0012 frnewline -->\n</TEXT>\n</DOC>\n")
    return (f"<DOC>\n<DOCNO> WSJ870324-0{n:03d} </DOCNO>\n<HL> {html.escape(title, quote=False)} </HL>\n<DD> 03/24/87</DD>\n"
            f"<SO> WALL STREET JOURNAL (J)</SO>\n<IN> MEDICINE </IN>\n<TEXT>\n{paras}</TEXT>\n</DOC>\n")


def test_the_classic_collections_shapes_give_their_headlines_and_their_text_alone(tmp_path):
    """Three hundred SciFact abstracts written in the shapes of LA Times (HEADLINE, P-wrapped
    fields), FBIS (TI inside HEADER, an <F P=105> tag), the Federal Register (PJG comments,
    USDEPT inside TEXT) and WSJ (HL): each document's title is its headline, its text the TEXT
    paragraphs (one space or newline between them, never glued), the other fields dropped."""
    with gzip.open(scifact().corpus, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in itertools.islice(f, 300)]
    shapes = ("latimes", "fbis", "fr94", "wsj")
    path = tmp_path / "disk45.trec"
    path.write_text("".join(_classic(shapes[i % 4], i, d["title"].strip(), d["text"]) for i, d in enumerate(docs)), encoding="utf-8")
    got = _read_all(path)
    assert got.num_rows == 300 and got.column("_reason").null_count == 300
    for i, (doc_id, title, text) in enumerate(_rows(got)):
        shape, d = shapes[i % 4], docs[i]
        words = " ".join(d["text"].split(". ")).split()
        if shape == "fbis":
            words = ["Language:", "English", "Article", "Type:BFN", *words]
        if shape == "fr94":
            words = ["Department", "of", "Agriculture", *words]
        assert text.split() == words, (shape, doc_id)  # nothing glued, nothing from DATE, BYLINE, SECTION, HEADER, DD ...
        assert title == (None if shape == "fr94" else d["title"].strip()), (shape, doc_id)
        assert "DATEMARK" not in text and "BYLINEMARK" not in text and "FBIS-WEU" not in text and "PJG" not in text


def test_web_pages_lead_paragraphs_and_word_boundaries(tmp_path):
    """A DOC holding a web page (<html>) takes its title from HTML's <title> alone, never its
    <head> or <script>; WSJ's LP and SJM's LEADPARA are text, before TEXT; a block tag or a
    comment between two words parts them, an inline tag does not."""
    path = tmp_path / "mixed.trec"
    path.write_text(
        "<DOC><DOCNO>GX000-00-0000000</DOCNO><DOCHDR>http://example.gov/</DOCHDR>\n<html><head><title>Page T</title>"
        "<script>var x = 1;</script><style>body {}</style></head><body><p>Hello</p><p>world</p><svg><text>label</text></svg></body></html></DOC>\n"
        "<DOC><DOCNO>WSJ910102-0001</DOCNO><HL>A Headline</HL><LP>Lead paragraph.</LP><TEXT>Body text.</TEXT></DOC>\n"
        "<DOC><DOCNO>SJMN91-0001</DOCNO><LEADPARA>Lead.</LEADPARA><TEXT>H<SUB>2</SUB>O is <B>water</B>, one<!-- c -->two</TEXT></DOC>\n",
        encoding="utf-8")
    rows = _rows(_read_all(path))
    assert rows[0][:2] == ("GX000-00-0000000", "Page T") and rows[0][2].split() == ["http://example.gov/", "Hello", "world", "label"]  # DOCHDR kept
    assert rows[1:] == [
        ("WSJ910102-0001", "A Headline", "Lead paragraph.\nBody text."),
        ("SJMN91-0001", None, "Lead.\nH2O is water, one two"),
    ]
    # a web collection's page without <html> (WT10g, GOV2: it starts at <HEAD>) is a page too:
    # its <HEAD> is not a news title, nor an SVG's <text> its text; declarations are markup
    path.write_text(
        "<DOC><DOCNO>WTX001-B01-1</DOCNO><DOCHDR>http://a.b/</DOCHDR><HEAD><TITLE>T</TITLE><SCRIPT>var a=1;</SCRIPT>"
        "<STYLE>b{c:d}</STYLE></HEAD><BODY>hello <p>main body</p><svg><text>label</text></svg></BODY></DOC>\n"
        '<DOC><DOCNO>G2</DOCNO><?xml version="1.0"?><!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0//EN" "http://w3.org/x">'
        "<html><title>P</title>words <![CDATA[a<b]]></html></DOC>\n", encoding="utf-8")
    rows = _rows(_read_all(path))
    assert [(r[0], r[1], r[2].split()) for r in rows] == [("WTX001-B01-1", "T", ["http://a.b/", "hello", "main", "body", "label"]),
                                                          ("G2", "P", ["words", "a<b"])]
    # a news DOC with a <BODY> (AQUAINT's) is news: its HEADLINE the title, its TEXT the text
    path.write_text("<DOC>\n<DOCNO> APW19980601.0003 </DOCNO>\n<DOCTYPE> NEWS STORY </DOCTYPE>\n<DATE_TIME> 1998-06-01 </DATE_TIME>\n"
                    "<BODY>\n<SLUG> BC-Soccer </SLUG>\n<HEADLINE>\nBrazil wins\n</HEADLINE>\n<TEXT>\n<P>\nThe story.\n</P>\n</TEXT>\n"
                    "</BODY>\n<TRAILER> AP-NY-06-01-98 </TRAILER>\n</DOC>\n", encoding="utf-8")
    assert _rows(_read_all(path)) == [("APW19980601.0003", "Brazil wins", "The story.")]


def test_the_index_command_says_which_corpus_files_it_left_out(tmp_path, monkeypatch):
    """The files ``--format trec`` leaves out of a directory (READMEs, DTDs, ``cr/``) are named
    on the terminal, not only in the run's manifest."""
    import logicrank.jobs.index
    from logicrank.cli import app
    from logicrank.jobs.index import IndexSummary

    left = [str(tmp_path / "disk4" / "readmefr"), str(tmp_path / "disk4" / "cr" / "hfiles" / "cr93h1.1z")]
    from logicrank.pipelines.corpus import TREC_NOT_READ

    monkeypatch.setattr(logicrank.jobs.index, "run_index",
                        lambda cfg, out, progress=False: IndexSummary(not_read=left, why_not_read=TREC_NOT_READ, table_version=1))
    res = CliRunner().invoke(app, ["--stall-timeout", "0", "index", str(tmp_path), "--format", "trec", "--db", str(tmp_path / "db"),
                                   "--out", str(tmp_path / "r"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert f"index: 2 file(s) under the corpus directory not read, as Anserini's TrecCollection leaves them out (READMEs, DTDs, " \
           f"the Congressional Record: cr/), e.g. {left[0]}; the run's manifest lists them." in " ".join(res.output.split())


def test_every_layout_lists_its_sources_with_what_was_left_out(tmp_path):
    """A BEIR directory, a file and a directory of files: each listing carries ``not_read`` (the
    index job records it), empty where nothing is left out by rule."""
    from logicrank.pipelines.corpus import Sources

    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "x"}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\n')
    (tmp_path / "dir").mkdir()
    write_trec(tmp_path / "dir" / "a.trec", DOCS[:1])
    for location, fmt in ((beir, "auto"), (beir / "corpus.jsonl", "auto"), (tmp_path / "dir", "auto"), (tmp_path / "dir", "trec")):
        listed = list_sources(str(location), fmt)
        assert isinstance(listed, Sources) and listed.not_read == () and len(listed) == 1, (location, fmt)
