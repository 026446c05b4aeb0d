"""Retrieval as pipelines of stages: the stages (:mod:`~logicrank.pipelines.retrieval.stages`),
the methods' logic they run (:mod:`~logicrank.pipelines.retrieval.methods`), the logical query
language (:mod:`~logicrank.pipelines.retrieval.logic`), pipelines as values
(:mod:`~logicrank.pipelines.retrieval.pipeline`), run with the stage cache
(:mod:`~logicrank.pipelines.retrieval.runner`), the ``--set`` grammar
(:mod:`~logicrank.pipelines.retrieval.overrides`), the stage options' base
(:mod:`~logicrank.pipelines.retrieval.options`) and the ``--method`` presets (``presets/``)."""
