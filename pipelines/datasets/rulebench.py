"""RuleBench (rule retrieval) sets, read from a path as the upstream repository publishes them,
and written in the BEIR layout.

The sets declare no licence, so logicrank bundles none of them. Each set of the upstream
repository (llm-rule-following's ``dataset/<set>/``) is a directory with a rule base and a
query file; :func:`find_files` looks them up by the names the sets use:

    rule base   ``<split>_rule.json`` (clutrr, deer, ulogic-cf, ...), ``rules.json`` (ulogic),
                ``test_rule.json`` (law's, beside its train_data.json), or the one
                ``*_rule.json`` the directory holds (theoremQA's train_rule.json)
    queries     ``<split>_data.json`` (``split`` "test" unless told: clutrr ships only
                ``validation_data.json``, law only ``train_data.json``)

or explicit paths (``--rules``, ``--queries``) where a set names them otherwise. The rule
base maps rule ids to rules (``{"NL": text, "FOL": first-order form}``, or the text alone) or
lists them (a rule's id is then its position); the query file is a JSON list of records
``{"input": ..., "rule": [ids] or one id, "output": ..., "instruction": ...}``. Rule ids may
be integers or strings (deer numbers its rules 0, 1, ...; ulogic and theoremQA write "0",
"1", ...): they are compared as text. :func:`to_beir` writes

    <out>/corpus.jsonl     one rule per line: _id = rule id, title "", text = the NL rule,
                           metadata {"fol": ...}
    <out>/queries.jsonl    _id = <set>-<n> (the set's name and the query's 0-based position),
                           text = its input without the "Context:" and "Question:" label lines
                           (facts, then the question, one per line), as the reference
                           computations read it
    <out>/qrels/test.tsv   query-id, corpus-id, score 1 for each gold rule
    <out>/answers.jsonl    {"query_id", "question" (the input as given), "answers": [output],
                           "instruction"}: the gold outputs reasoning is scored against
                           (written when every query has an output)

which `logicrank index` and `logicrank evaluate` read like any BEIR set. Nothing is dropped:
a query whose gold rules are not in the rule base (all such queries are named at once), or a
rule or query without text, fails the conversion with what to fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from logicrank.pipelines.datasets import BeirDataset
from logicrank.pipelines.files import atomic_path, read_jsonl
from logicrank.schemas.errors import UserError

ENV = "LOGICRANK_RULEBENCH"  # the variable the main job and jobs/experiments/rulebench-*.yaml read the set's directory from
OBTAIN = ("RuleBench is not bundled (no licence declared): get a set's directory (e.g. `dataset/ulogic/`: rules.json, test_data.json) "
          "from the llm-rule-following repository and give its path")

_LABEL = re.compile(r"^\s*(Context|Question):\s*", re.IGNORECASE)
RULE_TEXT_KEYS = ("NL", "nl", "text", "rule")  # a rule record's text, the first of these it has


def query_text(raw: str) -> str:
    """A RuleBench input without its "Context:" / "Question:" labels (a label's own line goes;
    a label before text on its line is cut off)."""
    lines = (_LABEL.sub("", line).strip() for line in raw.splitlines())
    return "\n".join(line for line in lines if line)


class RuleBenchError(UserError, ValueError):
    """The directory does not hold a RuleBench rule-retrieval set in the expected shape."""


def find_files(src: str | Path | None, rules: str | Path | None = None, queries: str | Path | None = None,
               split: str = "test") -> tuple[Path, Path]:
    """(rule base, query file): the explicit paths, else the names the upstream sets use in ``src``."""
    if src is None and (rules is None or queries is None):
        raise RuleBenchError("rulebench: give a set's directory, or both --rules and --queries.")
    root = Path(src) if src is not None else None
    if root is not None and not root.is_dir():
        raise RuleBenchError(f"rulebench: {root} is not a directory; give a set's directory (e.g. llm-rule-following's dataset/ulogic).")

    def pick(explicit, names: tuple[str, ...], what: str, option: str) -> Path:
        if explicit is not None:
            path = Path(explicit)
            if not path.is_file():
                raise RuleBenchError(f"rulebench: {option} {path}: no such file.")
            return path
        for name in names:
            if (root / name).is_file():
                return root / name
        near = sorted(p.name for p in root.glob("*.json"))
        raise RuleBenchError(f"rulebench: {root} lacks a {what} ({' or '.join(names)}; found: {', '.join(near) or 'no JSON file'}); "
                             f"give {option} FILE, or --split for a set without a test split.")

    # a split's own rule base, ULogic's, the test split's (law: test_rule.json beside train_data.json),
    # else the one rule base the directory holds (theoremQA: train_rule.json beside test_data.json)
    names = list(dict.fromkeys((f"{split}_rule.json", "rules.json", "test_rule.json")))
    only = sorted(root.glob("*_rule.json")) if root is not None else []
    if len(only) == 1 and only[0].name not in names:
        names.append(only[0].name)
    return (pick(rules, tuple(names), "rule base", "--rules"), pick(queries, (f"{split}_data.json",), "query file", "--queries"))


def _load(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))  # a byte order mark is not JSON
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RuleBenchError(f"rulebench: {path}: not valid JSON ({exc}).") from None


def _rule_texts(raw, path: Path) -> dict[str, dict]:
    """rule id (text) -> {"text", "fol"} from a mapping or a list (ids: positions)."""
    if not isinstance(raw, (dict, list)) or not raw:
        raise RuleBenchError(f"rulebench: {path}: a rule base maps rule ids to rules (or lists them); got {type(raw).__name__}"
                             f"{' (empty)' if not raw else ''}.")
    if isinstance(raw, list):
        raw = {str(i): r for i, r in enumerate(raw)}
    out, bad = {}, []
    for rid, r in raw.items():
        if isinstance(r, dict):
            text = next((r[k] for k in RULE_TEXT_KEYS if isinstance(r.get(k), str)), "")
            fol = r.get("FOL", r.get("fol"))
        else:
            text, fol = r if isinstance(r, str) else "", None
        if not text.strip():
            bad.append(rid)
        out[str(rid)] = {"text": text.strip(), "fol": fol}
    if bad:
        raise RuleBenchError(f"rulebench: {path}: {len(bad)} rule(s) without an NL text (one of {', '.join(RULE_TEXT_KEYS)}), e.g. {bad[:3]}.")
    return out


def _gold_ids(q: dict) -> list[str] | None:
    gold = q.get("rule")
    if isinstance(gold, (str, int)) and not isinstance(gold, bool):
        gold = [gold]
    if not isinstance(gold, list) or not gold or not all(isinstance(g, (str, int)) and not isinstance(g, bool) for g in gold):
        return None
    return list(dict.fromkeys(str(g) for g in gold))


def set_name(src: str | Path | None, queries: str | Path | None = None, name: str | None = None) -> str:
    """The set's name in query ids: ``name``, else the directory's name (the query file's
    when no directory is given), lower case: ``ulogic`` for llm-rule-following's dataset/ulogic."""
    if name is None:
        where = src if src is not None else (Path(queries).parent if queries is not None else None)
        if where is None:
            raise RuleBenchError("rulebench: give a set's directory, or both --rules and --queries.")
        name = Path(where).resolve().name
    name = name.lower()
    if not re.fullmatch(r"[a-z0-9_.-]+", name):
        raise RuleBenchError(f"rulebench: set name {name!r}: use letters, digits, '.', '_' or '-' (give --name).")
    return name


