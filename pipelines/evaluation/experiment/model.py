"""An experiment as a value: its dataset, pipelines, measures, references and caveats (pydantic
models), read from a YAML file (:func:`load`), changed by overrides (:func:`override`) or drawn
down to a sample of its queries (:func:`with_sample`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig
from logicrank.schemas.errors import JobFailed, UserError, validation_line

EXPERIMENTS = Path(__file__).parents[3] / "jobs" / "experiments"  # the experiment files that ship (package data of logicrank.jobs)


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



def _query_id(value: Any) -> str:
    """A query id as written: YAML reads ``1.10`` as 1.1 and ``0x1F`` as 31, so a number that is
    not a whole one is refused (write ids in quotes); a whole number (``51``) is its digits."""
    if isinstance(value, float) or type(value).__name__ in ("bool", "bool_"):
        raise ValueError(f"query id {value!r}: YAML read it as a number or a yes or no, whose text may not be what was typed; write it in quotes")
    return str(value)

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
    qa_corpus: str | None = Field(None, description="With qa: musique: the paragraph corpus file going with qa_src (`prepare-qa --corpus`; default: its questions' paragraphs).")
    qrels: str = Field("qrels/test.tsv", description="The qrels file inside a BEIR directory; with corpus, the qrels file (BEIR TSV or TREC).")
    sample: int | None = Field(None, ge=1)
    seed: int = 0
    query_ids: tuple[Annotated[str, BeforeValidator(_query_id)], ...] | None = Field(
        None, min_length=1, description="Run only these queries (not with sample); whole numbers are read as ids.")

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
        if self.qrels != "qrels/test.tsv" and self.beir is None and self.corpus is None and self.synthetic is None:
            # (a bundled, qa, rulebench, setlogic or irds set is read with its own qrels/test.tsv: another split given was ignored)
            raise ValueError(f"qrels {self.qrels!r}: only a beir directory, corpus files or a synthetic set take a qrels file; "
                             "this dataset is judged by its own qrels/test.tsv")
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
    presets: tuple[str, ...] = Field((), description="--method presets (pipelines/retrieval/presets/), run beside the pipelines.")
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
    ignore_identical_ids: bool = Field(False, description="Drop the run rows whose document id is their query's id before measuring, "
                                       "as BEIR's evaluation does (its ArguAna and Quora hold each query in the corpus).")

    @model_validator(mode="after")
    def _something_to_run(self):
        """Everything checked before any work: the pipelines, the presets and their options, the measures."""
        from logicrank.pipelines.evaluation.measures import parse_measures

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
            from logicrank.pipelines.evaluation.qa import parse_qa_measures

            measures += parse_qa_measures(self.qa_measures)
            if self.gold is None and self.dataset.qa is None:
                raise ValueError("qa_measures need gold answers: a qa dataset, or gold (an answers.jsonl)")
        elif self.gold is not None:
            raise ValueError("gold is only read for qa_measures")
        off = [f"{r.run} {r.measure}" for r in self.references if measure_name(r.measure) not in measures]
        if off:
            raise ValueError(f"references name measure(s) not among the measures {measures}: {off}")
        unknown = sorted({r.run for r in self.references} - set(names)) + ([self.baseline] if self.baseline and self.baseline not in names else [])
        if unknown:
            raise ValueError(f"references or baseline name runs that are not among the pipelines {names}: {unknown}")
        return self


    def pipelines_to_run(self, dataset: str | Path | None = None) -> dict[str, tuple[Any, ...]]:
        """The named pipelines this experiment runs: its pipelines and presets, with ``set``
        applied, validated; ``dataset``: the directory '{dataset}' in an option stands for."""
        from logicrank.pipelines.retrieval.pipeline import parse_pipelines, read_presets, with_sets

        if not self.pipelines and not self.presets:
            raise ValueError("give pipelines or presets (or both)")
        spec = in_dataset(dict(self.pipelines or {}), str(dataset)) if dataset is not None else dict(self.pipelines or {})
        out = dict(parse_pipelines(spec)) if spec else {}
        if self.presets:
            presets = read_presets(self.presets)
            both = sorted(set(out) & set(presets))
            if both:
                raise ValueError(f"pipelines and presets both name {both}")
            out.update(presets)
        return with_sets(out, in_dataset(self.set, str(dataset)) if dataset is not None else self.set)


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
    by the stage's name (``orlog.k``, ``orlog/bm25.k``: :mod:`logicrank.pipelines.retrieval.overrides`,
    kept in the experiment's ``set``; ``orlog.k`` replaces the file's ``RUN/orlog.k`` keys too,
    as the command line beats the file), else a dotted place in the experiment
    (``dataset.sample``; a key that is not there is added, and validated). The file's
    references are figures of its own dataset and pipelines: a change to the dataset, or to a
    pipeline a reference names, drops them (a caveat says so)."""
    from logicrank.pipelines.retrieval.overrides import is_stage_key, parse_sets

    changes = parse_sets(changes)
    spec = exp.model_dump(mode="json", exclude_none=True)
    runs = exp.pipelines_to_run()
    if "dataset.name" in changes:  # another dataset by name: its own fields, not the old name's spelled-out ones (which won)
        spec["dataset"] = {k: v for k, v in spec.get("dataset", {}).items() if k in ("sample", "seed", "query_ids")}
    for key, value in changes.items():
        if is_stage_key(key, runs):
            held = spec.get("set", {})
            if "/" not in key.rpartition(".")[0]:  # every run's option: the file's keys of one run for it give way too
                held = {k: v for k, v in held.items() if k.rpartition("/")[2] != key}
            spec["set"] = {**held, key: value}
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
    # what every figure is measured on: the data, the vectors, the index, the run rows measured (BEIR's rule for a
    # query's own id) and the QA measures' gold answers
    everything = not _same_data(got.dataset, exp.dataset) or any(getattr(got, f) != getattr(exp, f)
                                                                 for f in ("embed", "index", "ignore_identical_ids", "gold"))
    after = got.pipelines_to_run()
    moved = [r for r in got.references if everything or after.get(r.run) != runs.get(r.run)]
    if moved:
        kept = tuple(r for r in got.references if r not in moved)
        got = got.model_copy(update={"references": kept, "caveats": (
            *got.caveats, f"{len(moved)} of the file's references (figures of its own queries and pipelines) are not checked on this run.")})
    return got


