"""The BM25 engine's compiled loops are compiled once per machine: the first process that
searches writes numba's cache under the project's cache root, and a second process loads every
kernel from it (numba's own log, NUMBA_DEBUG_CACHE) instead of compiling again. Kernels made
inside factory functions missed that cache in every new process (16.8 s for a fresh process's
first search on SciFact, 0.54 s for its second)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SEARCH = (
    "import numpy as np, pyarrow as pa\n"
    "from logicrank.pipelines import sparse\n"
    "docs = ['the cat sat on the mat', 'a dog and a cat', 'birds of australia that cannot fly', 'museums in paris']\n"
    "batch = pa.record_batch({'doc_id': [f'd{i}' for i in range(len(docs))], 'title': [None] * len(docs), 'text': docs,\n"
    "                         'content_hash': [str(i) for i in range(len(docs))]})\n"
    "index = sparse.BM25Index.build([batch], 1)\n"
    "counts, rows, scores = index.search_flat(['cat', 'paris museums'], 3)\n"
    "assert counts.tolist() == [2, 1], counts\n"
)


def _search(cache: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(LOGICRANK_CACHE=str(cache), NUMBA_DEBUG_CACHE="1")
    done = subprocess.run([sys.executable, "-c", SEARCH], cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_a_second_process_loads_the_kernels_from_the_cache_root(tmp_path):
    first = _search(tmp_path)
    assert "[cache] data saved to" in first and str(tmp_path / "numba") in first, first[-3000:]
    assert list((tmp_path / "numba").rglob("bm25_kernels.top_k-*.nbi")), sorted(p.name for p in tmp_path.rglob("*"))
    second = _search(tmp_path)
    assert "[cache] data loaded from" in second, second[-3000:]
    assert "[cache] data saved to" not in second, second[-3000:]  # nothing compiled again


PRELOAD = (
    "import threading, pyarrow as pa\n"
    "from logicrank.pipelines import sparse\n"
    "docs = ['the cat sat on the mat', 'a dog and a cat', 'birds of australia that cannot fly', 'museums in paris']\n"
    "batch = pa.record_batch({'doc_id': [f'd{i}' for i in range(len(docs))], 'title': [None] * len(docs), 'text': docs,\n"
    "                         'content_hash': [str(i) for i in range(len(docs))]})\n"
    "path = sparse.BM25Index.build([batch], 1).save(__import__('pathlib').Path(__import__('sys').argv[1]))\n"
    "index = sparse.MappedBM25.open(path)\n"
    "for t in threading.enumerate():\n"
    "    if t.name == 'bm25-kernels':\n"
    "        t.join()\n"
    "loaded = list(sparse.kernels().top_k.signatures)\n"
    "counts, rows, scores = index.search_flat(['cat', 'paris museums'], 3)\n"
    "assert counts.tolist() == [2, 1], counts\n"
    "print('SIGNATURES', len(loaded), len(sparse.kernels().top_k.signatures))\n"
)


def test_a_mapped_index_loads_its_search_loop_before_the_first_search(tmp_path):
    """Opening a mapped index (the job's stages, every shard actor) loads the search loop for
    its argument types in the background: the search that follows finds it loaded (one
    signature before and after, so the preload dispatched exactly the types a search passes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(LOGICRANK_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", PRELOAD, str(tmp_path / "index")], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SIGNATURES 1 1" in done.stdout, done.stdout
