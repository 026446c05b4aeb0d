"""Corpus readers, row validation and content hashing.

A corpus is a BEIR directory (``corpus.jsonl[.gz]``), plain JSONL(.gz) files, Parquet
files, TREC SGML files or TSV files, on a local path or any pyarrow filesystem URI. Readers
stream: each source yields Arrow tables of at most ``batch_rows`` rows, so no corpus is ever
held whole in memory. A UTF-8 byte order mark starting a JSONL, TSV or TREC file is not read
as part of its first record.

Every input row comes out exactly once, either valid (``_reason`` null) or marked with
the reason it was rejected and where it came from (``_source``, ``_location``: the 1-based
line of a JSONL or TSV row or of a TREC ``<DOC>`` tag, the 0-based row of a Parquet file;
``_record``: its place among its source's rows, 0-based, which tells apart the DOCs of one
TREC line).
Deciding what to do with rejects is the caller's business; a bad row never hides a good one.

TREC SGML (kind ``trec``; ``.trec``, ``.trectext``, ``.sgml``, ``.sgm``, each with optional
``.gz``; a file with another name with ``fmt="trec"``) is a sequence of
``<DOC> ... </DOC>`` records, read DOC by DOC from the byte stream. Tag names are
case-insensitive and may carry attributes. In a DOC:

- the id is the ``<DOCNO>`` element's text, surrounding whitespace stripped; a DOC with no
  DOCNO element is known by its tag's ``id`` attribute (``<DOC id="APW_ENG_20041001.0001"
  type="story">``: AQUAINT-2, Gigaword);
- the title is the text of its ``<TITLE>`` elements or, where it has none, of the first of
  ``<HEAD>``, ``<HEADLINE>`` (LA Times, FT), ``<HL>`` (WSJ), ``<TTL>``, ``<TI>`` (FBIS) it
  has, several joined by a space; none: no title;
- the text is the text of its ``<LEADPARA>`` (SJM), ``<LP>`` (WSJ) and ``<TEXT>`` elements in
  document order, joined by a newline; where the DOC has none, the text is all its text
  outside its DOCNO and title elements;
- a web page (a DOC holding ``<html>``, ``<!DOCTYPE>`` or a web collection's ``<DOCHDR>``:
  WT10g, GOV2, ClueWeb) has HTML's ``<title>`` as its title and no TEXT of
  TREC's (its ``<head>`` and an SVG's ``<text>`` are HTML's): its text is everything else but
  its ``<script>`` and ``<style>`` code and its declarations (``<!DOCTYPE ...>``, ``<?xml ...?>``);
- the one rule for every other tag (``<DATE>``, ``<BYLINE>``, ``<DOCHDR>``, ...): its text is
  dropped when the DOC has a ``<TEXT>`` element, and is part of the text otherwise;
- each field's markup (``<P>``, an unclosed ``<F P=105>``, comments) is removed, leaving its
  text (a space where a block tag such as ``<P>``, a comment, or the end of one element
  and the start of the next stood between two words; an inline tag such as ``<B>`` leaves
  nothing), its surrounding whitespace is stripped as layout, then SGML/HTML entities are decoded
  (``html.unescape``), so ``&#32;`` keeps a space a field starts or ends with and ``&lt;``
  is a ``<`` of the text (an entity ``html.unescape`` does not know, such as the Federal
  Register's ``&hyph;``, stays as written; its ``&blank;`` is a space, not HTML5's U+2423). A bare ``<`` followed by a letter starts a tag:
  escape it.

The record ``{"docno", "title", "text"}`` is then checked by :func:`validate_record`, as a
JSONL row is; a TREC document has no metadata. TREC's disks ship their files compressed by Unix
``compress`` (``fr940104.0z``, ``la010189.z``): a file whose name ends ``.z``, ``.0z``, ``.1z`` or ``.2z``
(any case) is decompressed first, as Anserini's ``TrecCollection`` reads it, and a directory read
with ``fmt="trec"`` leaves out what that collection leaves out of TREC's disks: files whose name
starts ``readme`` and the folders ``dtd``, ``dtds`` (document type definitions) and ``cr`` (the
Congressional Record, not part of Robust04's collection); :func:`list_sources` names them in
its result's ``not_read``. A DOC that no ``</DOC>`` closes before the next
``<DOC>`` or the end of the file is an ``unclosed_doc`` reject and reading goes on with the
next DOC; a DOC longer than ``trec_raw_limit(max_doc_bytes)`` bytes is an ``oversized``
reject, skipped without being held; non-blank text between DOCs is an ``outside_doc`` reject
(one per stretch), so nothing in a file goes unread silently. Bytes of a DOC that are not UTF-8
(older collections' Latin-1) read as U+FFFD, as Anserini's and ir_datasets' TREC readers read
them: the DOC is valid, its ``_detail`` noting them (:data:`NOT_UTF8_NOTE`), unless its DOCNO
holds such bytes (``invalid_utf8``: an id is never guessed).

TSV (kind ``tsv``; ``.tsv``, ``.tsv.gz``): one document per line, ``id<TAB>text`` (MS MARCO's
``collection.tsv``), no header (a first line ``id<TAB>text`` is a document like any other),
no quoting, blank lines skipped, a trailing ``\r`` dropped. A line that is not exactly two
tab-separated fields (no tab, or a third column) is a ``bad_tsv_row`` reject; the two fields
are then checked by :func:`validate_record` (an empty id: ``missing_id``; blank text:
``empty_text``, a TSV line having no title). A file whose first line is DPR's header
``id<TAB>text<TAB>title`` (its Wikipedia passages, ``psgs_w100.tsv``) is read as DPR reads
it: three fields a line, each in double quotes where it holds one (``""`` a quote inside). A
file whose first line is four fields, the second a URL, is MS MARCO v1's documents
(``msmarco-docs.tsv``: ``docid<TAB>url<TAB>title<TAB>body``, no header, no quoting): every line
four fields, the body the text, the URL in the metadata (``{"url": ...}``, not searched).

Precomputed vectors (``logicrank index --vector-column NAME``, :class:`VectorColumn`): a JSONL
record's field ``NAME`` holds a list of numbers, a Parquet file's column ``NAME`` a list (or
fixed-size list) of numbers. Each is checked by :func:`check_vector`: present
(``missing_vector``), a list of numbers (``bad_vector``), of the table's dimension
(``vector_dim``), finite in float32 and not all zeros (``bad_vector``); a good one is carried
L2-normalised as float32 in the ``vector`` column (dense stages score by cosine over unit
vectors), and its float32 numbers are part of the row's content hash, so new vectors for the
same text update the document.
"""

from __future__ import annotations

import bisect
import csv
import hashlib
import html
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from logicrank.pipelines.files import not_text, reading, utf8_text
from logicrank.schemas.errors import UserError, first_line

# The reader's output: corpus columns plus provenance and the verdict.
PARSED = pa.schema(
    [
        pa.field("doc_id", pa.string()),  # null when no id could be read
        pa.field("title", pa.string()),
        pa.field("text", pa.string()),  # null on a rejected row
        pa.field("metadata", pa.string()),
        pa.field("content_hash", pa.string()),  # null on a rejected row
        pa.field("_source", pa.string(), nullable=False),
        pa.field("_location", pa.int64(), nullable=False),
        # the row's place among its source's rows, 0-based: with _source, the row's key (a TREC line may hold several DOCs)
        pa.field("_record", pa.int64(), nullable=False),
        pa.field("_reason", pa.string()),  # null: valid; else one of REJECT_REASONS
        pa.field("_detail", pa.string()),
    ]
)
# With precomputed vectors (:class:`VectorColumn`): each valid row's vector, unit length; null on a rejected row.
PARSED_VECTORS = PARSED.append(pa.field("vector", pa.list_(pa.float32())))
VECTOR_KINDS = ("jsonl", "parquet")  # the formats that can carry a vector per document

