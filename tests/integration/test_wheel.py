"""The package installs as declared: the wheel built from pyproject.toml and setup.py holds
every module of the source tree (subpackages are found, not listed), and installed with
``--no-deps`` into a fresh virtual environment over the lock's packages (this environment's
site-packages, where `make venv` installed requirements.lock) it runs ``logicrank --help``,
``logicrank evaluate`` on a small run, and imports every one of its modules, from a folder
outside the checkout so that nothing is read from the source tree. The build fetches its
build requirements (setuptools) from the package index, as `make venv`'s install does, and
reads the checkout's files with git."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds the wheel and an environment

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"logicrank": "logicrank", "pipelines": "logicrank/pipelines", "jobs": "logicrank/jobs", "schemas": "logicrank/schemas"}


def _run(argv, cwd) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, logicrank script, module names in the wheel) of a fresh environment."""
    tmp = tmp_path_factory.mktemp("wheel")
    # built from a copy of the checkout's files (tracked, and new ones not ignored): what a
    # clone holds, and the build writes nothing into the checkout
    for name in _run(["git", "ls-files", "-co", "--exclude-standard"], ROOT).splitlines():
        if (ROOT / name).is_file():
            (tmp / "src" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tmp / "src" / name)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"), str(tmp / "src")], tmp)
    (wheel,) = (tmp / "dist").glob("logicrank-*.whl")
    env = tmp / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)], tmp)
    # the lock's packages: this environment's site-packages as a plain path (its .pth files, the
    # editable install of the checkout among them, are not read from there)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).strip())
    (site / "zz_lock_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    names = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")]
    modules = sorted(n.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for n in names)
    return python, env / "bin" / "logicrank", modules, tmp


def test_the_wheel_holds_every_file_of_the_tree(installed):
    """Every file under the package folders (tracked, or new and not ignored), modules and data
    (presets, prompts, bundled datasets, experiment files), is in the wheel, at its package's path."""
    tracked = [n for n in _run(["git", "ls-files", "-co", "--exclude-standard", *FOLDERS], ROOT).splitlines() if (ROOT / n).is_file()]
    expected = sorted(FOLDERS[path.split("/", 1)[0]] + "/" + path.split("/", 1)[1] for path in tracked)
    with zipfile.ZipFile(installed[3] / "dist" / next(p.name for p in (installed[3] / "dist").iterdir())) as wheel:
        held = sorted(n for n in wheel.namelist() if ".dist-info/" not in n)
    assert held == expected


def test_the_installed_package_runs(installed):
    python, logicrank, modules, tmp = installed
    where = _run([str(python), "-c", "import logicrank.pipelines as p; print(p.__file__)"], tmp)
    assert str(tmp / "env") in where and str(ROOT) not in where  # the wheel's code, not the checkout's
    assert "evaluate" in _run([str(logicrank), "--help"], tmp)
    (tmp / "qrels.txt").write_text("q1 0 d1 1\nq1 0 d2 0\nq2 0 d3 1\n")
    (tmp / "run.trec").write_text("q1 Q0 d1 1 2.0 r\nq1 Q0 d2 2 1.0 r\nq2 Q0 d2 1 3.0 r\nq2 Q0 d3 2 1.0 r\n")
    said = _run([str(logicrank), "evaluate", "qrels.txt", "run.trec", "--measure", "P@1", "--measure", "MRR", "--out", "eval"], tmp)
    row = next(line.split() for line in said.splitlines() if line.startswith("r "))
    assert row == ["r", "2", "0.5000", "0.7500"]  # q1: d1 first (P@1 1, RR 1); q2: d3 second (P@1 0, RR 1/2)
    _run([str(python), "-c", "import importlib\nfor m in " + repr(modules) + ": importlib.import_module(m)"], tmp)
