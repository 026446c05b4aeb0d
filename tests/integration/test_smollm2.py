"""The embedded default model end to end: prepared from its package, loaded by vLLM."""

from __future__ import annotations

import pytest

from logicrank.pipelines.config.settings import LLMConfig
from logicrank.pipelines.llm import prompts
from logicrank.pipelines.llm.engine import Constraint, Engine
from logicrank.pipelines.llm.models import MARKER, checksum, prepare
from logicrank.pipelines.retrieval.logic.grammar import to_gbnf
from logicrank.pipelines.retrieval.logic.query import parse

pytestmark = [pytest.mark.integration, pytest.mark.llm]


def test_smollm2_is_prepared_from_its_package_and_scores_and_decodes():
    resolved = prepare("smollm2-135m-instruct")  # converts once (about a minute), then verifies
    assert (resolved.path / MARKER).is_file() and resolved.model_id.endswith(checksum(resolved.path)[:12])
    assert prepare("smollm2-135m-instruct") == resolved  # idempotent
    engine = Engine(LLMConfig(cache=None, max_model_len=1024, max_num_seqs=8), resolved).start()
    assert engine.label_note is None  # " True" and " False" are single tokens for its tokenizer
    truth = prompts.load("truth")
    res = engine.truth([truth.render(context="", statement=s) for s in ("Paris is the capital of France", "Two plus two is five")])
    assert all(0.0 < r.p_true < 1.0 and r.exact for r in res)
    gens = engine.generate(
        [prompts.load("itlr_decompose").render(question="vitamin D benefits other than bone health")],
        Constraint("grammar", to_gbnf()), max_tokens=64,
    )
    assert gens[0].finish_reason == "stop"
    parse(gens[0].text)
