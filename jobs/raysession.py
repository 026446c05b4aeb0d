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

    # Ray starts its processes with fork+exec; lancedb's warning about fork is for forks
    # that keep running Python, which these do not.
    warnings.filterwarnings("ignore", message="lancedb fork support is experimental", category=RuntimeWarning)
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
