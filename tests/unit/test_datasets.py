"""Datasets by name and from any format (pipelines/datasets/registry.py and an experiment's
``dataset:``): bundled names, registered collections (`logicrank datasets`), three files in
the formats the jobs read (TREC topics and qrels here), and ``irds:<id>`` read through
ir_datasets from its local cache, never downloaded."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.pipelines.datasets import registry
from logicrank.pipelines.evaluation.experiment import Dataset, ExperimentError, load, prepare_dataset

runner = CliRunner()

TOPICS = """<top>
<num> Number: 401
<title> foreign minorities, Germany
<desc> Description:
What language and cultural differences impede the integration of foreign minorities in Germany?
</top>

<top>
<num> Number: 402
<title> behavioral genetics
<desc> Description:
What is happening in the field of behavioral genetics?
</top>
"""
QRELS = "401 0 FBIS3-10082 1\n401 0 FBIS3-10169 0\n402 0 FR940104-0-00001 2\n"


@pytest.fixture
def user_registry(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.REGISTRY_ENV, str(tmp_path / "registry" / "datasets.yaml"))
    return tmp_path / "registry" / "datasets.yaml"


def _trec_files(tmp_path):
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "fb1").write_text("<DOC>\n<DOCNO> FBIS3-10082 </DOCNO>\n<TEXT>\nMinorities in Germany.\n</TEXT>\n</DOC>\n")
    (tmp_path / "topics.401-402").write_text(TOPICS)
    (tmp_path / "qrels.401-402").write_text(QRELS)
    return {"corpus": str(tmp_path / "docs"), "queries": str(tmp_path / "topics.401-402"), "qrels": str(tmp_path / "qrels.401-402")}


def test_a_dataset_given_by_a_bundled_name_is_the_set_it_names():
    assert Dataset.model_validate("scifact").bundled == "scifact"
    assert Dataset.model_validate({"name": "scifact", "sample": 5}).sample == 5
    assert Dataset.model_validate("musique").qa == "musique" and Dataset.model_validate("limit-small").setlogic is not None
    assert Dataset.model_validate("irds:cranfield").irds == "cranfield"


@pytest.mark.parametrize(("dataset", "message"), [
    ("nope", r"no dataset named 'nope'; bundled: scifact, musique, hotpotqa, limit-small, synthetic; registered: none"),
    ({"beirr": "x"}, r"dataset\.beirr 'x': no such option; options: name, bundled, beir, corpus, queries, format, topics_field, irds, "),
    ({"corpus": "c", "queries": "q"}, "corpus, queries and qrels go together"),
    ({"beir": "b", "topics_field": "desc"}, "format and topics_field describe the files of corpus"),
    ({"beir": "b", "irds": "x"}, "give exactly one of bundled, beir, corpus"),
])
def test_a_bad_dataset_is_one_line_naming_what_is_valid(dataset, message, user_registry, tmp_path):
    import yaml

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(load("scifact").model_dump(mode="json", exclude_none=True) | {"dataset": dataset}))
    with pytest.raises(ExperimentError, match=message) as info:
        load(path)
    assert "\n" not in str(info.value)


def test_another_dataset_name_set_on_an_experiment_is_that_dataset(user_registry, tmp_path):
    """`--set dataset.name=OTHER` changed the label and kept the first name's spelled-out
    fields (they won on validation): B's report held A's figures, and A's references passed."""
    from logicrank.pipelines.evaluation.experiment import override

    files = _trec_files(tmp_path)
    assert runner.invoke(app, ["datasets", "add", "trec2", "--corpus", files["corpus"], "--queries", files["queries"],
                               "--qrels", files["qrels"], "--format", "trec"]).exit_code == 0
    exp = override(load("scifact"), ["dataset.sample=5"])
    assert exp.dataset.bundled == "scifact"
    other = override(exp, ["dataset.name=trec2"])
    assert (other.dataset.name, other.dataset.bundled, other.dataset.corpus, other.dataset.sample) == ("trec2", None, files["corpus"], 5)
    assert other.references == () and override(other, ["dataset.name=scifact"]).dataset.bundled == "scifact"
    irds = override(override(exp, ["dataset.name=irds:beir/scifact/test"]), ["dataset.name=irds:beir/nfcorpus/test"])
    assert irds.dataset.irds == "beir/nfcorpus/test"


def test_a_qrels_file_is_refused_where_the_dataset_reads_its_own():
    """A bundled, QA, RuleBench, set-logic or ir_datasets set is judged by its own
    qrels/test.tsv: another split given was ignored, the run made on the test split."""
    for dataset in ({"bundled": "scifact", "qrels": "qrels/dev.tsv"}, {"qa": "hotpotqa", "qrels": "qrels/dev.tsv"},
                    {"name": "irds:cranfield", "qrels": "qrels/dev.tsv"}):
        with pytest.raises(ValueError, match="only a beir directory, corpus files or a synthetic set take a qrels file"):
            Dataset.model_validate(dataset)
    assert Dataset.model_validate({"beir": "b", "qrels": "qrels/dev.tsv"}).qrels == "qrels/dev.tsv"


