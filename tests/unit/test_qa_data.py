"""The bundled MuSiQue and HotpotQA sets in the BEIR layout: counts, gold paragraphs in the
corpus, decompositions pointing at qrels documents, and loud failures on a broken file; the
same questions in every shape read (JSON array or JSON Lines, gzip or not; HotpotQA's official,
Hugging Face and grouped layouts) give the same BEIR files; a layout error names the record and
the field; `bench-lag --src` carries the path to the experiment's dataset."""

import gzip
import hashlib
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from logicrank.pipelines.datasets import qa
from logicrank.pipelines.evaluation.experiment import Dataset, ExperimentError
from logicrank.pipelines.io import read_qrels, read_queries


def _lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_musique_keeps_every_question_and_gold_paragraph(tmp_path):
    assert qa.to_beir("musique", tmp_path) == {"docs": 1890, "queries": 100, "qrels": 237}  # 68 x 2 + 27 x 3 + 5 x 4 hops
    docs = {d["_id"] for d in _lines(tmp_path / "corpus.jsonl")}
    qrels = read_qrels(tmp_path)
    assert set(qrels.column("doc_id").to_pylist()) <= docs
    answers = _lines(tmp_path / "answers.jsonl")
    assert [a["query_id"] for a in answers] == read_queries(tmp_path).column("query_id").to_pylist()
    pairs = set(zip(qrels.column("query_id").to_pylist(), qrels.column("doc_id").to_pylist(), strict=True))
    first = answers[0]
    assert first["answers"] == ["G. Stanley Hall", "Stanley Hall"] and first["question"].startswith("Who was the first president")
    assert first["scoring"] == "squad"  # MuSiQue's metrics/answer.py
    assert first["decomposition"][1]["question"] == "Who was the first president of #1 ?"
    for a in answers:  # every step's supporting paragraph is a gold paragraph of its question
        assert all((a["query_id"], s["doc_id"]) in pairs for s in a["decomposition"])
        assert a["type"] == f"{len(a['decomposition'])}hop"


def test_musique_full_contrast_questions_and_repeated_ids_are_refused(tmp_path):
    """MuSiQue-Full holds each id twice: the answerable question and its unanswerable contrast
    copy (answerable: false), whose answer MuSiQue's evaluation does not score. Both were read
    as gold questions under one id, silently."""
    questions = json.loads(gzip.decompress(qa._BUNDLED["musique"][0].read_bytes()))[:2]
    (tmp_path / "c.json").write_bytes(gzip.decompress(qa._BUNDLED["musique"][1].read_bytes()))
    cases = {
        "answerable: false (MuSiQue-Full's contrast copy)": [questions[0], {**questions[0], "answerable": False}],
        f"question id {questions[0]['id']!r} is also record 0's": [questions[0], questions[0]],
        "field 'answerable': expected true or false": [{**questions[0], "answerable": "yes"}],
    }
    for why, records in cases.items():
        (tmp_path / "q.json").write_text(json.dumps(records))
        with pytest.raises(qa.QADataError, match=re.escape(why)):
            qa.to_beir("musique", tmp_path / "out", tmp_path / "q.json", tmp_path / "c.json")
    (tmp_path / "q.json").write_text(json.dumps([{**q, "answerable": True} for q in questions]))
    assert qa.to_beir("musique", tmp_path / "ok", tmp_path / "q.json", tmp_path / "c.json")["queries"] == 2


