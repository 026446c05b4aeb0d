"""The stage registry: every method registers its stage class here, by name.

Nothing else keeps a list of method names: the pipeline config schema, the ``--method``
presets and ``logicrank stages`` are all read from this registry. Adding a method is one
module (a :class:`~logicrank.pipelines.stages.base.Stage` subclass decorated with :func:`register`,
optionally a :func:`preset`), its prompt files and its tests; import it at the bottom of
this file.
"""

from __future__ import annotations

from logicrank.pipelines.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from logicrank.pipelines.stages.registry import parse_stages, preset, presets, register, stage_class, stages

__all__ = ["Context", "Kind", "Needs", "Output", "Stage", "StageOptions", "parse_stages", "preset", "presets", "register",
           "stage_class", "stages"]

# the stages that ship with logicrank (each registers itself on import)
from logicrank.pipelines.stages import cut, fusion, itlr, lag, mmr, orlog, retrievers, rewriters, rules  # noqa: E402, F401

__all__ = ["Context", "Kind", "Needs", "Output", "Stage", "StageOptions", "preset", "presets", "register", "stage_class", "stages"]
