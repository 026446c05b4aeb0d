"""The docs follow the code: docs/stages.md is `logicrank stages`' output, docs/pipelines.md
names every registered stage, every YAML pipeline example validates, every `logicrank`
command line in a shell block names a real command and real options, every relative link
resolves, and the README stays a front page."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml

from logicrank.cli import app
from logicrank.pipelines.config.retrieval import NightlyConfig, RetrieveConfig
from logicrank.pipelines.retrieval.pipeline import describe
from logicrank.pipelines.retrieval.stages import stages

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
STAGES_DOC = ROOT / "docs" / "stages.md"
PIPELINES_DOC = ROOT / "docs" / "pipelines.md"
REGENERATE = """.venv/bin/python -c "from logicrank.pipelines.retrieval.pipeline import describe; open('docs/stages.md','w').write(describe())\""""
README_MAX_LINES = 250


def _blocks(lang: str) -> list[tuple[str, str]]:
    """(page name, block text) of every fenced block of ``lang`` in the README and docs/."""
    return [(p.name, b) for p in PAGES for b in re.findall(rf"^```{lang}\n(.*?)^```", p.read_text(encoding="utf-8"), re.S | re.M)]


def test_stages_doc_is_describe():
    assert STAGES_DOC.read_text(encoding="utf-8") == describe(), f"docs/stages.md is out of date; regenerate it with {REGENERATE}"


@pytest.mark.parametrize("name", sorted(stages()))
def test_every_stage_is_documented(name):
    assert f"`{name}`" in PIPELINES_DOC.read_text(encoding="utf-8"), f"docs/pipelines.md does not name stage {name!r}"
    assert f"### `{name}` (" in STAGES_DOC.read_text(encoding="utf-8"), f"docs/stages.md lacks stage {name!r}; regenerate it"


def test_yaml_pipelines_validate():
    blocks = _blocks("yaml")
    assert len(blocks) >= 3, "the docs have lost their ```yaml pipeline examples"
    for page, block in blocks:
        data = yaml.safe_load(block)
        if isinstance(data, dict) and {"out", "index", "query_sets"} <= set(data):  # a nightly config (docs/operations.md)
            assert NightlyConfig.model_validate(data).pipelines, page
            continue
        if isinstance(data, dict) and {"name", "title", "dataset"} <= set(data):  # an experiment file (docs/experiments.md)
            from logicrank.pipelines.evaluation.experiment import Experiment

            assert Experiment.model_validate(data).pipelines, page
            continue
        if isinstance(data, dict) and "corpus" in data:  # an index config (`logicrank index --config`, docs/usage.md)
            from logicrank.pipelines.config.settings import IndexConfig

            IndexConfig.model_validate(data)
            continue
        if isinstance(data, dict) and set(data) == {"pipelines"}:  # as `logicrank retrieve --pipelines` reads it
            data = data["pipelines"]
        cfg = RetrieveConfig(queries="q", db="d", pipelines=data)
        assert list(cfg.pipelines) == list(data), page


