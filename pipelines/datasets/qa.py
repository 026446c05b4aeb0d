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

Files read (questions, and MuSiQue's paragraph corpus): a JSON array of records or JSON Lines
(one record a line), told apart by the first character that is not whitespace (``[`` or
``{``), gzip-compressed or not (told by its magic bytes). A record not in the set's shape
fails with its number (from 0, the order of the file), its id (``_id``/``id``) and the field.

- MuSiQue: document ids ``musique-<n>`` (the corpus file's order; a corpus record is
  ``{title, text}``, ``paragraph_text`` read for ``text``); query ids are MuSiQue's own; a
  sub-question refers to an earlier answer as ``#k`` (1-based).
- HotpotQA: the corpus is the union of the questions' context paragraphs (a paragraph is its
  sentences joined; one document per distinct title and text), ids ``hotpotqa-doc-<n>`` in
  order of first appearance; query ids HotpotQA's own (``_id``, as its evaluation script keys
  answers; Hugging Face's ``id``), ``hotpotqa-<n>`` (the question's position) for a record
  with neither (the bundled copy); gold
  paragraphs are the context paragraphs whose title is a supporting fact's. ``context``:
  official pairs ``[[title, [sentences]], ...]``, the Hugging Face mapping ``{"title": [...],
  "sentences": [...]}`` or objects ``[{"title", "sentences"}, ...]`` (``paragraph_text`` or
  ``text``, a list of sentences or one string, read for ``sentences``). ``supporting_facts``:
  official pairs ``[[title, sent_id], ...]``, lists per title ``[[title, [sent_ids],
  [sentences], {id, title, text, score}], ...]`` (what follows the ids is not read), the
  Hugging Face mapping ``{"title": [...], "sent_id": [...]}`` or objects per title
  ``[{"title", "sent_ids", "sentences"?}, ...]`` (``sent_id`` or ``sentence_ids`` read for
  ``sent_ids``; a number or a list).

A UTF-8 byte order mark starting a file is not read as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from logicrank.pipelines.datasets import _HERE
from logicrank.pipelines.files import atomic_path, open_text, read_jsonl, reading
from logicrank.schemas.errors import UserError

SETS = ("musique", "hotpotqa")
_BUNDLED = {
    "musique": (_HERE / "musique" / "musique_train_100.json.gz", _HERE / "musique" / "musique_train_100_corpus.json.gz"),
    "hotpotqa": (_HERE / "hotpotqa" / "hotpot_dev_distractor_100.json.gz", None),
}
_MISSING = object()
_SENT_IDS = ("sent_ids", "sent_id", "sentence_ids")


class QADataError(UserError, ValueError):
    """A question file that is not MuSiQue or HotpotQA in the expected shape."""


def _records(path: Path) -> Iterator[tuple[int, int | None, Any]]:
    """(record number, line or None, record) of a JSON array or a JSON Lines file (gzipped or
    not)."""
    label = str(path)
    if not path.exists():
        raise QADataError(f"{path}: no such file.")
    if not path.is_file():  # (read twice: first its start, to tell an array from JSON Lines; a pipe would lose that start)
        raise QADataError(f"{path}: not a regular file (a pipe or a directory); save the questions to a file and give its path.")
    with reading(label, QADataError):
        with open_text(path) as f:
            head = ""
            while not head and (chunk := f.read(4096)):
                head = chunk.lstrip()
        if not head:
            raise QADataError(f"{path}: empty; expected a JSON array of records or JSON Lines (one record a line).")
        if head[0] not in "[{":
            raise QADataError(f"{path}: neither a JSON array nor JSON Lines: it starts with {head[0]!r} (expected '[' or '{{').")
        if head[0] == "[":
            with open_text(path) as f:
                try:
                    data = json.load(f)
                except json.JSONDecodeError as exc:
                    raise QADataError(f"{path}: not a readable JSON file ({exc}).") from None
            yield from ((n, None, rec) for n, rec in enumerate(data))
            return
    lines = read_jsonl(path, "questions", QADataError, hint=_spread_hint)
    yield from ((n, line_no, rec) for n, (line_no, rec) in enumerate(lines))


def _spread_hint(line: str) -> str:
    """A line that opens an object it does not close: one JSON object spread over lines."""
    if line.lstrip().startswith("{") and not line.rstrip().endswith("}"):
        return ("; a file that starts with '{' is read as JSON Lines, one record a line (a JSON object spread over "
                "lines is neither: give an array of records)")
    return ""


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool | int | float):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, list | tuple):
        return f"list of {len(value)}"
    return type(value).__name__


