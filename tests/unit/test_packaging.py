"""The package declares what it imports: deptry (pinned in the test extra; configured in
pyproject.toml's [tool.deptry]) over logicrank/, pipelines/, jobs/ and schemas/ finds no
missing, dev-only or transitive import and no unused declaration. The wheel built from the
same declarations is installed and run in tests/integration/test_wheel.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_deptry_finds_every_import_declared():
    done = subprocess.run([sys.executable, "-m", "deptry", "logicrank", "pipelines", "jobs", "schemas", "--no-ansi"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No dependency issues found" in done.stdout + done.stderr


def test_deptry_would_see_a_missing_declaration(tmp_path):
    """The check can fail: an import that only arrives as another package's dependency (lark,
    here: DEP003) and one of a package not installed at all (DEP001) are reported."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "0"\ndependencies = ["numpy"]\n')
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "__init__.py").write_text("import numpy\nimport lark\nimport no_such_package_here\n")
    done = subprocess.run([sys.executable, "-m", "deptry", "x", "--no-ansi"], cwd=tmp_path, capture_output=True, text=True)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "DEP003 'lark' imported but it is a transitive dependency" in said
    assert "DEP001 'no_such_package_here' imported but missing from the dependency definitions" in said
