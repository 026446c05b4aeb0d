"""Small file helpers used everywhere: content digests, atomic writes, read faults in words, and
the one JSON Lines and YAML readers."""

from __future__ import annotations

import contextlib
import errno
import functools
import gzip
import hashlib
import io
import json
import os
import tempfile
import zlib
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from logicrank.schemas.errors import UserError, first_line


def utf8_text(value: str) -> bool:
    """Whether ``value`` is text UTF-8 can hold: JSON may escape half of a surrogate pair
    (``"\\ud800"``), which Python decodes to a string that is no character."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def sha256_file(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary name beside ``path``; on success rename it to ``path``, so readers
    never see half a file; on failure remove it. The file's bytes reach the disk before the
    rename, and the rename before the return (fsync of the file, then of its directory), so
    a machine that loses power after a write returns holds the whole file, not an empty one
    under its name. A directory it makes for the file is synced into its parent too."""
    path = Path(path)
    make_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb") as f:
                try:
                    os.fsync(f.fileno())
                except OSError as exc:  # a file system that cannot sync (some FUSE and object-store mounts) says so; any other failure is the write's
                    if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
                        raise
        tmp.replace(path)
        _sync_directory(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def make_dirs(path: str | Path) -> None:
    """Directory ``path``, with its missing parents, made as ``mkdir -p`` does; each one made
    is synced into its parent, so a file renamed into a new directory is not lost with the
    directory's entry when the machine loses power."""
    path, missing = Path(path), []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for made in reversed(missing):
        made.mkdir(exist_ok=True)  # (another process may make it meanwhile; a file of that name is refused)
        _sync_directory(made.parent)


def _sync_directory(path: Path) -> None:
    """A rename in ``path`` to the disk, where the system can sync a directory (not on every one)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# What reading a file can raise when the file itself is at fault (cut off, corrupt, binary,
# unreadable); :func:`read_fault` says which in words. pyarrow's errors are OSError or
# ArrowInvalid; gzip's are OSError, EOFError and zlib.error. (Not every ArrowException: a
# type or conversion error is a bug in the reader, not a fault of the file.)
READ_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, UnicodeDecodeError, pa.ArrowInvalid)


def require_writable(path: str | Path, job: str, option: str, error: type[Exception] = UserError) -> None:
    """Refuse, in one line, an output directory this process cannot write, before a job does
    any work: ``path`` itself or, where it does not exist yet, its nearest existing parent
    must be a directory in which a probe file can be made. The probe is removed at once and
    no directory is made, so a refusal leaves nothing behind. Checked by trying, not by
    permission bits (root ignores them; a read-only mount does not show in them). A URI
    (``s3://...``) is not checked here: its store says at the first write."""
    if "://" in str(path):
        return
    target = Path(path)
    where = target
    while not where.exists() and not where.is_symlink() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        why = "is a file, not a directory" if where == target else f"cannot be made: {where} is a file, not a directory"
        raise error(f"{job}: {option} {target} {why}; give {option} a directory this user can write.")
    try:
        fd, probe = tempfile.mkstemp(prefix=".logicrank-probe-", dir=where)
    except OSError as exc:
        inside = "" if where == target else f" (in {where}, where it would be made)"
        raise error(f"{job}: {option} {target} cannot be written{inside}: {(exc.strerror or first_line(exc)).lower()}; "
                    f"give {option} a directory this user can write.") from None
    os.close(fd)
    os.unlink(probe)


def write_parquet_atomic(table: pa.Table, path: str | Path) -> Path:
    """Write to a temporary name beside ``path``, then rename: readers never see half a file."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return Path(path)


def write_text_atomic(text: str, path: str | Path) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def read_fault(exc: BaseException) -> str:
    """Why a file could not be read, in a few words and with the fix, for a one-line refusal."""
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text (a binary file, or text in another encoding); give the file as UTF-8 text"
    first = first_line(exc)
    low = first.lower()
    if isinstance(exc, EOFError) or "truncated" in low or "end-of-stream" in low or "unexpected end" in low:
        return "the compressed data ends early: the file is truncated (an interrupted download or copy?); fetch or write it again"
    if isinstance(exc, zlib.error) or "inflate" in low or "crc check" in low or "not a gzipped file" in low or "compressed data" in low or "codec" in low:
        return f"corrupt compressed data ({first}); fetch or write the file again"
    if "checksum" in low:
        return f"corrupt data ({first}); fetch or write the file again"
    if "parquet magic bytes" in low or "parquet file size is 0" in low:
        return "not a Parquet file, or its footer is damaged; give a whole Parquet file"
    if isinstance(exc, IsADirectoryError):
        return "a directory, not a file"
    if isinstance(exc, PermissionError):
        return "permission denied; make the file readable by this user"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot be read ({exc.strerror})"
    return f"cannot be read ({first})"


@contextmanager
def reading(label: str | Callable[[], str], error: type[Exception]) -> Iterator[None]:
    """Inside the block, a fault of the file being read (:data:`READ_ERRORS`) becomes
    ``error("<label>: <why>.")``: one line for the user, never a traceback. ``label`` names
    the file ("queries data/q.jsonl"), or is called at the fault to say how far it got. An
    error the block raises itself (a :class:`~logicrank.schemas.errors.UserError`) passes unchanged."""
    try:
        yield
    except UserError:
        raise
    except READ_ERRORS as exc:
        raise error(f"{label() if callable(label) else label}: {read_fault(exc)}.") from exc


def read_jsonl(path: str | Path, what: str, error: type[Exception], expect: str = "",
               hint: Callable[[str], str] | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each JSON object line of a JSON Lines file, in order; blank lines
    are skipped, a byte order mark starting the file is dropped, gzip data (told by its first
    bytes, whatever the name) is gunzipped. A line that is not a JSON object is ``error("<what> <path>: line <n> is not a JSON
    object[ <expect>] (<why>)[<hint(line)>].")``; a fault of the file itself is
    ``error("<what> <path>: <why>.")`` (:func:`reading`). Streams: one line is held at a time."""
    label = f"{what} {Path(path)}"
    with reading(label, error), open_text(path) as f:
        yield from jsonl_objects(f, label, error, expect, hint)


def jsonl_objects(lines: Iterable[str], label: str, error: type[Exception], expect: str = "",
                  hint: Callable[[str], str] | None = None) -> Iterator[tuple[int, dict]]:
    """:func:`read_jsonl` over lines already open (``label`` names their file in an error)."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            why = f"{exc.msg} at column {exc.pos + 1}"
        else:
            if isinstance(obj, dict):
                yield n, obj
                continue
            why = f"found {_JSON_KINDS.get(type(obj), 'a JSON value')}"
        expected = f" {expect}" if expect else ""
        raise error(f"{label}: line {n} is not a JSON object{expected} ({why}){hint(line) if hint else ''}.")


@contextmanager
def open_text(path: str | Path) -> Iterator[io.TextIOWrapper]:
    """A UTF-8 text file to read, gunzipped where its first bytes are gzip's (whatever its name),
    a byte order mark starting it dropped. Opened once, its first bytes peeked, not read: a
    pipe (``<(zcat qrels.gz)``) read through it loses none of them (a reader that opens its
    file twice, or seeks, still needs a regular file)."""
    with open(path, "rb") as raw:
        gzipped = raw.peek(2)[:2] == b"\x1f\x8b"  # (gzip writes its 10-byte header at once)
        with gzip.GzipFile(fileobj=raw) if gzipped else contextlib.nullcontext(raw) as binary, \
                io.TextIOWrapper(binary, encoding="utf-8-sig") as text:
            yield text


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false", type(None): "null"}


def load_yaml(text: str) -> Any:
    """``text`` as YAML (PyYAML's safe loader), a number written as no one writes a count kept as
    the text it is: PyYAML follows YAML 1.1, where ``010`` is 8 (octal), ``1_000`` is 1000 and
    ``12:30`` is 750 (base 60), so a query id ``010`` became ``8`` and ``orlog.k=010`` was 8.
    Here a number is only a form YAML 1.1 and 1.2 both read as one (``10``, ``-3``, ``0x1F``,
    ``1.5``, ``-2.5e+3``, ``.inf``); ``010``, ``1_000`` and ``12:30`` are strings (an integer
    option still reads ``"010"`` as 10). Every plain number here is one to PyYAML too, so what
    ``yaml.safe_dump`` writes reads back the same. A key given twice in one mapping, which PyYAML
    resolves by keeping the last, is a :class:`yaml.YAMLError` (a key a merge ``<<`` brings in
    may be given again), as is text that is not YAML."""
    import yaml

    return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 (a SafeLoader, its number forms narrowed)


@functools.cache
def _yaml_loader() -> type:
    import re

    import yaml

    def flatten_mapping(self, node):
        # each mapping's own keys, checked once, before any merge: flattening a mapping that merges
        # another flattens that one too, and then its value holds the keys it merged beside its own
        checked = self.__dict__.setdefault("_checked", set())
        if id(node) not in checked:
            checked.add(id(node))  # (the nodes live as long as the loader)
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                # a plain = key, which PyYAML's flatten makes the string "=" (not yet made here)
                key = key_node.value if key_node.tag == "tag:yaml.org,2002:value" else self.construct_object(key_node, deep=True)
                if isinstance(key, Hashable):
                    if key in seen:
                        raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice in one mapping",
                                                                key_node.start_mark)
                    seen.add(key)
        yaml.SafeLoader.flatten_mapping(self, node)

    numbers = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    loader = type("YAMLNumbersBothRead", (yaml.SafeLoader,), {"flatten_mapping": flatten_mapping})
    loader.yaml_implicit_resolvers = {first: [(tag, rx) for tag, rx in rules if tag not in numbers]
                                      for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    loader.add_implicit_resolver(numbers[0], re.compile(r"^[-+]?(?:0|[1-9][0-9]*|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
    loader.add_implicit_resolver(numbers[1], re.compile(
        r"^(?:[-+]?(?:0|[1-9][0-9]*)\.[0-9]*(?:[eE][-+][0-9]+)?|\.[0-9]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."))
    return loader


def read_yaml(path: str | Path, what: str, error: type[Exception]) -> Any:
    """A YAML file's content (UTF-8). An unreadable file is ``error("<what> <path>: <strerror>")``,
    text that is not UTF-8 ``error("<what> <path>: <why>")`` (:func:`read_fault`), bad YAML
    ``error("<what> <path>: not valid YAML: <the parser's message on one line>")``."""
    import yaml

    try:
        return load_yaml(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path}: {read_fault(exc)}") from None
    except yaml.YAMLError as exc:
        raise error(f"{what} {path}: not valid YAML: {' '.join(str(exc).split())}") from None


def not_text(head: bytes) -> bool:
    """True when the first bytes of a file say it is not UTF-8 text: a NUL byte (binary
    data, or UTF-16/32 text) appears. A single bad line is left to the row readers."""
    return b"\x00" in head
