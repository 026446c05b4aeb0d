"""Command-line options generated from the config models, and config files with overrides.

An option that sets a config field is declared once, by the field: its flag comes from the
option's name, and its type, default and help from the field's annotation, default and
description. A command names the fields it exposes
(``@configured(IndexConfig, EMBED.at("embed"), table="table", db=Bind("db", default="data/lancedb"))``)
and declares in its own signature only its arguments and what it computes itself (``--out``,
``--progress``). Blocks of options several commands share (:data:`LLM`, :data:`EMBED`) are
declared once here. The config is then built in one order, as Ray's and Hydra's users expect:

    the config's own defaults < the command's own defaults (e.g. ``--db data/lancedb``)
    < a config file (``--config FILE``) < the options given on the command line

so a config file plus a few options is the way to run a job with many settings.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from logicrank.pipelines.config.settings import EmbedConfig, LLMConfig, RayConfig

PARTS = {"embed": EmbedConfig, "llm": LLMConfig, "ray": RayConfig}
"""The sub-configs a command bound to no one config sets (its paths' first part names one)."""

_FIELD = object()  # Bind's default: the field's own


def default(config, field: str):
    """A config field's default, as the command line's: defaults are declared once, in the configs."""
    return config.model_fields[field].get_default(call_default_factory=True)


def field_at(config, path: str):
    """The pydantic field at a dotted ``path`` of ``config`` (None: the path's first part names
    one of :data:`PARTS`)."""
    parts = path.split(".")
    if config is None:
        config, parts = PARTS[parts[0]], parts[1:]
    for i, name in enumerate(parts):
        if name not in config.model_fields:
            raise TypeError(f"{config.__name__} has no field {name!r} (option path {path!r})")
        field = config.model_fields[name]
        if i < len(parts) - 1:
            config = next(a for a in (field.annotation, *typing.get_args(field.annotation)) if isinstance(a, type) and hasattr(a, "model_fields"))
    return field


def cli_type(annotation) -> tuple[Any, tuple[str, ...]]:
    """The type typer parses a field's option as, and its choices (a Literal's values): a
    Literal is read as text and a tuple as a repeatable option; pydantic validates the value
    when the config is built, so a bad one is refused in the config's words."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner, choices = cli_type(rest[0]) if len(rest) == 1 else (str, ())
        return inner | None if type(None) in args else inner, choices
    if origin is Literal:
        return str, tuple(map(str, args))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        inner, choices = cli_type(args[0])
        return list[inner], choices
    return (annotation, ()) if annotation in (str, int, float, bool, Path) else (str, ())


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
class Bind:
    """An option of a command that sets the field at ``path``, with the command's own
    ``default`` where it has one (``db``: data/lancedb; a required field), and more ``flags``
    beside the one its name gives (decompose's older names)."""

    path: str
    default: Any = _FIELD
    flags: tuple[str, ...] = ()


def option(config, name: str, bind: Bind | str) -> Opt:
    """The option ``--name`` generated from the field ``bind`` names in ``config``: the field's
    type, its default (or the command's) and its description as help."""
    bind = Bind(bind) if isinstance(bind, str) else bind
    field = field_at(config, bind.path)
    if not field.description:
        raise TypeError(f"option --{name.replace('_', '-')}: field {bind.path!r} has no description to show as help")
    kind, choices = cli_type(field.annotation)
    if bind.default is not _FIELD:
        value = bind.default
    else:
        value = None if field.is_required() else field.get_default(call_default_factory=True)
    to_field = None
    if typing.get_origin(kind) is list or any(typing.get_origin(a) is list for a in typing.get_args(kind)):
        value = list(value) if value else None
        to_field = repeated
    flag = "--" + name.replace("_", "-")
    decls = (f"{flag}/--no-{flag[2:]}" if kind is bool else flag, *bind.flags) if bind.flags else ()  # none: typer's, --x/--no-x for a bool
    help = field.description + (" Repeat the option for each value." if to_field is repeated else "")
    info = typer.Option(*decls, help=help, metavar="|".join(choices) if choices else None)  # as typed: the values are case-sensitive
    return Opt(name, bind.path, Annotated[kind, info], value, to_field)


def repeated(values):
    """A repeatable option's values as the field's tuple (None: none given, the config's own)."""
    return tuple(values) if values else None


@dataclass(frozen=True)
class Block:
    """Options several commands share (the LLM's, the encoder's): declared once here."""

    opts: tuple[Opt, ...]

    @classmethod
    def of(cls, config, *extra: Opt, **names: str | Bind) -> Block:
        """Options generated from ``config``'s fields (option name -> field), and ``extra``
        ones a command computes its field from."""
        return cls(tuple(option(config, n, b) for n, b in names.items()) + extra)

    def at(self, prefix: str) -> Block:
        """The same options setting fields under ``prefix`` (``llm`` in RetrieveConfig)."""
        return Block(tuple(replace(o, path=f"{prefix}.{o.path}" if prefix else o.path) for o in self.opts))

    def aliased(self, **flags: str) -> Block:
        """Extra flags for some options (``llm_model="--model"``: decompose's older names)."""
        out = []
        for o in self.opts:
            if o.name in flags:
                base, info = o.annotation.__origin__, o.annotation.__metadata__[0]
                own = info.param_decls or ("--" + o.name.replace("_", "-"),)
                info = typer.Option(*own, flags[o.name], help=info.help, metavar=info.metavar)
                o = replace(o, annotation=Annotated[base, info])
            out.append(o)
        return Block(tuple(out))


LLM = Block.of(
    LLMConfig,
    Opt("compiled", "enforce_eager", Annotated[bool, typer.Option(help="Compiled graphs (slow start, faster steps) instead of eager.")],
        not default(LLMConfig, "enforce_eager"), lambda v: not v),
    llm_model="model", llm_dtype="dtype", llm_max_model_len="max_model_len", tensor_parallel_size="tensor_parallel_size",
    llm_cache="cache", actors="actors", cpus_per_actor="cpus_per_actor", gpus_per_actor="gpus_per_actor", llm_batch_rows="batch_rows",
)
"""The LLM's options: every command with an LLM stage takes them (``LLM.at("llm")``)."""

EMBED = Block.of(EmbedConfig, model="model", backend="backend")
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
    flags: dict[str, str] = dataclass_field(default_factory=dict)  # path -> the option as this command spells it (--max-model-len)

    def flags_under(self, prefix: str = "") -> dict[str, str]:
        """:attr:`flags` of the part under ``prefix`` (``llm``), by the path inside it."""
        head = f"{prefix}." if prefix else ""
        return {path.removeprefix(head): flag for path, flag in self.flags.items() if path.startswith(head)}

    def data(self, prefix: str = "") -> dict[str, Any]:
        """The config as a nested mapping, in the module docstring's order; ``prefix``: the
        part under that key (``llm``), for a command that builds sub-configs alone."""
        out: dict[str, Any] = {}
        for path, value in self.values.items():
            if path not in self.given and value is not None:  # a None default leaves the config's own (None or required)
                put(out, path, value)
        if self.file is not None:
            _merge(out, read_file(self.file))
        for path in self.given:
            put(out, path, self.values[path])
        for key in filter(None, prefix.split(".")):
            out = out.get(key, {})
        return out

    def __getitem__(self, path: str) -> Any:
        """One field's value as the config will get it (file and command line applied)."""
        node: Any = self.data()
        for key in path.split("."):
            node = node[key]
        return node


def _spelling(param: Any) -> str:
    """How a user types ``param`` (a click parameter): its long flags (``--llm-max-model-len``;
    an option with an older name too: ``--llm-max-model-len/--max-model-len``), or an
    argument's name as help shows it (``corpus``)."""
    return "/".join(o for o in param.opts if o.startswith("--")) or param.name


def put(tree: dict, path: str, value: Any) -> None:
    """Set ``value`` at a dotted ``path`` of a config's mapping, making each parent a mapping
    where it is absent or not one (``index:`` left empty in a file reads as null)."""
    *parents, leaf = path.split(".")
    for key in parents:
        if not isinstance(tree.get(key), dict):  # absent, or null in a config file (judge: null, then --judge-llm)
            tree[key] = {}
        tree = tree[key]
    tree[leaf] = value


def _merge(into: dict, other: dict) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def configured(*blocks: Block, config=None, file: bool = False, **own: str | Bind | tuple[str, Callable]):
    """Bind a command's options to the fields of ``config`` (None: sub-configs named by the
    paths' first part, ``embed``, ``llm``, ``ray``) and add the shared ``blocks`` (and
    ``--config`` with ``file``) to its options. ``own``: option name -> the field it sets. An
    option the command's signature does not declare is generated from its field
    (:func:`option`); one it declares (an argument, or an option whose field the command
    computes: ``(path, to_field)``) keeps the command's declaration. The command gets the
    binding as its keyword-only ``bound`` argument, which the command line does not see."""

    def deco(fn):
        sig = inspect.signature(fn, eval_str=True)
        names = {p for p in sig.parameters if p != "bound"}
        declared = []  # (name, path, to_field) of the options the command declares itself
        opts = []
        for name, spec in own.items():
            if name in names:
                path, to_field = spec if isinstance(spec, tuple) else (spec.path if isinstance(spec, Bind) else spec, None)
                field_at(config, path)  # a path that names no field fails here, at import
                declared.append((name, path, to_field))
            elif isinstance(spec, tuple):
                raise TypeError(f"{fn.__name__}: option {name!r} computes its field, so the command declares it")
            else:
                opts.append(option(config, name, spec))
        opts += [o for b in blocks for o in b.opts]
        extra = [o.parameter() for o in opts] + ([CONFIG_FILE.parameter()] if file else [])
        params = [p for p in sig.parameters.values() if p.name != "bound"]
        context = inspect.Parameter("_ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)  # typer passes it
        params = [context] + [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params] + [
            p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in extra]
        bindings = [*declared, *((o.name, o.path, o.to_field) for o in opts)]

        @functools.wraps(fn)
        def wrapper(_ctx: typer.Context, **kwargs):
            values, given = {}, set()
            spelled = {p.name: _spelling(p) for p in _ctx.command.params}
            for name, path, to_field in bindings:
                value = kwargs[name]
                values[path] = to_field(value) if to_field else value
                source = _ctx.get_parameter_source(name)
                if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):  # given: on the command line or by an env var
                    given.add(path)
            path = kwargs.pop("config", None) if file else None
            for o in opts:
                kwargs.pop(o.name)
            flags = {path: spelled[name] for name, path, _ in bindings if name in spelled}
            return fn(**kwargs, bound=Bound(values, frozenset(given), path, flags))

        wrapper.__signature__ = sig.replace(parameters=params)
        # tests walk these: option -> (path, to_field), which of them are generated, and the config the paths are in
        wrapper.bindings = {n: (p, f) for n, p, f in bindings}
        wrapper.generated = frozenset(o.name for o in opts)
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
