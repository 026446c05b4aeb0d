"""Indexing benchmark: the index job against bare batched encoding, side by side in one run (not a test).

    make bench-index       # all 5,183 SciFact documents: backends auto and torch, placements default and 2x0.75
    python tests/perf/bench_index.py --docs 2000 --backends auto --placements default   # a quicker run

For each backend, on the same texts:
  encoder  logicrank's Embedder in one process with every core, one ``encode`` over all texts
           (sorted by length inside, batches of ``EmbedConfig.batch_size``): the bare peer,
           with and without its model load;
  index    the full ``logicrank index`` job for each placement (``default``: the pool sized to
           the cluster, what ``logicrank index`` does when no --actors is given; ``AxC``: A
           actors of C CPUs, each with floor(cores / A) threads), cold: Ray's start, the actors'
           start and model load, LanceDB writes, maintenance and the BM25 index included;
  reindex  the default job again on the unchanged corpus.
Goals (issue 24): default index docs/s >= 0.9x the bare encoder's with its load; reindex s <= 0.1x full.
An OpenVINO model converted once is cached (LOGICRANK_CACHE): the first run of a fresh cache converts it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logicrank.jobs.index import run_index  # noqa: E402
from logicrank.pipelines.config.settings import EmbedConfig, IndexConfig, RayConfig  # noqa: E402
from logicrank.pipelines.datasets import scifact  # noqa: E402
from logicrank.pipelines.engines.embed import Embedder, document_text  # noqa: E402
from logicrank.pipelines.markdown import table  # noqa: E402
from tests.perf.report import write_report  # noqa: E402


def _corpus(n: int, path: Path) -> list[str]:
    texts = []
    with gzip.open(scifact().corpus, "rt", encoding="utf-8") as f, open(path, "w", encoding="utf-8") as out:
        for line in f:
            d = json.loads(line)
            out.write(line)
            texts.append(document_text(d["title"], d["text"]))
            if n and len(texts) == n:
                break
    return texts


def _timed(fn):
    t = time.perf_counter()
    result = fn()
    return time.perf_counter() - t, result


def _placement(name: str, embed: EmbedConfig) -> tuple[RayConfig, EmbedConfig]:
    if name == "default":
        return RayConfig(), embed
    actors, cpus = name.split("x")
    threads = max(1, (os.cpu_count() or 1) // int(actors))
    return RayConfig(embed_actors=int(actors), embed_num_cpus=float(cpus)), embed.model_copy(update={"threads": threads})


def _pool(pool: dict) -> str:
    return pool["how"] if not pool["actors"] else f"{pool['actors']} x {pool['num_cpus']:g} CPU, {pool['how']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=0, help="SciFact documents to use (0: all 5,183)")
    ap.add_argument("--backends", default="auto", help="comma-separated: auto, torch, openvino")
    ap.add_argument("--placements", default="default", help="comma-separated: default, or AxC (A actors of C CPUs)")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="logicrank-bench-"))
    corpus = work / "corpus.jsonl"
    texts = _corpus(args.docs, corpus)
    n = len(texts)
    rows = []
    for backend in args.backends.split(","):
        embed = EmbedConfig(backend=backend)
        load_s, enc = _timed(lambda embed=embed: Embedder(embed))
        enc_s, _ = _timed(lambda enc=enc: enc.encode(texts))
        resolved = enc.backend
        del enc
        for name in args.placements.split(","):
            ray_cfg, embed_p = _placement(name, embed)
            db = work / f"db-{backend}-{name}"
            cfg = IndexConfig(corpus=str(corpus), db=str(db), embed=embed_p, ray=ray_cfg)
            full_s, full = _timed(lambda cfg=cfg, db=db: run_index(cfg, db.with_name(db.name + "-full")))
            re_s, again = _timed(lambda cfg=cfg, db=db: run_index(cfg, db.with_name(db.name + "-again"))) if name == "default" else (None, None)
            assert full.inserted == n and (again is None or again.embedded == 0), (full, again)
            rows.append({
                "backend": resolved, "placement": name, "pool": full.placement, "docs": n,
                "encoder_docs_per_s": n / enc_s, "encoder_load_s": load_s, "encoder_with_load_docs_per_s": n / (enc_s + load_s),
                "index_s": full_s, "index_docs_per_s": n / full_s, "index_vs_encoder_with_load": (enc_s + load_s) / full_s,
                "index_vs_encoder": enc_s / full_s, "reindex_unchanged_s": re_s, "reindex_vs_full": re_s / full_s if re_s else None,
            })
            print(json.dumps(rows[-1]), flush=True)
    shutil.rmtree(work, ignore_errors=True)

    lines = [
        f"# Indexing benchmark ({n} SciFact documents, {os.cpu_count()} cores, one run)",
        "",
    ]
    cells = []
    for r in rows:
        pool = r["pool"]
        reindex = [f"{r['reindex_unchanged_s']:.1f}", f"{r['reindex_vs_full']:.3f}"] if r["reindex_unchanged_s"] else ["-", "-"]
        cells.append([
            str(r["backend"]), f"{r['placement']} ({_pool(pool)})",
            f"{r['encoder_docs_per_s']:.1f}", f"{r['encoder_with_load_docs_per_s']:.1f}", f"{r['index_docs_per_s']:.1f}",
            f"{r['index_vs_encoder_with_load']:.2f}", f"{r['index_vs_encoder']:.2f}", f"{r['index_s']:.1f}", *reindex,
        ])
    lines += table(["backend", "placement (pool)", "bare encoder docs/s", "bare encoder with its load docs/s", "index job docs/s",
                    "index / bare with load (goal >= 0.9)", "index / bare", "full index s", "unchanged re-index s",
                    "re-index / full (goal <= 0.1)"], cells, align="llrrrrrrrr")
    write_report(args.out, "bench_index", rows, lines)


if __name__ == "__main__":
    main()
