"""The experiment files that ship (jobs/experiments/) load and validate, and a sample from
the command line (`logicrank experiment FILE --sample N`) replaces the file's own."""

from __future__ import annotations

import pytest

from jobs.experiment import EXPERIMENTS, ExperimentError, load, with_sample


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_file_loads(path):
    exp = load(path)
    assert exp.name == path.stem  # the name a report and `logicrank experiment NAME` use


def test_a_sample_replaces_the_files_and_drops_its_references():
    exp = load("rulebench-siar")
    assert exp.references and exp.dataset.sample is None
    got = with_sample(exp, 25, 1)
    assert (got.dataset.sample, got.dataset.seed, got.dataset.rulebench) == (25, 1, exp.dataset.rulebench)
    assert got.references == () and "not checked on this sample" in got.caveats[-1]
    assert got.pipelines == exp.pipelines and got.measures == exp.measures
    assert with_sample(exp, None, None) == exp  # nothing given: the file as it is
    with pytest.raises(ExperimentError, match="greater than or equal to 1"):
        with_sample(exp, 0, None)
