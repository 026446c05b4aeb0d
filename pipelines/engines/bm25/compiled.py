"""The BM25 search loop compiled ahead of time, once per machine, loaded without numba.

numba's on-disk cache (kernels.py) spares every process but the first the
compile; it cannot spare them numba's own start (importing numba and loading its typing and
lowering registries before it can load a cached kernel: about 0.4 s here), which made a fresh
process's first search 4.7x its second on SciFact's 3,000 queries. The same loop,
``kernels.top_k``, compiled ahead of time by numba's ``pycc`` into an extension module
loads in under a millisecond and needs no numba at run time: a process that only searches (a
notebook, the job's driver, each shard actor) never imports it.

The module lives under ``<cache root>/bm25-compiled/<key>/`` (pipelines/paths.py). The key
names the loop's source, this file's, the versions of numba, llvmlite, numpy and Python, and
the CPU (model and feature flags: the code is built for the host CPU, as numba's JIT builds it), so a change of any of
them builds again, and nodes with different CPUs that share one cache directory each build
their own. The first process that needs the loop and finds no module builds it (about 12 s on
2 cores) in a child process, under a file lock: concurrent processes (shard actors starting
together) wait for that one build. Where it cannot be built (pycc compiles a small C wrapper:
no C compiler or no Python headers), the failure is recorded beside the key (``failed.txt``,
removed to try again), logged once, and every process uses numba's JIT loop as before; a
build that was interrupted or killed is not recorded (a later process builds it). ``LOGICRANK_BM25_COMPILED=0`` uses the JIT
loop always.

The compiled function accepts exactly the argument types of its signature and would read
wrong memory if handed others, so :func:`top_k` converts the small arrays (the queries', the
scratch) and sends an index whose arrays are of other types (which would have to be copied),
or unaligned or read-only scratch, to the JIT loop: the results are the same either way
(``tests/unit/test_bm25_search_loop.py``). Unlike the JIT loop (``nogil``), the compiled call
holds the interpreter lock while it runs: one call searches one batch of queries (1,024 in
the jobs: about 9 s at 10M documents on one core), during which the process's other Python
threads wait; the engine never searches from several threads of one process (shards are
processes).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import numpy as np

from logicrank.pipelines.paths import cache_root

ENV = "LOGICRANK_BM25_COMPILED"
MODULE_NAME = "logicrank_bm25_top_k"  # the extension module's name (its PyInit_ symbol)
_KERNELS_SOURCE = Path(__file__).with_name("kernels.py")
log = logging.getLogger(__name__)

# kernels.top_k's arguments as compiled: (dtype, ndim, read-only) per array, None for an int64 scalar.
_ARGS = (
    (np.int64, 1, False), (np.int32, 1, False), (np.float32, 1, False),  # the queries: indptr, term ids, counts (converted)
    (np.int64, 2, True), (np.int32, 1, True), (np.float32, 1, True),  # the index's segmented postings (checked, never copied)
    None,  # rows per segment
    (np.int64, 1, True),  # tiebreak ranks (checked)
    None,  # k
    (np.float32, 1, False), (np.int64, 1, False),  # scratch: accumulator, candidates (converted)
    None, None,  # lo, hi
)
_CONVERTED = {0, 1, 2, 9, 10}  # small arrays, made of the compiled types when they are not

_BUILD_TIMEOUT_S = 1800  # about 12 s here; a compiler that hangs must not hold every process at the lock
_lock = threading.Lock()
loaded: dict[str, object] = {}  # the compiled functions this process loaded, by name (``top_k``; None: unavailable)


def key() -> str:
    """What the compiled module depends on: sources, numba, Python and the CPU."""
    h = hashlib.sha256()
    h.update(_KERNELS_SOURCE.read_bytes())
    h.update(Path(__file__).read_bytes())
    for package in ("numba", "llvmlite", "numpy"):  # the module is built against numpy's C API: another numpy, another build
        h.update(f"{package}={importlib.metadata.version(package)};".encode())
    h.update(sys.version.encode() + platform.machine().encode())
    h.update(_cpu().encode())
    return h.hexdigest()[:20]


def _cpu() -> str:
    """The CPU's model and feature flags (Linux), else what the platform says."""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
        wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")
        seen = {}
        for line in lines:
            name, _, value = line.partition(":")
            name = name.strip()
            if name in wanted and name not in seen:
                seen[name] = " ".join(value.split())
        if seen:
            return repr(sorted(seen.items()))
    return platform.processor() or platform.machine()


def directory() -> Path:
    return cache_root() / "bm25-compiled" / key()


