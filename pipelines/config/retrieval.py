"""The configs that hold pipelines or decomposition kinds, validated by the registries: the
retrieve job's (named pipelines over one table, validated by the stage registry: a pipeline
that cannot run fails here, before Ray starts or a model loads), the decompose job's (kinds from
the decomposition registry) and the nightly job's (its index job, query sets, pipelines,
measures and regression rules, retention, alert receivers; and what defines a night). The
settings they build on are in :mod:`logicrank.pipelines.config.settings`."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from logicrank.pipelines.config.base import OUTSIDE, UNHASHED
from logicrank.pipelines.config.base import Config as _Config
from logicrank.pipelines.config.embedding import EmbedConfig
from logicrank.pipelines.config.settings import EvaluateConfig, IndexConfig, LLMConfig, RayConfig, distinct
from logicrank.pipelines.evaluation.measures import parse_measures
from logicrank.pipelines.llm.decompose import KINDS
from logicrank.pipelines.retrieval.options import StageOptions
from logicrank.pipelines.retrieval.pipeline import parse_pipelines, read_presets, validate


def with_option(value: Any, name: str, setting: Any) -> Any:
    """Stage options (a stage, or tuples of them, sub-pipelines included) with option ``name``
    set to ``setting`` in every stage that has it."""
    if isinstance(value, tuple):
        return tuple(with_option(v, name, setting) for v in value)
    if not isinstance(value, StageOptions):
        return value
    update = {f: with_option(getattr(value, f), name, setting) for f in type(value).model_fields if isinstance(getattr(value, f), tuple)}
    if name in type(value).model_fields:
        update[name] = setting
    return value.model_copy(update=update)


class RetrieveConfig(_Config):
    """`logicrank retrieve`: named pipelines of stages over one table, one run each.

    ``pipelines`` maps a run id to a list of stages (see pipelines/retrieval/pipeline.py and
    docs/pipelines.md); its schema is the stage registry's. :meth:`preset` builds it from
    ``--method`` presets."""

    queries: str = Field(description="Queries: BEIR queries.jsonl, JSONL, Parquet, qid<TAB>text TSV (.tsv) or a TREC topics file.")
    topics_field: Literal["title", "desc", "narr"] = Field(
        "title", description="The topic field that is the query: a TREC topics file's title, desc or narr; in JSONL or Parquet queries, "
        "desc and narr read the key desc/description/question and narr/narrative (title: text, query or title); a TSV file has title alone."
    )
    db: str = Field(description="LanceDB directory or URI.")
    table: str = Field("docs", description="The table in the LanceDB directory.")
    pipelines: dict[str, tuple[Any, ...]] = Field(description="run id -> its stages.")
    table_version: int | str | None = Field(
        None, description="Read this version of the table, any one: a number or a tag (e.g. nightly-2026-11-20); None: the last version a completed index run finished."
    )
    embed: EmbedConfig = EmbedConfig()
    llm: LLMConfig = LLMConfig()
    ray: RayConfig = RayConfig()
    trec: bool = Field(False, description="Also write a TREC run file per pipeline.")
    on_parse_error: Literal["refuse", "fallback"] | None = Field(
        None, description="Every stage that takes on_parse_error (itlr): refuse a logical query that does not parse, or score its "
        "whole text as one term; set, it replaces each stage's own (None: each stage's, default refuse)."
    )

    @model_validator(mode="before")
    @classmethod
    def _parse_policy(cls, data):
        """``on_parse_error`` set: every stage that takes it, in every pipeline (fused ones
        too), gets it, so the stages' options (and their cache keys) say what ran."""
        if not isinstance(data, dict) or data.get("on_parse_error") not in ("refuse", "fallback") or "pipelines" not in data:
            return data  # a bad value or bad pipelines: the fields' own validation names them
        try:
            parsed = parse_pipelines(data["pipelines"])
        except ValueError:
            return data
        return {**data, "pipelines": {name: with_option(stages, "on_parse_error", data["on_parse_error"]) for name, stages in parsed.items()}}

    @field_validator("pipelines", mode="before")
    @classmethod
    def _stages(cls, v):
        return parse_pipelines(v)

    @model_validator(mode="after")
    def _whole(self):
        for name, stages in self.pipelines.items():
            validate(name, stages)
        return self

    @classmethod
    def preset(cls, methods: tuple[str, ...] | list[str] = ("dense",), run_tag: str | None = None, set: Any = None, **fields) -> RetrieveConfig:
        """A config from ``--method`` presets (pipelines/retrieval/presets/), with the overrides ``set``
        (``{"orlog.k": 20}`` or ``["orlog.k=20"]``) and this config's own ``fields``."""
        return cls(pipelines=read_presets(tuple(methods), run_tag, set), **fields)


