"""The docs follow the code: docs/stages.md is `logicrank stages`' output, the README names
every registered stage, and its YAML pipeline examples validate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pipelines.pipeline import describe
from pipelines.stages import stages
from schemas.config import NightlyConfig, RetrieveConfig

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
STAGES_DOC = ROOT / "docs" / "stages.md"
REGENERATE = """.venv/bin/python -c "from pipelines.pipeline import describe; open('docs/stages.md','w').write(describe())\""""


def _pipelines_section() -> str:
    m = re.search(r"^## Pipelines\b.*?(?=^## )", README, re.S | re.M)
    assert m, "README.md has no '## Pipelines' section"
    return m.group(0)


def _yaml_blocks() -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", README, re.S | re.M)


def test_stages_doc_is_describe():
    assert STAGES_DOC.read_text(encoding="utf-8") == describe(), f"docs/stages.md is out of date; regenerate it with {REGENERATE}"


@pytest.mark.parametrize("name", sorted(stages()))
def test_every_stage_is_documented(name):
    assert f"`{name}`" in _pipelines_section(), f"README.md's Pipelines section does not name stage {name!r}"
    assert f"### `{name}` (" in STAGES_DOC.read_text(encoding="utf-8"), f"docs/stages.md lacks stage {name!r}; regenerate it"


def test_readme_yaml_pipelines_validate():
    blocks = _yaml_blocks()
    assert blocks, "README.md has no ```yaml pipeline example"
    for block in blocks:
        data = yaml.safe_load(block)
        if isinstance(data, dict) and {"out", "index", "query_sets"} <= set(data):  # a nightly config (README, "Nightly operations")
            assert NightlyConfig.model_validate(data).pipelines
            continue
        if isinstance(data, dict) and set(data) == {"pipelines"}:  # as `logicrank retrieve --pipelines` reads it
            data = data["pipelines"]
        cfg = RetrieveConfig(queries="q", db="d", pipelines=data)
        assert list(cfg.pipelines) == list(data)
