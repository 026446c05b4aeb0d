"""Turn scored (query, document) pairs into a ranked run table, and a run back into candidate pairs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from logicrank.pipelines.io import trec_score
from logicrank.schemas.errors import JobFailed
from logicrank.schemas.tables import RUN


def rank_pairs(pairs: pd.DataFrame, k: int, method: str, run_id: str) -> pa.Table:
    """``pairs`` has query_id, doc_id, score; keep each query's top ``k``.

    Higher score ranks first, the score as trec_eval stores it (a 32-bit float,
    :func:`~logicrank.pipelines.io.trec_score`: sums equal in arithmetic whose 64-bit last bits
    differ, as a fusion's, are one score); equal scores are ordered by a ``tiebreak`` column
    when the pairs have one (lower first, e.g. a base rank), then by doc_id descending:
    trec_eval's rule, so a run and its TREC file evaluate alike. Runs are deterministic. The
    run keeps each score's 64 bits, except where the ``tiebreak`` orders two equal scores
    otherwise than trec_eval would: the later one's score is lowered to the next 32-bit float
    below (:func:`_ties_apart`), so that its TREC file ranks as the run does; and scores then
    equal in 32 bits are written as that 32-bit value (:func:`_ties_as_ranked`: a reader that
    sorts by the 64 bits, as ranx does, put a later row first).
    """
    refuse_non_finite(pairs, method)
    extra = ["tiebreak"] if "tiebreak" in pairs.columns else []
    df = pairs[["query_id", "doc_id", "score", *extra]].assign(_key=trec_score(pairs["score"])).sort_values(
        ["query_id", "_key", *extra, "doc_id"], ascending=[True, False, *[True] * len(extra), False], kind="stable"
    )
    df = df.drop_duplicates(["query_id", "doc_id"], keep="first")
    df["rank"] = df.groupby("query_id", sort=False).cumcount().astype(np.int32) + 1
    df = df[df["rank"] <= k]
    if extra:
        df = df.assign(score=_ties_apart(df["query_id"].to_numpy(), df["_key"].to_numpy(), df["doc_id"].to_numpy(), df["score"].to_numpy()))
    # (after the lowering: a row whose score rounds to a lowered one's is tied with it)
    df = df.assign(score=_ties_as_ranked(df["query_id"].to_numpy(), trec_score(df["score"]), df["score"].to_numpy()))
    return pa.table(
        {
            "query_id": pa.array(df["query_id"].astype(str), pa.string()),
            "doc_id": pa.array(df["doc_id"].astype(str), pa.string()),
            "rank": pa.array(df["rank"], pa.int32()),
            "score": pa.array(df["score"].astype(np.float64), pa.float64()),
            "method": pa.array([method] * len(df), pa.string()),
            "run_id": pa.array([run_id] * len(df), pa.string()),
        },
        schema=RUN,
    )


def refuse_non_finite(pairs: pd.DataFrame, method: str) -> None:
    """Every pair's score finite, checked before a query's run is cut to its k: a NaN sorts last
    and would be cut away unseen (the base run's top document gone from an OrLog run of
    ``k=10`` over 20 candidates), where the run's own check sees only the rows kept."""
    scores = pd.to_numeric(pairs["score"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    refuse_unrankable(scores, lambda i: (pairs["query_id"].iloc[i], pairs["doc_id"].iloc[i]), method)


def refuse_unrankable(scores: np.ndarray, pair: Callable[[int], tuple[str, str]], where: str) -> None:
    """Refuse ``scores`` (float64; a null read as NaN) holding a NaN or an infinity, naming the
    first such (query, document) (``pair(i)``): no ranking or measure can use them (trec_eval
    and ``evaluate`` refuse them), so nothing is ranked or written."""
    bad = ~np.isfinite(scores)
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        query, doc = pair(at)
        raise JobFailed(f"{where}: {int(bad.sum())} score(s) are missing, NaN or infinite, e.g. {scores[at]} for query {query!r}, doc "
                        f"{doc!r}; nothing is ranked or written, as no ranking or measure can use them.")


def _ties_as_ranked(queries: np.ndarray, keys: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``scores`` (rows in rank order; ``keys``: their 32-bit scores) with each row whose key
    equals a neighbour's in its query written as the key itself: rows ranked as ties (by doc_id
    descending, trec_eval's rule) whose 64 bits differ were ranked against those bits (an RRF
    of two depth-1,000 runs held 5,958 such pairs), so a reader that sorts by them (ranx) put a
    later row before an earlier one. Then the scores never rise down a query's run; rows with
    one score are left to the reader's tie rule (trec_eval's is the run's)."""
    same = (queries[1:] == queries[:-1]) & (keys[1:] == keys[:-1])
    tied = np.zeros(len(keys), dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    tied &= np.isfinite(keys)  # (a score past 32 bits' range keeps its 64)
    out = scores.astype(np.float64, copy=True)
    out[tied] = keys[tied].astype(np.float64)
    return out


def _ties_apart(queries: np.ndarray, keys: np.ndarray, docs: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``scores`` (rows in rank order; ``keys``: their 32-bit scores, trec_eval's key) with each
    row that trec_eval would put before the row above it (an equal key and a greater doc_id, as
    a tie broken by a base rank leaves it) lowered to the next 32-bit float below that row's,
    and so on down the run while rows tie with a lowered one: the order is then the scores'
    alone, in any reader (Anserini's ScoreTiesAdjusterReranker does the same for its docid
    order). Other rows keep their 64-bit scores."""
    keys, scores = keys.copy(), scores.astype(np.float64, copy=True)
    for i in np.flatnonzero((queries[1:] == queries[:-1]) & (keys[1:] >= keys[:-1])) + 1:
        while i < len(keys) and queries[i] == queries[i - 1] and (
                keys[i] > keys[i - 1] or (keys[i] == keys[i - 1] and docs[i] > docs[i - 1])):
            keys[i] = np.nextafter(keys[i - 1], np.float32(-np.inf), dtype=np.float32)
            scores[i] = float(keys[i])
            i += 1
    return scores


def candidate_pairs(run: pa.Table, query_ids: Sequence[str]) -> pd.DataFrame:
    """The (query_id, doc_id) pairs of ``run`` for these queries, each query's in rank order:
    the candidates a retriever after that run scores (PyTerrier's ``a >> b``)."""
    df = run.select(["query_id", "doc_id", "rank"]).to_pandas()
    df = df[df["query_id"].isin(list(query_ids))].sort_values(["query_id", "rank"], kind="stable")
    return df[["query_id", "doc_id"]].reset_index(drop=True)
