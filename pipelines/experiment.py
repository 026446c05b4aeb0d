"""An experiment: one benchmark as a value and a YAML file, PyTerrier's ``Experiment`` in
logicrank's terms, run in this process or by the jobs.

An experiment names a dataset (a bundled set, a BEIR directory, or a converter's output), an
index recipe, named pipelines and ``--method`` presets, stage overrides (``set``, the grammar
of :mod:`logicrank.pipelines.overrides`), measures, a baseline for the significance tests,
query columns to group the per-query figures by, reference figures with tolerances, and
caveats. :func:`run_in_process` runs it over a table that exists, in this process, without
Ray (``lr.run_experiment(exp, table=...)``); ``logicrank experiment`` (jobs/experiment.py)
indexes the corpus and runs every pipeline in one retrieve job on a Ray cluster. Both end in
:func:`conclude`: group, check the references, render one report ``<out>/experiment.md``; a
reference missed fails the run after the report is written (``strict``). The files that
ship are in jobs/experiments/ (docs/experiments.md).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig
from logicrank.pipelines.files import write_text_atomic
from logicrank.pipelines.markdown import number, table
from logicrank.schemas.errors import JobFailed, UserError, validation_line

EXPERIMENTS = Path(__file__).parents[1] / "jobs" / "experiments"  # the experiment files that ship (package data of logicrank.jobs)


class ExperimentError(UserError, ValueError):
    """An experiment file that cannot run (bad YAML, an unknown dataset, an unset variable)."""


class ReferenceMissed(JobFailed):
    """A figure fell outside its reference's tolerance: the report is written, the run fails."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SetLogic(_Model):
    """LIMIT set-logic queries with exact gold, generated (`logicrank generate setlogic`)."""

    per_template: int = Field(20, ge=1)
    seed: int = 0


class Synthetic(_Model):
    """ITLR's synthetic logical benchmark, generated from bundled SciFact text
    (pipelines/generate/synthetic.py): 32 templates of 3-term queries with 0 to 3 negations."""

    per_template: int = Field(10, ge=1)
    seed: int = 0


class RuleBenchSet(_Model):
    """A RuleBench set read from a path, converted as `logicrank prepare-rulebench` does: a
    set's directory as upstream publishes it (its rule base and query file found by the names
    the sets use, for ``split``), or explicit ``rules`` and ``queries`` files. A plain string
    is the directory."""

    dir: str | None = None
    rules: str | None = None
    queries: str | None = None
    split: str = "test"
    name: str | None = Field(None, description="The set's name in query ids (default: the directory's name).")

    @model_validator(mode="after")
    def _somewhere(self):
        if self.dir is None and (self.rules is None or self.queries is None):
            raise ValueError("rulebench: give the set's directory, or both rules and queries")
        return self

    @property
    def label(self) -> str:
        return " ".join(os.path.expandvars(p) for p in (self.dir, self.rules, self.queries) if p)


def _rulebench_set(v: Any) -> Any:
    return {"dir": v} if isinstance(v, str) else v


def _dataset_form(v: Any) -> Any:
    """A dataset given by name (``dataset: NAME`` or ``{name: NAME, ...}``): a bundled set, a
    registered one (:mod:`logicrank.pipelines.datasets.registry`) or ``irds:<id>``, spelled out
    as the fields it stands for (the name kept for the report)."""
    if isinstance(v, str):
        v = {"name": v}
    if not isinstance(v, dict) or v.get("name") is None:
        return v
    from logicrank.pipelines.datasets import registry

    name, rest = str(v["name"]), {k: x for k, x in v.items() if k != "name"}
    if name.startswith(registry.IRDS):
        return {"name": name, "irds": name.removeprefix(registry.IRDS), **rest}
    if name in registry.BUNDLED:
        return {"name": name, **registry.BUNDLED[name][1], **rest}
    held = registry.registered()
    if name in held:
        return {"name": name, **held[name].model_dump(exclude={"description"}), **rest}
    raise ValueError(f"no dataset named {name!r}; bundled: {', '.join(registry.BUNDLED)}; registered: {', '.join(held) or 'none'} "
                     f"(`logicrank datasets add`); or irds:<id> (ir_datasets)")


