"""The BM25 engine's loops are compiled once per machine. The search loop is compiled ahead
of time into a module under the project's cache root, which a later process loads without
numba (pipelines/engines/bm25/compiled.py); where it cannot be built (here: a C compiler that fails) the
failure is recorded once and numba's JIT loop serves, its machine code in numba's cache under
the cache root, which a second process loads (numba's own log, NUMBA_DEBUG_CACHE) instead of
compiling again. Kernels made inside factory functions missed that cache in every new process
(16.8 s for a fresh process's first search on SciFact, 0.54 s for its second); numba's own
start in each process (0.4 s) made the first search 4.7x the second."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.slow]  # each test compiles the search loop in child processes

SEARCH = (
    "import numpy as np, pyarrow as pa\n"
    "from logicrank.pipelines.engines import bm25\n"
    "docs = ['the cat sat on the mat', 'a dog and a cat', 'birds of australia that cannot fly', 'museums in paris']\n"
    "batch = pa.record_batch({'doc_id': [f'd{i}' for i in range(len(docs))], 'title': [None] * len(docs), 'text': docs,\n"
    "                         'content_hash': [str(i) for i in range(len(docs))]})\n"
    "index = bm25.BM25Index.build([batch], 1)\n"
    "counts, rows, scores = index.search_flat(['cat', 'paris museums'], 3)\n"
    "assert counts.tolist() == [2, 1], counts\n"
)


def _search(cache: Path, code: str = SEARCH, *args: str, **env_vars: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "LOGICRANK_BM25"))}
    env.update(LOGICRANK_CACHE=str(cache), NUMBA_DEBUG_CACHE="1", **env_vars)
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


# a saved index searched by a process that only searches: numba is never imported there
MAPPED = (
    "import sys, pathlib, pyarrow as pa\n"
    "from logicrank.pipelines.engines import bm25\n"
    "path = pathlib.Path(sys.argv[1])\n"
    "if not (path / 'meta.json').is_file():\n"
    "    docs = ['the cat sat on the mat', 'a dog and a cat', 'birds of australia that cannot fly', 'museums in paris']\n"
    "    batch = pa.record_batch({'doc_id': [f'd{i}' for i in range(len(docs))], 'title': [None] * len(docs), 'text': docs,\n"
    "                             'content_hash': [str(i) for i in range(len(docs))]})\n"
    "    bm25.BM25Index.build([batch], 1).save(path)\n"
    "    print('BUILT')\n"
    "else:\n"
    "    counts, rows, scores = bm25.MappedBM25.open(path).search_flat(['cat', 'paris museums'], 3)\n"
    "    assert counts.tolist() == [2, 1], counts\n"
    "    print('NUMBA', 'numba' in sys.modules)\n"
)


def test_the_search_loop_is_compiled_once_and_a_later_process_searches_without_numba(tmp_path):
    from logicrank.pipelines.engines.bm25 import compiled

    cache = tmp_path / "cache"
    assert "BUILT" in _search(cache, MAPPED, str(tmp_path / "index"))
    first = _search(cache, MAPPED, str(tmp_path / "index"))  # the first search on this cache root: builds the module
    built = list((cache / "bm25-compiled").rglob(f"{compiled.MODULE_NAME}*"))
    assert len(built) == 1 and not list((cache / "bm25-compiled").rglob("failed.txt")), sorted(p.name for p in cache.rglob("*"))
    assert "NUMBA False" in first, first[-3000:]
    made = built[0].stat().st_mtime_ns
    second = _search(cache, MAPPED, str(tmp_path / "index"))
    assert "NUMBA False" in second, second[-3000:]
    assert list((cache / "bm25-compiled").rglob(f"{compiled.MODULE_NAME}*")) == built and built[0].stat().st_mtime_ns == made  # not built again


def test_a_search_loop_that_cannot_be_compiled_is_recorded_once_and_the_jit_loop_serves(tmp_path):
    cache = tmp_path / "cache"
    assert "BUILT" in _search(cache, MAPPED, str(tmp_path / "index"))
    failing = _search(cache, MAPPED, str(tmp_path / "index"), CC="false")  # pycc's C compiler fails
    assert "NUMBA True" in failing and "could not compile the search loop ahead of time" in failing, failing[-3000:]
    failed = list((cache / "bm25-compiled").rglob("failed.txt"))
    assert len(failed) == 1, sorted(p.name for p in cache.rglob("*"))
    again = _search(cache, MAPPED, str(tmp_path / "index"))  # a compiler now: the recorded failure stands, no build tried
    assert "NUMBA True" in again and "could not compile" not in again, again[-3000:]
    assert not list((cache / "bm25-compiled").rglob("logicrank_bm25_top_k*"))


def test_a_second_process_loads_the_jit_kernels_from_the_cache_root(tmp_path):
    """Where the JIT loop serves (here turned on by LOGICRANK_BM25_COMPILED=0), numba's cache
    hits in a second process; the kernels are cached under the digest of kernels.py's content
    (pipelines/numba_cache.py: tests/unit/test_numba_cache.py), not under its path."""
    from logicrank.pipelines.numba_cache import ContentKeyedCache

    digest = ContentKeyedCache("bm25", ROOT / "pipelines" / "engines" / "bm25" / "kernels.py").digest
    first = _search(tmp_path, LOGICRANK_BM25_COMPILED="0")
    assert f"[cache] data saved to '{tmp_path / 'numba' / f'bm25-{digest}'}" in first, first[-3000:]
    assert list((tmp_path / "numba").rglob("kernels.top_k-*.nbi")), sorted(p.name for p in tmp_path.rglob("*"))
    second = _search(tmp_path, LOGICRANK_BM25_COMPILED="0")
    assert "[cache] data loaded from" in second, second[-3000:]
    assert "[cache] data saved to" not in second, second[-3000:]  # nothing compiled again


PRELOAD = (
    "import threading, pyarrow as pa\n"
    "from logicrank.pipelines.engines import bm25\n"
    "from logicrank.pipelines.engines.bm25 import loading\n"
    "docs = ['the cat sat on the mat', 'a dog and a cat', 'birds of australia that cannot fly', 'museums in paris']\n"
    "batch = pa.record_batch({'doc_id': [f'd{i}' for i in range(len(docs))], 'title': [None] * len(docs), 'text': docs,\n"
    "                         'content_hash': [str(i) for i in range(len(docs))]})\n"
    "path = bm25.BM25Index.build([batch], 1).save(__import__('pathlib').Path(__import__('sys').argv[1]))\n"
    "index = bm25.MappedBM25.open(path)\n"
    "for t in threading.enumerate():\n"
    "    if t.name == 'bm25-kernels':\n"
    "        t.join()\n"
    "loaded = list(loading.kernels().__getattr__('top_k').signatures)\n"
    "counts, rows, scores = index.search_flat(['cat', 'paris museums'], 3)\n"
    "assert counts.tolist() == [2, 1], counts\n"
    "print('SIGNATURES', len(loaded), len(loading.kernels().__getattr__('top_k').signatures))\n"
)


def test_a_mapped_index_loads_its_search_loop_before_the_first_search(tmp_path):
    """Where the JIT loop serves, opening a mapped index (the job's stages, every shard actor) loads the search loop for
    its argument types in the background: the search that follows finds it loaded (one
    signature before and after, so the preload dispatched exactly the types a search passes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(LOGICRANK_CACHE=str(tmp_path / "cache"), LOGICRANK_BM25_COMPILED="0")
    done = subprocess.run([sys.executable, "-c", PRELOAD, str(tmp_path / "index")], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SIGNATURES 1 1" in done.stdout, done.stdout
