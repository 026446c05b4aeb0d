"""Small datasets bundled with logicrank (like scikit-learn's toy datasets).

- ``scifact``: BEIR SciFact test split (5,183 abstracts, 300 queries, 339 qrels).
  See ``scifact/LICENSE.md`` for its source and licence (CC BY-NC 2.0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_HERE = Path(__file__).parent


@dataclass(frozen=True)
class BeirDataset:
    name: str
    root: Path

    @property
    def corpus(self) -> Path:
        return self.root / "corpus.jsonl.gz"

    @property
    def queries(self) -> Path:
        return self.root / "queries.jsonl"

    @property
    def qrels(self) -> Path:
        return self.root / "qrels" / "test.tsv"


def scifact() -> BeirDataset:
    return BeirDataset("scifact", _HERE / "scifact")
