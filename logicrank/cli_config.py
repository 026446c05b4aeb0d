"""Command-line options bound to config fields, and config files with overrides.

A command declares which of its options set which field of its config
(``@configured(IndexConfig, EMBED.at("embed"), table="table", ...)``) and may share blocks
of options with other commands (:data:`LLM`, :data:`EMBED`) instead of repeating them. The
config is then built in one order, as Ray's and Hydra's users expect:

    the config's own defaults < the command's own defaults (e.g. ``--db data/lancedb``)
    < a config file (``--config FILE``) < the options given on the command line

so a config file plus a few options is the way to run a job with many settings, and a
default is declared once, in the config (the options read it with :func:`default`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from logicrank.pipelines.config.settings import EmbedConfig, LLMConfig


def default(config, field: str):
    """A config field's default, as the command line's: defaults are declared once, in the configs."""
    return config.model_fields[field].get_default(call_default_factory=True)


@dataclass(frozen=True)
class Opt:
    """One option that sets one config field: ``path`` is dotted from the command's config
    (``llm.model``); ``to_field`` turns the option's value into the field's."""

    name: str
    path: str
    annotation: Any
    default: Any
    to_field: Callable[[Any], Any] | None = None

    def parameter(self) -> inspect.Parameter:
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, annotation=self.annotation, default=self.default)


@dataclass(frozen=True)
class Block:
    """Options several commands share (the LLM's, the encoder's): declared once here."""

    opts: tuple[Opt, ...]

    def at(self, prefix: str) -> Block:
        """The same options setting fields under ``prefix`` (``llm`` in RetrieveConfig)."""
        return Block(tuple(replace(o, path=f"{prefix}.{o.path}" if prefix else o.path) for o in self.opts))

    def without(self, *names: str) -> Block:
        return Block(tuple(o for o in self.opts if o.name not in names))

    def aliased(self, **flags: str) -> Block:
        """Extra flags for some options (``llm_model="--model"``: decompose's older names)."""
        out = []
        for o in self.opts:
            if o.name in flags:
                base, info = o.annotation.__origin__, o.annotation.__metadata__[0]
                decls = ("--" + o.name.replace("_", "-"), flags[o.name])
                o = replace(o, annotation=Annotated[base, typer.Option(*decls, help=info.help)])
            out.append(o)
        return Block(tuple(out))


def _opt(name: str, path: str, type_: Any, help: str, config=None, field: str | None = None, value: Any = None, to_field=None) -> Opt:
    return Opt(name, path, Annotated[type_, typer.Option(help=help)], default(config, field or path) if config else value, to_field)


LLM = Block((
    _opt("llm_model", "model", str, "LLM name or checkpoint directory (every LLM stage).", LLMConfig),
    _opt("llm_dtype", "dtype", str, "LLM dtype: auto | float32 | bfloat16 | float16.", LLMConfig),
    _opt("llm_max_model_len", "max_model_len", int, "LLM context length (tokens).", LLMConfig),
    _opt("tensor_parallel_size", "tensor_parallel_size", int, "GPUs per vLLM engine.", LLMConfig),
    _opt("compiled", "enforce_eager", bool, "Compiled graphs (slow start, faster steps) instead of eager.",
         value=not default(LLMConfig, "enforce_eager"), to_field=lambda v: not v),
    _opt("llm_cache", "cache", str, "LLM cache file; 'default' under the cache root; 'none' to disable.", LLMConfig,
         to_field=lambda v: None if v == "none" else v),
    _opt("actors", "actors", int, "Engine actors of the job's one LLM pool.", LLMConfig),
    _opt("cpus_per_actor", "cpus_per_actor", float, "CPUs per engine actor.", LLMConfig),
    _opt("gpus_per_actor", "gpus_per_actor", float | None, "GPUs per engine actor (default: the tensor-parallel size on GPU nodes).", LLMConfig),
    _opt("llm_batch_rows", "batch_rows", int, "Prompts per engine call of the LLM pool.", LLMConfig),
))
"""The LLM's options: every command with an LLM stage takes them (``LLM.at("llm")``)."""

EMBED = Block((
    _opt("model", "model", str, "Registered embedding model name or a local model directory.", EmbedConfig),
    _opt("backend", "backend", str, "Encoder backend: auto (openvino on CPU where installed, torch on GPU), torch or openvino.", EmbedConfig),
))
"""The encoder's options."""

CONFIG_FILE = Opt("config", "", Annotated[Path | None, typer.Option(
    "--config", help="A YAML file of this job's config (docs/usage.md); options given on the command line override it.")], None)


@dataclass(frozen=True)
class Bound:
    """What a command's options say about its config: every bound option's value, which of
    them were given on the command line, and the config file."""

    values: dict[str, Any]  # path -> value (defaults included)
    given: frozenset[str]  # the paths whose option was given on the command line
    file: Path | None  # --config

    def data(self, prefix: str = "") -> dict[str, Any]:
        """The config as a nested mapping, in the module docstring's order; ``prefix``: the
        part under that key (``llm``), for a command that builds sub-configs alone."""
        out: dict[str, Any] = {}
        for path, value in self.values.items():
            if path not in self.given and value is not None:  # a None default leaves the config's own (None or required)
                _put(out, path, value)
        if self.file is not None:
            _merge(out, read_file(self.file))
        for path in self.given:
            _put(out, path, self.values[path])
        for key in filter(None, prefix.split(".")):
            out = out.get(key, {})
        return out

    def __getitem__(self, path: str) -> Any:
        """One field's value as the config will get it (file and command line applied)."""
        node: Any = self.data()
        for key in path.split("."):
            node = node[key]
        return node


def _put(tree: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def _merge(into: dict, other: dict) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def configured(*blocks: Block, config=None, file: bool = False, **own: str | tuple[str, Callable]):
    """Bind a command's options to the fields of ``config`` (None: sub-configs named by the
    paths' first part, ``embed``, ``llm``, ``ray``) and add the shared ``blocks`` (and
    ``--config`` with ``file``) to its options. ``own``: option name -> the field's path (or
    (path, to_field)). The command gets the binding as its keyword-only ``bound`` argument,
    which the command line does not see."""
    opts = [o for b in blocks for o in b.opts]

    def deco(fn):
        sig = inspect.signature(fn, eval_str=True)
        names = {p for p in sig.parameters if p != "bound"}
        for name in own:
            if name not in names:
                raise TypeError(f"{fn.__name__}: no option {name!r} to bind")
        bound_own = [(n, *(s if isinstance(s, tuple) else (s, None))) for n, s in own.items()]
        extra = [o.parameter() for o in opts] + ([CONFIG_FILE.parameter()] if file else [])
        params = [p for p in sig.parameters.values() if p.name != "bound"]
        context = inspect.Parameter("_ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)  # typer passes it
        params = [context] + [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params] + [
            p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in extra]

        @functools.wraps(fn)
        def wrapper(_ctx: typer.Context, **kwargs):
            values, given = {}, set()
            for name, path, to_field in [*bound_own, *((o.name, o.path, o.to_field) for o in opts)]:
                value = kwargs[name]
                values[path] = to_field(value) if to_field else value
                source = _ctx.get_parameter_source(name)
                if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):  # given: on the command line or by an env var
                    given.add(path)
            path = kwargs.pop("config", None) if file else None
            for o in opts:
                kwargs.pop(o.name)
            return fn(**kwargs, bound=Bound(values, frozenset(given), path))

        wrapper.__signature__ = sig.replace(parameters=params)
        # tests walk these: option -> (path, to_field), and the config the paths are in
        wrapper.bindings = {**{n: (p, f) for n, p, f in bound_own}, **{o.name: (o.path, o.to_field) for o in opts}}
        wrapper.config = config
        return wrapper

    return deco


def read_file(path: Path) -> dict:
    """A config file's top-level mapping (YAML)."""
    from logicrank.pipelines.files import read_yaml
    from logicrank.schemas.errors import UserError

    data = read_yaml(path, "config", UserError)
    if not isinstance(data, dict):
        raise UserError(f"config {path}: expected a mapping of the job's config fields.")
    return data
