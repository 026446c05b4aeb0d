"""Every job's config, in one package; import from its modules.

- :mod:`~logicrank.pipelines.config.base`: the base class every config derives from (frozen,
  unknown keys refused, hashed; the ``OUTSIDE`` and ``UNHASHED`` field markers).
- :mod:`~logicrank.pipelines.config.embedding`: the encoder's config, alone, because the code
  that makes vectors imports it and an edit there embeds every stored document again.
- :mod:`~logicrank.pipelines.config.settings`: the settings every job shares and the configs
  that need nothing else (Ray, index, LLM, evaluate, generate; ``EmbedConfig`` re-exported).
  It imports no project module outside this package, so the engines (stores, LLM engines)
  import it freely.
- :mod:`~logicrank.pipelines.config.retrieval`: the configs that hold pipelines or
  decomposition kinds (retrieve, decompose, nightly), validated by the stage and decomposition
  registries, which import the engines.

settings and retrieval are two modules because the second reads the registries and the
registries' engines read the first; one module would be an import circle. An experiment
file's model (``Experiment``) lives with the experiment runner in
:mod:`logicrank.pipelines.evaluation.experiment`. ``import logicrank`` gives every config by name.
"""
