"""ITLR's real-corpus recipe (paper appendix): logical questions about an indexed corpus,
with LLM relevance labels. The pieces here are plain functions over lists and Arrow tables,
with the schemas of the checkpoint tables (``TOPICS``, ``QUESTIONS``, ``LABELS``);
``jobs/generate.py`` runs them on the job's LLM pool, shard by shard, with checkpoints.

1. **Topics**: the LLM lists each sampled document's salient topics (a JSON list of short
   strings, under a JSON schema). An output that does not parse, or holds no usable topic
   (2 to 80 characters and at most 8 words, with a word of letters, no double quote or
   backslash), falls back to the
   document's title (counted).
2. **Logical queries**: a shard's topics fill the 32 three-term templates of the synthetic
   benchmark (``pipelines.generate.synthetic.TEMPLATES``: one source of templates). Query
   ``j`` of shard ``s`` takes template ``(s * per_shard + j) mod 32``, so every template is
   used as evenly as the count allows, and three topics of three different documents of the
   shard (seeded per shard).
3. **Questions**: the LLM turns each logical query into a natural question (one line ending
   in '?', regex-constrained); the logical form stays beside it. An unusable output falls
   back to the template's plain rendering ("a and not b or c?"), counted.
4. **Deduplication**: exact (normalised text: lower case, punctuation and extra spaces
   removed) then near duplicates (cosine of the questions' embeddings above a threshold),
   in query-id order: the first of a group is kept; both counted.
5. **Labels**: one truth prompt per (question, candidate document); the candidates are the
   union of the configured retrievers' top k (dense, bm25, ITLR with the gold form). The
   label table keeps P(True) and both logits; a pair is relevant when P(True) >= the
   threshold (documented in the card).
"""

from __future__ import annotations

import json
import math
import random
import re
import string
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from logicrank.pipelines.config.settings import GenerateConfig
from logicrank.pipelines.engines.store import DocStore
from logicrank.pipelines.files import write_text_atomic
from logicrank.pipelines.generate.synthetic import TEMPLATES, Template
from logicrank.pipelines.markdown import table
from logicrank.schemas.errors import UserError

MAX_TOPIC_CHARS = 80
MAX_TOPIC_WORDS = 8
QUESTION_REGEX = r"[A-Z][^\n\"?]{4,200}\?"  # one line, capitalised, ends in '?'

TOPICS = pa.schema([("doc_id", pa.string()), ("shard", pa.int32()), ("topics", pa.list_(pa.string())), ("status", pa.string()),
                    ("raw_output", pa.string())])
QUESTIONS = pa.schema([
    ("query_id", pa.string()), ("shard", pa.int32()), ("template", pa.string()), ("negations", pa.int32()), ("logical_query", pa.string()),
    ("terms", pa.list_(pa.string())), ("source_doc_ids", pa.list_(pa.string())), ("text", pa.string()), ("status", pa.string()),
    ("raw_output", pa.string()),
])
LABELS = pa.schema([
    ("query_id", pa.string()), ("doc_id", pa.string()), ("sources", pa.list_(pa.string())), ("p_true", pa.float64()),
    ("logit_true", pa.float64()), ("logit_false", pa.float64()), ("exact", pa.bool_()), ("label", pa.int32()),
])


class GenerateError(UserError, RuntimeError):
    """A table to generate from that is missing or too small, or a run directory of another config."""


def sample_docs(store: DocStore, n: int, seed: int) -> list[str]:
    """``n`` document ids drawn from the table's sorted ids (seeded), sorted. The ids stay in
    Arrow (at 10M documents a Python string each was about 0.7 GiB in the driver): sorted by
    their UTF-8 bytes, which is Python's order of the same strings, and drawn by position, as
    ``random.sample`` draws from a sorted list, so the documents are those a list gives."""
    import pyarrow.compute as pc

    ids = pa.chunked_array([batch.column(0) for batch in store.scan(["doc_id"])], pa.string())
    if len(ids) < n:
        raise GenerateError(f"generate: the table holds {len(ids)} documents; --docs {n} asks for more")
    picks = random.Random(f"generate:{seed}:docs").sample(range(len(ids)), n)
    return sorted(ids.take(pc.sort_indices(ids).take(pa.array(picks, pa.int64()))).to_pylist())


