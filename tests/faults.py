"""Files damaged the ways real files are: cut off, corrupt, binary, or impossible to open.

Each helper writes one damaged file and returns its path. Nothing here is random: the
same call writes the same bytes.
"""

from __future__ import annotations

import gzip
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def truncated_gzip(path: Path, data: bytes, keep: float = 0.5) -> Path:
    """``data`` gzipped, cut after ``keep`` of its compressed bytes (an interrupted download)."""
    z = gzip.compress(data, mtime=0)
    path.write_bytes(z[: int(len(z) * keep)])
    return path


def corrupt_gzip(path: Path, data: bytes, at: float = 0.5) -> Path:
    """``data`` gzipped whole, with 64 bytes from ``at`` of its length inverted (its CRC no longer matches)."""
    z = bytearray(gzip.compress(data, mtime=0))
    mid = int(len(z) * at)
    z[mid : mid + 64] = bytes(b ^ 0xFF for b in z[mid : mid + 64])
    path.write_bytes(bytes(z))
    return path


def binary(path: Path, size: int = 20_000) -> Path:
    """Bytes that are not text (every byte value, NUL included), under a text file's name."""
    path.write_bytes(bytes(range(256)) * (size // 256))
    return path


def corrupt_parquet_footer(path: Path, rows: list[dict]) -> Path:
    """A Parquet file whose last 100 bytes (footer and magic) are overwritten."""
    pq.write_table(pa.Table.from_pylist(rows), path)
    b = path.read_bytes()
    path.write_bytes(b[:-100] + b"\x00" * 100)
    return path


def corrupt_parquet_row_group(path: Path, rows: list[dict], row_group_rows: int, bad_group: int, column: str = "text") -> Path:
    """A gzip-compressed Parquet file of ``row_group_rows``-row groups whose ``bad_group``-th
    group has its ``column`` pages damaged: the groups before it read, that one fails."""
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_rows, compression="gzip")
    meta = pq.ParquetFile(path).metadata.row_group(bad_group)
    chunk = next(meta.column(j) for j in range(meta.num_columns) if meta.column(j).path_in_schema == column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    b = bytearray(path.read_bytes())
    for i in range(start + 30, start + chunk.total_compressed_size - 10):  # past the page header: the compressed data
        b[i] ^= 0x5A
    path.write_bytes(bytes(b))
    return path


def unopenable(path: Path) -> Path:
    """A Unix socket where a file is expected: opening it for reading fails for every user,
    root included (ENXIO), which no permission bit can do for root."""
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
    return path


def processes(part: str) -> list:
    """This process's descendants (a local Ray cluster's workers and theirs) whose command line
    holds ``part``: e.g. ``VLLM::EngineCore``, the engine core vLLM runs in a child process, or
    ``_EngineActor``, a Ray engine actor. Nothing outside this test run is touched."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if part in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:  # gone meanwhile
            continue
    return out


def descendants() -> list[str]:
    """Every descendant's pid and command line (cut to 120 characters): what a test that found
    no process to kill saw instead."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            continue
    return out


def engine_cores() -> list:
    """vLLM's engine core processes of this run's engine actors (``engine_process: separate``),
    found by their parent, not their title: each is an engine actor's child started by
    multiprocessing's spawn, which names itself ``VLLM::EngineCore`` once it runs, and under a
    CPU quota was seen never to (its command line stayed the spawn bootstrap's for a whole job).
    The actor's other children (multiprocessing's resource tracker, compilers) are not cores."""
    import psutil

    out = []
    for actor in processes("_EngineActor"):
        try:
            children = actor.children()
        except psutil.Error:
            continue
        for child in children:
            try:
                cmd = " ".join(child.cmdline())
            except psutil.Error:
                continue
            if "VLLM::EngineCore" in cmd or "multiprocessing.spawn import spawn_main" in cmd:
                out.append(child)
    return out


def kill(found: list) -> int:
    """SIGKILL each process of ``found``; returns how many were killed."""
    import psutil

    killed = 0
    for p in found:
        try:
            p.kill()
            killed += 1
        except psutil.NoSuchProcess:
            pass
    return killed


def kill_processes(part: str) -> int:
    """SIGKILL the :func:`processes` holding ``part``; returns how many were killed."""
    return kill(processes(part))


def kill_engine_cores() -> int:
    """SIGKILL the :func:`engine_cores`; returns how many were killed."""
    return kill(engine_cores())
