"""Start (or join) Ray with quiet logs and the settings measured on small machines."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections import deque
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from logicrank.pipelines.config.settings import RayConfig
from logicrank.schemas.errors import JobFailed, UserError, first_line

VERBOSE_ENV = "LOGICRANK_VERBOSE"  # set by `logicrank --verbose`
_QUIET = {
    # Ray Data: console at ERROR (its INFO/WARNING lines stay in the session's ray-data.log)
    "RAY_DATA_LOGGING_CONFIG": str(Path(__file__).with_name("ray_data_quiet.yaml")),
    # vLLM's per-engine WARNING lines, in every actor the local cluster starts
    "VLLM_LOGGING_LEVEL": "ERROR",
    # torch's Python loggers ("Triton not available") and C++ warnings (NUMA binding) in the engines
    "TORCH_LOGS": "-torch",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    # progress bars drawn inside actors (vLLM's checkpoint loading); the job prints its own progress
    "TQDM_DISABLE": "1",
    # the raylet's disk warning, forwarded to the driver every 10 s while Ray's temp dir is over
    # 95% full (a CI machine with 9.6 GB free of 252 GB); it stays in the session's raylet.err.
    # Read when Ray is imported: the driver must set it first (ray_session does).
    "RAY_DEDUP_LOGS_SKIP_REGEX": r"file_system_monitor\.cc:\d+: .* is over [\d.]+% full",
}


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def quiet_logs() -> None:
    """Unless ``--verbose``: only the job's own progress and summary reach the terminal.

    Set before Ray starts, so the raylet and the workers it spawns inherit them; a variable
    the user set already wins. On a remote cluster, set them in the image or the RayJob."""
    if not verbose():
        for key, value in _QUIET.items():
            os.environ.setdefault(key, value)


# Lines Ray's C++ core writes straight to file descriptor 2, known to be noise for our jobs:
# Ray Data puts every actor-pool UDF in the object store itself, and the core worker then
# notes, at error level, that such an actor's restart needs that object (it is owned by the
# driver, which outlives the job's actors).
_NATIVE_NOISE = re.compile(rb"core_worker\.cc:\d+: Actor with class name: .* has constructor arguments in the object store")
_TERMINAL: list[int] = []  # the real stderr's descriptor of each open drop_native_noise, innermost last


def write_to_terminal(text: str) -> None:
    """Write ``text`` to the real stderr at once, past :func:`drop_native_noise`'s pipe where
    one is open: for a process about to end with ``os._exit``, which stops the pump thread
    before it forwards what was written to fd 2 (the stall watchdog's last line was lost so)."""
    _flush_stderr()
    _write_all(_TERMINAL[-1] if _TERMINAL else 2, text.encode(errors="replace"))


@contextmanager
def drop_native_noise():
    """While open, lines matching :data:`_NATIVE_NOISE` written to fd 2 are dropped; every
    other byte passes through unchanged, in order.

    A pump thread forwards the pipe to the real stderr as soon as a line is complete, writing
    every byte (waiting out a full pipe); the real stderr's descriptor is closed only after the
    pump has drained the pipe, so a child that inherited the pipe still reaches the terminal.
    A hard crash (abort) inside the block can lose its last native line here; Ray also writes
    every such line to the session's log files."""
    try:
        os.fstat(2)
    except OSError:  # no stderr at all: nothing to filter
        yield
        return
    if verbose():
        yield
        return
    _flush_stderr()
    original = os.dup(2)
    read_end, write_end = os.pipe()
    pipe = _identity(write_end)
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump():
        with os.fdopen(read_end, "rb", buffering=0) as src:
            pending = b""
            while chunk := src.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                _write_all(original, b"".join(line + b"\n" for line in lines if not _NATIVE_NOISE.search(line)))
            if pending and not _NATIVE_NOISE.search(pending):
                _write_all(original, pending)

    thread = threading.Thread(target=pump, daemon=True, name="stderr-filter")
    thread.start()
    _TERMINAL.append(original)
    try:
        yield
    finally:
        _TERMINAL.remove(original)
        _flush_stderr()
        # Put the real stderr back only if fd 2 is still our pipe: whoever replaced it since
        # (pytest's capture does, between tests) owns it now, and the pipe is closed already.
        if _identity(2) == pipe:
            os.dup2(original, 2)  # closes our write end: the pump drains the pipe and stops
        thread.join(timeout=5)
        if not thread.is_alive():  # a child still holding the pipe keeps the pump (and original) alive
            os.close(original)


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte (a pipe may take part of them, or none for now); on an error that
    waiting cannot fix, drop this chunk rather than stop forwarding the rest."""
    import select

    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
        except OSError:
            return


def _flush_stderr() -> None:
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class RayAuthError(UserError):
    """The cluster refused this client's authentication (it runs with token authentication);
    the message says which variables to set."""


class RayStartTimeout(JobFailed):
    """The local Ray cluster did not start in time (a loaded machine); the message says what to do."""


# What Ray 2.60 says when a cluster with token authentication refuses a client: ray.exceptions.AuthenticationError
# (RAY_AUTH_MODE=token here but no token), or gRPC's UNAUTHENTICATED status inside "Failed to connect to GCS"
# (this client sends no token or the wrong one: RAY_AUTH_MODE unset)
_AUTH = re.compile(r"unauthenticated|invalidauthtoken|authentication token|token authentication", re.IGNORECASE)
# What it says when a local start does not finish in time: node.py's 30 s wait for the raylet, services.py's
# waits for the node and a GCS that never answered
_START_TIMEOUT = re.compile(r"timed out during startup|timed out waiting for node|timed out after .* node to startup|failed to start gcs",
                            re.IGNORECASE)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during, outermost first."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def start_failure(exc: BaseException, address: str | None) -> Exception | None:
    """What ``ray.init`` raised, as one line with the fix, for the faults users hit: a cluster
    that refuses this client's authentication (:class:`RayAuthError`) and a local start that
    timed out (:class:`RayStartTimeout`); None for anything else (it keeps its traceback)."""
    from ray.exceptions import AuthenticationError

    chain = _chain(exc)
    auth = next((e for e in chain if isinstance(e, AuthenticationError)), None)
    said = next((line.strip() for e in chain for line in str(getattr(e, "message", e)).splitlines() if _AUTH.search(line)), None)
    if auth is not None or said is not None:
        cause = first_line(auth) if auth is not None and not said else said
        where = f"the Ray cluster at {address}" if address else "the Ray cluster"
        return RayAuthError(
            f"ray: {where} refused this client's authentication ({cause[:200]}): it runs with token authentication. Set "
            "RAY_AUTH_MODE=token and the cluster's token where this job runs (RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH naming a file "
            "holding it, or ~/.ray/auth_token; `ray get-auth-token` on the head node prints it), then rerun.")
    said = next((first_line(e) for e in chain if isinstance(e, TimeoutError) or _START_TIMEOUT.search(str(e))), None)
    if address is None and said is not None:
        return RayStartTimeout(
            f"ray: the local Ray cluster did not start in time ({said[:200]}): the machine is too busy for Ray to start its "
            "processes within its own wait. Rerun when the machine is less loaded, or start Ray once beforehand (ray start --head "
            "--num-cpus N) and pass --ray-address auto.")
    return None


# ---------------------------------------------------------------- engines kept between jobs
# Inside keep_engines(): [] or [(cluster, key, actors)], the one LLM pool a finished job left running.
_kept: list | None = None


def cluster_id() -> str | None:
    """This driver's Ray cluster and its connection to it (its node's id, new with each start of
    a node, and its job's: actors die with the job), or None when Ray is not initialised."""
    import ray

    if not ray.is_initialized():
        return None
    ctx = ray.get_runtime_context()
    return f"{ctx.gcs_address}/{ctx.get_node_id()}/{ctx.get_job_id()}"


@contextmanager
def keep_engines():
    """Within this block, in this process, a job's LLM pool outlives the job: the next job that
    asks the same Ray cluster for the same engines takes it over, its engines loaded (an
    engine's start takes seconds on a CPU, minutes for a large model on GPUs). What a
    job computes is unchanged: it answers from its own cache and counts its own work
    (jobs/llm_service.py). At most one pool is kept, and until a job takes it, it is the
    block's: it ends with the block, and when a job's Ray session starts for other engines or
    none (its CPUs and GPUs are that job's). An experiment runs its jobs in one block (its LLM
    judge takes its retrieve job's pool). Nested blocks are one."""
    global _kept
    if _kept is not None:
        yield
        return
    _kept = []
    try:
        yield
    finally:
        end_kept()
        _kept = None


def keep(key: str, actors: list) -> bool:
    """Hand ``actors`` (a closing job's pool of engines ``key``) to the next job that asks for
    them: True inside :func:`keep_engines` on a running cluster; False elsewhere (the caller
    ends them)."""
    cluster = cluster_id() if _kept is not None else None
    if cluster is None:
        return False
    end_kept()
    _kept.append((cluster, key, list(actors)))
    return True


def kept_for(key: str) -> int:
    """How many engine actors are kept for ``key`` on this cluster (they hold its resources)."""
    return len(_kept[0][2]) if _kept and _kept[0][:2] == (cluster_id(), key) else 0


def take_kept(key: str) -> list:
    """The actors kept for ``key`` on this cluster, now the caller's; a pool kept for other
    engines is ended (its resources are the caller's job's)."""
    if kept_for(key):
        return _kept.pop()[2]
    end_kept()
    return []


def drop_kept(key: str) -> None:
    """End the pool kept for ``key`` on this cluster, if one is (its job releases it untaken)."""
    if kept_for(key):
        end_kept()


def end_kept(unless: str | None = None) -> None:
    """End the kept pool, unless it is kept for ``unless`` on this cluster (a pool kept on a
    cluster this driver has left died with it)."""
    if not _kept or (unless is not None and kept_for(unless)):
        return
    cluster, _, actors = _kept.pop()
    if cluster == cluster_id():
        import ray

        for actor in actors:
            with suppress(Exception):  # (one already lost)
                ray.kill(actor)


# Tries of a local start before its time-out is the job's error: Ray waits a fixed 30 s for its raylet (node.py), which a
# loaded machine can miss once (an index run beside a test that kills engines, on a slow 2-core machine)
LOCAL_START_ATTEMPTS = 3


@contextmanager
def ray_session(config: RayConfig, llm: Any = None):
    """Join ``config.address`` or start a local cluster; reuse one already initialised.
    ``llm``: the job's LLM service (jobs/llm_service.py), which takes over the pool an earlier
    job kept for the same engines (:func:`keep_engines`); any other kept pool ends here.

    Only a cluster this call started is shut down on exit. A cluster that refuses this
    client's authentication, and a local start that times out ``LOCAL_START_ATTEMPTS`` times
    (each time let go and started again), are one line with the fix (:func:`start_failure`).
    """
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    quiet_logs()
    import warnings

    import ray

    # ray.init starts the GCS server and raylet with subprocess.Popen(preexec_fn=...), a
    # fork that execs at once (traced); lance's and lancedb's fork warnings are for forks
    # that keep running Python, which these do not.
    warnings.filterwarnings("ignore", message="lancedb fork support is experimental", category=RuntimeWarning)
    warnings.filterwarnings("ignore", message="lance is not fork-safe", category=UserWarning)
    started = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "logging_level": logging.INFO if verbose() else logging.ERROR, "log_to_driver": True}
        for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
            try:
                if config.address:
                    ray.init(address=config.address, **kwargs)
                else:
                    ray.init(num_cpus=config.num_cpus, object_store_memory=config.object_store_memory, **kwargs)
                break
            except Exception as exc:
                failure = start_failure(exc, config.address)
                if failure is None:
                    raise
                with suppress(Exception):  # what a half-made start left (processes, the driver's state)
                    ray.shutdown()
                if not isinstance(failure, RayStartTimeout) or attempt == LOCAL_START_ATTEMPTS:
                    raise failure from None
                print(f"ray: the local Ray cluster did not start within Ray's own wait (try {attempt} of {LOCAL_START_ATTEMPTS}); "
                      "starting it again", file=sys.stderr, flush=True)
        started = True
    end_kept(unless=llm.engine_key if llm is not None else None)  # a pool kept for other engines: its CPUs and GPUs are this job's
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.execution_options.preserve_order = True
    ctx.target_max_block_size = config.block_bytes
    try:
        with drop_native_noise():
            yield ray
    finally:
        if started:
            ray.shutdown()


