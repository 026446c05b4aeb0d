"""An LLM stage's work in shards of queries, each written as it finishes, so a killed job resumes.

Why: a stage's output is cached only whole (pipelines/retrieval/runner.py), and at millions of truth
prompts (OrLog at 100k queries x top 20 x 3 atoms is an hour of 8 GPUs) a failure in the
last minute would lose the hour; the per-node prompt cache (pipelines/llm/cache.py) helps only
on the same node and still sends every prompt through the driver.

How: the stage's units (its queries, in the order it reads them) are cut into shards of
``shard_queries`` consecutive ones (:class:`logicrank.pipelines.config.settings.LLMConfig`). Shards go to the LLM in
waves of ``wave_shards`` (default two per engine actor): one call of the pool per wave, so
every engine has work, and the driver holds one wave's prompts at a time. Each finished shard
is written atomically to ``<stage cache dir>.partial/shard-NNNNN.parquet`` (extra tables of
the shard beside it as ``shard-NNNNN.<name>.parquet``, written first: the main file is the
shard's commit), tagged with the stage's cache key and the digest of its query ids, so a shard
of another input (another key, or the same key cut at another ``shard_queries``) is never
read. A rerun reads the shards it has and computes only the rest: a killed job loses at most
the wave in flight. The runner caches the whole output and removes the directory when the
stage completes (:meth:`logicrank.pipelines.retrieval.runner.StageCache.put`).

Without a checkpoint (a notebook without a cache directory) the units are computed in one
pass.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from logicrank.pipelines.files import READ_ERRORS, write_parquet_atomic
from logicrank.pipelines.retrieval.stages.base import Checkpoint, Context

META = b"logicrank.shard"  # the schema metadata key of a shard's tag
Tables = dict[str, pa.Table]  # one shard's output: its main table first, then any others by name
Compute = Callable[[list[list[str]]], list[Tables]]  # a wave of shards (each its unit ids) -> each shard's tables


def cut(units: Sequence[str], size: int) -> list[list[str]]:
    """Consecutive runs of ``size`` units (the last one shorter)."""
    return [list(units[i : i + size]) for i in range(0, len(units), size)]


def shard_path(where: Path, shard: int, part: str | None = None) -> Path:
    return where / (f"shard-{shard:05d}.parquet" if part is None else f"shard-{shard:05d}.{part}.parquet")


def tag(key: str, ids: Sequence[str]) -> dict:
    """What a shard file must carry to be read: the stage's key and its units' digest."""
    return {"key": key, "ids": hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest(), "units": len(ids)}


def write_shard(where: Path, shard: int, shard_tag: dict, tables: Tables) -> None:
    """The shard's extra tables, then its main table carrying the tag (and the extras' names):
    each atomically, the main one last, so a shard is whole once its main file exists. A main
    file there from before (another cut of the units, under the same key) goes first: left
    beside this write's extras by a crash, it would be read with them."""
    names = list(tables)
    shard_path(where, shard).unlink(missing_ok=True)
    for name in names[1:]:
        write_parquet_atomic(tables[name], shard_path(where, shard, name))
    main = tables[names[0]]
    meta = {**(main.schema.metadata or {}), META: json.dumps({**shard_tag, "parts": names}).encode()}
    write_parquet_atomic(main.replace_schema_metadata(meta), shard_path(where, shard))


def read_tag(where: Path, shard: int) -> dict | None:
    """A shard file's tag; None when it is missing, unreadable or untagged (computed again)."""
    path = shard_path(where, shard)
    if not path.is_file():
        return None
    try:
        meta = pq.read_schema(path).metadata or {}
    except READ_ERRORS:
        return None
    return json.loads(meta[META]) if META in meta else None


def finished(where: Path, key: str, shards: Sequence[Sequence[str]]) -> list[int]:
    """The shards whose file holds this key's output of these very units."""
    out = []
    for i, ids in enumerate(shards):
        held = read_tag(where, i)
        if held is not None and {k: held.get(k) for k in ("key", "ids", "units")} == tag(key, ids):
            out.append(i)
    return out


def read_shard(where: Path, shard: int) -> Tables:
    """A finished shard's tables, its tag taken off again (the output equals a computed one)."""
    main = pq.read_table(shard_path(where, shard))
    meta = dict(main.schema.metadata or {})
    names = json.loads(meta.pop(META))["parts"]
    out = {names[0]: main.replace_schema_metadata(meta or None)}
    for name in names[1:]:
        out[name] = pq.read_table(shard_path(where, shard, name))
    return out


def settings(ctx: Context) -> tuple[int, int]:
    """(queries per shard, shards per wave) from the job's LLM config."""
    cfg = ctx.llm_service().cfg
    return cfg.shard_queries, cfg.wave_shards or 2 * cfg.actors


def in_shards(ctx: Context, units: Sequence[str], compute: Compute, label: str) -> tuple[list[Tables], dict]:
    """Every shard's tables, in the units' order, and the counts for the manifest.

    With ``ctx.checkpoint`` the shards already written for its key are read, the rest computed
    in waves and each written as it finishes (a progress line per shard on ``ctx.echo``);
    without one, all units are computed in one pass (one shard, nothing written)."""
    if ctx.checkpoint is None:
        return (compute([list(units)]) if units else []), {}
    size, wave = settings(ctx)
    return run_shards(ctx.checkpoint, cut(units, size), compute, wave, label, ctx.echo)


def run_shards(checkpoint: Checkpoint, shards: list[list[str]], compute: Compute, wave: int, label: str,
               echo: Callable[[str], None] | None = None) -> tuple[list[Tables], dict]:
    """:func:`in_shards` with its shards and wave size given."""
    where, n = checkpoint.where, len(shards)
    done = set(finished(where, checkpoint.key, shards))
    if done and echo:
        echo(f"{label}: {len(done)} of {n} shards read from checkpoints ({where})")
    todo = [i for i in range(n) if i not in done]
    out: dict[int, Tables] = {i: read_shard(where, i) for i in sorted(done)}
    for start in range(0, len(todo), wave):
        group = todo[start : start + wave]
        results = compute([shards[i] for i in group])
        if len(results) != len(group):
            raise RuntimeError(f"{label}: {len(group)} shards in, {len(results)} out (a bug)")
        for i, tables in zip(group, results, strict=True):
            write_shard(where, i, tag(checkpoint.key, shards[i]), tables)
            out[i] = tables
            if echo:
                echo(f"{label}: shard {i + 1} of {n} written ({len(out)} of {n} done)")
    return [out[i] for i in range(n)], {"shards": n, "shard_units": max((len(s) for s in shards), default=0), "shards_resumed": len(done)}
