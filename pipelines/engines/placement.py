"""How work is split over a cluster, decided from its description alone (the jobs place the
actors): the embedding pool of the index job, from the nodes' resources; how many shards a
bulk retriever searches in, each shard one search actor holding one range of the documents'
mapped index (bm25 and dense's exact search), sized so each stays within
``ray.retrieve_shard_bytes``."""

from __future__ import annotations

from dataclasses import dataclass

from logicrank.pipelines.config.settings import EmbedConfig, RayConfig
from logicrank.schemas.errors import UserError


class ShardError(UserError, RuntimeError):
    """Shards asked of an index that cannot be searched in shards."""


def shard_count(stage, store, ray: RayConfig) -> int | None:
    """How many search actors a per-query retriever runs on, each holding one shard of
    ``store``: ``ray.retrieve_shards`` when given (1: one actor holding the whole index), else
    as many as keep each within ``ray.retrieve_shard_bytes`` of the index's mapped files; None
    (not sharded: the driver or the pool, as ``ray.retrieve_actors`` says) when the index fits
    one or the database keeps no mapped index (not a local directory). Only bm25 and dense's
    exact search shard."""
    import math

    if not getattr(stage, "shardable", False) or getattr(stage.options, "search", "exact") != "exact":
        return None
    if ray.retrieve_shards is not None:
        require_mapped(store, ray.retrieve_shards)
        return ray.retrieve_shards
    if not is_mapped(store):  # each shard would read the whole index into memory: searched whole instead
        return None
    needed = math.ceil(index_bytes(stage, store) / ray.retrieve_shard_bytes)
    return needed if needed > 1 else None


def is_mapped(store) -> bool:
    """Whether the store's engines are saved and mapped (a local database directory)."""
    from logicrank.pipelines.engines.bm25 import index_root

    return index_root(store) is not None


def require_mapped(store, shards: int) -> None:
    if shards > 1 and not is_mapped(store):
        raise ShardError(f"retrieve: --shards needs a database in a local directory (shards map its saved index); with {store.uri!r} "
                               f"each of the {shards} shards would read the whole index into memory. Search unsharded (no --shards).")


def index_bytes(stage, store) -> int:
    """Bytes of the index files a whole search of this stage maps (saved first where missing)."""
    if stage.name == "bm25":
        index = store.bm25_index()
        return index.mapped_bytes() if hasattr(index, "mapped_bytes") else index.nbytes()
    return store.vectors(stage.options.precision).nbytes()


@dataclass(frozen=True)
class EncoderPlacement:
    """The embedding actor pool: how many, what each needs, and how that was decided."""

    actors: int
    num_cpus: float
    num_gpus: float
    how: str


IN_DRIVER = "driver (one CPU node: its encoder uses every core)"


def encoder_placement(config: RayConfig, nodes: list[dict], reserve_cpus: float, embed: EmbedConfig | None = None,
                      driver_node: str | None = None) -> EncoderPlacement:
    """Size the embedding pool from ``config`` and the cluster's alive ``nodes`` (``ray.nodes()``).

    Given values are kept. Otherwise: where the cluster has GPUs (and ``embed`` does not ask for
    the CPU: device cpu or backend openvino), one encoder per GPU (1 CPU each); without GPUs, one encoder per node offering ``embed_resources``, each holding the
    smallest such node's CPUs less the reader's ``reserve_cpus`` (1.5 on two cores: fractional,
    so the reader fits beside it) and encoding with every core of its node. One encoder per node
    rather than one per core: on two cores, two single-threaded OpenVINO encoders index
    SciFact at 0.50x the speed of one two-threaded encoder (docs/bulk-retrieval.md, Placement).

    A cluster of one CPU node that is the driver's own (``driver_node``, its node id) gets no
    pool at all (0 actors, :data:`IN_DRIVER`): the driver's encoder uses every core of that node
    as the one actor would, without the pool's start and the batches' transfers.
    """
    custom = dict(config.embed_resources)
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    hosts = [r for r in alive if all(r.get(k, 0) >= v for k, v in custom.items())] or alive
    gpus_total = sum(r.get("GPU", 0) for r in hosts)
    on_cpu = embed is not None and (embed.device == "cpu" or embed.backend == "openvino")
    gpus = config.embed_num_gpus if config.embed_num_gpus is not None else (1.0 if gpus_total >= 1 and not on_cpu else 0.0)
    if config.embed_actors is not None:
        cpus = config.embed_num_cpus if config.embed_num_cpus is not None else 1.0
        return EncoderPlacement(config.embed_actors, cpus, gpus, "given")
    if gpus > 0:
        cpus = config.embed_num_cpus if config.embed_num_cpus is not None else 1.0
        fit = sum(int(r.get("GPU", 0) // gpus) for r in hosts)  # per node: a fraction of a GPU does not span two
        return EncoderPlacement(max(1, fit), cpus, gpus, "one per GPU" if gpus == 1 else f"{gpus:g} GPU each")
    cpu_hosts = [n for n in nodes if n.get("Alive", True) and n.get("Resources", {}).get("CPU", 0) > 0]
    if (driver_node is not None and not custom and config.embed_num_cpus is None and len(cpu_hosts) == 1
            and cpu_hosts[0].get("NodeID") == driver_node):
        return EncoderPlacement(0, 0.0, 0.0, IN_DRIVER)
    node_cpus = [r["CPU"] for r in hosts if r.get("CPU", 0) > 0] or [1.0]
    smallest = min(node_cpus)
    cpus = config.embed_num_cpus if config.embed_num_cpus is not None else max(smallest - reserve_cpus, min(smallest, 0.5))
    return EncoderPlacement(len(node_cpus), cpus, 0.0, "one per node")