def require_fit(
    job: str,
    actors: int,
    num_cpus: float,
    num_gpus: float,
    resources: dict,
    error: type[Exception],
    reserve_cpus: float = 0.0,
    custom: dict[str, float] | None = None,
) -> None:
    """Raise ``error`` when an actor pool (plus ``reserve_cpus`` for the job's reader) exceeds the cluster.

    ``custom``: the custom Ray resources each actor also needs. Ray Data would otherwise
    wait forever for resources that never free up.
    """
    for name, amount in (custom or {}).items():
        if actors * amount > resources.get(name, 0):
            raise error(
                f"{job}: {actors} actor(s) x {amount} {name!r} need {actors * amount} {name!r}; the cluster has "
                f"{resources.get(name, 0)}. Lower --actors or add nodes that offer {name!r}."
            )
    cpus, gpus = resources.get("CPU", 0), resources.get("GPU", 0)
    need_cpu, need_gpu = actors * num_cpus + reserve_cpus, actors * num_gpus
    if need_cpu > cpus or need_gpu > gpus:
        extra = f" + {reserve_cpus} CPU for the reader" if reserve_cpus else ""
        raise error(
            f"{job}: {actors} actor(s) x ({num_cpus} CPU, {num_gpus} GPU){extra} need {need_cpu} CPU / {need_gpu} GPU; "
            f"the cluster has {cpus} / {gpus}. Lower --actors or the per-actor resources."
        )


