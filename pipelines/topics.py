"""Queries, qrels and runs: readers and writers for the formats users bring.

- queries: BEIR ``queries.jsonl`` (``_id``, ``text``), JSONL with ``query_id``/``qid``, or Parquet;
- qrels: BEIR TSV (``query-id corpus-id score`` with a header) or TREC (``qid 0 docno rel``);
- runs: our Parquet run table, or a TREC run file (``qid Q0 docno rank score tag``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.tables import QRELS, QUERIES, RUN, conform

_QID_KEYS = ("query_id", "_id", "qid", "id")
_QTEXT_KEYS = ("text", "query", "title")


class TopicsError(ValueError):
    """A queries, qrels or run file cannot be read."""


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def read_queries(path: str | Path) -> pa.Table:
    """Queries table (QUERIES). Rejects unreadable lines loudly: a query set must be whole."""
    path = Path(path)
    if path.is_dir():
        path = path / "queries.jsonl"
    if not path.exists():
        raise TopicsError(f"queries: no file at {str(path)!r}.")
    if path.suffix in (".parquet", ".pq"):
        table = pq.read_table(path)
        if "query_id" not in table.column_names:
            for alt in _QID_KEYS[1:]:
                if alt in table.column_names:
                    table = table.rename_columns(["query_id" if c == alt else c for c in table.column_names])
                    break
        if "logical_query" not in table.column_names:
            table = table.append_column("logical_query", pa.nulls(table.num_rows, pa.string()))
        return conform(table, QUERIES, f"queries {path.name}")
    rows = []
    with _open_text(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                qid = next(obj[k] for k in _QID_KEYS if k in obj)
                text = next(obj[k] for k in _QTEXT_KEYS if k in obj)
            except (json.JSONDecodeError, StopIteration, TypeError) as exc:
                raise TopicsError(
                    f"queries {path}: line {n} is not a JSON object with an id ({list(_QID_KEYS)}) and a text ({list(_QTEXT_KEYS)})."
                ) from exc
            rows.append({"query_id": str(qid), "text": str(text), "logical_query": obj.get("logical_query")})
    ids = [r["query_id"] for r in rows]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise TopicsError(f"queries {path}: duplicate query ids {dup}.")
    return pa.Table.from_pylist(rows, schema=QUERIES)


def read_qrels(path: str | Path) -> pa.Table:
    """Qrels table (QRELS) from BEIR TSV or TREC qrels; a BEIR dir means its qrels/test.tsv."""
    path = Path(path)
    if path.is_dir():
        path = path / "qrels" / "test.tsv"
    if not path.exists():
        raise TopicsError(f"qrels: no file at {str(path)!r}.")
    qids, dids, rels = [], [], []
    with _open_text(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if n == 1 and parts[0].lower() in ("query-id", "query_id", "qid"):
                continue  # BEIR header
            if len(parts) == 3:
                q, d, r = parts
            elif len(parts) == 4:
                q, _, d, r = parts
            else:
                raise TopicsError(f"qrels {path}: line {n} has {len(parts)} fields; expected 3 (BEIR) or 4 (TREC).")
            try:
                rel = int(float(r))
            except ValueError as exc:
                raise TopicsError(f"qrels {path}: line {n}: relevance {r!r} is not a number.") from exc
            qids.append(q), dids.append(d), rels.append(rel)
    return pa.table({"query_id": qids, "doc_id": dids, "relevance": pa.array(rels, pa.int32())}, schema=QRELS)


def read_run(path: str | Path) -> pa.Table:
    """A run table (RUN) from Parquet or a TREC run file (run_id = the file's tag column)."""
    path = Path(path)
    if not path.exists():
        raise TopicsError(f"run: no file at {str(path)!r}.")
    if path.suffix in (".parquet", ".pq"):
        return conform(pq.read_table(path), RUN, f"run {path.name}")
    cols: dict[str, list] = {name: [] for name in RUN.names}
    with _open_text(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise TopicsError(f"run {path}: line {n} has {len(parts)} fields; a TREC run line has 6.")
            q, _, d, rank, score, tag = parts
            for k, v in zip(RUN.names, (q, d, int(rank), float(score), "trec", tag), strict=True):
                cols[k].append(v)
    return pa.table(cols, schema=RUN)


def write_trec_run(run: pa.Table, path: str | Path) -> Path:
    """Write a run table as a TREC run file (sorted by query, then rank)."""
    path = Path(path)
    df = conform(run, RUN, "write_trec_run").to_pandas().sort_values(["query_id", "rank"], kind="stable")
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in df.itertuples(index=False):
            f.write(f"{r.query_id} Q0 {r.doc_id} {r.rank} {r.score:.6f} {r.run_id}\n")
    tmp.replace(path)
    return path