# A record's id and text: the first of these keys it has; v2.1's segments ({"docid", "segment"}) have a docid of their own.
# MS MARCO v2's passages ({"pid", "passage", "docid"}) carry their document's docid beside their own pid: a record with a
# pid and a passage and none of the first three ids is known by its pid (a pid elsewhere, a chunk's number, is no id)
ID_KEYS = ("doc_id", "_id", "id", "docid", "docno")
TEXT_KEYS = ("text", "contents", "body", "passage", "segment", "abstract")  # (abstract: ir_datasets' CORD-19, NFCorpus, Medline)
_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}  # names whose compression Arrow's streams undo, and its codec
_COMPRESSED = tuple(_CODECS)
# Unix compress (LZW), undone by ncompress: .Z, and TREC's disks' .z, .0z, .1z, .2z (as Anserini's TrecCollection reads them).
# LZW records no length: a file cut short reads as far as it goes (its last DOC an unclosed_doc reject, unless cut between DOCs)
_LZW_NAME = re.compile(r"\.[0-2]?z$", re.IGNORECASE)  # (not 7-Zip's .7z)
_LZW_MAGIC = b"\x1f\x9d"
_UNREAD_COMPRESSED = (".xz", ".lzma", ".7z", ".zip", ".br")  # compressions no reader here undoes: refused in a directory by name
# what Anserini's TrecCollection leaves out of a directory of TREC's disks: file names starting so, and these folders
_TREC_NOT_READ_PREFIX = "readme"
_TREC_NOT_READ_FOLDERS = frozenset({"cr", "dtd", "dtds"})
_JSONL_SUFFIXES = tuple(s + c for s in (".jsonl", ".json", ".ndjson", ".jl") for c in ("", *_COMPRESSED))  # (.jl: the Washington Post's)
_PARQUET_SUFFIXES = (".parquet", ".pq")
_TREC_SUFFIXES = tuple(s + c for s in (".trec", ".trectext", ".sgml", ".sgm") for c in ("", *_COMPRESSED))
_TSV_SUFFIXES = tuple(".tsv" + c for c in ("", *_COMPRESSED))
KINDS = ("jsonl", "parquet", "trec", "tsv")
_KIND_NAMES = {"jsonl": "JSONL", "parquet": "Parquet", "trec": "TREC SGML", "tsv": "TSV"}
_NOT_DOCUMENTS = ("queries", "qrels", "topics")  # names that, in a directory, are a test collection's other files (never indexed)
# A directory holding any of these is a BEIR directory, whose corpus must be corpus.jsonl[.gz].
_BEIR_BESIDE = ("answers", "decompositions")  # a QA set's gold answers, a set-logic set's gold decompositions: beside a corpus, no documents
_BEIR_MARKERS = ("queries.jsonl", "queries.jsonl.gz", "qrels")


class CorpusError(UserError, ValueError):
    """The corpus location or layout cannot be read."""


class SourceError(CorpusError):
    """A corpus file cannot be read (cut off, corrupt, binary, unreadable): the whole run stops.

    Unlike a bad row (a reject), a file that fails part-way hides every row after the fault,
    so no snapshot read from it may change the table.
    """


_TEXT_LAYOUT = {"jsonl": "one JSON object per line", "trec": "<DOC>...</DOC> records", "tsv": "id<TAB>text per line"}
UNREADABLE = "unreadable_source"  # the _reason of the one row a reader emits in place of a failed file
_HEAD_BYTES = 1 << 16  # what check_sources reads of each file
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which some tools write at the start of a text file


@dataclass(frozen=True)
class Source:
    """One file of a corpus."""

    filesystem: pafs.FileSystem
    path: str
    kind: str  # one of KINDS
    uri: str  # how to name it in rejects and manifests

    def fingerprint(self) -> dict[str, Any]:
        info = self.filesystem.get_file_info(self.path)
        mtime = info.mtime.isoformat() if info.mtime is not None else None
        return {"uri": self.uri, "size": info.size, "mtime": mtime}


@dataclass(frozen=True)
class VectorColumn:
    """Where a corpus carries its documents' vectors (a JSONL field, a Parquet column: ``name``)
    and how many numbers each must hold (``dim``)."""

    name: str
    dim: int


class Vector(NamedTuple):
    """A checked vector: the numbers ``given`` (float32, what the content hash covers) and
    their ``unit`` vector (float32, what the table stores)."""

    given: np.ndarray
    unit: np.ndarray


def check_vector(value: Any, dim: int) -> tuple[Vector | None, str | None, str | None]:
    """One document's given vector -> (:class:`Vector`, None, None), or (None, reject reason,
    detail): ``missing_vector``, ``bad_vector`` (not a list of numbers; a number that is not
    finite in float32; all zeros, which has no direction for cosine), ``vector_dim``."""
    if value is None:
        return None, "missing_vector", "no vector (the field is absent or null)"
    if not isinstance(value, list | tuple) or any(isinstance(x, bool) or not isinstance(x, int | float) for x in value):
        return None, "bad_vector", f"expected a list of numbers, got {_what(value)}"
    try:
        array = np.asarray(value, dtype=np.float64)
    except (OverflowError, ValueError) as exc:  # an integer past any float (JSON allows one of any length)
        return None, "bad_vector", f"a number is out of range ({first_line(exc)})"
    if array.shape != (dim,):
        return None, "vector_dim", f"{array.size} numbers, expected {dim}"
    return _units(array[None, :])[0]


def _what(value: Any) -> str:
    if isinstance(value, list | tuple):
        bad = next(x for x in value if isinstance(x, bool) or not isinstance(x, int | float))
        return f"a list holding {type(bad).__name__} {bad!r}"[:120]
    return type(value).__name__


def _units(rows: np.ndarray) -> list[tuple[Vector | None, str | None, str | None]]:
    """Each row's float32 numbers and unit vector, or its reject: a row with a number not finite
    in float32, or all zeros. Normalised in float64 (a float32 norm of large or tiny numbers
    overflows or loses its digits), the same arithmetic for one row or many."""
    with np.errstate(over="ignore", invalid="ignore"):
        given = rows.astype(np.float32)
        finite = np.isfinite(rows) & np.isfinite(given)
    wide = given.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        norms = np.sqrt((wide * wide).sum(axis=1))
        units = (wide / norms[:, None]).astype(np.float32)
        unit_norms = np.sqrt((units.astype(np.float64) ** 2).sum(axis=1))
    all_finite = finite.all(axis=1)
    out: list[tuple[Vector | None, str | None, str | None]] = []
    for i in range(len(rows)):
        if not all_finite[i]:
            first = int(np.flatnonzero(~finite[i])[0])
            out.append((None, "bad_vector", f"number {first + 1} of {rows.shape[1]} is {float(rows[i, first])!r}, not a finite float32"))
        elif norms[i] == 0.0:
            out.append((None, "bad_vector", "all zeros: no direction for cosine similarity"))
        elif abs(unit_norms[i] - 1.0) > 1e-3:  # (not seen: a guard, never a wrong vector stored)
            out.append((None, "bad_vector", "cannot be normalised to unit length in float32"))
        else:
            out.append((Vector(given[i], units[i]), None, None))
    return out


def _compression(path: str) -> str | None:
    """Arrow's codec for a file's name, in any case (Arrow's own detection knows ``.gz`` but not
    ``.GZ``)."""
    return _CODECS.get(Path(path).suffix.lower())


def _compressed(path: str) -> bool:
    return path.lower().endswith(_COMPRESSED) or _LZW_NAME.search(path) is not None


def _kind_of(path: str) -> str | None:
    lower = _LZW_NAME.sub("", path.lower())  # (corpus.trec.Z is TREC SGML)
    for kind, suffixes in (("jsonl", _JSONL_SUFFIXES), ("parquet", _PARQUET_SUFFIXES), ("trec", _TREC_SUFFIXES), ("tsv", _TSV_SUFFIXES)):
        if lower.endswith(suffixes):
            return kind
    return None


