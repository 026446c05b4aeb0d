"""A job's output directory holds what its last run made (earlier runs' other outputs are
moved aside, said in one line), and a command that only reads a table creates nothing."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.jobs.retrieve import earlier_outputs, output_dirs
from logicrank.jobs.rundir import RunDir
from logicrank.pipelines.config.retrieval import RetrieveConfig
from logicrank.pipelines.engines.store import DocStore, StoreError


def _touch(root, *rels):
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)


def test_a_missing_database_is_refused_in_one_line_and_never_created(tmp_path):
    missing = tmp_path / "typo" / "lancedb"
    store = DocStore(str(missing), "docs")
    assert not store.exists()
    with pytest.raises(StoreError, match=r"^store: no database at '.*typo/lancedb' \(no such directory; nothing was created there\); "
                                         r"check --db, or run `logicrank index` first\.$"):
        store.version  # noqa: B018 (the first read of the table)
    assert not (tmp_path / "typo").exists()  # before: lancedb.connect made typo/lancedb/
    with pytest.raises(StoreError, match="no database at"):
        DocStore(f"file://{missing}", "docs", version=3).table  # noqa: B018
    assert not (tmp_path / "typo").exists()
    # a writer still makes it: the index job creates the table (and the directory) on its first write
    DocStore(str(missing), "docs").open_or_create(4, "some-model")
    assert DocStore(str(missing), "docs").exists() and (missing / "docs.lance").is_dir()
    # an existing database without the table: the tables it holds are named
    with pytest.raises(StoreError, match=r"no table 'other' in .* \(it holds 'docs'\); check --table, or run `logicrank index` first"):
        DocStore(str(missing), "other").table  # noqa: B018
    assert DocStore(str(tmp_path), "docs").absent() == f"no table 'docs' in {str(tmp_path)!r} (it holds no table)"


def test_retrieve_with_a_mistyped_db_creates_no_directory(tmp_path):
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"_id": "1", "text": "protein"}\n')
    typo = tmp_path / "dta" / "lancedb"
    result = CliRunner().invoke(app, ["retrieve", str(queries), "--db", str(typo), "--method", "bm25", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "no database at" in result.output and str(typo) in " ".join(result.output.split())
    assert not (tmp_path / "dta").exists() and not (tmp_path / "r").exists()


def test_set_aside_moves_earlier_files_keeping_their_paths_and_says_so(tmp_path):
    _touch(tmp_path, "runs/old.parquet", "runs/old.trec", "term_scores/old-itlr.parquet")
    rundir, lines = RunDir(tmp_path, "retrieve"), []
    assert rundir.set_aside(["runs/absent.parquet"], lines.append) is None and not lines
    aside = rundir.set_aside(["runs/old.parquet", "runs/old.trec"], lines.append)
    assert aside.parent == tmp_path / "previous" and (aside / "runs" / "old.parquet").read_text() == "runs/old.parquet"
    assert not (tmp_path / "runs" / "old.parquet").exists() and not (tmp_path / "runs" / "old.trec").exists()
    assert lines == [f"retrieve: moved 2 earlier output(s) of {tmp_path} that this run does not make to {aside}: runs/old.parquet, runs/old.trec"]
    assert rundir.set_aside(["term_scores/old-itlr.parquet"]) == aside  # one directory per run
    rundir.write_manifest({}, "h", {}, [])
    recorded = json.loads((tmp_path / "manifest.json").read_text())["set_aside"]
    assert recorded == {"to": str(aside.relative_to(tmp_path)), "files": ["runs/old.parquet", "runs/old.trec", "term_scores/old-itlr.parquet"]}
    _touch(tmp_path, "runs/old.parquet")
    again = RunDir(tmp_path, "retrieve")
    assert again.set_aside(["runs/old.parquet"]) != aside and len(list((tmp_path / "previous").iterdir())) == 2  # a later run: its own


def test_retrieve_moves_only_outputs_of_pipelines_it_does_not_run(tmp_path):
    cfg = RetrieveConfig.preset(queries="q.jsonl", db="db", methods=("dense", "bm25"), set={"dense.k": 10, "bm25.k": 10})
    assert {"runs", "term_scores", "predicate_scores", "decompositions", "answers"} <= set(output_dirs())
    _touch(tmp_path, "runs/dense.parquet", "runs/bm25.parquet", "runs/bm25.trec", "runs/old.parquet", "runs/old.trec", "runs/notes.txt",
           "runs/.bm25.parquet.tmp", "term_scores/old-itlr.parquet", "term_scores/dense@0-rrf0.parquet", "stages/abc/out.parquet",
           "manifest.json", "stalled-20261127T000000Z.txt")
    rundir = RunDir(tmp_path, "retrieve")
    assert earlier_outputs(rundir, cfg) == ["runs/bm25.trec", "runs/old.parquet", "runs/old.trec", "term_scores/old-itlr.parquet"]
    trec = cfg.model_copy(update={"trec": True})
    assert earlier_outputs(rundir, trec) == ["runs/old.parquet", "runs/old.trec", "term_scores/old-itlr.parquet"]
    # once the run wrote its outputs: a side table its pipelines no longer make goes too
    assert earlier_outputs(rundir, cfg, {"runs/dense.parquet", "runs/bm25.parquet"}) == [
        "runs/bm25.trec", "runs/old.parquet", "runs/old.trec", "term_scores/dense@0-rrf0.parquet", "term_scores/old-itlr.parquet"]


def test_evaluate_moves_a_significance_table_it_no_longer_makes(tmp_path):
    from logicrank.jobs.evaluate import run_evaluate
    from logicrank.pipelines.config.settings import EvaluateConfig

    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    a, b = tmp_path / "a.trec", tmp_path / "b.trec"
    a.write_text("q1 Q0 d1 1 2.0 a\nq1 Q0 d2 2 1.0 a\nq2 Q0 d1 1 2.0 a\nq2 Q0 d2 2 1.0 a\n")
    b.write_text("q1 Q0 d2 1 2.0 b\nq1 Q0 d1 2 1.0 b\nq2 Q0 d2 1 2.0 b\nq2 Q0 d1 2 1.0 b\n")
    out, lines = tmp_path / "ev", []
    run_evaluate(EvaluateConfig(qrels=str(qrels), runs=(str(a), str(b)), measures=("P@1",)), out, echo=lines.append)
    assert (out / "significance.parquet").exists() and not lines
    run_evaluate(EvaluateConfig(qrels=str(qrels), runs=(str(a),), measures=("P@1",)), out, echo=lines.append)
    assert not (out / "significance.parquet").exists()  # before: the two-run table stayed beside the one-run metrics
    (aside,) = (out / "previous").iterdir()
    assert (aside / "significance.parquet").exists()
    assert lines == [f"evaluate: moved 1 earlier output(s) of {out} that this run does not make to {aside}: significance.parquet"]
    assert json.loads((out / "manifest.json").read_text())["set_aside"]["files"] == ["significance.parquet"]


def test_a_second_run_of_a_job_over_the_same_directory_is_refused_while_the_first_holds_it(tmp_path):
    """Two runs of one job over one --out both found it not fresh and wrote their runs and
    manifests in turn: the manifest of one beside the runs of the other, which the next rerun
    of that config took as fresh. A run holds its directory for its job while it runs; another
    is refused in one line, a run of another job there is not, and once the first ends the
    directory is free again."""
    from logicrank.jobs.rundir import RunDirBusy

    first = RunDir(tmp_path / "out", "retrieve")
    with first.held():
        second = RunDir(tmp_path / "out", "retrieve")
        with pytest.raises(RunDirBusy, match=r"^retrieve: another retrieve run is writing .*out now; wait for it to finish, or give another --out$"), \
                second.held():
            pass
        with RunDir(tmp_path / "out", "evaluate").held():  # another job's manifest: its own lock
            pass
    with RunDir(tmp_path / "out", "retrieve").held():
        pass


def test_the_index_jobs_line_on_documents_written_again_reads_a_records_kind_whatever_follows_it():
    """A table's record of what made its vectors is the embedding code's digest or
    ``precomputed``, either followed by ``+`` and a local model directory's files: the line
    read ``precomputed+<files>`` as embedding code, and said the embedding code had changed."""
    from logicrank.cli import reembed_note

    assert reembed_note("docs", {"before": "abc", "now": "abc"}) is None
    switched = reembed_note("docs", {"before": "abc+f1", "now": "precomputed+f2", "reembedded": 40})
    assert switched == ("index: table 'docs''s vectors were embedded by logicrank; this run's are given by the corpus (--vector-column), "
                        "so its 40 stored documents were written again.")
    back = reembed_note("docs", {"before": "precomputed", "now": "abc", "reembedded": 3})
    assert back is not None and "were given by the corpus (--vector-column); this run's are embedded by logicrank" in back
    saved_over = reembed_note("docs", {"before": "precomputed+f1", "now": "precomputed+f2", "reembedded": 40})
    assert saved_over is not None and saved_over.startswith("index: table 'docs''s vectors were given by the corpus for another --vector-model")
    assert "code that embeds documents" in reembed_note("docs", {"before": "abc", "now": "def", "reembedded": 5})
