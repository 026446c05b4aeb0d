"""Evaluate run tables against qrels into the long metrics table.

The numbers are ir_measures' (its pytrec_eval provider runs trec_eval's code, ``-c``) or the
run is refused. A run is ranked by its
``rank`` column: :func:`logicrank.pipelines.io.read_run` has already re-ranked a TREC file by
score as trec_eval does (score descending, equal scores by docno descending), and a Parquet
run keeps its stage's ranks, checked by :func:`logicrank.pipelines.io.check_run` (distinct
positive ranks, never a better rank with a lower score; finite scores; each (query, doc)
pair once). Qrels must judge each pair once. Qrels queries the run misses score 0; run
queries absent from the qrels are not evaluated (:func:`query_coverage` counts both).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.evaluation import trec10
from logicrank.pipelines.evaluation.measures import Measure, provider
from logicrank.pipelines.io import Duplicates, check_qrels, check_run
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import AGGREGATE_QUERY_ID, METRICS, QRELS, RUN, conform, require_columns


class EvaluationError(UserError, ValueError):
    """Runs that cannot be evaluated together as given (run ids, baseline)."""


def judgements(qrels: pa.Table, query_ids: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
    """The qrels as ir_measures (pytrec_eval) takes them: query -> doc -> relevance."""
    require_columns(qrels, QRELS, "evaluate")
    q = qrels.select(["query_id", "doc_id", "relevance"]).to_pandas()
    if query_ids is not None:
        q = q[q["query_id"].isin(set(query_ids))]
    out: dict[str, dict[str, int]] = {}
    for qid, doc, rel in zip(q["query_id"], q["doc_id"], q["relevance"].astype(int), strict=True):
        out.setdefault(str(qid), {})[str(doc)] = int(rel)
    return out


def rank_scores(run: pa.Table, query_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """The run as ir_measures takes it, for ``query_ids`` only: query -> doc -> ``-rank``.

    trec_eval ranks by score (equal scores by docno descending); the score ``-rank`` makes it
    follow the run's ``rank`` column instead (checked by :func:`run_metrics`, not here)."""
    require_columns(run, ["query_id", "doc_id", "rank"], "evaluate")
    r = run.select(["query_id", "doc_id", "rank"]).to_pandas()
    r = r[r["query_id"].isin(set(query_ids))]
    out: dict[str, dict[str, float]] = {}
    for qid, doc, rank in zip(r["query_id"], r["doc_id"], r["rank"].astype(float), strict=True):
        out.setdefault(str(qid), {})[str(doc)] = -float(rank)
    return out


def measure_values(run: pa.Table, qrels: pa.Table, query_ids: Sequence[str], measures: Sequence[Measure]) -> dict[Measure, np.ndarray]:
    """Per-query values of each measure for ``query_ids`` (in that order), by ir_measures.

    A query with no row in the run scores 0 (trec_eval -c), except NumQ (1) and NumRel (its
    relevant documents), which trec_eval -c counts for it too."""
    qrels_dict = judgements(qrels, query_ids)
    run_dict = rank_scores(run, query_ids)
    out = _trec_only_values(run_dict, qrels_dict, query_ids, [m for m in measures if m.trec])
    measures = [m for m in measures if not m.trec]
    wanted = list(dict.fromkeys(ir for m in measures for ir in m.ir_measures()))
    got: dict[tuple[str, object], float] = {}
    if run_dict and qrels_dict and wanted:  # wanted is empty when every measure is trec_eval's own
        got = _ir_measures_values(wanted, run_dict, qrels_dict)
    missed = [qid for qid in query_ids if qid not in run_dict]
    for ir in wanted:  # trec_eval -c: the counts it gives a query without results
        for qid in missed:
            if ir.NAME == "NumQ":
                got[(qid, ir)] = 1.0
            elif ir.NAME == "NumRel":
                got[(qid, ir)] = float(sum(rel >= ir["rel"] for rel in qrels_dict.get(qid, {}).values()))
    for m in measures:
        irs = m.ir_measures()
        out[m] = np.array([m.combine([got.get((qid, ir), 0.0) for ir in irs]) for qid in query_ids], dtype=np.float64)
    return out


