"""The stage contract: every method is a stage from Arrow tables to Arrow tables.

A stage states what it consumes and produces (its :class:`Kind`), its validated options (a
pydantic model with ``extra="forbid"``), the query columns it reads and adds, and what it
needs from the job (:class:`Needs`: the encoder, the LLM for truth scores or generation)
and the side tables it writes, with their schemas. It registers itself with
:func:`logicrank.pipelines.retrieval.stages.register`; the pipeline config schema is derived from that registry.
No Ray here: :mod:`logicrank.pipelines.retrieval.runner` runs a pipeline in any process, handing each stage a
:class:`Context` (the table, the encoder and the LLM, typed by the protocols below); a job
(jobs/retrieve.py) decides where per-query work runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pyarrow as pa

from logicrank.pipelines.retrieval.options import (
    StageOptions as StageOptions,  # defined in a leaf: methods declare their options too
)


class Kind(StrEnum):
    """What a stage consumes and produces."""

    RETRIEVER = "retriever"  # queries -> run; after a stage that produced a run: that run's candidates, rescored (or refused)
    RERANKER = "reranker"  # queries + run -> run
    REWRITER = "rewriter"  # queries -> queries (a run, if any, passes through)
    FUSION = "fusion"  # the runs of several sub-pipelines -> run


@dataclass(frozen=True)
class Needs:
    """What a stage needs from the job, known before Ray starts or any model loads."""

    encoder: bool = False  # the sentence-transformers encoder of the table
    fulltext: bool = False  # the table's full-text indexes (BM25)
    llm: frozenset[str] = frozenset()  # "truth" (P(True) scoring), "generate" (constrained or free text)
    files: tuple[str, ...] = ()  # input files the stage reads (checked to exist; fingerprinted for the cache)

    def __or__(self, other: Needs) -> Needs:
        return Needs(self.encoder or other.encoder, self.fulltext or other.fulltext, self.llm | other.llm, self.files + other.files)




@dataclass
class Output:
    """What a stage returns: new queries (a rewriter) or a run (anything else), its side
    tables by kind (``term_scores``, ``predicate_scores``, ...) and its manifest counts."""

    queries: pa.Table | None = None
    run: pa.Table | None = None
    side: dict[str, pa.Table] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)


class Store(Protocol):
    """The table one pipeline run reads, at one version (:class:`logicrank.pipelines.engines.store.DocStore`)."""

    @property
    def version(self) -> int: ...
    @property
    def dim(self) -> int: ...
    def count(self) -> int: ...
    def rows_for(self, doc_ids: Sequence[str], columns: Sequence[str]) -> pa.Table: ...
    def vectors_for(self, doc_ids: Sequence[str]) -> dict[str, Any]: ...
    def sample_vectors(self, n: int, seed: int = 0) -> Any: ...
    def vector_blocks(self, batch_rows: int = 32768, read_ahead: bool = True) -> Iterator[Any]: ...
    def vector_search(self, *args: Any, **kwargs: Any) -> Any: ...
    def bm25_index(self) -> Any: ...
    def vectors(self, precision: str = "float32") -> Any: ...  # pipelines/engines/vectors.py Vectors
    def held_bytes(self) -> int: ...
    def mapped_bytes(self) -> int: ...
    def release(self) -> None: ...


class Encoder(Protocol):
    """The table's sentence encoder (:class:`logicrank.pipelines.engines.embed.Embedder`)."""

    config: Any  # pipelines.config.settings.EmbedConfig (its digest is part of the cache keys)

    @property
    def model_id(self) -> str: ...
    def encode(self, texts: Sequence[str]) -> Any: ...  # float32 (n, dim), unit length


class LLM(Protocol):
    """An LLM behind the prompt cache: :class:`logicrank.pipelines.llm.engine.LocalLLM` in this process,
    ``jobs.llm_service.LLMService`` on a pool of engine actors. One failure contract for both:

    - ``generate``: a prompt the engine fails on gets its exception in its slot (the caller
      records it as an ``error`` row) and the other prompts are kept;
    - ``truth``: a batch that fails raises (scores are never guessed); a prompt longer than the
      model's window raises before any is sent, one line naming it (by ``keys``, when given);
    - an engine that cannot go on raises :class:`logicrank.schemas.errors.JobFailed` (both calls).
    """

    cfg: Any  # pipelines.config.settings.LLMConfig

    @property
    def model_id(self) -> str: ...
    def generate(self, template: Any, values: Sequence[Mapping[str, str]], constraint: Any = None, max_tokens: int = 256,
                 temperature: float = 0.0, seed: int | None = None, label: str | None = None) -> list[Any]: ...
    def truth(self, template: Any, values: Sequence[Mapping[str, str]], label: str | None = None,
              keys: Sequence[str] | None = None) -> list[Any]: ...


