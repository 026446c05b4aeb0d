"""Shared test helpers: small real corpora cut from bundled SciFact."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from logicrank.jobs.raysession import quiet_logs
from logicrank.pipelines.datasets import scifact

# The test process is a driver like the command line's: Ray's quiet defaults are set before any
# test imports Ray (some are read once, when Ray is imported).
quiet_logs()


def pytest_sessionstart(session):
    """The code under test is this checkout's: the installed package maps logicrank.pipelines to
    the folders of the checkout `make venv` installed, and a test run from another checkout
    (a worktree, a copy) would mix its logicrank/ with that one's pipelines/."""
    import logicrank.pipelines

    here, used = Path(__file__).resolve().parents[1], Path(logicrank.pipelines.__file__).resolve().parents[1]
    if here != used:
        raise pytest.UsageError(f"logicrank.pipelines is imported from {used}, not this checkout ({here}); run `make venv` here first.")


def scifact_docs(n: int, text_chars: int = 300) -> list[dict]:
    """The first ``n`` SciFact documents, abstracts cut to ``text_chars`` (fast to embed)."""
    out = []
    with gzip.open(scifact().corpus, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            out.append({"_id": d["_id"], "title": d["title"], "text": d["text"][:text_chars]})
            if len(out) == n:
                break
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


@pytest.fixture(scope="session")
def docs300() -> list[dict]:
    return scifact_docs(300)
