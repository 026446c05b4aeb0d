"""One LLM service per job: a Ray actor pool of vLLM engines, started once, shared by every
stage that needs the LLM (truth scoring, constrained and free generation).

Each actor holds an :class:`~pipelines.llm.engine.LLMClient`: the persistent cache in front,
the engine behind it, started on the first cache miss. The service has the client's
``generate`` / ``truth`` interface, so stage code calls it as it would call one engine.
Requests are sorted by their rendered prompt before they are cut into batches, so prompts
that share a prefix (a document's atoms, one template's instructions) land in one engine
batch and vLLM's prefix cache keeps working; results come back in the caller's order, each
exactly once. An actor lost with its node is restarted by Ray where it fits (or replaced) and
its batches are sent again; results are deterministic, so a batch re-sent after a loss gives
what it would have given. Engines are spread over nodes.

Placement is spelled once, in :class:`schemas.config.LLMConfig`: ``actors``,
``cpus_per_actor``, ``gpus_per_actor`` (default: the tensor-parallel size on a cluster with
GPUs, 0 without), ``resources``, ``batch_rows``.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence

from pipelines.errors import UserError
from pipelines.llm.engine import Constraint, Generation, Truth
from pipelines.llm.prompts import Template
from schemas.config import LLMConfig


def prefix_batches(prompts: Sequence[str], size: int) -> list[list[int]]:
    """Prompt indices cut into batches of at most ``size``, in the order of the prompts' text:
    prompts that share a prefix (one document's statements, one template's instructions) sit
    side by side, so one engine batch holds them and vLLM's prefix cache reuses their blocks."""
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    return [order[i : i + size] for i in range(0, len(order), size)]


def truth_table(prompt_ids, results: Sequence[Truth]):
    """TRUTH_SCORES rows: each prompt's id beside its truth result."""
    import pyarrow as pa

    from schemas.tables import TRUTH_SCORES

    cols = {f: [getattr(r, f) for r in results] for f in TRUTH_SCORES.names if f != "prompt_id"}
    return pa.table({"prompt_id": prompt_ids, **cols}, schema=TRUTH_SCORES)


class LLMServiceError(UserError, RuntimeError):
    """The engine pool cannot be placed on this cluster, or every engine was lost."""


class _EngineActor:
    """One engine behind the cache (a Ray actor; heavy imports happen here, on the worker)."""

    def __init__(self, cfg: LLMConfig):
        from pipelines.llm.engine import LLMClient

        self.client = LLMClient(cfg)

    def ready(self) -> bool:
        return True

    def call(self, task: str, template: Template, values: list, kwargs: dict) -> list:
        if task == "truth":  # a batch the engine cannot score fails the job: scores are never guessed
            return self.client.truth(template, values)
        try:
            return self.client.generate(template, values, **kwargs)
        except Exception:  # noqa: BLE001 - one prompt at a time: a bad prompt fails alone, as an exception in its slot
            out: list = []
            for v in values:
                try:
                    out += self.client.generate(template, [v], **kwargs)
                except Exception as exc:  # noqa: BLE001
                    out.append(RuntimeError(f"{type(exc).__name__}: {exc}"))
            return out

    def stats(self) -> dict:
        return {**self.client.stats, "engine_loaded": int(self.client._engine is not None)}