class _Record:
    """One record of a file, for errors that name it and the field."""

    def __init__(self, set_name: str, path: Path, n: int, line: int | None, rec: Any):
        self.rec = rec
        rid = (rec.get("_id") or rec.get("id")) if isinstance(rec, dict) else None
        extra = ", ".join(x for x in (f"line {line}" if line is not None else "", f"id {rid}" if rid is not None else "") if x)
        self.where = f"{set_name}: {path}: record {n}" + (f" ({extra})" if extra else "")
        if not isinstance(rec, dict):
            raise QADataError(f"{self.where}: expected an object; got {_describe(rec)}")

    def error(self, field: str, expected: str, got: Any = _MISSING) -> QADataError:
        return QADataError(f"{self.where}: field '{field}': " + (f"missing (expected {expected})" if got is _MISSING else f"expected {expected}; got {_describe(got)}"))

    def string(self, obj: dict, key: str, field: str | None = None, optional: bool = False) -> str | None:
        value = obj.get(key, _MISSING)
        if isinstance(value, str) or (optional and (value is _MISSING or value is None)):
            return None if value is _MISSING else value
        raise self.error(field or key, "a string", value)

    def mapping(self, value: Any, field: str, expected: str) -> dict:
        if not isinstance(value, dict):
            raise self.error(field, expected, value)
        return value

    def items(self, value: Any, field: str, expected: str) -> list:
        if not isinstance(value, list):
            raise self.error(field, expected, value)
        return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(s, str) for s in value)


def musique(questions: Path, corpus: Path | None) -> tuple[list[dict], list[dict], list[tuple[str, str]], list[dict]]:
    """(docs, queries, qrels, answers) of a MuSiQue question file and its paragraph corpus; with
    no corpus (MuSiQue publishes none: each question carries its own paragraphs), the corpus is
    the questions' paragraphs, each distinct (title, text) once in the order met, as HotpotQA's
    is its questions' context (:func:`hotpotqa`)."""
    docs, ids = [], {}
    for n, line, p in _records(corpus) if corpus is not None else ():
        r = _Record("musique", corpus, n, line, p)
        title = r.string(p, "title", optional=True) or ""
        text = r.string(p, "text" if "text" in p or "paragraph_text" not in p else "paragraph_text")
        doc_id = f"musique-{n}"
        docs.append({"_id": doc_id, "title": title, "text": text})
        ids.setdefault((title, text), doc_id)
    queries, qrels, answers, seen = [], [], [], {}
    for n, line, q in _records(questions):
        r = _Record("musique", questions, n, line, q)
        qid, question, answer = r.string(q, "id"), r.string(q, "question"), r.string(q, "answer")
        # MuSiQue-Full holds each id twice, the unanswerable contrast copy (answerable: false) beside the answerable
        # one; MuSiQue's evaluation scores answers of answerable questions only, so such a file is refused
        if (answerable := q.get("answerable", True)) is not True:
            if answerable is False:
                raise QADataError(f"{r.where}: question {qid!r} is answerable: false (MuSiQue-Full's contrast copy), whose answer "
                                  "MuSiQue's evaluation does not score; give the answerable set (musique_ans_v1.0_*.jsonl)")
            raise r.error("answerable", "true or false", answerable)
        if qid in seen:
            raise QADataError(f"{r.where}: question id {qid!r} is also record {seen[qid]}'s; each question once")
        seen[qid] = n
        aliases = q.get("answer_aliases") or []
        if not _strings(aliases):
            raise r.error("answer_aliases", "a list of strings", aliases)
        own = r.items(q.get("paragraphs", _MISSING), "paragraphs", "a list of paragraph objects")
        paragraphs = []
        for i, p in enumerate(own):
            r.mapping(p, f"paragraphs[{i}]", "a paragraph object {title, paragraph_text, is_supporting}")
            title = r.string(p, "title", f"paragraphs[{i}].title", optional=True) or ""
            text = r.string(p, "paragraph_text", f"paragraphs[{i}].paragraph_text")
            if not isinstance(supporting := p.get("is_supporting", _MISSING), bool):
                raise r.error(f"paragraphs[{i}].is_supporting", "true or false", supporting)
            paragraphs.append((title, text, supporting))

        if corpus is None:  # the questions' own paragraphs are the corpus
            for title, text, _ in paragraphs:
                if (title, text) not in ids:
                    ids[title, text] = f"musique-p{len(docs)}"
                    docs.append({"_id": ids[title, text], "title": title, "text": text})

        def doc_of(i: int, r=r, paragraphs=paragraphs) -> str:
            title, text, _ = paragraphs[i]
            if (title, text) not in ids:
                raise QADataError(f"{r.where}: field 'paragraphs[{i}]': gold paragraph {title!r} is not in the corpus {corpus}.")
            return ids[title, text]

        steps = []
        decomposition = r.items(q.get("question_decomposition", _MISSING), "question_decomposition", "a list of sub-question objects")
        for j, s in enumerate(decomposition):
            field = f"question_decomposition[{j}]"
            r.mapping(s, field, "a sub-question object {question, answer, paragraph_support_idx}")
            idx = s.get("paragraph_support_idx", _MISSING)
            if not (_is_int(idx) and 0 <= idx < len(paragraphs)):
                raise r.error(f"{field}.paragraph_support_idx", f"an index into paragraphs (0 to {len(paragraphs) - 1})", idx)
            steps.append({"question": r.string(s, "question", f"{field}.question"), "answer": r.string(s, "answer", f"{field}.answer"), "doc_id": doc_of(idx)})
        queries.append({"_id": qid, "text": question})
        qrels += [(qid, d) for d in dict.fromkeys(doc_of(i) for i, p in enumerate(paragraphs) if p[2])]
        answers.append({"query_id": qid, "question": question, "answers": [answer, *aliases], "type": f"{len(steps)}hop", "decomposition": steps,
                        "scoring": "squad"})  # MuSiQue's metrics/answer.py: SQuAD's
    return docs, queries, qrels, answers


