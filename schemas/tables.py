"""Arrow schemas of the tables that cross modules: the contracts of logicrank.

The rule for where a table's contract lives:

- here, every table one part of logicrank writes and another reads: the corpus and the
  document table, queries, runs, qrels, decompositions, truth scores, metrics, significance,
  the query columns a stage adds for the stages after it;
- with its stage, a side table that stage alone writes and nothing in logicrank reads back
  (users do): the stage declares it (``side_tables``) and its method module holds the schema
  (``TERM_SCORES`` in pipelines/retrieval/methods/itlr.py, ``PREDICATE_SCORES`` in pipelines/retrieval/methods/orlog.py);
- beside its code, a checkpoint or a batch inside one module (a stage's finished shards, a
  job's resumable files, the corpus reader's parsed batches).

One name for one thing: a column called ``doc_id`` is the same string everywhere. Each stage
states which tables it reads and writes and checks its input with :func:`require_columns`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from logicrank.schemas.errors import UserError

# corpus: what a reader yields for a valid document.
CORPUS = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("text", pa.string(), nullable=False),
        pa.field("metadata", pa.string()),  # JSON text
    ]
)

# rejects: a row that could not become a corpus row, and why.
REJECTS = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),  # file path or URI
        pa.field("location", pa.int64(), nullable=False),  # 1-based line (JSONL, TSV; TREC: of the <DOC> tag) or 0-based row (Parquet)
        pa.field("doc_id", pa.string()),  # when one could be read
        pa.field("reason", pa.string(), nullable=False),  # one of REJECT_REASONS
        pa.field("detail", pa.string()),
    ]
)

REJECT_REASONS = (
    "malformed_json",
    "invalid_utf8",
    "missing_id",
    "bad_id",
    "empty_text",
    "oversized",
    "duplicate_id",
    "bad_field_type",
    "unclosed_doc",  # TREC: a <DOC> that no </DOC> closes before the next <DOC> or the end of the file
    "outside_doc",  # TREC: non-blank text between DOCs (one reject per stretch)
    "bad_tsv_row",  # TSV: a line that is not exactly id<TAB>text
    "missing_vector",  # --vector-column: the row has no vector (field absent or null)
    "bad_vector",  # --vector-column: not a list of numbers, a number not finite in float32, or all zeros
    "vector_dim",  # --vector-column: a vector of another dimension than the table's
)


def docs_schema(dim: int) -> pa.Schema:
    """docs (LanceDB): corpus columns + content hash, embedding and index time."""
    return pa.schema(
        list(CORPUS)
        + [
            pa.field("content_hash", pa.string(), nullable=False),
            pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
            pa.field("indexed_at", pa.timestamp("us", tz="UTC"), nullable=False),
        ]
    )


def as_stored(docs: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows in a docs table's form (``schema``): its columns in its order and types, with the
    time they are written (``indexed_at``) unless they carry one."""
    if "indexed_at" not in docs.column_names:
        now = np.datetime64(datetime.now(UTC).replace(tzinfo=None), "us")
        docs = docs.append_column("indexed_at", pa.array(np.full(docs.num_rows, now), pa.timestamp("us", tz="UTC")))
    return docs.select(schema.names).cast(schema)


QUERIES = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("logical_query", pa.string()),
    ]
)

# decompositions: one row per (query, method) from the LLM; never dropped (see status).
# fallback: output unusable (unparsed, cut); degenerate: parsed but unusable (a term copied from the prompt, a conjunct
# beside its own negation); error: the engine failed. All but ok carry the raw question in the method's shape.
DECOMPOSITION_STATUS = ("ok", "fallback", "degenerate", "error")
ATOM = pa.struct([pa.field("id", pa.string(), nullable=False), pa.field("text", pa.string(), nullable=False)])
DECOMPOSITIONS = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),  # a registered decomposition kind (pipelines/llm/decompose.py KINDS)
        pa.field("model", pa.string(), nullable=False),  # model id (name@checksum)
        pa.field("prompt_sha", pa.string(), nullable=False),  # the prompt template's hash
        # question_sha(the question's text) it was made for: a row is applied to that text only (null: unchecked,
        # as in hand-written tables and tables written before the column)
        pa.field("question_sha", pa.string()),
        pa.field("raw_output", pa.string()),  # what the model wrote (null on error)
        # itlr: over quoted text terms; orlog: over quoted atom ids ("a1" AND NOT "a2")
        pa.field("logical_query", pa.string()),
        pa.field("atoms", pa.list_(ATOM)),  # orlog: statements about {x}
        pa.field("expansion", pa.string()),  # reasoning: the text embedded as the query
        pa.field("status", pa.string(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("generated_tokens", pa.int32(), nullable=False),
        pa.field("cached", pa.bool_(), nullable=False),  # read from the persistent LLM cache
    ]
)