class LLMService:
    """Started on first use; :meth:`close` ends the actors and returns the counts for the manifest."""

    def __init__(self, cfg: LLMConfig, echo: Callable[[str], None] | None = None, replace_timeout_s: float = 600.0):
        from pipelines.llm.models import resolve

        self.resolved = resolve(cfg.model, log=echo or (lambda m: None))  # prepared once, on the driver
        self.cfg = cfg.model_copy(update={"model": str(self.resolved.path)})
        self.echo = echo
        self.replace_timeout_s = replace_timeout_s
        self._actors: list = []
        self._ready: dict = {}  # actor -> bool
        self.actors_started = 0
        self.actors_lost = 0
        self.pools = 0  # times the pool was started: 1 per job unless released to make room (see release)
        self._pool_first = 0
        self._totals: Counter = Counter()

    @property
    def model_id(self) -> str:
        return self.resolved.model_id

    # ------------------------------------------------------------------ the client interface
    def generate(
        self, template: Template, values: Sequence[Mapping[str, str]], constraint: Constraint | None = None,
        max_tokens: int = 256, temperature: float = 0.0, seed: int | None = None, label: str | None = None,
    ) -> list[Generation | Exception]:
        """One Generation per prompt; a prompt the engine fails on gets its exception in its
        slot instead (the caller records it), and the others are kept."""
        kwargs = {"constraint": constraint, "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
        return self._map("generate", template, values, kwargs, label)

    def truth(self, template: Template, values: Sequence[Mapping[str, str]], label: str | None = None) -> list[Truth]:
        return self._map("truth", template, values, {}, label)

    # ------------------------------------------------------------------ the pool
    def _gpus(self, ray) -> float:
        if self.cfg.gpus_per_actor is not None:
            return self.cfg.gpus_per_actor
        return float(self.cfg.tensor_parallel_size) if ray.cluster_resources().get("GPU", 0) else 0.0

    def _spawn(self, ray):
        # SPREAD: one engine per node where they fit (a lost node takes one engine, not the pool);
        # max_restarts: Ray restarts an actor whose node died wherever it fits; the batch it held
        # fails (no task retries) and is sent again by _map
        remote = ray.remote(_EngineActor).options(
            num_cpus=self.cfg.cpus_per_actor, num_gpus=self._gpus(ray) or None, resources=dict(self.cfg.resources) or None,
            scheduling_strategy="SPREAD", max_restarts=-1, max_task_retries=0,
        )
        actor = remote.remote(self.cfg)
        self._actors.append(actor)
        self._ready[actor] = False
        self.actors_started += 1
        return actor

    def check_fit(self) -> None:
        """Raise :class:`LLMServiceError` now if the pool cannot be placed on this cluster."""
        import ray

        from jobs.raysession import require_fit

        if not ray.is_initialized():
            raise RuntimeError("LLMService: start it inside the job's ray_session (a bug)")
        require_fit("llm", self.cfg.actors, self.cfg.cpus_per_actor, self._gpus(ray), ray.cluster_resources(), LLMServiceError,
                    custom=dict(self.cfg.resources))

    def _start(self):
        import ray

        if self._actors:
            return ray
        self.check_fit()
        self.pools += 1
        self._pool_first = self.actors_started  # this pool's budget of engine deaths starts here
        for _ in range(self.cfg.actors):
            self._spawn(ray)
        return ray

    def _map(self, task: str, template: Template, values: Sequence[Mapping[str, str]], kwargs: dict, label: str | None) -> list:
        n = len(values)
        if n == 0:
            return []
        ray = self._start()
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        # at most batch_rows per call, and no fewer batches than engines: a small request keeps every engine busy (at the
        # price of splitting some shared prefixes between engines; with one engine nothing changes)
        chunks = prefix_batches([template.render(**v) for v in values], min(self.cfg.batch_rows, -(-n // max(len(self._actors), 1))))
        results: list = [None] * n
        pending = deque(range(len(chunks)))
        attempts = Counter()
        inflight: dict = {}  # result ref -> (chunk index, actor)
        readiness = {a.ready.remote(): a for a, ok in self._ready.items() if not ok}
        done, lost_since = 0, None
        while pending or inflight:
            busy = Counter(a for _, a in inflight.values())
            for actor in [a for a, ok in self._ready.items() if ok]:
                while pending and busy[actor] < 2:  # two batches per engine: one running, one queued
                    c = pending.popleft()
                    ref = actor.call.remote(task, template, [dict(values[i]) for i in chunks[c]], kwargs)
                    inflight[ref] = (c, actor)
                    busy[actor] += 1
            if not inflight and not readiness:
                raise LLMServiceError(f"llm: every engine actor was lost and none could be restarted; {n - done} of {n} prompts unscored. Rerun the job (cached prompts are not recomputed).")
            if not inflight:  # waiting for a replacement engine to come up
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > self.replace_timeout_s:
                    raise LLMServiceError(f"llm: no engine actor could be placed for {self.replace_timeout_s:.0f} s after losing them all; check the cluster's nodes.")
            ready, _ = ray.wait(list(inflight) + list(readiness), num_returns=1, timeout=5.0)
            for ref in ready:
                if ref in readiness:
                    actor = readiness.pop(ref)
                    try:
                        ray.get(ref)
                        self._ready[actor] = True
                        lost_since = None
                    except ActorDiedError as exc:  # it cannot come back (e.g. its engine failed to start): a new one, a few times
                        if self.actors_started - self._pool_first >= 3 * self.cfg.actors:
                            cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                            raise LLMServiceError(f"llm: engine actors keep dying ({self.actors_started} started); last: {cause}") from exc
                        self._replace(ray, actor, readiness)
                    except (RayActorError, ActorUnavailableError):  # restarting: ask again
                        readiness[actor.ready.remote()] = actor
                    continue
                c, actor = inflight.pop(ref)
                try:
                    out = ray.get(ref)
                except (RayActorError, ActorDiedError, ActorUnavailableError):
                    attempts[c] += 1
                    if attempts[c] >= 3:  # a batch that kills its engine each time: stop, rather than loop
                        raise LLMServiceError(f"llm: a batch of {len(chunks[c])} prompts lost its engine {attempts[c]} times "
                                              f"(e.g. a prompt that crashes the engine or exhausts its memory); first prompt: "
                                              f"{template.render(**values[chunks[c][0]])[:200]!r}") from None
                    pending.appendleft(c)  # sent again to another engine
                    for other, (c2, a2) in list(inflight.items()):
                        if a2 is actor:
                            inflight.pop(other)
                            pending.appendleft(c2)
                    self._lose(actor, readiness)
                    continue
                if len(out) != len(chunks[c]):
                    raise RuntimeError(f"llm: {len(chunks[c])} prompts in, {len(out)} results out (a bug)")
                for i, r in zip(chunks[c], out, strict=True):
                    results[i] = r
                done += len(out)
                if self.echo:
                    self.echo(f"{label or task}: {done}/{n} prompts {'scored' if task == 'truth' else 'generated'}")
        if any(r is None for r in results):
            raise RuntimeError("llm: a prompt has no result (a bug)")
        return results

    def _lose(self, actor, readiness: dict) -> None:
        """An actor's call failed with its process or node: use it again once Ray has restarted it."""
        if self._ready.get(actor):
            self._ready[actor] = False
            self.actors_lost += 1
            readiness[actor.ready.remote()] = actor

    def _replace(self, ray, actor, readiness: dict) -> None:
        """An actor that cannot be restarted: forget it and start a new one."""
        if actor in self._ready:
            del self._ready[actor]
            self._actors.remove(actor)
            new = self._spawn(ray)
            readiness[new.ready.remote()] = new

    def release(self) -> None:
        """End the actors now, keeping their counts; the next request starts a new pool."""
        if self._actors:
            import ray

            for actor, ok in list(self._ready.items()):
                if ok:
                    with contextlib.suppress(Exception):  # a lost actor's counts are lost with it
                        self._totals.update(ray.get(actor.stats.remote(), timeout=60))
                ray.kill(actor)
            self._actors.clear()
            self._ready.clear()

    def holds(self) -> dict[str, float]:
        """The resources the running pool holds (nothing when it is not running)."""
        if not self._actors:
            return {}
        import ray

        return {"CPU": len(self._actors) * self.cfg.cpus_per_actor, "GPU": len(self._actors) * self._gpus(ray)}

    def close(self) -> dict:
        """End the actors; the counts for the manifest (pools, actors started and lost,
        engines loaded, cache use)."""
        self.release()
        totals = Counter(self._totals)
        return {
            "model": self.model_id, "pools": self.pools, "actors_started": self.actors_started,
            "actors_lost": self.actors_lost, "engines_loaded": totals.pop("engine_loaded", 0), **dict(totals),
        }
