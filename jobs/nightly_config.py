"""The nightly job's config (`logicrank nightly CONFIG.yaml`, jobs/nightly.py): the index
job's config, the query sets, the pipelines, the measures and regression rules, retention,
the alert receivers; and what defines a night (its digests)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from logicrank.pipelines.config import RetrieveConfig
from logicrank.pipelines.evaluate.measures import parse_measures
from logicrank.schemas.config import OUTSIDE, UNHASHED, EvaluateConfig, IndexConfig, LLMConfig, _Config


class QuerySetConfig(_Config):
    """One evaluation query set of the nightly suite."""

    queries: str = Field(description="Queries: BEIR queries.jsonl, JSONL or Parquet.")
    qrels: str = Field(description="Their qrels (BEIR TSV or dir, TREC qrels).")


class RegressionRule(_Config):
    """When a measure's change from one night to the next is a regression."""

    max_drop: float = Field(0.01, ge=0, description="A drop of the mean by more than this (absolute) ...")
    significant: bool = Field(True, description="... that is also significant (paired test, corrected p < alpha); false: the drop alone.")


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
        canonical = {str(parse_measures([m])[0]): m for m in self.regressions}
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
