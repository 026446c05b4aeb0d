"""OrLog (arXiv 2601.23085): predicate plausibility from True/False logits, composed by exact
probabilistic inference, to rerank a base retriever's top k.

Per query: atoms about an entity ``{x}`` and a logical form over their ids (the ``orlog``
rows of a decompositions table). Per (candidate, atom): one truth prompt, the candidate's
text first (so the atoms of one candidate share a cached prefix), then the atom with the
candidate's name in place of ``{x}``. P(True) per pair, optionally calibrated, are the
probabilities of independent facts; the posterior of the form (compiled once per query,
all candidates at once) reranks the candidates, ties in base order.

The LLM-as-reasoner baseline asks the whole question of each candidate in one prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pyarrow as pa

from logicrank.pipelines.llm.decompose import PLACEHOLDER, one_id_per_statement
from logicrank.pipelines.retrieval.logic.probability import compile_probability, problog_probability
from logicrank.pipelines.retrieval.logic.query import Node, UnparsedQueryError, parse
from logicrank.schemas.errors import JobFailed
from logicrank.schemas.tables import question_column, require_columns

# The side tables its stage writes (the stage declares them; nothing else in logicrank reads them back).
# predicate_scores: OrLog's P(True) per (query, candidate, atom) (raw logits of the label tokens)
PREDICATE_SCORES = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("atom_id", pa.string(), nullable=False),
        pa.field("atom", pa.string(), nullable=False),
        pa.field("p_true", pa.float64(), nullable=False),  # uncalibrated
        pa.field("logit_true", pa.float64(), nullable=False),
        pa.field("logit_false", pa.float64(), nullable=False),
    ]
)


CALIBRATIONS = ("none", "content-free", "pool-mean")
CONTENT_FREE = "N/A"


@dataclass(frozen=True)
class OrlogQuery:
    query_id: str
    question: str
    atoms: tuple[tuple[str, str], ...]  # (id, text with {x})
    form: Node  # over atom ids
    status: str  # the decomposition's status


def orlog_queries(queries: pa.Table) -> list[OrlogQuery]:
    """Each query's atoms and form, from the columns the ``decomposition`` stage (target
    orlog) adds: ``atoms``, ``logical_query`` (over atom ids), ``decomposition_status``."""
    require_columns(queries, ["query_id", "text", "atoms", "logical_query", "decomposition_status"], "orlog")
    # the question as asked: a stage before may have rewritten the text (siar's rule, an expansion's reasoning)
    cols = (queries.column(c).to_pylist() for c in ("query_id", question_column(queries), "atoms", "logical_query", "decomposition_status"))
    out, bad = [], []
    for qid, text, atoms, form, status in zip(*cols, strict=True):  # (a table written before atoms were merged at parsing too)
        ids, node = [a["id"] for a in atoms or []], parse(form)
        # a decompositions file edited by hand: an id naming two statements would score one of them for both; a form over
        # an id no atom has, none
        if twice := sorted({i for i in ids if ids.count(i) > 1}):
            bad.append(f"query {qid!r}: atom id {twice[0]!r} names two atoms")
        elif unknown := sorted(set(node.terms()) - set(ids)):
            bad.append(f"query {qid!r}: the form uses atom id(s) {unknown[:3]} that no atom has")
        else:
            merged, node = one_id_per_statement([(a["id"], a["text"]) for a in atoms], node)
            out.append(OrlogQuery(qid, text, tuple(merged), node, status))
    if bad:
        raise UnparsedQueryError(f"orlog: {len(bad)} decomposition(s) cannot be scored ({bad[0]}{'; ...' if len(bad) > 1 else ''}); "
                                 "give each atom its own id and the form only those ids, in the decompositions file.")
    return out


def truth_prompts(queries: Sequence[OrlogQuery], candidates: pd.DataFrame, names: dict[str, str], contexts: dict[str, str]) -> pd.DataFrame:
    """One row per (query, candidate, atom), a candidate's atoms consecutive (shared prefix).

    ``candidates``: query_id, doc_id, base_rank; ``names``/``contexts``: doc_id -> the
    entity's name and its (truncated) description, "" for none."""
    rows = []
    by_query = {q.query_id: q for q in queries}
    for qid, doc, rank in candidates[["query_id", "doc_id", "base_rank"]].itertuples(index=False):
        for atom_id, atom in by_query[qid].atoms:
            rows.append({
                "query_id": qid, "doc_id": doc, "base_rank": rank, "atom_id": atom_id, "atom": atom,
                "context": contexts.get(doc, ""), "statement": atom.replace(PLACEHOLDER, names[doc]),
            })
    out = pd.DataFrame(rows, columns=["query_id", "doc_id", "base_rank", "atom_id", "atom", "context", "statement"])
    out.insert(0, "prompt_id", [f"p{i}" for i in range(len(out))])
    return out


