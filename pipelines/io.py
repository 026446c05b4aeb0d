"""Queries, qrels and runs (PyTerrier's ``pt.io``): readers and writers for the formats users bring.

- queries: BEIR ``queries.jsonl`` (``_id``, ``text``), JSONL with ``query_id``/``qid``, Parquet,
  ``qid<TAB>text`` TSV (MS MARCO's ``queries.tsv``: a ``.tsv`` name, or a first line of that
  shape, as Anserini's ``topics.*.txt``; no header, exactly two fields a line) or a TREC topics file (told by its first non-blank character, ``<``):
  ``<top>`` blocks (``<num> Number: 301``, ``<title>``, ``<desc> Description:``,
  ``<narr> Narrative:``; closing tags optional, the labels stripped) or ``<topic number="1">``
  elements (``<query>``, ``<question>`` or ``<description>``, ``<narrative>``), the query text
  being the field ``field`` names (title, desc or narr), whitespace runs made one space; a
  comment is no text, a CDATA section its characters, two ``<num>`` in one block refused;
- QUEST's examples (``train.jsonl``, ``test.jsonl``: ``query``, ``docs``, no id; Malaviya et al.,
  2023) are queries and qrels at once: an example's id is made from its query's text
  (:func:`quest_query_id`), its text ``query``,
  and each title in ``docs`` a relevant document (relevance 1), the title being the id of
  QUEST's documents (``documents.jsonl``: ``title``, ``text``; :mod:`logicrank.pipelines.corpus`);
  LoTTE's ``qas.*.jsonl`` (``qid``, ``answer_pids``) are qrels the same way;
- qrels: BEIR TSV (first line the header ``query-id<TAB>corpus-id<TAB>score``, or with
  ``query_id``/``qid``; every line split on tabs only, so ids may hold spaces) or TREC
  (``qid 0 docno rel``, no header, split on any whitespace; ``qid docno rel`` is accepted too,
  every line with the fields of the first) or Parquet (a query, a document and an integer
  relevance column under QRELS's, BEIR's or ir_datasets' names); a relevance as trec_eval
  reads it (an integer, or a decimal up to its point), any other form refused;
- runs: our Parquet run table (RUN), or a TREC run file (``qid Q0 docno rank score tag``;
  fields after the tag ignored, as trec_eval ignores them).

A TREC run's or TREC qrels' line that starts with ``#`` is a comment, skipped as trec_eval
skips it (a run's after leading spaces too).

A text file (gzipped or not) may start with a UTF-8 byte order mark: it is not read as text.

Evaluation must equal trec_eval or refuse, so the readers follow trec_eval's rules and every
refusal names the file, what is wrong and the fix:

- a TREC run is ranked as trec_eval ranks it: by score descending, the score as trec_eval
  stores it (``atof`` into a 32-bit ``float``: 40.123401 and 40.1234 are one score), equal
  scores by docno descending (byte order, trec_eval's reverse ``strcmp``); its rank column is
  ignored and ``rank`` is recomputed; the ``score`` column keeps the file's 64-bit value; a
  score ``atof`` would read otherwise than Python's ``float`` (``1_0``, non-ASCII digits) is refused;
- a Parquet run is ranked by its ``rank`` column, so each stage's own tie-break holds; within
  a query, ranks must be distinct positive integers and a better (lower) rank must never
  have a strictly lower score than a worse one, scores compared in 32 bits as trec_eval
  stores them (equal scores may take any order);
- scores must be finite, and a run or qrels file must have at least one row;
- a (query, doc) pair may appear once in a run (as trec_eval, we refuse repeats;
  ``duplicates="first"`` keeps each pair's best-ranked row instead and counts the others)
  and once in the qrels;
- a TREC run line cannot carry an empty id, one holding whitespace or a query id starting
  with ``#`` (a comment to trec_eval): ``write_trec_run`` refuses them (the Parquet run carries
  any id).
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logicrank.pipelines.files import atomic_path, jsonl_objects, open_text, read_jsonl, reading, utf8_text
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import QRELS, QUERIES, RUN, conform, require_columns

QUERY_ID_KEYS = ("query_id", "_id", "qid", "id")
_QTEXT_KEYS = ("text", "query", "title")
_BEIR_HEADER = ("query-id", "query_id", "qid")
# A TREC run's score as trec_eval's atof reads all of it (inf and nan too: check_run refuses them).
_SCORE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)", re.IGNORECASE)
DUPLICATES_REMOVED = b"duplicates_removed"  # read_run's schema metadata: rows dropped by duplicates="first"
Duplicates = Literal["refuse", "first"]


class TopicsError(UserError, ValueError):
    """A queries, qrels or run file (or table) cannot be read or evaluated as it is."""


TopicsField = Literal["title", "desc", "narr"]
TOPICS_FIELDS: tuple[str, ...] = ("title", "desc", "narr")


def read_queries(path: str | Path, field: TopicsField = "title") -> pa.Table:
    """Queries table (QUERIES) from BEIR JSONL, Parquet, TSV or a TREC topics file (module
    docstring); ``field`` picks a topic's text: ``title`` (the default) a TREC topic's title
    or a record's ``text``/``query``/``title``; ``desc`` or ``narr`` a TREC topic's field or a
    JSONL record's key or Parquet column of that name (ir_datasets' ``description``,
    ``narrative``), refused where there is none (a TSV file holds one text). Rejects
    unreadable lines loudly: a query set must be whole."""
    path = Path(path)
    if field not in TOPICS_FIELDS:
        raise TopicsError(f"queries {path}: topics field {field!r}; use one of {', '.join(TOPICS_FIELDS)}.")
    if path.is_dir():
        path = path / "queries.jsonl"
    if not path.exists():
        raise TopicsError(f"queries: no file at {str(path)!r}.")
    if path.suffix.lower() in (".parquet", ".pq"):
        return queries_table(_field_column(_read_parquet(path, "queries"), field, path), f"queries {path}")
    with reading(f"queries {path}", TopicsError), open_text(path) as f:
        # read once, whole (a query set is small): a pipe (`--queries <(zcat queries.jsonl.gz)`) cannot be rewound
        # after its first character tells its format. Lines end as a file's read through open_text end: \n, \r\n or \r
        f = io.StringIO(f.read(), newline=None)
    kind = text_queries_format(f, path)
    if kind == "tsv":
        if field != "title":
            raise TopicsError(f"queries {path}: topics field {field!r}, but a TSV query file holds one text a query (qid<TAB>text); "
                              "give the topics file or a JSONL file with that field, or leave the topics field as title.")
        rows = _read_tsv_queries(f, path)
    elif kind == "trec":
        rows = _read_trec_topics(f.read(), path, field)
    else:
        rows = _read_jsonl_queries(f, path, field)
    if not rows:
        raise TopicsError(f"queries {path}: no queries (the file is empty); give the queries to run.")
    ids = [r["query_id"] for r in rows]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise TopicsError(f"queries {path}: duplicate query ids {dup}.")
    return pa.Table.from_pylist(rows, schema=QUERIES)


def text_queries_format(f, path: Path) -> Literal["tsv", "trec", "jsonl"]:
    """The format of a queries file that is text (``f``, open, rewound after): ``tsv`` (a
    ``.tsv`` name, or a first line of ``qid<TAB>text``), ``trec`` (topics: its first character
    ``<``) or ``jsonl``."""
    if path.name.lower().endswith((".tsv", ".tsv.gz")) or _tab_separated(f):
        return "tsv"
    return "trec" if _first_char(f) == "<" else "jsonl"


def _tab_separated(f) -> bool:
    """Whether a text file whose name marks no format holds ``qid<TAB>text`` lines (Anserini's
    ``topics.*.txt``, TREC RAG's ``topics.rag24.test.txt``): its first non-blank line holds a tab
    and is neither a JSON object nor a tag. The file rewound."""
    first = next((line for line in f if line.strip()), "")
    f.seek(0)
    return "\t" in first and not first.lstrip().startswith(("{", "<"))


def _first_char(f) -> str:
    """The first non-blank character of a text file, the file rewound."""
    while chunk := f.read(4096):
        rest = chunk.lstrip()
        if rest:
            f.seek(0)
            return rest[0]
    f.seek(0)
    return ""


def _read_jsonl_queries(lines: Iterable[str], path: Path, field: TopicsField = "title") -> list[dict]:
    rows = []
    keys = _QTEXT_KEYS if field == "title" else _FIELD_TAGS[field]  # (ir_datasets' JSONL topics: title, description, narrative)
    expect = f"with an id ({list(QUERY_ID_KEYS)}) and a text ({list(keys)}{'' if field == 'title' else ': the topics field ' + field})"
    for n, obj in jsonl_objects(lines, f"queries {path}", TopicsError, expect, _tab_hint):
        text = next((obj[k] for k in keys if k in obj), _MISSING)
        if text is _MISSING or not (any(k in obj for k in QUERY_ID_KEYS) or quest_example(obj)):
            raise TopicsError(f"queries {path}: line {n} is not a JSON object {expect}.")
        rows.append({"query_id": jsonl_query_id(obj, path, n), "text": _query_text(text, path, n),
                     "logical_query": _logical_text(obj.get("logical_query"), path, n)})
    return rows


_MISSING = object()


def quest_query_id(query: str) -> str:
    """The id of QUEST's example asking ``query``: ``quest-`` and 16 hex digits of its SHA-256.
    From the text, not the line: the same question has one id in every file (train, val,
    test, a sample of one), and the qrels of another file share no id with a run (refused,
    never scored against another question's documents)."""
    return "quest-" + hashlib.sha256(query.encode("utf-8")).hexdigest()[:16]


def quest_example(obj: dict) -> bool:
    """Whether a JSONL record is one of QUEST's examples: a ``query`` and its ``docs`` (a list
    of titles), no id of its own."""
    return "query" in obj and isinstance(obj.get("docs"), list) and not any(k in obj for k in QUERY_ID_KEYS)


def jsonl_query_id(obj: dict, path: Path, n: int) -> str:
    """The id of the JSONL query record ``obj`` (line ``n`` of ``path``) as every job reads
    it: the first of ``query_id``, ``_id``, ``qid``, ``id`` it has (see :func:`_query_id`);
    one of QUEST's examples, which have none, is known by its query's text, as QUEST's
    evaluation matches predictions (:func:`quest_query_id`)."""
    if quest_example(obj):
        if not isinstance(obj["query"], str):
            raise TopicsError(f"queries {path}: line {n}: the query is {json.dumps(obj['query'])[:80]}; give a string.")
        return quest_query_id(obj["query"])
    qid = next((obj[k] for k in QUERY_ID_KEYS if k in obj), _MISSING)
    if qid is _MISSING:
        raise TopicsError(f"queries {path}: line {n} has no id (one of {list(QUERY_ID_KEYS)}).")
    return _query_id(qid, path, n)


def _query_id(qid, path: Path, n: int) -> str:
    """A JSONL query's id as text: a string, or an integer as its decimal text; anything else
    (null, true, 3.0, a list) would become an id no qrels line holds, and is refused."""
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise TopicsError(f"queries {path}: line {n}: the query id is {json.dumps(qid)}; give a string (or an integer).")
    qid = str(qid)
    if not qid.strip() or qid != qid.strip() or not utf8_text(qid):
        raise TopicsError(f"queries {path}: line {n}: the query id {qid!r} is blank, has surrounding whitespace or is not text; "
                          "qrels and runs name it exactly as given.")
    return qid


def _query_text(text, path: Path, n: int) -> str:
    """A JSONL query's text, a string (blank is a query with no text: the jobs say so)."""
    if not isinstance(text, str):
        raise TopicsError(f"queries {path}: line {n}: the query text is {json.dumps(text)}; give a string.")
    if not utf8_text(text):
        raise TopicsError(f"queries {path}: line {n}: the query text holds a lone surrogate escape (half of a pair: no character).")
    return text


def _logical_text(form, path: Path, n: int) -> str | None:
    """A JSONL query's ``logical_query``: a string, or null (none)."""
    if form is not None and not isinstance(form, str):
        raise TopicsError(f"queries {path}: line {n}: the logical query is {json.dumps(form)}; give a string ('\"a\" AND NOT \"b\"') "
                          "or leave it out.")
    if form is not None and not utf8_text(form):
        raise TopicsError(f"queries {path}: line {n}: the logical query holds a lone surrogate escape (half of a pair: no character).")
    return form




def _tab_hint(line: str) -> str:
    return " (a qid<TAB>text line: a TSV query file holds only such lines)" if "\t" in line else ""


_QUERY_HEADER = frozenset({"qid", "query_id", "query-id", "queryid", "id", "_id", "topic", "topic_id"})  # a header's first field


def _read_tsv_queries(f, path: Path) -> list[dict]:
    """``qid<TAB>text`` a line; no header; blank lines skipped; the text's surrounding whitespace stripped."""
    rows = []
    for n, line in enumerate(f, 1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            what = "no tab" if len(parts) == 1 else f"{len(parts)} tab-separated fields"
            raise TopicsError(f"queries {path}: line {n} has {what}; a TSV queries line is qid<TAB>text (no header): "
                              "separate the id and the text with one tab.")
        qid, text = parts[0].strip(), parts[1].strip()
        if not qid:
            raise TopicsError(f"queries {path}: line {n} has an empty query id; give every query an id before its tab.")
        if not rows and qid.lower() in _QUERY_HEADER:
            raise TopicsError(f"queries {path}: line {n} is a header ({line!r}), which a TSV queries file has none of: "
                              "remove it (every line is qid<TAB>text).")
        rows.append({"query_id": qid, "text": text, "logical_query": None})
    return rows


# TREC topics: a <top> block or a <topic ...> element; a field runs from its tag to the next tag
_TOPIC_OPEN = re.compile(r"<(top|topic)(\s[^<>]*)?>", re.I)
_TOPIC_CLOSE = re.compile(r"</(top|topic)\s*>", re.I)
_TOPIC_TAG = re.compile(r"<(/?)([A-Za-z][\w.:-]*)(?:\s[^<>]*)?/?>")
_TOPIC_NUMBER = re.compile(r"""\bnumber\s*=\s*["']?([^"'\s>]+)""", re.I)
_TOPIC_LABEL = re.compile(r"^\s*(number|topic|description|narrative)\s*:", re.I)
_COMMENT_OR_CDATA = re.compile(r"<!--.*?-->|<!\[CDATA\[(.*?)\]\]>", re.S)  # in one pass: either may hold the other's marks
# (CLEF's English topics: <EN-title>, <EN-desc>, <EN-narr>)
_FIELD_TAGS = {"title": ("title", "query", "en-title"), "desc": ("desc", "description", "question", "en-desc"),
               "narr": ("narr", "narrative", "en-narr")}
_FIELD_NAMES = {"title": "<title> (or <query>, <EN-title>)", "desc": "<desc> (or <description>, <question>, <EN-desc>)",
                "narr": "<narr> (or <narrative>, <EN-narr>)"}


def _topic_text(raw: str) -> str:
    """A field's text: its label (``Number:``, ``Topic:``, ``Description:``, ``Narrative:``)
    stripped, entities decoded, whitespace runs made one space."""
    return " ".join(html.unescape(_TOPIC_LABEL.sub("", raw, count=1)).split())


def _read_trec_topics(text: str, path: Path, field: str) -> list[dict]:
    # a comment (a topic commented out) is no text, its lines kept for the line numbers; a CDATA
    # section is its characters, escaped here as the rest of the text is (decoded with it)
    text = _COMMENT_OR_CDATA.sub(lambda m: "\n" * m.group(0).count("\n") if m.group(1) is None else html.escape(m.group(1), quote=False), text)
    rows = []
    opens = list(_TOPIC_OPEN.finditer(text))
    if not opens and _NTCIR_QUERY.search(text):
        return _read_ntcir_queries(text, path, field)
    if not opens:
        raise TopicsError(f"queries {path}: starts with '<' but holds no <top> or <topic> element; give a TREC topics file "
                          "(<top> <num> Number: 301 <title> ...), or JSONL, TSV or Parquet queries.")
    for i, m in enumerate(opens):
        end = opens[i + 1].start() if i + 1 < len(opens) else len(text)
        close = _TOPIC_CLOSE.search(text, m.end(), end)
        block = text[m.end() : close.start() if close else end]
        line = text.count("\n", 0, m.start()) + 1
        fields: dict[str, str] = {}
        tags = list(_TOPIC_TAG.finditer(block))
        if sum(not t.group(1) and t.group(2).lower() == "num" for t in tags) > 1:
            raise TopicsError(f"queries {path}: the topic at line {line} holds two <num> fields (a </top> and <top> missing between "
                              "two topics?); give each topic its own <top> block.")
        for j, t in enumerate(tags):
            name = t.group(2).lower()
            if t.group(1) or name in fields:
                continue
            fields[name] = block[t.end() : tags[j + 1].start() if j + 1 < len(tags) else len(block)]
        number = _TOPIC_NUMBER.search(m.group(2) or "")
        # (TREC Genomics 2004's <TOPIC><ID>1</ID>: the number under <ID>)
        qid = number.group(1) if number else _topic_text(fields.get("num", "") or fields.get("id", ""))
        if not qid:
            raise TopicsError(f"queries {path}: the topic at line {line} has no number (<num> Number: N, <ID>N</ID>, or <topic number=\"N\">); "
                              "give every topic its number.")
        if number is None and m.group(1).lower() == "top" and qid.isascii() and qid.isdigit():  # TREC's <num> Number: 051 is topic 51, as its qrels write it
            qid = str(int(qid))  # (<topic number="0001">, NTCIR's <TOPIC><NUM>0001, keep their ids as written, as their qrels do)
        raw = next((fields[t] for t in _FIELD_TAGS[field] if t in fields), None)
        query = _topic_text(raw) if raw is not None else ""
        if not query:
            has = [f for f in TOPICS_FIELDS if any(_topic_text(fields.get(t, "")) for t in _FIELD_TAGS[f])]
            raise TopicsError(f"queries {path}: topic {qid} (line {line}) has no {'text in its ' if raw is not None else ''}{_FIELD_NAMES[field]}; "
                              f"pick a field it has ({', '.join(has) or 'none'}) as the topics field (retrieve --topics-field; topics_field: in a "
                              "config file), or add the field to the topic.")
        rows.append({"query_id": qid, "text": query, "logical_query": None})
    return rows


# NTCIR WWW's topics: <queries><query><qid>0001</qid><content>...</content><description>...</description></query>
_NTCIR_QUERY = re.compile(r"<query>\s*<qid>", re.I)
_NTCIR_BLOCK = re.compile(r"<query>(.*?)</query>", re.I | re.S)
_NTCIR_FIELDS = {"title": "content", "desc": "description", "narr": "narrative"}


def _read_ntcir_queries(text: str, path: Path, field: str) -> list[dict]:
    """NTCIR WWW's topics (``<query>`` elements, each ``<qid>``, ``<content>`` (its title),
    ``<description>``): ids kept as written (``0001``, as its qrels write them)."""
    rows = []
    for m in _NTCIR_BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        parts = {t.lower(): v for t, v in re.findall(r"<(\w+)>(.*?)</\1\s*>", m.group(1), re.S)}
        qid, query = _topic_text(parts.get("qid", "")), _topic_text(parts.get(_NTCIR_FIELDS[field], ""))
        if not qid:
            raise TopicsError(f"queries {path}: the query at line {line} has no <qid>; give every query its id.")
        if not query:
            raise TopicsError(f"queries {path}: query {qid} (line {line}) has no <{_NTCIR_FIELDS[field]}>; pick a field it has as the "
                              "topics field (retrieve --topics-field), or add the field to the query.")
        rows.append({"query_id": qid, "text": query, "logical_query": None})
    return rows


def _field_column(table: pa.Table, field: TopicsField, path: Path) -> pa.Table:
    """A Parquet queries table with the topics field's column as its text (``title``: the
    first of ``text``, ``query``, ``title``, as a JSONL record's)."""
    keys = _QTEXT_KEYS if field == "title" else _FIELD_TAGS[field]
    column = next((c for c in keys if c in table.column_names), None)
    if column == "text" or (column is None and field == "title"):  # (no text: queries_table names the column missing)
        return table
    if column is None:
        raise TopicsError(f"queries {path}: topics field {field!r}, but no column {' or '.join(keys)} among "
                          f"{table.column_names}; name the column, or leave the topics field as title.")
    return table.drop_columns([c for c in ("text",) if c in table.column_names]).append_column("text", table.column(column))


def queries_table(table: pa.Table, source: str) -> pa.Table:
    """A table of queries as the QUERIES contract: the id column under any of its usual names,
    ids as strings, ``logical_query`` added when absent; no rows or a repeated id is refused
    (``source`` names the input in the one-line error)."""
    if "query_id" not in table.column_names:
        for alt in QUERY_ID_KEYS[1:]:
            if alt in table.column_names:
                table = table.rename_columns(["query_id" if c == alt else c for c in table.column_names])
                break
    if "logical_query" not in table.column_names:
        table = table.append_column("logical_query", pa.nulls(table.num_rows, pa.string()))
    if table.num_rows == 0:
        raise TopicsError(f"{source}: no queries (the table has no rows); give the queries to run.")
    # as a JSONL query's (_query_id): an id is text or an integer, a text is text; another type (1.0, true, a decimal)
    # would be written as no qrels line writes it. A dictionary column (a pandas Categorical) is its values
    for name, kinds in (("query_id", (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view, pa.types.is_integer)),
                        ("text", (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view))):
        if name in table.column_names and pa.types.is_dictionary(table.column(name).type):
            column = table.column(name)
            table = table.set_column(table.column_names.index(name), name, column.cast(column.type.value_type))
        if name in table.column_names and not any(kind(table.column(name).type) for kind in kinds):
            raise TopicsError(f"{source}: column {name!r} is {table.column(name).type}; give "
                              f"{'strings (or integers)' if name == 'query_id' else 'strings'}.")
    table = conform(table, QUERIES, source)
    ids = table.column("query_id")
    bad = pc.or_(pc.equal(pc.utf8_trim_whitespace(ids), ""), pc.not_equal(pc.utf8_trim_whitespace(ids), ids))
    if pc.any(bad).as_py():
        raise TopicsError(f"{source}: the query id {ids.filter(bad)[0].as_py()!r} is blank or has surrounding whitespace; qrels and runs "
                          "name it exactly as given.")
    if pc.count_distinct(ids).as_py() != len(ids):
        counts = pc.value_counts(ids)
        dup = sorted(v["values"] for v in counts.to_pylist() if v["counts"] > 1)[:5]
        raise TopicsError(f"{source}: duplicate query ids {dup}.")
    return table


def _read_parquet(path: Path, what: str) -> pa.Table:
    if path.is_dir():  # pyarrow would read a directory as a dataset, possibly of nothing
        raise TopicsError(f"{what} {path}: a directory, not a file; give the {what} file itself.")
    with reading(f"{what} {path}", TopicsError):
        return pq.read_table(path)


def read_qrels(path: str | Path) -> pa.Table:
    """Qrels table (QRELS) from BEIR TSV, TREC qrels, Parquet (``.parquet``, ``.pq``) or JSONL
    examples that list their relevant documents (``.jsonl[.gz]``: QUEST's, LoTTE's); a BEIR
    dir means its qrels/test.tsv.

    A file whose first line is a BEIR header is split on tabs, any other on whitespace.
    Refuses an empty file and repeated (query, doc) pairs, as trec_eval does.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "qrels" / "test.tsv"
    if not path.exists():
        raise TopicsError(f"qrels: no file at {str(path)!r}; give a BEIR qrels TSV, a BEIR directory, a TREC qrels file, Parquet qrels or QUEST's examples.")
    if path.suffix.lower() in (".parquet", ".pq"):
        return _parquet_qrels(path)
    if path.name.lower().endswith((".jsonl", ".jsonl.gz")):
        return _jsonl_qrels(path)
    qids, dids, rels = [], [], []
    beir, width = False, None  # width: the fields of the first line, and its number
    with reading(f"qrels {path}", TopicsError), open_text(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip() or (not beir and line.startswith("#")):  # trec_eval skips a line that starts with #
                continue
            if n == 1 and trec_fields(line)[0].lower() in _BEIR_HEADER:
                beir = True
                continue
            if beir:
                parts = line.split("\t")
                if len(parts) != 3:
                    raise TopicsError(
                        f"qrels {path}: line {n} has {len(parts)} tab-separated field(s); a BEIR qrels line has 3 "
                        "(query-id<TAB>corpus-id<TAB>score): separate the fields with single tabs."
                    )
                q, d, r = parts
            else:
                parts = trec_fields(line)
                if len(parts) not in (3, 4):
                    raise TopicsError(f"qrels {path}: line {n} has {len(parts)} fields; expected 4 (TREC: qid 0 docno rel) or 3.")
                width = width or (len(parts), n)
                if len(parts) != width[0]:  # (a line missing its docno, or an id with a space in a file without a header)
                    raise TopicsError(f"qrels {path}: line {n} has {len(parts)} fields and line {width[1]} has {width[0]}; "
                                      "every line of a qrels file has the same fields (TREC: qid 0 docno rel).")
                q, d, r = (parts[0], parts[2], parts[3]) if len(parts) == 4 else parts
            qids.append(q), dids.append(d), rels.append(_relevance(r.strip(), f"qrels {path}: line {n}"))  # (a BEIR score's spaces)
    qrels = pa.table({"query_id": qids, "doc_id": dids, "relevance": pa.array(rels, pa.int32())}, schema=QRELS)
    check_qrels(qrels, f"qrels {path}")
    return qrels


def _jsonl_qrels(path: Path) -> pa.Table:
    """Qrels from JSONL: examples that list their relevant documents, QUEST's (``query``,
    ``docs``: titles, its line number the id) and LoTTE's ``qas.*.jsonl`` (``qid``,
    ``answer_pids``: passage ids, integers read as their decimal text), each listed document
    relevant (1), the list read as a set (a document listed twice is one judgement), an example
    listing none refused, as QUEST's evaluation refuses it; or one judgement a line, BEIR's
    qrels as JSON (``query-id``, ``corpus-id``, ``score``: LIMIT's, and BEIR sets on the Hugging
    Face hub), under any of the names a Parquet qrels table's columns take."""
    qids, dids, rels = [], [], []
    expect = ("listing its relevant documents (QUEST's query and docs, LoTTE's qid and answer_pids) or holding one judgement "
              "(query-id, corpus-id, score)")
    for n, obj in read_jsonl(path, "qrels", TopicsError, expect):
        judged = _jsonl_judgement(obj, path, n)
        if judged is not None:
            qids.append(judged[0]), dids.append(judged[1]), rels.append(judged[2])
            continue
        key = "docs" if "docs" in obj else "answer_pids"
        docs = obj.get(key)
        if not quest_example(obj) and not (isinstance(docs, list) and any(k in obj for k in QUERY_ID_KEYS)):
            raise TopicsError(f"qrels {path}: line {n} is not a JSON object {expect}.")
        numbers = key == "answer_pids"  # (LoTTE's passage ids are integers; QUEST's titles strings)
        if not docs or not all((isinstance(d, str) and d) or (numbers and isinstance(d, int) and not isinstance(d, bool)) for d in docs):
            kind = "ids (integers or non-empty strings)" if numbers else "titles (non-empty strings)"
            raise TopicsError(f"qrels {path}: line {n}: {key} is {json.dumps(docs)[:80]}; each example lists its relevant documents' "
                              f"{kind}, at least one.")
        qid = jsonl_query_id(obj, path, n)
        for doc in dict.fromkeys(str(d) for d in docs):
            qids.append(qid), dids.append(doc), rels.append(1)
    qrels = pa.table({"query_id": qids, "doc_id": dids, "relevance": pa.array(rels, pa.int32())}, schema=QRELS)
    check_qrels(qrels, f"qrels {path}")
    return qrels


def _jsonl_judgement(obj: dict, path: Path, n: int) -> tuple[str, str, int] | None:
    """A JSONL line of one judgement (:func:`_jsonl_qrels`): its query id, doc id and
    relevance, ids that are integers read as their decimal text; None where the line names no
    document by one of the doc id keys (an example that lists them)."""
    names = {name: [k for k in keys if k in obj] for name, keys in _QRELS_COLUMNS.items()}
    if not names["doc_id"] or isinstance(obj[names["doc_id"][0]], list):
        return None
    where = f"qrels {path}: line {n}"
    got = []
    for name, found in names.items():
        if len(found) != 1:
            raise TopicsError(f"{where}: {'no' if not found else 'more than one'} {name} ({' or '.join(_QRELS_COLUMNS[name])}); "
                              "a judgement line holds one query id, one doc id and one relevance.")
        value = obj[found[0]]
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise TopicsError(f"{where}: {found[0]} is {json.dumps(value)[:80]}; give "
                              + ("an integer." if name == "relevance" else "a string (or an integer)."))
        got.append(value if name == "relevance" else str(value))
    if not isinstance(got[2], int):
        got[2] = _relevance(got[2].strip(), where)
    elif not -(2**31) <= got[2] < 2**31:
        raise TopicsError(f"{where}: relevance {got[2]} is out of range (qrels hold 32-bit integers).")
    return got[0], got[1], got[2]


# a Parquet qrels table's columns under their usual names: QRELS's, BEIR's (MTEB's Parquet qrels), ir_datasets'
_QRELS_COLUMNS = {"query_id": ("query_id", "query-id", "qid"), "doc_id": ("doc_id", "corpus-id", "docid", "docno"),
                  "relevance": ("relevance", "score", "rel", "label")}


def _parquet_qrels(path: Path) -> pa.Table:
    """Qrels from a Parquet table: a query, a document and an integer relevance column, each
    under one of its usual names; ids of an integer type read as their decimal text."""
    table = _read_parquet(path, "qrels")
    columns = {}
    for name, names in _QRELS_COLUMNS.items():
        found = [n for n in names if n in table.column_names]
        if len(found) != 1:
            raise TopicsError(f"qrels {path}: {'no' if not found else 'more than one'} {name} column ({' or '.join(names)}) among its "
                              f"columns {table.column_names}; a Parquet qrels table has one of each.")
        column = table.column(found[0])
        if name == "relevance" and not pa.types.is_integer(column.type):
            raise TopicsError(f"qrels {path}: column {found[0]!r} is {column.type}; relevance is an integer (0, 1, 2, -1).")
        if name != "relevance" and not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                                        or pa.types.is_integer(column.type)):
            raise TopicsError(f"qrels {path}: column {found[0]!r} is {column.type}; ids are strings or integers.")
        if column.null_count:
            raise TopicsError(f"qrels {path}: column {found[0]!r} has {column.null_count} null(s); every judgement needs its query, "
                              "document and relevance.")
        if name == "relevance" and len(column) and not (pc.min(column).as_py() >= -(2**31) and pc.max(column).as_py() < 2**31):
            raise TopicsError(f"qrels {path}: column {found[0]!r} holds values past 32 bits; qrels hold 32-bit integers.")
        columns[name] = column.cast(pa.int32() if name == "relevance" else pa.string())
    qrels = pa.table(columns, schema=QRELS)
    check_qrels(qrels, f"qrels {path}")
    return qrels


