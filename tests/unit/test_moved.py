"""The module paths that moved in issue 52 (pipelines/moved.py): each old path still imports,
for one release, as the new module's objects with a one-line FutureWarning; nothing in
logicrank imports an old path; a stage module written against an old path is keyed on the
new module's code."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from logicrank.pipelines.codedigest import closure
from logicrank.pipelines.moved import MOVED, new_name

ROOT = Path(__file__).resolve().parents[2]


def test_an_old_path_gives_the_new_modules_objects_with_one_line_naming_the_new_path():
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from logicrank.pipelines.stages.base import Stage as old\n"
            "from logicrank.pipelines.stages import register as old_register\n"
            "from logicrank.pipelines.retrieval.stages.base import Stage as new\n"
            "from logicrank.pipelines.retrieval.stages import register as new_register\n"
            "import logicrank.pipelines.evaluate.core as core\n"
            "assert old is new and old_register is new_register and core.run_metrics.__module__ == 'logicrank.pipelines.evaluation.core'\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    notices = [line for line in out.stderr.splitlines() if "FutureWarning" in line]
    assert len(notices) == 2, out.stderr  # one line per moved package, however many of its modules are imported
    assert "logicrank.pipelines.stages is now logicrank.pipelines.retrieval.stages;" in notices[0], out.stderr
    assert "logicrank.pipelines.evaluate is now logicrank.pipelines.evaluation;" in notices[1], out.stderr


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_moved_path_names_a_module_that_exists(old):
    new = new_name(f"logicrank.pipelines.{old}")
    folder = ROOT / "pipelines" / Path(*new.split(".")[2:])
    assert folder.is_dir() or folder.with_suffix(".py").is_file(), new


def test_nothing_in_logicrank_imports_an_old_path():
    old = []
    for folder in ("logicrank", "pipelines", "jobs", "schemas"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module, *(f"{node.module}.{a.name}" for a in node.names)] if isinstance(node, ast.ImportFrom) and node.module else [])
                old += [f"{path.relative_to(ROOT)}: {n}" for n in names if new_name(n)]
    assert not old, old  # ("from logicrank.pipelines import bm25" counts: it names logicrank.pipelines.bm25)


def test_a_stage_module_written_against_an_old_path_is_keyed_on_the_new_modules_code(tmp_path, monkeypatch):
    (tmp_path / "old_path_stage.py").write_text("from logicrank.pipelines.stages.base import Stage\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n == "logicrank.pipelines.stages" or n.startswith("logicrank.pipelines.stages.")]:
        monkeypatch.delitem(sys.modules, name)  # imported under its old name by an earlier test here: imported afresh
    with pytest.warns(FutureWarning, match="logicrank.pipelines.stages is now logicrank.pipelines.retrieval.stages;"):
        import old_path_stage  # noqa: F401
    assert "logicrank.pipelines.retrieval.stages.base" in closure("old_path_stage")
