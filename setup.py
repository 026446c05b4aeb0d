"""Subpackages are found, not listed: every package under each folder that pyproject.toml's
``package-dir`` maps (logicrank/, pipelines/ as logicrank.pipelines, jobs/, schemas/) goes into
the wheel, so a new subpackage cannot be left out. Everything else is in pyproject.toml."""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
setup(packages=[name + (f".{sub}" if sub else "") for name, folder in folders.items() for sub in ["", *find_packages(ROOT / folder)]])
