"""Evaluation: measures (ir_measures, trec_eval's C code), QA measures, significance tests,
runs evaluated in any process (:mod:`~logicrank.pipelines.evaluation.runs`), reports and
history; experiments (:mod:`~logicrank.pipelines.evaluation.experiment`) and the bench
commands' experiments (:mod:`~logicrank.pipelines.evaluation.benchmarks`)."""