class Dataset(_Model):
    """Where the queries, qrels and corpus come from: exactly one of ``bundled`` (a set in
    pipelines/datasets), ``beir`` (a BEIR directory: corpus.jsonl, queries.jsonl,
    qrels/test.tsv), ``corpus`` with ``queries`` and ``qrels`` (three paths in any format
    `logicrank index`, `retrieve` and `evaluate` read: BEIR, JSONL, Parquet, TREC SGML and
    topics, TSV; ``format`` the corpus's, ``topics_field`` a TREC topics file's field), ``irds``
    (an ir_datasets id, read from the local ir_datasets cache; nothing is downloaded),
    ``rulebench`` (a RuleBench set, :class:`RuleBenchSet`), ``setlogic`` (LIMIT
    set-logic queries generated with exact gold), ``synthetic`` (ITLR's synthetic logical
    benchmark, generated; its qrels files: ``qrels/test.tsv`` each query's own positives,
    ``qrels/pooled.tsv`` every document judged, ``qrels/own.tsv`` each query's own documents)
    or ``qa`` (a multi-hop QA set, bundled or read from ``qa_src`` and, for MuSiQue,
    ``qa_corpus``, converted as `logicrank prepare-qa` does). Paths may name
    environment variables (``${LOGICRANK_RULEBENCH}``). ``sample``: that many queries drawn
    with ``seed``, or ``query_ids``: those queries (queries and qrels cut alike either way).
    A dataset may be given by name instead: ``dataset: scifact``, a name registered with
    `logicrank datasets add`, or ``dataset: irds:<id>``."""

    name: str | None = Field(None, description="The name the dataset was given by (bundled, registered or irds:<id>).")
    bundled: Literal["scifact"] | None = None
    beir: str | None = None
    corpus: str | None = Field(None, description="With queries and qrels: the corpus file or directory, in any format `logicrank index` reads.")
    queries: str | None = Field(None, description="With corpus: the queries file (BEIR JSONL, JSONL, Parquet, TSV, TREC topics).")
    format: Literal["auto", "beir", "jsonl", "parquet", "trec", "tsv"] = Field("auto", description="With corpus: the corpus format.")
    topics_field: Literal["title", "desc", "narr"] = Field("title", description="With corpus: a TREC topics file's field that is the query.")
    irds: str | None = Field(None, description="An ir_datasets id, read from the local ir_datasets cache (nothing is downloaded).")
    rulebench: Annotated[RuleBenchSet | None, BeforeValidator(_rulebench_set)] = None
    setlogic: SetLogic | None = None
    synthetic: Synthetic | None = None
    qa: Literal["musique", "hotpotqa"] | None = Field(None, description="A bundled multi-hop QA set, converted as `logicrank prepare-qa` does.")
    qa_src: str | None = Field(None, description="With qa: the set's question file instead of the bundled one (`prepare-qa --src`).")
    qa_corpus: str | None = Field(None, description="With qa: musique: the paragraph corpus file going with qa_src (`prepare-qa --corpus`).")
    qrels: str = Field("qrels/test.tsv", description="The qrels file inside a BEIR directory; with corpus, the qrels file (BEIR TSV or TREC).")
    sample: int | None = Field(None, ge=1)
    seed: int = 0
    query_ids: tuple[Annotated[str, BeforeValidator(str)], ...] | None = Field(
        None, min_length=1, description="Run only these queries (not with sample); numbers are read as ids.")

    @model_validator(mode="before")
    @classmethod
    def _by_name(cls, v: Any) -> Any:
        return _dataset_form(v)

    @model_validator(mode="after")
    def _one(self):
        if sum(x is not None for x in (self.bundled, self.beir, self.corpus, self.irds, self.rulebench, self.setlogic, self.synthetic,
                                       self.qa)) != 1:
            raise ValueError("give exactly one of bundled, beir, corpus (with queries and qrels), irds, rulebench, setlogic, synthetic, qa; "
                             "or a name")
        if (self.corpus is None) != (self.queries is None) or (self.corpus is not None and "qrels" not in self.model_fields_set):
            raise ValueError("corpus, queries and qrels go together: give all three paths")
        if self.corpus is None and (self.format != "auto" or self.topics_field != "title"):
            raise ValueError("format and topics_field describe the files of corpus, queries and qrels: give those with them")
        if self.qa is None and (self.qa_src is not None or self.qa_corpus is not None):
            raise ValueError("qa_src and qa_corpus name the files of a qa set: give qa (musique or hotpotqa) with them")
        if self.qa == "hotpotqa" and self.qa_corpus is not None:
            raise ValueError("qa_corpus is MuSiQue's paragraph corpus; HotpotQA's corpus is its questions' context (give qa_src alone)")
        if self.sample is not None and self.query_ids is not None:
            raise ValueError("give sample or query_ids, not both")
        return self

    @property
    def label(self) -> str:
        if self.qa is not None:
            where = (f"{self.qa} from {os.path.expandvars(self.qa_src)}" if self.qa_src else f"{self.qa} (bundled QA set)") + (
                f" (corpus {os.path.expandvars(self.qa_corpus)})" if self.qa_corpus else "")
        elif self.setlogic is not None:
            where = f"LIMIT set-logic queries ({self.setlogic.per_template} per template, seed {self.setlogic.seed})"
        elif self.synthetic is not None:
            where = (f"ITLR's synthetic logical benchmark from SciFact text ({self.synthetic.per_template} per template, "
                     f"seed {self.synthetic.seed}; qrels {self.qrels})")
        elif self.corpus is not None:
            where = (f"{self.name}: " if self.name else "") + (
                f"corpus {os.path.expandvars(self.corpus)}, queries {os.path.expandvars(self.queries or '')}, "
                f"qrels {os.path.expandvars(self.qrels)}")
        elif self.irds is not None:
            where = f"irds:{self.irds} (ir_datasets)"
        else:
            where = self.bundled or os.path.expandvars(self.beir or "") or f"RuleBench {self.rulebench.label if self.rulebench else ''}"
        if self.query_ids:
            return where + f", {len(self.query_ids)} queries ({', '.join(self.query_ids[:5])}{', ...' if len(self.query_ids) > 5 else ''})"
        return where + (f", a sample of {self.sample} queries (seed {self.seed})" if self.sample else "")


