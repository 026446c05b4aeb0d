"""numba's on-disk cache keyed by the content of the source, not by its path and time.

numba's own cache locators key a compiled function by its file's path and modification time,
so every copy of unchanged source compiles every function again: a fresh checkout, a
reinstall or a new virtual environment, a Ray working directory unpacked on a node. While a
:class:`ContentKeyedCache` is installed, numba caches the functions of its sources (a file, or
every ``.py`` file of a package directory) under ``<numba cache dir>/<label>-<digest>``, the
functions of a package's subdirectory in the same subdirectory there (numba names a cache file
after its module's base name: ``fusion/common.py`` and ``metrics/common.py`` stay apart). The
digest is of numba's version and of every one of those files' content, so an edit to any of
them (a function may call one of another file, whose code the cache holds) compiles the group
again, another numba keeps its own, and a copy of the same files loads what an earlier copy
compiled. Each edit leaves its own directory. The numba cache directory is numba's
``CACHE_DIR`` (``$NUMBA_CACHE_DIR``) where set, else ``<cache root>/numba``
(pipelines/paths.py). Within it numba keys each entry by Python's version, the argument types
and the CPU, as always.

numba picks a function's cache when the function is decorated, that is when its module is
imported: install the cache before that import (a ``with`` block around it, or
:meth:`ContentKeyedCache.install` at the top of the module that defines the functions). Its
locator claims the functions of its own files only, so it may stay installed. A user's
``NUMBA_CACHE_LOCATOR_CLASSES`` wins (numba then asks only those); where the directory cannot be
written, numba's own locators serve.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import numba
from numba.core import caching
from numba.core import config as numba_config

from logicrank.pipelines.paths import cache_root

_CACHE_IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # (an older numba's name)


def numba_cache_dir() -> Path:
    """numba's ``CACHE_DIR`` (``$NUMBA_CACHE_DIR``) where set, else ``<cache root>/numba``."""
    return Path(numba_config.CACHE_DIR or cache_root() / "numba")


class ContentKeyedCache:
    """numba's cache of the functions defined in ``sources`` (a file or a package directory)
    under ``<numba cache dir>/<label>-<digest of their content>`` while installed (module doc)."""

    def __init__(self, label: str, sources: Path):
        sources = Path(sources).resolve()
        self.top = sources.parent if sources.is_file() else sources  # the files' paths below the cache's directory are theirs below it
        files = [sources] if sources.is_file() else sorted(sources.rglob("*.py"))
        h = hashlib.sha256(numba.__version__.encode() + b"\0")
        for f in files:
            h.update(str(f.relative_to(self.top)).encode() + b"\0" + f.read_bytes() + b"\0")
        self.digest = h.hexdigest()[:16]
        self.path = numba_cache_dir() / f"{label}-{self.digest}"
        self.files = frozenset(files)
        self.locator = self._locator()

    def _locator(self) -> type:
        cache = self

        class Locator(caching._CacheLocator):
            def __init__(self, py_func, py_file: Path):
                self._py_file = str(py_file)  # (numba names the file in its warning for a function it cannot cache)
                self._lineno = py_func.__code__.co_firstlineno
                self._cache_path = str(cache.path / py_file.parent.relative_to(cache.top))

            def get_cache_path(self) -> str:
                return self._cache_path

            def get_source_stamp(self) -> str:
                return cache.digest

            def get_disambiguator(self) -> str:
                return str(self._lineno)

            @classmethod
            def from_function(cls, py_func, py_file):
                path = Path(py_file).resolve()
                if path not in cache.files:
                    return None  # another file's: numba's own locators
                locator = cls(py_func, path)
                try:
                    locator.ensure_cache_path()
                except OSError:  # not writable: numba's own locators
                    return None
                return locator

        return Locator

    def install(self) -> None:
        """numba asks this cache's locator first, from now on (or until :meth:`remove`)."""
        _CACHE_IMPL._locator_classes.insert(0, self.locator)

    def remove(self) -> None:
        _CACHE_IMPL._locator_classes.remove(self.locator)

    def __enter__(self) -> ContentKeyedCache:
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


_typed_cached = False


def cache_typed_containers() -> None:
    """Cache the helper functions of numba's typed containers (``numba.typed.Dict`` and
    ``List``: their creation, append, lookup, iteration) by the content of numba's ``typed``
    package, as :class:`ContentKeyedCache` caches a package's own functions. numba declares them
    without ``cache=True``, so every process compiled them again on first use, most of ranx's
    first fusion's time (docs/bulk-retrieval.md). numba still refuses to cache a function
    it cannot (one holding an address of this process), as for any cached function. The
    caching holds for the whole process: a typed container of a user's own types whose hash or
    equality (an ``@overload``, a jitclass) is edited later would load the helpers compiled with
    the old one, numba's limit for any cached function that calls code of another file. Call it
    before the containers are first used; calling it again does nothing."""
    global _typed_cached
    if _typed_cached:
        return
    from numba.core.dispatcher import Dispatcher
    from numba.typed import typeddict, typedlist

    ContentKeyedCache("numba-typed", Path(typeddict.__file__).parent).install()
    for module in (typeddict, typedlist):
        for f in vars(module).values():
            if isinstance(f, Dispatcher) and f.py_func.__module__ == module.__name__:
                with contextlib.suppress(RuntimeError):  # no locator can write its cache: compiled in each process, as before
                    f.enable_caching()
    _typed_cached = True