def question_sha(text: str) -> str:
    """The key of a question's text in a decompositions table: its UTF-8 bytes' SHA-256, 16 hex."""
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# query columns a decomposition stage (pipelines/retrieval/stages/rewriters.py) adds to QUERIES, for
# the stages after it: its status, and for orlog the atoms (logical_query then holds the
# form over atom ids)
DECOMPOSED_QUERY = pa.schema(
    [
        pa.field("decomposition_status", pa.string(), nullable=False),  # one of DECOMPOSITION_STATUS
        pa.field("atoms", pa.list_(ATOM)),
    ]
)

INDUCTION_STATUS = ("ok", "fallback", "error")  # fallback: not an "If ..., then ..." rule (the query stands in); error: the engine failed

# query columns the siar stage adds: the query's text before the rewrite (what a later
# reranker reads; an expansion adds it too), the induced rule and its status
INDUCED_QUERY = pa.schema(
    [
        pa.field("original_text", pa.string(), nullable=False),
        pa.field("induced_rule", pa.string()),
        pa.field("induction_status", pa.string(), nullable=False),  # one of INDUCTION_STATUS
    ]
)


def question_column(queries: pa.Table) -> str:
    """The column of ``queries`` holding each question as it was asked: ``original_text`` where
    a stage before rewrote ``text`` (siar's rule, an expansion's reasoning), else ``text``. What
    an LLM stage asks about (a reranker, the reasoner, a decomposition) reads it."""
    return "original_text" if "original_text" in queries.column_names else "text"


# truth scores: P(True) of one prompt from one forward pass (jobs/llm_service.py)
TRUTH_SCORES = pa.schema(
    [
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("p_true", pa.float64(), nullable=False),
        pa.field("logit_true", pa.float64(), nullable=False),
        pa.field("logit_false", pa.float64(), nullable=False),
        pa.field("exact", pa.bool_(), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("cached_prompt_tokens", pa.int32(), nullable=False),
        pa.field("cached", pa.bool_(), nullable=False),
    ]
)


QRELS = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("relevance", pa.int32(), nullable=False),
    ]
)


RUN = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),  # 1-based
        pa.field("score", pa.float64(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
    ]
)

METRICS = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("query_id", pa.string(), nullable=False),  # "all" for the aggregate
        pa.field("measure", pa.string(), nullable=False),  # canonical name, e.g. "nDCG@10"
        pa.field("value", pa.float64(), nullable=False),
    ]
)

