"""Start (or join) Ray with quiet logs and the settings measured on small machines."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager

from schemas.config import RayConfig


@contextmanager
def ray_session(config: RayConfig):
    """Join ``config.address`` or start a local cluster; reuse one already initialised.

    Only a cluster this call started is shut down on exit.
    """
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import warnings

    import ray

    # ray.init starts the GCS server and raylet with subprocess.Popen(preexec_fn=...), a
    # fork that execs at once (traced); lance's and lancedb's fork warnings are for forks
    # that keep running Python, which these do not.
    warnings.filterwarnings("ignore", message="lancedb fork support is experimental", category=RuntimeWarning)
    warnings.filterwarnings("ignore", message="lance is not fork-safe", category=UserWarning)
    started = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": True}
        if config.address:
            ray.init(address=config.address, **kwargs)
        else:
            ray.init(num_cpus=config.num_cpus, object_store_memory=config.object_store_memory, **kwargs)
        started = True
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.execution_options.preserve_order = True
    ctx.target_max_block_size = config.block_bytes
    try:
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
) -> None:
    """Raise ``error`` when an actor pool (plus ``reserve_cpus`` for the job's reader) exceeds the cluster.

    Ray Data would otherwise wait forever for resources that never free up.
    """
    cpus, gpus = resources.get("CPU", 0), resources.get("GPU", 0)
    need_cpu, need_gpu = actors * num_cpus + reserve_cpus, actors * num_gpus
    if need_cpu > cpus or need_gpu > gpus:
        extra = f" + {reserve_cpus} CPU for the reader" if reserve_cpus else ""
        raise error(
            f"{job}: {actors} actor(s) x ({num_cpus} CPU, {num_gpus} GPU){extra} need {need_cpu} CPU / {need_gpu} GPU; "
            f"the cluster has {cpus} / {gpus}. Lower --actors or the per-actor resources."
        )