def decomposition_kinds() -> list[str]:
    """Every registered decomposition kind (pipelines/llm/decompose.py and any stage module that
    registers its own: the stages are imported first)."""
    import logicrank.pipelines.retrieval.stages  # noqa: F401 - each stage module registers its kinds on import

    return list(KINDS)


class DecomposeConfig(_Config):
    """`logicrank decompose`: one row per (query, method) from an actor pool of engines."""

    queries: str = Field(description="Queries: BEIR queries.jsonl, JSONL, Parquet, qid<TAB>text TSV (.tsv) or a TREC topics file.")
    topics_field: Literal["title", "desc", "narr"] = Field(
        "title", description="The topic field that is the query: a TREC topics file's title, desc or narr; in JSONL or Parquet queries, "
        "desc and narr read the key desc/description/question and narr/narrative (title: text, query or title); a TSV file has title alone."
    )
    llm: LLMConfig = LLMConfig()
    ray: RayConfig = RayConfig()
    methods: tuple[str, ...] = Field(default_factory=lambda: tuple(decomposition_kinds()),
                                     description="Decomposition kinds to run (default: every registered kind).")
    constrained: bool = Field(True, description="Decode itlr under its grammar and orlog under its JSON schema.")
    max_tokens: dict[str, int] = Field(default_factory=dict, description="A kind's token budget, e.g. {itlr: 160} (a kind left out: its own).")
    max_term_chars: int | None = Field(
        None, ge=1, description="itlr: longest term the grammar allows (None: unbounded; a bound makes xgrammar slow)."
    )
    temperature: float = Field(0.0, ge=0)

    @field_validator("methods")
    @classmethod
    def _methods(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in v if m not in decomposition_kinds()]
        if unknown:
            raise ValueError(f"unknown decomposition kind(s) {unknown}; valid: {', '.join(decomposition_kinds())}")
        return distinct(v)

    @field_validator("max_tokens")
    @classmethod
    def _budgets(cls, v: dict[str, int]) -> dict[str, int]:
        bad = [f"{k}: {n}" for k, n in v.items() if k not in decomposition_kinds() or n < 8]
        if bad:
            raise ValueError(f"max_tokens {bad}: give kinds of {', '.join(decomposition_kinds())}, each at least 8 tokens")
        return dict(sorted(v.items()))


class QuerySetConfig(_Config):
    """One evaluation query set of the nightly suite."""

    queries: str = Field(description="Queries: BEIR queries.jsonl, JSONL or Parquet.")
    qrels: str = Field(description="Their qrels (BEIR TSV or dir, TREC qrels).")


class RegressionRule(_Config):
    """When a measure's change from one night to the next is a regression."""

    max_drop: float = Field(0.01, ge=0, description="A change for the worse of the value over queries (the report's: the mean; gm_*: the geometric mean; counts: the sum) by more than this (absolute): a drop, or a rise for unj_k, rbp_resid and num_nonrel_judged_ret, where lower is better ...")
    significant: bool = Field(True, description="... that is also significant (paired test, corrected p < alpha); false: the change alone.")


class AlertConfig(_Config):
    """Who hears about a regression or a stopped night: each receives the alert's JSON."""

    webhook: str | None = Field(None, description="POST the alert JSON to this http(s) URL.")
    command: tuple[str, ...] = Field((), description="Run this command (argv) with the alert JSON on its standard input.")
    timeout_s: float = Field(30.0, gt=0, description="Give up on the webhook or command after this long (the alert files stay).")

    @field_validator("webhook")
    @classmethod
    def _url(cls, v):
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"webhook {v!r} is not an http(s) URL")
        return v


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
NIGHTLY_TAG_PREFIX = "nightly-"


