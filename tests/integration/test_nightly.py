"""`logicrank nightly` on a real Ray cluster and LanceDB table: three nights (baseline, a
routine change, a corrupted corpus), a night killed mid-way and finished by a rerun, a
webhook on loopback, time travel to a tagged version, and nights stopped by the index job's
guards."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from logicrank.jobs.nightly import run_at, run_nightly
from logicrank.jobs.nightly_demo import changed, corrupted, read_docs, relevant_ids, write_jsonl
from logicrank.pipelines.config.retrieval import NightlyConfig
from logicrank.pipelines.datasets import scifact
from logicrank.pipelines.engines.store import DocStore
from logicrank.pipelines.operations.nightly import EXIT_REGRESSION, EXIT_STOPPED, NightlyError
from logicrank.pipelines.operations.writelock import TableLock
from tests.integration.children import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]  # jobs join the session's cluster (conftest.py)

ROOT = Path(__file__).resolve().parents[2]
D1, D2, D3, D4 = "2026-11-20", "2026-11-21", "2026-11-22", "2026-11-23"


class _Receiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def webhook():
    """A local HTTP server on loopback that records every alert posted to it."""
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/alert", _Receiver.received
    server.shutdown()


@pytest.fixture(scope="module")
def world(tmp_path_factory, webhook):
    """40 SciFact queries, their relevant documents and 200 others; the three snapshots."""
    root = tmp_path_factory.mktemp("nightly")
    data = scifact()
    rel = relevant_ids(data.qrels)
    chosen = sorted(rel)[:40]
    needed = set().union(*(rel[q] for q in chosen))
    docs = read_docs(data.corpus, text_chars=300)
    small = [d for d in docs if d["_id"] in needed] + [d for d in docs if d["_id"] not in needed][:200]
    with open(data.qrels, encoding="utf-8") as f:
        lines = [next(f)] + [line for line in f if line.split("\t")[0] in chosen]
    (root / "qrels.tsv").write_text("".join(lines))
    write_jsonl([json.loads(q) for q in data.queries.read_text().splitlines() if json.loads(q)["_id"] in chosen], root / "queries.jsonl")
    snapshots = {D1: small, D2: changed(small, needed, edit=5, delete=3), D3: corrupted(small, needed)}
    config = {
        "out": str(root / "nightly"),
        "index": {"corpus": str(root / "corpus.jsonl"), "db": str(root / "db")},
        "query_sets": {"scifact40": {"queries": str(root / "queries.jsonl"), "qrels": str(root / "qrels.tsv")}},
        "pipelines": {"dense": [{"stage": "dense", "k": 100}], "bm25": [{"stage": "bm25", "k": 100}]},
        "measures": ["nDCG@10", "P@1", "R@100"],
        "regressions": {"nDCG@10": {"max_drop": 0.01}},
        "baseline": D1,  # pinned: every night is also compared with night 1, whose tag outlives the retention
        "keep_nightly_tags": 1,
        "alert": {"webhook": webhook[0]},
    }
    return root, NightlyConfig.model_validate(config), snapshots, webhook[1]


def _value(history, day, pipeline, measure) -> float:
    df = history.to_pandas()
    (value,) = df[(df["date"] == day) & (df["pipeline"] == pipeline) & (df["measure"] == measure)]["value"]
    return float(value)


def _version(history, day) -> int:
    return history.filter(pc.equal(history.column("date"), day)).column("table_version")[0].as_py()


def _night(world, day):
    root, cfg, snapshots, _ = world
    write_jsonl(snapshots[day], root / "corpus.jsonl")
    return run_nightly(cfg, day)


@pytest.fixture(scope="module")
def three_nights(world, ray_cluster):
    """Night 1 in process; night 2 in a child process killed mid-evaluation, then finished by
    a rerun; night 3 on the corrupted snapshot. Returns each night's result (and the rerun's)."""
    root, cfg, snapshots, received = world
    first = _night(world, D1)
    after_first = len(received)

    write_jsonl(snapshots[D2], root / "corpus.jsonl")
    address = ray_cluster.get_runtime_context().gcs_address
    spec = cfg.model_copy(update={"index": cfg.index.model_copy(update={"ray": cfg.index.ray.model_copy(update={"address": address})})})
    child = ("import sys; from logicrank.jobs.nightly import run_nightly; from logicrank.pipelines.config.retrieval import NightlyConfig; "
             "run_nightly(NightlyConfig.model_validate_json(sys.argv[1]), sys.argv[2])")
    proc = subprocess.Popen([sys.executable, "-c", child, spec.model_dump_json(), D2], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    state = root / "nightly" / "nights" / D2 / "state.json"
    stage_cache = root / "nightly" / "nights" / D2 / "sets" / "scifact40" / "retrieve" / "stages"
    try:
        wait_until(lambda: any(stage_cache.rglob("*.parquet")), proc, "its first pipeline's stage was cached")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # mid-evaluation: the first pipeline retrieved, the second not yet
        proc.wait()
    killed_state = json.loads(state.read_text())
    history_after_kill = pq.read_table(root / "nightly" / "history.parquet")
    second = run_nightly(cfg, D2)
    again = run_nightly(cfg, D2)  # a finished night, run once more
    after_second = len(received)
    third = _night(world, D3)
    return {"first": first, "after_first": after_first, "killed_state": killed_state, "history_after_kill": history_after_kill,
            "second": second, "again": again, "after_second": after_second, "third": third}


def test_three_nights_alert_only_on_the_corrupted_one(world, three_nights):
    root, cfg, _, received = world
    n = three_nights
    assert (n["first"].status, n["first"].exit_code) == ("ok", 0)
    assert (n["second"].status, n["second"].exit_code) == ("ok", 0)
    assert (n["third"].status, n["third"].exit_code) == ("regression", EXIT_REGRESSION)
    assert n["after_first"] == 0 and n["after_second"] == 0 and len(received) == 1  # the webhook heard night 3 only, once

    history = pq.read_table(root / "nightly" / "history.parquet")
    assert sorted(set(history.column("date").to_pylist())) == [D1, D2, D3]
    assert history.num_rows == 3 * 2 * 3  # nights x pipelines x measures: nothing twice
    flagged = history.filter(history.column("regression"))
    assert set(flagged.column("date").to_pylist()) == {D3}
    assert set(flagged.column("measure").to_pylist()) == {"nDCG@10"}  # the one measure with a rule

    alert = json.loads((root / "nightly" / "nights" / D3 / "alert.json").read_text())
    assert alert == received[0] and alert["status"] == "regression" and alert["exit_code"] == EXIT_REGRESSION
    v2, v3 = _version(history, D2), _version(history, D3)
    assert v3 > v2 and alert["table"]["version"] == v3 and alert["compared_with"]["previous"] == {"date": D2, "table_version": v2}
    assert alert["compared_with"]["baseline"] == {"date": D1, "table_version": _version(history, D1)}
    assert sorted((r["against"], r["pipeline"]) for r in alert["regressions"]) == [  # both lose the relevant texts
        ("baseline", "bm25"), ("baseline", "dense"), ("previous", "bm25"), ("previous", "dense")]
    by_pipeline = {r["pipeline"]: r for r in alert["regressions"] if r["against"] == "previous"}
    for pipeline, r in by_pipeline.items():
        assert r["old_value"] == pytest.approx(_value(history, D2, pipeline, "nDCG@10"))
        assert r["new_value"] == pytest.approx(_value(history, D3, pipeline, "nDCG@10"))
        assert r["delta"] < -0.1 and r["p_adjusted"] < cfg.alpha and r["p_value"] <= r["p_adjusted"]
        assert (r["old_table_version"], r["new_table_version"], r["queries"]) == (v2, v3, 40)
    assert alert["served"]["held"] and (alert["served"]["version"], alert["served"]["tonight"]) == (v2, v3)
    assert alert["served"]["last_good_night"] == D2 and f"was held on v{v2} (the last good version, night {D2})" in alert["message"]
    assert n["second"].served == {"tag": "served", "version": v2, "held": False, "tonight": v2}
    assert n["third"].served == alert["served"]
    md = (root / "nightly" / "nights" / D3 / "alert.md").read_text()
    assert "REGRESSION" in md and f"v{v2} -> v{v3}" in md and f"**held on v{v2}**" in md
    assert (root / "nightly" / "plots" / "nDCG_10.png").stat().st_size > 10_000
    assert "![nDCG@10 per night](plots/nDCG_10.png)" in (root / "nightly" / "report.md").read_text()


@pytest.mark.faults
def test_a_night_killed_mid_way_is_finished_by_a_rerun_without_double_rows(world, three_nights):
    root, cfg, _, received = world
    n = three_nights
    assert "maintain" in n["killed_state"]["steps"] and "evaluate" not in n["killed_state"]["steps"]
    assert set(n["history_after_kill"].column("date").to_pylist()) == {D1}  # the killed night appended nothing
    assert n["second"].resumed == ["index", "maintain"]  # the rerun did not index again
    assert n["again"].resumed == ["index", "maintain", "evaluate", "compare", "serve", "history"]
    assert n["again"].comparisons.equals(n["second"].comparisons)
    second = pq.read_table(root / "nightly" / "nights" / D2 / "comparisons.parquet")
    assert not any(second.column("regression").to_pylist())
    assert second.column("against").to_pylist() == ["previous"] * 6  # the baseline D1 is also the previous night: compared once
    assert second.filter(pc.is_valid(second.column("p_value"))).num_rows == 6


def test_tags_served_version_and_time_travel(world, three_nights):
    root, cfg, _, _ = world
    store = DocStore(cfg.index.db, cfg.index.table)
    history = pq.read_table(root / "nightly" / "history.parquet")
    versions = {d: _version(history, d) for d in (D1, D2, D3)}
    # retention keeps the newest nightly tag and the pinned baseline's; night 2's tag went
    assert {d: store.tagged_version(f"nightly-{d}") for d in versions} == {D1: versions[D1], D2: None, D3: versions[D3]}
    state = json.loads((root / "nightly" / "nights" / D3 / "state.json").read_text())["steps"]["maintain"]
    assert state["tags_dropped"] == [f"nightly-{D2}"] and not any(state["unindexed_rows"].values())
    # night 3's regression held the served tag on night 2's version (before: it moved to night 3's corrupted one)
    assert store.tagged_version("served") == versions[D2]
    # bisect: the pipelines against night 1's tag give night 1's numbers, on today's table
    metrics = run_at(cfg, f"nightly-{D1}")["scifact40"]
    agg = metrics.filter(pc.equal(metrics.column("query_id"), "all")).to_pylist()
    for row in agg:
        assert row["value"] == pytest.approx(_value(history, D1, row["run_id"], row["measure"]), abs=1e-9)
    with pytest.raises(Exception, match="no version or tag 'nightly-1999-01-01'"):
        run_at(cfg, "nightly-1999-01-01")


def test_a_refused_reindex_stops_the_night_and_keeps_the_served_version(world, three_nights):
    root, cfg, snapshots, received = world
    before = len(received)
    served = DocStore(cfg.index.db, cfg.index.table).tagged_version("served")
    write_jsonl(snapshots[D2], root / "corpus.jsonl")
    with TableLock(cfg.index.db, cfg.index.table, "index"):  # another writer holds the table
        held = run_nightly(cfg, D4)
    assert (held.status, held.exit_code) == ("stopped", EXIT_STOPPED)
    alert = json.loads((root / "nightly" / "nights" / D4 / "alert.json").read_text())
    assert alert["step"] == "index" and "being written by" in alert["message"] and alert["served"] == {"tag": "served", "version": served}
    # released, but half the snapshot is bad rows: the reject guard stops the night again
    bad = snapshots[D3] + [{"_id": f"bad{i}", "title": "", "text": ""} for i in range(len(snapshots[D3]))]
    write_jsonl(bad, root / "corpus.jsonl")
    rejected = run_nightly(cfg, D4)
    assert (rejected.status, rejected.exit_code) == ("stopped", EXIT_STOPPED)
    alert = json.loads((root / "nightly" / "nights" / D4 / "alert.json").read_text())
    assert "rejected" in alert["message"] and f"stays at v{served}" in alert["message"]
    assert len(received) == before + 2 and received[-1] == alert
    assert not (root / "nightly" / "nights" / D4 / "sets").exists()  # nothing was evaluated
    assert set(pq.read_table(root / "nightly" / "history.parquet").column("date").to_pylist()) == {D1, D2, D3}
    assert DocStore(cfg.index.db, cfg.index.table).tagged_version("served") == served
    with pytest.raises(NightlyError, match="nights run in date order"):
        run_nightly(cfg, D2)


@pytest.mark.faults
def test_a_crash_is_alerted_and_a_rerun_finishes_the_night(world, three_nights, monkeypatch):
    """The report of night 3 fails once: its regression alert is not sent again (it was
    delivered), a 'failed' alert naming the step is; the next rerun finishes the night."""
    from logicrank.jobs import nightly

    root, cfg, _, received = world
    before = len(received)
    monkeypatch.setattr(nightly.NightRun, "_report", lambda self: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        run_nightly(cfg, D3)
    assert len(received) == before + 1
    assert {k: received[-1][k] for k in ("status", "step", "message")} == {"status": "failed", "step": "report", "message": "OSError: disk full"}
    monkeypatch.undo()
    again = run_nightly(cfg, D3)
    assert again.status == "regression" and len(received) == before + 1  # the regression's receivers were already told
    assert json.loads((root / "nightly" / "nights" / D3 / "alert.json").read_text())["status"] == "regression"


def test_a_held_night_is_not_the_next_nights_reference(world, three_nights):
    """Night 3 was held on a regression. A later night on the same corrupted corpus is compared
    with the last night served (night 2), not with night 3, so the corruption is found again
    against the previous night, not only against the pinned baseline, and the tag stays held."""
    root, cfg, snapshots, _ = world
    d5 = "2026-11-24"
    write_jsonl(snapshots[D3], root / "corpus.jsonl")
    lines: list[str] = []
    night = run_nightly(cfg, d5, echo=lines.append)
    assert (night.status, night.exit_code) == ("regression", EXIT_REGRESSION)
    history = pq.read_table(root / "nightly" / "history.parquet")
    alert = json.loads((root / "nightly" / "nights" / d5 / "alert.json").read_text())
    assert alert["compared_with"]["previous"] == {"date": D2, "table_version": _version(history, D2)}
    assert {r["pipeline"] for r in alert["regressions"] if r["against"] == "previous"} == {"bm25", "dense"}
    assert any(f"night(s) {D3} held on a regression (not served): compared with {D2}, the last night served" in line for line in lines)
    assert alert["served"]["held"] and alert["served"]["version"] == _version(history, D2)
