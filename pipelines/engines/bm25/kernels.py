"""The BM25 engine's loops for numba (as bm25s's fastest backend): the search loop
:func:`top_k`, the kernels that lay a saved index's postings out in segments of documents
(:func:`segment_starts`, :func:`segment_copy`), and the two passes that turn documents' term
counts into their terms' BM25 weights (:func:`weight_layout`, :func:`weight_postings`).

They are defined here, at module level, so that numba's on-disk cache serves every process of
a machine: the first process to search compiles them (about 15 s on 2 cores) and writes the
machine code under ``<cache root>/numba/bm25-<digest>``, and every later process, shard actor
included, loads it in well under a second. The digest is of this file's content
(pipelines/numba_cache.py), so another copy of the same source (a fresh checkout, a reinstall)
loads it too. numba names the files after this module (``kernels.top_k-*.nbi``);
``NUMBA_DEBUG_CACHE=1`` prints each load and save.

The search loop is also compiled ahead of time from this source, once per machine, into a
module loaded without numba (compiled.py); the JIT kernels here serve the index's builds, and
searches where that module cannot be built.

Importing this module loads numba; the engine imports it on first use (loading.py), after
which a vLLM engine can still start in the process (pipelines/llvmlite_compat.py).
"""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np

from logicrank.pipelines.llvmlite_compat import make_llvmlite_scannable
from logicrank.pipelines.numba_cache import ContentKeyedCache

make_llvmlite_scannable()

_CHUNK = 64  # documents per vectorised count in the candidate pass
_INSERTION_MAX = 128  # sample ranks kept by insertion; past it, np.partition (linear in the sample)

# numba picks each kernel's cache as it is decorated below: this file's, by its content
# (installed for the process's life: it claims this file's functions only)
ContentKeyedCache("bm25", Path(__file__)).install()


@numba.njit(cache=True, nogil=True, inline="always")
def first_at_least(values, a, b, x):
    """The first position in ``values[a:b]`` (sorted) holding at least ``x``, read in place: a
    slice handed to np.searchsorted with another integer type is copied whole, which would make
    a shard read every page of its terms' postings."""
    while a < b:
        m = (a + b) >> 1
        if values[m] < x:
            a = m + 1
        else:
            b = m
    return a


@numba.njit(cache=True, nogil=True)
def segment_starts(indptr, indices, seg_rows, n_seg):
    """Per term, where each segment's postings start in its (row-sorted) postings, and its end."""
    terms = len(indptr) - 1
    out = np.empty((terms, n_seg + 1), np.int64)
    for t in range(terms):
        a, b = indptr[t], indptr[t + 1]
        out[t, 0] = a
        for s in range(1, n_seg):
            out[t, s] = first_at_least(indices, out[t, s - 1], b, s * seg_rows)
        out[t, n_seg] = b
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _next_term(a_indices, a_data, i, ie, b_indices, b_data, j, je):
    """The next term of two documents' rows merged (each sorted by term id), its count summed
    over both, and the positions after it."""
    if j >= je or (i < ie and a_indices[i] < b_indices[j]):
        return np.int64(a_indices[i]), np.int64(a_data[i]), i + 1, j
    if i >= ie or b_indices[j] < a_indices[i]:
        return np.int64(b_indices[j]), np.int64(b_data[j]), i, j + 1
    return np.int64(a_indices[i]), np.int64(a_data[i]) + np.int64(b_data[j]), i + 1, j + 1


@numba.njit(cache=True, nogil=True)
def weight_layout(a_indptr, a_indices, a_data, b_indptr, b_indices, b_data, terms):
    """The first pass over two fields' counts (documents x terms CSR, each row sorted by term
    id, the same documents): each term's postings' start in the terms x documents layout
    (``terms + 1`` offsets, int64) and each document's length (both fields' counts summed). A
    term a document holds in either field, with a count other than 0, is one posting."""
    docs = len(a_indptr) - 1
    starts = np.zeros(terms + 1, np.int64)
    lengths = np.zeros(docs, np.int64)
    for d in range(docs):
        i, ie, j, je = np.int64(a_indptr[d]), np.int64(a_indptr[d + 1]), np.int64(b_indptr[d]), np.int64(b_indptr[d + 1])
        total = np.int64(0)
        while i < ie or j < je:
            t, f, i, j = _next_term(a_indices, a_data, i, ie, b_indices, b_data, j, je)
            if f != 0:
                starts[t + 1] += 1
                total += f
        lengths[d] = total
    for t in range(terms):
        starts[t + 1] += starts[t]
    return starts, lengths