# a relevance as trec_eval reads it (C's atol): an integer, or a decimal read up to its point
# (0.5 is 0); an exponent, an underscore or inf would read otherwise there, so they are refused
_RELEVANCE = re.compile(r"[+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+")


def _relevance(text: str, where: str) -> int:
    if not _RELEVANCE.fullmatch(text):
        raise TopicsError(f"{where}: relevance {text!r} is not an integer (trec_eval reads the digits before any point: write 0, 1, 2, -1).")
    whole = text.split(".")[0]
    rel = int(whole) if whole.lstrip("+-") else 0  # (".5" and "-.5" are 0)
    if not -(2**31) <= rel < 2**31:
        raise TopicsError(f"{where}: relevance {text!r} is out of range (qrels hold 32-bit integers).")
    return rel


def check_qrels(qrels: pa.Table, source: str) -> None:
    """Refuse qrels with no rows, with an id blank or with surrounding ASCII whitespace (it would
    match no query or document, and its query would count as missed; trec_eval, which splits on
    it, keeps other spaces in an id), or with a (query, doc) pair judged twice; ``source`` names
    them."""
    if qrels.num_rows == 0:
        raise TopicsError(f"{source}: no judgements (the file is empty or holds only a header); give the qrels of the queries evaluated.")
    for column in ("query_id", "doc_id"):
        ids = qrels.column(column)
        bad = pc.or_(pc.equal(pc.utf8_length(ids), 0), pc.not_equal(pc.ascii_trim_whitespace(ids), ids))  # (ASCII: trec_eval's separators)
        if pc.any(bad).as_py():
            found = ids.filter(bad)
            raise TopicsError(f"{source}: {len(found)} judgement(s) with a {column.replace('_', ' ')} blank or with surrounding "
                              f"whitespace, e.g. {found[0].as_py()!r}; queries, documents and runs name each id exactly.")
    df = qrels.select(["query_id", "doc_id"]).to_pandas()
    dup = df[df.duplicated(keep="first")]
    if len(dup):
        raise TopicsError(
            f"{source}: {len(dup)} row(s) repeat a (query, doc) pair, e.g. {_pairs(dup)}; "
            "trec_eval refuses them too: judge each pair once."
        )


