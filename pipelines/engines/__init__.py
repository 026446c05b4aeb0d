"""The engines a retrieval runs on: BM25 (:mod:`~logicrank.pipelines.engines.bm25`), the LanceDB
table (:mod:`~logicrank.pipelines.engines.store`), the dense operand and its exact search
(:mod:`~logicrank.pipelines.engines.vectors`, :mod:`~logicrank.pipelines.engines.exact`), the
encoders (:mod:`~logicrank.pipelines.engines.embed`) and their placement on a cluster
(:mod:`~logicrank.pipelines.engines.placement`)."""
