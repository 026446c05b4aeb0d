"""ITLR's synthetic logical benchmark, built deterministically from real SciFact text.

All 32 templates of 3-term queries: two binary operators (AND / OR, 4 ways) times a NOT on
any subset of the three terms (8 ways), read with the usual precedence. For a query:

- its three topics are three distinct SciFact documents; a topic's term is its title;
- a generated document "matching" a set of topics is the first sentence of each of those
  topics' abstracts (each cut to ``max_words`` words, so three stay inside the encoder's
  256-token window); the empty set is a sentence from an unrelated document;
- positives: topic sets for which the query is true; hard negatives: sets for which it is
  false and that differ from a kept positive by moving exactly one term to the other side;
  up to 3 of each per query (the paper's setting).

Output, BEIR layout: ``corpus.jsonl``, ``queries.jsonl`` (with ``logical_query``,
``negations``, ``template``), ``qrels/test.tsv`` (each query's own positives: the paper's
judgements), ``labels.jsonl`` (which topics each generated document contains: what supervised
calibration learns from), and for the two settings of the benchmark (jobs/experiments/
itlr-synthetic*.yaml): ``qrels/own.tsv`` lists each query's own documents (the candidates of
the ``own`` setting, where a query ranks only those), ``qrels/pooled.tsv`` judges every
generated document against every query (the ``pooled`` setting, see :func:`pooled_qrels`);
``decompositions.parquet``: OrLog's gold decomposition of each query (one atom per term, see
:func:`gold_orlog_decompositions`).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from logicrank.pipelines.files import atomic_path, read_jsonl
from logicrank.pipelines.retrieval.logic.query import holds, parse, quote, relabel, to_text
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import DECOMPOSITIONS

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


class SyntheticError(UserError, ValueError):
    """The corpus the benchmark is drawn from cannot be read."""


@dataclass(frozen=True)
class Template:
    ops: tuple[str, str]
    negated: tuple[bool, bool, bool]

    @property
    def negations(self) -> int:
        return sum(self.negated)

    @property
    def name(self) -> str:
        parts = [("NOT " if n else "") + v for n, v in zip(self.negated, "abc", strict=True)]
        return f"{parts[0]} {self.ops[0]} {parts[1]} {self.ops[1]} {parts[2]}"

    def logical(self, terms: tuple[str, str, str]) -> str:
        parts = [("NOT " if n else "") + quote(t) for n, t in zip(self.negated, terms, strict=True)]
        return f"{parts[0]} {self.ops[0]} {parts[1]} {self.ops[1]} {parts[2]}"

    def natural(self, terms: tuple[str, str, str]) -> str:
        """What a user would type: the same words without quotes."""
        parts = [("not " if n else "") + t.rstrip(".") for n, t in zip(self.negated, terms, strict=True)]
        return f"{parts[0]} {self.ops[0].lower()} {parts[1]} {self.ops[1].lower()} {parts[2]}"


TEMPLATES: tuple[Template, ...] = tuple(
    Template(ops, neg) for ops in itertools.product(("AND", "OR"), repeat=2) for neg in itertools.product((False, True), repeat=3)
)


def first_sentence(text: str, max_words: int) -> str:
    sentence = _SENTENCE_END.split(text.strip(), maxsplit=1)[0]
    words = sentence.split()
    return " ".join(words[:max_words])


def scifact_topics(corpus_path: Path, max_words: int) -> list[tuple[str, str]]:
    """(title, first sentence) of every SciFact document with both."""
    out = []
    for _, d in read_jsonl(corpus_path, "synthetic: corpus", SyntheticError):
        title, sentence = (d.get("title") or "").strip(), first_sentence(d.get("text") or "", max_words)
        if 3 <= len(title.split()) <= 30 and len(sentence.split()) >= 8 and '"' not in title:
            out.append((title, sentence))
    return out


def generate(corpus_path: str | Path, out: str | Path, per_template: int = 10, seed: int = 0, max_words: int = 55) -> dict[str, int]:
    """Write the benchmark to ``out``; returns counts. Same inputs, same files."""
    rng = random.Random(seed)
    topics = scifact_topics(Path(corpus_path), max_words)
    out = Path(out)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    docs, queries, qrels, labels = [], [], [], []
    subsets = [frozenset(s) for r in range(4) for s in itertools.combinations(range(3), r)]
    for t_idx, template in enumerate(TEMPLATES):
        for rep in range(per_template):
            qid = f"syn-{t_idx:02d}-{rep:03d}"
            picked = rng.sample(range(len(topics)), 4)  # three topics and one unrelated sentence
            terms = tuple(topics[i][0] for i in picked[:3])
            ast = parse(template.logical(terms))  # type: ignore[arg-type]
            truth = {s: holds(ast, {terms[i] for i in s}) for s in subsets}
            positives = [s for s in subsets if truth[s]]
            rng.shuffle(positives)
            positives = positives[:3]
            hard = {s ^ {i} for s in positives for i in range(3)}
            negatives = sorted((s for s in hard if not truth[s]), key=lambda s: (len(s), sorted(s)))
            rng.shuffle(negatives)
            negatives = negatives[:3]
            for kind, sets in (("p", positives), ("n", negatives)):
                for j, s in enumerate(sets):
                    doc_id = f"{qid}-{kind}{j}"
                    order = sorted(s)
                    rng.shuffle(order)
                    # the empty set's document holds the unrelated topic's sentence: it contains that
                    # topic, which may be another query's term (pooled_qrels reads it from here)
                    shown = order or [3]
                    text = " ".join(topics[picked[i]][1] for i in shown)
                    docs.append({"_id": doc_id, "title": "", "text": text})
                    labels.append({"doc_id": doc_id, "query_id": qid, "present": [topics[picked[i]][0] for i in sorted(shown)]})
                    if kind == "p":
                        qrels.append((qid, doc_id, 1))
            queries.append(
                {
                    "_id": qid,
                    "text": template.natural(terms),  # type: ignore[arg-type]
                    "logical_query": template.logical(terms),  # type: ignore[arg-type]
                    "negations": template.negations,
                    "template": template.name,
                    "terms": list(terms),
                }
            )
    _write_jsonl(out / "corpus.jsonl", docs)
    _write_jsonl(out / "queries.jsonl", queries)
    _write_jsonl(out / "labels.jsonl", labels)
    _write_qrels(out / "qrels" / "test.tsv", qrels)
    _write_qrels(out / "qrels" / "own.tsv", [(r["query_id"], r["doc_id"], 1) for r in labels])
    pooled = pooled_qrels([(q["_id"], q["logical_query"]) for q in queries], {r["doc_id"]: r["present"] for r in labels})
    _write_qrels(out / "qrels" / "pooled.tsv", pooled)
    with atomic_path(out / "decompositions.parquet") as tmp:
        pq.write_table(gold_orlog_decompositions([(q["_id"], q["logical_query"]) for q in queries]), tmp)
    return {"queries": len(queries), "docs": len(docs), "positives": len(qrels), "pooled_positives": len(pooled)}


def pooled_qrels(queries: list[tuple[str, str]], present: dict[str, list[str]]) -> list[tuple[str, str, int]]:
    """Ground truth over the pooled corpus, (query id, doc id, 1) rows: a document is relevant
    to a query (id, logical query) when the query holds for the query's topics the document
    contains (``present``: doc_id -> every topic whose sentence it holds). Other queries'
    documents usually contain none of them, so they match exactly the queries that the empty
    set satisfies (``NOT a AND NOT b AND NOT c``, ...)."""
    rows = []
    for qid, logical in queries:
        ast = parse(logical)
        terms = set(ast.terms())
        cache: dict[frozenset, bool] = {}
        for doc, topics in present.items():
            key = frozenset(terms.intersection(topics))
            if key not in cache:
                cache[key] = holds(ast, set(key))
            if cache[key]:
                rows.append((qid, doc, 1))
    return rows


def gold_orlog_decompositions(queries: Iterable[tuple[str, str]]) -> pa.Table:
    """OrLog rows (DECOMPOSITIONS) from (query id, gold logical query) pairs: one atom per
    term ("{x} discusses: <term>") and the same formula over the atom ids."""
    rows = []
    for qid, logical in queries:
        ast = parse(logical)
        ids = {t: f"a{i + 1}" for i, t in enumerate(ast.terms())}
        rows.append({
            "query_id": qid, "method": "orlog", "model": "gold", "prompt_sha": "-", "raw_output": None,
            "logical_query": to_text(relabel(ast, ids)), "atoms": [{"id": a, "text": f"{{x}} discusses: {t}"} for t, a in ids.items()],
            "expansion": None, "status": "ok", "error": None, "finish_reason": None, "prompt_tokens": 0, "generated_tokens": 0, "cached": False,
        })
    return pa.Table.from_pylist(rows, schema=DECOMPOSITIONS)


def _write_qrels(path: Path, rows: list[tuple[str, str, int]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"{q}\t{d}\t{r}\n" for q, d, r in rows)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
