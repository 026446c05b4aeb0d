"""No test has a deadline of its own (the project's rule): pytest's per-test timeout is the one
wall-clock bound, so no unit or integration test passes a ``timeout=`` or ``timeout_s=`` (a
subprocess run, a wait, a join, a delivery) that could fail a slow but correct run on a loaded
machine. The stall watchdog's own tests (``watch(..., timeout_s=...)``) set the timeout under
test: a stall is what they wait for."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_unit_or_integration_test_passes_a_timeout_of_its_own():
    found = [f"{p.relative_to(TESTS)}:{n}: {line.strip()}"
             for p in sorted([*(TESTS / "unit").rglob("*.py"), *(TESTS / "integration").rglob("*.py")]) if p != Path(__file__).resolve()
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\btimeout(_s)?\s*=", line) and "watch(" not in line]
    assert found == [], "\n".join(found)