def _resolve(location: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(location)
    except (pa.ArrowInvalid, ValueError):
        # A plain relative path: pyarrow wants absolute local paths.
        import os

        return pafs.LocalFileSystem(), os.path.abspath(location)


TREC_NOT_READ = "as Anserini's TrecCollection leaves them out (READMEs, DTDs, the Congressional Record: cr/)"
BEIR_NOT_READ = "as a BEIR directory's corpus is its corpus.jsonl alone (give a file, or a directory of them, to read others)"


class Sources(list):
    """:func:`list_sources`' files (a list of :class:`Source`), with ``not_read``: the paths of
    the files a directory holds that are left out by rule (TREC's disks' READMEs, DTDs and
    Congressional Record, ``fmt="trec"``; a BEIR directory's document files beside its
    corpus.jsonl), for the run's record, and ``why_not_read``, the rule in words."""

    not_read: tuple[str, ...] = ()
    why_not_read: str = ""  # (the rule, for the job's line: "as Anserini's TrecCollection leaves them out ...")


def list_sources(location: str, fmt: str = "auto") -> Sources:
    """The files making up the corpus at ``location``, in a stable order.

    ``fmt`` is ``auto``, ``beir`` (a directory holding ``corpus.jsonl[.gz]``), ``jsonl``,
    ``parquet``, ``trec`` or ``tsv`` (a file, or a directory of such files). ``auto`` tells a
    file's kind by its suffix. A file named with a format is read as that format whatever its
    name (``fmt="trec"`` on ``la010189``); in a directory, ``fmt="trec"`` or ``"tsv"`` also
    reads every file whose name marks no format (TREC collections ship as ``la010189``,
    ``fr940104.0``), and ``fmt="jsonl"`` every such file that is compressed (MS MARCO v2 ships
    as ``msmarco_passage_00.gz``; a README or MD5SUMS beside it is not read), except hidden
    ones (``.name``). ``fmt="trec"`` on a directory leaves out TREC's disks' READMEs, DTDs and
    Congressional Record, as Anserini's ``TrecCollection`` does (the result's ``not_read``).
    """
    with reading(f"corpus {location}", CorpusError):  # e.g. a directory that cannot be listed
        return _list_sources(location, fmt)


def _beside_beir_corpus(fs, path: str, corpus: str) -> list[str]:
    """The document files (JSONL or Parquet by name, not hidden) under a BEIR directory other
    than its corpus file, its queries, qrels and topics, and the gold answers or decompositions
    this project's datasets keep beside their corpus."""
    root = path.rstrip("/")
    out = []
    for f in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        rel = f.path[len(root) + 1 :]
        parts = rel.split("/")
        if (f.type == pafs.FileType.File and f.path != corpus and _kind_of(f.path) in ("jsonl", "parquet")
                and not any(part.startswith(".") or part.lower().startswith((*_NOT_DOCUMENTS, *_BEIR_BESIDE)) for part in parts)):
            out.append(f.path)
    return sorted(out)


def _trec_not_read(rel: str) -> bool:
    *folders, name = rel.lower().split("/")
    return name.startswith(_TREC_NOT_READ_PREFIX) or any(f in _TREC_NOT_READ_FOLDERS for f in folders)


def _broken_links(path: str) -> list[str]:
    """The links to nothing under directory ``path`` (hidden ones aside), which Arrow's listing
    leaves out without a word (git-annex or DVC content never fetched looks so). Links to
    directories are followed, as Arrow follows them, each real directory once; only a link's
    entry costs a second look at the disk."""
    out, seen, todo = [], set(), [path]
    while todo:
        top = todo.pop()
        real = os.path.realpath(top)
        if real in seen:
            continue
        seen.add(real)
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue  # (a directory this process cannot list: Arrow's listing says so)
        for e in entries:
            if e.name.startswith("."):
                continue
            if e.is_dir():  # (follows a link to a directory)
                todo.append(e.path)
            elif e.is_symlink() and not os.path.exists(e.path):
                out.append(e.path)
    return sorted(out)


def _list_sources(location: str, fmt: str) -> Sources:
    fs, path = _resolve(location)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise CorpusError(f"corpus: nothing at {location!r}; give a BEIR directory, a JSONL(.gz), Parquet, TREC SGML or TSV file, "
                          "or a directory of them.")
    if info.type not in (pafs.FileType.File, pafs.FileType.Directory):
        raise CorpusError(f"corpus {location}: neither a file nor a directory (a socket, device or pipe); give the corpus file or its directory.")
    prefix = location if "://" in location else ""

    def source(p: str, kind: str) -> Source:
        uri = (prefix.split("://")[0] + "://" + p) if prefix else p
        return Source(fs, p, kind, uri)

    if info.type == pafs.FileType.File:
        kind = _kind_of(path) if fmt in ("auto", "beir") else fmt
        if kind is None:
            raise CorpusError(f"corpus: cannot tell the format of {location!r} from its name; pass --format jsonl, parquet, trec or tsv.")
        return Sources([source(path, kind)])

    if fmt in ("auto", "beir"):
        for name in ("corpus.jsonl", "corpus.jsonl.gz"):
            candidate = f"{path.rstrip('/')}/{name}"
            if fs.get_file_info(candidate).type == pafs.FileType.File:
                # BEIR's layout: corpus.jsonl is the corpus. Other document files beside it (a corpus-2.jsonl, a
                # Parquet export) are not read, and said so: never skipped without a word
                out = Sources([source(candidate, "jsonl")])
                out.not_read = tuple(source(p, "jsonl").uri for p in _beside_beir_corpus(fs, path, candidate))
                out.why_not_read = BEIR_NOT_READ
                return out
        top = sorted(f.base_name for f in fs.get_file_info(pafs.FileSelector(path)))
        if fmt == "beir" or any(n in _BEIR_MARKERS for n in top):
            # a BEIR directory without its corpus file: never index its queries as documents
            raise CorpusError(
                f"corpus: {location!r} is laid out as a BEIR directory but holds no corpus.jsonl or corpus.jsonl.gz "
                f"(found: {', '.join(top[:10]) or 'nothing'}); give the directory that holds the corpus, or the corpus file itself."
            )

    broken = _broken_links(path) if isinstance(fs, pafs.LocalFileSystem) else []
    files = sorted(
        [f.path for f in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if f.type == pafs.FileType.File] + broken
    )  # (a link to nothing goes through the filters below: refused where it would be read)
    files = [p for p in files if not any(part.startswith(".") for part in p[len(path.rstrip("/")) + 1 :].split("/"))]  # hidden: not read
    not_read: list[str] = []
    if fmt == "trec":
        not_read = [p for p in files if _trec_not_read(p[len(path.rstrip("/")) + 1 :])]
        left_out = frozenset(not_read)
        files = [p for p in files if p not in left_out]
    kinds = {p: _kind_of(p) for p in files}
    if fmt in ("jsonl", "trec", "tsv"):  # files named with no format are this one's (hidden ones aside; JSONL: compressed ones)
        kinds = {p: k or (None if fmt == "jsonl" and not _compressed(p) else fmt) for p, k in kinds.items()}
    else:  # a directory's .tsv files are often its queries and qrels (MS MARCO's layout): read them only when told
        kinds = {p: None if k == "tsv" else k for p, k in kinds.items()}
    # a document file in a compression Arrow's streams do not undo: refused, never skipped (a queries, qrels or topics file, or
    # a .tsv one read only with --format tsv, is no document: left alone as before)
    unread = sorted({p for p in files if kinds[p] is None and p.lower().endswith(_UNREAD_COMPRESSED)
                     and _kind_of(p.rsplit(".", 1)[0]) in ("jsonl", "parquet", "trec")
                     and not any(part.lower().startswith(_NOT_DOCUMENTS) for part in p[len(path.rstrip("/")) + 1 :].split("/"))})
    if unread:
        rel = unread[0][len(path.rstrip("/")) + 1 :]
        raise CorpusError(f"corpus: {location!r} holds {len(unread)} document file(s) in a compression that is not read ({rel}); "
                          "decompress them, or compress them as .gz, .bz2, .zst or .lz4.")
    wanted = [p for p in files if kinds[p] is not None and (fmt in ("auto", "beir") or kinds[p] == fmt)]
    if gone := sorted(set(wanted) & set(broken)):
        raise CorpusError(f"corpus {location}: {gone[0]} is a link to nothing ({os.readlink(gone[0])}; {len(gone)} such document file(s)); "
                          "its documents would be read as deleted: fetch its content, or remove the link")
    # a file, or a folder below the corpus's (Hugging Face's BEIR layout: queries/queries/0000.parquet), named as one
    not_docs = [rel for rel in (p[len(path.rstrip("/")) + 1 :] for p in wanted)
                if any(part.lower().startswith(_NOT_DOCUMENTS) for part in rel.split("/"))]  # (relative)
    if not_docs:
        raise CorpusError(f"corpus: {location!r} holds query or relevance files ({', '.join(not_docs[:5])}), not documents; "
                          "give the collection file itself.")
    if not wanted:
        named = _KIND_NAMES.get(fmt)
        tsv = fmt not in ("trec", "tsv") and any(_kind_of(p) == "tsv" for p in files)
        raise CorpusError(f"corpus: no {named + ' files' if named else 'JSONL(.gz), Parquet or TREC SGML files'} under {location!r}"
                          + ("; a directory's .tsv files are read only with --format tsv (or give the collection's .tsv file)." if tsv else "."))
    found = sorted({kinds[p] for p in wanted})  # type: ignore[type-var]
    if len(found) > 1:
        raise CorpusError(f"corpus: {location!r} mixes {' and '.join(_KIND_NAMES[k] for k in found)} files; pass --format to pick one.")
    out = Sources(source(p, kinds[p]) for p in wanted)  # type: ignore[arg-type]
    out.not_read = tuple(source(p, "trec").uri for p in not_read)
    out.why_not_read = TREC_NOT_READ
    return out


@contextmanager
def open_stream(src: Source) -> Iterator[Any]:
    """A corpus file's bytes, decompressed: Arrow's stream undoes the compressions it knows by
    name (``.gz``, ``.bz2``, ``.zst``, ``.lz4``); Unix compress (``.Z``, TREC's ``.0z``) is
    undone by ncompress into a temporary file first, as LZW is not read part-way."""
    if _LZW_NAME.search(src.path) is None:
        with src.filesystem.open_input_stream(src.path, compression=_compression(src.path)) as stream:
            yield stream
        return
    import ncompress

    with src.filesystem.open_input_file(src.path) as raw, tempfile.TemporaryFile() as plain:
        _require_lzw(src, raw.read(len(_LZW_MAGIC)))
        raw.seek(0)
        try:
            ncompress.decompress(raw, plain)
        except ValueError as exc:  # (ncompress's word for data that is not LZW, or is corrupt)
            raise SourceError(f"corpus file {src.uri}: unreadable: not Unix compress (.Z) data or corrupt ({exc}).") from None
        plain.seek(0)
        yield plain


def _require_lzw(src: Source, head: bytes) -> None:
    if head != _LZW_MAGIC:
        raise SourceError(f"corpus file {src.uri}: a name ending {_LZW_NAME.search(src.path).group()} is Unix compress (.Z) data, "  # type: ignore[union-attr]
                          "and this file is not; rename it, or compress it.")

_json_string = json.encoder.encode_basestring  # a str as json.dumps(..., ensure_ascii=False) writes it
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # Unicode's control characters (category Cc), every one


def content_hash(title: str | None, text: str, metadata: str | None, vector: np.ndarray | None = None) -> str:
    """SHA-256 of a document's content (and the float32 numbers of its given vector); equal
    content gives equal hashes, whatever the id."""
    parts = (title, text, metadata)
    if all(p is None or type(p) is str for p in parts):  # the bytes json.dumps writes, without its encoder's set-up per call
        blob = "[" + ",".join("null" if p is None else _json_string(p) for p in parts) + "]"
    else:
        blob = json.dumps(list(parts), ensure_ascii=False, separators=(",", ":"))
    h = hashlib.sha256(blob.encode("utf-8"))
    if vector is not None:
        h.update(b"\0vector\0" + np.ascontiguousarray(vector, dtype="<f4").tobytes())
    return h.hexdigest()


def _json_value(value: Any) -> Any:
    """A metadata value JSON has no type for, as text: a Parquet timestamp, date or time in ISO
    8601, a decimal or a duration as written; anything else refused (TypeError)."""
    import datetime
    import decimal

    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | datetime.timedelta):
        return str(value)
    raise TypeError(f"a value of type {type(value).__name__} has no JSON form")


