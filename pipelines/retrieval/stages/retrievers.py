"""Retrievers over the LanceDB table: dense (cosine) and BM25 (full-text index), each over the whole
table or, after a stage that produced a run, over that run's candidates; and runs read from files."""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
from pydantic import Field

from logicrank.pipelines.retrieval.methods.bm25 import bm25, bm25_candidates
from logicrank.pipelines.retrieval.methods.dense import dense, dense_candidates
from logicrank.pipelines.retrieval.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from logicrank.pipelines.retrieval.stages.registry import register


class DenseOptions(StageOptions):
    stage: Literal["dense"] = "dense"
    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query.")
    search: Literal["exact", "ann"] = Field("exact", description="exact: the blocked product over every vector (sharded past a process's "
                                           "memory budget); ann: the table's ANN index (logicrank index --ann), refined.")
    precision: Literal["float32", "float16"] = Field("float32", description="The saved vectors the exact product reads: float16 halves "
                                                     "their bytes (its recall is measured in docs/bulk-retrieval.md).")
    product: Literal["auto", "numpy", "torch"] = Field("auto", description="The exact product: torch on a visible GPU (auto), numpy on CPUs.")


@register
class Dense(Stage):
    """Embed each query's text; exact cosine top k over the table's saved vectors (or its ANN
    index, as an option); after a stage that produced a run, the cosines of that run's candidates only."""

    name = "dense"
    shardable = True  # its exact search
    kind = Kind.RETRIEVER
    Options = DenseOptions
    per_query = True

    def needs(self) -> Needs:
        return Needs(encoder=True)

    def after_run(self) -> str | None:
        return None if self.options.search == "exact" else "its search 'ann' searches the table's ANN index (search exact scores the run's candidates)"

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        o = self.options
        if runs:
            run, counts = dense_candidates(queries, runs[0], ctx.store, ctx.embedder(), o.k, precision=o.precision)
            return Output(run=run, counts=counts)
        return Output(run=dense(queries, ctx.store, ctx.embedder(), o.k, search=o.search, precision=o.precision, product=o.product))


class BM25Options(StageOptions):
    stage: Literal["bm25"] = "bm25"
    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query.")


@register
class BM25(Stage):
    """BM25 (k1 1.2, b 0.75) over title and text with Lucene's combined-field statistics, as
    LanceDB's CombinedFieldsQuery scores them (per term the larger of the two fields' document
    frequencies; a document's term frequency and length summed over both), searched by the batch
    engine over the table version's saved index (pipelines/engines/bm25/); English stemming and
    Lucene's English stop words on documents and queries alike; a query term counts as often as
    the query repeats it. After a stage that produced a run, the same scores of that run's
    candidates only (those that share a term with the query)."""

    name = "bm25"
    shardable = True
    kind = Kind.RETRIEVER
    Options = BM25Options
    per_query = True
    version = 2  # bump when a change alters its results (CHANGELOG.md says what each bump changed)

    def needs(self) -> Needs:
        return Needs(fulltext=True)

    def after_run(self) -> str | None:
        return None

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        if runs:
            run, counts = bm25_candidates(queries, runs[0], ctx.store, self.options.k)
            return Output(run=run, counts=counts)
        return Output(run=bm25(queries, ctx.store, self.options.k))


class RunFileOptions(StageOptions):
    stage: Literal["run_file"] = "run_file"
    path: str = Field(description="A run table (Parquet, RUN columns) or a TREC run file holding one run.")
    k: int | None = Field(None, ge=1, le=10_000, description="Keep each query's top k (None: all of them).")


@register
class RunFile(Stage):
    """A precomputed run as a first stage (PyTerrier's precomputed results): rerank or fuse
    another system's run. Its rows for the pipeline's queries, ranks as in the file (a TREC
    file is ranked as trec_eval ranks it)."""

    name = "run_file"
    kind = Kind.RETRIEVER
    Options = RunFileOptions
    reads = ("query_id",)  # every query, blank text or not: the file decides which have results

    def needs(self) -> Needs:
        return Needs(files=(self.options.path,))

    def after_run(self) -> str | None:
        return "it reads its own run from a file"

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        import pyarrow.compute as pc

        from logicrank.pipelines.io import read_run

        run = read_run(self.options.path)
        if len(set(run.column("run_id").to_pylist())) > 1:
            from logicrank.pipelines.io import TopicsError

            raise TopicsError(f"run_file {self.options.path}: holds several runs {sorted(set(run.column('run_id').to_pylist()))}; give one.")
        run = run.filter(pc.is_in(run.column("query_id"), queries.column("query_id")))
        if self.options.k is not None:
            run = run.filter(pc.less_equal(run.column("rank"), self.options.k))
        return Output(run=run.sort_by([("query_id", "ascending"), ("rank", "ascending")]), counts={"rows": run.num_rows})


class QrelsOptions(StageOptions):
    stage: Literal["qrels"] = "qrels"
    path: str = Field(description="A qrels file (BEIR TSV or TREC qrels).")
    k: int | None = Field(None, ge=1, le=10_000, description="Keep each query's first k judged documents (None: all of them).")


@register
class Qrels(Stage):
    """The oracle first stage: each query's judged documents (relevance above 0) from a qrels
    file, as a run: relevance descending, then the file's order. The gold rule for reasoning
    with the gold rule (``reason``); an upper bound for a reranker's input."""

    name = "qrels"
    kind = Kind.RETRIEVER
    Options = QrelsOptions
    reads = ("query_id",)  # every query: the file decides which have results

    def needs(self) -> Needs:
        return Needs(files=(self.options.path,))

    def after_run(self) -> str | None:
        return "it reads its own run from a qrels file"

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        from logicrank.pipelines.io import read_qrels
        from logicrank.pipelines.retrieval.methods.ranking import rank_pairs
        from logicrank.schemas.tables import RUN, conform

        qrels = read_qrels(self.options.path).to_pandas()
        qrels = qrels[(qrels["relevance"] > 0) & qrels["query_id"].isin(queries.column("query_id").to_pylist())]
        # ranked by relevance, then the file's order; the scores (the relevance) nudged where that order is not trec_eval's
        # (rank_pairs), so the run's TREC file ranks as the run does
        pairs = qrels.assign(score=qrels["relevance"].astype("float64"), tiebreak=range(len(qrels)))
        run = conform(rank_pairs(pairs, self.options.k or max(len(qrels), 1), "qrels", "qrels"), RUN, "qrels")
        return Output(run=run, counts={"rows": run.num_rows})
