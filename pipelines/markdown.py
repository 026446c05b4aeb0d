"""Markdown tables, written one way: every report, the generated docs and the nightly alert
build their tables here (GitHub's pipe tables)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str = "") -> list[str]:
    """A pipe table as lines: the header, the separator, a line per row. ``align``: a letter per
    column, ``l`` (``---``) or ``r`` (``---:``), default every column ``l``; cells are written
    with ``str()``, an empty header cell as ``| |``."""
    align = align or "l" * len(header)
    if len(align) != len(header):
        raise ValueError(f"markdown table: {len(header)} columns but {len(align)} alignments")
    head = "| " + " | ".join(map(str, header)) + " |"
    return [head.replace("|  |", "| |"), "|" + "".join("---:|" if a == "r" else "---|" for a in align),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]