def local_driver_node(config: RayConfig) -> str | None:
    """The id of the node this driver runs on, where work may run in the driver instead of a
    pool: only on a cluster no address was given for (one this process started, or joined
    already initialised in process), never through Ray Client (whose node id is the remote
    head's). A cluster joined by address is shared: its work goes to pools that reserve CPUs."""
    import ray

    if config.address is not None or ray.util.client.ray.is_connected():
        return None
    return ray.get_runtime_context().get_node_id()


RESULT_BLOCKS_IN_FLIGHT = 32  # output blocks a Ray Data task or actor may have unread before it is paused


def unread_blocks_allowed(ds, blocks: int = RESULT_BLOCKS_IN_FLIGHT):
    """``ds`` with each of its tasks and actors allowed ``blocks`` output blocks unread before
    Ray Data pauses it (its default, 2, pauses a retrieval actor on every batch of results,
    each several blocks: 30,000 queries over 10k documents take 14.3 s on one actor, 7.8 s
    with 32). Set on this dataset's own context, not the process's. A Ray without the
    setting (a private one) leaves ``ds`` as it is."""
    if hasattr(ds.context, "_max_num_blocks_in_streaming_gen_buffer"):
        ds.context._max_num_blocks_in_streaming_gen_buffer = blocks
    return ds