def _unread_text_fields(obj: dict[str, Any]) -> list[str]:
    """The fields of a record holding non-blank text that are neither its id, title, text nor
    metadata (nor MS MARCO v2's ``pid``/``docid``, nor a vector)."""
    known = {*ID_KEYS, *TEXT_KEYS, "title", "metadata", "pid"}
    return [k for k, v in obj.items() if k not in known and isinstance(v, str) and v.strip()]


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """The value of the first of ``keys`` the record has that holds one: a key whose value is
    null, a blank string or an empty list is passed over (a Parquet file merged from two
    exports fills ``text`` on some rows and ``contents`` on others, the other one null), else
    the first key's value as it is (None where the record has none of them)."""
    present = [obj[k] for k in keys if k in obj]
    for value in present:
        if not (value is None or value == [] or (isinstance(value, str) and not value.strip())):
            return value
    return present[0] if present else None


def validate_record(obj: Any, max_doc_bytes: int) -> tuple[dict[str, Any], str | None, str | None]:
    """Check one decoded record; returns (fields, reject reason or None, detail)."""
    empty = {"doc_id": None, "title": None, "text": None, "metadata": None}
    if not isinstance(obj, dict):
        return empty, "malformed_json", f"expected a JSON object, got {type(obj).__name__}"
    passage = "pid" in obj and "passage" in obj and not any(k in obj for k in ID_KEYS[:3])  # MS MARCO v2's
    entity = obj.keys() == {"title", "text"}  # QUEST's documents.jsonl: an entity's page, known by its title (unique there)
    doc_id = obj["pid"] if passage else obj["title"] if entity else _first(obj, ID_KEYS)
    if isinstance(doc_id, bool) or (doc_id is not None and not isinstance(doc_id, (str, int))):
        return empty, "bad_field_type", f"id must be a string, got {type(doc_id).__name__}"
    doc_id = None if doc_id is None else str(doc_id)
    if doc_id is not None and not utf8_text(doc_id):
        return empty, "invalid_utf8", f"the id {doc_id!r} holds a lone surrogate escape (half of a pair: no character)"
    fields = dict(empty, doc_id=doc_id or None)
    if not doc_id or not doc_id.strip():
        pid = " (a pid is an id only beside a passage, as in MS MARCO v2's passages)" if "pid" in obj and not passage else ""
        return fields, "missing_id", f"none of {list(ID_KEYS)} holds a non-empty id{pid}"
    if doc_id != doc_id.strip() or _CONTROL.search(doc_id):
        # ids are stored exactly as given; one that differs from another only by surrounding
        # whitespace, or holds a tab or newline, is almost surely a mistake (and no TSV or
        # TREC file can carry it), so it is refused rather than silently changed
        return fields, "bad_id", f"id {doc_id!r} has surrounding whitespace or a control character (tab, newline)"
    title, text, metadata = obj.get("title"), _first(obj, TEXT_KEYS), obj.get("metadata")
    if _msmarco_v2_document(obj) and isinstance(obj["headings"], str) and isinstance(text, str):
        # MS MARCO v2 and v2.1's documents and segments: the headings are text (Anserini indexes url, title, headings and
        # body), the URL kept in the metadata as v1's documents keep it (not searched)
        text, metadata = "\n".join(part for part in (obj["headings"], text) if part.strip()), {"url": obj["url"]}
    if isinstance(text, list):
        text = _list_text(text)
    if title is not None and not isinstance(title, str):
        return fields, "bad_field_type", f"title must be a string, got {type(title).__name__}"
    if text is not None and not isinstance(text, str):
        return fields, "bad_field_type", f"text must be a string, got {type(text).__name__}"
    if not (text and text.strip()) and not (title and title.strip()):  # a title alone is a document (BEIR has such: an abstract missing)
        return fields, "empty_text", f"none of {list(TEXT_KEYS)} nor the title holds non-blank text"
    if not any(k in obj for k in TEXT_KEYS) and (others := sorted(_unread_text_fields(obj))):
        # a title alone where the record names no text field but carries other text: its text is under a name not read
        # here (ClinicalTrials' summary), never silently dropped
        return fields, "empty_text", (f"no field named {' or '.join(TEXT_KEYS)}; its other text fields ({', '.join(others[:5])}) are not "
                                      "read: convert the records to one of those names")
    if metadata is not None and not isinstance(metadata, str):
        try:
            metadata = json.dumps(metadata, ensure_ascii=False, sort_keys=True, default=_json_value)
        except (TypeError, ValueError) as exc:  # a value JSON has no form for
            return fields, "bad_field_type", f"metadata: {exc}"
    try:  # (the size in UTF-8; a lone surrogate escape has none)
        size = len((text or "").encode("utf-8")) + len((title or "").encode("utf-8"))
    except UnicodeEncodeError:
        size = None
    if size is None or not utf8_text(metadata or ""):
        return fields, "invalid_utf8", "the title, text or metadata holds a lone surrogate escape (half of a pair: no character)"
    if size > max_doc_bytes:
        return fields, "oversized", f"{size} bytes of title+text > max_doc_bytes={max_doc_bytes}"
    return {"doc_id": doc_id, "title": title or None, "text": text or "", "metadata": metadata}, None, None




_ARTICLE_ITEMS = ("sanitized_html", "tweet")  # the items of a Washington Post article's contents that are its text


def _msmarco_v2_document(obj: dict) -> bool:
    """MS MARCO v2's and v2.1's documents (``docid``, ``url``, ``title``, ``headings``, ``body``)
    and v2.1's segments (``segment`` for ``body``, with ``start_char``, ``end_char``)."""
    return "docid" in obj and "url" in obj and "headings" in obj and ("body" in obj or "segment" in obj) and "metadata" not in obj


def _list_text(items: list) -> Any:
    """A text given as a list: paragraphs (strings), a line each; or a Washington Post article's
    ``contents`` (TREC Core 2018, News track: ``{"type", "content"}`` objects), whose text is
    the content of its ``sanitized_html`` and ``tweet`` items, as Anserini's
    WashingtonPostCollection takes it, a line each, its markup removed and its entities decoded
    as a TREC field's are (its kicker, title, byline, date and images are not text; null
    items and those without a type are skipped, as Anserini skips them). Any other list is
    returned as it is (a ``bad_field_type`` reject)."""
    if all(isinstance(i, str) for i in items) or all(i is None for i in items):
        return "\n".join(i for i in items if i is not None)
    if all(i is None or isinstance(i, dict) for i in items) and any(isinstance(i, dict) and "type" in i for i in items):
        return "\n".join(_trec_clean(i["content"]) for i in items
                          if i is not None and i.get("type") in _ARTICLE_ITEMS and isinstance(i.get("content"), str))
    return items


