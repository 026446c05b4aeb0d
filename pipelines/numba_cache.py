"""numba's on-disk cache keyed by the content of the source, not by its path and time.

numba's own cache locators key a compiled function by its file's path and modification time,
so every copy of unchanged source compiles every function again: a fresh checkout, a
reinstall or a new virtual environment, a Ray working directory unpacked on a node (the BM25
engine's kernels, about 15 s a process; ranx's fusion and measures, about 25 s). While a
:class:`ContentKeyedCache` is installed, numba caches the functions of its sources (a file, or
every ``.py`` file of a package directory) under ``<numba cache dir>/<label>-<digest>``: the
digest is of every one of those files' content, so an edit to any of them (a function may call
one of another file, whose code the cache holds) compiles the group again, and a copy of the
same files loads what an earlier copy compiled. The numba cache directory is
``$NUMBA_CACHE_DIR`` where set, else ``<cache root>/numba`` (pipelines/paths.py). Within it numba
keys each entry by its own version, Python's, the argument types and the CPU, as always.

numba picks a function's cache when the function is decorated, that is when its module is
imported: install the cache around that import (a ``with`` block, or :meth:`install` and
:meth:`remove` around a module's definitions). A user's ``NUMBA_CACHE_LOCATOR_CLASSES`` wins
(numba then reads only those); where the directory cannot be written, numba's own locators
serve.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from numba.core import caching

from logicrank.pipelines.paths import cache_root

# numba named the class _CacheImpl before 0.62
_CACHE_IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl


def numba_cache_dir() -> Path:
    """``$NUMBA_CACHE_DIR`` where set, else ``<cache root>/numba``."""
    return Path(os.environ.get("NUMBA_CACHE_DIR") or cache_root() / "numba")


def _files(sources: Path) -> list[Path]:
    return [sources] if sources.is_file() else sorted(sources.rglob("*.py"))


class ContentKeyedCache:
    """numba's cache of the functions defined in ``sources`` (a file or a package directory)
    under ``<numba cache dir>/<label>-<digest of their content>`` while installed (module doc)."""

    def __init__(self, label: str, sources: Path):
        self.sources = Path(sources).resolve()
        files = _files(self.sources)
        h = hashlib.sha256()
        for f in files:
            h.update(str(f.relative_to(self.sources.parent)).encode() + b"\0" + f.read_bytes() + b"\0")
        self.digest = h.hexdigest()[:16]
        self.path = numba_cache_dir() / f"{label}-{self.digest}"
        self._files = set(files)
        self.locator = self._locator()

    def _locator(self) -> type:
        cache = self

        class Locator(caching._CacheLocator):
            def __init__(self, py_func):
                self._lineno = py_func.__code__.co_firstlineno

            def get_cache_path(self) -> str:
                return str(cache.path)

            def get_source_stamp(self) -> str:
                return cache.digest

            def get_disambiguator(self) -> str:
                return str(self._lineno)

            @classmethod
            def from_function(cls, py_func, py_file):
                if Path(py_file).resolve() not in cache._files:
                    return None  # another file's: numba's own locators
                locator = cls(py_func)
                try:
                    locator.ensure_cache_path()
                except OSError:  # not writable: numba's own locators
                    return None
                return locator

        return Locator

    def install(self) -> None:
        _CACHE_IMPL._locator_classes.insert(0, self.locator)

    def remove(self) -> None:
        _CACHE_IMPL._locator_classes.remove(self.locator)

    def __enter__(self) -> ContentKeyedCache:
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