def test_musique_as_published_without_a_corpus_takes_its_questions_paragraphs(tmp_path):
    """MuSiQue publishes no corpus: each question carries its paragraphs. Its file given alone
    was checked against the bundled set's corpus and refused ("not in the corpus" of a file the
    user never gave). Its corpus is now its questions' paragraphs, each distinct one once."""
    questions = _bundled("musique")[:3]
    counts = qa.to_beir("musique", tmp_path / "out", _write(tmp_path / "q.jsonl", questions, jsonl=True))
    docs = _lines(tmp_path / "out" / "corpus.jsonl")
    paragraphs = list(dict.fromkeys((p["title"], p["paragraph_text"]) for q in questions for p in q["paragraphs"]))
    assert [(d["title"], d["text"]) for d in docs] == paragraphs and len({d["_id"] for d in docs}) == len(docs)
    assert counts == {"docs": len(paragraphs), "queries": 3, "qrels": sum(p["is_supporting"] for q in questions for p in q["paragraphs"])}
    by_id = {d["_id"]: (d["title"], d["text"]) for d in docs}
    qrels = read_qrels(tmp_path / "out")
    for q, d in zip(qrels.column("query_id").to_pylist(), qrels.column("doc_id").to_pylist(), strict=True):  # each a supporting paragraph
        question = next(x for x in questions if x["id"] == q)
        assert any(p["is_supporting"] and (p["title"], p["paragraph_text"]) == by_id[d] for p in question["paragraphs"])


def test_hotpotqa_corpus_is_the_union_of_context_paragraphs(tmp_path):
    counts = qa.to_beir("hotpotqa", tmp_path)
    assert counts["queries"] == 100 and counts["qrels"] == 200  # two gold paragraphs each
    docs = _lines(tmp_path / "corpus.jsonl")
    assert len({(d["title"], d["text"]) for d in docs}) == len(docs) == counts["docs"]
    first = _lines(tmp_path / "answers.jsonl")[0]
    assert first == {"query_id": "hotpotqa-0", "question": "Were Scott Derrickson and Ed Wood of the same nationality?", "answers": ["yes"], "type": "comparison",
                     "scoring": "hotpotqa"}
    qrels = read_qrels(tmp_path)
    gold_ids = {d for q, d in zip(qrels.column("query_id").to_pylist(), qrels.column("doc_id").to_pylist(), strict=True) if q == "hotpotqa-0"}
    assert {d["title"] for d in docs if d["_id"] in gold_ids} == {"Scott Derrickson", "Ed Wood"}  # its supporting_facts titles


def test_a_gold_paragraph_missing_from_the_corpus_fails_the_conversion(tmp_path):
    questions = json.loads(gzip.decompress(qa._BUNDLED["musique"][0].read_bytes()))[:2]
    corpus = json.loads(gzip.decompress(qa._BUNDLED["musique"][1].read_bytes()))
    gold = next(p for p in questions[0]["paragraphs"] if p["is_supporting"])
    (tmp_path / "q.json").write_text(json.dumps(questions))
    (tmp_path / "c.json").write_text(json.dumps([p for p in corpus if p["text"] != gold["paragraph_text"]]))
    with pytest.raises(qa.QADataError, match=f"gold paragraph {gold['title']!r} is not in the corpus"):
        qa.to_beir("musique", tmp_path / "out", tmp_path / "q.json", tmp_path / "c.json")
    assert not (tmp_path / "out").exists()  # nothing half-written
    (tmp_path / "bad.json").write_text("[not json")
    with pytest.raises(qa.QADataError, match="bad.json: not a readable JSON file"):
        qa.to_beir("hotpotqa", tmp_path / "out", tmp_path / "bad.json")
    with pytest.raises(qa.QADataError, match="unknown QA set"):
        qa.to_beir("2wiki", tmp_path / "out")


def test_hotpotqa_reads_the_official_layout_too(tmp_path):
    """context as [[title, [sentences]], ...] and supporting_facts as [[title, sent_id], ...]."""
    bundled = json.loads(gzip.decompress(qa._BUNDLED["hotpotqa"][0].read_bytes()))[:5]
    official = [dict(q, context=[[t, s] for t, s in zip(q["context"]["title"], q["context"]["sentences"], strict=True)],
                     supporting_facts=[[t, i] for t, i in zip(q["supporting_facts"]["title"], q["supporting_facts"]["sent_id"], strict=True)])
                for q in bundled]
    (tmp_path / "hf.json").write_text(json.dumps(bundled))
    (tmp_path / "official.json").write_text(json.dumps(official))
    assert qa.hotpotqa(tmp_path / "hf.json") == qa.hotpotqa(tmp_path / "official.json")
    (tmp_path / "broken.json").write_text(json.dumps([{"question": "q", "answer": "a", "context": 3, "supporting_facts": []}]))
    with pytest.raises(qa.QADataError, match=re.escape("broken.json: record 0: field 'context': expected pairs [title, [sentences]]")):
        qa.hotpotqa(tmp_path / "broken.json")


