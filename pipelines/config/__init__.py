"""Every job's config, in one package; import from its two modules.

- :mod:`~logicrank.pipelines.config.settings`: the settings every job shares and the configs
  that need nothing else (Ray, embedding, index, LLM, evaluate, generate). It imports no other
  project module, so the engines (embedding, stores, LLM engines) import it freely.
- :mod:`~logicrank.pipelines.config.pipelines`: the configs that hold pipelines or
  decomposition kinds (retrieve, decompose, nightly), validated by the stage and decomposition
  registries, which import the engines.

Two modules because the second reads the registries and the registries' engines read the
first; one module would be an import circle. An experiment file's model (``Experiment``) lives
with the experiment runner in :mod:`logicrank.pipelines.experiment`. ``import logicrank`` gives
every config by name.
"""
