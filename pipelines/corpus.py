"""Corpus readers, row validation and content hashing.

A corpus is a BEIR directory (``corpus.jsonl[.gz]``), plain JSONL(.gz) files, or Parquet
files, on a local path or any pyarrow filesystem URI. Readers stream: each source yields
Arrow tables of at most ``batch_rows`` rows, so no corpus is ever held whole in memory.

Every input row comes out exactly once, either valid (``_reason`` null) or marked with
the reason it was rejected and where it came from (``_source``, ``_location``). Deciding
what to do with rejects is the caller's business; a bad row never hides a good one.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.files import not_text, reading
from schemas.errors import UserError

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
        pa.field("_reason", pa.string()),  # null: valid; else one of REJECT_REASONS
        pa.field("_detail", pa.string()),
    ]
)

ID_KEYS = ("doc_id", "_id", "id", "docid", "docno")
TEXT_KEYS = ("text", "contents", "body")
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz")
_PARQUET_SUFFIXES = (".parquet", ".pq")
# A directory holding any of these is a BEIR directory, whose corpus must be corpus.jsonl[.gz].
_BEIR_MARKERS = ("queries.jsonl", "queries.jsonl.gz", "qrels")


class CorpusError(UserError, ValueError):
    """The corpus location or layout cannot be read."""


class SourceError(CorpusError):
    """A corpus file cannot be read (cut off, corrupt, binary, unreadable): the whole run stops.

    Unlike a bad row (a reject), a file that fails part-way hides every row after the fault,
    so no snapshot read from it may change the table.
    """


UNREADABLE = "unreadable_source"  # the _reason of the one row a reader emits in place of a failed file
_HEAD_BYTES = 1 << 16  # what check_sources reads of each file


@dataclass(frozen=True)
class Source:
    """One file of a corpus."""

    filesystem: pafs.FileSystem
    path: str
    kind: str  # "jsonl" | "parquet"
    uri: str  # how to name it in rejects and manifests

    def fingerprint(self) -> dict[str, Any]:
        info = self.filesystem.get_file_info(self.path)
        mtime = info.mtime.isoformat() if info.mtime is not None else None
        return {"uri": self.uri, "size": info.size, "mtime": mtime}


def _kind_of(path: str) -> str | None:
    lower = path.lower()
    if lower.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if lower.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    return None


def _resolve(location: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(location)
    except (pa.ArrowInvalid, ValueError):
        # A plain relative path: pyarrow wants absolute local paths.
        import os

        return pafs.LocalFileSystem(), os.path.abspath(location)


def list_sources(location: str, fmt: str = "auto") -> list[Source]:
    """The files making up the corpus at ``location``, in a stable order.

    ``fmt`` is ``auto``, ``beir`` (a directory holding ``corpus.jsonl[.gz]``), ``jsonl``
    or ``parquet`` (a file, or a directory of such files).
    """
    with reading(f"corpus {location}", CorpusError):  # e.g. a directory that cannot be listed
        return _list_sources(location, fmt)


def _list_sources(location: str, fmt: str) -> list[Source]:
    fs, path = _resolve(location)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise CorpusError(f"corpus: nothing at {location!r}; give a BEIR directory, a JSONL(.gz) or Parquet file, or a directory of them.")
    if info.type not in (pafs.FileType.File, pafs.FileType.Directory):
        raise CorpusError(f"corpus {location}: neither a file nor a directory (a socket, device or pipe); give the corpus file or its directory.")
    prefix = location if "://" in location else ""

    def source(p: str, kind: str) -> Source:
        uri = (prefix.split("://")[0] + "://" + p) if prefix else p
        return Source(fs, p, kind, uri)

    if info.type == pafs.FileType.File:
        kind = _kind_of(path) if fmt in ("auto", "beir") else fmt
        if kind is None:
            raise CorpusError(f"corpus: cannot tell the format of {location!r} from its name; pass --format jsonl or parquet.")
        return [source(path, kind)]

    if fmt in ("auto", "beir"):
        for name in ("corpus.jsonl", "corpus.jsonl.gz"):
            candidate = f"{path.rstrip('/')}/{name}"
            if fs.get_file_info(candidate).type == pafs.FileType.File:
                return [source(candidate, "jsonl")]
        top = sorted(f.base_name for f in fs.get_file_info(pafs.FileSelector(path)))
        if fmt == "beir" or any(n in _BEIR_MARKERS for n in top):
            # a BEIR directory without its corpus file: never index its queries as documents
            raise CorpusError(
                f"corpus: {location!r} is laid out as a BEIR directory but holds no corpus.jsonl or corpus.jsonl.gz "
                f"(found: {', '.join(top[:10]) or 'nothing'}); give the directory that holds the corpus, or the corpus file itself."
            )

    files = sorted(
        f.path for f in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if f.type == pafs.FileType.File
    )
    kinds = {p: _kind_of(p) for p in files}
    wanted = [p for p in files if kinds[p] is not None and (fmt == "auto" or kinds[p] == fmt)]
    if not wanted:
        raise CorpusError(f"corpus: no JSONL(.gz) or Parquet files under {location!r}.")
    found = {kinds[p] for p in wanted}
    if len(found) > 1:
        raise CorpusError(f"corpus: {location!r} mixes JSONL and Parquet files; pass --format to pick one.")
    return [source(p, kinds[p]) for p in wanted]  # type: ignore[arg-type]


def content_hash(title: str | None, text: str, metadata: str | None) -> str:
    """SHA-256 of a document's content; equal content gives equal hashes, whatever the id."""
    blob = json.dumps([title, text, metadata], ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if k in obj:
            return obj[k]
    return None


def validate_record(obj: Any, max_doc_bytes: int) -> tuple[dict[str, Any], str | None, str | None]:
    """Check one decoded record; returns (fields, reject reason or None, detail)."""
    empty = {"doc_id": None, "title": None, "text": None, "metadata": None}
    if not isinstance(obj, dict):
        return empty, "malformed_json", f"expected a JSON object, got {type(obj).__name__}"
    doc_id = _first(obj, ID_KEYS)
    if isinstance(doc_id, bool) or (doc_id is not None and not isinstance(doc_id, (str, int))):
        return empty, "bad_field_type", f"id must be a string, got {type(doc_id).__name__}"
    doc_id = None if doc_id is None else str(doc_id)
    fields = dict(empty, doc_id=doc_id or None)
    if not doc_id or not doc_id.strip():
        return fields, "missing_id", f"none of {list(ID_KEYS)} holds a non-empty id"
    if doc_id != doc_id.strip() or any(unicodedata.category(c) == "Cc" for c in doc_id):
        # ids are stored exactly as given; one that differs from another only by surrounding
        # whitespace, or holds a tab or newline, is almost surely a mistake (and no TSV or
        # TREC file can carry it), so it is refused rather than silently changed
        return fields, "bad_id", f"id {doc_id!r} has surrounding whitespace or a control character (tab, newline)"
    title, text, metadata = obj.get("title"), _first(obj, TEXT_KEYS), obj.get("metadata")
    if title is not None and not isinstance(title, str):
        return fields, "bad_field_type", f"title must be a string, got {type(title).__name__}"
    if text is not None and not isinstance(text, str):
        return fields, "bad_field_type", f"text must be a string, got {type(text).__name__}"
    if not text or not text.strip():
        return fields, "empty_text", f"none of {list(TEXT_KEYS)} holds non-blank text"
    if metadata is not None and not isinstance(metadata, str):
        metadata = json.dumps(metadata, ensure_ascii=False, sort_keys=True)
    size = len(text.encode("utf-8")) + len((title or "").encode("utf-8"))
    if size > max_doc_bytes:
        return fields, "oversized", f"{size} bytes of title+text > max_doc_bytes={max_doc_bytes}"
    return {"doc_id": doc_id, "title": title or None, "text": text, "metadata": metadata}, None, None


class _Batcher:
    """Accumulates parsed rows and emits PARSED tables of ``size`` rows."""

    def __init__(self, uri: str, size: int):
        self.uri, self.size = uri, size
        self.cols: dict[str, list[Any]] = {name: [] for name in PARSED.names}

    def add(self, location: int, fields: dict[str, Any], reason: str | None, detail: str | None) -> None:
        c = self.cols
        for k in ("doc_id", "title", "text", "metadata"):
            c[k].append(fields[k])
        c["content_hash"].append(
            None if reason else content_hash(fields["title"], fields["text"], fields["metadata"])
        )
        c["_source"].append(self.uri)
        c["_location"].append(location)
        c["_reason"].append(reason)
        c["_detail"].append(detail)

    def __len__(self) -> int:
        return len(self.cols["_location"])

    def flush(self) -> pa.Table:
        table = pa.Table.from_pydict(self.cols, schema=PARSED)
        self.cols = {name: [] for name in PARSED.names}
        return table


def _lines(stream, max_line: int, chunk: int = 1 << 20) -> Iterator[bytes | None]:
    """Lines of a binary stream without their newline; ``None`` for a line over ``max_line``
    bytes, whose bytes are skipped, never held."""
    buf = b""
    skipping = False
    while True:
        data = stream.read(chunk)
        if not data:
            break
        buf += data
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl], buf[nl + 1 :]
            if skipping:
                skipping = False
                yield None
            elif len(line) > max_line:
                yield None
            else:
                yield line
        if len(buf) > max_line:
            buf, skipping = b"", True
    if skipping:
        yield None
    elif buf:
        yield buf