def _bundled(name: str, part: int = 0) -> list:
    return json.loads(gzip.decompress(qa._BUNDLED[name][part].read_bytes()))


def _write(path, records, jsonl: bool = False, gz: bool = False, bom: bool = False):
    text = "".join(json.dumps(r) + "\n" for r in records) if jsonl else json.dumps(records, indent=1)
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode()  # bom: a UTF-8 byte order mark first, as Windows tools write
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _beir(out, name, src, corpus=None) -> dict[str, str]:
    """Every file to_beir writes, by name."""
    qa.to_beir(name, out, src, corpus)
    return {f: (out / f).read_text(encoding="utf-8") for f in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "answers.jsonl")}


def test_musique_reads_json_lines_and_gzip_told_by_content(tmp_path):
    """The bundled layout (JSON arrays) is the reference; the same questions and corpus as JSON
    Lines, gzipped, with a misleading suffix or blank lines give the same BEIR files."""
    questions, corpus = _bundled("musique")[:6], _bundled("musique", 1)
    want = _beir(tmp_path / "ref", "musique", _write(tmp_path / "q.json", questions), _write(tmp_path / "c.json", corpus))
    assert want["queries.jsonl"].count("\n") == 6 and want["corpus.jsonl"].count("\n") == len(corpus)
    shapes = {
        "jsonl": (_write(tmp_path / "q.jsonl", questions, jsonl=True), _write(tmp_path / "c.jsonl", corpus, jsonl=True)),
        "jsonl.gz": (_write(tmp_path / "q.jsonl.gz", questions, jsonl=True, gz=True), _write(tmp_path / "c.jsonl.gz", corpus, jsonl=True, gz=True)),
        "array gz named .json": (_write(tmp_path / "qz.json", questions, gz=True), _write(tmp_path / "cz.txt", corpus, gz=True)),
        "paragraph_text in the corpus": (tmp_path / "q.jsonl", _write(tmp_path / "cp.jsonl", [{"title": p["title"], "paragraph_text": p["text"]} for p in corpus], jsonl=True)),
    }
    (tmp_path / "blank.jsonl").write_text("\n  \n" + "\n\n".join(json.dumps(q) for q in questions) + "\n\n")
    shapes["jsonl with blank lines"] = (tmp_path / "blank.jsonl", tmp_path / "c.jsonl")
    for shape, (q, c) in shapes.items():
        assert _beir(tmp_path / shape, "musique", q, c) == want, shape


def _hotpot_id(q: dict) -> str:
    """An id in the shape of HotpotQA's own (24 hex digits), made from the question."""
    return hashlib.md5(q["question"].encode()).hexdigest()[:24]


def _hf_to(layout: str, q: dict) -> dict:
    """A bundled (Hugging Face layout) HotpotQA question in another layout."""
    titles, sentences = q["context"]["title"], q["context"]["sentences"]
    facts = list(zip(q["supporting_facts"]["title"], q["supporting_facts"]["sent_id"], strict=True))
    by_title: dict[str, list[int]] = {}
    for t, i in facts:
        by_title.setdefault(t, []).append(i)
    sents = dict(zip(titles, sentences, strict=True))
    if layout == "official":
        return dict({k: v for k, v in q.items() if k != "id"}, _id=q.get("id") or _hotpot_id(q), context=[[t, s] for t, s in zip(titles, sentences, strict=True)],
                    supporting_facts=[[t, i] for t, i in facts])
    if layout == "grouped":  # supporting facts per title with their sentences; context as objects
        return dict(q, context=[{"title": t, "sentences": s} for t, s in zip(titles, sentences, strict=True)],
                    supporting_facts=[{"title": t, "sent_ids": ids, "sentences": [sents[t][i] for i in ids if i < len(sents[t])]} for t, ids in by_title.items()])
    if layout == "grouped-text":  # sent_id lists; context objects holding the paragraph as one string
        return dict(q, context=[{"title": t, "paragraph_text": "".join(s)} for t, s in zip(titles, sentences, strict=True)],
                    supporting_facts=[{"title": t, "sent_id": ids} for t, ids in by_title.items()])
    if layout == "grouped-lists":  # facts per title as [title, [sent ids], [sentences], {id, title, text, score}]; official context
        return dict(q, context=[[t, s] for t, s in zip(titles, sentences, strict=True)],
                    supporting_facts=[[t, ids, [sents[t][i] for i in ids if i < len(sents[t])],
                                       {"id": f"{t}-{k}", "title": t, "text": "".join(sents[t]), "score": 1.0}]
                                      for k, (t, ids) in enumerate(by_title.items())])
    raise AssertionError(layout)


