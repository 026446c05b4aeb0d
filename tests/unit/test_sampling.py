"""An experiment's query sample and its qrels (pipelines/evaluation/experiment/datasets.py), and the main job's rules
section when the set is absent, without Ray."""

import json

import pytest

from logicrank.jobs.main_job import rules_section
from logicrank.pipelines.evaluation.experiment import ExperimentError, sample_queries


def _beir(root, n=10):
    (root / "qrels").mkdir(parents=True)
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": f"ulogic-{i}", "text": f"q{i}"}) + "\n" for i in range(n)))
    rows = ["query-id\tcorpus-id\tscore"] + [f"ulogic-{i}\t{i % 3}\t1" for i in range(n)] + ["ulogic-0\t7\t1"]
    (root / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n")
    return root


def test_a_sample_cuts_queries_and_qrels_to_the_same_queries(tmp_path):
    beir = _beir(tmp_path / "beir")
    queries, qrels = sample_queries(beir, 4, seed=0, out=tmp_path / "s")
    ids = [json.loads(line)["_id"] for line in queries.read_text().splitlines()]
    assert len(ids) == 4 == len(set(ids))
    kept = {line.split("\t")[0] for line in qrels.read_text().splitlines()[1:]}
    assert kept == set(ids)
    first = queries.read_text()
    assert sample_queries(beir, 4, seed=0, out=tmp_path / "s") == (queries, qrels) and queries.read_text() == first  # seeded: the same sample
    sample_queries(beir, 4, seed=5, out=tmp_path / "s")
    assert queries.read_text() != first  # another seed, another sample (4 of 10: 210 possible)
    assert sample_queries(beir, None, seed=0, out=tmp_path / "s") == (beir / "queries.jsonl", beir / "qrels" / "test.tsv")
    with pytest.raises(ExperimentError, match="sample 11: must be between 1 and 10"):
        sample_queries(beir, 11, seed=0, out=tmp_path / "s")


@pytest.mark.parametrize("layout", ["headerless", "trec", "trec with comments"])
def test_a_sample_of_qrels_without_a_header_keeps_every_judgement_of_the_drawn_queries_and_no_other(tmp_path, layout):
    """A qrels file without BEIR's header (3 fields, or TREC's 4) is read by evaluation; its
    first line is a judgement, not a header to copy: a query never drawn must not be evaluated.
    Comment lines (``#`` first, skipped by trec_eval) anywhere: old code cut the file's lines by
    counting the judgements read, so a comment shifted every judgement onto the next query's."""
    from logicrank.pipelines.io import read_qrels

    beir = _beir(tmp_path / "beir")
    lines = (beir / "qrels" / "test.tsv").read_text().splitlines()[1:]
    if layout == "trec":
        lines = [line.replace("\t", " 0 ", 1).replace("\t", " ") for line in lines]
    if layout == "trec with comments":
        lines = [f"# judgements {i}" if i % 4 == 2 else line.replace("\t", " 0 ", 1).replace("\t", " ") for i, line in enumerate(lines)]
    (beir / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    judged = {line.split()[0] for line in lines if not line.startswith("#")}
    for n in range(1, len(judged) + 1):
        queries, qrels = sample_queries(beir, n, seed=n, out=tmp_path / f"s{n}")
        drawn = {json.loads(line)["_id"] for line in queries.read_text().splitlines()}
        got = read_qrels(qrels)
        assert set(got.column("query_id").to_pylist()) == drawn
        assert got.num_rows == sum(1 for line in lines if line.split()[0] in drawn)
        assert set(zip(got.column("query_id").to_pylist(), got.column("doc_id").to_pylist(), strict=True)) == {
            (f[0], f[-2]) for f in map(str.split, lines) if f[0] in drawn}
    assert sample_queries(beir, len(judged), seed=0, out=tmp_path / "all")[0].read_text().count("\n") == len(judged)  # ulogic-0 can be drawn


def test_a_sample_reads_the_queries_as_the_run_reads_them(tmp_path):
    """A queries file as BEIR's tools may write it: a byte order mark, integer ids, the id
    under another of its keys. The sample keys each query as evaluation does ("7" judges
    query 7) and keeps each record whole."""
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    records = [{"_id": i, "text": f"q{i}", "metadata": {"n": i}} for i in range(6)] + [{"query_id": "x", "text": "other key"}]
    (beir / "queries.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in records).encode())
    (beir / "qrels" / "test.tsv").write_bytes(b"\xef\xbb\xbfquery-id\tcorpus-id\tscore\r\n" + b"".join(f"{q}\td{q}\t1\r\n".encode() for q in [0, 2, 4, "x"]))
    queries, qrels = sample_queries(beir, None, 0, tmp_path / "s", ids=("4", "x", "0"))
    assert [json.loads(line) for line in queries.read_text().splitlines()] == [records[0], records[4], records[6]]  # in the file's order
    assert qrels.read_text().splitlines() == ["query-id\tcorpus-id\tscore", "0\td0\t1", "4\td4\t1", "x\tdx\t1"]
    with pytest.raises(ExperimentError, match=r"\['1'\] not among the queries the qrels judge"):
        sample_queries(beir, None, 0, tmp_path / "s", ids=("1",))


def test_the_gold_answers_of_a_sample_are_its_queries_records_whole(tmp_path):
    """Gold answers cut to a sample's queries, read as JSON Lines are: a byte order mark, and a
    line separator (U+2028) inside an answer, which str.splitlines would split at."""
    from logicrank.pipelines.evaluation.experiment.datasets import gold_of

    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"query_id": q, "text": f"t{q}"}) + "\n" for q in ("1", "3")))
    records = [{"query_id": 1, "answers": ["a\u2028b"]}, {"query_id": "2", "answers": ["c"]}, {"query_id": "3", "answers": ["caf\ud83d"]}]
    gold = tmp_path / "gold.jsonl"  # (the last answer holds half of a surrogate pair, as JSON can escape it: copied as it is)
    gold.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r, ensure_ascii=r["query_id"] == "3") + "\n" for r in records).encode())
    cut = gold_of(gold, queries, tmp_path / "cut.jsonl")
    assert cut == tmp_path / "cut.jsonl"
    assert [json.loads(line) for line in cut.read_text(encoding="utf-8").split("\n") if line] == [records[0], records[2]]
    queries.write_text("".join(json.dumps({"query_id": q, "text": "t"}) + "\n" for q in ("1", "2", "3")))
    assert gold_of(gold, queries, tmp_path / "all.jsonl") == gold  # every query's: the file itself


@pytest.mark.parametrize("given", [None, "missing-dir"])
def test_without_the_set_the_rules_section_is_one_line_saying_how_to_get_it(tmp_path, given):
    lines = []
    path = str(tmp_path / given) if given else None
    section = rules_section(tmp_path / "rules", path, embed=None, ray=None, echo=lines.append)
    body = section.splitlines()[2]
    assert body.startswith("Rule retrieval (SIAR + R3): skipped, LOGICRANK_RULEBENCH")
    assert "llm-rule-following" in body and "rules.json" in body
    assert not (tmp_path / "rules").exists() and any("skipped" in line for line in lines)
