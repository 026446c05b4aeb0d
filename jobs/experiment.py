"""`logicrank experiment FILE`: an experiment (:mod:`logicrank.pipelines.evaluation.experiment`) run by the
jobs on one Ray cluster: the index job over its corpus, one retrieve job for every pipeline
(one LLM pool), the evaluate job, then :func:`~logicrank.pipelines.evaluation.experiment.conclude` (groups,
reference checks, the report). Each job keeps its run directory and manifest under ``out``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq

from logicrank.pipelines.config.settings import EmbedConfig, LLMConfig, RayConfig
from logicrank.pipelines.evaluation.experiment import (
    Experiment,
    ExperimentError,
    ExperimentResult,
    conclude,
    prepared,
    with_encoder,
)


def run_experiment(exp: Experiment, out: str | Path, embed: EmbedConfig | None = None, ray: RayConfig | None = None,
                   llm: LLMConfig | None = None, strict: bool = True, progress: bool = True, echo=None,
                   index_dir: str | Path | None = None) -> ExperimentResult:
    """Index, retrieve, evaluate, conclude (module docstring). ``embed``, ``ray``, ``llm``: the
    placement and models of this run (the file holds the benchmark itself). ``index_dir``: where
    the index lives (``lancedb/`` and its ``index/`` run; default ``out``): experiments over
    the same corpus and encoder can share one, and a corpus already there is not encoded again."""
    from logicrank.jobs.raysession import keep_engines, ray_session

    inputs = prepared(exp, Path(out))  # a dataset that cannot be read, or a pipeline that cannot run, is refused before Ray starts
    with ray_session(ray or RayConfig()), keep_engines():  # (the LLM judge's engines: the retrieve job's pool, kept)
        return _run(exp, Path(out), Path(index_dir or out), embed or EmbedConfig(), ray or RayConfig(), llm or LLMConfig(), strict, progress, echo,
                    inputs)


def _run(exp: Experiment, out: Path, index_dir: Path, embed: EmbedConfig, ray: RayConfig, llm: LLMConfig, strict: bool, progress: bool,
         echo, inputs: tuple) -> ExperimentResult:
    from logicrank.jobs.evaluate import run_evaluate
    from logicrank.jobs.index import run_index
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.config.settings import EvaluateConfig, IndexConfig
    from logicrank.pipelines.evaluation.qa import parse_qa_measures

    corpus, queries, qrels, root, pipelines, gold = inputs  # (prepared: checked before the cluster started)
    embed = EmbedConfig.model_validate({**embed.model_dump(), **exp.embed})
    exp = with_encoder(exp, embed)  # another encoder than the file's: its references are not checked
    table = {"table": exp.index["table"]} if "table" in exp.index else {}  # (the table the index recipe writes is the one searched)
    cfg = RetrieveConfig(queries=str(queries), db=str(index_dir / "lancedb"), pipelines=pipelines, embed=embed, ray=ray, llm=llm, trec=exp.trec,
                         **table)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    fmt = {"format": exp.dataset.format} if exp.dataset.corpus is not None and "format" not in exp.index else {}
    index = run_index(IndexConfig(corpus=str(corpus), db=cfg.db, embed=embed, ray=ray, **fmt, **exp.index), index_dir / "index", progress=progress)
    timings["index"] = time.perf_counter() - t
    t = time.perf_counter()
    # the version the index run made, pinned: resolved again, another writer of a shared index_dir could move it between
    cfg = cfg.model_copy(update={"table_version": index.table_version})
    runs = run_retrieve(cfg, out / "retrieve", echo=echo, progress=progress)
    timings["retrieve"] = time.perf_counter() - t
    t = time.perf_counter()
    qa = {}
    if exp.qa_measures:  # the runs that answered, against the gold of the queries run
        answers = tuple(str(p) for rid in runs if (p := out / "retrieve" / "answers" / f"{rid}.parquet").is_file())
        if not answers:
            raise ExperimentError(f"experiment {exp.name}: qa_measures, but no pipeline answers (a LAG stage writes answers)")
        qa = dict(answers=answers, gold=str(gold), qa_measures=exp.qa_measures, judge=llm if "Judge" in parse_qa_measures(exp.qa_measures) else None,
                  ray=ray)
    # a pipeline that retrieved nothing (every LAG chain stopped before retrieving) is a row of zeros, not the end of the experiment
    metrics = run_evaluate(EvaluateConfig(qrels=str(qrels), runs=tuple(str(p) for p in runs.values()), measures=exp.measures,
                                          baseline=exp.baseline, empty_runs="zero", ignore_identical_ids=exp.ignore_identical_ids, **qa),
                           out / "evaluate", title=exp.title, echo=echo)
    timings["evaluate"] = time.perf_counter() - t
    sig_path = out / "evaluate" / "significance.parquet"
    significance = pq.read_table(sig_path) if sig_path.is_file() else None
    manifest = json.loads((out / "retrieve" / "manifest.json").read_text(encoding="utf-8"))
    stages = {rid: p["stages"] for rid, p in manifest["pipelines"].items()}
    return conclude(exp, metrics, significance, queries, out, index.table_version, runs, stages, timings, root, index, strict)
