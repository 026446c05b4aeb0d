"""Multi-hop question answering sets (MuSiQue, HotpotQA) in the BEIR layout plus an answers file.

Both are bundled (see ``musique/LICENSE.md`` and ``hotpotqa/LICENSE.md``); :func:`to_beir`
writes

    <out>/corpus.jsonl     one paragraph per line: _id, title, text
    <out>/queries.jsonl    _id, text (the question)
    <out>/qrels/test.tsv   query-id, corpus-id, 1 for each supporting (gold) paragraph
    <out>/answers.jsonl    one line per question, the gold side of QA evaluation:
                           {"query_id", "question", "answers": [answer, *aliases], "type",
                            "decomposition": [{"question", "answer", "doc_id"}, ...] (MuSiQue)}

which ``logicrank index`` reads as a corpus, ``logicrank evaluate`` as qrels (supporting-
paragraph recall) and ``logicrank evaluate --answers`` as QA gold. Nothing is dropped: a gold
paragraph missing from the corpus fails the conversion.

- MuSiQue: document ids ``musique-<n>`` (the corpus file's order); query ids are MuSiQue's
  own; a sub-question refers to an earlier answer as ``#k`` (1-based).
- HotpotQA: the corpus is the union of the questions' context paragraphs (a paragraph is its
  sentences joined; one document per distinct title and text), ids ``hotpotqa-doc-<n>`` in
  order of first appearance; query ids ``hotpotqa-<n>`` (the question's position); gold
  paragraphs are the context paragraphs whose title is a supporting fact's.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from pipelines.datasets import _HERE
from pipelines.files import atomic_path
from schemas.errors import UserError

SETS = ("musique", "hotpotqa")
_BUNDLED = {
    "musique": (_HERE / "musique" / "musique_train_100.json.gz", _HERE / "musique" / "musique_train_100_corpus.json.gz"),
    "hotpotqa": (_HERE / "hotpotqa" / "hotpot_dev_distractor_100.json.gz", None),
}


class QADataError(UserError, ValueError):
    """A question file that is not MuSiQue or HotpotQA in the expected shape."""


def _load(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise QADataError(f"{path}: no such file.") from None
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise QADataError(f"{path}: not a readable JSON file ({exc}).") from None


def musique(questions: Path, corpus: Path) -> tuple[list[dict], list[dict], list[tuple[str, str]], list[dict]]:
    """(docs, queries, qrels, answers) of a MuSiQue question file and its paragraph corpus."""
    qs, paragraphs = _load(questions), _load(corpus)
    if not isinstance(qs, list) or not isinstance(paragraphs, list):
        raise QADataError(f"musique: {questions} and {corpus} must each hold a JSON list.")
    docs, ids = [], {}
    for n, p in enumerate(paragraphs):
        doc_id = f"musique-{n}"
        docs.append({"_id": doc_id, "title": p.get("title") or "", "text": p["text"]})
        ids.setdefault((p.get("title") or "", p["text"]), doc_id)
    queries, qrels, answers = [], [], []
    for q in qs:
        try:
            own = q["paragraphs"]
            gold = [p for p in own if p["is_supporting"]]

            def doc_of(p, qid=q["id"]):
                key = (p.get("title") or "", p["paragraph_text"])
                if key not in ids:
                    raise QADataError(f"musique: question {qid}: gold paragraph {p.get('title')!r} is not in the corpus {corpus}.")
                return ids[key]

            steps = [{"question": s["question"], "answer": s["answer"], "doc_id": doc_of(own[s["paragraph_support_idx"]])}
                     for s in q["question_decomposition"]]
            queries.append({"_id": q["id"], "text": q["question"]})
            qrels += [(q["id"], d) for d in dict.fromkeys(doc_of(p) for p in gold)]
            answers.append({"query_id": q["id"], "question": q["question"], "answers": [q["answer"], *q.get("answer_aliases", [])], "type": f"{len(steps)}hop",
                            "decomposition": steps})
        except (KeyError, IndexError, TypeError) as exc:
            raise QADataError(f"musique: question {q.get('id') if isinstance(q, dict) else q!r} lacks {exc} (question_decomposition, paragraphs...).") from None
    return docs, queries, qrels, answers


def _hotpot_fields(q: dict) -> tuple[list[str], list[list[str]], set[str]]:
    """(titles, sentences per paragraph, supporting titles) from either HotpotQA layout: the
    official one (context: [[title, [sentences]], ...], supporting_facts: [[title, sent_id],
    ...]) or the Hugging Face datasets one (context: {"title": [...], "sentences": [...]},
    supporting_facts: {"title": [...], "sent_id": [...]}, the bundled file's)."""
    context, facts = q["context"], q["supporting_facts"]
    if isinstance(context, dict):
        titles, sentences = context["title"], context["sentences"]
    else:
        titles, sentences = [c[0] for c in context], [c[1] for c in context]
    supporting = set(facts["title"]) if isinstance(facts, dict) else {f[0] for f in facts}
    return titles, sentences, supporting


def hotpotqa(questions: Path) -> tuple[list[dict], list[dict], list[tuple[str, str]], list[dict]]:
    """(docs, queries, qrels, answers) of a HotpotQA (distractor) question file."""
    qs = _load(questions)
    if not isinstance(qs, list):
        raise QADataError(f"hotpotqa: {questions} must hold a JSON list.")
    docs, ids, queries, qrels, answers = [], {}, [], [], []
    for n, q in enumerate(qs):
        qid = f"hotpotqa-{n}"
        try:
            titles, sentences, supporting = _hotpot_fields(q)
            own = []
            for title, sents in zip(titles, sentences, strict=True):
                key = (title, "".join(sents).strip())
                if key not in ids:
                    ids[key] = f"hotpotqa-doc-{len(docs)}"
                    docs.append({"_id": ids[key], "title": title, "text": key[1]})
                own.append((title, ids[key]))
            gold = list(dict.fromkeys(d for title, d in own if title in supporting))
            if len(gold) < len(supporting):
                raise QADataError(f"hotpotqa: question {n}: a supporting title is not among its paragraphs ({sorted(supporting)}).")
            queries.append({"_id": qid, "text": q["question"]})
            qrels += [(qid, d) for d in gold]
            answers.append({"query_id": qid, "question": q["question"], "answers": [q["answer"]], "type": q.get("type") or ""})
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            if isinstance(exc, QADataError):
                raise
            raise QADataError(f"hotpotqa: question {n} is not in HotpotQA's shape ({type(exc).__name__}: {exc}; needs question, answer, context, supporting_facts).") from None
    return docs, queries, qrels, answers


def to_beir(name: str, out: str | Path, src: str | Path | None = None, corpus: str | Path | None = None) -> dict[str, int]:
    """Write set ``name`` (the bundled copy unless ``src`` and, for MuSiQue, ``corpus`` are
    given) to ``out``; returns the counts written."""
    if name not in SETS:
        raise QADataError(f"unknown QA set {name!r}; valid: {', '.join(SETS)}")
    bundled_q, bundled_c = _BUNDLED[name]
    questions = Path(src) if src else bundled_q
    if name == "musique":
        docs, queries, qrels, answers = musique(questions, Path(corpus) if corpus else bundled_c)
    else:
        docs, queries, qrels, answers = hotpotqa(questions)
    out = Path(out)
    for rel, lines in (("corpus.jsonl", docs), ("queries.jsonl", queries), ("answers.jsonl", answers)):
        with atomic_path(out / rel) as tmp:
            tmp.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    with atomic_path(out / "qrels" / "test.tsv") as tmp:
        tmp.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in qrels), encoding="utf-8")
    return {"docs": len(docs), "queries": len(queries), "qrels": len(qrels)}
