"""ITLR's operator grid scored (``logicrank ablate``, jobs/ablate.py): every AND x OR x NOT
family composed in one exact pass over the corpus for a term scorer (dense cosines, BM25 or
hybrid evidence, pipelines/retrieval/methods/evidence.py). Its table of measures is
pipelines/evaluation/ablation.py's. No Ray here."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from logicrank.pipelines.config.settings import EmbedConfig
from logicrank.pipelines.engines.embed import Embedder
from logicrank.pipelines.retrieval.logic.fuzzy import Operators
from logicrank.pipelines.retrieval.methods.evidence import calibrate_evidence, describe, make_evidence
from logicrank.pipelines.retrieval.methods.itlr import Calibration, refuse_empty_nots, score_exact, unique_terms

if TYPE_CHECKING:  # (the store imports LanceDB: a second of the command line's start)
    from logicrank.pipelines.engines.store import DocStore


def score_grid(parsed: list, store: DocStore, embed: EmbedConfig, k: int, scorer: str, calibration: str,
               hybrid_weight: float, empty_not: str = "refuse") -> tuple[dict, str]:
    """Every operator choice's top ``k`` (query, document) pairs over ``store`` for the parsed
    queries, in one exact pass, and the term scores' calibration as the manifest records it."""
    terms = unique_terms(parsed)
    grid = Operators.grid()
    if scorer == "dense" and calibration == "none":  # the cosines straight from the vectors (the fast path)
        return score_exact(parsed, terms, Embedder(embed).encode(terms), store.vector_blocks(), k, grid, Calibration()), calibration
    evidence = make_evidence(scorer, store, terms, lambda texts: Embedder(embed).encode(texts), hybrid_weight)
    empty = evidence.empty_terms()  # as the itlr stage: a NOT over a term no document holds refused, the term 0, no padding
    if empty_not == "refuse":  # (hold: such a NOT holds for every document, as the itlr stage's empty_not: hold)
        refuse_empty_nots(parsed, empty, "ablate")
    elif empty_not != "hold":
        raise ValueError(f"ablate: empty_not {empty_not!r}: give refuse or hold")
    cal = dataclasses.replace(calibrate_evidence(evidence, calibration), empty=frozenset(empty))
    return score_exact(parsed, terms, None, evidence.blocks(32768), k, grid, cal, drop_unsupported=evidence.sparse), describe(evidence, calibration)
