"""The two kinds of error a job reports in one line instead of a traceback.

The command line prints a :class:`UserError` as one line (what, where, the fix) and exits
2; a :class:`JobFailed` as one line and exits 1; anything else is a bug in logicrank and
keeps its traceback. Raise a subclass of :class:`UserError` for bad input, bad configuration
or a refused operation, never a bare ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin


class UserError(Exception):
    """A mistake in the user's input or configuration; the message says how to fix it."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class JobFailed(Exception):
    """The job stopped for a reason outside its input that it could not work around (an LLM
    engine that keeps dying, no progress for too long); the message names the cause. What
    was finished is kept: a rerun resumes."""


def validation_line(exc: Any, model: Any = None, name: Callable[[tuple], str] | None = None) -> str:
    """A pydantic ``ValidationError`` as one line: each error's place (``name(loc)``, default the
    dotted path), the value given and what is accepted; an unknown key lists the keys that
    exist there, found by walking ``model`` (a model class or a type, e.g. ``list[Union[...]]``)
    along the error's place."""
    parts = []
    for e in exc.errors(include_url=False):
        loc = tuple(e["loc"])
        msg = e["msg"].replace("Input should be", "must be").removeprefix("Value error, ")
        if e["type"] == "extra_forbidden" and (known := _keys_at(model, loc[:-1])):
            msg = f"no such option; options: {', '.join(known)}"
        given = f" {e['input']!r}" if "input" in e and not isinstance(e["input"], dict | list) and e["type"] != "missing" else ""
        where = (name or (lambda p: ".".join(map(str, p))))(loc)
        parts.append(f"{where}{given}: {msg}" if where else msg)
    return "; ".join(parts)


def _keys_at(model: Any, loc: tuple) -> list[str]:
    """The fields of the model found at ``loc`` inside ``model`` (a discriminated union's member
    picked by its tag, a list's item by an index), without the tag field (a one-value Literal);
    [] when unknown."""
    from pydantic import BaseModel

    def members(t: Any) -> list[Any]:
        args = [a for a in get_args(t) if a is not type(None)]
        return [m for a in args for m in members(a)] if args and get_origin(t) is not list else [t]

    def model_of(t: Any) -> Any:
        found = [m for m in members(t) if isinstance(m, type) and issubclass(m, BaseModel)]
        return found[0] if len(found) == 1 else None

    current = model
    for part in loc:
        if isinstance(part, int):
            args = get_args(current)
            current = args[0] if get_origin(current) in (list, tuple) and args else current
            continue
        m = model_of(current)
        if m is not None and part in m.model_fields:
            current = m.model_fields[part].annotation
            continue
        tagged = [x for x in members(current) if isinstance(x, type) and issubclass(x, BaseModel)
                  and any(f.default == part for f in x.model_fields.values() if f.annotation is not None and get_origin(f.annotation) is Literal)]
        if len(tagged) != 1:
            return []
        current = tagged[0]
    m = model_of(current)
    def tag(annotation: Any) -> bool:  # a discriminated union's tag: a Literal of one value
        return get_origin(annotation) is Literal and len(get_args(annotation)) == 1

    return [f for f, info in m.model_fields.items() if not tag(info.annotation)] if m is not None else []