def shard(sample: list[str], size: int) -> list[list[str]]:
    """Shards of ``size`` documents; a last one too small to fill a template (fewer than
    three documents) joins the one before it."""
    shards = [sample[i : i + size] for i in range(0, len(sample), size)]
    if len(shards) > 1 and len(shards[-1]) < 3:
        last = shards.pop()
        shards[-1] = shards[-1] + last
    return shards


def waves(todo: list[int], size: int) -> list[list[int]]:
    """``todo`` (shard numbers) cut into waves of ``size``, in order."""
    return [todo[i : i + size] for i in range(0, len(todo), size)]


def document_texts(store: DocStore, ids: list[str], model_dir: str, budget: int) -> tuple[dict[str, dict], dict[str, str]]:
    """The documents' rows and their "title. text" cut to ``budget`` tokens of the LLM's tokenizer."""
    from logicrank.pipelines.llm import prompts

    rows = {r["doc_id"]: r for r in store.rows_for(ids, ["title", "text"]).to_pylist()}
    texts = {d: f"{rows[d]['title'] or ''}. {rows[d]['text']}".strip(". ") for d in ids}
    return rows, prompts.cut_to_tokens(model_dir, texts, budget) if ids else {}


def output_text(gen) -> str | Exception:
    """An engine result as the recipe reads it: the generated text, or the exception in its slot."""
    return gen if isinstance(gen, Exception) else gen.text


def dedup_questions(cfg: GenerateConfig, questions: pa.Table) -> tuple[pa.Table, dict[str, str]]:
    """The questions (a ``QUESTIONS`` table) without exact and near duplicates (:func:`dedup`
    over their embeddings), sorted by query id, and query_id -> why each dropped one went."""
    from logicrank.pipelines.engines.embed import Embedder

    questions = questions.sort_by("query_id")
    texts = questions.column("text").to_pylist()
    vectors = Embedder(cfg.embed).encode(texts) if texts else None
    forms = [logic_key(q) for q in questions.column("logical_query").to_pylist()]
    keep, dropped = dedup(questions.column("query_id").to_pylist(), texts, vectors, cfg.dedup_threshold, forms) if texts else ([], {})
    return questions.take(pa.array(keep, pa.int64())), dropped


def logic_key(logical_query: str) -> tuple:
    """What a question's logical form asks, for near-duplicate removal: its terms (as
    :func:`normalise` writes them) and its truth table over them. "A and B or C" and "A and B
    and C" embed alike (cosine 0.96 with MiniLM) but have other gold sets; two forms alike up to
    term order, brackets and case have one key."""
    from logicrank.pipelines.retrieval.logic.query import holds, parse

    node = parse(logical_query)
    terms = sorted({normalise(t) for t in node.terms()})
    if len(terms) > 12:  # (no template has so many: the form as written)
        return (logical_query,)
    table = []
    for bits in range(1 << len(terms)):
        present = {normalise(t) for i, t in enumerate(terms) if bits >> i & 1}
        table.append(holds(node, {t for t in node.terms() if normalise(t) in present}))
    return tuple(terms), tuple(table)


def write_queries(kept: pa.Table, path: Path) -> None:
    """The kept questions as a queries JSONL (``_id``, ``text`` and the logical form), atomically."""
    rows = kept.select(["query_id", "text", "logical_query", "template", "negations", "terms", "source_doc_ids", "status"]).to_pylist()
    lines = [json.dumps({"_id": r.pop("query_id"), **r}, ensure_ascii=False) for r in rows]
    write_text_atomic("".join(line + "\n" for line in lines), path)


