"""ITLR's operator grid evaluated (``logicrank ablate``, jobs/ablate.py): each AND x OR x NOT
family's top ``k`` pairs (scored by pipelines/retrieval/methods/ablation.py) measured against
the qrels; one table like the paper's Table 2 (rows: operator choice; value: the measure)."""

from __future__ import annotations

import pandas as pd

from logicrank.pipelines.evaluation.core import run_metrics
from logicrank.pipelines.evaluation.runs import require_shared_queries
from logicrank.pipelines.retrieval.logic.fuzzy import Operators
from logicrank.pipelines.retrieval.methods.ranking import rank_pairs


def grid_notes(queries, qrels, m, k: int) -> list[str]:
    """What the grid's figures are over, as ``evaluate`` says it, or a refusal: queries that share
    none with the qrels (or spell the qrels' ids with other leading zeros) would give a table of
    zeros; the qrels' queries the queries file lacks score 0 in every row (trec_eval -c); a
    measure deeper than ``k`` counts the top ``k`` of each choice only."""
    require_shared_queries("ablate", queries, qrels, who="ablate: the queries file")
    asked, judged = (set(t.column("query_id").to_pylist()) for t in (queries, qrels))
    notes = []
    if n := len(judged - asked):
        notes.append(f"ablate: {n} of the qrels' {len(judged)} queries are not in the queries file; each scores 0 in every row, "
                     "as trec_eval -c scores a query a run misses.")
    if n := len(asked - judged):
        notes.append(f"ablate: {n} queries of the queries file have no qrels; not evaluated.")
    if not (isinstance(m.cutoff, int) and m.cutoff <= k):
        notes.append(f"ablate: each operator choice ranks its top {k} documents of a query, so {m} counts no deeper.")
    return notes


def grid_table(pairs: dict, qrels, m, k: int) -> pd.DataFrame:
    """One row per operator choice (operators, measure, value: ``m`` over ``qrels``), best first
    (the lowest first for a measure where lower is better, ``unj_k``; a stable sort: ties keep
    the grid's order)."""
    rows = []
    for ops in Operators.grid():
        metrics = run_metrics(rank_pairs(pairs[ops], k, "itlr", str(ops)), qrels, [m], str(ops)).to_pandas()
        rows.append({"operators": str(ops), "measure": str(m), "value": float(metrics[metrics["query_id"] == "all"]["value"].item())})
    return pd.DataFrame(rows).sort_values("value", ascending=m.lower_is_better, kind="stable")


def grid_markdown(df: pd.DataFrame, m, notes: list[str] = ()) -> str:
    """:func:`grid_table`'s table in Markdown, its notes (:func:`grid_notes`) below it."""
    from logicrank.pipelines.markdown import table

    lines = table(["operators", m], ([r.operators, f"{r.value:.4f}"] for r in df.itertuples()), "lr")
    return "\n".join([*lines, *(["", *(f"- {n}" for n in notes)] if notes else [])]) + "\n"
