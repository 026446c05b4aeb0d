"""Unreadable input through the command line: one line naming the file and the fault, exit 2,
nothing written. These refusals come before Ray starts or a table is opened; the index job's
faults found part-way through a file are in tests/integration/test_unreadable_corpus.py."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from logicrank.pipelines.datasets import scifact
from logicrank.pipelines.files import read_fault
from tests import faults
from tests.conftest import scifact_docs

runner = CliRunner()
QUERIES = Path(scifact().queries).read_bytes()
QRELS = Path(scifact().qrels).read_bytes()
TREC_RUN = "".join(f"1 Q0 d{i} {i + 1} {10 - i * 0.1:.2f} t\n" for i in range(50)).encode()


def _refused(args: list[str], *expected: str) -> str:
    from logicrank.cli import app

    res = runner.invoke(app, args)
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


TRUNCATED = "the file is truncated"
CORRUPT = "corrupt compressed data"
NOT_TEXT = "not UTF-8 text"
CANNOT_OPEN = "cannot be read (No such device or address)"


def _faulty(kind: str, tmp: Path, data: bytes, name: str) -> tuple[Path, str]:
    """A damaged copy of ``data`` and the words its refusal must hold."""
    if kind == "truncated":
        return faults.truncated_gzip(tmp / f"{name}.gz", data), TRUNCATED
    if kind == "corrupt":
        return faults.corrupt_gzip(tmp / f"{name}.gz", data), CORRUPT
    if kind == "binary":
        return faults.binary(tmp / name), NOT_TEXT
    return faults.unopenable(tmp / name), CANNOT_OPEN


KINDS = ["truncated", "corrupt", "binary", "unopenable"]


@pytest.mark.parametrize("kind", [*KINDS, "parquet"])
def test_retrieve_refuses_an_unreadable_queries_file(tmp_path, kind):
    if kind == "parquet":
        path, words = faults.corrupt_parquet_footer(tmp_path / "q.parquet", [{"_id": "1", "text": "q"}]), "not a Parquet file"
    else:
        path, words = _faulty(kind, tmp_path, QUERIES, "q.jsonl")
    _refused(["retrieve", str(path), "--db", str(tmp_path / "db"), "--method", "bm25", "--out", str(tmp_path / "out")],
             f"queries {path}: ", words)
    assert not (tmp_path / "out" / "runs").exists() and not (tmp_path / "db").exists()


def test_decompose_refuses_an_unreadable_queries_file(tmp_path):
    path = faults.truncated_gzip(tmp_path / "q.jsonl.gz", QUERIES)
    _refused(["decompose", str(path), "--out", str(tmp_path / "out")], f"queries {path}: ", TRUNCATED)
    assert not (tmp_path / "out" / "decompositions.parquet").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_evaluate_refuses_an_unreadable_qrels_file(tmp_path, kind):
    run = tmp_path / "run.txt"
    run.write_bytes(TREC_RUN)
    path, words = _faulty(kind, tmp_path, QRELS, "qrels.tsv")
    _refused(["evaluate", str(path), str(run), "--out", str(tmp_path / "out")], f"qrels {path}: ", words)
    assert not (tmp_path / "out" / "metrics.parquet").exists()


@pytest.mark.parametrize("kind", [*KINDS, "parquet", "directory"])
def test_evaluate_refuses_an_unreadable_run_file(tmp_path, kind):
    qrels = tmp_path / "qrels.tsv"
    qrels.write_bytes(QRELS)
    if kind == "parquet":
        path, words = faults.corrupt_parquet_footer(tmp_path / "run.parquet", [{"query_id": "1"}]), "not a Parquet file"
    elif kind == "directory":
        path, words = tmp_path / "run.parquet", "a directory, not a file"
        path.mkdir()
    else:
        path, words = _faulty(kind, tmp_path, TREC_RUN, "run.txt")
    _refused(["evaluate", str(qrels), str(path), "--out", str(tmp_path / "out")], f"run {path}: ", words)
    assert not (tmp_path / "out" / "metrics.parquet").exists()


def test_evaluate_refuses_unreadable_answers_and_gold_answers(tmp_path):
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"query_id": "q1", "answer": "x"}) + "\n")
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"query_id": "q1", "answers": ["x"]}) + "\n")
    bad_gold, bad_answers = faults.binary(tmp_path / "bad-gold.jsonl"), faults.binary(tmp_path / "bad-answers.jsonl")
    _refused(["evaluate", "--answers", str(answers), "--gold", str(bad_gold), "--out", str(tmp_path / "out")],
             f"gold answers {bad_gold}: ", NOT_TEXT)
    _refused(["evaluate", "--answers", str(bad_answers), "--gold", str(gold), "--out", str(tmp_path / "out")],
             f"answers {bad_answers}: ", NOT_TEXT)
    assert not (tmp_path / "out" / "metrics.parquet").exists()


CORPUS = "\n".join(json.dumps(d) for d in scifact_docs(200)).encode()


@pytest.mark.parametrize("kind", ["truncated-head", "not-gzip", "gzip-unnamed", "parquet-footer", "binary", "utf16", "unopenable"])
def test_index_refuses_a_corpus_file_it_cannot_open_before_anything_starts(tmp_path, kind):
    """Faults seen in a file's first bytes: refused before Ray starts, no table created."""
    if kind == "truncated-head":  # cut inside its first 64 KiB: the check reads that far
        path, words = faults.truncated_gzip(tmp_path / "c.jsonl.gz", CORPUS, keep=0.1), TRUNCATED
    elif kind == "not-gzip":
        path, words = tmp_path / "c.jsonl.gz", CORRUPT
        path.write_bytes(CORPUS)
    elif kind == "gzip-unnamed":  # (compression is told by the name)
        path, words = tmp_path / "c.jsonl", "gzip data under a name without .gz; name the file c.jsonl.gz"
        path.write_bytes(gzip.compress(CORPUS))
    elif kind == "parquet-footer":
        path, words = faults.corrupt_parquet_footer(tmp_path / "c.parquet", scifact_docs(20)), "not a Parquet file, or its footer is damaged"
    elif kind == "binary":
        path, words = faults.binary(tmp_path / "c.jsonl"), "not UTF-8 text (it holds NUL bytes"
    elif kind == "utf16":
        path, words = tmp_path / "c.jsonl", "not UTF-8 text (it holds NUL bytes"
        path.write_bytes(CORPUS.decode().encode("utf-16"))
    else:
        path, words = faults.unopenable(tmp_path / "c.jsonl"), "neither a file nor a directory"
    _refused(["index", str(path), "--db", str(tmp_path / "db"), "--out", str(tmp_path / "run")], words, str(path))
    assert not (tmp_path / "db").exists() or not any((tmp_path / "db").glob("*.lance"))


def test_permission_denied_is_named():
    """A file this user may not read (as root no permission bit denies a read, so the command-line
    cases above use a socket, which nobody can open); the words come from the same function."""
    assert read_fault(PermissionError(13, "Permission denied")) == "permission denied; make the file readable by this user"
    if os.geteuid() != 0:
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
            os.chmod(f.name, 0)
            _refused(["retrieve", f.name, "--db", "unused", "--method", "bm25"], "permission denied")
