"""The settings every job shares and the job configs that need no registry.

Every job reads one of these at start; a bad value fails here, before Ray starts or
a model loads. The same config runs on a laptop and on a Ray cluster: placement
(address, actors, GPUs) is configuration, never a code fork.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from logicrank.pipelines.config.base import OUTSIDE, UNHASHED
from logicrank.pipelines.config.base import Config as _Config
from logicrank.pipelines.config.embedding import EmbedConfig  # noqa: F401 - every job config beside the others
from logicrank.schemas.digest import json_digest


def distinct(v: tuple[str, ...]) -> tuple[str, ...]:
    """A job's methods: at least one, each once."""
    if not v:
        raise ValueError("give at least one method")
    if len(set(v)) != len(v):
        raise ValueError(f"methods repeat: {list(v)}")
    return v


def _resource_pairs(v, name: str) -> tuple[tuple[str, float], ...]:
    """A mapping of custom Ray resources as sorted (name, amount) pairs: the config stays
    hashable and its digest stable."""
    pairs = tuple(sorted(dict(v).items())) if isinstance(v, dict) else tuple(tuple(p) for p in v)
    for key, amount in pairs:
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):  # (checked before pydantic's own: a mode="before" check)
            raise ValueError(f"{name}: {key!r} asks for {amount!r}; an amount is a number, e.g. {key}: 1")
        if amount < 0:
            raise ValueError(f"{name}: {key!r} asks for {amount}; amounts must be >= 0")
    return pairs


class RayConfig(_Config):
    """Where the Ray work runs and how it is placed."""

    address: str | None = Field(None, description="Ray cluster address; None starts a local cluster.")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the local cluster (ignored with address).")
    object_store_memory: int = Field(1 << 30, ge=1 << 26)
    embed_actors: int | None = Field(
        None, ge=1, description="Size of the embedding actor pool; None: sized to the cluster (on a local cluster of one "
        "CPU node none: the driver encodes with every core; else one encoder per GPU, or one per node, each with its node's "
        "cores; see docs/bulk-retrieval.md, Placement)."
    )
    embed_num_cpus: float | None = Field(
        None, ge=0, description="CPUs per embedding actor (fractions allowed); None: 1 with GPUs or a given pool size, else the "
        "smallest node's CPUs less the reader's share."
    )
    embed_num_gpus: float | None = Field(
        None, ge=0, description="GPUs per embedding actor; None: 1 where the cluster has GPUs, else 0."
    )
    embed_resources: tuple[tuple[str, float], ...] = Field(
        (), description="Custom Ray resources per embedding actor, e.g. {'embed': 1}: only nodes offering them host one."
    )
    batch_rows: int = Field(512, ge=1, description="Rows per Ray Data batch into the embedder.")
    block_bytes: int = Field(1 << 20, ge=1 << 12, description="Target Ray Data block size: small blocks spread work over actors.")

    retrieve_actors: int | None = Field(
        None, ge=1, description="Size of the bulk-retrieval actor pool (dense, bm25 over query batches); None: as many as the "
        "cluster's free CPUs hold, and a job small enough for retrieve_local_s runs in the driver instead."
    )
    retrieve_num_cpus: float = Field(1.0, gt=0, description="CPUs per retrieval actor.")
    retrieve_local_s: float = Field(
        30.0, ge=0, description="With retrieve_actors None: a bulk retrieval whose work, timed on its first queries in the driver, "
        "would take at most this many seconds there finishes there (a pool costs seconds to start); so does one that encodes "
        "queries on a single node without GPUs, whatever its size (the driver's encoder already uses every core); 0: always the pool."
    )
    retrieve_batch_rows: int = Field(
        1024, ge=1, description="Queries per retrieval batch (the encoder batches within it; results do not depend on it)."
    )
    retrieve_shards: int | None = Field(
        None, ge=1, description="Search shards of bm25 and dense (exact): this many actors, each holding one range of the index's "
        "documents with the collection's statistics whole, their top k merged exactly; None: as many as the index needs to keep "
        "each shard within retrieve_shard_bytes (one when it fits, and the pool or the driver as retrieve_actors says).",
        json_schema_extra=UNHASHED,
    )
    retrieve_shard_bytes: int = Field(
        4 << 30, ge=1 << 20, description="The most bytes of an index one search actor maps (the BM25 weights and ids, or the vectors); "
        "an index past it is searched in shards (docs/bulk-retrieval.md, Shards).", json_schema_extra=UNHASHED,
    )

    _resources = field_validator("embed_resources", mode="before")(lambda v: _resource_pairs(v, "embed_resources"))


