"""`logicrank nightly-demo`: three nights of `logicrank nightly` on bundled SciFact.

Night 1 indexes the corpus as shipped (the baseline); night 2's snapshot edits and deletes a
few documents no query needs (no regression expected); night 3's snapshot swaps the texts
of the relevant documents of some queries with other documents' (their quality must drop,
the alert must fire, and the served tag must stay on night 2's version). The snapshots are written under ``<out>/snapshots/``; the nightly
config the demo runs is ``<out>/nightly.yaml``, so every night can be rerun by hand.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable
from pathlib import Path

import yaml

from logicrank.pipelines.datasets import scifact

DATES = ("2026-11-20", "2026-11-21", "2026-11-22")


def read_docs(path: str | Path, limit: int | None = None, text_chars: int | None = None) -> list[dict]:
    """BEIR corpus rows (``_id``, ``title``, ``text``) of a JSONL(.gz) file."""
    opener = gzip.open if str(path).endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            out.append({"_id": d["_id"], "title": d.get("title", ""), "text": d["text"][:text_chars] if text_chars else d["text"]})
            if limit is not None and len(out) == limit:
                break
    return out


def relevant_ids(qrels: str | Path) -> dict[str, set[str]]:
    """query id -> its relevant document ids (BEIR qrels TSV with a header)."""
    out: dict[str, set[str]] = {}
    with open(qrels, encoding="utf-8") as f:
        next(f)
        for line in f:
            q, d, rel = line.rstrip("\n").split("\t")[:3]
            if int(rel) > 0:
                out.setdefault(q, set()).add(d)
    return out


def changed(docs: list[dict], protected: set[str], edit: int, delete: int, seed: int = 0) -> list[dict]:
    """A routine night's snapshot: ``edit`` documents outside ``protected`` get a sentence
    more, ``delete`` others are gone."""
    rng = random.Random(seed)
    free = sorted(d["_id"] for d in docs if d["_id"] not in protected)
    picked = rng.sample(free, edit + delete)
    edited, deleted = set(picked[:edit]), set(picked[edit:])
    return [{**d, "text": d["text"] + " This abstract was revised."} if d["_id"] in edited else d
            for d in docs if d["_id"] not in deleted]


def corrupted(docs: list[dict], victims: set[str], seed: int = 0) -> list[dict]:
    """A broken snapshot: each document in ``victims`` carries another (non-victim)
    document's title and text, as when an upstream join goes wrong."""
    rng = random.Random(seed)
    donors = [d for d in docs if d["_id"] not in victims]
    return [{"_id": d["_id"], **{k: v for k, v in rng.choice(donors).items() if k != "_id"}} if d["_id"] in victims else d for d in docs]


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def demo_config(out: Path, corpus: Path, queries: str, qrels: str, backend: str = "auto", address: str | None = None) -> dict:
    """The demo's nightly config: dense and bm25 on SciFact's test queries."""
    return {
        "out": str(out / "nightly"),
        "index": {"corpus": str(corpus), "db": str(out / "lancedb"), "table": "docs", "embed": {"backend": backend},
                  "ray": {"address": address}},
        "query_sets": {"scifact": {"queries": queries, "qrels": qrels}},
        "pipelines": {"dense": [{"stage": "dense", "k": 100}], "bm25": [{"stage": "bm25", "k": 100}]},
        "measures": ["nDCG@10", "P@1", "R@100"],
        "regressions": {"nDCG@10": {"max_drop": 0.01}, "R@100": {"max_drop": 0.02}},
    }


def run_demo(out: str | Path, corrupt_queries: int = 60, echo: Callable[[str], None] | None = None,
             backend: str = "auto", address: str | None = None) -> list:
    """Three nights; returns their :class:`logicrank.jobs.nightly.NightResult`."""
    import shutil

    from logicrank.jobs.nightly import run_nightly
    from logicrank.pipelines.config.retrieval import NightlyConfig

    out = Path(out)
    for part in ("nightly", "lancedb", "snapshots"):  # a demo starts from nothing (nights run in date order)
        shutil.rmtree(out / part, ignore_errors=True)
    data = scifact()
    docs = read_docs(data.corpus)
    rel = relevant_ids(data.qrels)
    needed = set().union(*rel.values())
    victims = set().union(*(rel[q] for q in sorted(rel)[:corrupt_queries]))
    routine = changed(docs, needed, edit=40, delete=20)
    snapshots = [docs, routine, corrupted(routine, victims)]
    corpus = out / "snapshots" / "current.jsonl"  # the path the nightly reads: each night's snapshot replaces it
    config = demo_config(out, corpus, str(data.queries), str(data.qrels), backend, address)
    (out / "nightly.yaml").parent.mkdir(parents=True, exist_ok=True)
    (out / "nightly.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cfg = NightlyConfig.model_validate(config)
    results = []
    for day, snapshot in zip(DATES, snapshots, strict=True):
        write_jsonl(snapshot, out / "snapshots" / f"{day}.jsonl")
        write_jsonl(snapshot, corpus)
        if echo:
            echo(f"-- night {day}: snapshot of {len(snapshot)} documents")
        results.append(run_nightly(cfg, day, echo=echo))
    return results
