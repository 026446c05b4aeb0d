"""The two kinds of error a job reports in one line instead of a traceback.

The command line prints a :class:`UserError` as one line (what, where, the fix) and exits
2; a :class:`JobFailed` as one line and exits 1; anything else is a bug in logicrank and
keeps its traceback. Raise a subclass of :class:`UserError` for bad input, bad configuration
or a refused operation, never a bare ``ValueError``.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input or configuration; the message says how to fix it."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class JobFailed(Exception):
    """The job stopped for a reason outside its input that it could not work around (an LLM
    engine that keeps dying, no progress for too long); the message names the cause. What
    was finished is kept: a rerun resumes."""
