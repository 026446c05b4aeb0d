"""The module paths that moved when pipelines/ was grouped by concern (CHANGELOG.md, issue 52),
kept importable for one release: ``import logicrank.pipelines.stages`` (or any module below
it) gives the module at its new path, ``logicrank.pipelines.retrieval.stages``, with a one-line
``FutureWarning`` naming the package's new path (once per process). The objects are the new modules' own (one stage registry, one
``Stage`` class), reached through a light module that forwards every attribute. Nothing in
logicrank imports an old path (tests/unit/test_moved.py checks); the table goes in the next
release."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

PACKAGE = "logicrank.pipelines"
MOVED = {  # old name below logicrank.pipelines -> new name below it
    **{name: f"engines.{name}" for name in ("bm25", "store", "vectors", "exact", "embed", "placement")},
    **{name: f"retrieval.{name}" for name in ("stages", "methods", "logic", "pipeline", "runner", "overrides", "options")},
    "evaluate": "evaluation",
    "experiment": "evaluation.experiment",
    "benchmarks": "evaluation.benchmarks",
}


def new_name(old: str) -> str | None:
    """The module's path now, for a path that moved (``logicrank.pipelines.stages.base`` ->
    ``logicrank.pipelines.retrieval.stages.base``), else None."""
    if not old.startswith(PACKAGE + "."):
        return None
    head, dot, tail = old[len(PACKAGE) + 1:].partition(".")
    return f"{PACKAGE}.{MOVED[head]}{dot}{tail}" if head in MOVED else None


class _Forward(types.ModuleType):
    """A module under its old name that forwards every attribute to the module at the new one."""

    def __init__(self, name: str, target: types.ModuleType):
        super().__init__(name, target.__doc__)
        object.__setattr__(self, "_target", target)
        if hasattr(target, "__path__"):
            self.__path__ = []  # a package: its submodules' old names come through the finder too

    def __getattr__(self, attr: str):
        return getattr(object.__getattribute__(self, "_target"), attr)

    def __dir__(self):
        return dir(object.__getattribute__(self, "_target"))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if new_name(fullname) else None

    def create_module(self, spec):
        new = new_name(spec.name)
        module = importlib.import_module(new)
        if spec.name.count(".") == PACKAGE.count(".") + 1:  # one line per moved package: its modules' paths follow from it
            warnings.warn(f"{spec.name} is now {new}; the old path goes in the next release", FutureWarning, stacklevel=2)
        return _Forward(spec.name, module)

    def exec_module(self, module):
        pass


def install() -> None:
    """Serve the old paths (once per process)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
