"""The notebook API (exported as ``logicrank.*``): open a table, build pipelines, retrieve, evaluate, compare.

Everything here runs in this process, without Ray: the pipelines run through the same
runner the retrieve job uses (pipelines/runner.py), so a run made here equals the job's.
The CLI's jobs (``logicrank index``, ``retrieve``, ...) are for corpora and query sets that
want a cluster; this is for looking at one. docs/python-api.md walks through it::

    import logicrank as lr

    table = lr.open_table("runs/scifact/lancedb")  # made by `logicrank index`
    queries = lr.read_queries("pipelines/datasets/scifact/queries.jsonl")
    pipes = lr.read_pipelines({"bm25": ["bm25"], "hybrid": [{"rrf": {"of": [["dense"], ["bm25"]]}}]})
    runs = lr.retrieve(table, queries, pipes)  # an Arrow table with the RUN columns
    metrics = lr.evaluate(runs, lr.read_qrels("pipelines/datasets/scifact/qrels/test.tsv"), ["nDCG@10"])
    lr.compare(metrics, baseline="bm25")
    lr.run_experiment("scifact", table=table)  # a whole benchmark (jobs/experiments/scifact.yaml), here
    lr.run_experiment("scifact")  # the same through the jobs (index, retrieve, evaluate) on a local Ray cluster
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from logicrank.pipelines.config.settings import EmbedConfig, LLMConfig
from logicrank.pipelines.evaluate.runs import evaluate_runs
from logicrank.pipelines.evaluate.significance import compare as _compare
from logicrank.pipelines.io import queries_table, read_qrels, read_queries, read_run
from logicrank.pipelines.pipeline import Pipeline, PipelineError, read_presets
from logicrank.pipelines.pipeline import read_pipelines as _read_pipelines
from logicrank.pipelines.runner import Result, StageCache
from logicrank.pipelines.stages import Context
from logicrank.schemas.errors import UserError  # every mistake in the input raises one (a one-line message)
from logicrank.schemas.tables import RUN

__all__ = ["Pipeline", "PipelineError", "Result", "StageCache", "Table", "compare", "evaluate", "open_table", "preset", "read_pipelines", "read_qrels",
           "read_queries", "read_run", "retrieve", "run_experiment", "UserError"]

DEFAULT_MEASURES = ("nDCG@10", "P@1", "R@100", "MRR", "MAP", "F1@10")


class Table:
    """A LanceDB table of documents (made by ``logicrank index``) at one version, with the
    encoder its vectors came from and, given an LLM config, an LLM in this process (its
    checkpoint is prepared here; the engine starts on the first prompt the cache misses).
    Use it as the ``table`` of :func:`retrieve`."""

    def __init__(self, db: str | Path, name: str = "docs", version: int | None = None, embed: EmbedConfig | None = None,
                 llm: LLMConfig | None = None):
        import sys

        from logicrank.pipelines.store import DocStore

        store = DocStore(str(db), name)
        if not store.exists():
            raise PipelineError(f"open_table: {store.absent()}; make one with `logicrank index`.")
        # the version given (any one, on purpose), else the last one a completed index run finished
        store, self.note = store.readable(version, "open_table", option="open_table(..., version={v})")
        self.store = DocStore(str(db), name, version=store.version)  # pinned: every pipeline reads this version
        if self.note:
            print(self.note, file=sys.stderr)
        self.embed, self.llm_config = embed or EmbedConfig(), llm
        self._encoder = self._llm = None
        self.context = Context(self.store, encoder=self._encoder_once, llm=self._llm_once,
                               llm_model=None if llm is None else str(self._llm_once().model_dir))

    @property
    def version(self) -> int:
        return self.store.version

    def __len__(self) -> int:
        return self.store.count()

    def __repr__(self) -> str:
        return f"Table({self.store.uri!r}, {self.store.name!r}, version={self.version}, documents={len(self)})"

    def _encoder_once(self):
        if self._encoder is None:
            from logicrank.pipelines.embed import Embedder, model_id

            self.store.require_model(model_id(self.embed), "open_table", "give open_table(embed=...) the table's model")
            self._encoder = Embedder(self.embed)
        return self._encoder

    def _llm_once(self):
        if self._llm is None:
            if self.llm_config is None:
                raise PipelineError("a pipeline asks the LLM: give open_table(llm=LLMConfig(model=...)).")
            from logicrank.pipelines.llm.engine import LocalLLM

            self._llm = LocalLLM(self.llm_config)
        return self._llm


def open_table(db: str | Path, name: str = "docs", version: int | None = None, embed: EmbedConfig | None = None,
               llm: LLMConfig | None = None) -> Table:
    """The table ``name`` in the LanceDB database ``db``: ``version`` (a number or a tag) when
    given, else the last version a completed ``logicrank index`` run finished. A newer version
    left by a run that did not finish is not read, and a line on stderr says so (also kept as
    ``Table.note``); a table no index run completed is refused (:class:`UserError`)."""
    return Table(db, name, version, embed, llm)


def read_pipelines(spec: Mapping[str, Any] | str | Path, set: Mapping[str, Any] | Sequence[str] | None = None) -> dict[str, Pipeline]:
    """Named pipelines from a mapping (run id -> stages, as in a pipelines file) or a YAML
    file (docs/pipelines.md), with the overrides ``set`` (``{"orlog.k": 20}`` or
    ``["orlog.k=20"]``, the ``--set`` grammar), each validated."""
    return _read_pipelines(spec, set)


def preset(*methods: str, set: Mapping[str, Any] | Sequence[str] | None = None) -> dict[str, Pipeline]:
    """``--method`` presets (pipelines/presets/) as pipelines, with the overrides ``set``, e.g.
    ``preset("bm25", "orlog", set={"orlog/bm25.k": 50})`` (OrLog over BM25's top 50; ``bm25.k`` would
    set every pipeline's bm25 stage, the bm25 run's too)."""
    return {rid: Pipeline(rid, stages) for rid, stages in read_presets(methods, sets=set).items()}


def retrieve(table: Table, queries: pa.Table | str | Path, pipes: Mapping[str, Pipeline] | Iterable[Pipeline],
             cache: StageCache | str | Path | None = None, pandas: bool = False, results: dict[str, Result] | None = None):
    """Run each pipeline on ``queries`` (a table with query_id and text, checked as a queries
    file is, or a queries file); returns every run as one table with the RUN columns
    (``pandas``: a DataFrame; a pipeline that found nothing has no rows: evaluate it by
    naming it in :func:`evaluate`'s ``run_ids``). ``cache``:
    a :class:`StageCache` or a directory to keep stage outputs in (pipelines that share a
    prefix compute it once either way); keyed as the retrieve job keys them, so a job's
    ``<out>/stages`` answers the same pipelines on the same queries and table, and a stage
    whose code changed since is computed again (docs/pipelines.md). Pass a dict as ``results`` to get each pipeline's
    :class:`Result` (its side tables and steps) too."""
    queries = queries_table(queries, "retrieve: queries") if isinstance(queries, pa.Table) else read_queries(queries)
    if not isinstance(cache, StageCache):
        cache = StageCache(cache)
    pipes = list(pipes.values()) if isinstance(pipes, Mapping) else list(pipes)
    if not pipes:
        raise PipelineError("retrieve: give at least one pipeline.")
    runs = []
    for p in pipes:
        p.validate(frozenset(queries.column_names))  # every pipeline before any runs
    for p in pipes:
        result = p.run(table.context, queries, cache)
        runs.append(result.run)
        if results is not None:
            results[p.name] = result
    out = pa.concat_tables(runs) if runs else RUN.empty_table()
    return out.to_pandas() if pandas else out


def evaluate(runs: pa.Table | Any, qrels: pa.Table | str | Path, measures: Sequence[str] = DEFAULT_MEASURES,
             run_ids: Sequence[str] | None = None) -> pa.Table:
    """Per-query values and means (query ``all``) of ``measures`` for every run in ``runs``
    (RUN columns; a DataFrame is taken too), trec_eval's rules: a query of the qrels a run
    misses scores 0. ``qrels``: a table (query_id, doc_id, relevance) or a file. ``run_ids``:
    the runs to evaluate (default: those with rows); a named run with no rows scores 0."""
    if not isinstance(runs, pa.Table):
        runs = pa.Table.from_pandas(runs, preserve_index=False)
    if not isinstance(qrels, pa.Table):
        qrels = read_qrels(qrels)
    return evaluate_runs([runs], qrels, measures, run_ids=run_ids, significance=False).metrics


def compare(metrics: pa.Table, baseline: str, test: str = "t-test", correction: str = "holm", alpha: float = 0.05) -> pa.Table:
    """Each other run against ``baseline`` on every measure of ``metrics`` (from
    :func:`evaluate`): paired test, p-values adjusted across runs (SIGNIFICANCE columns)."""
    return _compare(metrics, baseline, test, correction, alpha)


def run_experiment(experiment: str | Path | Any, out: str | Path | None = None, strict: bool = True, table: Table | None = None,
                   set: Mapping[str, Any] | Sequence[str] | None = None, **placement: Any):
    """Run an experiment file (or an :class:`~logicrank.pipelines.experiment.Experiment`, or the
    name of one that ships, e.g. ``"scifact"``); returns its ``ExperimentResult`` (summary,
    metrics, groups, reference checks, report path). ``set``: overrides (``--set``'s grammar).

    Given ``table`` (:func:`open_table` of a table indexed from the experiment's corpus), it
    runs here, in this process, without Ray. Otherwise it runs the jobs (index, retrieve,
    evaluate) on a local Ray cluster, or the one ``placement`` names
    (``ray=RayConfig(address=...)``; ``embed``, ``llm``: configs). docs/experiments.md."""
    from logicrank.pipelines.experiment import Experiment, load, override, run_in_process

    exp = experiment if isinstance(experiment, Experiment) else load(experiment)
    if set:
        exp = override(exp, set)
    out = out or Path("runs/experiments") / exp.name
    if table is None:
        from logicrank.jobs.experiment import run_experiment as run

        return run(exp, out, strict=strict, **placement)
    if placement:
        raise PipelineError(f"run_experiment: {sorted(placement)} place the jobs; with a table the run is in this process (drop them).")
    wanted = EmbedConfig.model_validate({**table.embed.model_dump(), **exp.embed})
    if wanted != table.embed:
        raise PipelineError(f"run_experiment: experiment {exp.name} fixes embed {exp.embed}; open the table with open_table(embed=...) to match.")
    judge = None
    if "Judge" in exp.qa_measures:
        from logicrank.pipelines.evaluate.qa import llm_judge

        judge = llm_judge(table.context.llm_service())
    return run_in_process(exp, table.context, out, strict=strict, judge=judge)
