"""An experiment: one benchmark as a value and a YAML file, PyTerrier's ``Experiment`` in
logicrank's terms, run in this process or by the jobs.

An experiment names a dataset (a bundled set, a BEIR directory, or a converter's output), an
index recipe, named pipelines and ``--method`` presets, stage overrides (``set``, the grammar
of :mod:`logicrank.pipelines.retrieval.overrides`), measures, a baseline for the significance tests,
query columns to group the per-query figures by, reference figures with tolerances, and
caveats. :func:`run_in_process` runs it over a table that exists, in this process, without
Ray (``lr.run_experiment(exp, table=...)``); ``logicrank experiment`` (jobs/experiment.py)
indexes the corpus and runs every pipeline in one retrieve job on a Ray cluster. Both end in
:func:`conclude`: group, check the references, render one report ``<out>/experiment.md``; a
reference missed fails the run after the report is written (``strict``). The files that
ship are in jobs/experiments/ (docs/experiments.md).

- :mod:`~logicrank.pipelines.evaluation.experiment.model`: the experiment as a value, loaded, overridden, sampled;
- :mod:`~logicrank.pipelines.evaluation.experiment.datasets`: its dataset made ready (converted, generated, sampled);
- :mod:`~logicrank.pipelines.evaluation.experiment.run`: the checks before any work, and the run in this process;
- :mod:`~logicrank.pipelines.evaluation.experiment.report`: the end of a run: groups, references, the report.
"""

from logicrank.pipelines.evaluation.experiment.datasets import dataset_root, prepare_dataset, sample_queries
from logicrank.pipelines.evaluation.experiment.model import (
    EXPERIMENTS,
    Dataset,
    Experiment,
    ExperimentError,
    Reference,
    ReferenceMissed,
    load,
    override,
    with_encoder,
    with_sample,
)
from logicrank.pipelines.evaluation.experiment.report import ExperimentResult, ReferenceCheck, conclude, grouped, render
from logicrank.pipelines.evaluation.experiment.run import prepared, run_in_process

__all__ = ["EXPERIMENTS", "Dataset", "Experiment", "ExperimentError", "ExperimentResult", "Reference", "ReferenceCheck", "ReferenceMissed",
           "conclude", "dataset_root", "grouped", "load", "override", "prepare_dataset", "prepared", "render", "run_in_process",
           "sample_queries", "with_encoder", "with_sample"]