class NightlyConfig(_Config):
    """`logicrank nightly CONFIG.yaml`: re-index, maintain, evaluate, compare, alert (jobs/nightly.py).

    ``index`` is the index job's config (corpus snapshot, table, guards, encoder, Ray);
    retrieval reads the table with the same encoder and Ray placement."""

    out: str = Field(description="The nightly root: nights/<date>/, history.parquet, plots/, report.md.")
    index: IndexConfig
    query_sets: dict[str, QuerySetConfig] = Field(min_length=1, description="name -> queries and qrels.")
    pipelines: dict[str, tuple[Any, ...]] = Field(description="run id -> its stages (as in `logicrank retrieve --pipelines`).")
    measures: tuple[str, ...] = Field(("nDCG@10", "P@1", "R@100", "MRR"), min_length=1)
    regressions: dict[str, RegressionRule] = Field(
        default_factory=lambda: {"nDCG@10": RegressionRule()}, description="measure -> its regression rule (measures without one are recorded, never alerted)."
    )
    test: Literal["t-test", "randomisation"] = "t-test"
    correction: Literal["holm", "bonferroni", "bh"] = Field("holm", description="Within each measure, over every (pipeline, query set) compared that night.")
    alpha: float = Field(0.05, gt=0, lt=1)
    baseline: str | None = Field(None, description="Also compare with this pinned night (its date, YYYY-MM-DD), e.g. a release's.")
    keep_nightly_tags: int = Field(14, ge=1, description="Keep the newest N nightly-<date> tags; older ones are dropped so their versions can be pruned.",
                                   json_schema_extra=OUTSIDE)
    served_tag: str = Field("served", description="The tag downstream readers serve: moved to each night whose re-index succeeded "
                            "and whose comparison found no regression.")
    promote_on_regression: bool = Field(False, description="Move the served tag to a night whose comparison found a regression too "
                                        "(default: the tag stays on the last good version and the alert says so).",
                                        json_schema_extra=UNHASHED)
    llm: LLMConfig = LLMConfig()
    alert: AlertConfig = Field(AlertConfig(), json_schema_extra=OUTSIDE)

    @field_validator("query_sets")
    @classmethod
    def _set_names(cls, v):
        bad = [name for name in v if not _NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"query set names are directory names (letters, digits, '_', '.', '-'): {bad}")
        return v

    @field_validator("measures")
    @classmethod
    def _measures(cls, v):
        return tuple(str(m) for m in parse_measures(list(v)))

    @field_validator("baseline", mode="before")
    @classmethod
    def _date(cls, v):
        from datetime import date

        if isinstance(v, date):  # YAML reads an unquoted 2026-11-20 as a date
            v = v.isoformat()
        if v is not None:
            night_date(v)
        return v

    @field_validator("served_tag")
    @classmethod
    def _served(cls, v):
        if not _NAME.fullmatch(v) or v.startswith(NIGHTLY_TAG_PREFIX):
            raise ValueError(f"served_tag {v!r}: a tag name (letters, digits, '_', '.', '-') not starting with {NIGHTLY_TAG_PREFIX!r}")
        return v

    @model_validator(mode="after")
    def _whole(self):
        canonical: dict[str, str] = {}
        for m in self.regressions:  # one rule per measure: two spellings of one kept the last one's rule, silently
            c = str(parse_measures([m])[0])
            if c in canonical:
                raise ValueError(f"regressions name measure {c} twice ({canonical[c]!r} and {m!r}); give one rule per measure")
            canonical[c] = m
        unknown = [m for c, m in canonical.items() if c not in self.measures]
        if unknown:
            raise ValueError(f"regressions name measure(s) {unknown} that are not among the measures {list(self.measures)}")
        object.__setattr__(self, "regressions", {c: self.regressions[m] for c, m in canonical.items()})
        self.retrieve_config(next(iter(self.query_sets)))  # the pipelines validate as `logicrank retrieve` would
        return self

    def retrieve_config(self, query_set: str, table_version: int | str | None = None) -> RetrieveConfig:
        """The retrieve job of one query set against one table version."""
        return RetrieveConfig(queries=self.query_sets[query_set].queries, db=self.index.db, table=self.index.table,
                              pipelines=self.pipelines, table_version=table_version, embed=self.index.embed, llm=self.llm,
                              ray=self.index.ray)

    def evaluate_config(self, query_set: str, runs: tuple[str, ...]) -> EvaluateConfig:
        return EvaluateConfig(qrels=self.query_sets[query_set].qrels, runs=runs, measures=self.measures,
                              test=self.test, correction=self.correction, alpha=self.alpha)

    def night_digest(self) -> str:
        """What defines a night's results: placement, the alert receivers and retention do not
        (the fields declared ``OUTSIDE``, here and in the nested configs)."""
        return self.outcome_digest()

    def index_digest(self) -> str:
        """What defines a night's table version (the re-index), placement and retention aside."""
        return self.index.outcome_digest()


def night_date(value: str):
    """A night's date, from YYYY-MM-DD (the only spelling: it names directories and tags)."""
    from datetime import date

    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            return date.fromisoformat(value)
    except ValueError:
        pass
    raise ValueError(f"{value!r} is not a date YYYY-MM-DD")
