"""The stage registry: every stage registers its class here, by name.

Stages are found by discovery: every module of this package is imported (each stage module
registers itself with :func:`register`), so adding a method is its stage module (a
:class:`~logicrank.pipelines.retrieval.stages.base.Stage` subclass decorated with :func:`register`), its
method module in pipelines/retrieval/methods/, its prompt files and its tests; nothing else lists stage
names. The pipeline config schema and ``logicrank stages`` are read from this registry; the
``--method`` presets are pipeline files in pipelines/retrieval/presets/.
"""

from __future__ import annotations

from logicrank.pipelines.retrieval.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from logicrank.pipelines.retrieval.stages.registry import import_submodules, parse_stages, register, stage_class, stages

__all__ = ["Context", "Kind", "Needs", "Output", "Stage", "StageOptions", "parse_stages", "register", "stage_class", "stages"]

import_submodules(__name__, __path__)  # every stage that ships with logicrank (each registers itself on import)
