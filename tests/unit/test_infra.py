"""The manifests parse, and every logicrank command in them is accepted by the real CLI."""

import shlex
from pathlib import Path

import pytest
import typer
import yaml

from logicrank.cli import app

INFRA = Path(__file__).resolve().parents[2] / "infra"


def _commands(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "entrypoint" and isinstance(value, str) and value.startswith("logicrank"):
                yield shlex.split(value)
            elif key == "command" and isinstance(value, list) and value and value[0] == "logicrank":
                yield value
            else:
                yield from _commands(value)
    elif isinstance(node, list):
        for item in node:
            yield from _commands(item)


@pytest.mark.parametrize("manifest", sorted(INFRA.glob("*.yaml")), ids=lambda p: p.name)
def test_manifest_commands_parse(manifest):
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    assert docs and all("kind" in d and "apiVersion" in d for d in docs)
    cli = typer.main.get_command(app)
    for doc in docs:
        for argv in _commands(doc):
            sub, name, rest = cli, argv[1], list(argv[2:])
            sub = sub.get_command(None, name)  # type: ignore[attr-defined]
            while isinstance(sub, typer.core.TyperGroup):  # a command group (`generate itlr`): its subcommand
                name, rest = rest[0], rest[1:]
                sub = sub.get_command(None, name)
            assert sub is not None, f"{manifest.name}: no subcommand {name!r}"
            sub.make_context(name, rest)  # raises on an unknown option or a bad value


def test_every_manifest_has_a_logicrank_command():
    found = [m.name for m in INFRA.glob("*.yaml") if any(_commands(d) for d in yaml.safe_load_all(m.read_text()) if d)]
    assert set(found) >= {"rayjob-index.yaml", "cronjob-nightly.yaml", "rayjob-decompose.yaml", "rayjob-orlog.yaml", "rayjob-generate.yaml"}


def test_configmap_configs_are_valid_nightly_configs():
    """A config shipped in a ConfigMap validates against the real schema (stages included);
    its checkpoint paths exist only on the cluster, so nothing is resolved here."""
    from logicrank.pipelines.config.retrieval import NightlyConfig

    checked = 0
    for manifest in sorted(INFRA.glob("*.yaml")):
        for doc in yaml.safe_load_all(manifest.read_text()):
            if doc and doc.get("kind") == "ConfigMap":
                for name, text in doc["data"].items():
                    cfg = NightlyConfig.model_validate(yaml.safe_load(text))
                    assert cfg.regressions and cfg.pipelines, f"{manifest.name}:{name}"
                    checked += 1
    assert checked >= 1
