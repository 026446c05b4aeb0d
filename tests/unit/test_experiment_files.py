"""The experiment files that ship (jobs/experiments/) load and validate, and a sample from
the command line (`logicrank experiment FILE --sample N`) replaces the file's own."""

from __future__ import annotations

import re

import pytest

from jobs.experiment import EXPERIMENTS, ExperimentError, load, override, with_sample


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_file_loads(path):
    exp = load(path)
    assert exp.name == path.stem  # the name a report and `logicrank experiment NAME` use


def test_a_sample_replaces_the_files_and_drops_its_references():
    exp = load("rulebench-siar")
    assert exp.references and exp.dataset.sample is None
    got = with_sample(exp, 25, 1)
    assert (got.dataset.sample, got.dataset.seed, got.dataset.rulebench) == (25, 1, exp.dataset.rulebench)
    assert got.references == () and "not checked on this run" in got.caveats[-1]
    assert got.pipelines == exp.pipelines and got.measures == exp.measures
    assert with_sample(exp, None, None) == exp  # nothing given: the file as it is
    with pytest.raises(ExperimentError, match="greater than or equal to 1"):
        with_sample(exp, 0, None)


def test_qa_measures_are_checked_before_any_work():
    from jobs.experiment import Experiment

    lag = load("lag").model_dump(exclude_none=True)
    ok = Experiment.model_validate(lag | {"references": [{"run": "lag", "measure": "em", "value": 0.1, "tolerance": 0.1, "source": "x"}]})
    assert ok.references[0].measure == "em"  # a QA measure may carry a reference
    cases = {
        "unknown QA measure(s) 'Exact'": lag | {"qa_measures": ["Exact"]},
        "qa_measures need gold answers": lag | {"dataset": {"bundled": "scifact"}},
        "gold is only read for qa_measures": lag | {"qa_measures": [], "gold": "answers.jsonl"},
        "not among the measures": lag | {"references": [{"run": "lag", "measure": "Judge", "value": 0.1, "tolerance": 0.1, "source": "x"}]},
    }
    for why, spec in cases.items():
        with pytest.raises(ValueError, match=re.escape(why)):
            Experiment.model_validate(spec)


def test_override_sets_dotted_keys_and_drops_only_the_references_it_moves():
    exp = load("lag-oracle")
    got = override(exp, {"pipelines.question.1.cut.times": 3, "index.ann_threshold": 1000})
    assert got.pipelines["question"][1] == {"cut": {"depths": "{dataset}/answers.jsonl", "field": "decomposition", "times": 3}}
    assert got.index == {"ann_threshold": 1000} and got.pipelines["gold-chain"] == exp.pipelines["gold-chain"]
    assert [r.run for r in got.references] == ["gold-chain", "gold-no-answer"]  # the question row moved
    assert "1 of the file's references" in got.caveats[-1]
    assert override(exp, {"pipelines": {"gold-chain": exp.pipelines["gold-chain"]}, "baseline": None, "references": []}).pipelines.keys() == {"gold-chain"}
    assert override(exp, {}) == exp
    for key, value, why in (("pipelines.question.7.cut.k", 3, "no such place"), ("dataset.qa", "nq", "dataset.qa: Input should be"),
                            ("pipelines.question.1.cut.times", 0, "greater than or equal to 1")):
        with pytest.raises(ExperimentError, match=why):
            override(exp, {key: value})


def test_a_reference_is_reproduced_within_its_tolerance_and_never_without_a_figure():
    from jobs.experiment import Reference, ReferenceCheck

    ref = Reference(run="question", measure="R@100", value=0.697, tolerance=0.01, source="x")
    assert ReferenceCheck(ref, 0.6875).ok and ReferenceCheck(ref, 0.7065).ok
    assert not ReferenceCheck(ref, 0.6865).ok and not ReferenceCheck(ref, 0.7075).ok and not ReferenceCheck(ref, None).ok