def _command_lines(block: str) -> list[list[str]]:
    """The `logicrank ...` invocations of a shell block: continuation lines joined, comments
    dropped, each command of a `&&` / `;` / `|` chain on its own."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for w in [*words, ";"]:
            if w in ("&&", ";", "|", "||"):
                if current and Path(current[0]).name == "logicrank":
                    out.append(current[1:])
                current = []
            elif current or Path(w).name == "logicrank":
                current.append(w)
    return out


def _check(group, args: list[str], where: str) -> None:
    """``args`` (after ``logicrank``) name a command of ``group`` (typer's click command) and
    only its options."""
    command = group
    words = list(args)
    while hasattr(command, "commands"):  # a group (typer vendors click: duck-typed)
        opts = {o for p in command.params for o in p.opts}
        while words and words[0].startswith("-"):  # the group's own options (--verbose, --stall-timeout N)
            name = words.pop(0).split("=")[0]
            assert name in opts, f"{where}: `{name}` is not an option of `logicrank` ({' '.join(args)})"
            param = next(p for p in command.params if name in p.opts)
            if not getattr(param, "is_flag", False) and "=" not in name and words:
                words.pop(0)
        assert words, f"{where}: no command after `logicrank` ({' '.join(args)})"
        name = words.pop(0)
        sub = command.commands.get(name)
        assert sub is not None, f"{where}: `logicrank {name}` is not a command ({' '.join(args)})"
        command = sub
    opts = {o for p in command.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]}
    for w in words:
        if w.startswith("--"):
            assert w.split("=")[0] in opts, f"{where}: `{w.split('=')[0]}` is not an option of `logicrank {command.name}` ({' '.join(args)})"


def test_every_logicrank_command_line_in_the_docs_names_real_commands_and_options():
    group = typer.main.get_command(app)
    lines = [(page, cmd) for page, block in _blocks("sh") for cmd in _command_lines(block)]
    assert len(lines) >= 20, "the docs have lost their command lines"
    for page, args in lines:
        _check(group, args, page)


def test_every_relative_link_resolves():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: link to {target}, which does not exist"


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; manuals go to docs/ (at most {README_MAX_LINES})"
    assert sum(line.startswith("make ") for line in lines) == 2  # the two set-up commands


def test_every_python_block_compiles():
    """A syntax check in a second; tests/integration/test_docs_examples.py runs every block on a small table."""
    blocks = list(_blocks("python"))
    for page, block in blocks:
        compile(block, page, "exec")
    assert len(blocks) >= 5, blocks  # (the pages' examples are found: 7 when written)


def test_python_api_names_every_stage_that_asks_the_llm():
    """docs/python-api.md's list of the stages an ``llm`` is for: those whose needs (their
    options unvalidated, required ones given a placeholder) name an LLM call."""
    asks = set()
    for name, cls in stages().items():
        required = {f: "x" for f, info in cls.Options.model_fields.items() if info.is_required()}
        if cls(cls.Options.model_construct(**required)).needs().llm:
            asks.add(name)
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    listed = re.search(r"pipelines that ask the LLM\s+\(([^)]*)\)", text)
    assert listed, "docs/python-api.md: the list of stages that ask the LLM is gone"
    assert set(re.findall(r"`([a-z_0-9]+)`", listed.group(1))) == asks


# A dotted name that is no module or attribute: the key under which the index job records the
# table's encoder in the table's metadata.
NOT_A_MODULE = {"logicrank.model"}


def _dotted_names() -> list[tuple[str, str]]:
    """(where, name) of every dotted module name (``logicrank.pipelines.io.read_run``, or
    ``pipelines.io`` as the folders are called) in the README, docs/ and the package's docstrings;
    a name followed by ``=`` is an override path (``pipelines.orlog.0.bm25.k=5``), not a module."""
    import ast

    pattern = re.compile(r"(?<![\w/.-])(?:logicrank(?:\.[A-Za-z_]\w*)+|(?:pipelines|jobs|schemas)(?:\.[A-Za-z_]\w*)+)(?![\w.]*=)")
    texts = [(p.name, p.read_text(encoding="utf-8")) for p in PAGES if p.name != "CHANGELOG.md"]
    for folder in ("logicrank", "pipelines", "jobs", "schemas"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if path.name == "moved.py" and path.parent.name == "pipelines":
                    break  # its docstrings name the old paths it serves
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and ast.get_docstring(node):
                    texts.append((str(path.relative_to(ROOT)), ast.get_docstring(node)))
    found = []
    for where, text in texts:
        for m in pattern.finditer(text):
            name = m.group(0).rstrip(".")
            if not name.endswith((".py", ".md", ".yaml", ".txt", ".json", ".parquet")) and name not in NOT_A_MODULE:
                found.append((where, name))
    return found


def _resolves(name: str) -> bool:
    """The name is a module or an attribute at its path today; an old path that still imports
    for one release (pipelines/moved.py) does not count: the docs give the new one."""
    import importlib

    from logicrank.pipelines.moved import new_name

    parts = (name if name.startswith("logicrank.") else f"logicrank.{name}").split(".")
    if new_name(".".join(parts)):
        return False
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_dotted_module_name_in_the_docs_and_docstrings_resolves():
    names = _dotted_names()
    assert len(names) > 50  # the scan finds them
    assert [f"{where}: {name}" for where, name in names if not _resolves(name)] == []


def test_a_dotted_name_that_moved_is_found():
    assert _resolves("logicrank.pipelines.io.read_run") and _resolves("pipelines.io.read_run")
    assert not _resolves("pipelines.topics") and not _resolves("logicrank.pipelines.io.read_topics")
    assert not _resolves("logicrank.pipelines.stages.base.Stage") and _resolves("logicrank.pipelines.retrieval.stages.base.Stage")
