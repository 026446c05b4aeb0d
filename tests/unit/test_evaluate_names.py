"""`logicrank evaluate --name NEWID=FILE`: a run file's run evaluated under another run id, so
two files with the same tag compare; a file of several runs or a colliding id is one line."""

import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.pipelines.config.settings import EvaluateConfig

runner = CliRunner()


def _err(result) -> str:
    return " ".join((result.stderr or result.output).split())


@pytest.fixture
def files(tmp_path):
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    good = tmp_path / "good.trec"  # both tagged bm25
    good.write_text("q1 Q0 d1 1 2.0 bm25\nq1 Q0 d2 2 1.0 bm25\nq2 Q0 d2 1 2.0 bm25\nq2 Q0 d1 2 1.0 bm25\n")
    bad = tmp_path / "bad.trec"
    bad.write_text("q1 Q0 d2 1 2.0 bm25\nq1 Q0 d1 2 1.0 bm25\nq2 Q0 d1 1 2.0 bm25\nq2 Q0 d2 2 1.0 bm25\n")
    two = tmp_path / "two.trec"
    two.write_text("q1 Q0 d1 1 2.0 x\nq2 Q0 d2 1 2.0 x\nq1 Q0 d2 1 2.0 y\n")  # two runs (a tag per run, not per query)
    return tmp_path, qrels, good, bad, two


def test_two_files_with_one_tag_compare_under_new_names(files):
    tmp, qrels, good, bad, _ = files
    r = runner.invoke(app, ["evaluate", str(qrels), str(good), str(bad), "--out", str(tmp / "ev0")])
    assert r.exit_code == 2 and "run ids repeat" in _err(r), _err(r)
    r = runner.invoke(app, ["evaluate", str(qrels), str(good), str(bad), "--name", f"new={good}", "--name", f"old={bad}",
                            "--measure", "P@1", "--measure", "ndcg_cut_10", "--out", str(tmp / "ev")])
    assert r.exit_code == 0, _err(r)
    m = pq.read_table(tmp / "ev" / "metrics.parquet").to_pandas()
    means = m[m["query_id"] == "all"].set_index(["run_id", "measure"])["value"]
    assert means[("new", "P@1")] == 1.0 and means[("old", "P@1")] == 0.0
    assert set(m["measure"]) == {"P@1", "nDCG@10"} and list(dict.fromkeys(m["run_id"])) == ["new", "old"]
    assert (tmp / "ev" / "significance.parquet").exists()
    # one renamed, the other keeping its tag; a named file not among RUNS is added to them
    r = runner.invoke(app, ["evaluate", str(qrels), str(bad), "--name", f"new={good}", "--measure", "P@1", "--out", str(tmp / "ev2")])
    assert r.exit_code == 0, _err(r)
    assert set(pq.read_table(tmp / "ev2" / "metrics.parquet").column("run_id").to_pylist()) == {"bm25", "new"}


def test_a_file_of_several_runs_or_a_colliding_id_is_one_line(files):
    tmp, qrels, good, bad, two = files
    r = runner.invoke(app, ["evaluate", str(qrels), str(two), "--name", f"z={two}", "--out", str(tmp / "ev")])
    assert r.exit_code == 2 and "holds 2 runs (x, y)" in _err(r) and "--name z=" in _err(r), _err(r)
    assert "\n" not in r.output.strip()
    r = runner.invoke(app, ["evaluate", str(qrels), str(good), str(bad), "--name", f"bm25={good}", "--out", str(tmp / "ev")])
    assert r.exit_code == 2 and "run id 'bm25' is already a run of" in _err(r) and str(bad) in _err(r), _err(r)
    r = runner.invoke(app, ["evaluate", str(qrels), str(good), str(two), "--name", f"x={good}", "--out", str(tmp / "ev")])
    assert r.exit_code == 2 and "run id 'x' is already a run of" in _err(r), _err(r)
    for bad_name in [str(good), f"={good}", "a="]:
        r = runner.invoke(app, ["evaluate", str(qrels), str(good), "--name", bad_name, "--out", str(tmp / "ev")])
        assert r.exit_code == 2 and "NEWID=FILE" in _err(r), _err(r)
    r = runner.invoke(app, ["evaluate", str(qrels), str(good), str(bad), "--name", f"a={good}", "--name", f"a={bad}", "--out", str(tmp / "ev")])
    assert r.exit_code == 2 and "given twice" in _err(r), _err(r)
    r = runner.invoke(app, ["evaluate", str(qrels), str(good), "--name", f"a={good}", "--name", f"b={good}", "--out", str(tmp / "ev")])
    assert r.exit_code == 2 and "named twice" in _err(r), _err(r)
    assert not (tmp / "ev" / "metrics.parquet").exists()


def test_names_in_a_config(files):
    _, qrels, good, bad, _ = files
    cfg = EvaluateConfig(qrels=str(qrels), runs=(str(bad),), names={"new": str(good)})
    assert cfg.runs == (str(bad), str(good)) and cfg.run_id_for(str(good)) == "new" and cfg.run_id_for(str(bad)) is None
    assert EvaluateConfig(qrels=str(qrels), runs=(str(good),), names=[f"new={good}"]).runs == (str(good),)
    with pytest.raises(ValidationError, match="NEWID=FILE"):
        EvaluateConfig(qrels=str(qrels), names=["new"])
    # a YAML mapping: a number is a run id as its text; 1 and "1" are one id given twice; a key or file that is no name, refused
    assert EvaluateConfig(qrels=str(qrels), runs=(str(bad),), names={1: str(good)}).run_id_for(str(good)) == "1"
    with pytest.raises(ValidationError, match="names: 1: given twice"):  # named as the file's key, not --name
        EvaluateConfig(qrels=str(qrels), names={1: str(good), "1": str(bad)})
    for names in ({None: str(good)}, {True: str(good)}, {" ": str(good)}, {"new": None}, {"new": 3}, {"new": ""}, 5, True):
        with pytest.raises(ValidationError, match="names: "):  # (names: 5 was a TypeError's traceback)
            EvaluateConfig(qrels=str(qrels), names=names)
    with pytest.raises(ValidationError, match=r"names: the run id 1.5 was read as a number: quote it \('1.5': FILE\)"):
        EvaluateConfig(qrels=str(qrels), names={1.5: str(good)})


def test_two_names_may_swap_two_files_run_ids(files):
    tmp, qrels, good, bad, _ = files
    other = tmp / "other.trec"
    other.write_text(bad.read_text().replace(" bm25", " other"))
    r = runner.invoke(app, ["evaluate", str(qrels), str(good), str(other), "--name", f"other={good}", "--name", f"bm25={other}",
                            "--measure", "P@1", "--out", str(tmp / "swap")])
    assert r.exit_code == 0, _err(r)
    means = pq.read_table(tmp / "swap" / "metrics.parquet").to_pandas().query("query_id == 'all'").set_index("run_id")["value"]
    assert means["other"] == 1.0 and means["bm25"] == 0.0  # good's run is now "other", other's is "bm25"
