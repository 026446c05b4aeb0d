"""Where a command's CPU goes, by kind of process: ``python tests/perf/suite_cpu.py -- make test``.

Runs the command and, every half second until it ends, reads every process's CPU time
(utime + stime in /proc/PID/stat) and command line; prints the machine's busy fraction over
the command (from /proc/stat) and a table of CPU seconds per kind of process (the pytest
workers, vLLM engine actors, embedding actors, Ray's daemons, child interpreters, ...), with
how many processes of each kind ran (a process's kind is read from the last command line
seen: a Ray worker's names the actor it became). Processes that were running before the
command (the kernel's threads, other work) are left out. What a process spends after the last
read before it ends (up to half a second) is not counted, nor a process that starts and ends
between two reads: the busy fraction counts them, the table does not. Linux only (it reads
/proc).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
from collections import Counter

KINDS = (  # (kind, pattern over the command line), first match wins; anchored where the line starts,
    # as arguments name anything (a raylet's carries the worker's command, a test's temporary directory its name)
    ("pytest and its workers", r"^\[pytest-xdist|^\S*python\S* -m pytest\b"),
    ("vLLM engine actor", r"^ray::_EngineActor\b"),
    ("vLLM engine core and its worker", r"^VLLM::"),
    ("embedding actor", r"^ray::\S*_EmbedActor"),
    ("retrieval actor", r"^ray::\S*(_RetrieveActor|ShardSearch|_ShardTask)"),
    ("idle Ray worker", r"^ray::IDLE\b|^\S*python\S* \S*/ray/_private/workers/default_worker\.py"),
    ("other Ray actor or task", r"^ray::"),
    ("Ray daemons (GCS, raylet, agents, monitors)",
     r"^\S*/(gcs_server|raylet)\b|^\S*python\S* (-u )?\S*/ray/(dashboard|_private/(log_monitor|runtime_env)|autoscaler)\b"),
    ("BM25 index child (store.apart)", r"^\S*python\S* -m logicrank\.pipelines\.engines\.store\.apart\b"),
    ("child interpreters (CLI jobs, scripts)", r"^\S*python"),
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
