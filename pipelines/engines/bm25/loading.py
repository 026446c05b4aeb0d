"""Which of the engine's loops runs, loaded on first use: numba loads only in a process that
builds an index (or searches where the compiled search loop is unavailable).

:func:`kernels` hands out the loops as one object: its ``top_k`` is the search loop compiled
ahead of time (compiled.py; numba's JIT loop where it cannot be built), every other name the
JIT kernel of kernels.py. :func:`preload_kernels` loads the search loop in a background thread.
The function :func:`kernels` is not re-exported by the package (whose ``kernels`` is the
module kernels.py): callers name it ``loading.kernels()``.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import scipy.sparse as sp


class _Kernels:
    """The engine's compiled loops: the search loop ``top_k`` compiled ahead of time once per
    machine and loaded without numba (compiled.py; numba's JIT loop where it cannot be built),
    the index-building loops from numba's JIT and its on-disk cache (kernels.py), imported on
    first use."""

    @staticmethod
    def top_k(*args):
        from logicrank.pipelines.engines.bm25 import compiled

        return compiled.top_k(*args)

    def __getattr__(self, name: str):
        from logicrank.pipelines.engines.bm25 import kernels as jit_kernels

        return getattr(jit_kernels, name)


_KERNELS = _Kernels()


def kernels() -> _Kernels:
    """The engine's loops (:class:`_Kernels`), each imported on first use."""
    return _KERNELS


_preloading: set[str] = set()
_preload_lock = threading.Lock()


def preload_kernels(index=None) -> None:
    """Load the search loop in a background thread, once per process: the compiled module
    (under a millisecond; built first where this machine has none, about 12 s, once), or,
    where it is unavailable, numba's start-up and its cache load (about 0.5 s here), which then
    overlap what the process does before its first search (the retrieve job: Ray's start; a
    shard actor: its creation) instead of adding to it. With ``index`` (a mapped index,
    :class:`~logicrank.pipelines.engines.bm25.mapped.MappedBM25`, as the job's stages and shard actors
    open), the JIT loop for its argument types too. A search that comes first waits on the same
    locks; an error here is raised again, whole, by that search."""
    key = "numba" if index is None else "mapped"
    with _preload_lock:
        if key in _preloading:
            return
        _preloading.add(key)
    threading.Thread(target=_load_kernels, args=(index,), name="bm25-kernels", daemon=True).start()


def _load_kernels(index) -> None:
    with contextlib.suppress(Exception):
        from logicrank.pipelines.engines.bm25 import compiled

        if compiled.compiled_top_k() is not None:
            return  # loaded (built first, once per machine): this process needs no numba to search
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target

        from logicrank.pipelines.engines.bm25 import kernels as jit_kernels  # noqa: F401 (numba's JIT loop: its start-up, then its cache)

        with global_compiler_lock:  # as numba's own compiles do: a search's compile in the other thread waits, never sees them half loaded
            cpu_target.typing_context.refresh()  # the registries numba loads before its first call or cache load
            cpu_target.target_context.refresh()
        if index is not None:  # no queries (as wide as its terms): the types dispatched, the code loaded from the cache, nothing searched
            terms = index.segments()[0].shape[1] - 1
            index.search_keys(sp.csr_matrix((np.ones(0, np.float32), np.zeros(0, np.int32), np.zeros(1, np.int64)), shape=(0, terms)), 1)
