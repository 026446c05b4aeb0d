"""The one override grammar: ``KEY=VALUE``, the value read as YAML (``5`` a number, ``null`` a
None, ``[a, b]`` a list), parsed here and nowhere else; ``none`` is None for an option that has
no ``none`` value of its own (``itlr.ann_nprobes=none``; ``itlr.calibration=none`` is the
calibration ``none``), alike on the command line and in a file.

A stage option is addressed by the stage's name: ``STAGE.OPTION=VALUE`` sets OPTION in every
stage named STAGE of every pipeline (the sub-pipelines a fusion runs included), and
``RUN/STAGE.OPTION=VALUE`` in pipeline RUN alone, whatever the order the keys are given in
(stage and option names hold no dots, run ids may: a key splits at its last dot)::

    orlog.k=20            itlr.scorer=bm25            orlog/bm25.k=50

The command line (``logicrank retrieve --set``, ``logicrank experiment --set``), experiment
files (their ``set:`` mapping) and the Python API (``lr.read_pipelines(spec, set={...})``) all go
through :func:`parse_sets` and :func:`set_stage_options`. Each value is validated by the
stage's own options model; a mistake is one line naming the key and what exists.

A run's depth (documents kept per query; Pyserini's ``--hits``) is set by ``--k N``, which is
these overrides and nothing else (:func:`depth_sets`): ``RUN/STAGE.k=N`` for the last stage of
each pipeline that keeps a top k, and, where that stage fuses sub-pipelines, for theirs too::

    --method hybrid --k 1000   =   --set hybrid/rrf.k=1000 --set hybrid/dense.k=1000 --set hybrid/bm25.k=1000
    --method orlog --k 1000    =   --set orlog/orlog.k=1000   (still BM25's top 20 reranked: --set orlog/bm25.k=N)

A key sets every stage of its name in the run, so a run whose depth stage's name also stands
before another stage (``[[bm25, reasoner], [bm25]]`` fused) is refused: --k would deepen that
stage's candidates too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from logicrank.pipelines.retrieval.options import StageOptions
from logicrank.schemas.errors import UserError, validation_line


class OverrideError(UserError, ValueError):
    """An override that names no stage or option of the pipelines, or a value its option refuses."""


Pipelines = Mapping[str, Sequence[StageOptions]]


def parse_sets(items: Iterable[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """``KEY=VALUE`` items (or a mapping of them, as an experiment file's ``set:``) as
    {KEY: value}, each value read as YAML (:func:`~logicrank.pipelines.files.load_yaml`)."""
    import yaml

    from logicrank.pipelines.files import load_yaml

    if not items:
        return {}
    if isinstance(items, Mapping):
        out = {str(k).strip(): v for k, v in items.items()}
        if len(out) < len(items):  # two keys that differ only by spaces (or 1 and "1"): which one holds would be the order
            twice = sorted(k for k in out if sum(str(j).strip() == k for j in items) > 1)
            raise OverrideError(f"set: {twice[0]} given twice; give each key once")
        return out
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise OverrideError(f"--set {item!r}: give KEY=VALUE (e.g. orlog.k=20, or RUN/STAGE.OPTION=VALUE for one pipeline)")
        if key.strip() in out:  # which one holds would be the order the options were given in
            raise OverrideError(f"--set {key.strip()}: given twice; give each key once")
        try:
            out[key.strip()] = load_yaml(value)
        except yaml.YAMLError as exc:
            raise OverrideError(f"--set {item!r}: the value is not valid YAML ({' '.join(str(exc).split())[:160]})") from None
    return out


def is_stage_key(key: str, pipelines: Pipelines) -> bool:
    """Whether ``key`` addresses a stage option (``STAGE.OPTION`` or ``RUN/STAGE.OPTION``)
    rather than another place (an experiment's ``dataset.sample``)."""
    from logicrank.pipelines.retrieval.stages import stages

    target, _, _ = key.rpartition(".")
    return "/" in target or target in stages() or any(_named(p, target) for p in pipelines.values())


def set_stage_options(pipelines: Pipelines, changes: Mapping[str, Any]) -> dict[str, tuple[StageOptions, ...]]:
    """``pipelines`` with each ``[RUN/]STAGE.OPTION`` of ``changes`` set (module docstring); a
    key that names no stage of the pipelines, or an option the stage does not have, raises
    :class:`OverrideError` listing what there is."""
    out = {name: tuple(stages) for name, stages in pipelines.items()}
    groups: dict[tuple[str | None, str], dict[str, tuple[Any, str]]] = {}  # (run or None, stage) -> option -> (value, key)
    for key, value in changes.items():
        target, dot, option = key.rpartition(".")
        run, slash, stage = target.rpartition("/")
        if not dot or not option or not stage or "." in option:
            raise OverrideError(f"--set {key}: give STAGE.OPTION=VALUE or RUN/STAGE.OPTION=VALUE (e.g. orlog.k=20)")
        if slash and run not in out:
            raise OverrideError(f"--set {key}: no pipeline {run!r}; pipelines: {', '.join(out)}")
        names = [run] if slash else list(out)
        if not any(_named(out[n], stage) for n in names):
            held = sorted({s for n in names for s in _stage_names(out[n])})
            raise OverrideError(f"--set {key}: no stage {stage!r} in {'pipeline ' + repr(run) if slash else 'the pipelines'}; "
                                f"their stages: {', '.join(held)}")
        groups.setdefault((run if slash else None, stage), {})[option] = (value, key)
    # every pipeline's keys first, then one pipeline's (RUN/STAGE.OPTION wins whatever the order
    # given); a stage's options set together are validated together
    for (run, stage), options in sorted(groups.items(), key=lambda g: g[0][0] is not None):
        for n in [run] if run is not None else list(out):
            out[n] = _set(out[n], stage, options)
    for n, stages in out.items():
        _check_fused_depth(tuple(pipelines[n]), stages)
    return out


def depth_sets(pipelines: Pipelines, k: int) -> dict[str, int]:
    """``--k N`` as overrides (module docstring): the final depth of every run. A reranker's
    candidates are not deepened, so its run holds at most what it reranks; the reports state each
    run's depth as it came out. A pipeline with no stage that keeps a top k is refused, and one
    whose depth stage's name also names a stage before another (its key would set both)."""
    out: dict[str, int] = {}
    for run, stages in pipelines.items():
        depth = depth_stages(stages)
        if not depth:
            raise OverrideError(f"--k {k}: pipeline {run!r} ({' -> '.join(o.stage for o in stages)}) has no stage that keeps a top k; "
                                "drop --k, or add a cut stage (cut: {k: N})")
        names = _stage_names(stages)
        # a key sets every stage of its name in the run: one that is also another's candidates would be deepened too
        shared = next((o.stage for o in depth if names.count(o.stage) > sum(d.stage == o.stage for d in depth)), None)
        if shared:
            raise OverrideError(f"--k {k}: pipeline {run!r} holds stage {shared!r} as a run's last stage and also before another stage "
                                f"(its candidates); {run}/{shared}.k would set both, so give each depth in the pipeline file instead")
        out.update(dict.fromkeys((f"{run}/{o.stage}.{type(o).depth_option}" for o in depth), k))
    return out


def with_depth(changes: Mapping[str, Any], pipelines: Pipelines, k: int | None) -> dict[str, Any]:
    """``changes`` (parsed ``--set`` items) with ``--k``'s (:func:`depth_sets`) added; a key of
    ``changes`` that sets one of the same options is refused, the depth being given twice."""
    if k is None:
        return dict(changes)
    depth = depth_sets(pipelines, k)
    for key in changes:
        target, _, option = key.rpartition(".")
        run, slash, stage = target.rpartition("/")
        same = [d for d in depth if d.endswith(f"/{stage}.{option}") and (not slash or d.startswith(f"{run}/"))]
        if same:
            raise OverrideError(f"--k {k} and --set {key} both set {same[0].partition('/')[2]} (--k is {' '.join(f'--set {d}={k}' for d in same)}); "
                                "give the depth once")
    return {**changes, **depth}


def depth_stages(stages: Sequence[StageOptions]) -> list[StageOptions]:
    """The stages that set the depth of ``stages``' run: its last stage that keeps a top k and,
    where that stage fuses sub-pipelines, theirs (a fusion keeps no more than it fuses)."""
    for o in reversed(stages):
        if type(o).depth_option in type(o).model_fields:
            return [o, *(d for f in type(o).model_fields for sub in _subs(getattr(o, f)) for d in depth_stages(sub))]
    return []


def _check_fused_depth(before: Sequence[StageOptions], after: Sequence[StageOptions]) -> None:
    """An override that raises a fusion's ``k`` past every one of its sub-pipelines' depths
    would fuse fewer documents than it keeps: refused, naming the stages to deepen too (a file
    may fuse shallow lists on purpose; an override that deepens the fused run alone is a slip)."""
    for old, new in zip(before, after, strict=True):
        subs = _subs(getattr(new, "of", None))
        if not subs or getattr(new, "k", None) is None or getattr(new, "k", None) == getattr(old, "k", None):
            continue
        depths = [d for sub in subs if (d := next((getattr(o, "k", None) for o in reversed(sub) if getattr(o, "k", None) is not None), None))]
        if depths and new.k > max(depths):
            deepen = " ".join(f"--set {sub[-1].stage}.k={new.k}" for sub in subs)
            raise OverrideError(f"--set {new.stage}.k={new.k}: the {new.stage} fuses runs {max(depths)} deep at most, fewer than the {new.k} it "
                                f"keeps; deepen them too ({deepen}), or keep k within {max(depths)}")


def _stage_names(stages: Sequence[StageOptions]) -> list[str]:
    names = []
    for o in stages:
        names.append(o.stage)
        for f in type(o).model_fields:
            names += [s for sub in _subs(getattr(o, f)) for s in _stage_names(sub)]
    return names


def _named(stages: Sequence[StageOptions], stage: str) -> bool:
    return stage in _stage_names(stages)


def _subs(value: Any) -> list[tuple[StageOptions, ...]]:
    """The sub-pipelines an option holds (a fusion's ``of``), else []."""
    if isinstance(value, tuple) and value and all(isinstance(p, tuple) and all(isinstance(s, StageOptions) for s in p) for p in value):
        return list(value)
    return []


def _set(stages: Sequence[StageOptions], stage: str, options: Mapping[str, tuple[Any, str]]) -> tuple[StageOptions, ...]:
    """``stages`` with ``options`` (option -> (value, the key that set it)) set in every stage
    named ``stage``, sub-pipelines included; each changed stage validated once."""
    out = []
    for o in stages:
        fields = type(o).model_fields
        data = {f: getattr(o, f) for f in fields}
        for f in fields:
            if _subs(data[f]):
                data[f] = tuple(_set(sub, stage, options) for sub in data[f])
        mine = o.stage == stage
        if mine:
            for option, (value, key) in options.items():
                if option not in fields or option == "stage":
                    raise OverrideError(f"--set {key}: stage {stage!r} has no option {option!r}; its options: "
                                        f"{', '.join(f for f in fields if f != 'stage')}")
                data[option] = value
        if data == {f: getattr(o, f) for f in fields}:
            out.append(o)
            continue
        try:
            out.append(_validated(type(o), data, list(options) if mine else []))
        except ValidationError as exc:
            given = " ".join(f"{key}={value}" for value, key in options.values()) if mine else "(a sub-pipeline)"
            raise OverrideError(f"--set {given}: {validation_line(exc, name=lambda loc: '')}") from None
    return tuple(out)


def _validated(cls: type[StageOptions], data: dict, options: Sequence[str]) -> StageOptions:
    """``cls`` from ``data``; the word ``none`` set on one of ``options`` that has no such value of
    its own is None."""
    nones = {o: None for o in options if data.get(o) in ("none", "None") and not _takes_word(cls, o)}
    return cls.model_validate({**data, **nones})


def _takes_word(cls: type[StageOptions], option: str) -> bool:
    """Whether the option accepts the string ``none`` itself (a Literal holding it)."""
    from typing import get_args

    def words(t: Any) -> list:
        return [w for a in get_args(t) for w in ([a] if isinstance(a, str) else words(a))]

    return "none" in words(cls.model_fields[option].annotation)
