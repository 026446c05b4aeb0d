"""OrLog and its LLM-as-reasoner baseline: rerankers whose evidence is the LLM's P(True).

OrLog: one truth prompt per (candidate, atom), P(True) optionally calibrated, the exact
posterior of the query's form reranks the candidates (side table ``predicate_scores``).
With ``scorer: bm25 | dense`` P(True) is instead the calibrated retrieval score of the atom's
text, ``{x}`` dropped: OrLog at retrieval cost, the same posterior.
The reasoner asks the whole question of each candidate in one prompt. Both keep the
incoming run's order for ties, and count their cost (forward passes, tokens) per pair.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, model_validator

from logicrank.pipelines.llm import prompts as templates
from logicrank.pipelines.retrieval.methods import orlog
from logicrank.pipelines.retrieval.methods.orlog import PREDICATE_SCORES
from logicrank.pipelines.retrieval.methods.ranking import rank_pairs
from logicrank.pipelines.retrieval.stages.base import Context, Kind, Needs, Output, Stage, StageOptions
from logicrank.pipelines.retrieval.stages.registry import register
from logicrank.pipelines.retrieval.stages.shards import in_shards


class _RerankOptions(StageOptions):
    k: int = Field(100, ge=1, le=10_000, description="Documents kept per query.")
    depth: int | None = Field(None, ge=1, description="Rerank the incoming run's top `depth` per query, the only documents it returns (None: all of it).")
    context: bool = Field(True, description="Put the candidate's text before each statement.")
    context_tokens: int = Field(256, ge=1, description="Token budget of that text (the LLM's tokenizer).")


class OrlogOptions(_RerankOptions):
    stage: Literal["orlog"] = "orlog"
    scorer: Literal["llm", "bm25", "dense"] = Field(
        "llm", description="P(True) of each (candidate, atom): the LLM's, or the calibrated bm25/dense score of the atom's text ({x} dropped)."
    )
    calibration: Literal["none", "content-free", "pool-mean"] = Field(
        "none", description="llm: P(True) calibration: none, content-free (against the atom about 'N/A'), pool-mean (against the candidates' mean)."
    )
    score_calibration: Literal["max", "saturation", "zscore"] | None = Field(
        None, description="bm25/dense: the retrieval score's calibration to P(True) (None: bm25 max, dense zscore; pipelines/retrieval/methods/evidence.py)."
    )
    calibration_sample: int = Field(10_000, ge=10, description="zscore: corpus sample size for the atoms' score statistics.")
    reasoner: Literal["compiled", "problog"] = Field("compiled", description="problog: one ProbLog program per candidate (reference).")

    @model_validator(mode="after")
    def _scorer(self):
        if self.scorer == "llm":
            if self.score_calibration is not None:
                raise ValueError("orlog: score_calibration is for the bm25 and dense scorers; the llm scorer's is calibration.")
        else:
            if self.calibration != "none":
                raise ValueError(f"orlog: calibration {self.calibration!r} calibrates LLM logits; scorer {self.scorer!r} takes score_calibration.")
            valid = RETRIEVAL_CALIBRATIONS[self.scorer]
            if self.score_calibration is not None and self.score_calibration not in valid:
                raise ValueError(f"orlog: scorer {self.scorer!r} takes score_calibration {', '.join(valid)}, not {self.score_calibration!r}.")
        return self


# a shard of OrLog's truth scoring as it is kept on disk (pipelines/retrieval/stages/shards.py): the prompts' keys and scores,
# not their texts (a candidate's context is up to context_tokens of its document, repeated per atom)
SHARD_TRUTH = pa.schema([
    ("query_id", pa.string()), ("doc_id", pa.string()), ("base_rank", pa.int32()), ("atom_id", pa.string()), ("atom", pa.string()),
    ("p_true", pa.float64()), ("logit_true", pa.float64()), ("logit_false", pa.float64()), ("exact", pa.bool_()),
    ("prompt_tokens", pa.int64()), ("cached_prompt_tokens", pa.int64()), ("cached", pa.bool_()), ("p_calibrated", pa.float64()),
])
SHARD_REASONER = pa.schema([f for f in SHARD_TRUTH if f.name not in ("atom_id", "atom", "p_calibrated")])  # one prompt per candidate

# a retrieval scorer's calibrations to P(True), its default first (raw cosines and raw BM25 are no probabilities)
RETRIEVAL_CALIBRATIONS = {"bm25": ("max", "saturation", "zscore"), "dense": ("zscore",)}


class ReasonerOptions(_RerankOptions):
    stage: Literal["reasoner"] = "reasoner"


class _LLMReranker(Stage):
    side_tables = {"predicate_scores": PREDICATE_SCORES}
    kind = Kind.RERANKER

    def needs(self) -> Needs:
        return Needs(llm=frozenset({"truth"}))

    def _pairs(self, run: pa.Table) -> pd.DataFrame:
        """(query_id, doc_id, base_rank) of the incoming run's top depth."""
        cands = run.select(["query_id", "doc_id", "rank"]).to_pandas().rename(columns={"rank": "base_rank"})
        return cands[cands["base_rank"] <= self.options.depth] if self.options.depth is not None else cands

    def _texts(self, ctx: Context, cands: pd.DataFrame) -> tuple[dict[str, str], dict[str, str]]:
        """The candidates' names (their titles) and their texts cut to the token budget."""
        docs = ctx.store.rows_for(cands["doc_id"].unique().tolist(), ["title", "text"]).to_pylist()
        names = {d["doc_id"]: (d["title"] or "").strip() or "This document" for d in docs}
        contexts = _contexts(ctx.llm_model, docs, self.options.context_tokens) if self.options.context else {}
        return names, contexts

    def _scored_in_shards(self, ctx: Context, cands: pd.DataFrame, score: Callable, schema: pa.Schema) -> tuple[pd.DataFrame, dict]:
        """``score(shards, candidates, names, contexts)``'s rows for every candidate, computed
        by shards of the incoming run's queries, in the order they come (pipelines/retrieval/stages/shards.py):
        a wave's prompts are built (its documents read and cut) when it goes to the pool, and
        each shard's rows (``schema``: keys and scores, not the prompts' texts) written as it
        finishes, so a killed job resumes from them. Returns the rows and the shards' counts."""
        rows_of = cands.groupby("query_id", sort=False).indices  # query -> its candidates' positions, in the run's order

        def compute(shards: list[list[str]]) -> list[dict[str, pa.Table]]:
            wave = cands.iloc[np.concatenate([rows_of[q] for shard in shards for q in shard])].reset_index(drop=True)
            scored = score(shards, wave, *self._texts(ctx, wave))
            return [{"scores": pa.Table.from_pandas(scored[scored["query_id"].isin(shard)][schema.names], schema=schema, preserve_index=False)}
                    for shard in shards]

        tables, sharding = in_shards(ctx, list(rows_of), compute, self.name)
        return pa.concat_tables([t["scores"] for t in tables] or [schema.empty_table()]).to_pandas(), sharding

    def _score(self, ctx: Context, prompts: pd.DataFrame) -> pd.DataFrame:
        """The prompts with the LLM's truth scores (TRUTH_SCORES columns) beside them."""
        values = prompts[["context", "statement"]].fillna({"context": ""}).to_dict("records")
        atoms = prompts["atom_id"] if "atom_id" in prompts else [None] * len(prompts)  # (the reasoner's prompts have none)
        keys = [f"of query {q}, " + (f"document {d}" if isinstance(d, str) else "content-free") + (f", atom {a}" if isinstance(a, str) else "")
                for q, d, a in zip(prompts["query_id"], prompts["doc_id"], atoms, strict=True)]
        res = ctx.llm_service().truth(templates.load("truth"), values, label=self.name, keys=keys)
        return prompts.assign(
            p_true=[r.p_true for r in res], logit_true=[r.logit_true for r in res], logit_false=[r.logit_false for r in res],
            exact=[r.exact for r in res], prompt_tokens=[r.prompt_tokens for r in res],
            cached_prompt_tokens=[r.cached_prompt_tokens for r in res], cached=[r.cached for r in res],
        )