class Reference(_Model):
    """A figure the run must reproduce: ``run``'s ``measure`` within ``tolerance`` of ``value``."""

    run: str
    measure: str
    value: float
    tolerance: float = Field(ge=0)
    source: str = Field(description="Where the figure comes from (a paper, a published leaderboard, a reference computation).")


class Experiment(_Model):
    """One benchmark (module docstring)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    title: str
    dataset: Dataset
    index: dict[str, Any] = Field(default_factory=dict, description="IndexConfig fields besides corpus and db (e.g. ann_threshold).")
    embed: dict[str, Any] = Field(default_factory=dict, description="EmbedConfig fields the benchmark fixes for index and queries alike (e.g. title_sep).")
    pipelines: dict[str, Any] | None = Field(None, description="Named pipelines (run id -> stages), as in a pipelines file; "
                                             "'{dataset}' in an option stands for the dataset's directory (e.g. {dataset}/answers.jsonl).")
    presets: tuple[str, ...] = Field((), description="--method presets (pipelines/presets/), run beside the pipelines.")
    set: dict[str, Any] = Field(default_factory=dict, description="Stage options over the pipelines and presets, STAGE.OPTION or "
                                "RUN/STAGE.OPTION -> value (the --set grammar: e.g. orlog.k: 20).")
    measures: tuple[str, ...] = ("nDCG@10", "P@1", "R@100", "MRR", "MAP", "F1@10")
    baseline: str | None = Field(None, description="The run the others are tested against (default: the first).")
    group_by: tuple[str, ...] = Field((), description="Query fields (in the queries file) to group per-query figures by, e.g. template.")
    qa_measures: tuple[str, ...] = Field((), description="QA measures (EM, TokenF1, Acc, Judge) of the runs that answer (LAG's answers "
                                         "side table) against the dataset's gold answers (a qa dataset's answers.jsonl, or gold).")
    gold: str | None = Field(None, description="Gold answers for qa_measures (default: a qa dataset's {dataset}/answers.jsonl).")
    references: tuple[Reference, ...] = ()
    caveats: tuple[str, ...] = ()
    trec: bool = Field(False, description="Also write TREC run files.")

    @model_validator(mode="after")
    def _something_to_run(self):
        """Everything checked before any work: the pipelines, the presets and their options, the measures."""
        from logicrank.pipelines.evaluate.measures import parse_measures

        names = list(self.pipelines_to_run())
        measures = [str(m) for m in parse_measures(self.measures)]
        fixed = sorted({"corpus", "db", "embed", "ray"} & set(self.index))
        if fixed:
            raise ValueError(f"index: {fixed} come from the dataset, the embed key and the command line, not the index recipe")
        for key, config, values in (("embed", EmbedConfig, self.embed), ("index", IndexConfig, {"corpus": "-", "db": "-", **self.index})):
            try:
                config.model_validate(values)
            except ValidationError as exc:
                raise ValueError(f"{key}: {validation_line(exc, config)}") from None
        if self.qa_measures:
            from logicrank.pipelines.evaluate.qa import parse_qa_measures

            measures += parse_qa_measures(self.qa_measures)
            if self.gold is None and self.dataset.qa is None:
                raise ValueError("qa_measures need gold answers: a qa dataset, or gold (an answers.jsonl)")
        elif self.gold is not None:
            raise ValueError("gold is only read for qa_measures")
        off = [f"{r.run} {r.measure}" for r in self.references if _measure_name(r.measure) not in measures]
        if off:
            raise ValueError(f"references name measure(s) not among the measures {measures}: {off}")
        unknown = sorted({r.run for r in self.references} - set(names)) + ([self.baseline] if self.baseline and self.baseline not in names else [])
        if unknown:
            raise ValueError(f"references or baseline name runs that are not among the pipelines {names}: {unknown}")
        return self


    def pipelines_to_run(self, dataset: str | Path | None = None) -> dict[str, tuple[Any, ...]]:
        """The named pipelines this experiment runs: its pipelines and presets, with ``set``
        applied, validated; ``dataset``: the directory '{dataset}' in an option stands for."""
        from logicrank.pipelines.pipeline import parse_pipelines, read_presets, with_sets

        if not self.pipelines and not self.presets:
            raise ValueError("give pipelines or presets (or both)")
        spec = _in_dataset(dict(self.pipelines or {}), str(dataset)) if dataset is not None else dict(self.pipelines or {})
        out = dict(parse_pipelines(spec)) if spec else {}
        if self.presets:
            presets = read_presets(self.presets)
            both = sorted(set(out) & set(presets))
            if both:
                raise ValueError(f"pipelines and presets both name {both}")
            out.update(presets)
        return with_sets(out, _in_dataset(self.set, str(dataset)) if dataset is not None else self.set)


def load(path: str | Path) -> Experiment:
    """An experiment file (or the name of one in jobs/experiments/, e.g. ``scifact``); a
    mistake is one line naming the file and the key."""
    from logicrank.pipelines.files import read_yaml

    path = Path(path)
    if not path.exists() and (EXPERIMENTS / f"{path.name}.yaml").is_file() and path.name == str(path):
        path = EXPERIMENTS / f"{path.name}.yaml"
    data = read_yaml(path, "experiment", ExperimentError)
    try:
        return Experiment.model_validate(data)
    except ValidationError as exc:
        raise ExperimentError(f"experiment {path}: {validation_line(exc, Experiment)}") from None


def override(exp: Experiment, changes: dict[str, Any] | list[str]) -> Experiment:
    """``exp`` with overrides (``--set KEY=VALUE`` items, or a mapping of them): a stage option
    by the stage's name (``orlog.k``, ``orlog/bm25.k``: :mod:`logicrank.pipelines.overrides`,
    kept in the experiment's ``set``), else a dotted place in the experiment
    (``dataset.sample``; a key that is not there is added, and validated). The file's
    references are figures of its own dataset and pipelines: a change to the dataset, or to a
    pipeline a reference names, drops them (a caveat says so)."""
    from logicrank.pipelines.overrides import is_stage_key, parse_sets

    changes = parse_sets(changes)
    spec = exp.model_dump(mode="json", exclude_none=True)
    runs = exp.pipelines_to_run()
    for key, value in changes.items():
        if is_stage_key(key, runs):
            spec["set"] = {**spec.get("set", {}), key: value}
            continue
        *path, last = key.split(".")
        if path[:1] == ["pipelines"] and len(path) > 1:
            raise ExperimentError(f"experiment {exp.name}: --set {key}: address a stage's option by its name (STAGE.OPTION or "
                                  "RUN/STAGE.OPTION, e.g. orlog/bm25.k), not by its place in the file")
        node: Any = spec
        try:
            for part in path:  # a number indexes a list (references.0.value)
                node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
            if isinstance(node, list):
                node[int(last)] = value
            else:
                node[last] = value
        except (ValueError, IndexError, TypeError, AttributeError):
            raise ExperimentError(f"experiment {exp.name}: --set {key}: no such place in the experiment") from None
    try:
        got = Experiment.model_validate(spec)
    except ValidationError as exc:
        raise ExperimentError(f"experiment {exp.name}: {validation_line(exc, Experiment)}") from None
    everything = not _same_data(got.dataset, exp.dataset) or any(getattr(got, f) != getattr(exp, f) for f in ("embed", "index"))
    after = got.pipelines_to_run()
    moved = [r for r in got.references if everything or after.get(r.run) != runs.get(r.run)]
    if moved:
        kept = tuple(r for r in got.references if r not in moved)
        got = got.model_copy(update={"references": kept, "caveats": (
            *got.caveats, f"{len(moved)} of the file's references (figures of its own queries and pipelines) are not checked on this run.")})
    return got


def _same_data(a: Dataset, b: Dataset) -> bool:
    """The same queries and corpus: paths compared with their variables expanded and resolved
    (``${LOGICRANK_RULEBENCH}`` and the directory it names are one dataset)."""
    def norm(d: Dataset) -> dict:
        def resolved(p: str | None) -> str | None:
            return None if p is None else str(Path(os.path.expandvars(p)).resolve())

        out = d.model_dump(exclude={"name"})
        for k in ("beir", "corpus", "queries"):
            out[k] = resolved(out[k])
        if d.corpus is not None:
            out["qrels"] = resolved(out["qrels"])
        if out["rulebench"] is not None:
            out["rulebench"] |= {k: resolved(out["rulebench"][k]) for k in ("dir", "rules", "queries")}
        return out

    return norm(a) == norm(b)


def with_sample(exp: Experiment, sample: int | None, seed: int | None) -> Experiment:
    """``exp`` on a sample of its dataset's queries (``None`` keeps the file's value; a seed
    alone, with no sample in the file either, draws nothing and changes nothing); a sample
    replaces the file's ``query_ids``."""
    if sample is None and exp.dataset.sample is None:
        return exp
    changes = {f"dataset.{k}": v for k, v in (("sample", sample), ("seed", seed)) if v is not None}
    return override(exp, changes | ({"dataset.query_ids": None} if sample is not None else {}))  # a sample replaces the file's queries