def read_run(path: str | Path, duplicates: Duplicates = "refuse", empty: Literal["refuse", "allow"] = "refuse") -> pa.Table:
    """A run table (RUN) from Parquet or a TREC run file (run_id = the file's tag column).

    A TREC run is re-ranked by score as trec_eval ranks it; a Parquet run keeps its ranks,
    checked (module docstring). ``duplicates="first"`` keeps each repeated (query, doc)
    pair's best-ranked row; the number of rows dropped is in the schema metadata under
    ``DUPLICATES_REMOVED`` (see :func:`check_run`). A run of no rows is refused unless
    ``empty="allow"`` (it then comes back empty: the caller names it).
    """
    path = Path(path)
    if not path.exists():
        raise TopicsError(f"run: no file at {str(path)!r}; give a run table (Parquet) or a TREC run file.")
    table = conform(_read_parquet(path, "run"), RUN, f"run {path.name}") if path.suffix.lower() in (".parquet", ".pq") else _read_trec_run(path)
    if table.num_rows == 0 and empty == "refuse":
        raise TopicsError(f"run {path}: no rows; an empty run cannot be evaluated: give the run file that holds results.")
    return check_run(table, f"run {path}", duplicates)


_ASCII_SPACE = re.compile(r"[ \t\n\r\f\v]+")