@register
class Orlog(_LLMReranker):
    """OrLog: P(True) of each (candidate, atom) from one forward pass, optionally calibrated
    (``scorer: bm25 | dense``: the calibrated retrieval score of the atom's text, no LLM);
    the exact posterior of the query's form reranks the candidates, ties in the incoming
    order. Needs the ``atoms`` of a ``decomposition`` stage (target orlog) earlier in the
    pipeline. Side table ``predicate_scores``."""

    name = "orlog"
    Options = OrlogOptions
    requires = frozenset({"atoms"})

    def needs(self) -> Needs:
        if self.options.scorer == "llm":
            return super().needs()
        return Needs(encoder=self.options.scorer == "dense", fulltext=self.options.scorer == "bm25")

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        o = self.options
        refuse_unparsed_forms(queries)
        qs = orlog.orlog_queries(queries)
        if o.scorer == "bm25":
            ctx.store.bm25_index()  # opened (or built) before the clock starts: indexing is not scoring
        elif o.scorer == "dense":
            ctx.embedder()  # the encoder loaded before it, as the LLM service may already run
        started = time.perf_counter()  # seconds per pair: candidates to P(True), the LLM's or the scorer's
        if o.scorer == "llm":
            cands = self._pairs(runs[0])
            res, n_cf, sharding = self._truth(ctx, qs, cands)
            counts = _cost(res, len(cands), n_cf) | sharding
        else:
            cands = self._pairs(runs[0])
            qs, negative = orlog.negative_atoms_as_questions(qs)  # (counted among the fallbacks below, and apart)
            calibration = o.score_calibration or RETRIEVAL_CALIBRATIONS[o.scorer][0]
            encode = (lambda texts: ctx.embedder().encode(texts)) if o.scorer == "dense" else None  # noqa: E731
            res = orlog.retrieval_truth(qs, cands, o.scorer, calibration, ctx.store, encode, o.calibration_sample)
            counts = {"pairs": len(cands), "scorer": o.scorer, "score_calibration": calibration, "forward_passes": 0,
                      "negative_atom_fallbacks": len(negative), "negative_atom_fallback_query_ids": negative[:100],
                      "distinct_atom_texts": int(res["atom_text"].nunique()) if len(res) else 0}
        seconds = time.perf_counter() - started
        counts |= {"scoring_seconds": round(seconds, 4), "seconds_per_pair": seconds / max(counts["pairs"], 1)}
        post = orlog.posteriors(qs, res, o.reasoner)
        fell = [q.query_id for q in qs if q.status != "ok"]  # the LLM's output was unusable: the question is the one atom
        counts |= {"fallback_decompositions": len(fell), "fallback_decomposition_query_ids": fell[:100]}
        held = orlog.negated_everywhere(qs, res)
        counts |= {"unsatisfiable": len(held), "unsatisfiable_query_ids": held[:100]}
        run = rank_pairs(post.assign(tiebreak=post["base_rank"]), o.k, "orlog", "orlog")
        return Output(run=run, side={"predicate_scores": orlog.predicate_scores(res)}, counts=counts)

    def _truth(self, ctx: Context, qs: list[orlog.OrlogQuery], cands: pd.DataFrame) -> tuple[pd.DataFrame, int, dict]:
        """Every (candidate, atom)'s truth scores, calibrated, by shards of the run's queries.
        Calibration is per query (content-free: its atoms about "N/A"; pool-mean: over its
        candidates), so a wave is calibrated alone. Returns the scores, the content-free
        prompts counted, and the shards' counts."""
        o = self.options
        by_query = {q.query_id: q for q in qs}

        def score(shards: list[list[str]], wave: pd.DataFrame, names: dict, contexts: dict) -> pd.DataFrame:
            asked = [by_query[q] for shard in shards for q in shard]
            prompts = orlog.truth_prompts(asked, wave, names, contexts)
            cf = orlog.content_free_prompts(asked) if o.calibration == "content-free" else prompts.iloc[:0]
            scored = self._score(ctx, pd.concat([prompts, cf], ignore_index=True))  # one call of the pool for the wave
            res, cf = scored.iloc[: len(prompts)], scored.iloc[len(prompts) :]
            return res.assign(p_calibrated=orlog.calibrate(res, o.calibration, cf))

        res, sharding = self._scored_in_shards(ctx, cands, score, SHARD_TRUTH)
        units = cands["query_id"].unique()
        n_cf = sum(len(by_query[q].atoms) for q in units) if o.calibration == "content-free" else 0
        return res, n_cf, sharding