@dataclass
class ReferenceCheck:
    reference: Reference
    got: float | None  # None: the run or the measure is not in the results

    @property
    def ok(self) -> bool:
        return self.got is not None and abs(self.got - self.reference.value) <= self.reference.tolerance


@dataclass
class ExperimentResult:
    """What a run of an experiment gives: the per-query metrics (METRICS), the summary (runs
    x measures), the significance tests, the grouped means, the reference checks, the
    report and the runs' files."""

    experiment: Experiment
    metrics: pa.Table
    summary: pd.DataFrame
    significance: pa.Table | None
    groups: dict[str, pd.DataFrame]
    checks: list[ReferenceCheck]
    report: Path
    runs: dict[str, Path]
    table_version: int  # the version of the table the pipelines read
    index: Any = None  # the index job's summary (logicrank.jobs.index.IndexSummary) when the run indexed the corpus
    timings: dict[str, float] = field(default_factory=dict)
    stages: dict[str, list[dict]] = field(default_factory=dict)  # run id -> its stages' counts (the retrieve manifest's)
    dataset: Path | None = None  # the dataset's directory (a generated or converted one's, under out)
    depths: dict[str, int] = field(default_factory=dict)  # run id -> its depth, the most documents it holds for a query

    @property
    def reproduced(self) -> bool:
        return all(c.ok for c in self.checks)