def is_prepared(path: str | Path) -> bool:
    """A directory `prepare-rulebench` (or any BEIR conversion) wrote: corpus, queries, qrels."""
    p = Path(path)
    return (p / "corpus.jsonl").is_file() and (p / "queries.jsonl").is_file() and (p / "qrels" / "test.tsv").is_file()


def prepared_name(path: str | Path) -> str:
    """The set name in a prepared set's query ids (``deer`` of ``deer-0``)."""
    first = next(read_jsonl(Path(path) / "queries.jsonl", "rulebench: queries", RuleBenchError), None)
    qid = str(first[1].get("_id", "")) if first else ""
    return qid.rsplit("-", 1)[0] if "-" in qid else (qid or "unknown")


def to_beir(src: str | Path | None, out: str | Path, rules: str | Path | None = None, queries: str | Path | None = None,
            split: str = "test", name: str | None = None) -> dict[str, Any]:
    """Convert; returns the counts written (rules, queries, qrels, answers: 0 when a record
    has no text output, ``no_answers`` then says which), and the files read (rules_file,
    queries_file). ``name``: see :func:`set_name`."""
    rules_path, data_path = find_files(src, rules, queries, split)
    name = set_name(src, data_path, name)
    base = _rule_texts(_load(rules_path), rules_path)
    data = _load(data_path)
    if not isinstance(data, list) or not data:
        raise RuleBenchError(f"rulebench: {data_path}: a query file holds a non-empty JSON list of records.")
    qrels, unknown = [], []
    for i, q in enumerate(data):
        gold = _gold_ids(q) if isinstance(q, dict) else None
        if not isinstance(q, dict) or not query_text(str(q.get("input") or "")) or gold is None:
            raise RuleBenchError(f"rulebench: {data_path}: record {i} needs a non-empty 'input' and a non-empty 'rule' "
                                 "(a rule id or a list of them).")
        missing = [g for g in gold if g not in base]
        if missing:
            unknown.append(f"record {i}: {missing}")
        qrels += [(f"{name}-{i}", g) for g in gold]
    if unknown:
        raise RuleBenchError(f"rulebench: {len(unknown)} record(s) of {data_path} name gold rules that are not in {rules_path}: "
                             + "; ".join(unknown[:10]) + ("; ..." if len(unknown) > 10 else "") + ".")
    out = Path(out)
    ds = BeirDataset(f"rulebench-{name}", out)
    _write_lines(out / "corpus.jsonl", (
        json.dumps({"_id": rid, "title": "", "text": r["text"], "metadata": {"fol": r["fol"]}}) for rid, r in base.items()
    ))
    _write_lines(ds.queries, (json.dumps({"_id": f"{name}-{i}", "text": query_text(q["input"])}) for i, q in enumerate(data)))
    _write_lines(ds.qrels, ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t1" for q, d in qrels)])
    outputs = [_output(q) for q in data]
    answers = out / "answers.jsonl"
    lacking = next((i for i, o in enumerate(outputs) if not o), None)
    no_answers = None if lacking is None else f"record {lacking}'s output is {_what(data[lacking])}"
    if all(outputs):
        _write_lines(answers, (json.dumps({"query_id": f"{name}-{i}", "question": q["input"], "answers": [o], "instruction": _instruction(q, o)})
                               for i, (q, o) in enumerate(zip(data, outputs, strict=True))))
    elif answers.exists():
        answers.unlink()  # a previous conversion's gold must not outlive its set
    return {"rules": len(base), "queries": len(data), "qrels": len(qrels), "answers": len(data) if all(outputs) else 0,
            "no_answers": no_answers, "rules_file": str(rules_path), "queries_file": str(data_path)}


CHOICE_INSTRUCTION = "Answer with the letter of the correct option."


def _instruction(q: dict, output: str) -> str:
    """The record's instruction; for a multiple-choice record that gives none (deer,
    theoremQA), one asking for the option's letter, which is what its output is."""
    from logicrank.pipelines.evaluation.qa import option_letter

    given = str(q.get("instruction") or "").strip()
    return given or (CHOICE_INSTRUCTION if option_letter(output) else "")


def _what(q: dict) -> str:
    """Why a record has no text output, in words."""
    if "output" not in q:
        return "missing"
    o = q["output"]
    return "null" if o is None else "empty" if isinstance(o, str) else f"a {type(o).__name__}, not text"


def _output(q: dict) -> str:
    """A record's gold output as text ("" when it has none)."""
    o = q.get("output")
    if isinstance(o, bool):
        return str(o)
    return str(o).strip() if isinstance(o, (str, int, float)) else ""


def _write_lines(path: Path, lines) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