def _floating(ir) -> bool:
    """A measure ir_measures' pytrec_eval provider files under whichever trec_eval call it
    builds first (nDCG without gains, NumRet without rel, NumQ): beside another measure it
    takes that call's gains or judged-only setting."""
    from ir_measures.providers.base import NOT_PROVIDED

    return (ir.NAME == "nDCG" and ir["gains"] is NOT_PROVIDED) or (ir.NAME == "NumRet" and ir["rel"] is NOT_PROVIDED) or ir.NAME == "NumQ"


def _default_call(ir) -> bool:
    """Whether ``ir`` is computed in the trec_eval call a floating measure builds alone
    (relevance level 1, every document, trec_eval's own gains), so that one beside it takes
    nothing of another's."""
    def param(name: str, default):
        return ir[name] if name in ir.SUPPORTED_PARAMS else default  # (the value given, else the measure's default)

    return param("rel", 1) == 1 and not param("judged_only", False) and "gains" not in ir.params


def _ir_measures_values(wanted: list, run_dict: dict, qrels_dict: dict) -> dict[tuple[str, object], float]:
    """Each query's value of each of ``wanted`` (ir_measures' measures), by ir_measures, in
    calls that cannot mix them up. ir_measures 0.4's pytrec_eval provider puts a "floating"
    measure (:func:`_floating`) in whichever call it built first, so nDCG@10 beside
    nDCG(gains=...)@10 took those gains, and NumRet beside a judged-only measure counted only
    judged documents; and it files values by trec_eval's name, cut to two decimals, so of
    IPrec@0.12 and IPrec@0.125 in one call one got 0 for every query. So the floating measures
    go in calls of their own (one per judged-only setting), as does each measure at a
    fractional cutoff (IPrec's recall level), and a measure left without the values of a query
    it should have is asked again alone; still none is a bug, never a 0."""
    groups: dict[object, list] = {}
    for ir in wanted:
        if _floating(ir):
            key: object = ("floating", ir["judged_only"] if ir.NAME == "nDCG" else False)
        elif any(isinstance(v, float) for v in ir.params.values()):
            key = ("alone", ir)
        else:
            key = "fixed"
        groups.setdefault(key, []).append(ir)
    plain = ("floating", False)
    if plain in groups and "fixed" in groups and all(_default_call(ir) for ir in groups["fixed"]):
        groups["fixed"] += groups.pop(plain)  # every call there is the one a floating measure gets alone: one call, as ir_measures makes
    got: dict[tuple[str, object], float] = {}
    calls = list(groups.values())
    expected = [q for q, docs in qrels_dict.items() if docs and q in run_dict]  # (the queries every provider scores)
    asked_alone: set = set()
    while calls:
        group = calls.pop(0)
        for metric in provider().evaluator(group, qrels_dict).iter_calc(run_dict):
            got[(metric.query_id, metric.measure)] = float(metric.value)
        for ir in group:
            if any((q, ir) not in got for q in expected):
                if ir in asked_alone or len(group) == 1:
                    lost = next(q for q in expected if (q, ir) not in got)
                    raise RuntimeError(f"evaluate: ir_measures gave no {ir} for query {lost!r} (a bug)")
                asked_alone.add(ir)
                calls.append([ir])
    return got


