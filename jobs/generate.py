"""`logicrank generate itlr`: ITLR's real-corpus recipe as a Ray job over an indexed table.

Phases (the logic is in :mod:`logicrank.pipelines.generate.realcorpus`; this module runs it):

1. sample ``docs`` documents (seeded, from the table's sorted ids) and cut them into shards
   of ``shard_docs``;
2. per shard, on the job's LLM pool: topics, logical queries, questions;
3. deduplicate the questions (exact, then near by embedding cosine);
4. candidates: ``logicrank retrieve`` with the configured retrievers (ITLR with the gold
   form), top k each, union;
5. per shard of questions, on the LLM pool: one truth prompt per (question, candidate);
6. the dataset: ``queries.jsonl``, ``qrels/test.tsv``, ``labels.parquet``, ``corpus.json``,
   ``card.md``, ``generation.json``, ``manifest.json``.

Shards go to the pool in waves (``wave_shards``, default two per engine actor), so every
engine has work; each finished shard is written once, atomically, to
``checkpoints/{topics,questions,labels}/shard-NNNNN.parquet`` and never rewritten
(append-only). A killed run, rerun with the same config, reads the shards it has and does
the rest: nothing is computed twice into the dataset, nothing is lost. A run directory holding
another config's or another table version's checkpoints is refused. The same config and table
give the same dataset (greedy decoding, seeded sampling, every ordering by id).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from logicrank.jobs.rundir import RunDir
from logicrank.jobs.watchdog import beat
from logicrank.pipelines.config.settings import GenerateConfig, LLMConfig
from logicrank.pipelines.engines.store import DocStore
from logicrank.pipelines.files import write_parquet_atomic, write_text_atomic
from logicrank.pipelines.generate import realcorpus as rc
from logicrank.pipelines.generate.synthetic import TEMPLATES
from logicrank.schemas.digest import json_digest

PROMPTS = ("gen_topics", "gen_question", "gen_relevance")
# the card's note when the generator is the bundled plumbing model
DEMO_NOTE = ("Generated with SmolLM2-135M: a demo of the pipeline, not a benchmark; its questions and labels are not a dataset to "
             "report numbers on.")


def _shard_file(kind: str, shard: int) -> str:
    return f"checkpoints/{kind}/shard-{shard:05d}.parquet"


def run_generate(cfg: GenerateConfig, out: str | Path, echo: Callable[[str], None] = print, progress: bool = False) -> dict:
    """Returns the counts (also ``generation.json``)."""
    from logicrank.jobs.llm_service import LLMService
    from logicrank.jobs.raysession import ray_session
    from logicrank.pipelines.engines.embed import model_id
    from logicrank.pipelines.engines.vector_models import require_query_model

    out = Path(out)
    t0 = time.perf_counter()
    store = DocStore(cfg.db, cfg.table)
    if not store.exists():
        raise rc.GenerateError(f"generate: {store.absent()}; check --db and --table, or index a corpus first (`logicrank index`)")
    store, note = store.readable(None, "generate")  # the last version a completed index run finished, as retrieve reads
    if note:
        echo(note)
    if set(cfg.candidates) - {"bm25"}:  # dense and itlr encode the questions
        require_query_model(store, model_id(cfg.embed), "generate")
    if "bm25" in cfg.candidates:
        from logicrank.pipelines.engines.bm25 import ensure_index

        ensure_index(store)  # the BM25 index of this version, made once here rather than by every actor
    sample = rc.sample_docs(store, cfg.docs, cfg.seed)
    shards = rc.shard(sample, cfg.shard_docs)
    llm = LLMService(cfg.llm, echo=echo if progress else None)  # an unknown model fails here, before the directory is claimed
    _claim(out, checkpoints_state(cfg, store, llm.model_id))
    wave = cfg.wave_shards or 2 * cfg.llm.actors
    timings: dict[str, float] = {}
    with ray_session(cfg.ray, llm=llm):
        try:
            t = time.perf_counter()
            done = _questions_phase(cfg, out, store, shards, llm, wave, echo)
            timings["questions"] = time.perf_counter() - t
            questions = pa.concat_tables([pq.read_table(out / _shard_file("questions", s)) for s in range(len(shards))]).combine_chunks()
            t = time.perf_counter()
            kept, dropped = rc.dedup_questions(cfg, questions)
            timings["dedup"] = time.perf_counter() - t
            queries_path = out / "checkpoints" / "queries.jsonl"
            rc.write_queries(kept, queries_path)
            if _crowded(cfg):  # the retrievers' actors need the CPUs the engines hold: the next request starts the pool again
                llm.release()
            t = time.perf_counter()
            candidates = _candidates(cfg, store, queries_path, out)
            timings["candidates"] = time.perf_counter() - t
            t = time.perf_counter()
            labelled, done["label_shards_resumed"] = _labels_phase(cfg, out, store, kept, candidates, llm, wave, echo)
            timings["labels"] = time.perf_counter() - t
        finally:
            llm_counts = llm.close()
    labels = pa.concat_tables([pq.read_table(out / _shard_file("labels", s)) for s in labelled]).combine_chunks() if labelled else rc.LABELS.empty_table()
    counts = _finish(cfg, out, store, shards, kept, dropped, labels, llm, llm_counts, done, timings, t0)
    echo(f"generate: {counts['questions']} questions ({counts['dedup']['exact']} exact and {counts['dedup']['near']} near duplicates removed), "
         f"{counts['labels']['pairs']} pairs judged, {counts['labels']['relevant']} relevant -> {out}")
    return counts


def _crowded(cfg: GenerateConfig) -> bool:
    import ray

    return ray.available_resources().get("CPU", 0.0) < cfg.ray.retrieve_num_cpus


def generator_code() -> str:
    """The digest of the recipe's code (pipelines/generate/realcorpus.py and what it imports:
    the templates, the parsing of topics, the draw) and of this job's own source (what each
    call asks: the prompts' inputs, constraints and token budgets, and the label records):
    checkpoints another code wrote are not resumed (a changed draw gives other queries under
    the same ids). This module's imports (the LLM pool, the Ray session) are not in it: a fix
    there resumes."""
    from logicrank.pipelines.codedigest import code_digest, source_digest

    return json_digest([code_digest(rc.__name__), source_digest(__name__)])


def checkpoints_state(cfg: GenerateConfig, store: DocStore, model_id: str) -> dict:
    """What a run's checkpoints depend on (``checkpoints/state.json``): a run resumes from them
    only where this is unchanged. The table's version and when it was made (a table dropped and
    indexed again reuses version numbers); the engine as it runs (``dtype: auto`` is float32 on a
    CPU, the GPU's own there: a run stopped on one and resumed on the other kept the first's
    shards and went on at the other precision)."""
    from logicrank.pipelines.llm import prompts

    return {"dataset_digest": cfg.dataset_digest(), "table_version": store.version, "table_made": store.version_made(), "model": model_id,
            "engine": cfg.llm.engine_digest(), "prompts": {p: prompts.load(p).sha for p in PROMPTS}, "generator": generator_code()}


def _claim(out: Path, state: dict) -> None:
    path = out / "checkpoints" / "state.json"
    if path.is_file():
        held = json.loads(path.read_text(encoding="utf-8"))
        if held != state:
            raise rc.GenerateError(f"generate: {out} holds the checkpoints of another config, table version, engine or generator code "
                                   f"({held}); give a new --out, or remove that directory to start over")
        return
    write_text_atomic(json.dumps(state) + "\n", path)


def _questions_phase(cfg: GenerateConfig, out: Path, store: DocStore, shards: list[list[str]], llm, wave: int, echo) -> dict:
    """Topics and questions of every shard not yet checkpointed; returns what was resumed."""
    from logicrank.pipelines.llm import prompts
    from logicrank.pipelines.llm.engine import Constraint

    todo = [s for s in range(len(shards)) if not (out / _shard_file("questions", s)).is_file()]
    resumed = {"shards": len(shards), "question_shards_resumed": len(shards) - len(todo)}
    if resumed["question_shards_resumed"]:
        echo(f"generate: {resumed['question_shards_resumed']} of {len(shards)} shards' questions read from checkpoints")
    for n, group in enumerate(rc.waves(todo, wave), 1):
        topics: dict[int, pa.Table] = {}
        need = [s for s in group if not (out / _shard_file("topics", s)).is_file()]
        if need:
            ids = [d for s in need for d in shards[s]]
            rows, texts = rc.document_texts(store, ids, str(llm.resolved.path), cfg.document_tokens)
            gens = llm.generate(prompts.load("gen_topics"), [{"document": texts[d]} for d in ids],
                                Constraint("json", rc.topics_schema(cfg.max_topics)), cfg.topic_tokens, 0.0, None, label="generate:topics")
            by_doc = dict(zip(ids, map(rc.output_text, gens), strict=True))
            for s in need:
                recs = [rc.topic_row(d, s, by_doc[d], rows[d]["title"], rows[d]["text"], cfg.max_topics) for d in shards[s]]
                write_parquet_atomic(pa.Table.from_pylist(recs, schema=rc.TOPICS), out / _shard_file("topics", s))
        for s in group:
            topics[s] = pq.read_table(out / _shard_file("topics", s))
        drafts = {s: rc.fill_templates(s, dict(zip(topics[s].column("doc_id").to_pylist(), topics[s].column("topics").to_pylist(), strict=True)),
                                       cfg.questions_per_shard, cfg.seed) for s in group}
        flat = [d for s in group for d in drafts[s]]
        gens = llm.generate(prompts.load("gen_question"), [{"logical_query": d.logical_query} for d in flat],
                            Constraint("regex", rc.QUESTION_REGEX), cfg.question_tokens, 0.0, None, label="generate:questions")
        by_id = {d.query_id: rc.output_text(g) for d, g in zip(flat, gens, strict=True)}
        for s in group:
            recs = [rc.question_row(d, s, by_id[d.query_id]) for d in drafts[s]]
            write_parquet_atomic(pa.Table.from_pylist(recs, schema=rc.QUESTIONS), out / _shard_file("questions", s))
        echo(f"generate: questions, wave {n}: shards {group[0]}-{group[-1]} of {len(shards)} written")
        beat(f"generate: questions wave {n} written")
    return resumed


def _candidates(cfg: GenerateConfig, store: DocStore, queries: Path, out: Path) -> dict[str, dict[str, list[str]]]:
    """query_id -> doc_id -> the retrievers that proposed it (union of each one's top k), from
    the table version the job pinned at its start (an index run finished since is not read)."""
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.config.retrieval import RetrieveConfig
    from logicrank.pipelines.retrieval.pipeline import parse_stages

    if not queries.read_text(encoding="utf-8").strip():
        return {}
    pipelines = {name: parse_stages([{name: {"k": cfg.candidate_k}}]) for name in cfg.candidates}
    runs = run_retrieve(RetrieveConfig(queries=str(queries), db=cfg.db, table=cfg.table, table_version=store.version, embed=cfg.embed,
                                       ray=cfg.ray, pipelines=pipelines),
                        out / "checkpoints" / "candidates", progress=False)
    found: dict[str, dict[str, list[str]]] = {}
    for name in cfg.candidates:
        run = pq.read_table(runs[name], columns=["query_id", "doc_id"])
        for q, d in zip(run.column("query_id").to_pylist(), run.column("doc_id").to_pylist(), strict=True):
            found.setdefault(q, {}).setdefault(d, []).append(name)
    return found


def _labels_phase(cfg: GenerateConfig, out: Path, store: DocStore, kept: pa.Table, candidates: dict, llm, wave: int, echo) -> tuple[list[int], int]:
    """Truth labels of every (question, candidate) pair, by shard of questions; returns the
    shards labelled and how many of them were read from checkpoints."""
    from logicrank.pipelines.llm import prompts

    by_shard: dict[int, list[dict]] = {}
    for r in kept.select(["query_id", "shard", "text"]).to_pylist():  # shard: the question's, as drafted
        by_shard.setdefault(r["shard"], []).append(r)
    shards = sorted(by_shard)
    want = {s: {(q["query_id"], d, tuple(candidates.get(q["query_id"], {})[d])) for q in by_shard[s] for d in candidates.get(q["query_id"], {})}
            for s in shards}
    written = [s for s in shards if (out / _shard_file("labels", s)).is_file()]
    todo = [s for s in shards if s not in written or label_pairs(out / _shard_file("labels", s)) != want[s]]
    if len(todo) < len(shards):
        echo(f"generate: {len(shards) - len(todo)} of {len(shards)} shards' labels read from checkpoints")
    other = [s for s in written if s in todo]
    if other:  # the questions kept, or their candidates, are not those it labelled (another host's near-duplicate call)
        echo(f"generate: {len(other)} label checkpoint(s) hold other pairs than the kept questions' candidates (shards "
             f"{', '.join(map(str, other[:5]))}{', ...' if len(other) > 5 else ''}): labelled again")
    template = prompts.load("gen_relevance")
    for n, group in enumerate(rc.waves(todo, wave), 1):
        pairs = [(q, d, candidates.get(q["query_id"], {})[d]) for s in group for q in by_shard[s] for d in sorted(candidates.get(q["query_id"], {}))]
        _, texts = rc.document_texts(store, sorted({d for _, d, _ in pairs}), str(llm.resolved.path), cfg.document_tokens)
        res = llm.truth(template, [{"document": texts[d], "question": q["text"]} for q, d, _ in pairs], label="generate:labels")
        # every label of the wave made before any is written: a refused one (a NaN) leaves none of the wave's shards
        recs = [{"query_id": q["query_id"], "doc_id": d, "sources": src, "p_true": r.p_true, "logit_true": r.logit_true,
                 "logit_false": r.logit_false, "exact": r.exact, "shard": q["shard"],
                 "label": rc.label(r.p_true, r.logit_true, r.logit_false, r.exact, cfg.label_threshold, f"question {q['query_id']!r}, doc {d!r}")}
                for (q, d, src), r in zip(pairs, res, strict=True)]
        for s in group:
            write_parquet_atomic(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "shard"} for r in recs if r["shard"] == s],
                                                      schema=rc.LABELS), out / _shard_file("labels", s))
        echo(f"generate: labels, wave {n}: {len(pairs)} pairs of shards {group[0]}-{group[-1]} written")
        beat(f"generate: labels wave {n} written")
    return shards, len(shards) - len(todo)


def label_pairs(path: Path) -> set[tuple[str, str, tuple[str, ...]]] | None:
    """The (question, document, candidate runs that found it) triples a label checkpoint
    holds; None where it cannot be read (it is labelled again)."""
    from logicrank.pipelines.files import READ_ERRORS

    try:
        t = pq.read_table(path, columns=["query_id", "doc_id", "sources"])
    except READ_ERRORS:
        return None
    return {(q, d, tuple(src)) for q, d, src in zip(*(t.column(c).to_pylist() for c in ("query_id", "doc_id", "sources")), strict=True)}


def _finish(cfg: GenerateConfig, out: Path, store: DocStore, shards, kept: pa.Table, dropped: dict, labels: pa.Table, llm, llm_counts: dict,
            resumed: dict, timings: dict, t0: float) -> dict:
    from logicrank.pipelines.engines.embed import model_id
    from logicrank.pipelines.llm import prompts

    rundir = RunDir(out, "generate")
    labels = labels.sort_by([("query_id", "ascending"), ("doc_id", "ascending")])
    write_parquet_atomic(labels, out / "labels.parquet")
    write_text_atomic((out / "checkpoints" / "queries.jsonl").read_text(encoding="utf-8"), out / "queries.jsonl")
    rel = labels.filter(pa.compute.equal(labels.column("label"), 1))
    write_text_atomic("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in zip(rel.column("query_id").to_pylist(),
                      rel.column("doc_id").to_pylist(), strict=True)), out / "qrels" / "test.tsv")
    corpus = {"db": cfg.db, "table": cfg.table, "version": store.version, "documents": store.count(), "encoder": model_id(cfg.embed),
              "title_sep": store.title_sep()}
    write_text_atomic(json.dumps(corpus, indent=1) + "\n", out / "corpus.json")
    topics = pa.concat_tables([pq.read_table(out / _shard_file("topics", s)) for s in range(len(shards))])
    drafted = pa.concat_tables([pq.read_table(out / _shard_file("questions", s), columns=["status"]) for s in range(len(shards))])
    qs = kept
    per_query = Counter({q: 0 for q in qs.column("query_id").to_pylist()})
    per_query.update(rel.column("query_id").to_pylist())
    templates = Counter(qs.column("template").to_pylist())
    counts = {
        "name": out.name, "config": cfg.model_dump(mode="json"), "config_hash": cfg.dataset_digest(), "model": llm.model_id,
        "encoder": model_id(cfg.embed), "prompts": {p: prompts.load(p).sha for p in PROMPTS}, "table_version": store.version,
        "corpus_docs": store.count(), "docs_sampled": cfg.docs, "shards": len(shards), "topics": sum(len(t) for t in topics.column("topics").to_pylist()),
        "topic_fallbacks": topics.column("status").to_pylist().count("fallback"), "drafted": drafted.num_rows,
        "question_fallbacks": drafted.column("status").to_pylist().count("fallback"),
        "dedup": {"exact": sum(v.startswith("exact") for v in dropped.values()), "near": sum(v.startswith("near") for v in dropped.values()),
                  "dropped": dropped},
        "questions": qs.num_rows,
        "per_template": {t.name: templates.get(t.name, 0) for t in TEMPLATES},
        "per_negations": {str(k): v for k, v in sorted(Counter(qs.column("negations").to_pylist()).items())},
        "labels": rc.label_counts(labels.column("p_true").to_pylist(), labels.column("label").to_pylist(), per_query,
                                  labels.column("exact").to_pylist(),
                                  list(zip(labels.column("logit_true").to_pylist(), labels.column("logit_false").to_pylist(), strict=True))),
        "demo_note": cfg.demo_note, "resumed": resumed, "llm": llm_counts,
        "timings": {k: round(v, 2) for k, v in timings.items()},
    }
    counts["seconds"] = round(time.perf_counter() - t0, 2)
    write_text_atomic(rc.card(counts), out / "card.md")
    # generation.json: what the dataset depends on, not where it ran (the fields declared outside the outcome)
    data_only = {**counts, "config": {k: v for k, v in counts["config"].items() if k not in GenerateConfig.outside()}}
    data_only["config"]["llm"] = {k: v for k, v in data_only["config"]["llm"].items() if k not in LLMConfig.outside()}
    write_text_atomic(json.dumps({k: v for k, v in data_only.items() if k not in ("name", "llm", "timings", "seconds", "resumed")}, indent=1, sort_keys=True) + "\n",
                      out / "generation.json")
    rundir.write_manifest(cfg.model_dump(mode="json"), cfg.digest(), {"table": corpus},
                          ["queries.jsonl", "qrels/test.tsv", "labels.parquet", "corpus.json", "card.md", "generation.json"],
                          model=llm.model_id, llm=llm_counts, counts={k: counts[k] for k in ("questions", "drafted", "shards")},
                          resumed=resumed, timings=counts["timings"])
    return counts
