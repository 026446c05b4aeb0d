"""Where a command's CPU goes, by kind of process: ``python tests/perf/suite_cpu.py -- make test``.

Runs the command and, every half second until it ends, reads every process's CPU time
(utime + stime in /proc/PID/stat) and command line; prints the machine's busy fraction over
the command (from /proc/stat) and a table of CPU seconds per kind of process (the pytest
workers, vLLM engine actors, embedding actors, Ray's daemons, child interpreters, ...), with
how many processes of each kind ran. Processes that were running before the command (the
kernel's threads, other work) are left out. A process that ends between two reads loses at
most its last half second. Linux only (it reads /proc).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
from collections import Counter

KINDS = (  # (kind, pattern over the command line), first match wins
    ("vLLM engine actor", r"ray::_EngineActor|_EngineActor"),
    ("vLLM engine core", r"EngineCore"),
    ("embedding actor", r"_EmbedActor"),
    ("retrieval actor", r"_RetrieveActor|_ShardSearch|_ShardTask"),
    ("other Ray actor or task", r"^ray::(?!IDLE)"),
    ("idle Ray worker", r"ray::IDLE|default_worker\.py"),
    ("Ray daemons (GCS, raylet, agents, monitors)", r"gcs_server|raylet|dashboard|runtime_env|log_monitor|monitor\.py|agent"),
    ("BM25 index child (store.apart)", r"engines\.store\.apart"),
    ("pytest and its workers", r"^\[pytest-xdist|^\S*python\S* -m pytest"),
    ("child interpreters (CLI jobs, scripts)", r"python"),
)


def _busy() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v[:8]) - idle, idle


def _read(pid: str, hz: int) -> tuple[str, float, str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return f"{pid}:{fields[19]}", (int(fields[11]) + int(fields[12])) / hz, cmd


def _sample(before: set[str], seen: dict[str, list], stop: threading.Event, hz: int) -> None:
    while True:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if (got := _read(pid, hz)) and got[0] not in before:
                key, cpu, cmd = got
                rec = seen.setdefault(key, [0.0, cmd])
                rec[0], rec[1] = cpu, cmd or rec[1]
        if stop.wait(0.5):
            return


def kind(cmd: str) -> str:
    return next((name for name, pattern in KINDS if re.search(pattern, cmd)), "other")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --")
    hz = os.sysconf("SC_CLK_TCK")
    before = {got[0] for pid in filter(str.isdigit, os.listdir("/proc")) if (got := _read(pid, hz))}
    seen: dict[str, list] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(before, seen, stop, hz), daemon=True)
    busy0, idle0 = _busy()
    sampler.start()
    rc = subprocess.call(command)
    stop.set()
    sampler.join()
    busy1, idle1 = _busy()
    busy, idle = (busy1 - busy0) / hz, (idle1 - idle0) / hz
    cpu, count = Counter(), Counter()
    for seconds, cmd in seen.values():  # (this process ran before the command: not among them)
        cpu[kind(cmd)] += seconds
        count[kind(cmd)] += 1
    print(f"\nexit {rc}; the machine busy {busy / (busy + idle):.1%} of {busy + idle:,.0f} core-seconds; "
          f"{sum(cpu.values()):,.0f} core-seconds in the command's processes")
    print("\n| processes | how many | core-seconds |\n|:--|--:|--:|")
    for name, seconds in cpu.most_common():
        print(f"| {name} | {count[name]} | {seconds:,.0f} |")
    return rc


if __name__ == "__main__":
    sys.exit(main())
