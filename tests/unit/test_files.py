"""The one JSON Lines reader and the one YAML reader (pipelines/files.py): records, and the
one-line message each fault gives."""

from __future__ import annotations

import gzip

import pytest

from logicrank.pipelines.files import read_jsonl, read_yaml
from logicrank.schemas.errors import UserError

BOM = b"\xef\xbb\xbf"


class ReadError(UserError):
    pass


def _write(path, data: bytes):
    path.write_bytes(gzip.compress(data) if ".gz" in path.name else data)
    return path


@pytest.mark.parametrize("name, data", [
    ("plain.jsonl", b'{"a": 1}\n{"a": 2}\n'),
    ("blank-lines.jsonl", b'\n{"a": 1}\n  \n\r\n{"a": 2}\n\n'),
    ("bom.jsonl", BOM + b'{"a": 1}\r\n{"a": 2}'),
    ("gzipped.jsonl.gz", BOM + b'{"a": 1}\n\n{"a": 2}\n'),
    ("gzipped-by-its-bytes.gz-but-named.jsonl", b'{"a": 1}\n{"a": 2}\n'),  # told by the magic bytes, not the name
])
def test_read_jsonl_yields_each_object_with_its_line(tmp_path, name, data):
    path = _write(tmp_path / name, data)
    got = list(read_jsonl(path, "things", ReadError))
    assert [obj for _, obj in got] == [{"a": 1}, {"a": 2}]
    assert [n for n, _ in got] == [i + 1 for i, line in enumerate(data.removeprefix(BOM).splitlines()) if line.strip()]


@pytest.mark.parametrize("name, data, expect, message", [
    ("bad.jsonl", b'{"a": 1}\n{"a": }\n', "", "line 2 is not a JSON object (Expecting value at column 7)."),
    ("array.jsonl", b'\n[1, 2]\n', "", "line 2 is not a JSON object (found an array)."),
    ("string.jsonl", b'"q1"\n', "with an id", "line 1 is not a JSON object with an id (found a string)."),
    ("null.jsonl.gz", b'{"a": 1}\nnull\n', "", "line 2 is not a JSON object (found null)."),
    ("bom-bad.jsonl", BOM + b"q1 text\n", "", "line 1 is not a JSON object (Expecting value at column 1)."),
    ("missing.jsonl", None, "", "cannot be read (No such file or directory)."),
    ("latin1.jsonl", b'{"a": "caf\xe9"}\n', "", "not UTF-8 text"),
    ("cut.jsonl.gz", None, "", "the compressed data ends early"),
])
def test_read_jsonl_refuses_in_one_line(tmp_path, name, data, expect, message):
    path = tmp_path / name
    if name == "cut.jsonl.gz":
        path.write_bytes(gzip.compress(b'{"a": 1}\n' * 1000)[:-20])
    elif data is not None:
        _write(path, data)
    with pytest.raises(ReadError) as exc:
        list(read_jsonl(path, "things", ReadError, expect))
    text = str(exc.value)
    assert text.startswith(f"things {path}: {message}") and "\n" not in text, text


def test_read_jsonl_hint_sees_the_bad_line(tmp_path):
    path = _write(tmp_path / "q.jsonl", b"q1\thello\n")
    hint = lambda line: " (a tab: name a TSV file .tsv)" if "\t" in line else ""  # noqa: E731
    with pytest.raises(ReadError) as exc:
        list(read_jsonl(path, "queries", ReadError, "with an id", hint))
    assert str(exc.value) == f"queries {path}: line 1 is not a JSON object with an id (Expecting value at column 1) (a tab: name a TSV file .tsv)."


def test_read_jsonl_streams_and_lets_the_caller_stop(tmp_path):
    path = _write(tmp_path / "a.jsonl", b'{"a": 1}\nnot json\n')
    assert next(read_jsonl(path, "things", ReadError)) == (1, {"a": 1})  # the bad line after it is never read