@numba.njit(cache=True, nogil=True)
def weight_postings(a_indptr, a_indices, a_data, b_indptr, b_indices, b_data, starts, idf, k1, norm):
    """The second pass: every posting's document (int32) and BM25 weight (float32), terms x
    documents in :func:`weight_layout`'s ``starts``, each term's documents ascending. The weight
    is ``idf[t] * (k1 + 1) * f / (f + norm[d])`` in float64, operation by operation as numpy
    evaluates that expression over arrays, rounded once to float32."""
    docs = len(a_indptr) - 1
    nnz = starts[len(starts) - 1]
    out_docs = np.empty(nnz, np.int32)
    out_weights = np.empty(nnz, np.float32)
    at = starts[:-1].copy()
    for d in range(docs):
        i, ie, j, je = np.int64(a_indptr[d]), np.int64(a_indptr[d + 1]), np.int64(b_indptr[d]), np.int64(b_indptr[d + 1])
        while i < ie or j < je:
            t, f, i, j = _next_term(a_indices, a_data, i, ie, b_indices, b_data, j, je)
            if f != 0:
                x = np.float64(f)
                p = at[t]
                out_docs[p] = d
                out_weights[p] = np.float32(idf[t] * (k1 + 1) * x / (x + norm[d]))
                at[t] = p + 1
    return out_docs, out_weights


@numba.njit(cache=True, nogil=True)
def segment_copy(indices, data, starts, seg, out_indices, out_data, offset):
    """Segment ``seg``'s postings, term by term, into the outputs from ``offset``; its indptr row."""
    terms = starts.shape[0]
    row = np.empty(terms + 1, np.int64)
    o = offset
    for t in range(terms):
        row[t] = o
        for j in range(starts[t, seg], starts[t, seg + 1]):
            out_indices[o] = indices[j]
            out_data[o] = data[j]
            o += 1
    row[terms] = o
    return row


@numba.njit(cache=True, nogil=True, inline="always")
def _collect(acc, nb, t, keys, m, bits, tiebreak, base):
    """Append the keys of the block's documents scoring at least ``t``; the new count."""
    full = nb - nb % _CHUNK
    for c0 in range(0, full, _CHUNK):
        c = 0
        for i in range(c0, c0 + _CHUNK):  # vectorised: no branch
            c += acc[i] >= t
        if c:
            for i in range(c0, c0 + _CHUNK):
                if acc[i] >= t:
                    keys[m] = (np.int64(bits[i]) << 32) | (0xFFFFFFFF - tiebreak[base + i])
                    m += 1
    for i in range(full, nb):
        if acc[i] >= t:
            keys[m] = (np.int64(bits[i]) << 32) | (0xFFFFFFFF - tiebreak[base + i])
            m += 1
    return m