def _trec_only_values(run_dict: dict, qrels_dict: dict, query_ids: Sequence[str], measures: Sequence[Measure]) -> dict[Measure, np.ndarray]:
    """trec_eval's measures that ir_measures does not name, by pytrec_eval (trec_eval's code)
    directly, or by :mod:`~logicrank.pipelines.evaluation.trec10` where pytrec_eval lacks them: a
    query without results gets an empty ranking (a value pytrec_eval leaves undefined there, 0/0,
    is 0, as trec_eval -c prints it). A value missing from pytrec_eval's result is a bug, never a 0."""
    tens = [m for m in measures if m.name in trec10.FAMILIES]
    got10 = trec10.values([(m.name, m.params) for m in tens], run_dict, qrels_dict, query_ids)
    out = {m: got10[(m.name, m.params)] for m in tens}
    measures = [m for m in measures if m.name not in trec10.FAMILIES]
    if not measures:
        return out
    import pytrec_eval

    judged = {q: docs for q, docs in qrels_dict.items() if docs}
    got = pytrec_eval.RelevanceEvaluator(judged, {m.trec_request for m in measures}).evaluate(
        {q: run_dict.get(q, {}) for q in judged}) if judged else {}
    for m in measures:
        lost = [q for q in query_ids if q in judged and str(m) not in got.get(q, {})]
        if lost:  # pytrec_eval evaluates every judged query, an empty ranking too: a miss is a name it keys otherwise
            raise RuntimeError(f"evaluate: pytrec_eval gave no {str(m)!r} (asked {m.trec_request!r}) for query {lost[0]!r} (a bug)")
        out[m] = np.nan_to_num(np.array([got[q][str(m)] if q in judged else 0.0 for q in query_ids], dtype=np.float64), nan=0.0)
    return out


def run_metrics(
    run: pa.Table, qrels: pa.Table, measures: Sequence[Measure], run_id: str | None = None, duplicates: Duplicates = "refuse"
) -> pa.Table:
    """Per-query values of every measure for one run, plus the mean as query ``all`` (the sum
    for the counts NumQ, NumRet, NumRel, NumRelRet, as trec_eval prints them).

    Queries evaluated: those in the qrels (a query the run misses scores 0, trec_eval -c).
    The run and qrels are checked first (module docstring); ``duplicates="first"`` keeps
    each repeated (query, doc) pair's best-ranked row instead of refusing the run.
    """
    require_columns(run, RUN.names[:3], "evaluate")
    qrels = conform(qrels, QRELS, "evaluate")
    check_qrels(qrels, "evaluate: qrels")
    ids = run.column("run_id").unique().to_pylist() if "run_id" in run.column_names else []
    if len(ids) > 1 or (run_id is None and not ids):
        raise EvaluationError(f"evaluate: the run holds run_ids {ids[:5]}; evaluate one run at a time, or pass run_id for a run without one.")
    run_id = run_id if run_id is not None else ids[0]
    run = check_run(run, f"evaluate: run {run_id!r}", duplicates)
    query_ids = sorted(set(qrels.column("query_id").to_pylist()))
    if AGGREGATE_QUERY_ID in query_ids:  # its rows would be taken for the mean's (trec_eval prints the mean as "all" too)
        raise EvaluationError(f"evaluate: the qrels hold a query {AGGREGATE_QUERY_ID!r}, the name of the mean's row; "
                              "rename that query (in the qrels, the queries and the run).")
    values = measure_values(run, qrels, query_ids, measures)

    frames = []
    for m in measures:
        v = values[m]
        total = m.aggregate(v)
        frames.append(pd.DataFrame({"query_id": query_ids, "measure": str(m), "value": v}))
        frames.append(pd.DataFrame({"query_id": [AGGREGATE_QUERY_ID], "measure": [str(m)], "value": [total]}))
    df = pd.concat(frames, ignore_index=True)
    df.insert(0, "run_id", run_id)
    return pa.Table.from_pandas(df, schema=METRICS, preserve_index=False)


def run_depth(run: pa.Table) -> int:
    """The run's depth: the most documents it holds for one query (0 for no rows). Measures
    count no deeper: a 100-deep run's MAP is its MAP at 100, whatever the collection holds."""
    if not run.num_rows:
        return 0
    return int(pc.max(run.group_by("query_id").aggregate([("query_id", "count")]).column("query_id_count")).as_py())


def query_coverage(run: pa.Table, qrels: pa.Table) -> tuple[int, int]:
    """(qrels queries with no row in the run: they score 0, run queries absent from the qrels: not evaluated);
    ids compared as text, as they are evaluated (a qrels table with integer ids: ``1`` is the run's ``"1"``)."""
    in_run = set(pc.unique(run.column("query_id")).cast(pa.string()).to_pylist())
    in_qrels = set(pc.unique(qrels.column("query_id")).cast(pa.string()).to_pylist())
    return len(in_qrels - in_run), len(in_run - in_qrels)