def prepared(exp: Experiment, out: Path) -> tuple[Path, Path, Path, Path, dict[str, tuple[Any, ...]], Path | None]:
    """Everything an experiment needs before any work, checked: (corpus, queries, qrels, the
    dataset's directory, the pipelines to run, the gold answers of the queries run or None);
    a conversion or a sample is written under ``out``."""
    corpus, queries, qrels = prepare_dataset(exp.dataset, out)
    for column in exp.group_by:
        _group_of(queries, column)
    root = dataset_root(exp.dataset, out)
    gold = None
    if exp.qa_measures:
        gold = Path(_expand(_in_dataset(exp.gold, str(root)))) if exp.gold else root / "answers.jsonl"
        gold = _gold_of(gold, queries, out / "sample" / "answers.jsonl")
    try:
        pipelines = exp.pipelines_to_run(root)
    except ValueError as exc:
        raise ExperimentError(f"experiment {exp.name}: {exc}") from None
    return corpus, queries, qrels, root, pipelines, gold


def conclude(exp: Experiment, metrics: pa.Table, significance: pa.Table | None, queries: Path, out: Path, table_version: int,
             runs: dict[str, Path], stages: dict[str, list[dict]], timings: dict[str, float], dataset: Path | None = None,
             index: Any = None, strict: bool = True) -> ExperimentResult:
    """An experiment's end, wherever it ran: the summary, the groups, the reference checks,
    the report ``out/experiment.md``; a missed reference raises :class:`ReferenceMissed` after
    the report is written (``strict``)."""
    from logicrank.pipelines.evaluate.core import run_depth
    from logicrank.pipelines.evaluate.report import summary_frame

    summary = summary_frame(metrics)
    depths = {rid: run_depth(pq.read_table(path, columns=["query_id"])) for rid, path in runs.items()}
    groups = {g: grouped(metrics, queries, g) for g in exp.group_by}
    checks = [ReferenceCheck(r, _value(summary, r.run, r.measure)) for r in exp.references]
    result = ExperimentResult(exp, metrics, summary, significance, groups, checks, out / "experiment.md", runs, table_version, index,
                              timings, stages, dataset, depths)
    write_text_atomic(render(result), result.report)
    missed = [c for c in checks if not c.ok]
    if missed and strict:
        raise ReferenceMissed(f"experiment {exp.name}: {len(missed)} reference figure(s) missed: " + "; ".join(
            f"{c.reference.run} {c.reference.measure} {_fmt(c.got)} vs {c.reference.value} ± {c.reference.tolerance}" for c in missed)
            + f" (report: {result.report})")
    return result


def run_in_process(exp: Experiment, ctx: Any, out: str | Path, strict: bool = True, cache: Any = None, judge: Any = None) -> ExperimentResult:
    """Run ``exp`` over a table that exists (``ctx``: the :class:`~logicrank.pipelines.stages.Context`
    of a table indexed from the experiment's corpus, as ``lr.open_table`` makes), in this
    process, without Ray: its pipelines through :mod:`logicrank.pipelines.runner`, then
    evaluate and :func:`conclude`. Runs go to ``out/runs/<run id>.parquet``, a LAG stage's
    answers to ``out/answers/``. ``cache``: a :class:`~logicrank.pipelines.runner.StageCache`
    (default: ``out/stages``, keyed as the retrieve job keys it); ``judge``: the LLM judge of
    the Judge measure."""
    import time

    from logicrank.pipelines.evaluate.qa import read_gold, read_predictions
    from logicrank.pipelines.evaluate.runs import evaluate_runs
    from logicrank.pipelines.files import write_parquet_atomic
    from logicrank.pipelines.io import read_qrels, read_queries
    from logicrank.pipelines.pipeline import Pipeline
    from logicrank.pipelines.runner import StageCache

    out = Path(out)
    _, queries, qrels, root, pipelines, gold = prepared(exp, out)
    asked = read_queries(queries)
    cache = cache if cache is not None else StageCache(out / "stages")
    runs, stages, answers, timings = {}, {}, {}, {}
    t = time.perf_counter()
    for rid, steps in pipelines.items():
        result = Pipeline(rid, steps).run(ctx, asked, cache)
        runs[rid] = write_parquet_atomic(result.run, out / "runs" / f"{rid}.parquet")
        stages[rid] = result.steps
        if f"answers/{rid}" in result.side:
            answers[rid] = read_predictions(write_parquet_atomic(result.side[f"answers/{rid}"], out / "answers" / f"{rid}.parquet"))
    timings["retrieve"] = time.perf_counter() - t
    if exp.qa_measures and not answers:
        raise ExperimentError(f"experiment {exp.name}: qa_measures, but no pipeline answers (a LAG stage writes answers)")
    t = time.perf_counter()
    ev = evaluate_runs([pq.read_table(p) for p in runs.values()], read_qrels(qrels), exp.measures, exp.baseline,
                       run_ids=list(runs),  # every pipeline's run, one that retrieved nothing a row of zeros
                       answers=answers if exp.qa_measures else None, gold=read_gold(gold) if gold else None,
                       qa_measures=exp.qa_measures, judge=judge)
    timings["evaluate"] = time.perf_counter() - t
    return conclude(exp, ev.metrics, ev.significance, queries, out, ctx.store.version, runs, stages, timings, root, strict=strict)