def with_encoder(exp: Experiment, embed: EmbedConfig) -> Experiment:
    """``exp`` as run with the encoder ``embed``: where its vectors are not
    those the file was written for (its ``embed``, else the default encoder's), the encoder is
    set in it as an override is, so the references (figures of that encoder) are not checked
    and a caveat says so. A file without ``embed`` run with ``--model X`` (or on a table of
    another encoder) checked X's dense figures against all-MiniLM-L6-v2's published ones."""
    from logicrank.pipelines.engines.embed import model_id

    if model_id(embed) == model_id(EmbedConfig.model_validate(exp.embed)):
        return exp
    return override(exp, {"embed.model": embed.model, "embed.max_seq_length": embed.max_seq_length})


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


def in_dataset(value: Any, root: str) -> Any:
    """``value`` with every '{dataset}' in its strings replaced by the dataset's directory."""
    if isinstance(value, str):
        return value.replace("{dataset}", root)
    if isinstance(value, dict):
        return {k: in_dataset(v, root) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [in_dataset(v, root) for v in value]
    return value



def measure_name(text: str) -> str:
    """A retrieval or QA measure's canonical name (``ndcg@10`` -> ``nDCG@10``, ``em`` -> ``EM``)."""
    from logicrank.pipelines.evaluation.measures import parse_measure
    from logicrank.pipelines.evaluation.qa import QAError, parse_qa_measures

    try:
        return parse_qa_measures([text])[0]
    except QAError:
        return str(parse_measure(text))