def test_hotpotqa_layouts_and_file_shapes_give_the_same_beir_files(tmp_path):
    bundled = [dict(q, id=_hotpot_id(q)) for q in _bundled("hotpotqa")[:6]]  # (Hugging Face's id; the official file's _id)
    want = _beir(tmp_path / "ref", "hotpotqa", _write(tmp_path / "hf.json", bundled))
    assert want["queries.jsonl"].count("\n") == 6 and want["qrels/test.tsv"].count("\n") == 1 + 12
    shapes = {
        "hf jsonl": _write(tmp_path / "hf.jsonl", bundled, jsonl=True),  # as datasets' to_json writes it
        "official array": _write(tmp_path / "official.json", [_hf_to("official", q) for q in bundled]),
        "official jsonl.gz": _write(tmp_path / "official.jsonl.gz", [_hf_to("official", q) for q in bundled], jsonl=True, gz=True),
        "grouped facts, context objects": _write(tmp_path / "grouped.jsonl", [_hf_to("grouped", q) for q in bundled], jsonl=True),
        "sent_id lists, paragraph_text": _write(tmp_path / "grouped-text.json.gz", [_hf_to("grouped-text", q) for q in bundled], gz=True),
        "mixed records": _write(tmp_path / "mixed.jsonl", [_hf_to(("official", "grouped", "grouped-text")[i % 3], q) if i % 4 else q
                                                          for i, q in enumerate(bundled)], jsonl=True),
    }
    for shape, src in shapes.items():
        assert _beir(tmp_path / shape, "hotpotqa", src) == want, shape


def test_hotpotqa_reads_fact_lists_with_trailing_elements_and_byte_order_marks(tmp_path):
    """Supporting facts grouped as [title, [sentence ids], [sentences], {id, title, text, score}]
    (the elements past the ids not read) give the BEIR files of the Hugging Face layout, in a
    JSON array or JSON Lines, gzipped or not, with a UTF-8 byte order mark or without."""
    bundled = [dict(q, id=_hotpot_id(q)) for q in _bundled("hotpotqa")[:6]]
    grouped = [_hf_to("grouped-lists", q) for q in bundled]
    assert len(grouped[0]["supporting_facts"][0]) == 4
    want = _beir(tmp_path / "ref", "hotpotqa", _write(tmp_path / "hf.json", bundled))
    shapes = {
        "lists jsonl": _write(tmp_path / "lists.jsonl", grouped, jsonl=True),
        "lists array, bom": _write(tmp_path / "lists-bom.json", grouped, bom=True),
        "lists jsonl, bom": _write(tmp_path / "lists-bom.jsonl", grouped, jsonl=True, bom=True),
        "lists jsonl.gz, bom": _write(tmp_path / "lists-bom.jsonl.gz", grouped, jsonl=True, gz=True, bom=True),
        "pairs and lists mixed": _write(tmp_path / "mixed.jsonl", [g if i % 2 else _hf_to("official", q) for i, (q, g) in enumerate(zip(bundled, grouped, strict=True))], jsonl=True),
    }
    for shape, src in shapes.items():
        assert _beir(tmp_path / shape, "hotpotqa", src) == want, shape
    queries = read_queries(tmp_path / "lists jsonl.gz, bom").column("query_id").to_pylist()
    assert queries == [_hotpot_id(q) for q in bundled]
    assert _lines(tmp_path / "lists jsonl.gz, bom" / "corpus.jsonl")[0]["_id"] == "hotpotqa-doc-0"