class _Batcher:
    """Accumulates parsed rows and emits PARSED tables of ``size`` rows (PARSED_VECTORS with
    ``vectors``: a row's ``fields`` then carry its checked ``vector``)."""

    def __init__(self, uri: str, size: int, vectors: bool = False):
        self.uri, self.size = uri, size
        self.schema = PARSED_VECTORS if vectors else PARSED
        self.cols: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        self.records = 0  # rows added so far: the next row's _record

    def add(self, location: int, fields: dict[str, Any], reason: str | None, detail: str | None) -> None:
        c = self.cols
        for k in ("doc_id", "title", "text", "metadata"):
            c[k].append(fields[k])
        vector = fields.get("vector") if reason is None else None  # a Vector (precomputed) or None
        c["content_hash"].append(
            None if reason else content_hash(fields["title"], fields["text"], fields["metadata"], None if vector is None else vector.given)
        )
        c["_source"].append(self.uri)
        c["_location"].append(location)
        c["_record"].append(self.records)
        self.records += 1
        c["_reason"].append(reason)
        c["_detail"].append(detail)
        if "vector" in c:
            c["vector"].append(None if vector is None else vector.unit)

    def __len__(self) -> int:
        return len(self.cols["_location"])

    def flush(self) -> pa.Table:
        table = pa.Table.from_pydict(self.cols, schema=self.schema)
        self.cols = {name: [] for name in self.schema.names}
        return table


class _Long(bytes):
    """The first :data:`_LONG_HEAD` bytes of a line over the reader's limit, the rest skipped
    (never held): enough to read the id a record starts with (:func:`_long_id`)."""


_LONG_HEAD = 4096