def test_trec_topics_and_qrels_are_read_as_the_jobs_read_them_and_sampled_alike(tmp_path):
    files = _trec_files(tmp_path)
    d = Dataset.model_validate({**files, "format": "trec", "topics_field": "desc"})
    corpus, queries, qrels = prepare_dataset(d, tmp_path / "out")
    assert str(corpus) == files["corpus"]
    rows = [json.loads(line) for line in queries.read_text().splitlines()]
    assert [r["_id"] for r in rows] == ["401", "402"] and rows[1]["text"] == "What is happening in the field of behavioral genetics?"
    assert qrels.read_text().splitlines() == ["query-id\tcorpus-id\tscore", "401\tFBIS3-10082\t1", "401\tFBIS3-10169\t0",
                                              "402\tFR940104-0-00001\t2"]
    one = Dataset.model_validate({**files, "query_ids": ["402"]})
    _, queries, qrels = prepare_dataset(one, tmp_path / "one")
    assert [json.loads(line)["_id"] for line in queries.read_text().splitlines()] == ["402"]
    with pytest.raises(ExperimentError, match=r"dataset: no such path: qrels .*missing"):
        prepare_dataset(Dataset.model_validate({**files, "qrels": str(tmp_path / "missing")}), tmp_path / "x")


def test_the_fields_group_by_reads_survive_a_dataset_given_as_three_files(tmp_path):
    """A dataset of corpus, queries and qrels files has its queries read and written again for
    sampling; only the id, text and logical query were kept, so ``group_by`` over a field of
    the queries file (top level or under metadata, as docs/experiments.md says) failed on every
    query. The records' other fields are kept (JSON Lines and Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from logicrank.pipelines.evaluation.experiment.datasets import group_of

    files = _trec_files(tmp_path)
    records = [{"_id": "401", "text": "german minorities", "template": "A|B", "metadata": {"source": "x"}},
               {"_id": "402", "text": "behavioral genetics", "template": "C", "metadata": {"source": "y"}}]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "metadata"} for r in records]), tmp_path / "q.parquet")
    written = {}
    for name in ("q.jsonl", "q.parquet"):
        _, written[name], _ = prepare_dataset(Dataset.model_validate({**files, "queries": str(tmp_path / name)}), tmp_path / name.replace(".", "-"))
        assert group_of(written[name], "template") == {"401": "A|B", "402": "C"}
        assert [json.loads(line)["text"] for line in written[name].read_text().splitlines()] == ["german minorities", "behavioral genetics"]
    assert group_of(written["q.jsonl"], "source") == {"401": "x", "402": "y"}  # (under metadata)


def test_datasets_lists_the_bundled_and_the_registered_and_an_experiment_names_one(tmp_path, user_registry):
    files = _trec_files(tmp_path)
    r = runner.invoke(app, ["datasets"])
    assert r.exit_code == 0 and "scifact:" in r.output and "registered" in r.output and "none" in r.output
    r = runner.invoke(app, ["datasets", "add", "robust-mini", "--corpus", files["corpus"], "--queries", files["queries"],
                            "--qrels", files["qrels"], "--format", "trec", "--description", "three TREC files"])
    assert r.exit_code == 0, r.output
    assert "robust-mini: corpus" in runner.invoke(app, ["datasets"]).output
    d = Dataset.model_validate("robust-mini")
    assert (d.name, d.corpus, d.format) == ("robust-mini", files["corpus"], "trec") and "robust-mini" in d.label
    r = runner.invoke(app, ["datasets", "add", "robust-mini", "--corpus", files["corpus"], "--queries", files["queries"], "--qrels", files["qrels"]])
    assert r.exit_code == 2 and "already registered" in r.output and "--replace" in r.output
    r = runner.invoke(app, ["datasets", "add", "scifact", "--corpus", files["corpus"], "--queries", files["queries"], "--qrels", files["qrels"]])
    assert r.exit_code == 2 and "not a bundled name" in r.output
    r = runner.invoke(app, ["datasets", "add", "other", "--corpus", str(tmp_path / "nowhere"), "--queries", files["queries"], "--qrels", files["qrels"]])
    assert r.exit_code == 2 and "no such path: corpus" in r.output
    assert runner.invoke(app, ["datasets", "remove", "robust-mini"]).exit_code == 0
    with pytest.raises(ValueError, match="no dataset named 'robust-mini'"):
        Dataset.model_validate("robust-mini")


def test_irds_reads_a_dataset_ir_datasets_builds_from_local_files(tmp_path):
    import ir_datasets

    (tmp_path / "docs.tsv").write_text("d1\tmalaria in children\nd2\tmalaria in adults\n")
    (tmp_path / "queries.tsv").write_text("q1\tmalaria\n")
    (tmp_path / "qrels.txt").write_text("q1 0 d2 1\nq1 0 d1 0\n")
    name = f"logicrank-test-{tmp_path.name}"
    ir_datasets.registry.register(name, ir_datasets.create_dataset(
        docs_tsv=str(tmp_path / "docs.tsv"), queries_tsv=str(tmp_path / "queries.tsv"), qrels_trec=str(tmp_path / "qrels.txt")))
    corpus, queries, qrels = prepare_dataset(Dataset.model_validate(f"irds:{name}"), tmp_path / "out")
    assert [json.loads(line) for line in (corpus / "corpus.jsonl").read_text().splitlines()] == [
        {"_id": "d1", "title": "", "text": "malaria in children"}, {"_id": "d2", "title": "", "text": "malaria in adults"}]
    assert [json.loads(line) for line in queries.read_text().splitlines()] == [{"_id": "q1", "text": "malaria"}]
    assert qrels.read_text().splitlines()[1:] == ["q1\td2\t1", "q1\td1\t0"]


def test_an_irds_document_without_a_text_field_holds_its_title_once():
    """ir_datasets' default text of a document without a ``text`` field (MS MARCO documents,
    TREC's parsed documents) is its title and body: with the title beside it, the indexed and
    embedded text read "title title body". The title is taken off the text."""
    from ir_datasets.datasets.msmarco_document import MsMarcoDocument
    from ir_datasets.formats import GenericDoc, TrecParsedDoc

    from logicrank.pipelines.datasets.registry import doc_fields

    assert doc_fields(MsMarcoDocument("D1", "http://x", "Airbus Subsidies", "Government assistance to Airbus.")) == (
        "Airbus Subsidies", "Government assistance to Airbus.")
    assert doc_fields(TrecParsedDoc("D2", "A title", "A body.", "<html/>")) == ("A title", "A body.")
    assert doc_fields(GenericDoc("D3", "plain text")) == ("", "plain text")


def test_irds_downloads_nothing_and_names_an_unknown_id_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path / "empty-cache"))
    with pytest.raises(ExperimentError, match=r"irds:cranfield: .*nothing is downloaded here") as info:
        prepare_dataset(Dataset.model_validate("irds:cranfield"), tmp_path / "out")  # a real id whose files are not cached
    assert "\n" not in str(info.value)
    with pytest.raises(ExperimentError, match="irds:no-such-set: ir_datasets knows no dataset 'no-such-set'"):
        prepare_dataset(Dataset.model_validate("irds:no-such-set"), tmp_path / "out2")


def test_irds_conversion_is_reused_only_as_this_code_made_it_and_never_half_written(tmp_path, monkeypatch):
    """The BEIR directory an ``irds:`` dataset is converted into was reused by the dataset's id
    alone: a release that converts otherwise (or another ir_datasets) kept the old files, and a
    conversion of another id that failed half-way into the same directory left the first id's
    mark over mixed files. The mark is the conversion's (id, code, ir_datasets' version), and
    it is taken away before any file is written."""
    import ir_datasets

    from logicrank.pipelines.datasets import registry

    def register(name, docs):
        (tmp_path / f"{name}.tsv").write_text("".join(f"d{i}\t{t}\n" for i, t in enumerate(docs)))
        (tmp_path / "queries.tsv").write_text("q1\tmalaria\n")
        (tmp_path / "qrels.txt").write_text("q1 0 d1 1\n")
        ir_datasets.registry.register(f"{name}-{tmp_path.name}", ir_datasets.create_dataset(
            docs_tsv=str(tmp_path / f"{name}.tsv"), queries_tsv=str(tmp_path / "queries.tsv"), qrels_trec=str(tmp_path / "qrels.txt")))
        return f"{name}-{tmp_path.name}"

    def texts(out):
        return [json.loads(line)["text"] for line in (out / "corpus.jsonl").read_text().splitlines()]

    a, b = register("a", ["malaria in children", "malaria in adults"]), register("b", ["other", "texts", "here"])
    out = tmp_path / "irds"
    assert texts(registry.irds_to_beir(a, out)) == ["malaria in children", "malaria in adults"]
    (tmp_path / "a.tsv").write_text("d0\tchanged\nd1\tchanged too\n")
    assert texts(registry.irds_to_beir(a, out)) == ["malaria in children", "malaria in adults"]  # the same conversion: reused
    from logicrank.pipelines import codedigest

    monkeypatch.setattr(codedigest, "code_digest", lambda module: "another release")
    assert texts(registry.irds_to_beir(a, out)) == ["changed", "changed too"]  # another converter's code: converted again
    monkeypatch.undo()
    assert texts(registry.irds_to_beir(a, out)) == ["changed", "changed too"]

    def fails(doc):
        raise OSError("disk full")

    monkeypatch.setattr(registry, "doc_fields", fails)
    with pytest.raises(registry.DatasetError, match="disk full"):
        registry.irds_to_beir(b, out)  # the other id fails half-way over the same directory
    monkeypatch.undo()
    (tmp_path / "a.tsv").write_text("d0\tmalaria in children\nd1\tmalaria in adults\n")
    assert texts(registry.irds_to_beir(a, out)) == ["malaria in children", "malaria in adults"]  # not taken for complete
