"""`logicrank generate itlr` on a real index, a real Ray pool and vLLM (a tiny random Llama:
assert on structure, not content): complete, seeded, and resumable after a SIGKILL."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from logicrank.jobs.generate import run_generate
from logicrank.jobs.llm_service import LLMEngineFailed
from logicrank.pipelines.config.settings import GenerateConfig
from logicrank.pipelines.generate.realcorpus import GenerateError, no_evidence
from logicrank.pipelines.generate.synthetic import TEMPLATES
from logicrank.pipelines.llm.models import resolve
from tests.compare import assert_tables_close, close
from tests.faults import descendants, kill_engine_cores, kill_processes, processes
from tests.integration.children import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]  # jobs join the session's cluster (conftest.py)

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
    a, c = clean  # (that another placement gives the same dataset: test_an_engine_actor_killed_with_its_engine_is_restarted)
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
    assert all(r["label"] == (0 if no_evidence(r["logit_true"], r["logit_false"], r["exact"]) else int(r["p_true"] >= cfg.label_threshold))
               for r in labels)
    assert c["labels"]["no_evidence"] == sum(no_evidence(r["logit_true"], r["logit_false"], r["exact"]) for r in labels)
    qrels = (a / "qrels" / "test.tsv").read_text().splitlines()[1:]
    assert len(qrels) == c["labels"]["relevant"] == sum(r["label"] for r in labels)
    card = (a / "card.md").read_text()
    assert cfg.dataset_digest() in card and f"**{c['questions']} kept**" in card
    other = run_generate(cfg.model_copy(update={"seed": 1}), tmp_path / "c", echo=lambda m: None)
    assert (tmp_path / "c" / "queries.jsonl").read_bytes() != (a / "queries.jsonl").read_bytes() and other["questions"] > 0


def test_a_run_directory_of_another_config_is_refused(synthetic, tiny_cfg, clean, tmp_path):
    with pytest.raises(GenerateError, match="holds the checkpoints of another config"):
        run_generate(_cfg(synthetic, tiny_cfg, seed=5), clean[0], echo=lambda m: None)
    # checkpoints the generator's earlier code wrote (another draw: other queries under the same ids) are not resumed
    import shutil

    older = tmp_path / "older"
    shutil.copytree(clean[0], older)
    state = json.loads((older / "checkpoints" / "state.json").read_text())
    (older / "checkpoints" / "state.json").write_text(json.dumps({**state, "generator": "0" * 16}))
    with pytest.raises(GenerateError, match="holds the checkpoints of another config, table version, engine or generator code"):
        run_generate(_cfg(synthetic, tiny_cfg), older, echo=lambda m: None)


@pytest.mark.faults
def test_a_killed_run_resumes_without_losing_or_repeating_rows(synthetic, tiny_cfg, tmp_path, ray_cluster, clean):
    cfg = _cfg(synthetic, tiny_cfg)
    killed = tmp_path / "killed"
    child = (
        "import json, sys; from logicrank.jobs.generate import run_generate; from logicrank.pipelines.config.settings import GenerateConfig; "
        "run_generate(GenerateConfig.model_validate_json(sys.argv[1]), sys.argv[2], echo=lambda m: None)"
    )
    address = ray_cluster.get_runtime_context().gcs_address
    spec = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": address})}).model_dump_json()
    proc = subprocess.Popen([sys.executable, "-c", child, spec, str(killed)], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first_label = killed / "checkpoints" / "labels" / "shard-00000.parquet"
    try:
        wait_until(first_label.exists, proc, "it wrote its first label shard")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # mid-run: some shards labelled, the rest not
        proc.wait()
    assert not (killed / "card.md").exists()  # it was killed before the end, so the rerun has work left
    labelled_before = len(list((killed / "checkpoints" / "labels").glob("shard-*.parquet")))
    assert labelled_before < 6
    # a label checkpoint that does not hold the pairs the kept questions' candidates give (as where another host's encoder
    # kept other near-duplicates): labelled again, never read as the shard's labels
    shard0 = pq.read_table(first_label)
    assert shard0.num_rows > 1
    pq.write_table(shard0.slice(0, shard0.num_rows - 1), first_label)
    said = []
    c = run_generate(cfg, killed, echo=said.append)
    assert c["resumed"]["question_shards_resumed"] == 6 and c["resumed"]["label_shards_resumed"] == labelled_before - 1
    assert any(m.startswith("generate: 1 label checkpoint(s) hold other pairs than the kept questions' candidates (shards 0)") for m in said), said
    _same(clean[0], killed)  # nothing lost, nothing twice
    labels = pq.read_table(killed / "labels.parquet")
    assert len(set(zip(labels.column("query_id").to_pylist(), labels.column("doc_id").to_pylist(), strict=True))) == labels.num_rows


class _KillAt:
    """An echo callback that kills the processes ``kill()`` finds once at the first progress
    line of each given phase (the LLM pool's lines: ``generate:questions: 6/6 ...``)."""

    def __init__(self, kill, phases: tuple[str, ...]):
        self.kill, self.left, self.killed, self.seen = kill, list(phases), [], []

    def __call__(self, line: str) -> None:
        for phase in self.left:
            if line.startswith(f"{phase}:"):
                self.left.remove(phase)
                self.killed.append(self.kill())
                if not self.killed[-1]:  # (seen once, cause unknown): what was running instead, for the failure's message
                    self.seen.append((line, descendants()))
                return


@pytest.mark.faults
def test_an_engine_killed_inside_its_actor_is_restarted_and_its_batch_sent_again(synthetic, tiny_cfg, tmp_path, clean):
    """The engine core in its own process (vLLM's default on GPUs), killed mid-job once during
    generation and once during truth scoring: the actor lives on with a dead engine. Every
    prompt is answered by a restarted engine, none becomes an error, and the dataset equals an
    uninterrupted run's."""
    cfg = _cfg(synthetic, tiny_cfg, llm=tiny_cfg.model_copy(update={"cache": None, "engine_process": "separate"}))
    killer = _KillAt(kill_engine_cores, ("generate:questions", "generate:labels"))
    c = run_generate(cfg, tmp_path / "d", echo=killer, progress=True)
    assert killer.left == [] and all(n >= 1 for n in killer.killed), (killer.killed, killer.seen)
    assert c["llm"]["engine_restarts"] == 2 and c["llm"]["actors_lost"] == 0, c["llm"]
    # every prompt counted once: the restarted engines' earlier batches too, the batches they lost not twice
    assert c["llm"]["prompts_run"] == clean[1]["llm"]["prompts_run"] > 0, (c["llm"], clean[1]["llm"])
    # a killed core surfaces as vLLM's EngineDeadError, or, when the kill lands mid-request, as the
    # dead core's socket failing under the call (found dead by the health probe): either is named
    assert c["llm"]["last_engine_error"].startswith(("EngineDeadError", "ZMQError")), c["llm"]["last_engine_error"]
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["llm"]["engine_restarts"] == 2
    for kind in ("topics", "questions"):  # no prompt was turned into an error row
        for shard in range(6):
            raw = pq.read_table(tmp_path / "d" / "checkpoints" / kind / f"shard-{shard:05d}.parquet").column("raw_output").to_pylist()
            assert not any(r.startswith("error:") for r in raw), (kind, shard)
    _same(clean[0], tmp_path / "d")


@pytest.mark.faults
def test_an_engine_actor_killed_with_its_engine_is_restarted(synthetic, tiny_cfg, tmp_path, clean):
    """The engine in the actor's own process (the default on CPU): killing that process kills
    both; Ray restarts the actor and its batches are sent again. Run with three shards per wave
    (the reference, one): neither the placement nor the kills change the dataset."""
    killer = _KillAt(lambda: kill_processes("_EngineActor"), ("generate:questions", "generate:labels"))
    c = run_generate(_cfg(synthetic, tiny_cfg, wave_shards=3), tmp_path / "e", echo=killer, progress=True)
    assert killer.left == [] and all(n >= 1 for n in killer.killed), (killer.killed, killer.seen)
    assert c["llm"]["actors_lost"] >= 1 and c["llm"]["engine_restarts"] == 0, c["llm"]
    assert c["llm"]["prompts_run"] == clean[1]["llm"]["prompts_run"] > 0, (c["llm"], clean[1]["llm"])
    _same(clean[0], tmp_path / "e")


@pytest.mark.faults
def test_an_engine_that_keeps_dying_fails_the_job_in_one_line(synthetic, tiny_cfg, tiny_dir, tmp_path):
    cfg = _cfg(synthetic, tiny_cfg, llm=tiny_cfg.model_copy(update={"cache": None, "engine_process": "separate", "max_engine_restarts": 1}))
    stop = threading.Event()
    killed, seen = [], set()  # kills per look; every descendant's command line seen meanwhile

    def keep_killing():
        # each engine core is killed as soon as it appears (found as its actor's spawned child, before it has even
        # loaded vLLM), so no engine ever answers a batch and the job cannot finish first, on a fast machine or a slow one.
        # A look every 0.1 s: a core takes seconds to import vLLM; each look reads every process on the machine (twice),
        # and every 0.01 s the looks alone kept a core about half busy
        while not stop.is_set():
            killed.append(kill_engine_cores())
            seen.update(d.split(" ", 1)[-1] for d in descendants())  # each command line, cut to 120 characters
            stop.wait(0.1)

    killer = threading.Thread(target=keep_killing, daemon=True)
    killer.start()
    err, counts = None, None
    try:
        counts = run_generate(cfg, tmp_path / "f", echo=lambda m: None)["llm"]
    except LLMEngineFailed as exc:
        err = exc
    finally:
        stop.set()
        killer.join()
    # if the job finishes: did the kills land (engine cores killed, restarts counted) or was the limit not enforced?
    assert err is not None, (f"the job finished: {sum(killed)} engine cores killed in {len(killed)} looks; pool counts {counts}; "
                             f"processes seen: {sorted(seen)}")
    message = str(err)
    model = resolve(str(tiny_dir), log=lambda m: None).model_id
    assert "\n" not in message and message.startswith(f"llm: the engine of {model} keeps dying"), message
    assert "last engine error: " in message, message
    assert not (tmp_path / "f" / "card.md").exists()


@pytest.mark.faults
def test_a_stalled_run_stops_with_its_stacks_and_a_rerun_finishes_it(synthetic, tiny_dir, tmp_path, ray_cluster):
    """The engines stop answering mid-job (their processes are paused: SIGSTOP), so the driver
    waits with nothing to do, as in the hang seen once. The stall watchdog ends the command in
    one line (exit 1) with every thread's stack in the run directory; the job's command run
    again resumes from the checkpoints and finishes."""
    import psutil

    out = tmp_path / "g"
    address = ray_cluster.get_runtime_context().gcs_address
    # 45 s: an engine starting beats every few seconds (on its first batch: its start), so the
    # longest honest gap between two beats is the job's start up to its first engine actor's
    # answer, 7 s on a 2-core AVX2 machine (docs/failures.md, the stall watchdog): a stall
    # must be longer than that on a machine several times slower
    args = ["--stall-timeout", "45", "generate", "itlr", "--db", str(synthetic / "db"), "--out", str(out), "--docs", "12",
            "--shard-docs", "4", "--questions-per-shard", "3", "--candidate-k", "3", "--wave-shards", "1", "--backend", "torch",
            "--llm-model", str(tiny_dir), "--llm-max-model-len", "1024", "--llm-cache", "none", "--ray-address", address]
    cmd = [sys.executable, "-c", "from logicrank.cli import app; app()", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = out / "checkpoints" / "questions" / "shard-00000.parquet"
    wait_until(first.exists, proc, "it wrote its first question shard")
    paused = processes("_EngineActor")
    for p in paused:
        p.suspend()
    try:
        stdout, stderr = proc.communicate()  # the stall watchdog ends it (45 s without progress)
    finally:
        for p in paused:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()
    assert first.exists() and paused, stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("error: generate: no progress for ") and "--stall-timeout 45" in lines[0], lines[0]
    dumps = list(out.glob("stalled-*.txt"))
    assert len(dumps) == 1 and str(dumps[0]) in lines[0]
    assert "_map" in dumps[0].read_text()  # the driver's stack shows where it waited: the LLM pool
    assert not (out / "card.md").exists()
    # the rerun is the job's command under the default watchdog: only the stall above is under test
    rerun = subprocess.run([*cmd[:3], *args[2:]], cwd=ROOT, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "shards' questions read from checkpoints" in rerun.stdout and (out / "card.md").exists()