@pytest.mark.parametrize("data, want", [
    (b"a: 1\nb: [x, y]\n", {"a": 1, "b": ["x", "y"]}),
    (BOM + b"a: 1\n", {"a": 1}),
    (b"", None),
])
def test_read_yaml_reads(tmp_path, data, want):
    (tmp_path / "c.yaml").write_bytes(data)
    assert read_yaml(tmp_path / "c.yaml", "config", ReadError) == want


@pytest.mark.parametrize("name, data, message", [
    ("missing.yaml", None, "No such file or directory"),
    ("dir", "dir", "Is a directory"),
    ("bad.yaml", b"a: [1, 2\n", "not valid YAML: while parsing a flow sequence in \"<unicode string>\", line 1, column 4"),
    ("tabs.yaml", b"a:\n\tb: 1\n", "not valid YAML: while scanning"),
    ("latin1.yaml", b"a: caf\xe9\n", "not UTF-8 text"),
])
def test_read_yaml_refuses_in_one_line(tmp_path, name, data, message):
    path = tmp_path / name
    if data == "dir":
        path.mkdir()
    elif data is not None:
        path.write_bytes(data)
    with pytest.raises(ReadError) as exc:
        read_yaml(path, "config", ReadError)
    text = str(exc.value)
    assert text.startswith(f"config {path}: {message}") and "\n" not in text, text


def test_an_atomic_write_reaches_the_disk_before_its_rename_and_the_rename_before_it_returns(tmp_path, monkeypatch):
    """A machine that loses power after a write returned must hold the whole file under its
    name, not an empty one: the file is synced before the rename, its directory after, and a
    directory made for it into its own parent."""
    import os
    from pathlib import Path

    from logicrank.pipelines.files import atomic_path

    events = []
    real_fsync, real_replace = os.fsync, Path.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(self, target):
        events.append(("rename", str(target)))
        return real_replace(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "replace", replace)
    target = tmp_path / "out" / "table.parquet"
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"rows")
        written = str(tmp)
    # out/ is made for it: its entry synced in tmp_path first
    assert events == [("fsync", str(tmp_path)), ("fsync", written), ("rename", str(target)), ("fsync", str(target.parent))]
    assert target.read_bytes() == b"rows" and not Path(written).exists()
    events.clear()
    deep = tmp_path / "out" / "a" / "b" / "runs.parquet"  # two directories made, each synced into its parent
    with atomic_path(deep) as tmp:
        tmp.write_bytes(b"rows")
    assert [e for e in events if e[0] == "fsync"][:2] == [("fsync", str(tmp_path / "out")), ("fsync", str(tmp_path / "out" / "a"))]
    assert deep.read_bytes() == b"rows"
    (tmp_path / "out" / "a" / "b" / "runs.parquet").unlink()
    for d in (tmp_path / "out" / "a" / "b", tmp_path / "out" / "a"):
        d.rmdir()
    events.clear()
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "out" / "failed.parquet") as tmp:  # a failed write: nothing synced, nothing left
        tmp.write_bytes(b"half")
        raise RuntimeError("the writer failed")
    assert events == [] and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["table.parquet"]


def test_a_file_system_that_cannot_sync_still_takes_the_write_and_a_failed_sync_fails_it(tmp_path, monkeypatch):
    import errno
    import os

    from logicrank.pipelines.files import atomic_path

    def cannot(fd):
        raise OSError(errno.EINVAL, "Invalid argument")  # a mount without fsync

    monkeypatch.setattr(os, "fsync", cannot)
    with atomic_path(tmp_path / "a.txt") as tmp:
        tmp.write_text("rows")
    assert (tmp_path / "a.txt").read_text() == "rows"

    def failed(fd):
        raise OSError(errno.EIO, "Input/output error")  # the disk did not take the bytes

    monkeypatch.setattr(os, "fsync", failed)
    with pytest.raises(OSError, match="Input/output error"), atomic_path(tmp_path / "b.txt") as tmp:
        tmp.write_text("rows")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
