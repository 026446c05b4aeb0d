"""RuleBench ULogic (rule retrieval), read from a path and written in the BEIR layout.

The set (830 concrete queries, each a context of facts and a question, with its gold rule
ids, over a base of 1,046 abstract rules) declares no licence, so logicrank does not bundle
it: :func:`to_beir` reads ``rules.json`` (id -> {"NL": natural-language rule, "FOL":
first-order form}) and ``test_data.json`` (a list of {"input", "rule": [ids], ...}) from a
directory and writes

    <out>/corpus.jsonl     one rule per line: _id = rule id, title "", text = the NL rule,
                           metadata {"fol": ...}
    <out>/queries.jsonl    _id = ulogic-<n> (the query's 0-based position), text = its input
                           without the "Context:" and "Question:" label lines (facts, then
                           the question, one per line), as the reference computations read it
    <out>/qrels/test.tsv   query-id, corpus-id, score 1 for each gold rule

which `logicrank index` and `logicrank evaluate` read like any BEIR set. Nothing is dropped:
a query whose gold rule is not in the rule base, or a rule or query without text, fails the
conversion with what to fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipelines.datasets import BeirDataset
from pipelines.files import atomic_path
from schemas.errors import UserError

ENV = "LOGICRANK_RULEBENCH"  # the variable the main job and jobs/experiments/rulebench-*.yaml read the set's directory from
OBTAIN = ("RuleBench ULogic is not bundled (no licence declared): get `dataset/ulogic/` (rules.json, test_data.json) from the "
          "llm-rule-following repository and give its directory")

_LABEL = re.compile(r"^\s*(Context|Question):\s*", re.IGNORECASE)


def query_text(raw: str) -> str:
    """A RuleBench input without its "Context:" / "Question:" labels (a label's own line goes;
    a label before text on its line is cut off)."""
    lines = (_LABEL.sub("", line).strip() for line in raw.splitlines())
    return "\n".join(line for line in lines if line)


class RuleBenchError(UserError, ValueError):
    """The directory does not hold a RuleBench rule-retrieval set in the expected shape."""


def to_beir(src: str | Path, out: str | Path) -> dict[str, int]:
    """Convert; returns the counts written (rules, queries, qrels)."""
    src, out = Path(src), Path(out)
    files = {name: src / name for name in ("rules.json", "test_data.json")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise RuleBenchError(f"rulebench: {src} lacks {missing}; give the directory holding rules.json and test_data.json "
                             "(e.g. llm-rule-following's dataset/ulogic).")
    try:
        rules = json.loads(files["rules.json"].read_text(encoding="utf-8"))
        data = json.loads(files["test_data.json"].read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RuleBenchError(f"rulebench: {src}: not valid JSON ({exc})") from None
    if not isinstance(rules, dict) or not isinstance(data, list):
        raise RuleBenchError(f"rulebench: {src}: rules.json must map rule ids to rules and test_data.json hold a list of queries.")
    bad_rules = [rid for rid, r in rules.items() if not isinstance(r, dict) or not str(r.get("NL") or "").strip()]
    if bad_rules:
        raise RuleBenchError(f"rulebench: {len(bad_rules)} rule(s) without an NL text, e.g. {bad_rules[:3]}.")
    qrels = []
    for i, q in enumerate(data):
        gold = q.get("rule") if isinstance(q, dict) else None
        if not isinstance(q, dict) or not query_text(str(q.get("input") or "")) or not isinstance(gold, list) or not gold:
            raise RuleBenchError(f"rulebench: query {i} needs a non-empty 'input' and a non-empty 'rule' list of ids.")
        unknown = [g for g in gold if str(g) not in rules]
        if unknown:
            raise RuleBenchError(f"rulebench: query {i}'s gold rule(s) {unknown} are not in rules.json.")
        qrels += [(f"ulogic-{i}", str(g)) for g in dict.fromkeys(map(str, gold))]
    ds = BeirDataset("rulebench-ulogic", out)
    _write_lines(out / "corpus.jsonl", (
        json.dumps({"_id": rid, "title": "", "text": r["NL"].strip(), "metadata": {"fol": r.get("FOL")}}) for rid, r in rules.items()
    ))
    _write_lines(ds.queries, (json.dumps({"_id": f"ulogic-{i}", "text": query_text(q["input"])}) for i, q in enumerate(data)))
    _write_lines(ds.qrels, ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t1" for q, d in qrels)])
    return {"rules": len(rules), "queries": len(data), "qrels": len(qrels)}


def _write_lines(path: Path, lines) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