def prepare_dataset(d: Dataset, out: Path) -> tuple[Path, Path, Path]:
    """(corpus, queries, qrels) of the dataset; a conversion or a sample is written under ``out``."""
    if d.bundled is not None:
        from logicrank.pipelines import datasets

        data = getattr(datasets, d.bundled)()
        corpus, root, qrels = Path(data.corpus), Path(data.queries).parent, str(Path(data.qrels).relative_to(Path(data.queries).parent))
    else:
        if d.rulebench is not None:
            from logicrank.pipelines.datasets.rulebench import to_beir

            r = d.rulebench
            to_beir(_maybe(r.dir), out / "beir", _maybe(r.rules), _maybe(r.queries), split=r.split, name=r.name)
            root, qrels = out / "beir", "qrels/test.tsv"
        elif d.qa is not None:
            from logicrank.pipelines.datasets.qa import to_beir as qa_to_beir

            qa_to_beir(d.qa, out / "beir", _maybe(d.qa_src), _maybe(d.qa_corpus))
            root, qrels = out / "beir", "qrels/test.tsv"
        elif d.setlogic is not None:
            from logicrank.pipelines.generate.setlogic import generate

            generate(out / "data", per_template=d.setlogic.per_template, seed=d.setlogic.seed)
            root, qrels = out / "data", "qrels/test.tsv"
        elif d.synthetic is not None:
            from logicrank.pipelines import datasets
            from logicrank.pipelines.generate.synthetic import generate as synthetic

            synthetic(datasets.scifact().corpus, out / "data", per_template=d.synthetic.per_template, seed=d.synthetic.seed)
            root, qrels = out / "data", d.qrels
        elif d.irds is not None:
            from logicrank.pipelines.datasets.registry import DatasetError, irds_to_beir

            try:
                root, qrels = irds_to_beir(d.irds, out / "irds"), "qrels/test.tsv"
            except DatasetError as exc:
                raise ExperimentError(f"dataset {exc}") from None
        elif d.corpus is not None:
            return _from_files(d, out)
        else:
            root, qrels = Path(_expand(d.beir)), d.qrels
        missing = [str(f) for f in (root / "queries.jsonl", root / qrels) if not f.is_file()]
        if not (root / "corpus.jsonl").is_file() and not (root / "corpus.jsonl.gz").is_file():
            missing.insert(0, str(root / "corpus.jsonl"))
        if missing:
            raise ExperimentError(f"dataset {d.label}: no {', '.join(missing)} (a BEIR directory holds corpus.jsonl(.gz), queries.jsonl and {qrels})")
        corpus = root
    queries, qrels_path = sample_queries(root, d.sample, d.seed, out / "sample", qrels=qrels, ids=d.query_ids)
    return corpus, queries, qrels_path


def _from_files(d: Dataset, out: Path) -> tuple[Path, Path, Path]:
    """(corpus, queries, qrels) of a dataset given as three files in any format the jobs read:
    the queries and qrels read by the readers `retrieve` and `evaluate` use and written as a
    BEIR queries.jsonl and qrels/test.tsv under ``out/data`` (so sampling and grouping read
    one form); the corpus stays where it is, read by the index job in its ``format``."""
    from logicrank.pipelines.io import read_qrels, read_queries

    corpus, queries, qrels = (Path(_expand(p)) for p in (d.corpus, d.queries, d.qrels))
    missing = [f"{what} {p}" for what, p in (("corpus", corpus), ("queries", queries), ("qrels", qrels)) if not p.exists()]
    if missing:
        raise ExperimentError(f"dataset: no such path: {'; '.join(missing)}")
    try:
        asked, judged = read_queries(queries, d.topics_field), read_qrels(qrels)
    except UserError as exc:
        raise ExperimentError(f"dataset: {exc}") from None
    root = out / "data"
    logical = asked.column("logical_query").to_pylist() if "logical_query" in asked.column_names else [None] * asked.num_rows
    write_text_atomic("".join(json.dumps({"_id": q, "text": t, **({"logical_query": lq} if lq else {})}) + "\n" for q, t, lq in zip(
        asked.column("query_id").to_pylist(), asked.column("text").to_pylist(), logical, strict=True)), root / "queries.jsonl")
    write_text_atomic("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{doc}\t{r}\n" for q, doc, r in zip(
        *(judged.column(c).to_pylist() for c in ("query_id", "doc_id", "relevance")), strict=True)), root / "qrels" / "test.tsv")
    q, r = sample_queries(root, d.sample, d.seed, out / "sample", qrels="qrels/test.tsv", ids=d.query_ids)
    return corpus, q, r


