"""The index job's encoder on a GPU: ``Embedder`` (pipelines/engines/embed.py, torch) on CUDA, its
documents per second by batch size, and its vectors against the same code's on a CPU.

    python tests/perf/device_embed.py --model DIR --save-reference ref.npy      # on a CPU machine
    python tests/perf/device_embed.py --model DIR --reference ref.npy --out runs/bench   # on the GPU

Needs numpy, pyarrow, torch, sentence-transformers and pydantic only: logicrank's folders are mapped
from the repository (:func:`_mount`), so it runs on a bare GPU machine whose Python is not the
project's. ``--model``: a sentence-transformers model directory (all-MiniLM-L6-v2's, as the
package that ships it holds it, or a copy of it); its weights are run in float32 whatever
precision its file stores (``--half`` adds a float16 run). The documents: passages drawn
(seeded) from bundled SciFact's abstracts, two or three sentences each, as the index benches
make them (tests/perf/bench_scale.py), joined to their title as the index job joins them.

Reported per batch size: documents per second of ``Embedder.encode`` (tokenization on the host
included, as the index job's encoders run it; a warm-up call first); then its two parts timed
alone over the same documents: the host's (its fixed-shape batches made: every text tokenized
for its length, then each batch tokenized) and the GPU's (the forward passes over those batches,
each pooled vector copied back); the GPU's peak memory; against ``--reference`` (the first
``--sample`` passages' vectors, saved by this script on a CPU), the largest difference of any
vector component and the smallest cosine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository, where nothing may be installed


def _mount() -> None:
    """``logicrank.pipelines`` and ``logicrank.schemas`` importable where the project is not
    installed: pyproject.toml maps them to the folders pipelines/ and schemas/."""
    try:
        import logicrank.pipelines  # noqa: F401 - installed (or mapped already)
        return
    except ImportError:
        pass
    import logicrank

    for name, folder in (("logicrank.schemas", "schemas"), ("logicrank.pipelines", "pipelines")):
        spec = importlib.util.spec_from_file_location(name, ROOT / folder / "__init__.py", submodule_search_locations=[str(ROOT / folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        setattr(logicrank, name.rpartition(".")[2], module)


def _texts(n: int, seed: int) -> list[str]:
    from tests.perf.bench_scale import passages, sentences

    sents, owner, _, titles = sentences(ROOT / "pipelines" / "datasets" / "scifact" / "corpus.jsonl.gz")
    return [f"{titles[owner[p[0]]]} {' '.join(sents[j] for j in p)}" for p in passages(n, seed, len(sents))]


def _embedder(model: str, device: str, batch_size: int):
    _mount()
    from logicrank.pipelines.config.embedding import EmbedConfig
    from logicrank.pipelines.engines.embed import Embedder

    embedder = Embedder(EmbedConfig(model=model, backend="torch", device=device, batch_size=batch_size))
    embedder.model.float()  # a copy of the weights may be stored in float16 (it travels in half the bytes)
    return embedder


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a sentence-transformers model directory")
    ap.add_argument("--docs", type=int, default=100_000, help="documents encoded per batch size")
    ap.add_argument("--batch-sizes", default="64,256,1024")
    ap.add_argument("--sample", type=int, default=1000, help="passages compared with the reference")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-reference", type=Path, help="encode the sample on the CPU into this .npy and stop")
    ap.add_argument("--reference", type=Path, help="the CPU's vectors of the sample (--save-reference)")
    ap.add_argument("--half", action="store_true", help="also run the model in float16 at the largest batch size")
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    args = ap.parse_args(argv)
    texts = _texts(max(args.docs, args.sample), args.seed)
    sample = texts[: args.sample]
    if args.save_reference:
        np.save(args.save_reference, _embedder(args.model, "cpu", 16).encode(sample))
        print(f"saved {args.sample} CPU vectors in {args.save_reference}")
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("device_embed: no CUDA device here")
    reference = np.load(args.reference) if args.reference else None
    rows = []
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    runs = [(b, "float32") for b in sizes] + ([(sizes[-1], "float16")] if args.half else [])
    embedder = _embedder(args.model, "cuda", sizes[0])
    tokenizer = embedder.model.tokenizer
    from logicrank.pipelines.engines.embed import fixed_shape_batches
    for batch_size, precision in runs:
        embedder.config = embedder.config.model_copy(update={"batch_size": batch_size})
        embedder.model.to(torch.float16 if precision == "float16" else torch.float32)
        embedder.encode(texts[:2048])  # warm-up: kernels chosen, memory taken
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        vectors = embedder.encode(texts[: args.docs])
        seconds = time.perf_counter() - t
        t = time.perf_counter()
        batches = list(fixed_shape_batches(tokenizer, texts[: args.docs], embedder.model.max_seq_length, batch_size, "pt"))
        host_s = time.perf_counter() - t
        with torch.inference_mode():
            torch.cuda.synchronize()
            t = time.perf_counter()
            for idx, features in batches:
                pooled = embedder.model({k: v.to("cuda") for k, v in features.items()})["sentence_embedding"][: len(idx)]
                torch.nn.functional.normalize(pooled, p=2, dim=1).float().cpu()
            forward_s = time.perf_counter() - t
        row = {"batch_size": batch_size, "precision": precision, "docs": args.docs, "seconds": round(seconds, 2),
               "docs_per_s": round(args.docs / seconds), "host_s": round(host_s, 2), "forward_s": round(forward_s, 2),
               "passes": len(batches), "rows_padded": sum(int(f["input_ids"].shape[0]) for _, f in batches) - args.docs,
               "gpu_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}
        if reference is not None:
            got = vectors[: args.sample]
            row["max_abs_diff_vs_cpu"] = float(np.abs(got - reference).max())
            row["min_cosine_vs_cpu"] = float((got * reference).sum(axis=1).min())
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
            "model": str(args.model), "sample": args.sample, "seed": args.seed}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_embed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print("| batch | precision | docs/s | its batches made alone s | its forward passes alone s | GPU peak GiB | largest difference vs CPU | smallest cosine vs CPU |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['batch_size']} | {r['precision']} | {r['docs_per_s']:,} | {r['host_s']} | {r['forward_s']} | {r['gpu_peak_gib']} | "
              f"{r.get('max_abs_diff_vs_cpu', '-')} | {r.get('min_cosine_vs_cpu', '-')} |")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