@numba.njit(cache=True, nogil=True)
def top_k(q_indptr, q_indices, q_data, w_indptr, w_indices, w_data, seg_rows, tiebreak, k, acc, cand, lo, hi):
    """The search loop, compiled by numba (as bm25s's fastest backend is). The documents
    ``[lo, hi)`` are scored one block of ``len(acc)`` rows at a time, so that the accumulator
    stays in the core's cache while every query term adds into it. Per query:

    1. per block, its terms' postings in the block (found by binary search: each term's
       postings are sorted by row) summed into the accumulator in the order a sparse product
       sums them (the query's terms in its order: by their strings, index.py's ``query_matrix``; float32, as LanceDB scores);
    2. in the first block, a threshold estimated from a strided sample of the accumulator (its
       rank chosen so that about 1.5k documents score at least that);
    3. the candidates, every document of the block scoring at least the threshold, collected
       in chunks of 64 whose vectorised count says whether the chunk holds any; in the first
       block, fewer than k, and the pass is repeated with a lower threshold from the same
       sample, then with every scoring document;
    4. one int64 key per candidate, the score's float32 bits (positive floats order as their
       bits) then ``tiebreak`` reversed; once more than 2k are held, the largest k are kept and
       the threshold rises to the k-th's score (a document below it cannot enter), and at the
       end the largest k keys are sorted.

    A document left out scores below k documents already held, so the candidates always hold
    the top k. ``lo``, ``hi``: the rows scored, all of them or one shard's; the keys carry the
    global tiebreak ranks, so the keys of several shards merge by value into exactly the
    unsharded top k (index.py's :func:`merge_keys`). ``cand`` holds at least ``len(acc) + 2k`` keys.

    Returns per query its k keys (index.py's ``decode_keys`` turns them into scores and tiebreak ranks)
    and how many it found. Blocks of index.py's ``_BLOCK`` rows against one accumulator over every
    document: the same below that size, and faster past it (docs/bulk-retrieval.md). A
    document-at-a-time loop with MaxScore pruning is slower on the bench corpus (measured: its
    queries' terms are common: about half the documents score). Compiled once per machine (the module doc)."""
    nq, n = len(q_indptr) - 1, hi - lo
    keys_out = np.zeros((nq, k), np.int64)
    found = np.zeros(nq, np.int64)
    if n <= 0:
        return keys_out, found
    block = min(len(acc), n)
    bits = acc.view(np.int32)
    keys = cand
    top = np.empty(_INSERTION_MAX, np.float32)
    tiny = np.float32(1e-30)  # "scores at all": every weight is positive
    kth_bits = np.zeros(1, np.int32)
    kth_score = kth_bits.view(np.float32)
    for r in range(nq):
        a0, m_terms = q_indptr[r], q_indptr[r + 1] - q_indptr[r]
        cur, end = np.empty(m_terms, np.int64), np.empty(m_terms, np.int64)
        m = 0
        t = tiny
        for seg in range(lo // seg_rows, (hi - 1) // seg_rows + 1):
            s0, s1 = max(lo, seg * seg_rows), min(hi, (seg + 1) * seg_rows)
            for i in range(m_terms):  # each term's postings in the segment, clipped to [lo, hi)
                term = q_indices[a0 + i]
                a, b = w_indptr[seg, term], w_indptr[seg, term + 1]
                cur[i] = first_at_least(w_indices, a, b, s0) if s0 > seg * seg_rows else a
                end[i] = first_at_least(w_indices, a, b, s1) if s1 < (seg + 1) * seg_rows else b
            for base in range(s0, s1, block):
                nb = min(block, s1 - base)
                for i in range(m_terms):
                    qv = q_data[a0 + i]
                    a = cur[i]
                    b = first_at_least(w_indices, a, end[i], base + nb) if base + nb < s1 else end[i]
                    for j in range(a, b):
                        acc[w_indices[j] - base] += qv * w_data[j]
                    cur[i] = b
                if base == lo:  # the first block: the threshold from a sample of its scores
                    stride = max(1, nb // (8 * k))
                    size = (nb + stride - 1) // stride
                    rank = min(size, (3 * k * size + 2 * nb - 1) // (2 * nb) + 1)  # ~1.5k documents expected at or above
                    deep = min(size, 4 * rank)  # the fallback threshold: ~6k documents
                    if deep <= _INSERTION_MAX:  # the sample's largest, descending, by insertion (small k)
                        top[:deep] = 0
                        for i in range(0, nb, stride):
                            s = acc[i]
                            if s > top[deep - 1]:
                                j = deep - 1
                                while j > 0 and top[j - 1] < s:
                                    top[j] = top[j - 1]
                                    j -= 1
                                top[j] = s
                        cut, low_cut = top[rank - 1], top[deep - 1]
                    else:  # linear selection: insertion would cost ~ size x deep
                        sample = np.partition(acc[:nb:stride].copy(), size - deep)
                        low_cut = sample[size - deep]
                        upper = sample[size - deep :].copy()
                        cut = np.partition(upper, deep - rank)[deep - rank]
                    for attempt in range(3):
                        t = max(cut, tiny) if attempt == 0 else max(low_cut, tiny) if attempt == 1 else tiny
                        m = _collect(acc, nb, t, keys, 0, bits, tiebreak, base)
                        if m >= k or t == tiny:
                            break
                else:
                    m = _collect(acc, nb, t, keys, m, bits, tiebreak, base)
                acc[:nb] = 0
                if m > 2 * k:  # keep the k best; none below the k-th can enter
                    keys[:k] = np.partition(keys[:m], m - k)[m - k :]
                    m = k
                    kth_bits[0] = np.int32(keys[:k].min() >> 32)
                    t = max(t, kth_score[0])
        best = keys[:m]
        if m > k:
            best = np.partition(best, m - k)[m - k :]
        best = np.sort(best)[::-1][:k]
        keys_out[r, : len(best)] = best
        found[r] = len(best)
    return keys_out, found
