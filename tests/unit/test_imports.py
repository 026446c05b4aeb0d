"""The import graph of schemas/, pipelines/ and jobs/ (every import, also those inside
functions): contracts at the bottom, no circles; and one namespace: the folders are imported as
``logicrank.schemas``, ``logicrank.pipelines`` and ``logicrank.jobs`` (pyproject.toml maps them),
never as top-level packages. The graph names modules by folder (``pipelines.retrieval.runner``).

- ``schemas`` (the table contracts) imports nothing from ``pipelines`` or ``jobs``;
- ``pipelines`` imports nothing from ``jobs``; nothing imports the command line (logicrank/cli.py);
- inside ``pipelines``, the engines (BM25, dense, store, embedding) import none of the
  concerns built on them, and retrieval imports neither evaluation nor operations nor
  generation: evaluation runs retrieval, never the reverse;
- the graph has no cycle.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "pipelines", "jobs", "logicrank")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


@functools.cache
def _import_nodes(path: Path) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """Every import statement of ``path`` (also inside functions): each file parsed once per run."""
    return tuple(n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Import | ast.ImportFrom))


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from a.b import c`` counts ``a.b.c`` when
    that is a module, else ``a.b``)."""
    modules = _modules()

    def known(name: str) -> str | None:
        name = name.removeprefix("logicrank.") if name.split(".")[1:2] and name.split(".")[1] in PACKAGES else name
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in _import_nodes(path):
            if isinstance(node, ast.Import):
                deps |= {known(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps |= {known(f"{node.module}.{a.name}") for a in node.names}
        graph[name] = deps - {None, name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        path.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def _top(name: str) -> str:
    return name.split(".")[0]


def test_the_graph_is_read():
    graph = _graph()
    assert "pipelines.engines.store" in graph["jobs.index"] and "pipelines.config.settings" in graph["jobs.index"]
    assert ("jobs.experiment", "jobs.index") in {(a, b) for a in graph for b in graph[a]}  # an import inside a function


def test_layers():
    graph = _graph()
    edges = {(a, b) for a in graph for b in graph[a]}
    upward = {(a, b) for a, b in edges if _top(a) == "schemas" and _top(b) != "schemas"}
    assert not upward, f"schemas imports from above it: {sorted(upward)}"
    assert not [(a, b) for a, b in edges if _top(a) == "pipelines" and _top(b) == "jobs"]
    assert not [(a, b) for a, b in edges if b.startswith("logicrank.cli") and not a.startswith("logicrank.cli")]  # nothing imports the command line
    assert not [(a, b) for a, b in edges if _top(b) == "logicrank" and _top(a) != "logicrank"]  # the API is the top


# what each concern of pipelines/ must not import: those built on it
_ABOVE = {
    "pipelines.engines": ("pipelines.retrieval", "pipelines.evaluation", "pipelines.operations", "pipelines.generate", "pipelines.llm",
                          "pipelines.datasets", "pipelines.corpus"),
    "pipelines.retrieval": ("pipelines.evaluation", "pipelines.operations", "pipelines.generate"),
}


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of ``graph`` from a concern built on the importer (``_ABOVE``), by package
    prefix: ``pipelines.engines.bm25.index`` is in ``pipelines.engines``, ``pipelines.corpus``
    is not in ``pipelines.corpus_x``."""
    def within(name: str, package: str) -> bool:
        return (name + ".").startswith(package + ".")

    return sorted((a, b) for a in graph for b in graph[a] for low, above in _ABOVE.items()
                  if within(a, low) and any(within(b, x) for x in above))


def test_concerns_inside_pipelines_import_downward():
    upward = _upward(_graph())
    assert not upward, f"imports from a concern built on the importer: {upward}"


def test_an_upward_import_is_found():
    graph = {"pipelines.retrieval.methods.lag": {"pipelines.evaluation.qa", "pipelines.answers"},
             "pipelines.engines.bm25.index": {"pipelines.corpus_x", "pipelines.retrievalish"},
             "pipelines.evaluation.ablation": {"pipelines.retrieval.methods.ranking"}}
    assert _upward(graph) == [("pipelines.retrieval.methods.lag", "pipelines.evaluation.qa")]


def _imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (top-level name), also inside functions."""
    found = set()
    for node in _import_nodes(path):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_nothing_below_jobs_imports_ray():
    """Ray is the jobs' (jobs/): the stage logic (pipelines/) and the contracts (schemas/) run in
    any process, a notebook's or an actor's, without it."""
    below = {name: path for name, path in _modules().items() if _top(name) in ("pipelines", "schemas")}
    assert len(below) > 50
    assert sorted(name for name, path in below.items() if "ray" in _imports_of(path)) == []
    assert "ray" in _imports_of(ROOT / "jobs" / "raysession.py")  # the check reads imports as they are written


def test_no_import_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def _top_level_imports(path: Path) -> list[str]:
    """The imports in ``path`` of a folder as a top-level package (``from pipelines.x import y``)."""
    out = []
    for node in _import_nodes(path):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if (
            isinstance(node, ast.ImportFrom) and node.module and node.level == 0) else []
        out += [n for n in names if n.split(".")[0] in PACKAGES[:3]]
    return out


def test_every_module_and_test_imports_the_folders_through_logicrank():
    files = [*(ROOT / "tests").rglob("*.py"), *_modules().values()]
    found = {str(f.relative_to(ROOT)): got for f in files if (got := _top_level_imports(f))}
    assert not found


def test_outside_the_repository_only_logicrank_is_installed(tmp_path):
    code = ("import importlib.util, json, logicrank as lr; "
            "print(json.dumps([[importlib.util.find_spec(m) is None for m in ('pipelines', 'jobs', 'schemas')], "
            "[getattr(lr, n).__module__ for n in ('RayConfig', 'RetrieveConfig', 'NightlyConfig', 'Experiment', 'BM25Options', 'OrlogOptions')]]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    absent, modules = json.loads(out.stdout)
    assert absent == [True, True, True]
    assert all(m.startswith("logicrank.") for m in modules)


def test_a_cycle_is_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_test_imports_a_private_name_of_logicrank():
    """Tests go through public seams: no ``from logicrank... import _name`` (nor of a test helper)."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in _import_nodes(path):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("logicrank", "tests"):
                found += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not found


def test_the_command_line_starts_without_the_heavy_libraries():
    """``logicrank --help`` and every refusal before a job's work are a fresh interpreter's
    import of logicrank/cli.py: LanceDB (a second on 2 cores), Ray, torch and vLLM are imported
    by the jobs that use them, not by the command line's start."""
    code = "import json, sys; import logicrank.cli; print(json.dumps(sorted(m for m in ('lancedb', 'lance', 'ray', 'torch', 'vllm') if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
