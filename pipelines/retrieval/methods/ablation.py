"""ITLR's operator grid (``logicrank ablate``, jobs/ablate.py): every AND x OR x NOT family
composed in one exact pass over the corpus for a term scorer (dense cosines, BM25 or hybrid
evidence, pipelines/retrieval/methods/evidence.py), each evaluated; one table like the paper's Table 2
(rows: operator choice; value: the measure). No Ray here."""

from __future__ import annotations

import dataclasses

import pandas as pd

from logicrank.pipelines.config.settings import EmbedConfig
from logicrank.pipelines.engines.embed import Embedder
from logicrank.pipelines.engines.store import DocStore
from logicrank.pipelines.evaluation.core import run_metrics
from logicrank.pipelines.retrieval.logic.fuzzy import Operators
from logicrank.pipelines.retrieval.methods.evidence import calibrate_evidence, describe, make_evidence
from logicrank.pipelines.retrieval.methods.itlr import Calibration, refuse_empty_nots, score_exact, unique_terms
from logicrank.pipelines.retrieval.methods.ranking import rank_pairs


def score_grid(parsed: list, store: DocStore, embed: EmbedConfig, k: int, scorer: str, calibration: str,
               hybrid_weight: float) -> tuple[dict, str]:
    """Every operator choice's top ``k`` (query, document) pairs over ``store`` for the parsed
    queries, in one exact pass, and the term scores' calibration as the manifest records it."""
    terms = unique_terms(parsed)
    grid = Operators.grid()
    if scorer == "dense" and calibration == "none":  # the cosines straight from the vectors (the fast path)
        return score_exact(parsed, terms, Embedder(embed).encode(terms), store.vector_blocks(), k, grid, Calibration()), calibration
    evidence = make_evidence(scorer, store, terms, lambda texts: Embedder(embed).encode(texts), hybrid_weight)
    empty = evidence.empty_terms()  # as the itlr stage: a NOT over a term no document holds refused, the term 0, no padding
    refuse_empty_nots(parsed, empty, "ablate")
    cal = dataclasses.replace(calibrate_evidence(evidence, calibration), empty=frozenset(empty))
    return score_exact(parsed, terms, None, evidence.blocks(32768), k, grid, cal, drop_unsupported=evidence.sparse), describe(evidence, calibration)


def grid_table(pairs: dict, qrels, m, k: int) -> pd.DataFrame:
    """One row per operator choice (operators, measure, value: ``m`` over ``qrels``), best first
    (a stable sort: ties keep the grid's order)."""
    rows = []
    for ops in Operators.grid():
        metrics = run_metrics(rank_pairs(pairs[ops], k, "itlr", str(ops)), qrels, [m], str(ops)).to_pandas()
        rows.append({"operators": str(ops), "measure": str(m), "value": float(metrics[metrics["query_id"] == "all"]["value"].item())})
    return pd.DataFrame(rows).sort_values("value", ascending=False, kind="stable")
 

def grid_markdown(df: pd.DataFrame, m) -> str:
    """:func:`grid_table`'s table in Markdown."""
    from logicrank.pipelines.markdown import table

    lines = table(["operators", m], ([r.operators, f"{r.value:.4f}"] for r in df.itertuples()), "lr")
    return "\n".join(lines) + "\n"
