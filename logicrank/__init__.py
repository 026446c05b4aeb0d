"""logicrank: logic-aware retrieval at scale.

One namespace. The folders pipelines/, jobs/ and schemas/ are the subpackages
``logicrank.pipelines`` (stage logic, no Ray), ``logicrank.jobs`` (the Ray jobs) and
``logicrank.schemas`` (table contracts, the settings every job shares); pyproject.toml maps
them. This package itself holds the two front doors: the notebook API (:mod:`logicrank.api`)
and the command line (:mod:`logicrank.cli`).

This module exports, on first use (importing ``logicrank`` itself loads nothing heavy):

- the notebook API of :mod:`logicrank.api` (``index``, ``open_table``, ``pipelines``, ``retrieve``,
  ``evaluate``, ``compare``, ``run_experiment``; docs/python-api.md);
- every config model (``RayConfig``, ``EmbedConfig``, ``RetrieveConfig``, ``Experiment``, ...);
- every registered stage's options class (``BM25Options``, ``OrlogOptions``, ...) and a
  factory per stage, named as the stage (``lr.bm25(k=20)``: :func:`logicrank.api.stage`),
  whose results compose with ``>>``::

    import logicrank as lr

    lr.Pipeline("bm25-20", (lr.BM25Options(k=20),))
    lr.bm25(k=100) >> lr.itlr(scorer="bm25")  # Pipeline("bm25-itlr", ...)

A name it lacks raises :class:`logicrank.api.UnknownName` (a ``UserError`` and an
``AttributeError``), listing the stage factories.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_API = ("Evaluation", "Pipeline", "PipelineError", "Result", "Results", "StageCache", "Table", "UnknownName", "UserError", "compare",
        "compose", "evaluate", "index", "open_table", "preset", "read_pipelines", "read_qrels", "read_queries", "read_run", "retrieve",
        "run_experiment", "stage")
_CONFIGS = {
    "logicrank.pipelines.config.settings": ("RayConfig", "EmbedConfig", "IndexConfig", "LLMConfig", "EvaluateConfig", "GenerateConfig"),
    "logicrank.pipelines.config.retrieval": ("RetrieveConfig", "DecomposeConfig", "NightlyConfig", "QuerySetConfig", "AlertConfig", "RegressionRule"),
    "logicrank.pipelines.evaluation.experiment": ("Experiment",),
}
_WHERE = {name: "logicrank.api" for name in _API} | {name: module for module, names in _CONFIGS.items() for name in names}


def _stage_options() -> dict[str, type]:
    """Every registered stage's options class by its class name (``BM25Options``)."""
    import logicrank.pipelines.retrieval.pipeline  # noqa: F401 - gives stage options their ``>>``
    from logicrank.pipelines.retrieval.stages import stages

    return {cls.Options.__name__: cls.Options for cls in stages().values()}


def _stage_names() -> list[str]:
    from logicrank.pipelines.retrieval.stages import stages

    return sorted(stages())


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name]), name)
    elif name.endswith("Options") and name in (options := _stage_options()):
        value = options[name]
    elif name.startswith("_"):  # (dunders, IPython's _repr_*_ probes: a plain miss)
        raise AttributeError(f"module 'logicrank' has no attribute {name!r}")
    elif name in _stage_names():
        return import_module("logicrank.api").stage_factory(name)  # not kept: a stage registered later gets its own
    else:
        api = import_module("logicrank.api")
        raise api.UnknownName(f"logicrank has no {name!r}; the API: {', '.join(sorted(_API))}; stage factories: "
                              f"{', '.join(_stage_names())} (lr.bm25(k=100) >> lr.itlr()).")
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE, *_stage_options(), *_stage_names()])


__all__ = [*_API, *(n for names in _CONFIGS.values() for n in names)]