def content_free_prompts(queries: Sequence[OrlogQuery]) -> pd.DataFrame:
    """Each atom about a content-free entity ("N/A", no description): the calibration input."""
    rows = [{"query_id": q.query_id, "atom_id": a, "context": "", "statement": t.replace(PLACEHOLDER, CONTENT_FREE)} for q in queries for a, t in q.atoms]
    out = pd.DataFrame(rows, columns=["query_id", "atom_id", "context", "statement"])
    out.insert(0, "prompt_id", [f"cf{i}" for i in range(len(out))])
    return out


def _logit_gap(scored: pd.DataFrame) -> np.ndarray:
    """z_True - z_False per row; 0 where both labels are masked (-inf and -inf: P(True) 0.5, as
    the engine's p_true says), not NaN."""
    zt, zf = scored["logit_true"].to_numpy(dtype=np.float64), scored["logit_false"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(zt == zf, 0.0, zt - zf)


def calibrate(scored: pd.DataFrame, mode: str, content_free: pd.DataFrame | None = None) -> np.ndarray:
    """P(True) per row after calibration of the logit difference d = z_True - z_False:
    ``none``: sigmoid(d); ``content-free``: sigmoid(d - d of the atom about "N/A");
    ``pool-mean``: sigmoid(d - mean d of the atom over the query's candidates).

    A gap is infinite where one label's logit is -inf (masked): that row's P(True) is 1 or 0
    in every calibration. The pool's mean is over its finite gaps (one infinite gap made every
    other candidate's P(True) 1 or 0); a content-free gap that is infinite (the atom about "N/A"
    certain) calibrates nothing and is refused in one line."""
    if mode not in CALIBRATIONS:
        raise ValueError(f"unknown calibration {mode!r}; valid: {', '.join(CALIBRATIONS)}")
    d = _logit_gap(scored)
    if mode == "content-free":
        cf = content_free.assign(d=_logit_gap(content_free)).set_index(["query_id", "atom_id"])["d"]
        ref = cf.loc[list(zip(scored["query_id"], scored["atom_id"], strict=True))].to_numpy()
        if np.isinf(ref).any():
            at = int(np.flatnonzero(np.isinf(ref))[0])
            raise JobFailed(f"orlog: calibration content-free: the atom {scored['atom_id'].iloc[at]!r} of query "
                            f"{scored['query_id'].iloc[at]!r} about \"N/A\" has a label's logit -inf (masked), so it calibrates "
                            "nothing; use calibration pool-mean or none.")
        d = d - ref
    elif mode == "pool-mean":
        finite = np.where(np.isinf(d), np.nan, d)  # (pandas' mean passes over NaN: the finite gaps' mean)
        mean = scored.assign(d=finite).groupby(["query_id", "atom_id"])["d"].transform("mean").to_numpy()
        d = d - np.nan_to_num(mean, nan=0.0)  # a pool without a finite gap: nothing to subtract
    return 1.0 / (1.0 + np.exp(-d))


def atom_query(atom: str) -> str:
    """An atom's text as a retrieval query: ``{x}`` dropped, spaces closed up
    ("{x} likes Quokkas" -> "likes Quokkas")."""
    return " ".join(atom.replace(PLACEHOLDER, " ").split())


# a statement that says not, as written in lower case ("{x} is not a comedy", "{x} doesn't smoke", "{x} never married");
# a title keeps its capitals ("Doctors Without Borders", "Don't Look Up", "Not Fade Away")
_SAYS_NOT = re.compile(r"\b(?:is|are|was|were|am|do|does|did|has|have|had|can|could|will|would|should|may|might|must)(?: not\b(?!-)|n['\u2019]t\b)"
                       r"|\b(?:not|never|without|neither|nor)\b(?!-)|\b(?:can|won|ain)['\u2019]t\b")


def negative_atoms_as_questions(queries: Sequence[OrlogQuery]) -> tuple[list[OrlogQuery], list[str]]:
    """For a retrieval scorer (bm25, dense): each decomposed query with a negative atom ("{x} is
    not a comedy") falls back to the question as its one atom, as an unusable decomposition
    does (status ``negative-atom``): BM25 drops "not" as a stop word and a dense vector barely
    moves, so the atom's P(True) would be its opposite's and the query would select what it
    excludes. Returns the queries and the ids of those that fell back."""
    out, fell = [], []
    for q in queries:
        if q.status == "ok" and any(_SAYS_NOT.search(text) for _, text in q.atoms):
            q = OrlogQuery(q.query_id, q.question, (("a1", f"{PLACEHOLDER} answers the question: {q.question}"),), parse('"a1"'),
                           "negative-atom")
            fell.append(q.query_id)
        out.append(q)
    return out, fell


def retrieval_truth(queries: Sequence[OrlogQuery], candidates: pd.DataFrame, scorer: str, calibration: str, store, encode=None,
                    sample: int = 10_000) -> pd.DataFrame:
    """One row per (query, candidate, atom) as :func:`truth_prompts` lays them out, with
    P(True) the calibrated ``scorer`` (bm25 | dense) score of the atom's text for the candidate
    (pipelines/retrieval/methods/evidence.py): ``p_true`` = ``p_calibrated``, ``logit_true`` its log-odds,
    ``logit_false`` 0, so sigmoid(logit_true - logit_false) is P(True) as for the LLM."""
    from logicrank.pipelines.retrieval.methods.evidence import calibrate_evidence, make_evidence

    by_query = {q.query_id: q for q in queries}
    rows = [(qid, doc, rank, atom_id, atom) for qid, doc, rank in candidates[["query_id", "doc_id", "base_rank"]].itertuples(index=False)
            for atom_id, atom in by_query[qid].atoms]
    out = pd.DataFrame(rows, columns=["query_id", "doc_id", "base_rank", "atom_id", "atom"])
    out["atom_text"] = [atom_query(a) for a in out["atom"]]
    texts = list(dict.fromkeys(out["atom_text"]))
    evidence = make_evidence(scorer, store, texts, encode, sample=sample)
    # an atom no document holds is false of every candidate, whatever the calibration (as ITLR's terms)
    cal = replace(calibrate_evidence(evidence, calibration, sample), empty=frozenset(evidence.empty_terms()))
    docs = list(dict.fromkeys(out["doc_id"]))
    R = evidence.raw(docs) if docs else np.zeros((0, len(texts)), np.float32)
    P = cal.apply(R, texts) if docs else np.zeros((0, len(texts)))
    doc_row, text_col = {d: i for i, d in enumerate(docs)}, {t: j for j, t in enumerate(texts)}
    at = ([doc_row[d] for d in out["doc_id"]], [text_col[t] for t in out["atom_text"]])
    p = np.asarray(P, dtype=np.float64)[at] if len(out) else np.zeros(0)
    clipped = np.clip(p, 1e-12, 1 - 1e-12)
    out = out.assign(p_true=p, p_calibrated=p, logit_true=np.log(clipped) - np.log1p(-clipped), logit_false=0.0)
    if evidence.sparse:  # BM25: a raw 0 is an atom the candidate misses, not held whatever its calibrated P (zscore: 0.5
        # for an atom the sample lacks), for the unsatisfiable count (:func:`negated_everywhere`), as ITLR's
        out["missed"] = (np.asarray(R)[at] <= 0) if len(out) else np.zeros(0, bool)
    return out


def by_atom(scored: pd.DataFrame, index: list[str]) -> pd.DataFrame:
    """``scored``'s calibrated P(True) as a (candidates x atom ids) frame, one row per
    candidate, in ``scored``'s order: a candidate whose every P(True) is NaN keeps its row
    (pandas' ``pivot_table`` drops such a row, and the candidate left the run unrefused); a
    (candidate, atom) scored twice is an error."""
    return scored.set_index([*index, "atom_id"])["p_calibrated"].unstack("atom_id", sort=False)


def negated_everywhere(queries: Sequence[OrlogQuery], scored: pd.DataFrame, threshold: float = 0.5) -> list[str]:
    """The queries whose every candidate is excluded by a negated conjunct of the form
    (``... AND NOT X``, X holding with its atoms' P(True) at least ``threshold``): the
    candidates cannot satisfy the query, and a deeper or other first stage is needed
    ("cancer but not breast or lung" over BM25's top 20 of the query text)."""
    from logicrank.pipelines.retrieval.logic.fuzzy import exclusion

    if scored.empty:
        return []
    if "missed" in scored.columns:  # (retrieval_truth over BM25) an atom a candidate misses does not hold it
        scored = scored.assign(p_calibrated=scored["p_calibrated"].where(~scored["missed"].astype(bool), 0.0))
    wide = by_atom(scored, ["query_id", "doc_id"])
    rows_of = pd.Series(np.arange(len(wide))).groupby(wide.index.get_level_values(0).to_numpy(), sort=False).indices
    out = []
    for q in queries:
        atom_ids = [a for a, _ in q.atoms]
        excluded = exclusion(q.form, atom_ids, threshold)
        if excluded is None or q.query_id not in rows_of or not set(atom_ids) <= set(wide.columns):
            continue
        P = wide.iloc[rows_of[q.query_id]][atom_ids].to_numpy(dtype=float)
        if excluded(np.nan_to_num(P, nan=0.0)).all():
            out.append(q.query_id)
    return out


def posteriors(queries: Sequence[OrlogQuery], scored: pd.DataFrame, reasoner: str = "compiled") -> pd.DataFrame:
    """(query_id, doc_id, base_rank, score=posterior): each form compiled once, its
    candidates evaluated in one call on their (candidates x atoms) P(True) matrix; or, with
    ``reasoner="problog"``, one ProbLog program per candidate (the reference)."""
    columns = ["query_id", "doc_id", "base_rank", "score"]
    if scored.empty:
        return pd.DataFrame(columns=columns)
    # one pivot for every query (candidates x atom ids), then each query's rows by position:
    # a per-query filter of ``scored`` would cost queries x rows (quadratic in the batch)
    wide = by_atom(scored, ["query_id", "doc_id", "base_rank"])
    values, col = wide.to_numpy(), {a: i for i, a in enumerate(wide.columns)}
    scored_atoms = scored.groupby("query_id", sort=False)["atom_id"].agg(set)
    keys = wide.index.get_level_values(0)
    rows_of = pd.Series(np.arange(len(wide))).groupby(keys.to_numpy(), sort=False).indices
    frames = []
    for q in queries:
        pos = rows_of.get(q.query_id)
        if pos is None:
            continue
        atom_ids = [a for a, _ in q.atoms]
        # atom ids repeat across queries (a1, a2, ...): a column another query fills is not this query's P(True)
        # (a P(True) of NaN is kept: the posterior is NaN, and the run refuses it)
        missing = [a for a in atom_ids if a not in scored_atoms.get(q.query_id, ())]
        if missing:
            raise KeyError(f"orlog: query {q.query_id!r} has no P(True) for atom(s) {missing}")
        P = values[np.ix_(pos, [col[a] for a in atom_ids])]
        if reasoner == "problog":
            post = np.array([problog_probability(q.form, dict(zip(atom_ids, row, strict=True))) for row in P])
        else:
            post = compile_probability(q.form, atom_ids)(P)
        index = wide.index[pos]
        frames.append(pd.DataFrame({"query_id": q.query_id, "doc_id": index.get_level_values(1), "base_rank": index.get_level_values(2), "score": post}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def predicate_scores(scored: pd.DataFrame) -> pa.Table:
    cols = {c: scored[c] for c in ("query_id", "doc_id", "atom_id", "atom", "p_true", "logit_true", "logit_false")}
    return pa.Table.from_pandas(pd.DataFrame(cols), schema=PREDICATE_SCORES, preserve_index=False)


def reasoner_prompts(queries: pa.Table, candidates: pd.DataFrame, names: dict[str, str], contexts: dict[str, str]) -> pd.DataFrame:
    """LLM-as-reasoner baseline: one prompt per (query, candidate) asking the whole question."""
    # the question as asked: a stage before may have rewritten the text (siar's rule, an expansion's reasoning)
    text = dict(zip(queries.column("query_id").to_pylist(), queries.column(question_column(queries)).to_pylist(), strict=True))
    out = pd.DataFrame({
        "query_id": candidates["query_id"], "doc_id": candidates["doc_id"], "base_rank": candidates["base_rank"],
        "context": [contexts.get(d, "") for d in candidates["doc_id"]],
        "statement": [f"{names[d]} is an answer to the question: {text[q]}" for q, d in zip(candidates["query_id"], candidates["doc_id"], strict=True)],
    })
    out.insert(0, "prompt_id", [f"r{i}" for i in range(len(out))])
    return out