def trec_fields(line: str) -> list[str]:
    """A TREC line's fields as trec_eval splits them: on ASCII spaces and tabs only, so an id
    holding a no-break space, another Unicode space or an ASCII separator control (\x1c-\x1f:
    ``str.split`` splits on each, and strips them from an id's ends) stays whole."""
    if line.isascii() and "\x1c" not in line and "\x1d" not in line and "\x1e" not in line and "\x1f" not in line:
        return line.split()  # (the common line: str.split is what trec_eval does there, and faster)
    return [p for p in _ASCII_SPACE.split(line) if p]


def _read_trec_run(path: Path) -> pa.Table:
    cols: dict[str, list] = {"query_id": [], "doc_id": [], "score": [], "run_id": []}
    with reading(f"run {path}", TopicsError), open_text(path) as f:
        for n, line in enumerate(f, 1):
            parts = trec_fields(line)
            if not parts or parts[0].startswith("#"):  # trec_eval skips blank lines and comments (# first)
                continue
            if len(parts) < 6:
                raise TopicsError(f"run {path}: line {n} has {len(parts)} fields; a TREC run line has 6 (qid Q0 docno rank score tag).")
            q, _, d, _, score, tag = parts[:6]  # the rank column and any after the tag ignored, as trec_eval ignores them
            if not _SCORE.fullmatch(score):  # Python's float reads '1_0' as 10, trec_eval's atof as 1
                raise TopicsError(f"run {path}: line {n}: score {score!r} is not a number as trec_eval reads one "
                                  "(ASCII digits, a point, an exponent: 12.5, -3, 1e-3; no '_').")
            value = float(score)
            for k, v in zip(cols, (q, d, value, tag), strict=True):
                cols[k].append(v)
    if not cols["query_id"]:
        return RUN.empty_table()
    df = pd.DataFrame(cols)
    _check_tags(df, path)
    df["sim"] = trec_score(df["score"])
    df = df.sort_values(
        ["run_id", "query_id", "sim", "doc_id"], ascending=[True, True, False, False], kind="stable"
    )  # trec_eval's order; the file's rank column is ignored
    df["rank"] = df.groupby(["run_id", "query_id"], sort=False).cumcount() + 1
    df["method"] = "trec"
    return pa.table({c: df[c].to_numpy() for c in RUN.names}, schema=RUN)  # NaN stays NaN, for check_run to name