@pytest.mark.parametrize(("fact", "message"), [
    ([3, [0], ["s"], {}], "field 'supporting_facts[1][0]': expected a title (a string); got int 3"),
    (["Ed Wood", ["0"], ["s"], {}], "field 'supporting_facts[1][1]': expected a sentence id or a list of them; got list of 1"),
    (["Ed Wood", 1.5, ["s"]], "field 'supporting_facts[1][1]': expected a sentence id or a list of them; got float 1.5"),
    (["Ed Wood", True], "field 'supporting_facts[1][1]': expected a sentence id or a list of them; got bool True"),
    (["Ed Wood"], "field 'supporting_facts[1]': expected a list [title, sentence id(s), ...] or an object {title, sent_ids}; got list of 1"),
], ids=["title-int", "ids-strings", "id-float", "id-bool", "title-alone"])
def test_a_fact_list_that_cannot_be_read_names_the_record_and_the_field(tmp_path, fact, message):
    """Also in a file that starts with a byte order mark: the record, its line and the field."""
    q = _hf_to("grouped-lists", _bundled("hotpotqa")[0])
    src = _write(tmp_path / "q.jsonl", [dict(q, _id="x1", supporting_facts=[q["supporting_facts"][0], fact])], jsonl=True, bom=True)
    with pytest.raises(qa.QADataError) as exc:
        qa.to_beir("hotpotqa", tmp_path / "out", src)
    assert str(exc.value) == f"hotpotqa: {src}: record 0 (line 1, id x1): {message}"
    assert not (tmp_path / "out").exists()


def test_layout_errors_name_the_record_and_the_field(tmp_path):
    hotpot = [_hf_to("official", q) for q in _bundled("hotpotqa")[:4]]
    qid = hotpot[2]["_id"]

    def fails(records, message, name="hotpotqa", jsonl=False):
        src = _write(tmp_path / f"{name}.{'jsonl' if jsonl else 'json'}", records, jsonl=jsonl)
        with pytest.raises(qa.QADataError) as exc:
            qa.to_beir(name, tmp_path / "out", src, _write(tmp_path / "c.json", _bundled("musique", 1)) if name == "musique" else None)
        assert str(exc.value) == message.format(src=src)
        assert not (tmp_path / "out").exists()

    broken = [*hotpot[:2], dict(hotpot[2], supporting_facts="Ed Wood"), *hotpot[3:]]
    fails(broken, f"hotpotqa: {{src}}: record 2 (id {qid}): field 'supporting_facts': expected pairs [title, sentence id], "
                  "a {{title, sent_id}} mapping or objects per title; got str")
    fails(broken, f"hotpotqa: {{src}}: record 2 (line 3, id {qid}): field 'supporting_facts': expected pairs [title, sentence id], "
                  "a {{title, sent_id}} mapping or objects per title; got str", jsonl=True)  # JSON Lines: the line too
    fails([*hotpot[:2], dict(hotpot[2], supporting_facts=[{"title": "Ed Wood"}])],
          f"hotpotqa: {{src}}: record 2 (id {qid}): field 'supporting_facts[0].sent_ids': missing (expected the title's supporting "
          "sentence ids (or sent_id, sentence_ids))")
    fails([hotpot[0], dict(hotpot[1], context=[*hotpot[1]["context"][:3], ["Lone title"]])],
          f"hotpotqa: {{src}}: record 1 (id {hotpot[1]['_id']}): field 'context[3]': expected a pair [title, [sentences]] "
          "or an object {{title, sentences}}; got list of 1")
    no_answer = {k: v for k, v in hotpot[1].items() if k != "answer"}
    fails([hotpot[0], no_answer], f"hotpotqa: {{src}}: record 1 (id {hotpot[1]['_id']}): field 'answer': missing (expected a string)")
    fails([dict(hotpot[0], supporting_facts=[["Nowhere", 0]])],
          f"hotpotqa: {{src}}: record 0 (id {hotpot[0]['_id']}): field 'supporting_facts': title 'Nowhere' is not among the context's titles.")
    fails([hotpot[0], ["not", "an", "object"]], "hotpotqa: {src}: record 1: expected an object; got list of 3")

    musique = _bundled("musique")[:3]
    steps = [dict(s) for s in musique[1]["question_decomposition"]]
    steps[1]["paragraph_support_idx"] = 99
    fails([musique[0], dict(musique[1], question_decomposition=steps)],
          f"musique: {{src}}: record 1 (id {musique[1]['id']}): field 'question_decomposition[1].paragraph_support_idx': "
          f"expected an index into paragraphs (0 to {len(musique[1]['paragraphs']) - 1}); got int 99", name="musique")
    paragraphs = [dict(p) for p in musique[2]["paragraphs"]]
    paragraphs[4]["is_supporting"] = "yes"
    fails([*musique[:2], dict(musique[2], paragraphs=paragraphs)],
          f"musique: {{src}}: record 2 (line 3, id {musique[2]['id']}): field 'paragraphs[4].is_supporting': expected true or false; got str",
          name="musique", jsonl=True)
    corpus = _write(tmp_path / "corpus.jsonl", [{"title": "a", "text": "x"}, {"title": "b", "body": "y"}], jsonl=True)
    with pytest.raises(qa.QADataError, match=re.escape(f"musique: {corpus}: record 1 (line 2): field 'text': missing (expected a string)")):
        qa.musique(_write(tmp_path / "q.json", musique), corpus)