class IndexConfig(_Config):
    corpus: str = Field(description="Corpus path or pyarrow filesystem URI (BEIR dir, JSONL(.gz), Parquet, TREC SGML(.gz), TSV(.gz)).")
    db: str = Field(description="LanceDB directory or URI.")
    table: str = Field("docs", description="The table in the LanceDB directory.")
    format: Literal["auto", "beir", "jsonl", "parquet", "trec", "tsv"] = Field(
        "auto", description="auto: each file's kind from its name; trec or tsv also read files whose name marks no format."
    )
    embed: EmbedConfig = EmbedConfig()
    # Added after digests were stored, and they change results: left out of every dump (so of every digest)
    # while at their defaults, so the index digests nights hold stay valid (not config/base.py's markers: the
    # code that makes vectors imports that module, and an edit there would embed every stored document again)
    vector_column: str | None = Field(
        None, min_length=1, description="Precomputed vectors: the JSONL field or Parquet column holding each document's vector; nothing is embedded.",
        exclude_if=lambda v: v is None,
    )
    vector_model: str = Field(
        "external", description="With vector_column: the model that made the vectors, recorded in the table; queries are encoded by it "
        "when it is a registered model or a local model directory (external: dense stages are refused).",
        exclude_if=lambda v: v == "external",
    )
    vector_dim: int | None = Field(
        None, ge=1, description="With vector_column: each vector's dimension, for a new table (else the table's, or the named model's).",
        exclude_if=lambda v: v is None,
    )
    ray: RayConfig = Field(RayConfig(), json_schema_extra=OUTSIDE)
    delete_missing: bool = Field(True, description="Delete documents absent from this snapshot.")
    max_delete_fraction: float = Field(
        0.1, ge=0, le=1, description="Refuse a snapshot that would delete more than this fraction of the table."
    )
    allow_mass_delete: bool = Field(False, description="Delete past max_delete_fraction (an empty snapshot still deletes nothing).")
    prune_after_hours: float = Field(
        168.0, ge=0, description="After a successful run, prune untagged table versions older than this (tagged ones never).",
        json_schema_extra=OUTSIDE,
    )
    keep_index_tags: int = Field(
        30, ge=1, description="Keep the newest N tags this job made itself (index-<time>); older ones are dropped so their versions can be pruned."
    )
    max_reject_fraction: float = Field(0.01, ge=0, le=1, description="Fail when more than this fraction of the snapshot's rows is rejected.")
    max_doc_bytes: int = Field(1 << 20, ge=1, description="Title + text larger than this is rejected.")
    write_batch_rows: int = Field(4096, ge=1, description="Rows per LanceDB commit.")
    writes: Literal["workers", "driver"] = Field(
        "workers", description="Who writes new documents' rows: the encoder workers, as Lance data files the driver commits (no text "
        "or vector of a new document reaches the driver), or the driver itself. Updates are the driver's keyed merges either way.",
        json_schema_extra=UNHASHED, exclude_if=lambda v: v == "workers",
    )
    bm25_workers: int = Field(
        0, ge=0, description="Ray tasks building the BM25 index's segments at once, spread over the cluster (the database at the "
        "same path on every node; docs/bulk-retrieval.md); 0: segment after segment, in a process beside the driver (in the driver "
        "below 50,000 rows). The same index either way.", json_schema_extra=UNHASHED,
        exclude_if=lambda v: v == 0,
    )
    ann_threshold: int = Field(100_000, ge=1, description="With ann: build the ANN index from this many rows; exact below.")
    tag: str | None = Field(None, description="LanceDB tag for this index run; default index-<time>.")
    # YAML reads an unquoted 2026-11-25 as a date: the tag is the date written (a number or a time is refused: quote it)
    _tag = field_validator("tag", mode="before")(lambda v: v.isoformat() if type(v).__name__ == "date" else v)

    @field_validator("tag")
    @classmethod
    def _tag_name(cls, v: str | None) -> str | None:
        """A tag LanceDB can make and the job does not keep for itself, checked before the run
        (LanceDB refused it at the run's very end)."""
        from logicrank.pipelines.engines.store.versions import tag_problem

        if v is not None and (why := tag_problem(v)):
            raise ValueError(f"{v!r} cannot tag a version: {why}")
        return v

    # UNHASHED: the index digests nights hold leave it out, so those digests stay valid
    ann: bool = Field(
        False, description="Build LanceDB's ANN index (IVF_HNSW_SQ) once the table has ann_threshold rows. Off: no ANN index is "
        "built (dense retrieval searches exactly); one the table already has is still updated in place each run.",
        json_schema_extra=UNHASHED,
    )
    rebuild_indexes: bool = Field(
        False, description="Rebuild every index of the table from its rows this run (the ANN index retrained) instead of "
        "updating them in place: after many runs of changes, or to fold the full-text indexes' statistics anew.",
        json_schema_extra=UNHASHED,
    )

    @model_validator(mode="after")
    def _vectors_need_their_column(self):
        if self.vector_column is None and (self.vector_model != "external" or self.vector_dim is not None):
            raise ValueError("vector_model and vector_dim describe precomputed vectors: give vector_column (--vector-column) too")
        return self

    def ann_from(self) -> int | None:
        """The row count from which the table keeps an ANN index; None: it builds none."""
        return self.ann_threshold if self.ann else None


