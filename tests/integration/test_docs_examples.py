"""Every Python example of the docs runs, against a small indexed table (the ``synthetic``
fixture): a renamed or removed API call fails here, not only in a reader's notebook. Each
example runs in its own process (a stage an example registers stays there), with the docs'
paths pointing at the fixture's files and its outputs under a temporary directory. A block
that defines ``test_*`` functions is the test of the block before it: the two run together
and the tests are called."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

pytestmark = [pytest.mark.integration]


def _examples() -> list[tuple[str, str]]:
    """(page, code) of every ```python block, a block of tests joined to the block before it."""
    out: list[tuple[str, str]] = []
    for page in PAGES:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            if re.search(r"^def test_", block, flags=re.M) and out and out[-1][0] == page.name:
                tests = re.findall(r"^def (test_\w+)", block, flags=re.M)
                out[-1] = (page.name, out[-1][1] + "\n\n" + block + "\n" + "".join(f"{t}()\n" for t in tests))
            else:
                out.append((page.name, block))
    return out


EXAMPLES = _examples()


def test_the_docs_have_their_python_examples():
    assert len(EXAMPLES) >= 4 and {page for page, _ in EXAMPLES} >= {"python-api.md", "pipelines.md"}


@pytest.mark.parametrize(("page", "code"), EXAMPLES, ids=[f"{page}-{i}" for i, (page, _) in enumerate(EXAMPLES)])
def test_a_python_example_of_the_docs_runs(page, code, synthetic, tmp_path):
    paths = {"runs/scifact/lancedb": synthetic / "db", "pipelines/datasets/scifact/queries.jsonl": synthetic / "syn" / "queries.jsonl",
             "pipelines/datasets/scifact/qrels/test.tsv": synthetic / "syn" / "qrels" / "test.tsv"}
    for doc_path, here in paths.items():
        code = code.replace(f'"{doc_path}"', repr(str(here)))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, f"{page}: the example fails:\n{code}\n{done.stderr[-3000:]}"
