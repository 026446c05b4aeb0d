"""Set-logic queries with exact gold over an entity corpus: LIMIT's people and their likes.

LIMIT-small (bundled, ``pipelines/datasets/limit/LICENSE.md``) has 46 documents "X likes A,
B, ..., Y and Z." and 1,000 single-attribute queries "Who likes A?". The like-lists are the
ground truth, so any set expression over items has an exact answer set. From them this module
writes QUEST-style queries with QUEST's seven templates:

    A | A and B | A or B | A or B or C | A and B and C | A but not B | A and B but not C

Each query carries its natural question ("Who likes Quokkas but not Tapirs?"), its ITLR
logical query (``"Quokkas" AND NOT "Tapirs"``), its OrLog atoms (``{x} likes Quokkas``) and
form over their ids (``"a1" AND NOT "a2"``), and its gold set: the people for whom the logical
query holds on their like-list (:func:`logicrank.pipelines.retrieval.logic.query.holds`, the evaluator of ITLR's
synthetic benchmark). A template instance is kept when its gold set is non-empty and is not
the whole corpus, and when the same items in the same template were not drawn before.

Sampling (seeded; each template draws from its own stream, so the same seed gives the same
queries whatever ``per_template`` the other templates get): items of an AND come from one
person's list (the gold set is never empty by chance); items of an OR are any items; a NOT
item is taken from the list of another person who shares the positive items where there is
one (a hard negative: it removes someone who would otherwise be an answer). Each query records
whom its NOT items take out (``negated_out``) and ``generation.json`` counts the queries whose
negation changes the answer (``negation_bites``): on LIMIT-small no two people share two
items, so "A and B" has one answer at most and "A and B but not C" can only keep it (a C
that removed it would leave nothing): there, that template tests the AND part alone.

Output, BEIR layout plus the gold decompositions:

    <out>/corpus.jsonl           _id (the name, spaces as '_'), title (the name), text (verbatim)
    <out>/queries.jsonl          _id, text, logical_query, template, items, atoms, form, gold, negated_out
    <out>/qrels/test.tsv         every gold person of every query, relevance 1
    <out>/decompositions.parquet method 'orlog', the gold atoms and form (DECOMPOSITIONS), for
                                 a ``decomposition`` stage reading a table
    <out>/generation.json        config, counts per template, rejected draws
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from logicrank.pipelines.datasets import _HERE
from logicrank.pipelines.files import read_jsonl
from logicrank.pipelines.retrieval.logic.query import holds, parse, quote
from logicrank.schemas.errors import UserError

LIMIT_DIR = _HERE / "limit"
GOLD_MODEL = "gold"  # the decompositions table's model for hand-derived (not generated) rows


class SetLogicError(UserError, ValueError):
    """An entity corpus that is not LIMIT-shaped, or like-lists that disagree with its qrels."""


@dataclass(frozen=True)
class SetTemplate:
    """``positives`` items joined by ``op``, then ``negatives`` items each under NOT (AND-ed)."""

    name: str
    positives: int
    op: str  # AND | OR (how the positive items combine)
    negatives: int = 0

    @property
    def size(self) -> int:
        return self.positives + self.negatives

    def logical(self, items: tuple[str, ...]) -> str:
        pos = f" {self.op} ".join(quote(i) for i in items[: self.positives])
        if not self.negatives:
            return pos
        if self.op == "OR" and self.positives > 1:
            pos = f"({pos})"
        return " AND ".join([pos, *(f"NOT {quote(i)}" for i in items[self.positives :])])

    def question(self, items: tuple[str, ...]) -> str:
        pos = list(items[: self.positives])
        word = "and" if self.op == "AND" else "or"
        said = pos[0] if len(pos) == 1 else f"{', '.join(pos[:-1])} {word} {pos[-1]}"
        neg = items[self.positives :]
        return f"Who likes {said}" + (f" but not {' or '.join(neg)}" if neg else "") + "?"

    def form(self) -> str:
        """The same expression over atom ids a1, a2, ... (OrLog's form)."""
        return self.logical(tuple(f"a{i + 1}" for i in range(self.size)))


# QUEST's templates (Malaviya et al., 2023), in its order
TEMPLATES: tuple[SetTemplate, ...] = (
    SetTemplate("A", 1, "AND"),
    SetTemplate("A and B", 2, "AND"),
    SetTemplate("A or B", 2, "OR"),
    SetTemplate("A or B or C", 3, "OR"),
    SetTemplate("A and B and C", 3, "AND"),
    SetTemplate("A but not B", 1, "AND", 1),
    SetTemplate("A and B but not C", 2, "AND", 1),
)
TEMPLATE_NAMES = tuple(t.name for t in TEMPLATES)


def parse_likes(name: str, text: str, known: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The items of "<name> likes A, B, ..., Y and Z." in order (no serial comma in LIMIT). An
    item may itself hold " and " ("Fish and Chips", "Macaroni and Cheese"): where the last two
    items' " and " is not the only one, the split is the one into two ``known`` items (those
    read where nothing is ambiguous: :func:`load_limit`), and none or two such is refused."""
    head = f"{name} likes "
    if not text.startswith(head) or not text.endswith("."):
        raise SetLogicError(f"limit: document {name!r} is not '{name} likes A, B and C.': {text[:80]!r}")
    *first, last = text[len(head) : -1].split(", ")
    if " and " not in last:
        if first:
            raise SetLogicError(f"limit: document {name!r}: no ' and ' before the last item: {last!r}")
        return [last]
    words = last.split(" and ")
    splits = [(" and ".join(words[:k]), " and ".join(words[k:])) for k in range(1, len(words))]
    if len(splits) > 1:
        splits = [s for s in splits if s[0] in known and s[1] in known]
        if len(splits) != 1:
            raise SetLogicError(f"limit: document {name!r}: {last!r} is two items split at one of its ' and 's, and "
                                f"{len(splits)} of those splits give items read elsewhere in the corpus; the like-list is ambiguous")
    return [*first, *splits[0]]


def _lines(path: Path) -> list[dict]:
    return [obj for _, obj in read_jsonl(path, "limit:", SetLogicError)]


def _file(root: Path, stem: str) -> Path:
    for name in (f"{stem}.jsonl.gz", f"{stem}.jsonl"):
        if (root / name).is_file():
            return root / name
    raise SetLogicError(f"limit: {root} holds no {stem}.jsonl(.gz)")


def doc_id(name: str) -> str:
    """A person's document id: the name with spaces as '_' (TREC run files split on spaces)."""
    return name.replace(" ", "_")


def load_limit(root: str | Path | None = None) -> dict[str, list[str]]:
    """name -> liked items, checked against LIMIT's own qrels: the people whose parsed list
    holds a query's item must be exactly the query's relevant documents (all 1,000)."""
    root = Path(root) if root else LIMIT_DIR
    docs, queries = _lines(_file(root, "corpus")), _lines(_file(root, "queries"))
    # the items read where no " and " can mislead: every item but a list's last two, and the queried ones
    known = {q["text"].removeprefix("Who likes ").removesuffix("?") for q in queries}
    for d in docs:
        body = d["text"].removeprefix(f"{d['_id']} likes ").removesuffix(".")
        known.update(body.split(", ")[:-1])
    likes = {d["_id"]: parse_likes(d["_id"], d["text"], known) for d in docs}
    holders: dict[str, set[str]] = {}
    for name, items in likes.items():
        for item in items:
            holders.setdefault(item, set()).add(name)
    gold: dict[str, set[str]] = {}
    for r in _lines(_file(root, "qrels")):
        if int(r.get("score", 1)) > 0:
            gold.setdefault(r["query-id"], set()).add(r["corpus-id"])
    for q in queries:
        item = q["text"].removeprefix("Who likes ").removesuffix("?")
        if holders.get(item, set()) != gold.get(q["_id"], set()):
            raise SetLogicError(f"limit: query {q['_id']} ({q['text']!r}): the parsed like-lists give {sorted(holders.get(item, ()))}, "
                                f"its qrels {sorted(gold.get(q['_id'], ()))}; the corpus is not LIMIT-shaped")
    return likes


def gold_set(template: SetTemplate, items: tuple[str, ...], likes: dict[str, list[str]]) -> list[str]:
    ast = parse(template.logical(items))
    wanted = set(items)
    return sorted(name for name, liked in likes.items() if holds(ast, wanted.intersection(liked)))


def _draw(t: SetTemplate, rng: random.Random, people: list[str], likes: dict[str, list[str]], vocab: list[str],
          holders: dict[str, list[str]]) -> tuple[str, ...]:
    if t.op == "OR" or t.positives == 1 and not t.negatives:
        pos = rng.sample(vocab, t.positives)
    else:
        person = rng.choice(people)
        pos = rng.sample(likes[person], t.positives)
    neg: list[str] = []
    if t.negatives:
        sharing = sorted({p for i in pos for p in holders[i]})
        pool = sorted({i for p in sharing for i in likes[p]} - set(pos))
        if t.op == "AND":  # a hard negative: liked by someone who likes every positive item, not by everyone who does
            answers = [p for p in sharing if all(i in likes[p] for i in pos)]
            pool = sorted({i for p in answers for i in likes[p]} - set(pos)) if len(answers) > 1 else pool
        neg = rng.sample(pool, t.negatives) if len(pool) >= t.negatives else rng.sample(vocab, t.negatives)
    return tuple(pos + neg)


def generate(out: str | Path, per_template: int = 20, seed: int = 0, root: str | Path | None = None,
             templates: tuple[str, ...] = TEMPLATE_NAMES) -> dict:
    """Write the set to ``out``; returns the counts (also in ``generation.json``). Same
    inputs, same bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from logicrank.pipelines.files import atomic_path
    from logicrank.schemas.tables import DECOMPOSITIONS, question_sha

    unknown = [t for t in templates if t not in TEMPLATE_NAMES]
    if unknown:
        raise SetLogicError(f"setlogic: unknown template(s) {unknown}; valid: {', '.join(TEMPLATE_NAMES)}")
    if per_template < 1:
        raise SetLogicError(f"setlogic: per_template {per_template}: must be at least 1")
    likes = load_limit(root)
    people = sorted(likes)
    ids: dict[str, str] = {}
    for person in people:  # "Ann Lee" and "Ann_Lee" would be one document id: two people merged in the corpus and the qrels
        if (other := ids.setdefault(doc_id(person), person)) != person:
            raise SetLogicError(f"limit: {other!r} and {person!r} make one document id {doc_id(person)!r}; give people names "
                                "that differ other than by spaces and underscores")
    vocab = sorted({i for items in likes.values() for i in items})
    holders: dict[str, list[str]] = {}
    for p in people:
        for i in likes[p]:
            holders.setdefault(i, []).append(p)
    queries, rejected, kept = [], Counter(), Counter()
    for t_idx, t in enumerate(TEMPLATES):
        if t.name not in templates:
            continue
        rng = random.Random(f"setlogic:{seed}:{t.name}")
        seen: set[frozenset] = set()
        for _ in range(per_template * 50):
            if kept[t.name] == per_template:
                break
            items = _draw(t, rng, people, likes, vocab, holders)
            key = frozenset(items[: t.positives]), frozenset(items[t.positives :])
            gold = gold_set(t, items, likes)
            why = "repeat" if key in seen else "empty gold" if not gold else "whole corpus" if len(gold) == len(people) else ""
            seen.add(key)
            if why:
                rejected[f"{t.name}: {why}"] += 1
                continue
            n = kept[t.name]
            kept[t.name] += 1
            # the people the NOT items take out of the positive part's answers (none: the negation changes nothing here)
            negated_out = sorted(set(gold_set(SetTemplate(t.name, t.positives, t.op), items[: t.positives], likes)) - set(gold)) if t.negatives else []
            queries.append({
                "_id": f"setlogic-{t_idx}-{n:03d}", "text": t.question(items), "logical_query": t.logical(items), "template": t.name,
                "items": list(items), "atoms": [{"id": f"a{i + 1}", "text": f"{{x}} likes {item}"} for i, item in enumerate(items)],
                "form": t.form(), "gold": [doc_id(p) for p in gold], "negated_out": [doc_id(p) for p in negated_out],
            })
    short = {t: per_template - kept[t] for t in templates if kept[t] < per_template}
    out = Path(out)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    text_of = {d["_id"]: d["text"] for d in _lines(_file(Path(root) if root else LIMIT_DIR, "corpus"))}
    _write_jsonl(out / "corpus.jsonl", [{"_id": doc_id(p), "title": p, "text": text_of[p]} for p in people])
    _write_jsonl(out / "queries.jsonl", queries)
    with atomic_path(out / "qrels" / "test.tsv") as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"{q['_id']}\t{d}\t1\n" for q in queries for d in q["gold"])
    rows = [{"query_id": q["_id"], "method": "orlog", "model": GOLD_MODEL, "prompt_sha": GOLD_MODEL, "question_sha": question_sha(q["text"]), "raw_output": None,
             "logical_query": q["form"], "atoms": q["atoms"], "expansion": None, "status": "ok", "error": None, "finish_reason": None,
             "prompt_tokens": 0, "generated_tokens": 0, "cached": False} for q in queries]
    with atomic_path(out / "decompositions.parquet") as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=DECOMPOSITIONS), tmp)
    counts = {
        "config": {"per_template": per_template, "seed": seed, "templates": list(templates), "source": str(root or "bundled LIMIT-small")},
        "people": len(people), "items": len(vocab), "queries": len(queries), "qrels": sum(len(q["gold"]) for q in queries),
        "per_template": dict(kept), "gold_size": {t: _mean([len(q["gold"]) for q in queries if q["template"] == t]) for t in kept},
        "rejected": dict(sorted(rejected.items())), "short": short,
        "negation_bites": {t.name: sum(bool(q["negated_out"]) for q in queries if q["template"] == t.name) for t in TEMPLATES
                           if t.negatives and t.name in kept},
    }
    with atomic_path(out / "generation.json") as tmp:
        tmp.write_text(json.dumps(counts, indent=1) + "\n", encoding="utf-8")
    return counts


def _mean(xs: list[int]) -> float:
    return round(sum(xs) / len(xs), 3) if xs else 0.0


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    from logicrank.pipelines.files import atomic_path

    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
