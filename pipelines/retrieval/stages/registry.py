"""The stage registry itself: stage classes by name, and stage options parsed from their
config form. A leaf: stage modules import it to register
themselves, and :mod:`logicrank.pipelines.retrieval.stages` imports every stage module, so nothing here imports a
stage module (no import circle)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Annotated, Any, TypeVar, Union

from pydantic import Field, TypeAdapter

from logicrank.pipelines.retrieval.stages.base import Stage, StageOptions

_STAGES: dict[str, type[Stage]] = {}
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


def stages() -> dict[str, type[Stage]]:
    return dict(_STAGES)


def stage_class(name: str) -> type[Stage]:
    return _STAGES[name]


def build(options: StageOptions) -> Stage:
    """The stage these options configure."""
    return stage_class(options.stage)(options)


@cache
def stages_type() -> Any:
    """The type of a pipeline's stages: a list of any registered stage's options, told apart by ``stage``."""
    options = tuple(cls.Options for cls in stages().values())
    return list[Annotated[Union[options], Field(discriminator="stage")]]  # noqa: UP007 - a runtime tuple of types


@cache
def _adapter() -> TypeAdapter:
    return TypeAdapter(stages_type())


def _normal(spec: Any) -> Any:
    """``"dense"`` and ``{"dense": {...}}`` as ``{"stage": "dense", ...}``; options models as they are."""
    if isinstance(spec, StageOptions):
        return spec
    if isinstance(spec, str):
        return {"stage": spec}
    if isinstance(spec, dict) and "stage" not in spec and len(spec) == 1:
        (name, options), = spec.items()
        return {"stage": name, **(options or {})}
    return spec


def parse_stages(specs: Sequence[Any]) -> tuple[StageOptions, ...]:
    """Stage options from their config form; an unknown stage name lists the registered ones."""
    if isinstance(specs, (str, dict)) or not isinstance(specs, Sequence):
        raise ValueError(f"a pipeline is a list of stages, not {type(specs).__name__}")
    specs = [_normal(s) for s in specs]
    for s in specs:
        if isinstance(s, dict) and s.get("stage") not in stages():
            raise ValueError(f"unknown stage {s.get('stage')!r}; registered stages: {', '.join(sorted(stages()))}")
    return tuple(_adapter().validate_python(specs))


def import_submodules(package: str, path: Sequence[str]) -> None:
    """Import every module of ``package`` (at ``path``): each stage module registers its stage
    on import, so a new stage is one new module and no list names it. The code digest
    (:mod:`logicrank.pipelines.codedigest`) counts a package whose ``__init__`` calls this as
    importing every module in it."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{info.name}")