class LLMConfig(_Config):
    """One vLLM engine. On this CPU: the prepared SmolLM2, float32, eager. On a GPU cluster:
    a checkpoint directory, ``dtype=auto``/``bfloat16``, ``enforce_eager=False``,
    ``tensor_parallel_size`` = GPUs per engine (and as many GPUs per Ray actor)."""

    model: str = Field("smollm2-135m-instruct", description="The LLM: a registered model name (prepared locally) or a checkpoint directory.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: float32 on CPU (bf16 logits are too coarse for True/False scoring there), the model's own on GPU."
    )
    max_model_len: int = Field(2048, ge=64, description="Context length (tokens) of the engine: a prompt and its output.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per vLLM engine (tensor parallel).")
    enforce_eager: bool = Field(True, description="Eager start-up takes seconds; compiled graphs take minutes on CPU.")
    enable_prefix_caching: bool = True
    block_size: int | None = Field(
        None, ge=16, description="KV cache block (tokens), the unit of prefix caching; CPU needs a multiple of 32. None: 32 on CPU, vLLM's default on GPU."
    )
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    cpu_kv_cache_gib: int = Field(1, ge=1, description="KV cache on CPU (VLLM_CPU_KVCACHE_SPACE).")
    max_num_seqs: int = Field(64, ge=1, description="Sequences per engine step.")
    seed: int = 0
    chat: bool = Field(True, description="Wrap generation prompts in the tokenizer's chat template, when it has one.")
    labels: tuple[str, str] = Field((" True", " False"), description="truth(): the label tokens read after the prompt.")
    cache: str | None = Field(
        "default", description="Persistent cache (SQLite) path; 'default': <cache root>/llm/cache.sqlite; 'none' (or null): off.", json_schema_extra=OUTSIDE
    )
    # placement of the job's one engine pool (jobs/llm_service.py); none of it changes a result
    actors: int = Field(1, ge=1, description="Engines (Ray actors) in the job's one LLM pool.", json_schema_extra=OUTSIDE)
    cpus_per_actor: float = Field(1.0, gt=0, description="CPUs Ray reserves per engine actor (its threads on a CPU node: see cpu_threads).", json_schema_extra=OUTSIDE)
    gpus_per_actor: float | None = Field(
        None, ge=0, description="GPUs per engine actor; None: tensor_parallel_size on a cluster with GPUs, 0 without.", json_schema_extra=OUTSIDE
    )
    resources: tuple[tuple[str, float], ...] = Field((), description="Custom Ray resources per engine actor, e.g. {'llm': 1}.", json_schema_extra=OUTSIDE)
    batch_rows: int = Field(64, ge=1, description="Prompts per actor call (one batched engine call).", json_schema_extra=OUTSIDE)
    shard_queries: int = Field(
        256, ge=1, description="LLM stages with a stage cache directory: queries per shard, each shard's output written as it "
        "finishes so a killed job resumes from it (docs/llm.md, 'Shards and resume').", json_schema_extra=UNHASHED,
    )
    wave_shards: int | None = Field(
        None, ge=1, description="Shards sent to the pool in one call; None: two per engine actor (every engine has work). "
        "A killed job loses at most one wave.", json_schema_extra=UNHASHED,
    )
    engine_process: Literal["inline", "separate"] = Field(
        "inline", description="inline: vLLM's engine core runs in the actor's process (starts in seconds on CPU); separate: in a child "
        "process of the actor (vLLM's own default, which overlaps scheduling with the forward pass on GPUs).", json_schema_extra=OUTSIDE
    )
    cpu_threads: int | None = Field(
        None, ge=1, description="OpenMP/torch threads of a CPU engine; None: a pool actor's node's CPUs shared among the pool's engines there, "
        "never fewer than cpus_per_actor (jobs/llm_service.py engine_threads); an engine outside a pool: the cores its process may "
        "run on. No effect on GPUs.",
        json_schema_extra=UNHASHED,
    )
    cpu_binding: Literal["none", "vllm"] = Field(
        "none", description="A CPU engine's threads: none: not pinned, and sleeping while they wait (OMP_WAIT_POLICY=PASSIVE), so "
        "an engine keeps its pace beside other busy processes on a shared node; vllm: vLLM's own binding (each thread pinned to "
        "a core vLLM picks, spinning while it waits; tests/perf/bench_engine_load.py measures both).", json_schema_extra=UNHASHED,
    )
    max_engine_restarts: int = Field(
        3, ge=0, description="Engine deaths (an engine that stopped inside its live actor) a pool restarts, per engine actor it has: "
        "past max_engine_restarts x actors deaths in one pool, the job fails.", json_schema_extra=OUTSIDE
    )

    _resources = field_validator("resources", mode="before")(lambda v: _resource_pairs(v, "resources"))
    # the command line's ways to say null (and YAML's None, which it reads as a string): the cache off, never a file so named
    _cache_off = field_validator("cache", mode="before")(lambda v: None if isinstance(v, str) and v.strip().lower() in ("none", "null", "~", "")
                                                          else v)

    def engine_digest(self) -> str:
        """The digest of what changes the engine's outputs (placement and the cache path do not):
        the settings and the installed vLLM (:func:`engine_versions`), so stage outputs and rerun
        checks made under one vLLM are never taken for another's. ``dtype: auto`` is keyed as the
        engine will run it where this environment's torch is built: float32 with a CPU-only
        torch (vllm-cpu's), vLLM's own choice with a GPU's (``auto@gpu``, as the prompt cache
        keys it), so a CPU run's are never taken for a GPU run's."""
        parts: list = [self.outcome_digest(), {"engine": engine_versions()}]
        if self.dtype == "auto":
            from logicrank.pipelines.torch_build import cpu_only

            parts.append({"dtype": "float32" if cpu_only() else "auto@gpu"})
        return json_digest(parts)


