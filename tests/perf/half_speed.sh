#!/usr/bin/env bash
# Run a command on a machine made half as fast: a CPU quota of half the cores (CFS bandwidth
# control) on a new cgroup holding the command and everything it starts (Ray's workers and
# vLLM's engine cores included). Works with cgroup v2 (cpu.max) and v1 (cpu.cfs_quota_us);
# needs write access to the cgroup tree (root here). The cgroup is removed on exit. The quota is
# half of nproc's cores: on a machine already under a CPU quota of its own, compute from that.
#
#   tests/perf/half_speed.sh CMD [ARGS...]        e.g. make test-faults-slow
#   HALF_SPEED_FRACTION=0.25 tests/perf/half_speed.sh ...   a quarter of the machine instead
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }
fraction=${HALF_SPEED_FRACTION:-0.5}
cores=$(nproc)
period=100000
quota=$(python3 -c "print(max(1000, int($cores * $fraction * $period)))")
name="logicrank-half-speed-$$"
dir=
cleanup() {  # move what is left back to the parent group, then remove ours
  if [ -n "$dir" ] && [ -f "$dir/cgroup.procs" ]; then
    root=$(dirname "$dir")
    while read -r pid; do echo "$pid" > "$root/cgroup.procs" 2>/dev/null || true; done < "$dir/cgroup.procs"
    rmdir "$dir" 2>/dev/null || true
  fi
}
trap cleanup EXIT  # set before the cgroup is made: a failed step below leaves nothing behind
for parent in /sys/fs/cgroup /sys/fs/cgroup/cpu; do  # empty ones left by a run that was SIGKILLed (no trap runs then)
  for stale in "$parent"/logicrank-half-speed-*; do
    [ -f "$stale/cgroup.procs" ] && [ ! -s "$stale/cgroup.procs" ] && rmdir "$stale" 2>/dev/null || true
  done
done
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # v2, unified: the cpu controller must be on for the children
  grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu > /sys/fs/cgroup/cgroup.subtree_control
  dir=/sys/fs/cgroup/$name
  mkdir "$dir" && echo "$quota $period" > "$dir/cpu.max"
elif [ -d /sys/fs/cgroup/cpu ]; then  # v1
  dir=/sys/fs/cgroup/cpu/$name
  mkdir "$dir" && echo "$period" > "$dir/cpu.cfs_period_us" && echo "$quota" > "$dir/cpu.cfs_quota_us"
else
  echo "$0: no cgroup CPU controller here (neither /sys/fs/cgroup/cgroup.controllers nor /sys/fs/cgroup/cpu)" >&2
  exit 2
fi
echo "half_speed: $(python3 -c "print(f'{$quota / $period:g}')") of $cores CPU(s) for: $*" >&2
# the child joins the cgroup before it runs the command, so every process it starts is in it too
bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' half_speed "$dir" "$@"