def test_a_file_is_an_array_or_json_lines_and_a_bad_line_is_named(tmp_path):
    lines = [json.dumps(q) for q in _bundled("hotpotqa")[:3]]
    (tmp_path / "q.jsonl").write_text("\n".join([lines[0], lines[1][:-5], lines[2]]) + "\n")
    with pytest.raises(qa.QADataError, match=re.escape(f"questions {tmp_path / 'q.jsonl'}: line 2 is not a JSON object (")):
        qa.hotpotqa(tmp_path / "q.jsonl")
    (tmp_path / "q.csv").write_text("question,answer\n")
    with pytest.raises(qa.QADataError, match=re.escape(f"{tmp_path / 'q.csv'}: neither a JSON array nor JSON Lines: it starts with 'q'")):
        qa.hotpotqa(tmp_path / "q.csv")
    (tmp_path / "empty.json").write_text(" \n")
    with pytest.raises(qa.QADataError, match="empty.json: empty"):
        qa.hotpotqa(tmp_path / "empty.json")
    (tmp_path / "object.json").write_text(json.dumps({"data": [1]}, indent=2))  # one object over several lines
    with pytest.raises(qa.QADataError, match="object.json: line 1 is not a JSON object .*a JSON object spread over lines"):
        qa.hotpotqa(tmp_path / "object.json")
    (tmp_path / "truncated.json.gz").write_bytes(gzip.compress(b"[" + b"1," * 100 + b"1]")[:-10])
    with pytest.raises(qa.QADataError, match="truncated.json.gz: the compressed data ends early"):
        qa.hotpotqa(tmp_path / "truncated.json.gz")
    with pytest.raises(qa.QADataError, match="a corpus file .* is MuSiQue's"):
        qa.to_beir("hotpotqa", tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "q.jsonl")
    # a pipe: read twice (its start tells an array from JSON Lines), it would come back short or empty: refused
    import os

    r, w = os.pipe()
    try:
        os.write(w, (lines[0] + "\n").encode())
        os.close(w)
        with pytest.raises(qa.QADataError, match="not a regular file"):
            qa.hotpotqa(Path(f"/dev/fd/{r}"))
    finally:
        os.close(r)