def engine_versions() -> list[str]:
    """The installed vLLM as ``distribution=version`` (``vllm`` on a GPU node, ``vllm-cpu``
    here), read from the package metadata without importing it: part of every LLM output's key
    (the prompt cache's, :func:`logicrank.pipelines.llm.engine.engine_code`; a stage's and a
    rerun check's, :meth:`LLMConfig.engine_digest`)."""
    import contextlib
    from importlib import metadata

    versions = []
    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions.append(f"{dist}={metadata.version(dist)}")
    return versions


def same_file(a: str, b: str) -> bool:
    """Whether two paths name the same file (as given, or resolved)."""
    from pathlib import Path

    return a == b or Path(a).resolve() == Path(b).resolve()


class EvaluateConfig(_Config):
    qrels: str | None = Field(None, description="Qrels of the runs (BEIR TSV or dir, TREC qrels); needed when runs are given.")
    runs: tuple[str, ...] = Field((), description="Run tables (Parquet) or TREC run files.")
    measures: tuple[str, ...] = Field(
        ("nDCG@10", "P@1", "R@100", "MRR", "MAP", "F1@10"), min_length=1,
        description="Measure names, e.g. nDCG@10 P@1 R@100 MRR MAP F1@10, any ir_measures name (Bpref, Judged@10, IPrec@0.5...) or "
                    "trec_eval's (ndcg_cut_10, map...).")
    answers: tuple[str, ...] = Field((), description="Answer tables (Parquet with query_id, answer, e.g. answers/<run_id>.parquet) or JSONL; run id = the file's stem.")
    gold: str | None = Field(None, description="Gold answers (answers.jsonl of `logicrank prepare-qa`, or its BEIR dir); needed with answers.")
    qa_measures: tuple[str, ...] = Field(("EM", "TokenF1", "Acc"), min_length=1, description="QA measures of the answers: EM TokenF1 Acc Judge.")
    judge: LLMConfig | None = Field(None, description="The LLM of the Judge QA measure (None: Judge is not available).")
    ray: RayConfig = Field(RayConfig(), description="Where the Judge's LLM pool runs (unused otherwise).")
    baseline: str | None = Field(None, description="run_id to test the others against; default the first.")
    test: Literal["t-test", "randomisation"] = Field("t-test", description="The paired significance test of each run against the baseline.")
    correction: Literal["holm", "bonferroni", "bh"] = Field("holm", description="Multiple-comparison correction over the runs compared.")
    alpha: float = Field(0.05, gt=0, lt=1)
    dedupe: bool = Field(False, description="Keep each repeated (query, doc) pair's best-ranked row instead of refusing the run.")
    ignore_identical_ids: bool = Field(
        False, description="Drop the rows whose document id is their query's id before measuring, as BEIR's evaluation does (ArguAna and "
                           "Quora hold each query in the corpus); off: scored as trec_eval scores them, with a note where a run has such rows.")
    empty_runs: Literal["refuse", "zero"] = Field(
        "refuse", description="A run file with no rows: refused (a file given by mistake), or evaluated as a run that retrieved nothing, "
                              "every query 0, under the file's stem as its run id (an experiment's own runs: a method that found nothing).")
    names: dict[str, str] = Field({}, description="Run id -> run file (--name NEWID=FILE): the file's run is evaluated under this run id; "
                                  "a file not among runs is added to them. The file must hold one run; the id must be no other run's.")

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data):
        """``names`` as given on the command line (``NEWID=FILE`` strings) or in a file (a
        mapping); each named file joins ``runs`` when it is not among them."""
        if not isinstance(data, dict) or not data.get("names"):
            return data
        given = data["names"]
        pairs = []
        if not isinstance(given, dict | list | tuple | str):
            raise ValueError(f"names: a mapping of run ids to run files (NEWID: FILE) is required, got {given!r}")
        if isinstance(given, dict):  # a config file's mapping: YAML may make a key a number (1: run.tsv) or a value null
            for newid, path in given.items():
                if isinstance(newid, float):  # its text is not what was typed (1.50 reads as 1.5)
                    raise ValueError(f"names: the run id {newid!r} was read as a number: quote it ('{newid}': FILE)")
                if not isinstance(newid, str | int) or isinstance(newid, bool) or not str(newid).strip():
                    raise ValueError(f"names: the run id {newid!r} is not a name; give each run file a run id (NEWID: FILE)")
                if not isinstance(path, str) or not path.strip():
                    raise ValueError(f"names: {newid}: {path!r} is not a run file's path")
                pairs.append((str(newid).strip(), path.strip()))
        if not isinstance(given, dict):
            for text in [given] if isinstance(given, str) else given:
                newid, sep, path = str(text).partition("=")
                if not sep or not newid.strip() or not path.strip():
                    raise ValueError(f"--name takes NEWID=FILE (a run id, then the run file), got {str(text)!r}")
                pairs.append((newid.strip(), path.strip()))
        names: dict[str, str] = {}
        where = "names:" if isinstance(given, dict) else "--name"  # a config file's key, or the option
        for newid, path in pairs:
            if newid in names:
                raise ValueError(f"{where} {newid}: given twice ({names[newid]} and {path}); give each file its own run id")
            if any(same_file(path, other) for other in names.values()):
                raise ValueError(f"{where}: {path} named twice; a file's run gets one run id")
            names[str(newid)] = str(path)
        runs = tuple(data.get("runs") or ())
        added = tuple(path for path in names.values() if not any(same_file(path, r) for r in runs))
        return {**data, "names": names, "runs": runs + added}

    def run_id_for(self, path: str) -> str | None:
        """The run id --name gives the run in ``path`` (None: it keeps its own)."""
        return next((newid for newid, named in self.names.items() if same_file(named, path)), None)

    @model_validator(mode="after")
    def _something_to_evaluate(self):
        if not self.runs and not self.answers:
            raise ValueError("give runs (with qrels) or answers (with gold) to evaluate")
        if self.runs and not self.qrels:
            raise ValueError("runs need qrels")
        if self.qrels and not self.runs:
            raise ValueError(f"qrels {self.qrels} given without runs (a run given alone is read as the qrels: give QRELS RUN...)")
        if self.answers and not self.gold:
            raise ValueError("answers need gold (the answers.jsonl of `logicrank prepare-qa`)")
        return self


