"""A persistent cache of LLM outputs, shared by every process of a node.

Keys are SHA-256 of (model id, prompt template hash, rendered prompt, sampling
parameters), so a changed template, model or parameter is a miss, never a stale hit.
Values are JSON. SQLite in WAL mode with a busy timeout makes concurrent readers and
writers (Ray workers on one node) safe: an insert is one transaction and a duplicate
insert of the same key is ignored (the value is a function of the key).

Put the file on node-local disk: SQLite's locking is not reliable on network file
systems. On a cluster each node then has its own cache, which costs a recomputation per
node, never a wrong answer.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from logicrank.pipelines.paths import cache_root


def default_path() -> Path:
    return cache_root() / "llm" / "cache.sqlite"


def cache_key(model_id: str, template_sha: str, prompt: str, params: dict) -> str:
    blob = json.dumps([model_id, template_sha, prompt, params], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class LLMCache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=120, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS outputs (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    def get_many(self, keys: Sequence[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        for i in range(0, len(keys), 500):  # SQLite's bound-parameter limit
            chunk = list(keys[i : i + 500])
            marks = ",".join("?" * len(chunk))
            for key, value in self._db.execute(f"SELECT key, value FROM outputs WHERE key IN ({marks})", chunk):
                found[key] = json.loads(value)
        return found

    def put_many(self, items: Iterable[tuple[str, dict]]) -> None:
        rows = [(k, json.dumps(v, ensure_ascii=False)) for k, v in items]
        if not rows:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("INSERT OR IGNORE INTO outputs (key, value) VALUES (?, ?)", rows)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM outputs").fetchone()[0]

    def close(self) -> None:
        self._db.close()