def _lines(stream, max_line: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Lines of a binary stream without their newline; a :class:`_Long` for a line over
    ``max_line`` bytes, whose other bytes are skipped, never held. The lines of a chunk are
    sliced from it by offset (each line's bytes copied once, not the rest of the chunk with
    every line)."""
    buf = b""
    skipping = None  # the head of the long line being skipped
    while True:
        data = stream.read(chunk)
        if not data:
            break
        buf += data
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            if skipping is not None:
                yield skipping
                skipping = None
            elif nl - start > max_line:
                yield _Long(buf[start : start + _LONG_HEAD])
            else:
                yield buf[start:nl]
            start = nl + 1
        buf = buf[start:]
        if len(buf) > max_line:
            buf, skipping = b"", (skipping if skipping is not None else _Long(buf[:_LONG_HEAD]))
    if skipping is not None:
        yield skipping
    elif buf:
        yield buf


# The id a JSON record starts with, read from a long line's head: the first key one of ID_KEYS, its value a string or an integer
_ID_NAMES = b"|".join(k.encode() for k in ID_KEYS)
_JSON_ID = re.compile(rb'\s*\{\s*"(' + _ID_NAMES + rb')"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)\s*[,}]')
_JSON_ANY_ID = re.compile(rb'"(' + _ID_NAMES + rb')"\s*:')


def _long_id(head: bytes, kind: str) -> str | None:
    """The id of the record a line over the limit holds, read from its head (:class:`_Long`),
    so that a stored document of that id is held, as one whose record is rejected for its size
    within the limit is, not taken for absent and deleted. JSON Lines: the record's first key
    when it is an id key and no other id key is in the head (which one a record's id is read
    from depends on all its keys); TSV: the first field. None where it cannot be told."""
    head = head.removeprefix(_BOM)
    if kind == "jsonl":
        m = _JSON_ID.match(head)
        if m is None or len(_JSON_ANY_ID.findall(head)) != 1:
            return None
        try:
            value = json.loads(m.group(2))
        except ValueError:
            return None
        candidate = str(value) if isinstance(value, (str, int)) else None
    else:
        field, tab, _ = head.partition(b"\t")
        if not tab or field.startswith(b'"'):
            return None
        try:
            candidate = field.decode("utf-8")
        except UnicodeDecodeError:
            return None
    ok = candidate and candidate == candidate.strip() and not _CONTROL.search(candidate) and utf8_text(candidate)
    return candidate if ok else None


def _read_rows(src: Source, batch_rows: int, max_line: int,
               parse: Callable[[bytes], tuple[dict[str, Any], str | None, str | None] | None], vectors: bool = False,
               kind: str = "jsonl") -> Iterator[pa.Table]:
    """A line-per-record file (JSONL, TSV: ``kind``): each non-blank line parsed by ``parse(raw)``
    (None: a header, no record), a UTF-8 byte order mark starting the file or a line removed
    (never part of a record or an id: files written with one and joined by ``cat`` hold one at
    a line's start); a line longer than ``max_line`` bytes is an ``oversized`` reject, never
    read whole, naming the id its head holds (:func:`_long_id`)."""
    batch = _Batcher(src.uri, batch_rows, vectors)
    with open_stream(src) as stream:
        for line_no, raw in enumerate(_lines(stream, max_line), 1):
            if isinstance(raw, _Long):
                batch.add(line_no, dict(_blank(), doc_id=_long_id(raw, kind)), "oversized", f"line longer than {max_line} bytes")
            elif not (raw := raw.removeprefix(_BOM)).strip():
                continue  # blank lines are layout, not records
            elif (parsed := parse(raw)) is not None:
                batch.add(line_no, *parsed)
            if len(batch) >= batch_rows:
                yield batch.flush()
    if len(batch):
        yield batch.flush()


def _read_jsonl(src: Source, batch_rows: int, max_doc_bytes: int, vectors: VectorColumn | None = None) -> Iterator[pa.Table]:
    # Not files.read_jsonl, which stops at a bad line: a corpus reads bytes from any pyarrow
    # filesystem, bounds a record's size and keeps going past a bad record (quarantined, counted).
    # A JSON line may escape every character (6 bytes for one); past this we do not parse (a
    # vector's numbers count on top: up to 32 characters each).
    max_line = 6 * max_doc_bytes + (1 << 16) + (32 * vectors.dim if vectors else 0)
    return _read_rows(src, batch_rows, max_line, lambda raw: _parse_line(raw, max_doc_bytes, vectors), vectors is not None)


def _blank() -> dict[str, Any]:
    return {"doc_id": None, "title": None, "text": None, "metadata": None}


def _undecodable_id(raw: bytes, kind: str) -> str | None:
    """The id of a line that is not UTF-8 where its id itself is (a Latin-1 byte in the text),
    so that the stored document of that id is held, not taken for absent and deleted, as for
    any other reject that names its id: JSON Lines: the record read with U+FFFD for the bad
    bytes, its id as :func:`validate_record` reads it, unless the id holds one; TSV: the first
    field (:func:`_long_id`). None where the id cannot be told; never guessed."""
    if kind != "jsonl":
        return _long_id(raw, kind)
    try:
        return _replaced_id(json.loads(raw.decode("utf-8", "replace")))
    except (ValueError, RecursionError):  # not JSON, an integer past Python's limit, a nesting too deep: the id its head names
        return _long_id(raw, "jsonl")


def _replaced_id(obj: Any) -> str | None:
    """The id :func:`validate_record` reads from ``obj``, a record whose bytes that are not
    UTF-8 were read as U+FFFD, unless the id holds one (or is no valid id)."""
    doc_id = validate_record(obj, 1 << 62)[0]["doc_id"] if isinstance(obj, dict) else None
    ok = doc_id and "\ufffd" not in doc_id and doc_id == doc_id.strip() and not _CONTROL.search(doc_id)
    return doc_id if ok else None


def _parse_line(raw: bytes, max_doc_bytes: int, vectors: VectorColumn | None = None) -> tuple[dict[str, Any], str | None, str | None]:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return dict(_blank(), doc_id=_undecodable_id(raw, "jsonl")), "invalid_utf8", str(exc)
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:  # its id read from its head, so that a stored document of that id is held, not deleted
        # (JSONDecodeError is a ValueError; so is an integer of more than 4,300 digits, and a nesting too deep is a RecursionError)
        return dict(_blank(), doc_id=_long_id(raw, "jsonl")), "malformed_json", first_line(exc)
    checked = validate_record(obj, max_doc_bytes)
    if vectors is None or checked[1] is not None:
        return checked
    vector, reason, detail = check_vector(obj.get(vectors.name), vectors.dim)
    return {**checked[0], "vector": vector}, reason, f"field {vectors.name!r}: {detail}" if reason else None


def _read_parquet(src: Source, batch_rows: int, max_doc_bytes: int, vectors: VectorColumn | None = None) -> Iterator[pa.Table]:
    batch = _Batcher(src.uri, batch_rows, vectors is not None)
    with src.filesystem.open_input_file(src.path) as f:
        pf = pq.ParquetFile(f, page_checksum_verification=True)  # a page whose CRC the writer stored is checked
        row = 0
        for record_batch in pf.iter_batches(batch_size=batch_rows):
            given = None
            if vectors is not None:  # the vector column checked as arrays, not turned into Python lists
                given = _parquet_vectors(record_batch, vectors)
                if vectors.name in record_batch.schema.names:
                    record_batch = record_batch.drop_columns([vectors.name])
            for i, rec in enumerate(record_batch.to_pylist()):
                decoded = _decode_binary(rec)
                if isinstance(decoded, tuple):  # (reason, detail): named by its id where the id is UTF-8 (_undecodable_id)
                    replaced = {k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v for k, v in rec.items()}
                    batch.add(row, dict(_blank(), doc_id=_replaced_id(replaced)), *decoded)
                else:
                    fields, reason, detail = validate_record(decoded, max_doc_bytes)
                    if given is not None and reason is None:
                        vector, reason, detail = given[i]
                        fields = {**fields, "vector": vector}
                    batch.add(row, fields, reason, detail)
                row += 1
                if len(batch) >= batch_rows:
                    yield batch.flush()
    if len(batch):
        yield batch.flush()


def _parquet_vectors(record_batch: pa.RecordBatch, vectors: VectorColumn) -> list[tuple[Vector | None, str | None, str | None]]:
    """:func:`check_vector`'s verdict on each row of a Parquet batch's vector column."""
    n, name = record_batch.num_rows, vectors.name
    if name not in record_batch.schema.names:
        return [(None, "missing_vector", f"no column {name!r} in this file")] * n
    column = record_batch.column(name)
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)) or not (
            pa.types.is_floating(kind.value_type) or pa.types.is_integer(kind.value_type)):
        return [(None, "bad_vector", f"column {name!r} holds {kind}, not a list of numbers")] * n
    lengths = pc.fill_null(pc.list_value_length(column), -1).to_numpy(zero_copy_only=False)
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.float64)  # a null number reads as NaN
    starts = np.cumsum(np.maximum(lengths, 0)) - np.maximum(lengths, 0)
    whole = np.flatnonzero(lengths == vectors.dim)  # the rows of the right dimension, checked together
    checked = dict(zip(whole.tolist(), _units(values[starts[whole, None] + np.arange(vectors.dim)]), strict=True))
    out = []
    for i in range(n):
        if lengths[i] < 0:
            out.append((None, "missing_vector", f"column {name!r} is null"))
        elif lengths[i] != vectors.dim:
            out.append((None, "vector_dim", f"column {name!r}: {lengths[i]} numbers, expected {vectors.dim}"))
        else:
            vector, reason, detail = checked[i]
            out.append((vector, reason, f"column {name!r}: {detail}" if reason else None))
    return out


def _decode_binary(rec: dict[str, Any]) -> dict[str, Any] | tuple[str, str]:
    """Binary columns must hold UTF-8 text to count as strings."""
    out = {}
    for k, v in rec.items():
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError as exc:
                return "invalid_utf8", f"column {k!r}: {exc}"
        out[k] = v
    return out


def _read_tsv(src: Source, batch_rows: int, max_doc_bytes: int) -> Iterator[pa.Table]:
    # TSV escapes nothing (DPR's quotes aside): a line longer than a document, its id and its title is oversized whatever it holds
    layout: list[Callable[[bytes, int], tuple[dict[str, Any], str | None, str | None]]] = []  # the parser the first line picks

    def parse(raw: bytes) -> tuple[dict[str, Any], str | None, str | None] | None:
        if not layout:
            if raw.rstrip(b"\r\n") == _DPR_HEADER:  # DPR's Wikipedia passages (psgs_w100.tsv): a header, then quoted fields
                layout.append(_parse_dpr)
                return None
            layout.append(_parse_msmarco_docs if _MSMARCO_DOCS.fullmatch(raw.rstrip(b"\r\n")) else _parse_tsv)
        return layout[0](raw, max_doc_bytes)

    return _read_rows(src, batch_rows, max_doc_bytes + (1 << 16), parse, kind="tsv")


_DPR_HEADER = b"id\ttext\ttitle"


def _decoded(raw: bytes) -> tuple[str | None, str | None]:
    """A TSV line's bytes as text, a trailing ``\\r`` dropped; (None, why) where they are not UTF-8."""
    try:
        return raw.decode("utf-8").removesuffix("\r"), None
    except UnicodeDecodeError as exc:
        return None, str(exc)


def _parse_dpr(raw: bytes, max_doc_bytes: int) -> tuple[dict[str, Any], str | None, str | None]:
    """A line of DPR's passages file: id, text, title, tab-separated, a field in double quotes
    where it holds one (``""`` inside), as DPR reads it (Python's csv, tab-delimited)."""
    line, bad = _decoded(raw)
    if line is None:
        return dict(_blank(), doc_id=_undecodable_id(raw, "tsv")), "invalid_utf8", bad
    try:
        parts = next(csv.reader([line], delimiter="\t"))  # (not strict, as DPR's: "abc"def is abcdef)
    except csv.Error as exc:
        return _blank(), "bad_tsv_row", f"{exc}; a line of a DPR passages file (header id<TAB>text<TAB>title) is three fields, quoted as CSV quotes"
    if len(parts) != 3:
        return dict(_blank(), doc_id=_long_id(raw, "tsv")), "bad_tsv_row", (f"{len(parts)} tab-separated fields; a DPR passages line is "
                                                                           "id<TAB>text<TAB>title (its header's)")
    return _say(validate_record({"_id": parts[0], "text": parts[1], "title": parts[2]}, max_doc_bytes), _TSV_SAYS)


# MS MARCO v1's documents (msmarco-docs.tsv): docid, URL, title, body; told by a first line of four fields, the second a URL
_MSMARCO_DOCS = re.compile(rb"[^\t]+\thttps?://[^\t]*\t[^\t]*\t[^\t]*")


def _parse_msmarco_docs(raw: bytes, max_doc_bytes: int) -> tuple[dict[str, Any], str | None, str | None]:
    """A line of MS MARCO v1's documents file: docid, URL, title, body, tab-separated, no
    quoting. The body is the text, the title the title, the URL kept in the metadata (not
    searched)."""
    line, bad = _decoded(raw)
    if line is None:
        return dict(_blank(), doc_id=_undecodable_id(raw, "tsv")), "invalid_utf8", bad
    parts = line.split("\t")
    if len(parts) != 4:
        return dict(_blank(), doc_id=_long_id(raw, "tsv")), "bad_tsv_row", (f"{len(parts)} tab-separated fields; an MS MARCO documents "
                                                                           "line is docid<TAB>url<TAB>title<TAB>body (its first line's layout)")
    record = {"_id": parts[0], "title": parts[2], "text": parts[3], "metadata": {"url": parts[1]}}
    return _say(validate_record(record, max_doc_bytes), _MSMARCO_DOCS_SAYS)


def _parse_tsv(raw: bytes, max_doc_bytes: int) -> tuple[dict[str, Any], str | None, str | None]:
    line, bad = _decoded(raw)
    if line is None:
        return dict(_blank(), doc_id=_undecodable_id(raw, "tsv")), "invalid_utf8", bad
    parts = line.split("\t")
    if len(parts) != 2:
        what = "no tab" if len(parts) == 1 else f"{len(parts)} tab-separated fields"
        return (dict(_blank(), doc_id=_long_id(raw, "tsv")), "bad_tsv_row",  # (its first field: a stored document of that id is held)
                f"{what}; a TSV corpus line is id<TAB>text (a text holding a tab cannot be given as TSV)")
    return _say(validate_record({"_id": parts[0], "text": parts[1]}, max_doc_bytes), _TSV_SAYS)


# TREC SGML. A <DOC> or </DOC> tag (not <DOCNO>, <DOCHDR>), attributes allowed but bounded, so
# that a tag cut by a read boundary is found again from the last _TAG_OVERLAP bytes.
_DOC_TAG = re.compile(rb"<(/?)doc(?:\s[^<>]{0,200})?>", re.IGNORECASE)
_TAG_OVERLAP = 256
_NON_BLANK = re.compile(rb"\S")
_KEEP_HEAD = 8192  # bytes of a skipped (oversized or unclosed) DOC kept to name its DOCNO
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_TAG = re.compile(r"<(/?)([A-Za-z][\w.:-]*)(?:\s[^<>]*)?/?>")
_GLUE = re.compile(r"(?<=[^\s\0])\0+(?=[^\s\0])")  # removed tags between two non-blank characters
_CLOSE_TAG = re.compile(r"</([A-Za-z][\w.:-]*)\s*>")
_TITLE_TAGS = ("title", "head", "headline", "hl", "ttl", "ti")  # a DOC's title: the first of these it has (LA Times/FT HEADLINE, WSJ HL, FBIS TI)
_TEXT_TAGS = ("leadpara", "lp", "text")  # a DOC's text, in document order (SJM's LEADPARA, WSJ's LP before TEXT)
_TREC_FIELDS = ("docno", *_TITLE_TAGS, *_TEXT_TAGS)  # the elements read as fields; every other tag is markup
_HTML_FIELDS = ("docno", "title")  # a web page's (a DOC _HTML finds): its HEAD and TEXT are HTML's, not TREC's
# a web page: HTML (its <html>, a <!DOCTYPE>) or a web collection's DOCHDR (the URL and HTTP
# headers before the page: WT10g and GOV2 pages often start at <HEAD>, no <html>). Not <BODY>:
# news collections' DOCs hold one (AQUAINT's <BODY> holds its <HEADLINE> and <TEXT>)
_HTML = re.compile(r"<(?:html|!doctype|dochdr)\b", re.IGNORECASE)
_DECLARATION = re.compile(r"<(?:![^\[<>][^<>]*|\?[^<>]*)>")  # <!DOCTYPE ...>, <?xml ...?> (comments are gone first): markup, not text
_CDATA = re.compile(r"<!\[CDATA\[(.*?)\]\]>", re.S)  # an XHTML page's CDATA section: its characters are text
_SCRIPT = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>", re.IGNORECASE | re.S)  # a web page's code, not its text
_BLOCK_TAGS = frozenset({"p", "br", "div", "td", "th", "tr", "li", "ul", "ol", "dl", "dd", "dt", "table", "hr", "blockquote", "pre",
                         "h1", "h2", "h3", "h4", "h5", "h6", "title"})  # tags that end a word; inline ones (<b>, <sub>) do not
_CLOSE_OPEN = re.compile(r"(</[A-Za-z][^<>]*>)(?=<[A-Za-z])")  # one element ending where the next begins: their texts are separate


def trec_raw_limit(max_doc_bytes: int) -> int:
    """The most bytes of one TREC DOC read into memory: markup and entities make the raw DOC
    longer than its title and text, so this is a multiple of ``max_doc_bytes`` (as for a JSONL
    line); a longer DOC is an ``oversized`` reject, skipped without being held."""
    return 6 * max_doc_bytes + (1 << 16)


def trec_units(stream, cap: int, chunk: int = 1 << 20) -> Iterator[tuple[str, int, bytes, str | None]]:
    """The DOCs of a TREC SGML byte stream, in bounded memory: (kind, line, data, detail).

    kind ``doc``: ``data`` is the DOC from its ``<DOC>`` tag (whose attributes may hold its id)
    to its ``</DOC>``, that tag left out; ``unclosed_doc`` and
    ``oversized``: the first bytes of the DOC; ``outside_doc``: the first bytes of a stretch of
    non-blank text outside every DOC. ``line``: 1-based, of the ``<DOC>`` tag (or the text).
    ``cap``: the most bytes of one DOC held (:func:`trec_raw_limit`); ``chunk``: the size of
    each read, which never changes what is found."""
    buf, pos, scan, eof = stream.read(3), 0, 0, False
    buf = buf.removeprefix(_BOM)  # a UTF-8 byte order mark is not text outside the DOCs
    keep_head = min(_KEEP_HEAD, cap)  # the same bytes whatever the read boundaries
    counted, line = 0, 1  # buf[counted] is on this line
    doc_line, doc_start, head, tag_len = 0, -1, None, 0  # inside a DOC: its line, where its tag starts; head: it is being skipped
    stray: tuple[int, bytes] | None = None  # non-blank text seen outside the DOCs, not reported yet

    def line_of(p: int) -> int:
        nonlocal counted, line
        line += buf.count(b"\n", counted, p)
        counted = p
        return line

    def note_stray(a: int, b: int) -> None:
        nonlocal stray
        m = _NON_BLANK.search(buf, a, b)
        if m is not None and stray is None:
            stray = (line_of(m.start()), buf[m.start() : min(b, m.start() + 80)].rstrip())

    def stray_unit():
        nonlocal stray
        if stray is None:
            return None
        unit, stray = ("outside_doc", stray[0], stray[1], None), None
        return unit

    while True:
        m = _DOC_TAG.search(buf, scan)
        if m is None:
            if eof:
                break
            tail = max(pos, len(buf) - _TAG_OVERLAP)
            if doc_start < 0:
                note_stray(pos, tail)
                pos = tail
            elif head is None and tail - doc_start - tag_len > cap:  # bytes before tail hold no </DOC> (a cut tag lies after it)
                head = buf[doc_start : doc_start + keep_head]
            if head is not None:
                pos = tail
            keep = doc_start if doc_start >= 0 and head is None else pos
            if counted < keep:
                line_of(keep)
            buf, counted, pos = buf[keep:], counted - keep, pos - keep
            doc_start = doc_start - keep if doc_start >= 0 and head is None else doc_start
            scan = max(pos, len(buf) - _TAG_OVERLAP)
            data = stream.read(chunk)
            if data:
                buf += data
            else:
                eof = True
            continue
        closing = bool(m.group(1))
        if doc_start < 0 and closing:  # a </DOC> that closes nothing: stray text
            note_stray(pos, m.end())
            pos = scan = m.end()
            continue
        if doc_start < 0:
            note_stray(pos, m.start())
            if (unit := stray_unit()) is not None:
                yield unit
        elif closing:
            if head is not None or m.start() - doc_start - tag_len > cap:  # (the same whatever the read boundaries)
                yield "oversized", doc_line, head or buf[doc_start : doc_start + keep_head], f"the DOC is longer than {cap} bytes"
            else:
                yield "doc", doc_line, buf[doc_start : m.start()], None
            doc_start, head = -1, None
            pos = scan = m.end()
            continue
        else:  # a <DOC> while one is open
            body = head if head is not None else buf[doc_start : min(m.start(), doc_start + keep_head)]
            yield "unclosed_doc", doc_line, body, f"no </DOC> before the next <DOC> at line {line_of(m.start())}"
        doc_line, doc_start, head = line_of(m.start()), m.start(), None
        tag_len = m.end() - m.start()  # (cap bounds the DOC's body, after its tag)
        pos = scan = m.end()
    if doc_start >= 0:
        body = head if head is not None else buf[doc_start : doc_start + keep_head]
        yield "unclosed_doc", doc_line, body, "no </DOC> before the end of the file"
    else:
        note_stray(pos, len(buf))
        if (unit := stray_unit()) is not None:
            yield unit


def _trec_fields(body: str, names: tuple[str, ...] = _TREC_FIELDS) -> dict[str, list[str]]:
    """A DOC's field elements (``names``) by lower-case name, each its raw inner text, the
    text elements (``_TEXT_TAGS``) together under ``text`` in document order; ``""``: the
    DOC's text outside its DOCNO and title elements. A field element runs from its tag to the
    first matching close tag after it; every other tag (``<P>``, ``<DATE>``, an SGML empty tag
    such as ``<F P=105>``) is markup, stripped later, so no other element's close tag can
    swallow a TEXT."""
    closes: dict[str, list[tuple[int, int]]] = {}
    for c in _CLOSE_TAG.finditer(body):
        closes.setdefault(c.group(1).lower(), []).append((c.start(), c.end()))
    out: dict[str, list[str]] = {}
    rest: list[str] = []
    at = 0
    while (m := _TAG.search(body, at)) is not None:
        name = m.group(2).lower()
        ends = [] if m.group(1) or name not in names else closes.get(name, [])
        i = bisect.bisect_left(ends, (m.end(), 0))
        if i == len(ends):  # markup (any other tag, or a field tag never closed): left in the text, stripped later
            rest.append(body[at : m.end()])
            at = m.end()
            continue
        inner = body[m.end() : ends[i][0]]
        text = name in _TEXT_TAGS
        out.setdefault("text" if text else name, []).append(inner)
        rest.append(body[at : m.start()] + (inner if text else " "))
        at = ends[i][1]
    rest.append(body[at:])
    out[""] = ["".join(rest)]
    return out


def _trec_clean(raw: str) -> str:
    """A field's text: markup removed (a space where a block tag such as ``<P>``, or the end of
    one element and the start of the next, stood between two words; an inline tag such as
    ``<B>`` or ``<SUB>`` leaves nothing: ``H<SUB>2</SUB>O`` is ``H2O``), layout whitespace
    stripped, entities decoded."""
    marked = _TAG.sub(lambda m: "\0" if m.group(2).lower() in _BLOCK_TAGS else "", _CLOSE_OPEN.sub("\\1\0", _COMMENT.sub("\0", raw)))
    # (the Federal Register's &blank; is a blank, which HTML5 names U+2423, the symbol for one)
    return html.unescape(_GLUE.sub(" ", marked).replace("\0", "").strip().replace("&blank;", " "))


def _trec_docno(body: str) -> str | None:
    m = re.search(r"<docno(?:\s[^<>]*)?>(.*?)</docno", body, re.IGNORECASE | re.S)
    if m is None:
        return _trec_clean(attribute) if (attribute := _doc_id_attribute(body)) is not None else None
    return _trec_clean(m.group(1))


# a DOC tag's id attribute (AQUAINT-2's and Gigaword's <DOC id="APW_ENG_20041001.0001" type="story">), its value quoted or not
_DOC_ID = re.compile(r"""\A\s*<doc\s[^<>]*?(?<![\w-])id\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'<>]+))""", re.IGNORECASE)


def _doc_id_attribute(doc: str) -> str | None:
    m = _DOC_ID.match(doc)
    return next(g for g in m.groups() if g is not None) if m else None  # (raw: _trec_clean decodes its entities)


def _parse_trec(body: bytes, max_doc_bytes: int) -> tuple[dict[str, Any], str | None, str | None]:
    try:
        doc, replaced = body.decode("utf-8"), 0
    except UnicodeDecodeError as exc:  # (TREC's older collections hold Latin-1 bytes: read as Anserini and ir_datasets read them)
        doc = body.decode("utf-8", errors="replace")
        replaced, error = doc.count("\ufffd") - body.count(_REPLACEMENT), str(exc)
    fields, reason, detail = _trec_record(doc, max_doc_bytes)
    if replaced and "\ufffd" in (fields["doc_id"] or ""):  # an id is never guessed at
        return _blank(), "invalid_utf8", f"the DOCNO holds U+FFFD in a DOC with bytes that are not UTF-8 ({error}): an id is never guessed"
    if replaced and reason is None:
        detail = f"{NOT_UTF8_NOTE}: {replaced} byte sequence(s) read as U+FFFD"
    return fields, reason, detail


_REPLACEMENT = "\ufffd".encode()  # U+FFFD written in UTF-8: a character of the text, not a replaced byte
# the note (``_detail``) of a valid TREC document some of whose bytes were not UTF-8 (IndexWriter counts these)
NOT_UTF8_NOTE = "bytes not UTF-8"


def _trec_record(doc: str, max_doc_bytes: int) -> tuple[dict[str, Any], str | None, str | None]:
    page = _HTML.search(doc) is not None
    doc = _COMMENT.sub(" ", _SCRIPT.sub(" ", doc) if page else doc)  # a comment between two words parts them
    if page:
        doc = _CDATA.sub(lambda m: html.escape(m.group(1), quote=False), _DECLARATION.sub(" ", doc))
    fields = _trec_fields(doc, _HTML_FIELDS if page else _TREC_FIELDS)
    docno = fields["docno"][0] if "docno" in fields else _doc_id_attribute(doc) or ""  # (no DOCNO: the DOC tag's id)
    titles = next((fields[t] for t in _TITLE_TAGS if t in fields), [])
    title = " ".join(t for t in map(_trec_clean, titles) if t)
    text = "\n".join(_trec_clean(t) for t in fields["text"]) if "text" in fields else _trec_clean(fields[""][0])
    return _say(validate_record({"docno": _trec_clean(docno), "title": title, "text": text}, max_doc_bytes), _TREC_SAYS)


# validate_record's details name JSON keys; these say the same of a TREC DOC or a TSV line
_TREC_SAYS = {"missing_id": "no <DOCNO> element (nor an id attribute of its <DOC> tag) holding a non-blank id",
              "empty_text": "no non-blank text and no title (text: in its <TEXT> elements; where it has none, outside its DOCNO and title elements)"}
_TSV_SAYS = {"missing_id": "the id (the first field) is empty", "empty_text": "the text (the second field) is blank"}
_MSMARCO_DOCS_SAYS = {"missing_id": "the docid (the first field) is empty", "empty_text": "the title and the body (the third and fourth fields) are blank"}


def _say(checked: tuple[dict[str, Any], str | None, str | None], says: dict[str, str]) -> tuple[dict[str, Any], str | None, str | None]:
    fields, reason, detail = checked
    return fields, reason, says.get(reason, detail) if reason else detail


def _read_trec(src: Source, batch_rows: int, max_doc_bytes: int) -> Iterator[pa.Table]:
    batch = _Batcher(src.uri, batch_rows)
    with open_stream(src) as stream:
        for kind, line, data, detail in trec_units(stream, trec_raw_limit(max_doc_bytes)):
            if kind == "doc":
                batch.add(line, *_parse_trec(data, max_doc_bytes))
            elif kind == "outside_doc":
                text = data.decode("utf-8", errors="replace")
                batch.add(line, _blank(), kind, f"text outside every <DOC>...</DOC>: {text!r}")
            else:  # unclosed_doc, oversized: named by its DOCNO where its first bytes hold one
                docno = _trec_docno(data.decode("utf-8", errors="replace"))
                ok = docno and "\ufffd" not in docno
                batch.add(line, dict(_blank(), doc_id=docno if ok else None), kind, detail)
            if len(batch) >= batch_rows:
                yield batch.flush()
    if len(batch):
        yield batch.flush()


_READERS: dict[str, Callable[..., Iterator[pa.Table]]] = {
    "jsonl": _read_jsonl, "parquet": _read_parquet, "trec": _read_trec, "tsv": _read_tsv,
}


def read_source(src: Source, batch_rows: int = 1024, max_doc_bytes: int = 1 << 20,
                vectors: VectorColumn | None = None) -> Iterator[pa.Table]:
    """Stream one source as PARSED tables of at most ``batch_rows`` rows (PARSED_VECTORS, each
    row's vector read from ``vectors``' field or column and checked, when given).

    Raises :class:`SourceError` (after the batches read before the fault) when the file
    cannot be read to its end."""
    if batch_rows < 1:
        raise ValueError("batch_rows must be >= 1")
    reader = _READERS.get(src.kind)
    if reader is None:
        raise CorpusError(f"corpus file {src.uri}: unknown format {src.kind!r}; give one of {', '.join(KINDS)}.")
    if vectors is not None:
        _require_vector_kind(src, vectors.name)
    rows = 0
    with _source_faults(src, lambda: rows):
        for table in reader(src, batch_rows, max_doc_bytes, **({"vectors": vectors} if vectors else {})):
            rows += table.num_rows
            yield table


def _require_vector_kind(src: Source, vector_column: str) -> None:
    if src.kind not in VECTOR_KINDS:
        raise SourceError(f"corpus file {src.uri}: a {_KIND_NAMES.get(src.kind, src.kind)} file carries no vectors; --vector-column "
                          f"{vector_column} reads JSONL (a list field) or Parquet (a list column).")


def check_sources(sources: list[Source], vector_column: str | None = None) -> None:
    """Open every source and read its first bytes (a Parquet file: its footer), so that a
    file that cannot be read at all, is not compressed as its name says, or is not text is
    refused before any work starts; with ``vector_column``, so is a file of a format that
    carries no vectors and a Parquet file without that column. Raises :class:`SourceError`."""
    for src in sources:
        if vector_column is not None:
            _require_vector_kind(src, vector_column)
        with _source_faults(src, lambda: 0):
            if src.kind == "parquet":
                with src.filesystem.open_input_file(src.path) as f:
                    schema = pq.ParquetFile(f).schema_arrow
                if vector_column is not None and vector_column not in schema.names:
                    raise SourceError(f"corpus file {src.uri}: no column {vector_column!r} (--vector-column); its columns: "
                                      f"{', '.join(schema.names)}.")
                continue
            if _LZW_NAME.search(src.path) is not None:  # (decompressed whole to be read: its first bytes say it is LZW)
                with src.filesystem.open_input_file(src.path) as f:
                    _require_lzw(src, f.read(len(_LZW_MAGIC)))
                continue
            with src.filesystem.open_input_stream(src.path, compression=_compression(src.path)) as stream:
                head = stream.read(_HEAD_BYTES)
            if head[:2] == _LZW_MAGIC:
                packed = Path(src.path).suffix.lower() in _COMPRESSED  # (its bytes, once undone, are LZW: two layers)
                raise SourceError(f"corpus file {src.uri}: Unix compress (.Z) data under a name without .Z; "
                                  + ("undo its outer compression and name the file .Z (or uncompress it)." if packed else
                                     f"name the file {Path(src.path).name}.Z (or uncompress it)."))
            if head[:2] == b"\x1f\x8b" and Path(src.path).suffix.lower() not in _COMPRESSED:  # (told by the name: Arrow's streams)
                raise SourceError(f"corpus file {src.uri}: gzip data under a name without .gz; name the file {Path(src.path).name}.gz "
                                  "(or gunzip it).")
            if not_text(head):
                raise SourceError(f"corpus file {src.uri}: not UTF-8 text (it holds NUL bytes: a binary file, or UTF-16/32 text); "
                                  f"a {_KIND_NAMES.get(src.kind, src.kind)} corpus is UTF-8 text, {_TEXT_LAYOUT.get(src.kind, '')}.")


def source_fault(src: Source, error: SourceError, vectors: bool = False) -> pa.Table:
    """The one PARSED row (PARSED_VECTORS with ``vectors``, as its file's other batches) a reader
    running in a Ray task sends in place of a failed file: ``_reason`` :data:`UNREADABLE`,
    ``_detail`` the refusal. The job's writer raises it."""
    row = {**_blank(), "content_hash": None, "_source": src.uri, "_location": -1, "_record": -1, "_reason": UNREADABLE, "_detail": str(error)}
    return pa.Table.from_pylist([row], schema=PARSED_VECTORS if vectors else PARSED)


def _source_faults(src: Source, rows_read: Callable[[], int]):
    """:func:`reading` for a corpus file: the refusal says how many rows came before the fault."""

    def label() -> str:
        n = rows_read()
        return f"corpus file {src.uri}: unreadable" + (f" after {n} rows" if n else "")

    return reading(label, SourceError)


def iter_corpus(location: str, fmt: str = "auto", batch_rows: int = 1024, max_doc_bytes: int = 1 << 20) -> Iterator[pa.Table]:
    """Every source of a corpus, streamed in order (the single-process reader)."""
    for src in list_sources(location, fmt):
        yield from read_source(src, batch_rows, max_doc_bytes)