def _paragraph(r: _Record, body: Any, field: str) -> str:
    """A context paragraph's text: its sentences joined, or the string given."""
    if isinstance(body, str):
        return body.strip()
    if _strings(body):
        return "".join(body).strip()
    raise r.error(field, "a list of sentences (strings) or a string", body)


def _hotpot_context(r: _Record, q: dict) -> list[tuple[str, str]]:
    """(title, text) of each context paragraph, from any of the three layouts."""
    context = q.get("context", _MISSING)
    if isinstance(context, dict):
        titles, sentences = context.get("title", _MISSING), context.get("sentences", _MISSING)
        if not _strings(titles):
            raise r.error("context.title", "a list of titles", titles)
        if not isinstance(sentences, list) or len(sentences) != len(titles):
            raise r.error("context.sentences", f"a list of {len(titles)} sentence lists (one per title)", sentences)
        return [(t, _paragraph(r, s, f"context.sentences[{i}]")) for i, (t, s) in enumerate(zip(titles, sentences, strict=True))]
    if not isinstance(context, list):
        raise r.error("context", "pairs [title, [sentences]], a {title, sentences} mapping or objects {title, sentences}", context)
    out = []
    for i, c in enumerate(context):
        if isinstance(c, list | tuple) and len(c) == 2 and isinstance(c[0], str):
            out.append((c[0], _paragraph(r, c[1], f"context[{i}][1]")))
        elif isinstance(c, dict):
            key = next((k for k in ("sentences", "paragraph_text", "text") if k in c), "sentences")
            out.append((r.string(c, "title", f"context[{i}].title"), _paragraph(r, c.get(key, _MISSING), f"context[{i}].{key}")))
        else:
            raise r.error(f"context[{i}]", "a pair [title, [sentences]] or an object {title, sentences}", c)
    return out


def _hotpot_supporting(r: _Record, q: dict) -> list[str]:
    """The supporting facts' titles, from any of the three layouts."""
    facts = q.get("supporting_facts", _MISSING)
    if isinstance(facts, dict):
        titles = facts.get("title", _MISSING)
        if not _strings(titles):
            raise r.error("supporting_facts.title", "a list of titles", titles)
        return titles
    if not isinstance(facts, list):
        raise r.error("supporting_facts", "pairs [title, sentence id], a {title, sent_id} mapping or objects per title", facts)
    titles = []
    for i, f in enumerate(facts):
        if isinstance(f, list | tuple) and len(f) >= 2:
            titles.append(_fact_title(r, f, f"supporting_facts[{i}]"))
        elif isinstance(f, dict):
            titles.append(r.string(f, "title", f"supporting_facts[{i}].title"))
            key = next((k for k in _SENT_IDS if k in f), None)
            if key is None:
                raise r.error(f"supporting_facts[{i}].sent_ids", "the title's supporting sentence ids (or sent_id, sentence_ids)")
            if not _sent_ids(f[key]):
                raise r.error(f"supporting_facts[{i}].{key}", "a sentence id or a list of them", f[key])
            if "sentences" in f and not (isinstance(f["sentences"], str) or _strings(f["sentences"])):
                raise r.error(f"supporting_facts[{i}].sentences", "a list of sentences (strings)", f["sentences"])
        else:
            raise r.error(f"supporting_facts[{i}]", "a list [title, sentence id(s), ...] or an object {title, sent_ids}", f)
    return titles


