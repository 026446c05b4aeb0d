"""Where a benchmark's figures go: ``<out>/<name>.json`` (all of them) and ``<name>.md`` (the table)."""

from __future__ import annotations

import json
from pathlib import Path


def write_report(out: str | Path, name: str, result, lines: list[str]) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(result, indent=2))
    print("\n".join(lines))
