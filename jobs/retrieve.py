"""`logicrank retrieve`: run queries against the LanceDB table with one or more methods.

Writes ``<out>/runs/<run_id>.parquet`` (RUN contract) per method, optionally a TREC run
file beside it, and a manifest. Skipped on rerun when the config, the queries and the
table version are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.rundir import RunDir, file_fingerprint, write_parquet_atomic
from pipelines.embed import Embedder, model_id, resolve_model
from pipelines.llm.decompose import apply_to_queries
from pipelines.logic.fuzzy import Operators
from pipelines.methods.bm25 import bm25
from pipelines.methods.dense import dense
from pipelines.methods.hybrid import rrf
from pipelines.methods.itlr import (
    Calibration,
    ann_candidates,
    parse_queries,
    score_candidates,
    score_exact,
    term_scores,
)
from pipelines.methods.ranking import rank_pairs
from pipelines.store import DocStore, StoreError
from pipelines.topics import TopicsError, read_queries, write_trec_run
from schemas.config import RetrieveConfig
from schemas.tables import RUN, conform


def run_retrieve(cfg: RetrieveConfig, out: str | Path, echo: Callable[[str], None] | None = None, progress: bool = True) -> dict[str, Path]:
    """Returns run_id -> run table path. ``echo`` (if given) receives notes (blank queries, a
    skipped rerun) and, with ``progress``, the progress lines of LLM scoring."""
    rundir = RunDir(out, "retrieve")
    queries, itlr_input, blank = _split_blank(read_queries(cfg.queries))
    if queries.num_rows == 0 and itlr_input.num_rows == 0:
        raise TopicsError(f"queries {cfg.queries}: every query's text is blank; give queries with text.")
    decompositions = pq.read_table(cfg.decompositions) if cfg.decompositions else None
    store = DocStore(cfg.db, cfg.table)
    needs_vectors = any(m in ("dense", "hybrid", "itlr", "expansion") for m in cfg.methods) or (
        any(m in ("orlog", "reasoner") for m in cfg.methods) and cfg.orlog_base in ("dense", "hybrid")
    )
    if needs_vectors:
        resolve_model(cfg.embed.model)
        if store.model_id() != model_id(cfg.embed):
            raise StoreError(
                f"retrieve: table {cfg.table!r} was embedded with {store.model_id()!r}; "
                f"queries would be embedded with {model_id(cfg.embed)!r}. Use the table's model (--model)."
            )
    run_ids = {m: f"{cfg.run_tag}-{m}" if cfg.run_tag else m for m in cfg.methods}
    outputs = {m: f"runs/{rid}.parquet" for m, rid in run_ids.items()}
    extra_outputs = [f"term_scores/{run_ids['itlr']}.parquet"] if "itlr" in cfg.methods else []
    extra_outputs += [f"predicate_scores/{run_ids['orlog']}.parquet"] if "orlog" in cfg.methods else []
    inputs = {"queries": file_fingerprint(cfg.queries), "table": {"db": cfg.db, "name": cfg.table, "version": store.version}}
    if cfg.labels:
        inputs["labels"] = file_fingerprint(cfg.labels)
    if cfg.decompositions:
        inputs["decompositions"] = file_fingerprint(cfg.decompositions)
    if blank and echo:
        echo(f"retrieve: {len(blank)} quer{'y has' if len(blank) == 1 else 'ies have'} a blank text and get no results "
             f"from the text methods (e.g. {blank[:3]}); they score 0 in evaluation.")
    if rundir.is_fresh(cfg.digest(), inputs):
        if echo:
            echo(f"retrieve: config, queries and table v{store.version} unchanged since the last run: skipped; runs in {rundir.path / 'runs'}")
        return {run_ids[m]: rundir.path / o for m, o in outputs.items()}

    embedder = None
    if needs_vectors:
        with rundir.timed("load_model"):
            embedder = Embedder(cfg.embed)
    cache: dict[tuple[str, int], pa.Table] = {}

    def scored(method: str, depth: int) -> pa.Table:
        """dense or bm25 to ``depth``, computed once (hybrid reuses them)."""
        if (method, depth) not in cache:
            with rundir.timed(f"{method}@{depth}"):
                cache[method, depth] = dense(queries, store, embedder, depth) if method == "dense" else bm25(queries, store, depth)
        return cache[method, depth]

    def hybrid(k: int) -> pa.Table:
        """RRF of dense and bm25 lists at least ``k`` deep, so the fused run can hold k results."""
        d = max(cfg.hybrid_depth, k)
        return rrf([scored("dense", d), scored("bm25", d)], k, cfg.rrf_k)

    produced: dict[str, pa.Table] = {}
    extra: dict = {}
    for method in cfg.methods:
        if method == "itlr":
            itlr_queries = apply_to_queries(queries, decompositions, "itlr") if decompositions is not None else itlr_input
            with rundir.timed("itlr"):
                pairs, scores, extra["itlr"] = _itlr(cfg, itlr_queries, store, embedder)
            run = rank_pairs(pairs, cfg.k, "itlr", run_ids["itlr"])
            write_parquet_atomic(scores, rundir.path / extra_outputs[0])
        elif method == "expansion":  # BRIGHT-style baseline: dense retrieval of the LLM's reasoning text
            with rundir.timed("expansion"):
                run = dense(apply_to_queries(queries, decompositions, "reasoning"), store, embedder, cfg.k)
        elif method in ("orlog", "reasoner"):
            base = hybrid(cfg.orlog_k) if cfg.orlog_base == "hybrid" else scored(cfg.orlog_base, cfg.orlog_k)
            with rundir.timed(method):
                pairs, predicates, cost = _orlog(cfg, method, queries, decompositions, store, base, echo if progress else None)
            run = rank_pairs(pairs, cfg.k, method, run_ids[method])
            extra[method] = cost
            if predicates is not None:
                write_parquet_atomic(predicates, rundir.path / f"predicate_scores/{run_ids[method]}.parquet")
        elif method == "hybrid":
            run = hybrid(cfg.k)
        else:
            run = scored(method, cfg.k)
        rid = run_ids[method]
        run = conform(run.set_column(run.schema.get_field_index("run_id"), "run_id", pa.array([rid] * run.num_rows, pa.string())), RUN, "retrieve")
        produced[rid] = run
        write_parquet_atomic(run, rundir.path / outputs[method])
        if cfg.trec:
            write_trec_run(run, rundir.path / f"runs/{rid}.trec")

    rundir.write_manifest(
        cfg.model_dump(mode="json"),
        cfg.digest(),
        inputs,
        list(outputs.values()) + extra_outputs,
        **extra,
        model=model_id(cfg.embed) if needs_vectors else None,
        rows={rid: t.num_rows for rid, t in produced.items()},
        queries=queries.num_rows + len(blank),
        blank_queries=len(blank),
        blank_query_ids=blank[:100],
        hybrid_depth=max(cfg.hybrid_depth, cfg.k),
    )
    return {run_ids[m]: rundir.path / o for m, o in outputs.items()}


def _split_blank(queries: pa.Table) -> tuple[pa.Table, pa.Table, list[str]]:
    """(queries for the text methods, queries for itlr, ids of queries whose text is blank).

    A blank text asks for nothing: every text method returns no results for it (rather than
    dense ranking the whole corpus by the empty string's vector while BM25 returns nothing).
    itlr still runs a blank-text query that carries its own logical form. Blank queries are
    counted in the manifest and score 0 in evaluation (trec_eval -c's rule for a query
    without results)."""
    import pyarrow.compute as pc

    def blank(col: pa.ChunkedArray) -> pa.ChunkedArray:
        return pc.fill_null(pc.equal(pc.utf8_trim_whitespace(col), ""), True)

    text_blank = blank(queries.column("text"))
    no_form = blank(queries.column("logical_query"))
    ids = queries.filter(text_blank).column("query_id").to_pylist()
    return queries.filter(pc.invert(text_blank)), queries.filter(pc.invert(pc.and_(text_blank, no_form))), ids


def _itlr(cfg: RetrieveConfig, queries: pa.Table, store: DocStore, embedder: Embedder):
    """ITLR pairs, their term scores, and counts for the manifest."""
    import numpy as np
    import pandas as pd

    parsed = parse_queries(queries)
    terms = list(dict.fromkeys(t for q in parsed for t in q.ast.terms()))
    term_vectors = embedder.encode(terms)  # each distinct term once, in one batch
    ops = Operators.parse(cfg.operators)
    calibration = _calibration(cfg, store, terms, term_vectors)
    if cfg.itlr_mode == "ann":
        candidates, exact_queries = ann_candidates(
            parsed, terms, term_vectors, lambda v, k: store.vector_search(v, k, with_vectors=True, nprobes=cfg.ann_nprobes), cfg.ann_k
        )
        frames = [score_candidates(parsed, terms, term_vectors, candidates, cfg.k, ops, calibration)]
    else:
        exact_queries, frames = parsed, []
    if exact_queries:
        blocks = store.vector_blocks(cfg.block_rows)
        frames.append(score_exact(exact_queries, terms, term_vectors, blocks, cfg.k, [ops], calibration)[ops])
    pairs = pd.concat(frames, ignore_index=True)
    vectors = store.vectors_for(pairs["doc_id"].unique().tolist())
    scores = term_scores(pairs, parsed, terms, term_vectors, vectors, calibration)
    fallback = [q.query_id for q in parsed if q.status == "fallback"]
    counts = {
        "queries": len(parsed),
        "fallback": len(fallback),
        "fallback_query_ids": fallback[:100],
        "unique_terms": len(terms),
        "mode": cfg.itlr_mode,
        "operators": str(ops),
        "calibration": calibration.name,
        "mean_candidates": float(np.mean([len(c[0]) for c in candidates.values()])) if cfg.itlr_mode == "ann" and candidates else None,
    }
    return pairs, scores, counts


def _orlog(cfg: RetrieveConfig, method: str, queries: pa.Table, decompositions, store: DocStore, base: pa.Table, echo=None):
    """OrLog or its LLM-as-reasoner baseline over ``base``'s top orlog_k: rerank pairs
    (score, tiebreak = base rank), predicate scores (orlog), and cost counts."""
    from jobs.score import score_truth
    from pipelines.methods import orlog

    cands = base.select(["query_id", "doc_id", "rank"]).to_pandas().rename(columns={"rank": "base_rank"})
    cands = cands[cands["base_rank"] <= cfg.orlog_k]
    docs = store.rows_for(cands["doc_id"].unique().tolist(), ["title", "text"]).to_pylist()
    names = {d["doc_id"]: (d["title"] or "").strip() or "This document" for d in docs}
    contexts = _contexts(cfg, docs) if cfg.orlog_context else {}
    score = lambda t: score_truth(  # noqa: E731
        pa.Table.from_pandas(t[["prompt_id", "context", "statement"]], preserve_index=False), cfg.llm, cfg.ray,
        cfg.score_actors, cfg.score_num_cpus, cfg.score_num_gpus, echo=echo and (lambda line: echo(f"{method}: {line}")),
    ).to_pandas()
    if method == "reasoner":
        prompts = orlog.reasoner_prompts(queries, cands, names, contexts)
        res = prompts.merge(score(prompts), on="prompt_id")
        pairs = res.assign(score=res["p_true"], tiebreak=res["base_rank"])
        return pairs, None, _cost(res, len(res), 0)
    qs = orlog.orlog_queries(queries, decompositions)
    prompts = orlog.truth_prompts(qs, cands, names, contexts)
    res = prompts.merge(score(prompts), on="prompt_id")
    cf, n_cf = None, 0
    if cfg.orlog_calibration == "content-free":
        cf_prompts = orlog.content_free_prompts(qs)
        cf = cf_prompts.merge(score(cf_prompts), on="prompt_id")
        n_cf = len(cf)
    res["p_calibrated"] = orlog.calibrate(res, cfg.orlog_calibration, cf)
    post = orlog.posteriors(qs, res, cfg.orlog_reasoner)
    pairs = post.assign(tiebreak=post["base_rank"])
    cost = _cost(res, int(len(cands)), n_cf)
    cost["fallback_decompositions"] = sum(q.status != "ok" for q in qs)
    return pairs, orlog.predicate_scores(res), cost


def _contexts(cfg: RetrieveConfig, docs: list[dict]) -> dict[str, str]:
    """Each candidate's title and text, cut to the token budget of the scoring model's tokenizer."""
    from transformers import AutoTokenizer

    from pipelines.llm.models import resolve

    tok = AutoTokenizer.from_pretrained(resolve(cfg.llm.model).path)
    out = {}
    for d in docs:
        text = f"{d['title'] or ''}. {d['text']}".strip(". ")
        ids = tok.encode(text, add_special_tokens=False)[: cfg.orlog_context_tokens]
        out[d["doc_id"]] = f"Document: {tok.decode(ids)}\n"
    return out


def _cost(res, pairs: int, extra_passes: int) -> dict:
    """Per (query, candidate) pair: forward passes, prompt tokens (and prefix-cache hits),
    generated tokens (one per pass: no decoding)."""
    passes = len(res) + extra_passes
    return {
        "pairs": pairs, "forward_passes": passes, "forward_passes_per_pair": passes / max(pairs, 1),
        "prompt_tokens": int(res["prompt_tokens"].sum()), "prefix_cached_tokens": int(res["cached_prompt_tokens"].sum()),
        "generated_tokens_per_pair": passes / max(pairs, 1), "llm_cache_hits": int(res["cached"].sum()),
    }


def _calibration(cfg: RetrieveConfig, store: DocStore, terms: list[str], term_vectors) -> Calibration:
    if cfg.calibration == "none":
        return Calibration()
    if cfg.calibration == "zscore":
        sample = store.sample_vectors(cfg.calibration_sample)
        return Calibration.zscore(terms, sample @ term_vectors.T)
    from pipelines.methods.itlr import labelled_scores  # sigmoid: RetrieveConfig requires --labels


    labels = [json.loads(line) for line in Path(cfg.labels).read_text(encoding="utf-8").splitlines() if line.strip()]
    vectors = store.vectors_for(sorted({r["doc_id"] for r in labels}))
    return Calibration.fit_sigmoid(labelled_scores(labels, terms, term_vectors, vectors))
