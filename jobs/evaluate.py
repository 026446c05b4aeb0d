"""`logicrank evaluate`: metrics table, significance tests and a Markdown + PNG report."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logicrank.jobs.rundir import RunDir, input_fingerprint
from logicrank.jobs.watchdog import beat
from logicrank.pipelines.config.settings import EvaluateConfig
from logicrank.pipelines.evaluation.core import EvaluationError
from logicrank.pipelines.evaluation.measures import parse_measures
from logicrank.pipelines.evaluation.qa import JUDGE_TEMPLATE, QAError, llm_judge, parse_qa_measures, read_gold, read_predictions
from logicrank.pipelines.evaluation.runs import evaluate_runs, named_runs, notes, without_identical_ids
from logicrank.pipelines.files import write_parquet_atomic, write_text_atomic
from logicrank.pipelines.io import DUPLICATES_REMOVED, read_qrels, read_run

OUTPUTS = ("metrics.parquet", "significance.parquet", "report.md", "plots/per_query.png")  # all an evaluation can write


def run_evaluate(cfg: EvaluateConfig, out: str | Path, title: str = "Evaluation", echo: Callable[[str], None] | None = None) -> pa.Table:
    """Writes metrics.parquet, significance.parquet, report.md, plots/per_query.png; returns the metrics.

    Runs and qrels are read and checked by :mod:`logicrank.pipelines.io` (the numbers equal
    trec_eval's, or a one-line error says why not); ``cfg.dedupe`` keeps each repeated
    (query, doc) pair's best-ranked row instead of refusing the run. The manifest records,
    per run_id, ``missing_queries`` (qrels queries without results: they score 0) and
    ``queries_without_qrels`` (not evaluated) and ``depths`` (documents per query at most), and
    per run file ``duplicates_removed``.
    Skipped (the stored metrics returned) when config, qrels and runs are unchanged.
    """
    measures, qa_measures = _check_inputs(cfg)
    rundir = RunDir(out, "evaluate")
    inputs = {**_fingerprint(cfg, qa_measures), "title": title}  # (the report's heading: another title is another report)
    with rundir.held():
        return _evaluate_into(cfg, rundir, title, echo, measures, qa_measures, inputs)


def _evaluate_into(cfg: EvaluateConfig, rundir: RunDir, title: str, echo: Callable[[str], None] | None, measures, qa_measures,
                   inputs: dict) -> pa.Table:
    if rundir.is_fresh(cfg.digest(), inputs) and {"missing_queries", "depths"} <= set(rundir.previous() or {}):  # (older reports lack depths)
        if echo:
            echo(f"evaluate: config, qrels and runs unchanged since the last run: skipped; metrics in {rundir.path / 'metrics.parquet'}")
        return pq.read_table(rundir.path / "metrics.parquet")
    qrels = read_qrels(cfg.qrels) if cfg.runs else None
    tables = retrieved_from(cfg.runs)
    if (note := table_versions_note(tables)) and echo:
        echo(note)
    runs, removed, empty, run_ids = _read_runs(cfg, echo)
    runs, run_ids, identical = _identical_ids(cfg, runs, run_ids, echo)
    ev, judge = _evaluate(cfg, qrels, runs, run_ids, removed, qa_measures)
    rundir.begin()
    outputs = _write_outputs(ev, rundir, title, echo)
    rundir.write_manifest(
        cfg.model_dump(mode="json"),
        cfg.digest(),
        inputs,
        outputs,
        measures=[str(m) for m in measures],
        run_ids=ev.run_ids,
        qrels_queries=ev.qrels_queries,
        missing_queries=ev.missing_queries,
        queries_without_qrels=ev.queries_without_qrels,
        duplicates_removed=ev.duplicates_removed,
        qa_measures=ev.qa_measures,
        unanswered_questions=ev.unanswered_questions,
        answers_without_gold=ev.answers_without_gold,
        depths=ev.depths,
        empty_runs=empty,
        identical_ids={"rows": identical, "dropped": cfg.ignore_identical_ids},
        retrieved_from=tables,
        llm=judge,
    )
    return ev.metrics


def retrieved_from(runs) -> dict[str, dict]:
    """Per run file that a retrieve run wrote (its ``runs/`` folder beside the run's manifest),
    the table it was retrieved from (db, name, version, when made), as that manifest records it."""
    out = {}
    for path in runs:
        manifest = Path(path).resolve().parent.parent / "manifest.json"
        if Path(path).resolve().parent.name != "runs" or not manifest.is_file():
            continue
        try:
            table = json.loads(manifest.read_text()).get("inputs", {}).get("table")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(table, dict):
            out[str(path)] = table
    return out


def _version_key(table: dict) -> str:
    """A table version as the note names it: the table, the version, when it was made (the db's
    path as written may differ for one table: not compared)."""
    return f"{table.get('name')} v{table.get('version')} (made {table.get('made')})"


def table_versions_note(tables: dict[str, dict]) -> str | None:
    """The one line said where the runs were retrieved from more than one table version: their
    figures are of other documents, and a significance test pairs them as one collection's
    (None from one version, or none known)."""
    by: dict[str, list[str]] = {}
    for path, t in tables.items():
        by.setdefault(_version_key(t), []).append(Path(path).name)
    if len(by) < 2:
        return None
    parts = "; ".join(f"{v}: {', '.join(names)}" for v, names in by.items())
    return (f"evaluate: the runs were retrieved from {len(by)} table versions ({parts}): their figures are of other documents, "
            "and the significance tests pair them as if of one collection.")


def _check_inputs(cfg: EvaluateConfig) -> tuple[list, list[str]]:
    """(retrieval measures, QA measures), before anything is read: a bad measure name, a Judge
    without its LLM, a file that is not there are one line each."""
    measures = parse_measures(cfg.measures)
    qa_measures = parse_qa_measures(cfg.qa_measures) if cfg.answers else []
    if "Judge" in qa_measures and cfg.judge is None:
        raise QAError("evaluate: the Judge measure needs an LLM (--judge-llm MODEL); or drop Judge.")
    given = ([("qrels", cfg.qrels)] if cfg.runs else []) + [("run", p) for p in cfg.runs] + [("answers", p) for p in cfg.answers]
    for kind, path in given:
        if not Path(path).exists():
            raise EvaluationError(f"evaluate: no {kind} file at {str(path)!r}; check the path.")
    for path in (*cfg.runs, *cfg.answers):
        refuse_unfinished_retrieve(Path(path).resolve())
    return measures, qa_measures


def refuse_unfinished_retrieve(path: Path) -> None:
    """Refuse a run or answers file in the ``runs/`` or ``answers/`` folder of a retrieve run
    that has not finished (its manifest says ``running``, ``interrupted`` or ``failed``): a run
    killed after writing one pipeline's file leaves the other pipelines' files of the run before
    it, of another table version or config, which would be evaluated as this run's."""
    manifest = path.parent.parent / "manifest.json"
    if path.parent.name not in ("runs", "answers") or not manifest.is_file():
        return
    try:
        prev = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return  # (not a manifest this project wrote: the file is read as any other)
    if isinstance(prev, dict) and prev.get("stage") == "retrieve" and prev.get("status") != "ok":
        raise EvaluationError(f"evaluate: {path} is an output of a retrieve run that has not finished ({manifest} says "
                              f"{prev.get('status')!r}), so it may be an earlier run's; rerun that retrieve command to finish it.")


def _fingerprint(cfg: EvaluateConfig, qa_measures: list[str]) -> dict:
    """What the evaluation reads, fingerprinted: an unchanged rerun is skipped."""
    inputs = {"qrels": input_fingerprint("qrels", cfg.qrels, EvaluationError) if cfg.runs else None, "runs": [input_fingerprint("run", p, EvaluationError) for p in cfg.runs]}
    if cfg.answers:
        gold_file = Path(cfg.gold) / "answers.jsonl" if Path(cfg.gold).is_dir() else Path(cfg.gold)
        inputs.update(gold=input_fingerprint("gold answers", gold_file, EvaluationError) if gold_file.is_file() else None,
                      answers=[input_fingerprint("answers", p, EvaluationError) for p in cfg.answers])
        if "Judge" in qa_measures:  # an edited judge prompt or another checkpoint is a new evaluation
            from logicrank.pipelines.llm import prompts
            from logicrank.pipelines.llm.models import resolve

            inputs["judge"] = {"template": prompts.load(JUDGE_TEMPLATE).sha, "model": resolve(cfg.judge.model, log=lambda m: None).model_id,
                               "engine": cfg.judge.engine_digest()}  # (dtype auto: float32 on a CPU, the GPU's own there)
    return inputs


def _read_runs(cfg: EvaluateConfig, echo: Callable[[str], None] | None) -> tuple[list[pa.Table], dict[str, int], list[str], list[str] | None]:
    """(the runs named, duplicates removed per file, the ids of the runs that retrieved
    nothing, every run id in order where one is empty, else None)."""
    runs, removed, empty = [], {}, []
    for path in cfg.runs:
        run = read_run(path, duplicates="first" if cfg.dedupe else "refuse", empty="allow" if cfg.empty_runs == "zero" else "refuse")
        removed[str(path)] = int(run.schema.metadata[DUPLICATES_REMOVED])
        if run.num_rows == 0:  # a run that retrieved nothing (empty_runs: zero): every query 0, under its file's stem
            empty.append(cfg.run_id_for(path) or Path(path).stem)
        runs.append(run)
    runs = named_runs(runs, cfg.runs, {path: cfg.run_id_for(path) for path in cfg.runs})
    run_ids = None
    if empty:  # the run ids in order, an empty file's its stem; one id in two files is refused, as without an empty run
        run_ids = [rid for path, run in zip(cfg.runs, runs, strict=True)
                   for rid in (pc.unique(run.column("run_id")).to_pylist() if run.num_rows else [cfg.run_id_for(path) or Path(path).stem])]
        if len(run_ids) != len(set(run_ids)):
            raise EvaluationError(f"evaluate: run ids repeat across the given runs: {run_ids} (an empty run's id is its file's stem); "
                                  "give each run a distinct run_id, or --name NEWID=FILE.")
        if echo:
            echo(f"evaluate: {len(empty)} run{'s' if len(empty) > 1 else ''} retrieved nothing ({', '.join(empty)}): every query scores 0.")
    return runs, removed, empty, run_ids


def _identical_ids(cfg: EvaluateConfig, runs: list[pa.Table], run_ids: list[str] | None,
                   echo: Callable[[str], None] | None) -> tuple[list[pa.Table], list[str] | None, dict[str, int]]:
    """(the runs, the run ids to evaluate, the count per run file of the rows whose doc id is
    their query's id). With ``cfg.ignore_identical_ids`` those rows are dropped, as BEIR's
    evaluation drops them (ArguAna's and Quora's queries are documents of their corpus, each
    retrieving itself first); a run left with no row is still evaluated, every query 0 (its
    ids are then all named, as for an empty run). Left in, they are scored as trec_eval scores
    them, and a note says so."""
    every = run_ids or [rid for run in runs for rid in pc.unique(run.column("run_id")).to_pylist()]  # (first seen first)
    out, counts = [], {}
    for path, run in zip(cfg.runs, runs, strict=True):
        kept, n = without_identical_ids(run)
        if n:
            counts[str(path)] = n
        out.append(kept if cfg.ignore_identical_ids else run)
    if cfg.ignore_identical_ids and counts:
        left = {rid for run in out for rid in run.column("run_id").to_pylist()}
        if any(rid not in left for rid in every):  # a run whose every row was its queries' own ids: 0, not gone
            run_ids = every
    if counts and echo:
        files = ", ".join(f"{p} ({n})" for p, n in counts.items())
        echo(identical_ids_note(sum(counts.values()), f" ({files})", cfg.ignore_identical_ids,
                                "--ignore-identical-ids (an experiment file's ignore_identical_ids: true)"))
    return out, run_ids, counts


def identical_ids_note(rows: int, where: str, dropped: bool, option: str) -> str:
    """The line said of ``rows`` rows whose document id is their query's (``where``: in which
    runs), ``dropped`` or scored; ``option``: how the caller drops them (a flag, a keyword)."""
    return (f"evaluate: {rows} row(s) have a document id equal to their query's id{where}: "
            + (f"dropped before measuring, as BEIR's evaluation drops them ({option})." if dropped else
               "scored as trec_eval scores them. Where the queries are documents of the corpus (BEIR's ArguAna and Quora), BEIR's "
               f"evaluation drops them: {option}; where the ids only coincide (numbered queries and documents), keep them."))


def _evaluate(cfg: EvaluateConfig, qrels: pa.Table | None, runs: list[pa.Table], run_ids: list[str] | None, removed: dict[str, int], qa_measures: list[str]):
    """The evaluation (:func:`~logicrank.pipelines.evaluation.runs.evaluate_runs`), with the
    judge's LLM pool started for it alone when the Judge measure is asked for (or taken over
    from the experiment's retrieve job, jobs.raysession.keep_engines), and the pool's counts
    (None without the judge)."""
    answers, gold = (_answers(cfg), read_gold(cfg.gold)) if cfg.answers else ({}, None)
    evaluate = partial(evaluate_runs, runs, qrels, cfg.measures, cfg.baseline, cfg.test, cfg.correction, cfg.alpha, run_ids=run_ids, answers=answers,
                       gold=gold, qa_measures=cfg.qa_measures if cfg.answers else (), duplicates_removed=removed, done=beat)
    if "Judge" not in qa_measures:
        return evaluate(), None
    from logicrank.jobs.llm_service import LLMService
    from logicrank.jobs.raysession import ray_session

    llm = LLMService(cfg.judge)
    with ray_session(cfg.ray, llm=llm):
        try:
            ev = evaluate(judge=llm_judge(llm))
        finally:
            counts = llm.close()
    return ev, counts


def _write_outputs(ev, rundir: RunDir, title: str, echo: Callable[[str], None] | None) -> list[str]:
    """The metrics, the significance tests (where there are any), the plot and the report;
    an earlier run's output this one does not make is set aside. Returns what was written."""
    write_parquet_atomic(ev.metrics, rundir.path / "metrics.parquet")
    outputs = ["metrics.parquet", "report.md", "plots/per_query.png"]
    if ev.significance is not None:
        write_parquet_atomic(ev.significance, rundir.path / "significance.parquet")
        outputs.append("significance.parquet")
    ev.plot(rundir.path / "plots" / "per_query.png")
    write_text_atomic(ev.markdown(title), rundir.path / "report.md")
    rundir.set_aside([o for o in OUTPUTS if o not in outputs], echo)  # an earlier run's significance table, with one run now
    return outputs


def _answers(cfg: EvaluateConfig) -> dict[str, dict[str, str]]:
    """Each answers file's predictions, by run id (its file stem)."""
    preds: dict[str, dict[str, str]] = {}
    for path in cfg.answers:
        rid = Path(path).stem
        if rid in preds:
            raise EvaluationError(f"evaluate: two answer files named {rid!r}; the file stem is the run id, so give each a distinct name.")
        preds[rid] = read_predictions(path)
    return preds


def evaluated_depths(out: str | Path) -> dict[str, int]:
    """Each run's depth (documents per query at most), read from an evaluation's manifest, to print."""
    path = Path(out) / "manifest.json"
    return json.loads(path.read_text()).get("depths", {}) if path.exists() else {}


def evaluation_notes(out: str | Path) -> list[str]:
    """The notes of report.md (queries a run misses or the qrels lack, rows dedupe dropped,
    questions an answers file leaves out), read from an evaluation's manifest, to print."""
    path = Path(out) / "manifest.json"
    m = json.loads(path.read_text()) if path.exists() else {}
    return notes(m.get("missing_queries", {}), m.get("queries_without_qrels", {}), m.get("qrels_queries", 0), m.get("duplicates_removed", {}),
                 m.get("unanswered_questions", {}), m.get("answers_without_gold", {}))