@register
class Reasoner(_LLMReranker):
    """The LLM-as-reasoner baseline: P(True) of "<candidate> is an answer to the question"."""

    name = "reasoner"
    Options = ReasonerOptions

    def run(self, ctx: Context, queries: pa.Table, runs: list[pa.Table]) -> Output:
        def score(shards: list[list[str]], wave: pd.DataFrame, names: dict, contexts: dict) -> pd.DataFrame:
            return self._score(ctx, orlog.reasoner_prompts(queries, wave, names, contexts))

        res, sharding = self._scored_in_shards(ctx, self._pairs(runs[0]), score, SHARD_REASONER)
        run = rank_pairs(res.assign(score=res["p_true"], tiebreak=res["base_rank"]), self.options.k, "reasoner", "reasoner")
        return Output(run=run, counts=_cost(res, len(res), 0) | sharding)


def refuse_unparsed_forms(queries: pa.Table) -> None:
    """A decomposition's form (a decompositions file's ``logical_query`` over atom ids) that
    does not parse stops the run, in one line naming the queries: OrLog has no whole-text
    reading of a query to fall back to."""
    from logicrank.pipelines.retrieval.logic.query import QueryParseError, UnparsedQueryError, parse, unparsed_message

    if "logical_query" not in queries.column_names:
        return  # orlog_queries names the missing columns
    bad = []
    for qid, form in zip(queries.column("query_id").to_pylist(), queries.column("logical_query").to_pylist(), strict=True):
        try:
            parse(form or "")
        except QueryParseError as exc:
            bad.append((qid, form or "", str(exc).splitlines()[0]))
    if bad:
        raise UnparsedQueryError(unparsed_message("orlog", bad, what=("decomposition's form", "decompositions' forms"), hint=(
            'Give it as a logical query over its quoted atom ids ("a1" AND NOT "a2") in the decompositions file')))


def _contexts(model_dir: str, docs: list[dict], budget: int) -> dict[str, str]:
    """Each candidate's title and text, cut to ``budget`` tokens of the scoring model's tokenizer."""
    texts = {d["doc_id"]: f"{d['title'] or ''}. {d['text']}".strip(". ") for d in docs}
    return {doc_id: f"Document: {text}\n" for doc_id, text in templates.cut_to_tokens(model_dir, texts, budget).items()}


def _cost(res: pd.DataFrame, pairs: int, extra_passes: int) -> dict:
    """Per (query, candidate) pair: forward passes, prompt tokens (and prefix-cache hits),
    generated tokens (one per pass: no decoding)."""
    passes = len(res) + extra_passes
    return {
        "pairs": pairs, "forward_passes": passes, "forward_passes_per_pair": passes / max(pairs, 1),
        "prompt_tokens": int(res["prompt_tokens"].sum()), "prefix_cached_tokens": int(res["cached_prompt_tokens"].sum()),
        "generated_tokens_per_pair": passes / max(pairs, 1), "llm_cache_hits": int(res["cached"].sum()),
    }
