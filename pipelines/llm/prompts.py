"""Prompt templates: text files in ``pipelines/llm/prompts/``, one per task.

Placeholders use ``string.Template`` syntax (``$question``, ``${context}``), so JSON
examples and the ``{x}`` entity placeholder in templates need no escaping. Every output
records its template's hash (``sha``): editing a file changes the hash, which changes the
cache key and the manifest, so results never mix template versions.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass
from functools import cache
from importlib import resources

from logicrank.schemas.digest import json_digest
from logicrank.schemas.errors import UserError


class PromptError(UserError, ValueError):
    """An unknown template, or a field missing from a render."""


@dataclass(frozen=True)
class Template:
    name: str
    text: str

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]

    @property
    def fields(self) -> set[str]:
        return {m.group("named") or m.group("braced") for m in string.Template.pattern.finditer(self.text)} - {None}

    def render(self, **values: str) -> str:
        missing = self.fields - values.keys()
        if missing:
            raise PromptError(f"template {self.name!r} needs {sorted(missing)}")
        return string.Template(self.text).substitute(values)


def names() -> list[str]:
    return sorted(p.name.removesuffix(".txt") for p in resources.files("logicrank.pipelines.llm").joinpath("prompts").iterdir() if p.name.endswith(".txt"))


@cache
def load(name: str) -> Template:
    path = resources.files("logicrank.pipelines.llm").joinpath("prompts", f"{name}.txt")
    if not path.is_file():
        raise PromptError(f"no prompt template {name!r}; have: {', '.join(names())}")
    return Template(name, path.read_text(encoding="utf-8"))


def templates_digest() -> str:
    """Every prompt template's hash: an edited prompt is a new LLM stage output."""
    return json_digest(sorted((name, load(name).sha) for name in names()))


def cut_to_tokens(model_dir: str, texts: dict[str, str], budget: int) -> dict[str, str]:
    """Each text cut to its first ``budget`` tokens of the model's tokenizer (the prompt
    budget of a document in a reranking prompt), never inside a character: a byte-level
    token that holds part of one ("東" is three) decodes to U+FFFD, which is dropped."""
    tok = _tokenizer(model_dir)
    return {key: _cut(tok, text, budget) for key, text in texts.items()}


def _cut(tok, text: str, budget: int) -> str:
    ids = tok.encode(text, add_special_tokens=False)
    cut = tok.decode(ids[:budget])
    while len(ids) > budget and cut.endswith("\ufffd") and not text.startswith(cut):  # (one the text holds there stays)
        cut = cut[:-1]
    return cut


@cache
def _tokenizer(model_dir: str):
    """Loaded once per checkpoint (LAG cuts passages every round)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
