"""`logicrank generate itlr` on a real index, a real Ray pool and vLLM (a tiny random Llama:
assert on structure, not content): complete, seeded, and resumable after a SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.generate import GenerateError, run_generate
from pipelines.generate.synthetic import TEMPLATES
from schemas.config import GenerateConfig
from tests.compare import assert_tables_close, close

ROOT = Path(__file__).resolve().parents[2]


def _cfg(synthetic, tiny_cfg, **kw) -> GenerateConfig:
    base = dict(db=str(synthetic / "db"), docs=24, shard_docs=4, questions_per_shard=6, candidate_k=3, wave_shards=1,
                document_tokens=64, topic_tokens=24, question_tokens=24, llm=tiny_cfg.model_copy(update={"cache": None}))
    return GenerateConfig(**(base | kw))


def _same(a: Path, b: Path, threshold: float = 0.5) -> None:
    """The same dataset: questions exactly; labels by (query, document) with P(True) and the
    logits within tests/compare.py's tolerance (another batch or CPU may move their last bits);
    qrels exactly, except a pair whose P(True) is within that tolerance of the threshold."""
    assert (a / "queries.jsonl").read_bytes() == (b / "queries.jsonl").read_bytes()
    labels = pq.read_table(a / "labels.parquet")
    assert_tables_close(pq.read_table(b / "labels.parquet").drop(["label"]), labels.drop(["label"]), ["query_id", "doc_id"], "labels")
    on_edge = {(q, d) for q, d, p in zip(*(labels.column(c).to_pylist() for c in ("query_id", "doc_id", "p_true")), strict=True)
               if close(p, threshold)}
    qrels = [set(tuple(line.split("\t")[:2]) for line in (x / "qrels" / "test.tsv").read_text().splitlines()[1:]) for x in (a, b)]
    assert qrels[0] - on_edge == qrels[1] - on_edge, "qrels differ beyond P(True)s tied with the threshold"


@pytest.fixture(scope="module")
def clean(synthetic, tiny_cfg, tmp_path_factory):
    """One uninterrupted run: the reference of the determinism and resume tests."""
    out = tmp_path_factory.mktemp("generate") / "a"
    return out, run_generate(_cfg(synthetic, tiny_cfg), out, echo=lambda m: None)


def test_a_dataset_is_complete_and_the_same_config_gives_the_same_dataset(synthetic, tiny_cfg, tmp_path, clean):
    cfg = _cfg(synthetic, tiny_cfg)
    a, c = clean
    run_generate(cfg.model_copy(update={"wave_shards": 3}), tmp_path / "b", echo=lambda m: None)  # placement does not change the data
    _same(a, tmp_path / "b")
    queries = [json.loads(line) for line in (a / "queries.jsonl").read_text().splitlines()]
    assert c["shards"] == 6 and c["drafted"] == 36 and len(queries) == c["questions"] == 36 - c["dedup"]["exact"] - c["dedup"]["near"]
    assert sum(c["per_template"].values()) == c["questions"]
    drafted = Counter(t for s in range(6) for t in pq.read_table(a / "checkpoints" / "questions" / f"shard-{s:05d}.parquet").column("template").to_pylist())
    assert set(drafted) == {t.name for t in TEMPLATES} and sum(drafted.values()) == 36  # 6 shards x 6 questions: every template drafted
    for q in queries:  # the logical form beside the question, three terms from three different sampled documents
        assert q["logical_query"].count('"') >= 6 and len(set(q["source_doc_ids"])) == 3 and q["text"].endswith("?")
    labels = pq.read_table(a / "labels.parquet").to_pylist()
    candidates = {}
    for name in cfg.candidates:  # every candidate of every kept question is judged once
        for r in pq.read_table(a / "checkpoints" / "candidates" / "runs" / f"{name}.parquet").to_pylist():
            candidates.setdefault((r["query_id"], r["doc_id"]), set()).add(name)
    assert {(r["query_id"], r["doc_id"]): set(r["sources"]) for r in labels} == candidates
    assert all(r["label"] == int(r["p_true"] >= cfg.label_threshold) for r in labels)
    qrels = (a / "qrels" / "test.tsv").read_text().splitlines()[1:]
    assert len(qrels) == c["labels"]["relevant"] == sum(r["label"] for r in labels)
    card = (a / "card.md").read_text()
    assert cfg.dataset_digest() in card and f"**{c['questions']} kept**" in card
    other = run_generate(cfg.model_copy(update={"seed": 1}), tmp_path / "c", echo=lambda m: None)
    assert (tmp_path / "c" / "queries.jsonl").read_bytes() != (a / "queries.jsonl").read_bytes() and other["questions"] > 0


def test_a_run_directory_of_another_config_is_refused(synthetic, tiny_cfg, clean):
    with pytest.raises(GenerateError, match="holds the checkpoints of another config"):
        run_generate(_cfg(synthetic, tiny_cfg, seed=5), clean[0], echo=lambda m: None)


def test_a_killed_run_resumes_without_losing_or_repeating_rows(synthetic, tiny_cfg, tmp_path, ray_cluster, clean):
    cfg = _cfg(synthetic, tiny_cfg)
    killed = tmp_path / "killed"
    child = (
        "import json, sys; from jobs.generate import run_generate; from schemas.config import GenerateConfig; "
        "run_generate(GenerateConfig.model_validate_json(sys.argv[1]), sys.argv[2], echo=lambda m: None)"
    )
    address = ray_cluster.get_runtime_context().gcs_address
    spec = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": address})}).model_dump_json()
    proc = subprocess.Popen([sys.executable, "-c", child, spec, str(killed)], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first_label = killed / "checkpoints" / "labels" / "shard-00000.parquet"
    deadline = time.monotonic() + 300
    while not first_label.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # mid-run: some shards labelled, the rest not
    proc.wait()
    assert first_label.exists(), proc.stderr.read().decode()[-2000:]
    assert not (killed / "card.md").exists()  # it was killed before the end, so the rerun has work left
    labelled_before = len(list((killed / "checkpoints" / "labels").glob("shard-*.parquet")))
    assert labelled_before < 6
    c = run_generate(cfg, killed, echo=lambda m: None)
    assert c["resumed"]["question_shards_resumed"] == 6 and c["resumed"]["label_shards_resumed"] == labelled_before
    _same(clean[0], killed)  # nothing lost, nothing twice
    labels = pq.read_table(killed / "labels.parquet")
    assert len(set(zip(labels.column("query_id").to_pylist(), labels.column("doc_id").to_pylist(), strict=True))) == labels.num_rows
