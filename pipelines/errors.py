"""The one base class of errors a user can fix.

The command line prints a :class:`UserError` as one line (what, where, the fix) and exits
2; anything else is a bug in logicrank and keeps its traceback. Raise a subclass of this
for bad input, bad configuration or a refused operation, never a bare ``ValueError``.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input or configuration; the message says how to fix it."""
