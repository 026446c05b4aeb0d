"""Indexing benchmark: ratios measured side by side in one run (not a test).

    make bench                      # SciFact, first 2,000 documents, both backends
    python tests/perf/bench_index.py --docs 0 --backends openvino   # all 5,183

For each backend, on the same texts:
  unsorted sentence-transformers (torch), batches of 32 in corpus order;
  plain    sentence-transformers `encode` (torch, sorts by length inside), model already loaded;
  encoder  logicrank's Embedder for that backend, model already loaded;
  ray      the full `logicrank index` job (Ray Data, actor pool, LanceDB writes, indexes),
           cold: actor start and model load included;
  reindex  the same job again on the unchanged corpus.
Goals (issue 2): ray docs/s / plain docs/s >= 0.9; reindex s / full index s <= 0.1.
The Ray figure includes starting the actor and loading the model; the plain and encoder
figures are also given with their model load included, for a like-for-like ratio.
An OpenVINO model converted once is cached (~/.cache/logicrank): run twice for warm figures.
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

from jobs.index import run_index  # noqa: E402
from jobs.raysession import ray_session  # noqa: E402
from pipelines.datasets import scifact  # noqa: E402
from pipelines.embed import Embedder, document_text, resolve_model  # noqa: E402
from schemas.config import EmbedConfig, IndexConfig, RayConfig  # noqa: E402


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=2000, help="SciFact documents to use (0: all 5,183)")
    ap.add_argument("--backends", default="torch,openvino")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="logicrank-bench-"))
    corpus = work / "corpus.jsonl"
    texts = _corpus(args.docs, corpus)
    n = len(texts)
    rows = []
    ray_cfg = RayConfig()
    from sentence_transformers import SentenceTransformer

    load_s, model = _timed(lambda: SentenceTransformer(resolve_model(EmbedConfig().model), device="cpu"))
    plain_s, _ = _timed(lambda: model.encode(texts, batch_size=32, normalize_embeddings=True))
    # the same model and batch size, batches in corpus order (no sorting by length)
    unsorted_s, _ = _timed(lambda: [model.encode(texts[i : i + 32], batch_size=32, normalize_embeddings=True) for i in range(0, n, 32)])
    with ray_session(ray_cfg):
        for backend in args.backends.split(","):
            embed = EmbedConfig(backend=backend)
            enc_load_s, enc = _timed(lambda embed=embed: Embedder(embed))
            enc_s, _ = _timed(lambda enc=enc: enc.encode(texts))
            del enc
            db = work / f"db-{backend}"
            cfg = IndexConfig(corpus=str(corpus), db=str(db), embed=embed, ray=ray_cfg)
            full_s, full = _timed(lambda cfg=cfg, b=backend: run_index(cfg, work / f"run-{b}-full"))
            re_s, again = _timed(lambda cfg=cfg, b=backend: run_index(cfg, work / f"run-{b}-again"))
            assert full.inserted == n and again.embedded == 0, (full, again)
            rows.append(
                {
                    "backend": backend,
                    "docs": n,
                    "plain_st_torch_docs_per_s": n / plain_s,
                    "unsorted_batches_torch_docs_per_s": n / unsorted_s,
                    "encoder_docs_per_s": n / enc_s,
                    "ray_index_docs_per_s": n / full_s,
                    "ratio_ray_vs_plain": (n / full_s) / (n / plain_s),
                    "ratio_ray_vs_same_encoder": (n / full_s) / (n / enc_s),
                    "ratio_ray_vs_plain_with_load": (plain_s + load_s) / full_s,
                    "ratio_ray_vs_same_encoder_with_load": (enc_s + enc_load_s) / full_s,
                    "full_index_s": full_s,
                    "reindex_unchanged_s": re_s,
                    "ratio_reindex_vs_full": re_s / full_s,
                }
            )
            print(json.dumps(rows[-1], indent=2), flush=True)
    shutil.rmtree(work, ignore_errors=True)

    lines = [
        f"# Indexing benchmark ({n} SciFact docs, {os.cpu_count()} CPUs, one run)",
        "",
        "| backend | unsorted batches torch docs/s | plain ST torch docs/s (sorted) | encoder docs/s | Ray index docs/s | Ray / plain (goal >= 0.9) | Ray / same encoder | Ray / plain, load included | Ray / same encoder, load included | full index s | unchanged re-index s | re-index / full (goal <= 0.1) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['unsorted_batches_torch_docs_per_s']:.1f} | {r['plain_st_torch_docs_per_s']:.1f} | {r['encoder_docs_per_s']:.1f} | {r['ray_index_docs_per_s']:.1f} "
            f"| {r['ratio_ray_vs_plain']:.2f} | {r['ratio_ray_vs_same_encoder']:.2f} | {r['ratio_ray_vs_plain_with_load']:.2f} "
            f"| {r['ratio_ray_vs_same_encoder_with_load']:.2f} | {r['full_index_s']:.1f} "
            f"| {r['reindex_unchanged_s']:.1f} | {r['ratio_reindex_vs_full']:.3f} |"
        )
    (out / "bench_index.md").write_text("\n".join(lines) + "\n")
    (out / "bench_index.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
