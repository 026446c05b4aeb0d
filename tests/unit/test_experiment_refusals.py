"""Experiment files (pipelines/evaluation/experiment/) without Ray: every shipped file loads, by path and
by name, and a bad file is refused in one line that says what is wrong (moved from
tests/integration/test_experiment.py, whose runs need Ray)."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.pipelines.evaluation.experiment import EXPERIMENTS, ExperimentError, load

BASE = {"name": "x", "title": "x", "dataset": {"bundled": "scifact"}}


def test_the_shipped_files_load_by_path_and_by_name():
    shipped = sorted(EXPERIMENTS.glob("*.yaml"))
    assert len(shipped) >= 5
    for path in shipped:
        assert load(path) == load(path.stem)


@pytest.mark.parametrize(("spec", "message"), [
    (BASE, "give pipelines or presets"),
    ({**BASE, "dataset": {}, "presets": ["dense"]}, "dataset: give exactly one of bundled, beir"),
    ({**BASE, "presets": ["dense"], "measure": ["P@1"]}, "measure: no such option; options: name, title, dataset"),
    ({**BASE, "pipelines": {"o": ["orlog"]}}, "pipeline 'o', stage 1 \\(orlog\\) reranks a run"),
    ({**BASE, "presets": ["bm25"], "measures": ["nDCG@ten"]}, "nDCG@ten"),
    ({**BASE, "presets": ["bm25"], "baseline": "dense"}, r"not among the pipelines \['bm25'\]: \['dense'\]"),
    ({**BASE, "presets": ["bm25"], "pipelines": {"bm25": ["bm25"]}}, r"both name \['bm25'\]"),
    ({**BASE, "presets": ["bm25"], "embed": {"titel_sep": ". "}}, r"embed: titel_sep '\. ': no such option; options: model"),
    ({**BASE, "presets": ["bm25"], "index": {"corpus": "c"}}, r"index: \['corpus'\] come from the dataset"),
    ({**BASE, "presets": ["bm25"], "measures": ["P@1"],
      "references": [{"run": "bm25", "measure": "nDCG@20", "value": 0.5, "tolerance": 0.1, "source": "s"}]},
     r"references name measure\(s\) not among the measures \['P@1'\]: \['bm25 nDCG@20'\]"),
], ids=["no-pipelines", "no-dataset", "unknown-field", "reranker-first", "bad-measure", "bad-baseline", "name-twice", "bad-embed-field",
        "index-corpus", "reference-measure"])
def test_a_bad_experiment_file_is_one_line(tmp_path, spec, message):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(ExperimentError, match=message) as info:
        load(tmp_path / "bad.yaml")
    assert "\n" not in str(info.value)


def test_an_unset_variable_in_a_dataset_path_is_one_line(tmp_path, monkeypatch):
    """Refused before a Ray cluster starts (it was after: seconds of start-up for a typo)."""
    import logicrank.jobs.raysession

    def no_cluster(*args, **kwargs):
        raise AssertionError("a Ray session started before the dataset was checked")

    monkeypatch.setattr(logicrank.jobs.raysession, "ray_session", no_cluster)
    monkeypatch.delenv("NO_SUCH_DIR", raising=False)
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({**BASE, "dataset": {"beir": "${NO_SUCH_DIR}/ulogic"}, "presets": ["bm25"]}))
    res = CliRunner().invoke(app, ["experiment", str(tmp_path / "env.yaml"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and res.output.strip() == "error: dataset path '${NO_SUCH_DIR}/ulogic': an environment variable in it is not set", res.output


@pytest.mark.parametrize("path", ["${EMPTY_DIR}", "$EMPTY_DIR", "${EMPTY_DIR}/ulogic"])
def test_a_variable_set_to_nothing_in_a_dataset_path_is_one_line(tmp_path, monkeypatch, path):
    """`DATA= logicrank experiment ...` over `beir: ${DATA}` read the working directory as the
    dataset (and `${DATA}/ulogic` the root's ulogic), silently. Refused, the variable named."""
    monkeypatch.setenv("EMPTY_DIR", "")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({**BASE, "dataset": {"beir": path}, "presets": ["bm25"]}))
    res = CliRunner().invoke(app, ["experiment", str(tmp_path / "env.yaml"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and res.output.strip() == f"error: dataset path {path!r}: the environment variable EMPTY_DIR is set to nothing", res.output


def test_a_variable_set_to_nothing_inside_a_dataset_path_is_a_path(monkeypatch):
    from logicrank.pipelines.evaluation.experiment.datasets import expand

    monkeypatch.setenv("VARIANT", "")
    assert expand("data/scifact${VARIANT}") == "data/scifact"  # a valid path, a suffix left out


def test_a_seed_without_a_sample_is_refused(tmp_path):
    """`--seed 5` over a file without a sample drew nothing and changed nothing, silently,
    though its help says it sets the dataset's seed."""
    (tmp_path / "e.yaml").write_text(yaml.safe_dump({**BASE, "presets": ["bm25"]}))
    res = CliRunner().invoke(app, ["experiment", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "o"), "--seed", "5"])
    assert res.exit_code == 2 and res.output.strip() == ("error: --seed 5: the seed of a sample, and neither --sample nor the file's "
                                                         "dataset.sample draws one; give --sample N too"), res.output
