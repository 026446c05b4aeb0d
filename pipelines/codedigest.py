"""The digest of the code a module runs: its source and that of every project module it imports.

A stage's cache key (:meth:`logicrank.pipelines.retrieval.runner.Inputs.key`) and a job's rerun check
(:meth:`logicrank.jobs.rundir.RunDir.is_fresh`) hold :func:`code_digest` of the module that defines the
stage or the job, so an edit to a method's code is never answered from a cache. Only the
project's own packages (:data:`PROJECT`) are hashed, and the module asked about itself wherever
it is (a stage defined in a test); third-party code is not (site-packages is the
environment's: its versions are in each manifest's ``packages``, not in the keys).

The rule (static: nothing is imported to compute it, the files are parsed with :mod:`ast`):

- a module's closure is the module and the closures of the project modules its import
  statements name, wherever they are (at the top, in a function, under ``TYPE_CHECKING``:
  stages import lazily);
- ``import a.b.c`` names ``a.b.c``; ``from a.b import c`` names the submodule ``a.b.c`` when
  there is one, else the package ``a.b`` (its ``__init__``: ``c`` is defined or re-exported
  there); relative imports are resolved against the importing module's package;
- a package's ``__init__`` counts only where it is named that way, not merely because
  Python runs it before a submodule: ``from logicrank.pipelines.retrieval.stages.base import Stage`` covers
  base.py, not pipelines/retrieval/stages/__init__.py (which imports every stage to register them).
  Naming a package (``from logicrank.pipelines.retrieval.stages import Context``) does cover its ``__init__`` and
  so everything that imports; an ``__init__`` that calls ``import_submodules`` (stage
  discovery) imports every module of its package;
- source files are found from where the top package is imported from (a copy of the
  project run from its own directory hashes its own files), and read as bytes.

So an edit to pipelines/retrieval/methods/itlr.py changes the key of the ``itlr`` stage and not that of
``bm25`` (pipelines/retrieval/stages/retrievers.py does not import it), and an edit to a module no stage
imports changes no stage's key. :func:`closure` lists a module's files
(``python -m logicrank.pipelines.codedigest logicrank.pipelines.retrieval.stages.itlr``). Each digest is computed once per
process: an edit made while a process runs is seen by the next process.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from functools import cache
from pathlib import Path

from logicrank.pipelines.moved import new_name

PROJECT = ("logicrank",)
"""The top package whose source is hashed."""


def code_digest(module: str) -> str:
    """16 hex digits of the SHA-256 over the sorted SHA-256s of the sources of ``module`` and of
    every project module it imports, directly or through others (the module doc's rule): their
    code, not their names; memoised per process."""
    return _digest(module)


@cache
def _digest(module: str) -> str:
    # the sources' own digests, sorted: neither a module's name nor where it sits enters, so a
    # module moved with every byte of its closure unchanged keeps its digest (its importers'
    # change with their import lines). A move that edits a byte of the closure (an import line,
    # a docstring) still changes it, as does code that reads files beside itself (__file__)
    h = hashlib.sha256()
    for part in sorted(hashlib.sha256(_source(name)).digest() for name in closure(module)):
        h.update(part)
    return h.hexdigest()[:16]


def source_digest(module: str) -> str:
    """16 hex digits of the SHA-256 of ``module``'s own source, none of its imports' (empty: no
    such project module): for code whose imports are keyed apart, as the retrieve job's, which
    imports every stage (runner.py's ``HOST_CODE``)."""
    return hashlib.sha256(_source(module)).hexdigest()[:16]


def source_file(module: str) -> Path | None:
    """Where ``module``'s source is read from (None: no such project module, or no file)."""
    return _path(module)


@cache
def closure(module: str) -> tuple[str, ...]:
    """The project modules whose source ``module``'s digest covers, ``module`` first, then by name.
    A module with no source file (a class defined in a notebook cell) covers only the project
    modules it cannot name: nothing; its stages' keys then change only with ``version``."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(m for m in _imports(name) if m not in seen)
    return (module, *sorted(seen - {module}))


def _project(name: str) -> bool:
    return name.split(".", 1)[0] in PROJECT


@cache
def _package_dir(package: str) -> Path | None:
    """The directory of a package, where Python imports it from, without importing it (a
    subpackage's parent is imported: ``logicrank``'s ``__init__`` is light for this)."""
    loaded = sys.modules.get(package)
    paths = list(getattr(loaded, "__path__", None) or [])
    if not paths:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        paths = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(paths[0]) if paths else None


@cache
def _path(name: str) -> Path | None:
    """The source file of a project module or package, or None when there is none. A module
    outside the project (a stage defined in a test or a script) has its own file, if loaded.
    The package configuration maps ``logicrank``'s subpackages to folders of their own
    (``logicrank.pipelines`` is pipelines/): below them, modules are files in folders."""
    if not _project(name):
        file = getattr(sys.modules.get(name), "__file__", None)
        return Path(file) if file and file.endswith(".py") and Path(file).is_file() else None
    parts = name.split(".")
    mapped = _package_dir(".".join(parts[:2])) if len(parts) > 1 else None
    root, rest = (mapped, parts[2:]) if mapped is not None else (_package_dir(parts[0]), parts[1:])
    if root is None:
        return None
    where = root.joinpath(*rest)
    for candidate in (where / "__init__.py", where.with_suffix(".py")) if rest else (root / "__init__.py",):
        if candidate.is_file():
            return candidate
    return None


@cache
def _source(name: str) -> bytes:
    path = _path(name)
    return path.read_bytes() if path is not None else b""


@cache
def _imports(name: str) -> tuple[str, ...]:
    """The project modules ``name``'s import statements name (the module doc's rule)."""
    path = _path(name)
    if path is None:
        return ()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(ast.parse(_source(name), str(path))):
        if isinstance(node, ast.Import):  # (a path that moved names its new module: pipelines/moved.py)
            out += [new_name(a.name) or a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            try:  # (a relative import, resolved as Python resolves it)
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
            except ImportError:  # beyond the top package
                continue
            base = new_name(base) or base
            for a in node.names:
                sub = f"{base}.{a.name}"
                sub = new_name(sub) or sub
                out.append(sub if a.name != "*" and _path(sub) is not None else base)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "import_submodules" and path.name == "__init__.py":
            out += [f"{name}.{f.stem}" for f in sorted(path.parent.glob("*.py")) if f.name != "__init__.py"]  # discovery
    return tuple(dict.fromkeys(m for m in out if _project(m) and _path(m) is not None))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {code_digest(arg)}")
        for m in closure(arg):
            print(f"  {m}")


def definitions_digest(files: dict[Path, tuple[str, ...]], label: str) -> str:
    """16 hex digits of the SHA-256 of named definitions' code (:func:`code_definitions`), read
    from their files (nothing imported): what a saved file records of the code that made it
    (BM25's weights and counts, the dense engine's vectors), so other code's files are made
    again. A name not found is an error naming ``label``, the list that holds it."""
    h = hashlib.sha256()
    for file, names in files.items():
        found = code_definitions(ast.parse(file.read_text(encoding="utf-8")))
        for name in names:
            if name not in found:
                raise RuntimeError(f"{label} names {name!r} in {file.name}, which defines no such thing; rename it there")
            h.update(f"{file.name}:{name}:{found[name]}\n".encode())
    return h.hexdigest()[:16]


def code_definitions(module: ast.Module) -> dict[str, str]:
    """A module's functions, classes' methods (``Class.method``) and assignments (by their first
    name) -> their code as :func:`ast.dump` writes it, docstrings removed."""
    out = {}
    for node in module.body:
        if isinstance(node, ast.ClassDef):
            out.update({f"{node.name}.{n.name}": _code(n) for n in node.body if isinstance(n, ast.FunctionDef)})
        elif isinstance(node, ast.FunctionDef):
            out[node.name] = _code(node)
        elif isinstance(node, ast.Assign):
            target = node.targets[0]
            first = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
            if isinstance(first, ast.Name):
                out[first.id] = _code(node)
    return out


def _code(node: ast.AST) -> str:
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            n.body = body[1:] or [ast.Pass()]
    return ast.dump(node)
