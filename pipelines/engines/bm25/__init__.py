"""BM25 as a batch engine: a sparse index kept beside the table, tied to its version, whose
scores are LanceDB's full-text search's (``CombinedFieldsQuery`` over title and text: BM25F
with Lucene's combined statistics; a query term counts as often as the query repeats it, where
LanceDB counts it once), searched by one compiled loop per batch of queries.

The modules, from the bottom up:

* ``analyzer.py``: text -> terms (:class:`Analyzer`, LanceDB's analyzer with Lucene's
  English stop words; :func:`default_analyzer`, the process's one) and the
  :class:`Vocabulary` (term <-> id);
* ``kernels.py``: the loops for numba (the search loop ``top_k``, the segment layout's
  kernels); importing it loads numba;
* ``compiled.py``: the search loop compiled ahead of time once per machine and loaded
  without numba (``LOGICRANK_BM25_COMPILED=0``: numba's JIT loop always);
* ``loading.py``: which loop runs, imported on first use (``loading.kernels()``), and the
  search loop's load in a background thread (:func:`preload_kernels`);
* ``index.py``: the scores (k1, b, the combined statistics), the search over an index's
  arrays every index shares (:class:`BM25Search`: query matrix, top k, term scores, the
  search keys that merge across shards) and the index made in memory (:class:`BM25Index`:
  built from a scan);
* ``storage.py``: one saved index on disk: its format (:data:`FORMAT`), its files, the
  weights in segments of documents (:func:`segmented`), writing and reading them;
* ``segments.py``: a build in segments of documents, each step a task any worker can run
  (analyze, merge, weigh, assemble), saving the same arrays as a build in one scan; and a
  patch from an earlier saved index in the same steps, analyzing only the new documents;
* ``mapped.py``: a saved index mapped from disk for search (:class:`MappedBM25`);
* ``versions.py``: the saved indexes beside a table, one per version
  (``<db>/_bm25/<table>/v<version>/``): opening, making, updating, pruning, dropping.

The names the rest of the code uses are re-exported here. Two are not: ``loading.kernels()``
(the package's ``kernels`` is the module kernels.py) and ``storage.SEGMENT_ROWS``, read where
an index is saved (a test that sets it sets it on storage).
"""

from logicrank.pipelines.engines.bm25.analyzer import ENGLISH_STOP_WORDS, Analyzer, Vocabulary, default_analyzer
from logicrank.pipelines.engines.bm25.index import BM25Index, BM25Search, decode_keys, merge_keys, tiebreak_ranks
from logicrank.pipelines.engines.bm25.loading import preload_kernels
from logicrank.pipelines.engines.bm25.mapped import MappedBM25
from logicrank.pipelines.engines.bm25.storage import FORMAT, segmented
from logicrank.pipelines.engines.bm25.versions import (
    SOURCE_COLUMNS,
    drop_indexes,
    ensure_index,
    index_root,
    open_index,
    prune_indexes,
    saved_versions,
    update_index,
)

__all__ = [
    "ENGLISH_STOP_WORDS", "FORMAT", "SOURCE_COLUMNS", "Analyzer", "BM25Index", "BM25Search", "MappedBM25", "Vocabulary", "decode_keys",
    "default_analyzer", "drop_indexes", "ensure_index", "index_root", "merge_keys", "open_index", "preload_kernels",
    "prune_indexes", "saved_versions", "segmented", "tiebreak_ranks", "update_index",
]