def _read_jsonl(src: Source, batch_rows: int, max_doc_bytes: int) -> Iterator[pa.Table]:
    # A JSON line may escape every character (6 bytes for one); past this we do not parse.
    max_line = 6 * max_doc_bytes + (1 << 16)
    batch = _Batcher(src.uri, batch_rows)
    with src.filesystem.open_input_stream(src.path, compression="detect") as stream:
        for line_no, raw in enumerate(_lines(stream, max_line), 1):
            if raw is None:
                batch.add(line_no, _blank(), "oversized", f"line longer than {max_line} bytes")
            elif not raw.strip():
                continue  # blank lines are layout, not records
            else:
                batch.add(line_no, *_parse_line(raw, max_doc_bytes))
            if len(batch) >= batch_rows:
                yield batch.flush()
    if len(batch):
        yield batch.flush()


def _blank() -> dict[str, Any]:
    return {"doc_id": None, "title": None, "text": None, "metadata": None}


def _parse_line(raw: bytes, max_doc_bytes: int) -> tuple[dict[str, Any], str | None, str | None]:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _blank(), "invalid_utf8", str(exc)
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return _blank(), "malformed_json", str(exc)
    return validate_record(obj, max_doc_bytes)


def _read_parquet(src: Source, batch_rows: int, max_doc_bytes: int) -> Iterator[pa.Table]:
    batch = _Batcher(src.uri, batch_rows)
    with src.filesystem.open_input_file(src.path) as f:
        pf = pq.ParquetFile(f, page_checksum_verification=True)  # a page whose CRC the writer stored is checked
        row = 0
        for record_batch in pf.iter_batches(batch_size=batch_rows):
            for rec in record_batch.to_pylist():
                rec = _decode_binary(rec)
                if isinstance(rec, tuple):  # (reason, detail)
                    batch.add(row, _blank(), *rec)
                else:
                    batch.add(row, *validate_record(rec, max_doc_bytes))
                row += 1
                if len(batch) >= batch_rows:
                    yield batch.flush()
    if len(batch):
        yield batch.flush()


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