def topics_schema(max_topics: int) -> dict:
    return {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": MAX_TOPIC_CHARS}, "minItems": 1, "maxItems": max_topics}


def usable_topic(t: object) -> str | None:
    if not isinstance(t, str):
        return None
    t = " ".join(t.split()).strip(" .,;:")
    if not 2 <= len(t) <= MAX_TOPIC_CHARS or '"' in t or "\\" in t or len(t.split()) > MAX_TOPIC_WORDS or not re.search(r"[^\W\d_]{2}", t):
        return None
    return t


def parse_topics(raw: str | None, max_topics: int) -> list[str]:
    """Distinct usable topics of the LLM's JSON list, in order (empty: fall back)."""
    try:
        value = json.loads(raw or "")
    except json.JSONDecodeError:
        return []
    if not isinstance(value, list):
        return []
    out: dict[str, None] = {}
    for t in value:
        u = usable_topic(t)
        if u and u.lower() not in {k.lower() for k in out}:
            out[u] = None
    return list(out)[:max_topics]


def fallback_topic(title: str | None, text: str) -> str:
    """A document's title, or its first eight words, as one topic."""
    base = usable_topic(title or "") or usable_topic(" ".join((text or "").split()[:8]).replace('"', "")) or "untitled document"
    return base[:MAX_TOPIC_CHARS]


@dataclass(frozen=True)
class Draft:
    """A logical query before its question: its template, terms and where the terms came from."""

    query_id: str
    shard: int
    template: Template
    terms: tuple[str, str, str]
    source_doc_ids: tuple[str, str, str]

    @property
    def logical_query(self) -> str:
        return self.template.logical(self.terms)


def template_for(shard: int, j: int, per_shard: int) -> Template:
    return TEMPLATES[(shard * per_shard + j) % len(TEMPLATES)]


def fill_templates(shard: int, topics: dict[str, list[str]], per_shard: int, seed: int) -> list[Draft]:
    """``per_shard`` logical queries from the shard's topics (doc_id -> topics, documents with
    at least one topic), each with three topics of three different documents, no two the same
    (case aside: ``a AND NOT a`` is no instance of its template); none when the shard's
    documents offer fewer than three such topics."""
    docs = sorted(d for d, ts in topics.items() if ts)
    rng = random.Random(f"generate:{seed}:{shard}")
    out = []
    for j in range(per_shard):
        drawn = _three_topics(rng, docs, topics)
        if drawn is None:
            return []
        picked, terms = drawn
        out.append(Draft(f"gen-{shard:05d}-{j:03d}", shard, template_for(shard, j, per_shard), terms, picked))
    return out


def _three_topics(rng: random.Random, docs: list[str], topics: dict[str, list[str]]) -> tuple[tuple[str, str, str], tuple[str, str, str]] | None:
    """Three documents of ``docs`` and a topic of each, the topics distinct (case aside), drawn
    at random among the ways there are (documents and each one's topics in a random order,
    searched in that order: a topic taken early never leaves a later document without one
    when another choice would do); None when no three documents offer three such topics."""
    order = rng.sample(docs, len(docs))
    choices = {d: rng.sample(topics[d], len(topics[d])) for d in order}

    def pick(start: int, picked: tuple[str, ...], terms: tuple[str, ...]):
        if len(terms) == 3:
            return picked, terms
        taken = {t.lower() for t in terms}
        for i in range(start, len(order) - (2 - len(terms))):
            for t in choices[order[i]]:
                if t.lower() not in taken and (found := pick(i + 1, (*picked, order[i]), (*terms, t))):
                    return found
        return None

    return pick(0, (), ())


def usable_question(text: str | None) -> str | None:
    t = " ".join((text or "").split())
    return t if re.fullmatch(QUESTION_REGEX, t) else None


def fallback_question(d: Draft) -> str:
    q = d.template.natural(d.terms)
    return q[:1].upper() + q[1:] + "?"


def topic_row(doc_id: str, shard: int, output: str | Exception, title: str | None, text: str, max_topics: int) -> dict:
    """A document's row of the topics table from the LLM's output (its text, or the exception
    the engine raised): the parsed topics, or the title as the fallback (step 1)."""
    raw = None if isinstance(output, Exception) else output
    topics = parse_topics(raw, max_topics)
    return {"doc_id": doc_id, "shard": shard, "topics": topics or [fallback_topic(title, text)], "status": "ok" if topics else "fallback",
            "raw_output": raw if raw is not None else f"error: {output}"}


def question_row(d: Draft, shard: int, output: str | Exception) -> dict:
    """A draft's row of the questions table from the LLM's output (its text, or the exception
    the engine raised): the question, or the template's plain rendering as the fallback (step 3)."""
    raw = None if isinstance(output, Exception) else output
    q = usable_question(raw)
    return {"query_id": d.query_id, "shard": shard, "template": d.template.name, "negations": d.template.negations,
            "logical_query": d.logical_query, "terms": list(d.terms), "source_doc_ids": list(d.source_doc_ids),
            "text": q or fallback_question(d), "status": "ok" if q else "fallback", "raw_output": raw if raw is not None else f"error: {output}"}


_PUNCT = str.maketrans("", "", string.punctuation)


def normalise(text: str) -> str:
    return " ".join(text.lower().translate(_PUNCT).split())


def dedup(query_ids: list[str], texts: list[str], vectors: np.ndarray, threshold: float,
          forms: list[tuple] | None = None) -> tuple[list[int], dict[str, str]]:
    """Indices kept (in the given order) and, for each dropped query, why ('exact' or 'near
    <kept id> <cosine>'). ``vectors``: normalised embeddings of ``texts``. ``forms``: each
    question's :func:`logic_key`: a near duplicate is one of a kept question of the same logic
    (an exact copy of a text goes whatever its form: one question cannot have two gold sets)."""
    kept: list[int] = []
    dropped: dict[str, str] = {}
    seen: dict[str, str] = {}  # normalised text -> the kept question
    near: dict[str, str] = {}  # normalised text -> a question dropped as a near duplicate
    for i, (qid, text) in enumerate(zip(query_ids, texts, strict=True)):
        key = normalise(text)
        if key in seen:
            dropped[qid] = f"exact {seen[key]}"
            continue
        alike = kept if forms is None else [k for k in kept if forms[k] == forms[i]]
        if alike:
            sims = vectors[alike] @ vectors[i]
            j = int(np.argmax(sims))
            if sims[j] > threshold:  # dropped; an exact copy of a question dropped so is counted exact
                dropped[qid] = f"exact {near[key]}" if key in near else f"near {query_ids[alike[j]]} {sims[j]:.3f}"
                near.setdefault(key, qid)
                continue
        seen[key] = qid
        kept.append(i)
    return kept, dropped


def label(p_true: float, logit_true: float, logit_false: float, exact: bool, threshold: float, where: str) -> int:
    """A judged pair's label: relevant when P(True) >= ``threshold``, except a pair the engine
    gave no evidence for (neither label's logit returned, or both masked: P(True) 0.5 from
    nothing, which a threshold of 0.5 read as relevant): not relevant, and counted on the card
    (:func:`label_counts`). A NaN P(True) (a NaN logit: an overflow in the model) is refused,
    naming the pair (``where``), rather than read as not relevant."""
    if math.isnan(p_true):
        raise GenerateError(f"generate: the engine's P(True) is NaN for {where} (logits {logit_true}, {logit_false}: an overflow in "
                            "the model); nothing of this wave is written. Try another dtype or model.")
    return 0 if no_evidence(logit_true, logit_false, exact) else int(p_true >= threshold)


def no_evidence(logit_true: float, logit_false: float, exact: bool) -> bool:
    """Neither label's logit came back, or both were masked (-inf): the engine's 0.5 says nothing."""
    return logit_true == logit_false and (not exact or math.isinf(logit_true))


def label_counts(p_true: list[float], labels: list[int], per_query: Counter, exact: list[bool] | None = None,
                 logits: list[tuple[float, float]] | None = None) -> dict:
    """The card's label distribution: positives, P(True) histogram, positives per question, and
    the pairs whose logits were not both returned (``inexact``: one label bounded by the
    smallest value returned) or neither (``no_evidence``: labelled not relevant, :func:`label`)."""
    hist, edges = np.histogram(np.asarray(p_true, dtype=float), bins=10, range=(0.0, 1.0))
    pos = np.asarray(list(per_query.values()), dtype=int)
    exact = exact if exact is not None else [True] * len(labels)
    logits = logits if logits is not None else [(0.0, 1.0)] * len(labels)
    return {
        "pairs": len(labels), "relevant": int(sum(labels)), "relevant_share": round(float(np.mean(labels)) if labels else 0.0, 4),
        "inexact": sum(not e for e in exact),
        "no_evidence": sum(no_evidence(t, f, e) for (t, f), e in zip(logits, exact, strict=True)),
        "p_true_histogram": {f"{edges[i]:.1f}-{edges[i + 1]:.1f}": int(h) for i, h in enumerate(hist)},
        "relevant_per_question": {"mean": round(float(pos.mean()), 3) if len(pos) else 0.0, "min": int(pos.min()) if len(pos) else 0,
                                  "max": int(pos.max()) if len(pos) else 0, "questions_without_any": int((pos == 0).sum())},
    }


def card(c: dict) -> str:
    """The dataset card (Markdown) from the job's counts."""
    cfg = c["config"]
    lines = [
        f"# Generated dataset: {c['name']}",
        "",
        f"ITLR's real-corpus recipe over `{cfg['db']}` (table `{cfg['table']}`, version {c['table_version']}, {c['corpus_docs']:,} documents): "
        f"{cfg['docs']} documents sampled with seed {cfg['seed']}, topics extracted by the LLM, the 32 three-term templates filled with them, "
        "each logical query rewritten as a natural question by the LLM (the logical form is kept beside it), candidates from "
        f"{', '.join(cfg['candidates'])} (top {cfg['candidate_k']} each, union), relevance judged by the LLM with one truth prompt per pair.",
        "",
    ]
    if c.get("demo_note"):
        lines += [f"**{c['demo_note']}**", ""]
    lines += [
        f"- Config hash: `{c['config_hash']}`; model: `{c['model']}`; encoder: `{c['encoder']}`.",
        "- Prompt templates: " + ", ".join(f"`{k}` {v}" for k, v in c["prompts"].items()) + ".",
        f"- Documents: {c['docs_sampled']} sampled in {c['shards']} shard(s) of {cfg['shard_docs']} (a last one too small joins the one before); topics: {c['topics']} "
        f"({c['topic_fallbacks']} documents' outputs were unusable: their title, or first words, became their one topic).",
        f"- Questions: {c['drafted']} drafted, {c['question_fallbacks']} fell back to the plain rendering; "
        f"{c['dedup']['exact']} exact and {c['dedup']['near']} near duplicates removed (cosine > {cfg['dedup_threshold']}); "
        f"**{c['questions']} kept**.",
        f"- Labels: {c['labels']['pairs']:,} (question, document) pairs judged; relevant when P(True) >= {cfg['label_threshold']} "
        f"(qrels/test.tsv holds those): {c['labels']['relevant']:,} ({100 * c['labels']['relevant_share']:.1f}%); "
        f"relevant per question mean {c['labels']['relevant_per_question']['mean']}, "
        f"{c['labels']['relevant_per_question']['questions_without_any']} questions with none. "
        f"{c['labels'].get('inexact', 0)} pair(s) had a label's logit missing from the engine's output (bounded by the smallest "
        f"returned), {c['labels'].get('no_evidence', 0)} both (P(True) 0.5 from nothing: labelled not relevant).",
        "",
        *table(["template", "questions"], ([f"`{t}`", n] for t, n in c["per_template"].items() if n), "lr"),
        "",
        f"{sum(1 for n in c['per_template'].values() if not n)} of the {len(c['per_template'])} templates have no question "
        "(query j of shard s takes template (s x questions per shard + j) mod 32: more documents cover them all).",
        "",
        *table(["negations", "questions"], sorted(c["per_negations"].items()), "rr"),
        "",
        "P(True) of the judged pairs: " + ", ".join(f"{k}: {v}" for k, v in c["labels"]["p_true_histogram"].items()) + ".",
        "",
        "Files: `queries.jsonl` (question, `logical_query`, template, negations, terms, source documents), `qrels/test.tsv`, "
        "`labels.parquet` (every judged pair: P(True), logits, label, which retrievers proposed it), `corpus.json` (the table this "
        "dataset refers to: evaluate against it), `generation.json` (these counts).",
        "",
    ]
    return "\n".join(lines)