def _check_tags(df: pd.DataFrame, path: Path) -> None:
    """A file's tags are its runs (several runs of one file each rank every query they have);
    tags that split the queries between them, no query under two, are one run's per-query tags
    to trec_eval, which reads a file as one run: each read as a run would score apart from it."""
    queries = df.groupby("run_id", sort=True)["query_id"].unique()
    if len(queries) < 2 or sum(map(len, queries)) != df["query_id"].nunique():
        return
    first, second = queries.index[:2]
    raise TopicsError(
        f"run {path}: its {len(queries)} tags split its queries, none under two (query {queries[first][0]!r} only under "
        f"{first!r}, {queries[second][0]!r} only under {second!r}): trec_eval reads such a file as one run, logicrank a tag as "
        "a run; give the file one tag for one run (its sixth column), or each run every query it ranks."
    )


def trec_score(score: pd.Series) -> np.ndarray:
    """Scores as trec_eval stores them (``float sim = atof(...)``), the key it ranks by; one too
    large for 32 bits is inf there too. A run is ranked by it (``ranking.rank_pairs``), so the
    run and its TREC file evaluate alike."""
    with np.errstate(over="ignore"):
        return score.to_numpy(dtype=np.float64).astype(np.float32)


def check_run(run: pa.Table, source: str, duplicates: Duplicates = "refuse") -> pa.Table:
    """Check a run table against the rules of the module docstring; ``source`` names it.

    Needs ``query_id``, ``doc_id``, ``rank``; ``score`` and ``run_id`` are checked when
    present. Returns the run, without the repeated pairs' worse-ranked rows when
    ``duplicates="first"``, with their count in its schema metadata (``DUPLICATES_REMOVED``).
    """
    if duplicates not in ("refuse", "first"):
        raise TopicsError(f"{source}: duplicates={duplicates!r}; use 'refuse' or 'first'.")
    require_columns(run, ["query_id", "doc_id", "rank"], source)
    df = run.select([c for c in ("run_id", "query_id", "doc_id", "rank", "score") if c in run.column_names]).to_pandas()
    group = [c for c in ("run_id", "query_id") if c in df.columns]
    if "score" in df:
        bad = df[~np.isfinite(df["score"].to_numpy(dtype=float))]
        if len(bad):
            raise TopicsError(
                f"{source}: {len(bad)} score(s) are NaN or infinite, e.g. for query {bad['query_id'].iloc[0]!r}, "
                f"doc {bad['doc_id'].iloc[0]!r}; give every row a finite score."
            )
    df = df.sort_values([*group, "rank"], kind="stable")
    repeated = df.duplicated([*group, "doc_id"], keep="first")
    if repeated.any() and duplicates == "refuse":
        raise TopicsError(
            f"{source}: {int(repeated.sum())} row(s) repeat a (query, doc) pair, e.g. {_pairs(df[repeated])}; trec_eval refuses "
            "them too: keep each pair once, or evaluate with dedupe to keep each pair's best-ranked row."
        )
    if repeated.any():
        df = df[~repeated]
        keep = np.zeros(run.num_rows, dtype=bool)
        keep[df.index.to_numpy()] = True
        run = run.filter(pa.array(keep))
    _check_ranks(df, group, source)
    return run.replace_schema_metadata({**(run.schema.metadata or {}), DUPLICATES_REMOVED: str(int(repeated.sum()))})


