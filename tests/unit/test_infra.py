"""The manifests parse, and every logicrank command in them is accepted by the real CLI."""

import shlex
from pathlib import Path

import pytest
import typer
import yaml

from jobs.cli import app

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
    assert set(found) >= {"rayjob-index.yaml", "cronjob-reindex.yaml", "rayjob-decompose.yaml", "rayjob-orlog.yaml", "rayjob-generate.yaml"}
