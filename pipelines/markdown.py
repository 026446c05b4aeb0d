"""Markdown tables, written one way: every report, the generated docs and the nightly alert
build their tables here, through tabulate's pipe tables (GitHub's)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tabulate import tabulate

_ALIGN = {"l": "left", "r": "right"}


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str = "") -> list[str]:
    """A pipe table as lines: the header, the separator, a line per row, columns padded to one
    width. ``align``: a letter per column, ``l`` or ``r``, default every column ``l``; cells are
    written with ``str()`` as they are (no number is re-formatted), a ``|`` in one escaped and a
    line break made a space (either would end the cell, and shift every cell after it)."""
    align = align or "l" * len(header)
    if len(align) != len(header) or set(align) - set(_ALIGN):
        raise ValueError(f"markdown table: {len(header)} columns need as many alignments, each l or r; got {align!r}")
    body = [[_cell(cell) for cell in row] for row in rows]
    text = tabulate(body, headers=[_cell(h) for h in header], tablefmt="pipe", disable_numparse=True,
                    colalign=[_ALIGN[a] for a in align])
    return text.splitlines()


def _cell(value: Any) -> str:
    return " ".join(str(value).replace("|", "\\|").splitlines())


def number(v: float | int) -> str:
    """A count or a measure as a person reads it: a whole number without a decimal point (40,
    not 40.0), any other to 4 significant digits."""
    return str(int(v)) if float(v).is_integer() else f"{v:.4g}"