def _module_path(where: Path) -> Path:
    return where / f"{MODULE_NAME}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def compiled_top_k():
    """The compiled ``top_k``: loaded, or built first (once per machine, under a lock); None
    where it is turned off or cannot be built (the JIT loop then serves)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    with _lock:
        if "top_k" not in loaded:
            loaded["top_k"] = _load_or_build()
        return loaded["top_k"]


def _load_or_build():
    try:
        where = directory()
        path, failed = _module_path(where), where / "failed.txt"
        if not path.is_file() and not failed.is_file():
            where.parent.mkdir(parents=True, exist_ok=True)
            import fcntl

            with open(where.parent / f"{where.name}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one build per machine; the others wait for it
                if not path.is_file() and not failed.is_file():
                    _build_into(where)
        if failed.is_file():
            log.info("bm25: the search loop could not be compiled on this machine (%s; remove it to try again); numba's JIT loop serves", failed)
            return None
        if not path.is_file():  # the build was interrupted or timed out (said when it happened): this process uses the JIT loop
            return None
        spec = importlib.util.spec_from_file_location(MODULE_NAME, path, loader=importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(path)))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.top_k
    except Exception as exc:  # noqa: BLE001 (an unreadable cache, an unloadable module: the JIT loop serves)
        log.warning("bm25: the compiled search loop is unavailable (%s); numba's JIT loop serves", exc)
        return None


def _build_into(where: Path) -> None:
    """Build the module in a child process (a fresh interpreter: pycc's compile and numba's
    state stay out of this one) into a temporary directory, then move it into place; a failure
    is recorded in ``failed.txt`` so that no later process tries again."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{where.name}-", dir=where.parent))
    try:
        path = os.pathsep.join([*sys.path, os.environ.get("PYTHONPATH", "")]).strip(os.pathsep)  # this process's imports (a notebook's, Ray's)
        try:
            done = subprocess.run([sys.executable, "-m", "logicrank.pipelines.engines.bm25.compiled", str(tmp)], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}, timeout=_BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("bm25: compiling the search loop took over %d s; numba's JIT loop serves this process", _BUILD_TIMEOUT_S)
            return
        built = _module_path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        if done.returncode == 0 and built.is_file():
            os.replace(built, _module_path(where))
        elif done.returncode > 0 and "KeyboardInterrupt" not in done.stderr:  # a compile that failed: recorded, not retried by every process
            reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            (where / "failed.txt").write_text(f"{reason}\n\n{done.stderr[-5000:]}")
            log.warning("bm25: could not compile the search loop ahead of time (%s); numba's JIT loop serves (details in %s; "
                        "remove it to try again)", reason, where / "failed.txt")
        else:  # interrupted or killed (Ctrl-C, the OOM killer): nothing recorded, a later process builds it
            log.warning("bm25: compiling the search loop was interrupted (exit %s); numba's JIT loop serves this process", done.returncode)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def top_k(q_indptr, q_indices, q_data, w_indptr, w_indices, w_data, seg_rows, tiebreak, k, acc, cand, lo, hi):
    """``kernels.top_k``, compiled where it can be (module doc), with its arguments made
    of the compiled types; an index of other types goes to the JIT loop instead of being copied."""
    fn = compiled_top_k()
    args = [q_indptr, q_indices, q_data, w_indptr, w_indices, w_data, seg_rows, tiebreak, k, acc, cand, lo, hi]
    if fn is not None:
        for i, want in enumerate(_ARGS):
            if want is None:
                args[i] = int(args[i])
                continue
            dtype, ndim, _ = want
            a = args[i]
            if i in _CONVERTED:
                a = args[i] = np.ascontiguousarray(a, dtype=dtype)
            if not (isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == ndim and a.flags.c_contiguous and a.flags.aligned
                    and (want[2] or a.flags.writeable)):  # the scratch arrays are written
                fn = None
                break
    if fn is None:
        from logicrank.pipelines.engines.bm25 import kernels

        return kernels.top_k(q_indptr, q_indices, q_data, w_indptr, w_indices, w_data, seg_rows, tiebreak, k, acc, cand, lo, hi)
    return fn(*args)


def _build(out: Path) -> None:
    """Compile ``kernels.top_k`` with :data:`_ARGS`' signature into ``out`` (run as
    ``python -m logicrank.pipelines.engines.bm25.compiled OUT``)."""
    import warnings

    warnings.simplefilter("ignore")  # pycc is marked for deprecation in numba; it is what numba offers for this
    from numba import types
    from numba.pycc import CC

    from logicrank.pipelines.engines.bm25 import kernels

    nb = {np.int64: types.int64, np.int32: types.int32, np.float32: types.float32}
    args = [types.int64 if a is None else types.Array(nb[a[0]], a[1], "C", readonly=a[2]) for a in _ARGS]
    result = types.Tuple((types.Array(types.int64, 2, "C"), types.Array(types.int64, 1, "C")))
    cc = CC(MODULE_NAME)
    cc.output_dir = str(out)
    cc.target_cpu = "host"
    cc.verbose = False
    cc.export("top_k", result(*args))(kernels.top_k.py_func)
    cc.compile()


if __name__ == "__main__":
    _build(Path(sys.argv[1]))
