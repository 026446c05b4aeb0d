"""Comparing tables that numerical code wrote, the same way on every CPU.

Float kernels differ between machines (BLAS and oneDNN pick other blockings on Intel and
AMD, on AVX2 and AVX-512), so a score recomputed on another machine can differ in its last
bits: 4.8e-7 was seen on an AMD EPYC against a reference written on Intel. These helpers
compare what must not change exactly (ids, ranks, strings, integers, row counts, schemas) and
floats to a stated tolerance, ``|new - old| <= ATOL + RTOL * |old|``. Where two documents'
scores are within that tolerance of each other, their order is a coin toss between machines,
so a swap is accepted there and only there: a swap of documents whose scores are apart, a
missing document, a new one, or a score off by more than the tolerance still fails.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

RTOL = 1e-5
ATOL = 1e-6


def close(a: float, b: float, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """``a`` within the tolerance of ``b`` (both NaN counts as equal)."""
    if np.isnan(a) or np.isnan(b):
        return bool(np.isnan(a) and np.isnan(b))
    return abs(a - b) <= atol + rtol * abs(b)


def _is_float(t: pa.DataType) -> bool:
    return pa.types.is_floating(t)


def assert_ranking_close(got: Sequence[str], want: Sequence[str], got_scores: Sequence[float], want_scores: Sequence[float],
                         what: str = "", rtol: float = RTOL, atol: float = ATOL) -> set[str]:
    """One ranked list against its reference (best first): the same length, scores position by
    position within the tolerance, and the same document at each position unless the two
    documents there are tied within the tolerance in the reference. A document of one list
    missing from the other is accepted only at the cut, tied with the reference's last score.
    Returns the documents accepted that way (on either side), for checking side tables."""
    assert len(got) == len(want), f"{what}: {len(got)} documents, the reference has {len(want)}"
    old = dict(zip(want, want_scores, strict=True))
    new = dict(zip(got, got_scores, strict=True))
    assert len(old) == len(want) and len(new) == len(got), f"{what}: a document twice in one list"
    last = want_scores[-1] if len(want_scores) else 0.0
    at_cut: set[str] = set()
    for i, (g, w, gs, ws) in enumerate(zip(got, want, got_scores, want_scores, strict=True)):
        assert close(gs, ws, rtol, atol), f"{what}: rank {i + 1} scores {gs!r}, the reference {ws!r} ({g} vs {w})"
        if g == w:
            continue
        if g in old:  # reordered: only inside a tie
            assert close(old[g], ws, rtol, atol), (
                f"{what}: rank {i + 1} holds {g} (reference score {old[g]!r}) where the reference has {w} ({ws!r}): not a tie")
        else:  # a document from beyond the reference's cut: only tied with its last score
            assert close(gs, last, rtol, atol), f"{what}: {g} at rank {i + 1} is not in the reference and not tied at its cut"
            at_cut.add(g)
        if w not in new:
            assert close(ws, last, rtol, atol), f"{what}: {w} (reference rank {i + 1}, {ws!r}) is missing and not tied at the cut"
            at_cut.add(w)
    return at_cut


def assert_runs_close(new: pa.Table, old: pa.Table, what: str = "", rtol: float = RTOL, atol: float = ATOL) -> set[tuple[str, str]]:
    """Two run tables (``query_id, doc_id, rank, score`` and any other columns): the same schema
    and row count, the same queries with the same number of documents, ranks 1..n exactly,
    every other non-float column exactly, and each query's ranking as in
    :func:`assert_ranking_close`. Returns the ``(query_id, doc_id)`` pairs accepted at a cut."""
    assert new.schema == old.schema, f"{what}: schema {new.schema} != {old.schema}"
    assert new.num_rows == old.num_rows, f"{what}: {new.num_rows} rows, the reference has {old.num_rows}"
    group = [c for c in ("run_id", "query_id") if c in new.column_names]
    order = [(c, "ascending") for c in group] + [("rank", "ascending")]
    new, old = new.sort_by(order), old.sort_by(order)
    fixed = [c for c in new.column_names if c not in ("doc_id", "score") and not _is_float(new.schema.field(c).type)]
    for c in fixed:
        assert new.column(c).equals(old.column(c)), f"{what}: column {c!r} differs"
    for c in new.column_names:  # any other float column: position by position
        if c != "score" and _is_float(new.schema.field(c).type):
            _assert_floats(new.column(c), old.column(c), f"{what}: column {c!r}", rtol, atol)
    keys = list(zip(*(new.column(c).to_pylist() for c in group), strict=True)) if group else [()] * new.num_rows
    ids_new, ids_old = new.column("doc_id").to_pylist(), old.column("doc_id").to_pylist()
    s_new, s_old = new.column("score").to_pylist(), old.column("score").to_pylist()
    at_cut: set[tuple[str, str]] = set()
    start = 0
    for end in [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]:
        q = keys[start]
        docs = assert_ranking_close(ids_new[start:end], ids_old[start:end], s_new[start:end], s_old[start:end], f"{what} {q}", rtol, atol)
        at_cut |= {(q[-1], d) for d in docs}
        start = end
    return at_cut


def assert_tables_close(new: pa.Table, old: pa.Table, keys: Sequence[str], what: str = "", rtol: float = RTOL, atol: float = ATOL,
                        may_differ: set[tuple[str, str]] = frozenset()) -> None:
    """Two tables keyed by ``keys`` (e.g. ``query_id, doc_id, term_id``): the same schema, the
    same rows by key, non-float columns exactly, float columns within the tolerance. Rows of a
    ``(query_id, doc_id)`` in ``may_differ`` (documents a run comparison accepted at a tied
    cut) may be present on one side only."""
    assert new.schema == old.schema, f"{what}: schema {new.schema} != {old.schema}"
    if may_differ:
        def keep(t: pa.Table) -> pa.Table:
            pairs = list(zip(t.column("query_id").to_pylist(), t.column("doc_id").to_pylist(), strict=True))
            return t.filter(pa.array([p not in may_differ for p in pairs]))
        new, old = keep(new), keep(old)
    assert new.num_rows == old.num_rows, f"{what}: {new.num_rows} rows, the reference has {old.num_rows}"
    order = [(k, "ascending") for k in keys]
    new, old = new.sort_by(order), old.sort_by(order)
    key_rows = list(zip(*(new.column(k).to_pylist() for k in keys), strict=True))
    assert len(set(key_rows)) == len(key_rows), f"{what}: keys {list(keys)} are not unique"
    for c in new.column_names:
        if _is_float(new.schema.field(c).type):
            _assert_floats(new.column(c), old.column(c), f"{what}: column {c!r}", rtol, atol, key_rows)
        else:
            assert new.column(c).equals(old.column(c)), f"{what}: column {c!r} differs"


def _assert_floats(new: pa.ChunkedArray, old: pa.ChunkedArray, what: str, rtol: float, atol: float, labels=None) -> None:
    assert pc.is_null(new).equals(pc.is_null(old)), f"{what}: nulls differ"
    a = new.to_numpy(zero_copy_only=False).astype(np.float64)
    b = old.to_numpy(zero_copy_only=False).astype(np.float64)
    ok = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        where = labels[i] if labels is not None else f"row {i}"
        raise AssertionError(f"{what}: {int((~ok).sum())} values off by more than rtol {rtol}, atol {atol}; first at {where}: {a[i]!r} vs {b[i]!r}")