def read_source(src: Source, batch_rows: int = 1024, max_doc_bytes: int = 1 << 20) -> Iterator[pa.Table]:
    """Stream one source as PARSED tables of at most ``batch_rows`` rows.

    Raises :class:`SourceError` (after the batches read before the fault) when the file
    cannot be read to its end."""
    if batch_rows < 1:
        raise ValueError("batch_rows must be >= 1")
    reader = _read_jsonl if src.kind == "jsonl" else _read_parquet
    rows = 0
    with _source_faults(src, lambda: rows):
        for table in reader(src, batch_rows, max_doc_bytes):
            rows += table.num_rows
            yield table


def check_sources(sources: list[Source]) -> None:
    """Open every source and read its first bytes (a Parquet file: its footer), so that a
    file that cannot be read at all, is not compressed as its name says, or is not text is
    refused before any work starts. Raises :class:`SourceError`."""
    for src in sources:
        with _source_faults(src, lambda: 0):
            if src.kind == "parquet":
                with src.filesystem.open_input_file(src.path) as f:
                    _ = pq.ParquetFile(f).metadata
                continue
            with src.filesystem.open_input_stream(src.path, compression="detect") as stream:
                head = stream.read(_HEAD_BYTES)
            if not_text(head):
                raise SourceError(f"corpus file {src.uri}: not UTF-8 text (it holds NUL bytes: a binary file, or UTF-16/32 text); "
                                  "a JSONL corpus is UTF-8 text, one JSON object per line.")


def source_fault(src: Source, error: SourceError) -> pa.Table:
    """The one PARSED row a reader running in a Ray task sends in place of a failed file:
    ``_reason`` :data:`UNREADABLE`, ``_detail`` the refusal. The job's writer raises it."""
    row = {**_blank(), "content_hash": None, "_source": src.uri, "_location": -1, "_reason": UNREADABLE, "_detail": str(error)}
    return pa.Table.from_pylist([row], schema=PARSED)


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