def _check_ranks(df: pd.DataFrame, group: list[str], source: str) -> None:
    """``df`` sorted by group then rank: ranks distinct positive integers, scores never rising
    (in 32 bits: a TREC run ranks 40.123401 after 40.1234, one score to trec_eval, by docno)."""
    rank = df["rank"].astype(float)
    bad = df[(rank < 1) | (rank % 1 != 0) | df.duplicated([*group, "rank"], keep=False)]
    if len(bad):
        raise TopicsError(
            f"{source}: query {bad['query_id'].iloc[0]!r} has rank {bad['rank'].iloc[0]} for doc {bad['doc_id'].iloc[0]!r}; "
            "ranks within a query must be distinct positive integers: rank the run again (higher score, better rank)."
        )
    if "score" not in df:
        return
    same = ~df[group].ne(df[group].shift()).any(axis=1)
    sim = pd.Series(trec_score(df["score"]), index=df.index)
    rises = df[same & (sim > sim.shift())]
    if len(rises):
        r = rises.iloc[0]
        prev = df.iloc[df.index.get_loc(rises.index[0]) - 1]
        raise TopicsError(
            f"{source}: query {r['query_id']!r} puts doc {r['doc_id']!r} (score {float(r['score'])!r}) at rank {r['rank']}, after "
            f"doc {prev['doc_id']!r} (score {float(prev['score'])!r}) at rank {prev['rank']}; a better rank must not have a lower score: "
            "rank the run by score, or give it as a TREC file to have it ranked by score as trec_eval does."
        )


