"""`logicrank ablate`: ITLR's operator grid (every AND x OR x NOT family) on a query set, for a
given term scorer (dense cosines, BM25 or hybrid evidence, pipelines/retrieval/methods/evidence.py).

All 18 choices are composed in one exact pass over the corpus, then each is evaluated:
one table like the paper's Table 2 (rows: operator choice; value: the measure). The grid is
scored by pipelines/retrieval/methods/ablation.py and measured by
pipelines/evaluation/ablation.py; this module reads the inputs and writes the files and the
manifest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa

from logicrank.jobs.rundir import RunDir
from logicrank.pipelines.config.settings import EmbedConfig
from logicrank.pipelines.engines.embed import model_id
from logicrank.pipelines.engines.store import DocStore
from logicrank.pipelines.engines.vector_models import require_query_model
from logicrank.pipelines.evaluation.ablation import grid_markdown, grid_notes, grid_table
from logicrank.pipelines.evaluation.measures import parse_measure
from logicrank.pipelines.files import write_parquet_atomic, write_text_atomic
from logicrank.pipelines.io import read_qrels, read_queries
from logicrank.pipelines.retrieval.logic.query import UnparsedQueryError, unparsed_message
from logicrank.pipelines.retrieval.methods.ablation import score_grid
from logicrank.pipelines.retrieval.methods.evidence import EvidenceError, check_calibration
from logicrank.pipelines.retrieval.methods.itlr import ScoreError, parse_queries
from logicrank.pipelines.retrieval.stages.itlr import unparsed_queries


def run_ablate(queries_path: str, qrels_path: str, db: str, out: str | Path, embed: EmbedConfig, table: str = "docs",
               measure: str = "nDCG@10", k: int = 100, scorer: str = "dense", calibration: str | None = None,
               hybrid_weight: float = 0.5, echo: Callable[[str], None] | None = None, empty_not: str = "refuse") -> pd.DataFrame:
    """``calibration``: the term scores' (None: the scorer's default; dense none, bm25 max).
    The table is read at the last version a completed index run finished (``echo`` gets the
    line saying so when a newer one was left)."""
    m = parse_measure(measure)
    if empty_not not in ("refuse", "hold"):
        raise EvidenceError(f"ablate: empty_not {empty_not!r}: give refuse or hold")
    calibration = check_calibration(scorer, calibration, "ablate")
    if calibration == "sigmoid":
        raise EvidenceError("ablate: calibration 'sigmoid' needs labels; use the itlr stage's (labels option) in an experiment.")
    rundir = RunDir(out, "ablate")
    queries, qrels = read_queries(queries_path), read_qrels(qrels_path)
    store, note = DocStore(db, table).readable(None, "ablate")
    if note and echo:
        echo(note)
    if scorer != "bm25":
        require_query_model(store, model_id(embed), "ablate")
    notes = grid_notes(queries, qrels, m, k)  # (a queries file sharing no query with the qrels: refused before scoring)
    parsed = parse_queries(queries)
    if unparsed := unparsed_queries(queries, parsed):  # its operators would be measured on queries read as one term
        raise UnparsedQueryError(unparsed_message("ablate", unparsed, hint='Quote each term ("vitamin D" AND NOT "bone")'))
    if fell := [q.query_id for q in parsed if q.status != "ok"]:  # one term: every operator choice scores it alike
        if len(fell) == len(parsed):
            raise UnparsedQueryError(f"ablate: none of the {len(parsed)} queries has a logical_query, so each is its whole text as one "
                                     "term and every operator choice would score them alike; give each query its logical form in "
                                     'logical_query ("vitamin D" AND NOT "bone"; a form written in the text is read as words).')
        notes.append(f"ablate: {len(fell)} of the {len(parsed)} queries have no logical query (e.g. {fell[0]!r}) and are scored as "
                     "their whole text, one term: alike under every operator choice, so they narrow the differences between rows.")
    with rundir.timed("score"):
        try:
            pairs, calibration = score_grid(parsed, store, embed, k, scorer, calibration, hybrid_weight, empty_not)
        except ScoreError as exc:
            what = str(exc).removeprefix("itlr: ")
            if " are infinite" not in what:
                raise ScoreError(f"ablate: {what}") from None
            # (the itlr stage's advice, an operator option, is none of ablate's: the grid holds every NOT family)
            raise ScoreError(f"ablate: {what.split(' (', 1)[0]}: the grid's not=reciprocal choices overflow float32 (1/1e-6 for "
                             "each negated term a document misses, past its range at seven), and no row is computed; leave such "
                             "queries out of the queries file.") from None
    df = grid_table(pairs, qrels, m, k)
    write_parquet_atomic(pa.Table.from_pandas(df, preserve_index=False), Path(out) / "ablation.parquet")
    write_text_atomic(grid_markdown(df, m, notes), Path(out) / "ablation.md")
    for line in notes if echo else ():
        echo(line)
    fallback = sum(q.status != "ok" for q in parsed)
    # the table version read, as retrieve records it: an index run moving the complete mark later leaves this tied to its documents
    read = {"table": {"db": db, "name": table, "version": store.version, "made": store.version_stamp()}}
    rundir.write_manifest({"queries": queries_path, "qrels": qrels_path, "db": db, "measure": str(m), "k": k, "scorer": scorer,
                           "calibration": calibration, "empty_not": empty_not},
                          "", read, ["ablation.parquet", "ablation.md"], fallback_queries=fallback, notes=notes, table_note=note)
    return df
