"""logicrank: logic-aware retrieval at scale.

One namespace. The folders pipelines/, jobs/ and schemas/ are the subpackages
``logicrank.pipelines`` (stage logic, no Ray), ``logicrank.jobs`` (the Ray jobs) and
``logicrank.schemas`` (table contracts, the settings every job shares); pyproject.toml maps
them. This package itself holds the two front doors: the notebook API (:mod:`logicrank.api`)
and the command line (:mod:`logicrank.cli`).

This module exports, on first use (importing ``logicrank`` itself loads nothing heavy):

- the notebook API of :mod:`logicrank.api` (``open_table``, ``pipelines``, ``retrieve``,
  ``evaluate``, ``compare``, ``run_experiment``; docs/python-api.md);
- every config model (``RayConfig``, ``EmbedConfig``, ``RetrieveConfig``, ``Experiment``, ...);
- every registered stage's options class (``BM25Options``, ``OrlogOptions``, ...)::

    import logicrank as lr

    lr.Pipeline("bm25-20", (lr.BM25Options(k=20),))
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_API = ("Pipeline", "PipelineError", "Result", "StageCache", "Table", "UserError", "compare", "evaluate", "open_table",
        "preset", "read_pipelines", "read_qrels", "read_queries", "read_run", "retrieve", "run_experiment")
_CONFIGS = {
    "logicrank.pipelines.config.settings": ("RayConfig", "EmbedConfig", "IndexConfig", "LLMConfig", "EvaluateConfig", "GenerateConfig"),
    "logicrank.pipelines.config.pipelines": ("RetrieveConfig", "DecomposeConfig", "NightlyConfig", "QuerySetConfig", "AlertConfig", "RegressionRule"),
    "logicrank.pipelines.experiment": ("Experiment",),
}
_WHERE = {name: "logicrank.api" for name in _API} | {name: module for module, names in _CONFIGS.items() for name in names}


def _stage_options() -> dict[str, type]:
    """Every registered stage's options class by its class name (``BM25Options``)."""
    from logicrank.pipelines.stages import stages

    return {cls.Options.__name__: cls.Options for cls in stages().values()}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name]), name)
    elif name.endswith("Options") and name in (options := _stage_options()):
        value = options[name]
    else:
        raise AttributeError(f"module 'logicrank' has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE, *_stage_options()])


__all__ = [*_API, *(n for names in _CONFIGS.values() for n in names)]