@dataclass(frozen=True)
class Checkpoint:
    """Where a stage keeps the shards of its output it has finished while it runs
    (:mod:`logicrank.pipelines.retrieval.stages.shards`): a directory that belongs to the stage's cache key, so a
    rerun with the same inputs resumes from it and a run of other inputs never reads it."""

    where: Path  # <stage cache root>/<key>.partial
    key: str  # the stage's cache key (recorded in every shard file)


@dataclass
class Context:
    """What a runner hands every stage. The encoder and the LLM start on first use."""

    store: Store
    encoder: Callable[[], Encoder] | None = None
    llm: Callable[[], LLM] | None = None
    llm_model: str | None = None  # the LLM's checkpoint directory (for its tokenizer)
    echo: Callable[[str], None] | None = None  # progress lines
    checkpoint: Checkpoint | None = None  # set by the runner per stage when its cache has a directory (None: one pass)
    # shards(task, merge): a scoring over every document run in shards of the table's rows, each
    # ``task(store, (lo, hi))`` on its own search actor, the parts merged by ``merge``; None (or a
    # call that answers None: the index fits one process) and the stage scores the table here
    shards: Callable[[Callable, Callable], Any] | None = None

    def embedder(self) -> Encoder:
        if self.encoder is None:
            raise RuntimeError("this stage needs the encoder but declared no Needs(encoder=True) (a bug)")
        return self.encoder()

    def llm_service(self) -> LLM:
        if self.llm is None:
            raise RuntimeError("this stage needs the LLM but declared no Needs(llm=...) (a bug)")
        return self.llm()


class Stage:
    """Base class of every stage. Subclasses set the class attributes and :meth:`run`."""

    name: ClassVar[str]
    kind: ClassVar[Kind]
    Options: ClassVar[type[StageOptions]]
    reads: ClassVar[tuple[str, ...]] = ("text",)  # query columns it reads; a query blank in all of them gets no results
    requires: ClassVar[frozenset[str]] = frozenset()  # query columns an earlier stage must add
    adds: ClassVar[frozenset[str]] = frozenset()  # query columns it adds (a rewriter)
    # query columns under which it would misread a query, each with why (validation refuses the pipeline)
    misreads: ClassVar[dict[str, str]] = {}
    drops: ClassVar[frozenset[str]] = frozenset()  # query columns it leaves stale (a rewriter: atoms of a form it replaces)
    per_query: ClassVar[bool] = False  # each query's output depends on that query alone: the job may run it on Ray over query batches
    shardable: ClassVar[bool] = False  # it may search in shards of the table's rows, one search actor each (pipelines/engines/placement.py)
    # The cache keys hold the digest of the stage's code (:meth:`code`: its module and every
    # project module it imports), so an edit to the code is never served from the cache.
    # ``version`` is part of the keys too, as a manual override for what the code digest cannot
    # see (a model or data file the stage reads whose path stays the same, a dependency's
    # behaviour): bump it when such a change changes the stage's output.
    version: ClassVar[int] = 1
    side_tables: ClassVar[Mapping[str, pa.Schema]] = {}  # the side tables it may write, by kind; the runner conforms them

    def __init__(self, options: StageOptions):
        self.options = options

    @classmethod
    def code(cls) -> str:
        """The digest of the code this stage runs (:func:`logicrank.pipelines.codedigest.code_digest` of
        its module), part of every cache key of its output; computed once per process."""
        from logicrank.pipelines.codedigest import code_digest

        return code_digest(cls.__module__)

    def needs(self) -> Needs:
        return Needs()

    def children(self) -> tuple[tuple[StageOptions, ...], ...]:
        """The sub-pipelines a fusion runs (each from this stage's queries); () for the rest."""
        return ()

    def after_run(self) -> str | None:
        """A retriever or fusion after a stage that produced a run (``bm25 >> itlr``: PyTerrier's
        ``>>``, b works on a's output). None: it scores only that run's candidates (its ``run``
        gets ``runs == [the run so far]``). Otherwise what it does instead, and the pipeline is
        refused naming both stages: by default it retrieves from the whole table, which would
        discard the run."""
        return "it retrieves from the whole table"

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        """``runs``: [] for a retriever (or [the run so far] when it comes after one:
        :meth:`after_run`) or a rewriter, [the run so far] for a reranker, the sub-pipelines'
        runs for a fusion."""
        raise NotImplementedError