def _pairs(df: pd.DataFrame, n: int = 3) -> str:
    pairs = df[["query_id", "doc_id"]].drop_duplicates().head(n)
    return ", ".join(f"({q!r}, {d!r})" for q, d in pairs.itertuples(index=False))


def write_trec_run(run: pa.Table, path: str | Path) -> Path:
    """Write a run table as a TREC run file (sorted by query, then rank; scores as Python's repr).

    Refuses an empty id or one holding whitespace (query, doc or run id), or a query id that
    starts with ``#`` (a comment line to trec_eval): a TREC line cannot carry it. Read back, the file is ranked by score as trec_eval stores it (a 32-bit float),
    so scores equal there (equal, or apart only past float32's precision: a float64
    composition's last bits) come back ordered by doc_id descending whatever their ranks were:
    a run logicrank ranked (``ranking.rank_pairs``, by that same key) comes back in its own
    order; a run ranked otherwise may not, and its measures may differ from the Parquet run's.
    """
    path = Path(path)
    table = conform(run, RUN, "write_trec_run").sort_by([("query_id", "ascending"), ("rank", "ascending")])
    for col in ("query_id", "doc_id", "run_id"):
        bad = [v for v in table.column(col).unique().to_pylist() if trec_fields(v) != [v] or (col == "query_id" and v.startswith("#"))]
        if bad:  # (a line that starts with # is a comment to trec_eval)
            run_ids = table.column("run_id").unique().to_pylist()
            raise TopicsError(
                f"write_trec_run {path}: {col} {bad[0]!r} of run {run_ids[0]!r} is empty, holds whitespace or starts a "
                f"comment ({len(bad)} such id(s)); a TREC line cannot carry it: use the Parquet run instead."
            )
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for q, d, rank, score, rid in zip(*(table.column(c).to_pylist() for c in ("query_id", "doc_id", "rank", "score", "run_id")), strict=True):
            f.write(f"{q} Q0 {d} {rank} {score!r} {rid}\n")
    return path
