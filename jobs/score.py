"""True/False scoring of a prompts table on the job's LLM service: one forward pass per prompt.

Input: a table of truth prompts (``prompt_id`` plus the ``truth`` template's fields,
``context`` and ``statement``). Output: one row per prompt (TRUTH_SCORES), in input order;
a batch the engine cannot score fails the job (scores are never guessed). Placement (actors,
CPUs, GPUs, custom resources, batch size) comes from the LLMConfig.
"""

from __future__ import annotations

import pyarrow as pa

from jobs.llm_service import LLMService
from jobs.raysession import ray_session
from pipelines.llm import prompts
from schemas.config import LLMConfig, RayConfig
from schemas.tables import TRUTH_SCORES


def score_truth(table: pa.Table, llm: LLMConfig, ray_cfg: RayConfig, template: str = "truth", echo=None) -> pa.Table:
    """TRUTH_SCORES for every row of ``table`` (prompt_id, context, statement), in order.
    ``echo`` (if given) receives a progress line per batch scored ("<done>/<n> prompts")."""
    values = [{"context": c or "", "statement": s} for c, s in zip(table.column("context").to_pylist(), table.column("statement").to_pylist(), strict=True)]
    with ray_session(ray_cfg):
        service = LLMService(llm, echo=echo)
        try:
            res = service.truth(prompts.load(template), values, label="score")
        finally:
            service.close()
    return pa.table(
        {
            "prompt_id": table.column("prompt_id"),
            "p_true": [r.p_true for r in res],
            "logit_true": [r.logit_true for r in res],
            "logit_false": [r.logit_false for r in res],
            "exact": [r.exact for r in res],
            "prompt_tokens": pa.array([r.prompt_tokens for r in res], pa.int32()),
            "cached_prompt_tokens": pa.array([r.cached_prompt_tokens for r in res], pa.int32()),
            "cached": [r.cached for r in res],
        },
        schema=TRUTH_SCORES,
    )
