"""The base of every stage's options, in a leaf module: a method declares its own options
(pipelines/retrieval/methods/lag.py's LagOptions) and its stage runs the method on them as they are,
without copying them into a settings object."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from logicrank.pipelines.config.base import no_yes_no_for_numbers


class StageOptions(BaseModel):
    """A stage's options. Subclasses declare ``stage: Literal["<name>"] = "<name>"``. Options
    compose into a pipeline with ``>>`` (``BM25Options(k=100) >> ITLROptions()``), an operator
    :mod:`logicrank.pipelines.retrieval.pipeline` gives this class (it holds ``Pipeline``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _numbers = model_validator(mode="before")(classmethod(no_yes_no_for_numbers))
    depth_option: ClassVar[str | None] = "k"
    """The option bounding how many documents per query the stage's run keeps, where the class
    has it (``--k N`` sets it: :func:`logicrank.pipelines.retrieval.overrides.depth_sets`); None where
    ``k`` means something else (lag: passages per step)."""
