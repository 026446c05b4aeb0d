"""The stage contract: every method is a stage from Arrow tables to Arrow tables.

A stage states what it consumes and produces (its :class:`Kind`), its validated options (a
pydantic model with ``extra="forbid"``), the query columns it reads and adds, and what it
needs from the job (:class:`Needs`: the encoder, the LLM for truth scores or generation).
It registers itself with :func:`pipelines.stages.register`; the pipeline config schema is
derived from that registry. No Ray here: the job (jobs/retrieve.py) decides placement and
hands each stage a :class:`Context` with the table, the encoder and the LLM service.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import pyarrow as pa
from pydantic import BaseModel, ConfigDict


class Kind(StrEnum):
    """What a stage consumes and produces."""

    RETRIEVER = "retriever"  # queries -> run
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


class StageOptions(BaseModel):
    """A stage's options. Subclasses declare ``stage: Literal["<name>"] = "<name>"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class Output:
    """What a stage returns: new queries (a rewriter) or a run (anything else), its side
    tables by kind (``term_scores``, ``predicate_scores``, ...) and its manifest counts."""

    queries: pa.Table | None = None
    run: pa.Table | None = None
    side: dict[str, pa.Table] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """What the job hands every stage. The encoder and the LLM service start on first use."""

    store: Any  # pipelines.store.DocStore
    encoder: Callable[[], Any] | None = None  # () -> pipelines.embed.Embedder
    llm: Callable[[], Any] | None = None  # () -> an LLM service with .truth(...) and .generate(...)
    llm_model: str | None = None  # the LLM's checkpoint directory (for its tokenizer)
    echo: Callable[[str], None] | None = None  # progress lines

    def embedder(self):
        if self.encoder is None:
            raise RuntimeError("this stage needs the encoder but declared no Needs(encoder=True) (a bug)")
        return self.encoder()

    def llm_service(self):
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
    per_query: ClassVar[bool] = False  # each query's output depends on that query alone: the job may run it on Ray over query batches
    version: ClassVar[int] = 1  # part of the cache digest: bump it when a change to the code changes the stage's output

    def __init__(self, options: StageOptions):
        self.options = options

    def needs(self) -> Needs:
        return Needs()

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        """``runs``: [] for a retriever or rewriter, [the run so far] for a reranker, the
        sub-pipelines' runs for a fusion."""
        raise NotImplementedError