SIGNIFICANCE = pa.schema(
    [
        pa.field("measure", pa.string(), nullable=False),
        pa.field("baseline", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("mean_baseline", pa.float64(), nullable=False),  # the measure's value over the queries, as the summary's
        pa.field("mean_run", pa.float64(), nullable=False),  # (a count's sum, a gm_* measure's geometric mean, else the mean)
        pa.field("test", pa.string(), nullable=False),
        pa.field("p_value", pa.float64(), nullable=False),
        pa.field("p_adjusted", pa.float64(), nullable=False),
        pa.field("correction", pa.string(), nullable=False),
        pa.field("significant", pa.bool_(), nullable=False),
    ]
)

AGGREGATE_QUERY_ID = "all"


class SchemaError(UserError, ValueError):
    """A table handed to a stage lacks columns the stage needs."""


def repeated(value: str, n: int) -> pa.StringArray:
    """``value`` ``n`` times as an Arrow string array, made from its buffers (a run's ``method``
    and ``run_id`` columns: 20x faster than taking one value ``n`` times)."""
    raw = value.encode()
    if len(raw) * n >= 2**31:
        raise ValueError(f"repeated: {n:,} copies of {value!r} exceed an Arrow string array (2 GiB); build the table in batches")
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def require_columns(table: pa.Table | pa.Schema, contract: pa.Schema | Iterable[str], stage: str) -> None:
    """Raise :class:`SchemaError` naming the stage, the missing and the found columns.

    Only names are checked; types are enforced by :func:`conform`.
    """
    names = contract.names if isinstance(contract, pa.Schema) else list(contract)
    found = table.names if isinstance(table, pa.Schema) else table.column_names
    missing = [n for n in names if n not in found]
    if missing:
        raise SchemaError(
            f"{stage}: input lacks column(s) {missing}; found {list(found)}; "
            f"the stage needs {names}."
        )


def _as_text(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` casts to a string column as its values are written: text,
    bytes (checked as UTF-8), integers (their decimal text), or all nulls. A float does not
    (1e18 casts to '1e+18', 10.0 to '10': an id a qrels line never names), nor does a boolean."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_integer(t) or pa.types.is_null(t) or str(t) in ("string_view", "binary_view"))


def conform(table: pa.Table, contract: pa.Schema, stage: str) -> pa.Table:
    """Select and cast ``table``'s columns to ``contract`` (in its order); returns a new table.
    A string column is made only of text, bytes or integers (:func:`_as_text`)."""
    require_columns(table, contract, stage)
    columns = []
    for field in contract:
        col = table.column(field.name)
        if (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)) and not _as_text(col.type) and col.null_count < len(col):
            # (a column of nulls alone, pandas' float NaN of an empty column, is nulls as text too)
            raise SchemaError(f"{stage}: column {field.name!r} has type {col.type}; it holds text (ids as strings or integers), "
                              f"and a {col.type} value would be written otherwise than given (a float 1e18 as '1e+18', 10.0 as '10')")
        if not col.type.equals(field.type):
            try:
                col = col.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(
                    f"{stage}: column {field.name!r} has type {col.type}, "
                    f"which does not convert to {field.type}: {exc}"
                ) from exc
        if not field.nullable and col.null_count:
            raise SchemaError(f"{stage}: column {field.name!r} has {col.null_count} null(s); it must have none.")
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=contract)

# `logicrank nightly` (jobs/nightly.py): one row per (night, query set, pipeline, measure)
NIGHTLY_HISTORY = pa.schema(
    [
        pa.field("date", pa.string(), nullable=False),  # YYYY-MM-DD
        pa.field("table_version", pa.int64(), nullable=False),
        pa.field("tag", pa.string(), nullable=False),
        pa.field("query_set", pa.string(), nullable=False),
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("measure", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("queries", pa.int32(), nullable=False),
        pa.field("config_hash", pa.string(), nullable=False),  # the pipeline, encoder, LLM and query set (not the corpus)
        pa.field("regression", pa.bool_(), nullable=False),
    ]
)

# one night's comparisons with an earlier one ("previous" night, or the pinned "baseline")
NIGHTLY_COMPARISONS = pa.schema(
    [
        pa.field("query_set", pa.string(), nullable=False),
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("measure", pa.string(), nullable=False),
        pa.field("against", pa.string(), nullable=False),  # previous | baseline
        pa.field("old_date", pa.string(), nullable=False),
        pa.field("new_date", pa.string(), nullable=False),
        pa.field("old_table_version", pa.int64(), nullable=False),
        pa.field("new_table_version", pa.int64(), nullable=False),
        pa.field("old_value", pa.float64()),  # means over the paired queries; null when not compared
        pa.field("new_value", pa.float64()),
        pa.field("delta", pa.float64()),
        pa.field("queries", pa.int32(), nullable=False),
        pa.field("p_value", pa.float64()),
        pa.field("p_adjusted", pa.float64()),
        pa.field("max_drop", pa.float64()),  # the measure's rule (null: none, never a regression)
        pa.field("regression", pa.bool_(), nullable=False),
        pa.field("note", pa.string(), nullable=False),  # why not compared, or ""
    ]
)