def test_bench_lag_carries_the_path_to_the_experiments_dataset(tmp_path, monkeypatch):
    from logicrank import cli
    from logicrank.pipelines.evaluation import benchmarks
    from logicrank.pipelines.evaluation.experiment import prepare_dataset

    src = _write(tmp_path / "h.jsonl", _bundled("hotpotqa")[:5], jsonl=True)
    [rows] = benchmarks.lag("hotpotqa", src=src, sample=2)
    assert rows.dataset.qa == "hotpotqa" and rows.dataset.qa_src == str(src) and rows.dataset.qa_corpus is None
    assert rows.dataset.label == f"hotpotqa from {src}, a sample of 2 queries (seed 0)"
    oracle, rows = benchmarks.lag("musique", src="q.json", corpus="c.json")
    assert (oracle.dataset.qa_src, oracle.dataset.qa_corpus, rows.dataset.qa_src, rows.dataset.qa_corpus) == ("q.json", "c.json") * 2
    assert oracle.references == () and "not checked" in oracle.caveats[-1]  # the bundled set's figures
    assert benchmarks.lag("musique")[0].references  # the bundled set: checked
    with pytest.raises(ExperimentError, match="--corpus is MuSiQue's"):
        benchmarks.lag("hotpotqa", src=src, corpus=src)

    monkeypatch.setenv("QA_DIR", str(tmp_path))  # the experiment converts the file, variables expanded
    corpus, queries, _ = prepare_dataset(Dataset(qa="hotpotqa", qa_src="${QA_DIR}/h.jsonl"), tmp_path / "run")
    assert len(read_queries(corpus)) == 5 and queries == tmp_path / "run" / "beir" / "queries.jsonl"

    with pytest.raises(ValueError, match="give qa"):
        Dataset(beir="x", qa_src="q.json")
    with pytest.raises(ValueError, match="qa_corpus is MuSiQue's"):
        Dataset(qa="hotpotqa", qa_src="q.json", qa_corpus="c.json")

    got = []
    monkeypatch.setattr(cli, "_experiments", lambda job, exps, out, bound, **kw: got.append((job, exps, out)))
    r = CliRunner().invoke(cli.app, ["bench-lag", "hotpotqa", "--src", str(src), "--sample", "3"])
    assert r.exit_code == 0, r.output
    [(job, [exp], out)] = got
    assert (job, exp.dataset.qa_src, exp.dataset.sample, str(out)) == ("bench-lag", str(src), 3, "runs/lag-hotpotqa")
    r = CliRunner().invoke(cli.app, ["bench-lag", "hotpotqa", "--src", str(src), "--corpus", str(src)])
    assert r.exit_code == 2 and "--corpus is MuSiQue's" in " ".join(r.output.split())


def test_hotpotqa_questions_keep_their_own_ids(tmp_path):
    """The official file's ``_id`` (the key of HotpotQA's evaluation script) and Hugging Face's
    ``id`` are the query ids of the queries, qrels and answers; the position names a question
    only where the record has neither (the bundled copy); a repeated id is refused."""
    bundled = _bundled("hotpotqa")[:3]
    ids = ["5a8b57f25542995d1e6f1371", "5a8c7595554299585d9e36b6", "5a85ea095542994775f606a8"]
    for key in ("_id", "id"):
        src = _write(tmp_path / f"{key}.json", [{key: i, **q} for i, q in zip(ids, bundled, strict=True)])
        files = _beir(tmp_path / key, "hotpotqa", src)
        assert [json.loads(line)["_id"] for line in files["queries.jsonl"].splitlines()] == ids, key
        assert [json.loads(line)["query_id"] for line in files["answers.jsonl"].splitlines()] == ids, key
        assert {line.split("\t")[0] for line in files["qrels/test.tsv"].splitlines()[1:]} == set(ids), key
        want = _beir(tmp_path / f"plain-{key}", "hotpotqa", _write(tmp_path / "plain.json", bundled))
        assert files["corpus.jsonl"] == want["corpus.jsonl"]  # (the paragraphs and their ids do not depend on it)
    src = _write(tmp_path / "twice.json", [{"_id": ids[0], **q} for q in bundled[:2]])
    with pytest.raises(qa.QADataError, match=rf"record 1 .*question id '{ids[0]}' is also record 0's"):
        qa.to_beir("hotpotqa", tmp_path / "twice", src)
