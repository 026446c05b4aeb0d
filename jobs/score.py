"""True/False scoring on an actor pool of engines: one forward pass per prompt.

Input: a table of truth prompts (``prompt_id`` plus the ``truth`` template's fields,
``context`` and ``statement``). Output: one row per prompt (TRUTH_SCORES), in input order;
a batch the engine cannot score fails the job (scores are never guessed).
"""

from __future__ import annotations

import pyarrow as pa

from pipelines.errors import UserError
from pipelines.llm import prompts
from schemas.config import LLMConfig, RayConfig
from schemas.tables import TRUTH_SCORES


class ScoreJobError(UserError, RuntimeError):
    """The scoring job cannot run as configured; the message says what to change."""


class _TruthActor:
    def __init__(self, llm: LLMConfig, template: str):
        from pipelines.llm.engine import LLMClient

        self.client = LLMClient(llm)
        self.template = prompts.load(template)

    def __call__(self, batch: pa.Table) -> pa.Table:
        values = [{"context": c or "", "statement": s} for c, s in zip(batch.column("context").to_pylist(), batch.column("statement").to_pylist(), strict=True)]
        res = self.client.truth(self.template, values)
        return pa.table(
            {
                "prompt_id": batch.column("prompt_id"),
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


def score_truth(
    table: pa.Table,
    llm: LLMConfig,
    ray_cfg: RayConfig,
    actors: int = 1,
    actor_num_cpus: float = 1.0,
    actor_num_gpus: float = 0.0,
    batch_rows: int = 256,
    template: str = "truth",
    echo=None,
    actor_resources: dict[str, float] | None = None,
) -> pa.Table:
    """TRUTH_SCORES for every row of ``table`` (prompt_id, context, statement), in order.

    ``echo`` (if given) receives a progress line per batch scored. ``actor_resources``:
    custom Ray resources per engine actor (only nodes offering them host one).
    """
    from jobs.raysession import ray_session, require_fit
    from pipelines.llm.models import resolve

    resolved = resolve(llm.model)  # prepare once on the driver, before the actors start
    llm = llm.model_copy(update={"model": str(resolved.path)})
    n = table.num_rows
    with ray_session(ray_cfg) as ray:
        require_fit("score", actors, actor_num_cpus, actor_num_gpus, ray.cluster_resources(), ScoreJobError, custom=actor_resources)
        ds = ray.data.from_arrow([table.slice(i, batch_rows) for i in range(0, max(n, 1), batch_rows)])
        ds = ds.map_batches(
            _TruthActor,
            fn_constructor_kwargs={"llm": llm, "template": template},
            compute=ray.data.ActorPoolStrategy(size=actors),
            batch_size=batch_rows,
            batch_format="pyarrow",
            num_cpus=actor_num_cpus,
            num_gpus=actor_num_gpus or None,
            **({"resources": dict(actor_resources)} if actor_resources else {}),
        )
        parts, done = [], 0
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            parts.append(batch)
            done += batch.num_rows
            if echo:
                echo(f"{done}/{n} prompts scored")
    out = pa.concat_tables(parts) if parts else TRUTH_SCORES.empty_table()
    if out.column("prompt_id").to_pylist() != table.column("prompt_id").to_pylist():
        raise RuntimeError(f"score: {n} prompts in, {out.num_rows} scores out, or out of order")
    return out
