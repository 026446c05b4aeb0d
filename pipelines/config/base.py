"""The base of every job's config: frozen, strict about unknown keys, hashed.

A field marked :data:`OUTSIDE` cannot change a job's results; :data:`UNHASHED` ones are left
out of the outcome digests. Imports no other project module but the digest.
"""

from __future__ import annotations

import typing

from pydantic import BaseModel, ConfigDict, model_validator

from logicrank.schemas.digest import json_digest

OUTSIDE = {"outcome": False}
"""``Field(..., json_schema_extra=OUTSIDE)``: the field cannot change a job's results (where the
work runs, retention, who is alerted); :meth:`Config.outcome` sets it to its default."""

UNHASHED = {"outcome": False, "hashed": False}
"""OUTSIDE, and left out of the outcome digests altogether: for a field added after digests
were stored (nights, datasets, the LLM cache's keys hold them). An OUTSIDE field is hashed at
its default, so adding one changes every stored digest; adding an UNHASHED one changes none."""


def _leaf_types(annotation) -> set:
    """The types an annotation admits at its leaves (``tuple[float, ...]``: float; ``dict[str,
    float] | None``: str, float, None)."""
    args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
    return set().union(*(_leaf_types(a) for a in args)) if args else {annotation}


def _a_bool_in(value) -> bool:
    if type(value).__name__ in ("bool", "bool_"):  # (numpy's)
        return True
    if isinstance(value, list | tuple):
        return any(_a_bool_in(v) for v in value)
    return isinstance(value, dict) and any(_a_bool_in(v) for v in value.values())


def no_yes_no_for_numbers(model: type[BaseModel], data):
    """A model validator (``mode="before"``) refusing true/false for a number field, or inside a
    list or mapping of numbers: pydantic's lax mode reads True as 1, so ``--set bm25.k=true``
    (YAML's ``yes``, ``on``) set k to 1, and ``weights: [yes, 0.5]`` gave (1.0, 0.5)."""
    if isinstance(data, dict):
        for name, value in data.items():
            if _a_bool_in(value) and (field := model.model_fields.get(name)) is not None:
                kinds = _leaf_types(field.annotation)
                if bool not in kinds and kinds & {int, float}:
                    shown = str(value).lower() if not isinstance(value, list | tuple | dict) else value
                    raise ValueError(f"{name} {shown}: a yes or no, where a number is asked")
    return data


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    _numbers = model_validator(mode="before")(classmethod(no_yes_no_for_numbers))

    def digest(self) -> str:
        """A stable hash of the config, for manifests and rerun detection."""
        return json_digest(self.model_dump(mode="json"))

    @classmethod
    def outside(cls) -> list[str]:
        """The fields declared not to change results (``OUTSIDE``)."""
        return [name for name, info in cls.model_fields.items() if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("outcome") is False]

    def outcome(self):
        """This config with every field declared outside the results at its default, in the
        nested configs too: what an outcome digest hashes."""
        outside = set(self.outside())
        update = {}
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if name in outside:
                update[name] = info.get_default(call_default_factory=True)
            elif isinstance(value, Config):
                update[name] = value.outcome()
        return self.model_copy(update=update)

    def outcome_digest(self) -> str:
        """The digest of :meth:`outcome`: equal for configs that differ only in placement,
        retention or receivers (``UNHASHED`` fields are left out of it)."""
        return json_digest(self.outcome().model_dump(mode="json", exclude=self._unhashed() or None))

    @classmethod
    def _unhashed(cls) -> dict:
        """The ``UNHASHED`` fields, here and in nested configs, as pydantic's ``exclude``."""
        out: dict = {}
        for name, info in cls.model_fields.items():
            if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("hashed") is False:
                out[name] = True
            elif isinstance(info.annotation, type) and issubclass(info.annotation, Config) and (inner := info.annotation._unhashed()):
                out[name] = inner
        return out
