"""The stage registry: every method registers its stage class here, by name.

Nothing else keeps a list of method names: the pipeline config schema, the ``--method``
presets and ``logicrank stages`` are all read from this registry. Adding a method is one
module (a :class:`~pipelines.stages.base.Stage` subclass decorated with :func:`register`,
optionally a :func:`preset`), its prompt files and its tests; import it at the bottom of
this file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pipelines.stages.base import Context, Kind, Needs, Output, Stage, StageOptions

_STAGES: dict[str, type[Stage]] = {}
_PRESETS: dict[str, Callable] = {}
S = TypeVar("S", bound=type[Stage])


def register(cls: S) -> S:
    """Class decorator: make a stage available to pipelines under ``cls.name``."""
    if cls.name in _STAGES:
        raise RuntimeError(f"stage {cls.name!r} registered twice ({_STAGES[cls.name].__module__}, {cls.__module__})")
    declared = cls.Options.model_fields.get("stage")
    if declared is None or declared.default != cls.name:
        raise RuntimeError(f"stage {cls.name!r}: its Options must declare stage: Literal[{cls.name!r}] = {cls.name!r}")
    _STAGES[cls.name] = cls
    return cls


def preset(name: str):
    """Decorator: a ``--method NAME`` preset, a function from the flat method options
    (:class:`pipelines.pipeline.MethodOptions`) to a list of stage options."""

    def deco(fn):
        if name in _PRESETS:
            raise RuntimeError(f"preset {name!r} registered twice")
        _PRESETS[name] = fn
        return fn

    return deco


def stages() -> dict[str, type[Stage]]:
    return dict(_STAGES)


def presets() -> dict[str, Callable]:
    return dict(_PRESETS)


def stage_class(name: str) -> type[Stage]:
    return _STAGES[name]


# the stages that ship with logicrank (each registers itself on import)
from pipelines.stages import fusion, itlr, lag, orlog, retrievers, rewriters, rules  # noqa: E402, F401

__all__ = ["Context", "Kind", "Needs", "Output", "Stage", "StageOptions", "preset", "presets", "register", "stage_class", "stages"]