def _gold_of(gold: Path, queries: Path, to: Path) -> Path:
    """The gold answers of the queries run: ``gold`` itself, or its lines of a sample's
    queries written to ``to`` (a gold question without an answer would score 0)."""
    if not gold.is_file():
        raise ExperimentError(f"gold answers: no file at {str(gold)!r} (prepare-qa writes one; prepare-rulebench when every record has a "
                              "text output, and says which has none)")
    keep = set(_group_of(queries, None))
    lines = [line for line in gold.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [line for line in lines if str(json.loads(line)["query_id"]) in keep]
    if len(kept) == len(lines):
        return gold
    write_text_atomic("".join(line + "\n" for line in kept), to)
    return to


def sample_queries(beir: Path, n: int | None, seed: int, out: Path, qrels: str = "qrels/test.tsv",
                   ids: tuple[str, ...] | None = None) -> tuple[Path, Path]:
    """The queries and qrels of a BEIR directory to run: all of them, ``n`` drawn with
    ``seed`` among the queries the qrels judge, or those of ``ids`` (both files cut to the
    same queries, in ``out``: evaluation averages over the qrels' queries)."""
    queries, qrels = beir / "queries.jsonl", beir / qrels
    if n is None and ids is None:
        return queries, qrels
    rows = qrels.read_text(encoding="utf-8").splitlines()
    judged = {r.split("\t")[0] for r in rows[1:] if r.strip()}
    # drawn among the queries the qrels judge (evaluation averages over those): a BEIR queries
    # file may hold other splits' queries too
    lines = [line for line in queries.read_text(encoding="utf-8").splitlines() if line.strip() and str(json.loads(line)["_id"]) in judged]
    if ids is not None:
        position = {str(json.loads(line)["_id"]): i for i, line in enumerate(lines)}
        missing = [q for q in ids if q not in position]
        if missing:
            raise ExperimentError(f"dataset query_ids: {missing[:5]} not among the queries the qrels judge ({len(missing)} of {len(ids)})")
        picked = sorted({position[q] for q in ids})
    elif not 1 <= n <= len(lines):
        raise ExperimentError(f"dataset sample {n}: must be between 1 and {len(lines)} (the queries the qrels judge)")
    else:
        picked = sorted(random.Random(seed).sample(range(len(lines)), n))
    keep = {str(json.loads(lines[i])["_id"]) for i in picked}
    out_q, out_r = out / "queries.jsonl", out / "qrels.tsv"
    write_text_atomic("".join(lines[i] + "\n" for i in picked), out_q)
    write_text_atomic("\n".join([rows[0], *(r for r in rows[1:] if r.split("\t")[0] in keep)]) + "\n", out_r)
    return out_q, out_r


def dataset_root(d: Dataset, out: Path) -> Path:
    """The directory the dataset's files are in (before any sample)."""
    if d.bundled is not None:
        from logicrank.pipelines import datasets

        return Path(getattr(datasets, d.bundled)().queries).parent
    if d.beir is not None:
        return Path(_expand(d.beir))
    if d.irds is not None:
        return out / "irds"
    return out / ("data" if d.setlogic is not None or d.synthetic is not None or d.corpus is not None else "beir")


def _in_dataset(value: Any, root: str) -> Any:
    """``value`` with every '{dataset}' in its strings replaced by the dataset's directory."""
    if isinstance(value, str):
        return value.replace("{dataset}", root)
    if isinstance(value, dict):
        return {k: _in_dataset(v, root) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_in_dataset(v, root) for v in value]
    return value


def _expand(path: str) -> str:
    expanded = os.path.expandvars(path)
    if "$" in expanded:
        raise ExperimentError(f"dataset path {path!r}: an environment variable in it is not set")
    return expanded


def _maybe(path: str | None) -> str | None:
    return _expand(path) if path else None


def _measure_name(text: str) -> str:
    """A retrieval or QA measure's canonical name (``ndcg@10`` -> ``nDCG@10``, ``em`` -> ``EM``)."""
    from logicrank.pipelines.evaluate.measures import parse_measure
    from logicrank.pipelines.evaluate.qa import QAError, parse_qa_measures

    try:
        return parse_qa_measures([text])[0]
    except QAError:
        return str(parse_measure(text))


def _value(summary: pd.DataFrame, run: str, measure: str) -> float | None:
    name = _measure_name(measure)
    return float(summary.loc[run, name]) if run in summary.index and name in summary.columns else None


def grouped(metrics: pa.Table, queries: Path, column: str) -> pd.DataFrame:
    """Mean of each run's per-query values by a field of the queries file (rows: (run, group);
    columns: measures; plus the number of queries per group)."""
    from logicrank.schemas.tables import AGGREGATE_QUERY_ID

    groups = _group_of(queries, column)
    df = metrics.to_pandas()
    df = df[df["query_id"] != AGGREGATE_QUERY_ID]
    df[column] = df["query_id"].map(groups)
    table = df.pivot_table(index=["run_id", column], columns="measure", values="value", aggfunc="mean", sort=False)
    counts = df[df["measure"] == df["measure"].iloc[0]].groupby(["run_id", column], sort=False).size()
    return table.assign(queries=counts.astype(int))


def _group_of(queries: Path, column: str | None) -> dict[str, str]:
    """query id -> its value of ``column`` (a top-level field of the queries file, or under
    metadata; None: the id itself)."""
    from logicrank.pipelines.files import read_jsonl

    groups = {}
    for _, row in read_jsonl(queries, "group_by: queries", ExperimentError):
        qid = str(row.get("_id", row.get("query_id")))
        value = qid if column is None else row.get(column, (row.get("metadata") or {}).get(column))
        if value is None:
            raise ExperimentError(f"group_by {column!r}: query {qid} has no such field")
        groups[qid] = str(value)
    return groups


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def render(r: ExperimentResult) -> str:
    """The experiment's one report (Markdown)."""
    from logicrank.pipelines.evaluate.report import DEPTH_NOTE, depth_cell

    exp = r.experiment
    d = exp.dataset
    lines = [f"# {exp.title}", "", f"Dataset: {d.label} (table v{r.table_version}); measures over the qrels' queries "
             "(a query a run misses scores 0, trec_eval -c).", ""]
    measures = list(r.summary.columns)
    lines += table(["run", "depth", *measures], ([run, depth_cell(r.depths, run), *(f"{row[m]:.4f}" for m in measures)]
                                                 for run, row in r.summary.iterrows()), "lr" + "r" * len(measures))
    lines += ["", DEPTH_NOTE]
    if r.significance is not None and r.significance.num_rows:
        sig = r.significance.to_pandas()
        lines += ["", f"Against `{sig['baseline'].iloc[0]}` ({sig['test'].iloc[0]}, {sig['correction'].iloc[0]} within each measure; "
                  "* significant):", ""]
        lines += table(["run", "measure", "mean", "baseline", "p adjusted"],
                       ([s.run_id, s.measure, f"{s.mean_run:.4f}", f"{s.mean_baseline:.4f}", f"{s.p_adjusted:.3g}{' *' if s.significant else ''}"]
                        for s in sig.itertuples()), "llrrr")
    for column, by in r.groups.items():
        cols = [c for c in by.columns if c != "queries"]
        lines += ["", f"By {column}:", ""]
        lines += table(["run", column, "queries", *cols], ([run, g, int(row["queries"]), *(f"{row[c]:.4f}" for c in cols)]
                                                          for (run, g), row in by.iterrows()), "llr" + "r" * len(cols))
    if r.checks:
        lines += ["", "References:", ""]
        lines += table(["run", "measure", "here", "reference", "tolerance", "source", ""],
                       ([c.reference.run, c.reference.measure, _fmt(c.got), c.reference.value, c.reference.tolerance, c.reference.source,
                         "reproduced" if c.ok else "**missed**"] for c in r.checks), "llrrrll")
    if r.stages:
        lines += ["", "Stages (the retrieve manifest's counts):", ""]
        lines += [f"- `{rid}`: " + "; ".join(_stage_counts(c) for c in stages) for rid, stages in r.stages.items()]
    if exp.caveats:
        lines += [""] + [f"**{c}**" for c in exp.caveats]
    lines += ["", "Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in r.timings.items()) + ".", ""]
    return "\n".join(lines)


def _stage_counts(counts: dict) -> str:
    """One stage's manifest entry in a line of words: its name, then its counts (names with
    spaces, nested ones in parentheses, lists joined, nothing as "none", no Python reprs)."""
    def fmt(v: Any) -> str:
        if isinstance(v, dict):
            return "(" + ", ".join(f"{words(k)} {fmt(x)}" for k, x in v.items()) + ")" if v else "none"
        if isinstance(v, list | tuple):
            return ", ".join(map(fmt, v)) if v else "none"
        if v is None:
            return "none"
        if isinstance(v, bool):
            return "yes" if v else "no"
        return number(v) if isinstance(v, float) else str(v)

    def words(key: str) -> str:
        return key.replace("_", " ")

    if "sub" in counts:  # a fusion's sub-pipeline
        return counts["stage"] + " (" + "; ".join(_stage_counts(c) for c in counts["sub"]) + ")"
    shown = {k: v for k, v in counts.items() if k not in ("stage", "digest", "cached", "placement")}
    body = ", ".join(f"{words(k)} {fmt(v)}" for k, v in shown.items())
    return counts["stage"] + (" (cached)" if counts.get("cached") else "") + (f" ({body})" if body else "")