def _sent_ids(value: Any) -> bool:
    """A sentence id or a list of them."""
    return _is_int(value) or (isinstance(value, list) and all(_is_int(x) for x in value))


def _fact_title(r: _Record, fact: list | tuple, field: str) -> str:
    """The title of a supporting fact given as a list: the official pair ``[title, sent_id]`` or a
    grouped ``[title, [sent_ids], [sentences], {id, title, text, score}]`` (elements past the
    ids are not read)."""
    if not isinstance(fact[0], str):
        raise r.error(f"{field}[0]", "a title (a string)", fact[0])
    if not _sent_ids(fact[1]):
        raise r.error(f"{field}[1]", "a sentence id or a list of them", fact[1])
    return fact[0]


def hotpotqa(questions: Path) -> tuple[list[dict], list[dict], list[tuple[str, str]], list[dict]]:
    """(docs, queries, qrels, answers) of a HotpotQA (distractor) question file."""
    docs, ids, queries, qrels, answers, seen = [], {}, [], [], [], {}
    for n, line, q in _records(questions):
        r = _Record("hotpotqa", questions, n, line, q)
        key = next((k for k in ("_id", "id") if k in q), None)  # (the official file's _id, Hugging Face's id)
        qid = f"hotpotqa-{n}" if key is None else r.string(q, key)
        if not qid.strip() or qid != qid.strip():
            raise r.error(key or "_id", "a question id, not blank, without surrounding whitespace (runs and qrels name it)", qid)
        if qid in seen:
            raise QADataError(f"{r.where}: question id {qid!r} is also record {seen[qid]}'s; each question once")
        seen[qid] = n
        question, answer = r.string(q, "question"), r.string(q, "answer")
        kind = r.string(q, "type", optional=True) or ""
        paragraphs, supporting = _hotpot_context(r, q), _hotpot_supporting(r, q)
        own, gold_titles = [], set(supporting)
        for key in paragraphs:
            if key not in ids:
                ids[key] = f"hotpotqa-doc-{len(docs)}"
                docs.append({"_id": ids[key], "title": key[0], "text": key[1]})
            own.append((key[0], ids[key]))
        if missing := [t for t in dict.fromkeys(supporting) if t not in {title for title, _ in own}]:
            raise QADataError(f"{r.where}: field 'supporting_facts': title {missing[0]!r} is not among the context's titles.")
        queries.append({"_id": qid, "text": question})
        qrels += [(qid, d) for d in dict.fromkeys(d for title, d in own if title in gold_titles)]
        answers.append({"query_id": qid, "question": question, "answers": [answer], "type": kind, "scoring": "hotpotqa"})
    return docs, queries, qrels, answers


def to_beir(name: str, out: str | Path, src: str | Path | None = None, corpus: str | Path | None = None) -> dict[str, int]:
    """Write set ``name`` to ``out`` (the bundled copy unless ``src`` is given; MuSiQue's
    ``src`` with its ``corpus``, or without one with its questions' paragraphs as the corpus,
    :func:`musique`); returns the counts written."""
    if name not in SETS:
        raise QADataError(f"unknown QA set {name!r}; valid: {', '.join(SETS)}")
    if name == "hotpotqa" and corpus:
        raise QADataError(f"hotpotqa: a corpus file ({corpus}) is MuSiQue's; HotpotQA's corpus is its questions' context paragraphs.")
    bundled_q, bundled_c = _BUNDLED[name]
    questions = Path(src) if src else bundled_q
    if name == "musique":
        docs, queries, qrels, answers = musique(questions, Path(corpus) if corpus else None if src else bundled_c)
    else:
        docs, queries, qrels, answers = hotpotqa(questions)
    out = Path(out)
    for rel, lines in (("corpus.jsonl", docs), ("queries.jsonl", queries), ("answers.jsonl", answers)):
        with atomic_path(out / rel) as tmp:
            tmp.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    with atomic_path(out / "qrels" / "test.tsv") as tmp:
        tmp.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in qrels), encoding="utf-8")
    return {"docs": len(docs), "queries": len(queries), "qrels": len(qrels)}
