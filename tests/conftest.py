"""Shared test helpers: small real corpora cut from bundled SciFact."""

from __future__ import annotations

import gzip
import json
import threading
import time
from pathlib import Path

import pytest

from logicrank.jobs.raysession import quiet_logs
from logicrank.pipelines.datasets import scifact

# The test process is a driver like the command line's: Ray's quiet defaults are set before any
# test imports Ray (some are read once, when Ray is imported).
quiet_logs()


def pytest_sessionstart(session):
    """The code under test is this checkout's: the installed package maps logicrank.pipelines to
    the folders of the checkout `make venv` installed, and a test run from another checkout
    (a worktree, a copy) would mix its logicrank/ with that one's pipelines/."""
    import logicrank.pipelines

    here, used = Path(__file__).resolve().parents[1], Path(logicrank.pipelines.__file__).resolve().parents[1]
    if here != used:
        raise pytest.UsageError(f"logicrank.pipelines is imported from {used}, not this checkout ({here}); run `make venv` here first.")


# A test's tier follows from what it uses: the session's Ray cluster (or a fixture built on it)
# makes it `cluster`, the tiny vLLM checkpoint `llm` (pyproject.toml's markers).
_TIER_BY_FIXTURE = {"ray_cluster": "cluster", "tiny_dir": "llm", "tiny_cfg": "llm"}


# What a test of each tier costs, roughly, in a file's share of the suite: the files that start
# engines and clusters are handed out first (the Makefile's `--dist loadfile
# --no-loadscope-reorder` keeps this order), so the longest ones never start last on one worker
# while the other has finished.
_COST_BY_TIER = {"llm": 3, "cluster": 2, "faults": 2, "slow": 2}


def pytest_collection_modifyitems(items):
    for item in items:
        for fixture, marker in _TIER_BY_FIXTURE.items():
            if fixture in item.fixturenames:
                item.add_marker(marker)
    cost: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        cost[path] = cost.get(path, 0) + max((c for tier, c in _COST_BY_TIER.items() if item.get_closest_marker(tier)), default=0)
    # stable: a file's tests keep their order; among files of one cost the integration tests'
    # first (real models and stores: in the quick tier, where no file has a costly marker, the
    # encoder's file would otherwise be handed out last, its worker alone at the end)
    integration = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("integration")}
    items.sort(key=lambda item: (-cost[item.nodeid.split("::")[0]], item.nodeid.split("::")[0] not in integration))


class _CpuWatch:
    """The CPU seconds of this process and its descendants (a Ray cluster it started and that
    cluster's workers, the children it runs), each process as last seen: a thread looks every
    half second, so a process that ends still counts up to its last look (Ray's raylet does
    not collect its workers' times when they end, so a parent's "children" times would miss
    them). Approximate: a process that lives under half a second, or the last half second of
    one, is missed, and an idle cluster's time goes to the test that runs meanwhile."""

    def __init__(self):
        import psutil

        self._me, self._error = psutil.Process(), psutil.Error
        self._seen: dict[tuple[int, float], float] = {}  # (pid, start time) -> CPU seconds when last seen
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="durations-cpu", daemon=True).start()

    def _run(self) -> None:
        while True:
            self.look()
            time.sleep(0.5)

    def look(self) -> float:
        """Look at every process now; returns the CPU seconds of all seen so far."""
        with self._lock:
            try:
                procs = [self._me, *self._me.children(recursive=True)]
            except self._error:
                procs = [self._me]
            for p in procs:
                try:
                    t = p.cpu_times()
                    self._seen[(p.pid, p.create_time())] = t.user + t.system
                except self._error:
                    continue
            return sum(self._seen.values())


_CPU_WATCH: list[_CpuWatch] = []  # one per test process, started at its first test
_CPU_AT_SETUP = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not _CPU_WATCH:
        _CPU_WATCH.append(_CpuWatch())
    item.stash[_CPU_AT_SETUP] = _CPU_WATCH[0].look()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The test's CPU seconds (setup to teardown, its processes' included) on its teardown's
    report (``cpu_s``: an attribute, which pytest-xdist carries from a worker with the report,
    and junit.xml leaves out)."""
    report = yield
    if call.when == "teardown" and _CPU_AT_SETUP in item.stash:
        report.cpu_s = _CPU_WATCH[0].look() - item.stash[_CPU_AT_SETUP]
    return report


def pytest_terminal_summary(terminalreporter, config):
    """Beside --junitxml's report, durations.md: the test files and the slowest tests, each
    with its wall time (setup, call and teardown summed) and its CPU seconds (its processes'
    included), so a run's cost is known after the terminal is gone. The suite is bound by the
    CPU: a test that waits leaves its core to the other worker, so CPU seconds are what a
    change must cut to shorten it (docs/testing.md)."""
    xml = getattr(config.option, "xmlpath", None)
    if not xml or hasattr(config, "workerinput"):
        return
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) in ("setup", "call", "teardown"):
                wall[r.nodeid] = wall.get(r.nodeid, 0.0) + r.duration
                cpu[r.nodeid] = cpu.get(r.nodeid, 0.0) + getattr(r, "cpu_s", 0.0)
    files: dict[str, list[float]] = {}
    for nodeid, seconds in wall.items():
        f = files.setdefault(nodeid.split("::")[0], [0.0, 0.0])
        f[0] += seconds
        f[1] += cpu[nodeid]
    lines = [f"# Test durations ({len(wall)} tests, {sum(wall.values()):.0f} s summed over workers, "
             f"{sum(cpu.values()):.0f} CPU seconds)", "", "| file | seconds | CPU seconds |", "|:--|--:|--:|"]
    lines += [f"| {f} | {w:.1f} | {c:.1f} |" for f, (w, c) in sorted(files.items(), key=lambda x: -x[1][0])]
    lines += ["", "| test (setup + call + teardown) | seconds | CPU seconds |", "|:--|--:|--:|"]
    lines += [f"| {n} | {t:.1f} | {cpu[n]:.1f} |" for n, t in sorted(wall.items(), key=lambda x: -x[1])[:50]]
    out = Path(xml).parent / "durations.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    terminalreporter.write_line(f"durations: {out}")


def scifact_docs(n: int, text_chars: int = 300) -> list[dict]:
    """The first ``n`` SciFact documents, abstracts cut to ``text_chars`` (fast to embed)."""
    out = []
    with gzip.open(scifact().corpus, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            out.append({"_id": d["_id"], "title": d["title"], "text": d["text"][:text_chars]})
            if len(out) == n:
                break
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


@pytest.fixture(scope="session")
def docs300() -> list[dict]:
    return scifact_docs(300)