class GenerateConfig(_Config):
    """`logicrank generate itlr`: ITLR's real-corpus recipe over an indexed table
    (pipelines/generate/realcorpus.py). Everything that changes the dataset is here, so the
    same config and table give the same dataset; placement (``llm.actors``, ``ray``) does not
    change it."""

    db: str = Field(description="LanceDB directory of the indexed corpus (`logicrank index`); required.")
    table: str = Field("docs", description="The table in the LanceDB directory.")
    docs: int = Field(32, ge=3, description="Documents sampled (seeded) for topics.")
    shard_docs: int = Field(8, ge=3, description="Documents per shard: the unit of work and of checkpoints.")
    questions_per_shard: int = Field(8, ge=1, description="Logical queries filled from each shard's topics.")
    max_topics: int = Field(3, ge=1, le=10, description="Topics kept per document.")
    seed: int = Field(0, description="Seed of every draw: the documents sampled, the templates' slots filled.")
    topic_tokens: int = Field(96, ge=8, description="Token budget of a document's topic list.")
    question_tokens: int = Field(64, ge=8, description="Token budget of a question.")
    document_tokens: int = Field(320, ge=16, description="A document cut to this many tokens in the topic and label prompts.")
    candidates: tuple[Literal["dense", "bm25", "itlr"], ...] = Field(("dense", "bm25", "itlr"), min_length=1, description="Retrievers proposing documents to label (itlr: with the gold logical form).")
    candidate_k: int = Field(10, ge=1, le=1000, description="Top k of each retriever; their union is judged.")
    dedup_threshold: float = Field(0.95, gt=0, le=1, description="Near duplicates: question embeddings' cosine above this.")
    label_threshold: float = Field(0.5, gt=0, lt=1, description="A pair is relevant (qrels) when P(True) >= this.")
    wave_shards: int | None = Field(None, ge=1, description="Shards sent to the LLM pool at once (None: 2 per engine actor); a killed run loses at most one wave's work.",
                                    json_schema_extra=OUTSIDE)
    demo_note: str | None = Field(None, description="A sentence the card prints in bold (e.g. that a small model made a demo, not a benchmark).",
                                  json_schema_extra=OUTSIDE)
    embed: EmbedConfig = EmbedConfig()
    llm: LLMConfig = LLMConfig()
    ray: RayConfig = Field(RayConfig(), json_schema_extra=OUTSIDE)

    _distinct = field_validator("candidates")(lambda v: distinct(v))

    @model_validator(mode="after")
    def _shards_are_generate_s(self):
        """generate cuts its work by documents (shard_docs) and sends wave_shards of those shards
        at once; the LLM stages' own shard options would be ignored without a word, so they are
        refused. A value equal to the default passes: a config written out whole (model_dump_json,
        every field set) must read back."""
        fields = type(self.llm).model_fields
        if ignored := [f"llm.{f}" for f in ("shard_queries", "wave_shards") if getattr(self.llm, f) != fields[f].default]:
            raise ValueError(f"generate does not read {' or '.join(ignored)} (the retrieval stages' shards): "
                             "its shards are shard_docs documents, sent wave_shards at once")
        return self

    def dataset_digest(self) -> str:
        """What changes the dataset: placement, the wave size, the LLM cache and the note do not."""
        return self.outcome_digest()
