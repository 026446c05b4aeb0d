"""ITLR's operator grid evaluated (``logicrank ablate``, jobs/ablate.py): each AND x OR x NOT
family's top ``k`` pairs (scored by pipelines/retrieval/methods/ablation.py) measured against
the qrels; one table like the paper's Table 2 (rows: operator choice; value: the measure)."""

from __future__ import annotations

import pandas as pd

from logicrank.pipelines.evaluation.core import run_metrics
from logicrank.pipelines.retrieval.logic.fuzzy import Operators
from logicrank.pipelines.retrieval.methods.ranking import rank_pairs


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
