"""One LLM service per job: a Ray actor pool of vLLM engines, started once, shared by every
stage that needs the LLM (truth scoring, constrained and free generation).

Each actor holds an :class:`~logicrank.pipelines.llm.engine.LLMClient`: the persistent cache in front,
the engine behind it, started on the first cache miss. The service has the client's
``generate`` / ``truth`` interface, so stage code calls it as it would call one engine.
Requests are sorted by their rendered prompt before they are cut into batches, so prompts
that share a prefix (a document's atoms, one template's instructions) land in one engine
batch and vLLM's prefix cache keeps working; results come back in the caller's order, each
exactly once. An actor lost with its node is restarted by Ray where it fits (or replaced) and
its batches are sent again; results are deterministic, so a batch re-sent after a loss gives
what it would have given. Engines are spread over nodes.

Placement is spelled once, in :class:`logicrank.pipelines.config.settings.LLMConfig`: ``actors``,
``cpus_per_actor``, ``gpus_per_actor`` (default: the tensor-parallel size on a cluster with
GPUs, 0 without), ``resources``, ``batch_rows``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from logicrank.jobs.raysession import drop_kept, keep, kept_for, take_kept
from logicrank.jobs.watchdog import beat, cpu_seconds, working
from logicrank.pipelines.config.settings import LLMConfig
from logicrank.pipelines.llm.engine import (
    Constraint,
    EngineDied,
    Generation,
    LLMFailed,
    PromptTooLong,
    Truth,
    check_label_follows,
    describe,
    generate_within_window,
    over_window,
    prefix_batches,
    too_long_message,
)
from logicrank.pipelines.llm.prompts import Template
from logicrank.schemas.errors import UserError, first_line


class LLMServiceError(UserError, RuntimeError):
    """The engine pool cannot be placed on this cluster."""


class LLMEngineFailed(LLMFailed):
    """The pool cannot go on: its engines keep dying, or every engine actor was lost."""


def engine_threads(cpus_per_actor: float, node_cpus: float, engines_per_node: int, on_gpu: bool) -> int:
    """An engine actor's OpenMP threads when ``cpu_threads`` is not set. On a GPU: the CPUs Ray
    gave it (the model's work is on the GPU). On a CPU node: the node's CPUs shared among the
    pool's engines placed there, and never fewer than it was given, so no core idles while the
    LLM works (one engine with both cores on a 2-core machine; Ray's reservation stays
    ``cpus_per_actor``: other work on the node keeps its place, and the engine's threads sleep
    while they wait, ``cpu_binding: none``)."""
    if on_gpu:
        return max(1, int(cpus_per_actor))
    return max(1, int(cpus_per_actor), int(node_cpus // max(engines_per_node, 1)))


class _EngineActor:
    """One engine behind the cache (a Ray actor; heavy imports happen here, on the worker)."""

    def __init__(self, cfg: LLMConfig, engines_per_node: int = 1):
        from logicrank.pipelines.llm.engine import LocalLLM

        if cfg.cpu_threads is None:
            import ray

            node = ray.get_runtime_context().get_node_id()
            node_cpus = next((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["NodeID"] == node), cfg.cpus_per_actor)
            on_gpu = bool(ray.get_gpu_ids())  # (torch is not imported here: the engine sets its threads before it is)
            threads = engine_threads(cfg.cpus_per_actor, node_cpus, engines_per_node, on_gpu)
            cfg = cfg.model_copy(update={"cpu_threads": min(threads, max(len(os.sched_getaffinity(0)), int(cfg.cpus_per_actor), 1))})
        self.threads = cfg.cpu_threads
        self.llm = LocalLLM(cfg, dead=EngineDied, check_window=False)  # the service checks every prompt's length before sending it

    def ready(self) -> str:
        """This actor process's Ray worker id: a restarted actor answers with a new one."""
        import ray

        return ray.get_runtime_context().get_worker_id()

    def call(self, task: str, template: Template, values: list, kwargs: dict, cache: str | None, user: str) -> tuple[list, dict]:
        """The batch's results, answered from ``cache`` (the asking job's, ``user``: an actor
        kept between jobs serves each from its own), under the LLM failure contract (pipelines.llm.engine.LocalLLM):
        a dead engine raises :class:`EngineDied` (the pool restarts this actor and sends the
        batch again), a failed truth batch fails the job, a prompt that fails alone gets its
        exception in its slot. With them, what the batch added to the engine's counts (prompts
        run, cache hits, tokens; the engine, when this batch started it; the threads of the
        engine that ran its prompts, 0 when every one came from the cache): the pool counts the
        batches it keeps, so what an actor counted before its restart or loss is not lost with
        its process, and a job that took over a kept actor counts only its own work."""
        self.llm.client.use_cache(cache, user)
        before, loaded = dict(self.llm.client.stats), self.llm.client._engine is not None
        out = self.llm.truth(template, values) if task == "truth" else self.llm.generate(template, values, **kwargs)
        counts = {k: v - before.get(k, 0) for k, v in self.llm.client.stats.items()}  # (zeros kept: the manifest lists them)
        counts["engine_loaded"] = int(not loaded and self.llm.client._engine is not None)
        counts["engine_threads"] = self._engine_threads() if counts.get("engine_calls") else 0
        return out, counts

    def engine_alive(self) -> bool:
        """False once the engine started and its core has died since (asked from the "health"
        concurrency group, beside a call that may wait forever on the dead core)."""
        return self.llm.engine_alive()

    def requests_in_flight(self) -> int:
        """Requests its engine holds now (asked from the "health" group, beside a running call)."""
        return self.llm.requests_in_flight()

    def cpu_seconds(self) -> tuple[float, float]:
        """The CPU seconds of this actor's process and of the processes below it (its engine
        core, run apart), and when they were read (this node's monotonic clock), asked from
        the "health" group beside a running call: an engine at work on a long call (its start,
        a large model's first batch) is progress to the job's stall watchdog, and a paused or
        hung one is not."""
        return cpu_seconds(), time.monotonic()

    def _engine_threads(self) -> int:
        """The threads of the engine (loaded): torch's where the model runs in this process."""
        if self.llm.client.cfg.engine_process == "inline":
            import torch

            return torch.get_num_threads()
        return self.threads


@dataclass
class _Dispatch:
    """One call of the pool: its prompts cut into batches (``chunks``, prompt indices), the
    results in the caller's order, and where each batch is."""

    task: str
    template: Template
    values: Sequence[Mapping[str, str]]
    kwargs: dict
    label: str
    chunks: list[list[int]]
    results: list = field(init=False)
    pending: deque = field(init=False)  # batches to send, by index
    inflight: dict = field(default_factory=dict)  # result ref -> (batch index, actor)
    readiness: dict = field(default_factory=dict)  # ready() ref -> the actor coming up
    attempts: Counter = field(default_factory=Counter)  # batch index -> engines it lost
    done: int = 0
    lost_since: float | None = None  # when the last engine was lost, while none holds a batch

    def __post_init__(self):
        self.results = [None] * len(self.values)
        self.pending = deque(range(len(self.chunks)))


class LLMService:
    """Started on first use; :meth:`close` ends the actors and returns the counts for the manifest."""

    def __init__(self, cfg: LLMConfig, echo: Callable[[str], None] | None = None, replace_timeout_s: float = 600.0,
                 poll_s: float = 5.0):
        from logicrank.pipelines.llm.models import resolve

        self.resolved = resolve(cfg.model, log=echo or (lambda m: None))  # prepared once, on the driver
        # an engine actor's threads, unless set: decided on its node (engine_threads)
        self.cfg = cfg.model_copy(update={"model": str(self.resolved.path)})
        self.echo = echo
        self.replace_timeout_s = replace_timeout_s
        self.poll_s = poll_s  # how long the pool waits for a batch before it looks at its engines (dead? at work?)
        self._actors: list = []
        self._ready: dict = {}  # actor -> bool
        self._worker_ids: dict = {}  # actor -> the Ray worker id of its running instance
        self._killed: dict = {}  # actor -> the worker id of its instance killed to restart its engine
        self.actors_started = 0
        self.actors_lost = 0
        self.engine_restarts = 0  # engines that died inside a live actor, restarted with it
        self._pool_restarts = 0  # the same, in the running pool (its budget: max_engine_restarts x actors)
        self.last_engine_error: str | None = None
        self.pools = 0  # times the pool was started: 1 per job unless released to make room (see release)
        self._pool_first = 0
        self._totals: Counter = Counter()
        self._threads = 0  # the most threads an engine of this service ran
        self._cpu: dict = {}  # actor -> its last reading: (CPU seconds, when, on its node's clock)
        self._answered: set = set()  # the actors that answered a batch since they (re)started
        self._cpu_asked: dict = {}  # actor -> its cpu_seconds() call not answered yet
        self._running = False  # the pool started (_start) and not released since
        self._failed = False  # a call raised: its batches may still run on the engines, which are not handed to another job
        self._user = uuid.uuid4().hex  # this service's name to an actor kept between jobs (its cache is opened for it)
        self.actors_adopted = 0  # engine actors taken over from an earlier job's pool (jobs.raysession.keep_engines)

    @property
    def model_id(self) -> str:
        return self.resolved.model_id

    @property
    def engine_key(self) -> str:
        """What an engine actor is made of: the checkpoint (its id, made from its files, so a
        directory rewritten between two jobs is another model) and every LLMConfig field but the
        cache (named with each batch) and how the driver cuts and restarts its work. Equal
        keys: the same engines."""
        return self.model_id + " " + self.cfg.model_dump_json(exclude={"cache", "batch_rows", "shard_queries", "wave_shards",
                                                                                "max_engine_restarts"})

    # ------------------------------------------------------------------ the client interface
    def generate(
        self, template: Template, values: Sequence[Mapping[str, str]], constraint: Constraint | None = None,
        max_tokens: int = 256, temperature: float = 0.0, seed: int | None = None, label: str | None = None,
    ) -> list[Generation | Exception]:
        """One Generation per prompt; a prompt the engine fails on gets its exception in its
        slot instead (the caller records it), and the others are kept."""
        kwargs = {"constraint": constraint, "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
        return generate_within_window(str(self.resolved.path), self.model_id, self.cfg, template, values,
                                      lambda vs: self._map("generate", template, vs, kwargs, label), label)

    def truth(self, template: Template, values: Sequence[Mapping[str, str]], label: str | None = None,
              keys: Sequence[str] | None = None) -> list[Truth]:
        """P(True) per prompt; a prompt over the model's window stops the call in one line
        naming it (its key, where the caller gives ``keys``) before any prompt is sent."""
        check_label_follows(template, self.cfg.labels)
        if over := over_window(str(self.resolved.path), self.cfg, "truth", template, values):
            raise PromptTooLong(too_long_message(label or "llm", self.model_id, self.cfg, over, len(values), keys))
        return self._map("truth", template, values, {}, label)

    # ------------------------------------------------------------------ the pool
    def _gpus(self, ray) -> float:
        if self.cfg.gpus_per_actor is not None:
            return self.cfg.gpus_per_actor
        return float(self.cfg.tensor_parallel_size) if ray.cluster_resources().get("GPU", 0) else 0.0

    def _spawn(self, ray):
        # SPREAD: one engine per node where they fit (a lost node takes one engine, not the pool);
        # max_restarts: Ray restarts an actor whose node died wherever it fits; the batch it held
        # fails (no task retries) and is sent again (_batch_back)
        # a "health" concurrency group: engine_alive answers while a call holds the default group's one thread
        remote = ray.remote(concurrency_groups={"health": 1})(_EngineActor).options(
            num_cpus=self.cfg.cpus_per_actor, num_gpus=self._gpus(ray) or None, resources=dict(self.cfg.resources) or None,
            scheduling_strategy="SPREAD", max_restarts=-1, max_task_retries=0,
        )
        wanted = {"CPU": self.cfg.cpus_per_actor, **dict(self.cfg.resources)}  # the nodes an engine actor can be placed on
        nodes = sum(1 for n in ray.nodes() if n.get("Alive") and all(n["Resources"].get(k, 0) >= v for k, v in wanted.items())) or 1
        # (no cache of its own: each batch names its job's, so a restarted or kept actor never opens an earlier job's)
        actor = remote.remote(self.cfg.model_copy(update={"cache": None}), -(-self.cfg.actors // nodes))  # SPREAD: engines per node, at most
        self._actors.append(actor)
        self._ready[actor] = False
        self.actors_started += 1
        return actor

    def check_fit(self) -> None:
        """Raise :class:`LLMServiceError` now if the pool cannot be placed on this cluster."""
        import ray

        from logicrank.jobs.raysession import require_fit

        if not ray.is_initialized():
            raise RuntimeError("LLMService: start it inside the job's ray_session (a bug)")
        require_fit("llm", self.cfg.actors, self.cfg.cpus_per_actor, self._gpus(ray), ray.cluster_resources(), LLMServiceError,
                    custom=dict(self.cfg.resources))

    def _start(self):
        import ray

        if self._running:
            return ray
        self.check_fit()
        self.pools += 1
        self._pool_first = self.actors_started  # this pool's budget of engine deaths starts here
        self._pool_restarts = 0
        self._running = True
        # an earlier job's pool of the same engines on this cluster, kept (jobs.raysession.keep_engines): its actors are
        # this pool's, each asked `ready` before its first batch (one lost since is replaced as any other)
        for actor in take_kept(self.engine_key):
            self._actors.append(actor)
            self._ready[actor] = False
            self.actors_adopted += 1
        for _ in range(self.cfg.actors - len(self._actors)):
            self._spawn(ray)
        return ray

    def _map(self, task: str, template: Template, values: Sequence[Mapping[str, str]], kwargs: dict, label: str | None) -> list:
        """Every prompt's result, in the caller's order: batches sent to the ready engines (two
        each), results collected as they come, batches of a lost or dead engine sent again."""
        if len(values) == 0:
            return []
        ray = self._start()
        try:
            return self._dispatch(ray, task, template, values, kwargs, label)
        except BaseException:
            self._failed = True
            raise

    def _dispatch(self, ray, task: str, template: Template, values: Sequence[Mapping[str, str]], kwargs: dict, label: str | None) -> list:
        # at most batch_rows per call, and no fewer batches than engines: a small request keeps every engine busy (at the
        # price of splitting some shared prefixes between engines; with one engine nothing changes)
        size = min(self.cfg.batch_rows, -(-len(values) // max(len(self._actors), 1)))
        d = _Dispatch(task, template, values, kwargs, label or task, prefix_batches([template.render(**v) for v in values], size))
        d.readiness = {a.ready.remote(): a for a, ok in self._ready.items() if not ok}
        while d.pending or d.inflight:
            self._send(d)
            self._check_engines_left(d)
            ready, _ = ray.wait(list(d.inflight) + list(d.readiness), num_returns=1, timeout=self.poll_s)
            if not ready and self.cfg.engine_process == "separate":
                self._resend_from_dead_engines(ray, d)
            if not ready:
                self._beat_while_engines_work(ray, d)
            for ref in ready:
                if ref in d.readiness:
                    self._engine_ready(ray, d, ref)
                elif ref in d.inflight:  # (else a batch of an engine restarted meanwhile: already sent again)
                    self._batch_back(ray, d, ref)
        if any(r is None for r in d.results):
            raise RuntimeError("llm: a prompt has no result (a bug)")
        return d.results

    def _send(self, d: _Dispatch) -> None:
        """Queued batches to the ready engines, two per engine: one running, one queued."""
        busy = Counter(a for _, a in d.inflight.values())
        for actor in [a for a, ok in self._ready.items() if ok]:
            while d.pending and busy[actor] < 2:
                c = d.pending.popleft()
                ref = actor.call.remote(d.task, d.template, [dict(d.values[i]) for i in d.chunks[c]], d.kwargs, self.cfg.cache, self._user)
                d.inflight[ref] = (c, actor)
                busy[actor] += 1
                self._ask_cpu(actor)  # the reading its work is measured from (_beat_while_engines_work)

    def _check_engines_left(self, d: _Dispatch) -> None:
        """Fail when no engine holds a batch and none is coming up, or a replacement has not
        come up within ``replace_timeout_s``."""
        if d.inflight:
            return
        n = len(d.values)
        if not d.readiness:
            raise LLMEngineFailed(f"llm: every engine actor of {self.model_id} was lost and none could be restarted; {n - d.done} of {n} "
                                  "prompts unanswered. Rerun the job (cached prompts are not recomputed).")
        d.lost_since = d.lost_since or time.monotonic()  # waiting for a replacement engine to come up
        if time.monotonic() - d.lost_since > self.replace_timeout_s:
            raise LLMEngineFailed(f"llm: no engine actor of {self.model_id} could be placed for {self.replace_timeout_s:.0f} s after "
                                  "losing them all; check the cluster's nodes.")

    def _resend_from_dead_engines(self, ray, d: _Dispatch) -> None:
        """A batch still running: is its engine alive? vLLM's engine core (in its own process)
        can die under a call that then waits forever."""
        for actor in self._dead_engines({a for _, a in d.inflight.values()}):
            running = next(c for c, a in d.inflight.values() if a is actor)  # its first batch sent; the next one waits
            self._engine_died(EngineDied("EngineDeadError: the engine core process died during a batch"))
            self._send_again(d, actor, [running])
            self._restart(ray, actor, d.readiness)

    def _engine_ready(self, ray, d: _Dispatch, ref) -> None:
        """An engine actor answered ``ready`` (started, restarted or replaced), or could not."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        actor = d.readiness.pop(ref)
        try:
            worker = ray.get(ref)
        except ActorDiedError as exc:  # it cannot come back (e.g. its engine failed to start): a new one, a few times
            if self.actors_started - self._pool_first >= 3 * self.cfg.actors:
                cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                raise LLMEngineFailed(f"llm: engine actors of {self.model_id} keep dying ({self.actors_started} started); "
                                      f"last: {cause}") from exc
            self._replace(ray, actor, d.readiness)
            return
        except (RayActorError, ActorUnavailableError):  # restarting: ask again
            time.sleep(0.2)
            d.readiness[actor.ready.remote()] = actor
            return
        if worker == self._killed.get(actor):  # the instance killed to restart, answering before it went
            time.sleep(0.2)
            d.readiness[actor.ready.remote()] = actor
            return
        self._killed.pop(actor, None)
        self._worker_ids[actor] = worker
        self._ready[actor] = True
        d.lost_since = None
        beat(f"{d.label}: an engine actor is ready")

    def _batch_back(self, ray, d: _Dispatch, ref) -> None:
        """A batch's results, into the caller's slots; a batch whose engine or actor died is
        sent again (the engine restarted, the actor awaited)."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        c, actor = d.inflight[ref]
        try:
            out, counted = ray.get(ref)
        except (RayActorError, ActorDiedError, ActorUnavailableError, EngineDied) as exc:
            died = isinstance(exc, EngineDied)  # the engine, inside a live actor; else the actor itself
            if died:
                self._engine_died(exc)
            self._send_again(d, actor, [c], exc)
            if died:
                self._restart(ray, actor, d.readiness)
            else:
                self._lose(actor, d.readiness)
            return
        d.inflight.pop(ref)
        if len(out) != len(d.chunks[c]):
            raise RuntimeError(f"llm: {len(d.chunks[c])} prompts in, {len(out)} results out (a bug)")
        counted = dict(counted)
        self._threads = max(self._threads, counted.pop("engine_threads", 0))  # per engine, not summed over engines or pools
        self._totals.update(counted)
        for i, r in zip(d.chunks[c], out, strict=True):
            d.results[i] = r
        d.done += len(out)
        self._answered.add(actor)
        beat(f"{d.label}: {d.done}/{len(d.values)} prompts")
        if self.echo:
            self.echo(f"{d.label}: {d.done}/{len(d.values)} prompts {'scored' if d.task == 'truth' else 'generated'}")

    def _send_again(self, d: _Dispatch, actor, failed: list[int], exc: BaseException | None = None) -> None:
        """Every batch ``actor`` holds goes back to the front of the queue; a failed batch
        (``failed``) that lost its engine three times stops the job instead of looping."""
        for c in failed:
            d.attempts[c] += 1
            if d.attempts[c] >= 3:  # a batch that kills its engine each time
                raise LLMEngineFailed(f"llm: a batch of {len(d.chunks[c])} prompts lost its engine of {self.model_id} {d.attempts[c]} "
                                      f"times (e.g. a prompt that crashes the engine or exhausts its memory); last engine error: "
                                      f"{self.last_engine_error or describe(exc)}; first prompt: "
                                      f"{d.template.render(**d.values[d.chunks[c][0]])[:200]!r}")
        for ref, (c, a) in list(d.inflight.items()):
            if a is actor:
                d.inflight.pop(ref)
                d.pending.appendleft(c)

    def _dead_engines(self, actors) -> list:
        """Those of ``actors`` whose engine started and has died since; asked in the actors'
        health group, which answers while a call waits. An actor that does not answer (busy
        starting, lost) is left to the other checks."""
        import ray
        from ray.exceptions import RayError

        refs = {a.engine_alive.options(concurrency_group="health").remote(): a for a in actors}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=10.0)
        dead = []
        for ref in ready:
            try:
                if not ray.get(ref):
                    dead.append(refs[ref])
            except RayError:  # a lost actor: found when its batch fails
                continue
        return dead

    def _ask_cpu(self, actor) -> None:
        """Ask ``actor`` its CPU seconds (in its health group, beside a running call), unless
        a question is still unanswered."""
        if actor not in self._cpu_asked:
            self._cpu_asked[actor] = actor.cpu_seconds.options(concurrency_group="health").remote()

    def _beat_while_engines_work(self, ray, d: _Dispatch) -> None:
        """While no batch comes back, the stall watchdog hears from the engines that hold a
        batch and have answered none since they (re)started that they work: starting (a core's
        worth, importing and loading) and on their first batch. Each is asked its CPU seconds
        (when its batch is sent, and at each of these looks); one that used at least a quarter
        of a core between two answers two seconds or more apart (``working``) is at work. An
        engine that is paused, deadlocked or dead uses a few percent (its actor's Ray threads),
        or does not answer within a second: no beat, and the watchdog's timeout runs. Once an
        engine has answered a batch, only its answers are progress: a hang that spins (a GPU
        collective that never completes) uses CPU too, and would beat for ever."""
        from ray.exceptions import RayError

        holding = {a for _, a in d.inflight.values()}
        at_work = set()
        for _ in range(2):  # the answers waiting since the last look (or the send), then readings now
            for actor in holding:
                self._ask_cpu(actor)
            asked = {self._cpu_asked[a]: a for a in holding}
            answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=1.0) if asked else ([], [])
            for ref in answered:
                actor = asked.pop(ref)
                del self._cpu_asked[actor]
                try:
                    cpu, when = ray.get(ref)
                except RayError:  # lost or restarting: found by the other checks
                    self._cpu.pop(actor, None)
                    continue
                before = self._cpu.get(actor)
                if before is None or cpu < before[0]:  # the first reading, or a restarted process's
                    self._cpu[actor] = (cpu, when)
                elif when - before[1] >= 2.0:
                    self._cpu[actor] = (cpu, when)
                    if working(before[0], cpu, when - before[1], share=0.25) and actor not in self._answered:
                        at_work.add(actor)
            if not answered:
                break
        if at_work:
            beat(f"{d.label}: {len(at_work)} engine(s) at work, {d.done}/{len(d.values)} prompts answered")

    def _engine_died(self, exc: EngineDied) -> None:
        """Count an engine death; past ``max_engine_restarts`` per engine actor, fail the job."""
        cause = getattr(exc, "cause", None) or exc  # the actor's EngineDied, not Ray's wrapper with its traceback
        self.engine_restarts += 1
        self._pool_restarts += 1
        self.last_engine_error = first_line(cause)
        limit = self.cfg.max_engine_restarts * self.cfg.actors
        if self._pool_restarts > limit:
            raise LLMEngineFailed(f"llm: the engine of {self.model_id} keeps dying ({self._pool_restarts} deaths, more than "
                                  f"max_engine_restarts {self.cfg.max_engine_restarts} x {self.cfg.actors} actor(s)); last engine error: "
                                  f"{self.last_engine_error}")

    def _forget_work(self, actor) -> None:
        """An actor restarted or replaced: its CPU readings and first batch start again."""
        self._cpu.pop(actor, None)
        self._cpu_asked.pop(actor, None)
        self._answered.discard(actor)

    def _restart(self, ray, actor, readiness: dict) -> None:
        """An actor whose engine died: Ray restarts its process (a new engine), then it is used
        again; until the new instance answers (another worker id), it gets no batch."""
        self._forget_work(actor)
        self._ready[actor] = False
        self._killed[actor] = self._worker_ids.get(actor)
        ray.kill(actor, no_restart=False)
        readiness[actor.ready.remote()] = actor

    def _lose(self, actor, readiness: dict) -> None:
        """An actor's call failed with its process or node: use it again once Ray has restarted it."""
        self._forget_work(actor)
        if self._ready.get(actor):
            self._ready[actor] = False
            self.actors_lost += 1
            readiness[actor.ready.remote()] = actor

    def _replace(self, ray, actor, readiness: dict) -> None:
        """An actor that cannot be restarted: forget it and start a new one."""
        self._forget_work(actor)
        if actor in self._ready:
            del self._ready[actor]
            self._actors.remove(actor)
            new = self._spawn(ray)
            readiness[new.ready.remote()] = new

    def release(self) -> None:
        """End the actors now, keeping their counts; the next request starts a new pool. A pool
        kept for this job by an earlier one and not taken yet ends too (it holds what this
        job's other work needs)."""
        if not self._running:
            drop_kept(self.engine_key)
        if self._actors:
            import ray

            for actor in self._actors:
                ray.kill(actor)
            self._forget_pool()

    def _forget_pool(self) -> None:
        self._actors.clear()
        self._ready.clear()
        self._worker_ids.clear()
        self._killed.clear()
        self._cpu.clear()
        self._cpu_asked.clear()
        self._answered.clear()
        self._running = False

    def holds(self) -> dict[str, float]:
        """The resources the running pool holds, or the pool an earlier job kept for this one
        (nothing when neither runs)."""
        n = len(self._actors) or kept_for(self.engine_key)
        if not n:
            return {}
        import ray

        return {"CPU": n * self.cfg.cpus_per_actor, "GPU": n * self._gpus(ray)}

    def close(self) -> dict:
        """End the actors, or hand the ready ones to the next job inside ``keep_engines``
        (unless a call failed on them: its batches may still run there; one restarting ends);
        the counts for the manifest (pools, actors started, taken over from an earlier job and
        lost, engines this job loaded, cache use)."""
        ready = [a for a in self._actors if self._ready.get(a)]
        if ready and not self._failed and keep(self.engine_key, ready):
            import ray

            for actor in self._actors:
                if actor not in ready:
                    ray.kill(actor)
            self._forget_pool()
        elif self._actors:
            self.release()
        # every count the manifest lists, 0 where nothing was counted (a job answered from the cache ran no prompt)
        totals = Counter(self._totals)
        for k in ("engine_calls", "prompts_run", "cache_hits", "prompt_tokens", "cached_prompt_tokens", "generated_tokens"):
            totals.setdefault(k, 0)
        return {
            "model": self.model_id, "pools": self.pools, "actors_started": self.actors_started, "actors_adopted": self.actors_adopted,
            "actors_lost": self.actors_lost, "engine_restarts": self.engine_restarts, "last_engine_error": self.last_engine_error,
            "engines_loaded": totals.pop("engine_loaded", 0), "engine_threads": self._threads, **dict(totals),
        }