class RayTasks:
    """A ``run(step, [args, ...])`` for work cut into independent tasks (the BM25 index's
    segments, pipelines/engines/bm25/segments.py): each call of ``step`` a Ray task of
    ``num_cpus`` CPUs, at most ``at_once`` running, the results in the arguments' order. A task
    whose worker or node dies is run again by Ray (a step writes the same files from the same
    inputs, so a rerun is harmless); when one fails, those still running are cancelled and
    awaited before the error is raised. Spread over the nodes: a node holds as few segments at
    once as the cluster allows. ``nodes``: the node ids the tasks ran on, for the manifest."""

    def __init__(self, ray, at_once: int, num_cpus: float = 1.0):
        self.ray, self.at_once, self.nodes = ray, max(1, at_once), set()
        self._task = ray.remote(num_cpus=num_cpus, max_retries=3, scheduling_strategy="SPREAD")(_on_node)  # a segment per node, where they fit

    def __call__(self, step, args) -> list:
        ray, results, pending = self.ray, [None] * len(args), {}
        queue = deque(enumerate(args))
        try:
            while queue or pending:
                while queue and len(pending) < self.at_once:
                    i, a = queue.popleft()
                    pending[self._task.remote(step, *a)] = i
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    # out of pending before its result is read: a task that failed has finished, and is not cancelled
                    # below (Ray's force-cancel of a finished task can abort the driver: "Tried to complete task that
                    # was not pending", once in the suite)
                    i = pending.pop(ref)
                    node, results[i] = ray.get(ref)
                    self.nodes.add(node)
        except BaseException:
            # only the tasks still running are cancelled (those that finished meanwhile are left, as the one that failed)
            running = ray.wait(list(pending), num_returns=len(pending), timeout=0, fetch_local=False)[1] if pending else []
            for ref in running:  # force: their workers killed (a polite cancel is a KeyboardInterrupt, which a worker whose
                ray.cancel(ref, force=True)  # earlier task installed its own SIGINT handler never raises); a step is rerun whole
            if running:
                ray.wait(running, num_returns=len(running), fetch_local=False)
            raise
        return results


def _on_node(step, *args):
    """A task of :class:`RayTasks`: the step's result, with the node it ran on."""
    import ray

    return ray.get_runtime_context().get_node_id(), step(*args)
