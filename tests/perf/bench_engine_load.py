"""One LLM call on a node shared with other work: alone, beside busy processes, and under a
CPU quota of half the machine (not a test; both bindings measured side by side in one run).

    make bench-engine-load      # both bindings, every condition

The call is the engine-fault test's: 64 prompts x 160 tokens through the job's LLM service
(jobs/llm_service.py) on the tiny random Llama (tests/tiny_llm.py), the engine core in its own
process. Each (binding, condition) runs in a fresh process with its own local Ray: a first
call that starts the engine, then a second; a run past ``--cap-s`` is killed (a crawl is
reported as such, not waited for). Bindings
(``LLMConfig.cpu_binding``): ``vllm`` pins each OpenMP thread to a core vLLM picks, and its
threads spin while they wait; ``none`` (the default) leaves threads unpinned, as many as the
actor's CPUs, sleeping while they wait. Conditions: ``alone``; ``busy`` (two processes that
spin on the CPU beside it); ``busy-omp`` (two processes running torch matrix products on every
core, as other engines or encoders on the node would); ``half`` (the run under
tests/perf/half_speed.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CHILD = """
import json, sys, time
from logicrank.jobs.llm_service import LLMService
from logicrank.jobs.raysession import ray_session
from logicrank.pipelines.llm import prompts
from logicrank.pipelines.config.settings import LLMConfig, RayConfig

model, binding = sys.argv[1], sys.argv[2]
cfg = LLMConfig(model=model, max_model_len=1024, cache=None, max_num_seqs=64, engine_process="separate", batch_rows=64,
                cpu_binding=binding)
template = prompts.load("gen_question")
values = [{"logical_query": f'"topic {i}" AND NOT "other topic {i}"'} for i in range(64)]
with ray_session(RayConfig(num_cpus=2)):
    pool = LLMService(cfg)
    times = []
    for _ in range(2):  # the first call starts the engine (its actor, its core, the model), the second finds it up
        t = time.perf_counter()
        out = pool.generate(template, values, max_tokens=160)
        times.append(time.perf_counter() - t)
        print("CALL " + json.dumps(round(times[-1], 2)), flush=True)
    pool.close()
print("RESULT " + json.dumps({"first_s": round(times[0], 2), "second_s": round(times[1], 2),
                              "tokens": sum(g.generated_tokens for g in out)}), flush=True)
"""

BUSY = {
    "busy": "while True: pass",  # one thread that never waits
    # OpenMP work on every core, as an encoder or another engine on the node runs it (torch's threads, their default wait)
    "busy-omp": "import torch\nx = torch.rand(512, 512)\nwhile True: x = torch.tanh(x @ x)",
}


def _run(model: Path, binding: str, condition: str, cap_s: float) -> dict:
    """One fresh process: its two calls' seconds, or ``capped`` with the calls it finished."""
    cmd = [sys.executable, "-c", CHILD, str(model), binding]
    if condition == "half":
        cmd = [str(ROOT / "tests" / "perf" / "half_speed.sh"), *cmd]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "VLLM_CPU_OMP_THREADS_BIND")}
    busy = [subprocess.Popen([sys.executable, "-c", BUSY[condition]]) for _ in range(2 if condition in BUSY else 0)]  # busy first
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True, env=env)
    row = {"binding": binding, "condition": condition}
    try:
        out, _ = proc.communicate(timeout=cap_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        row["capped_at_s"] = cap_s
    finally:
        for b in busy:
            b.kill()
            b.wait()
    calls = [json.loads(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith("CALL ")]
    row |= {"first_s": calls[0] if calls else None, "second_s": calls[1] if len(calls) > 1 else None}
    if "capped_at_s" not in row and len(calls) < 2:
        row["error"] = f"exited {proc.returncode}"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bindings", default="vllm,none")
    ap.add_argument("--conditions", default="alone,busy,busy-omp,half")
    ap.add_argument("--cap-s", type=float, default=240.0, help="a call past this is reported as capped and its run killed")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()

    from logicrank.pipelines.markdown import table
    from tests.perf.report import write_report
    from tests.tiny_llm import build_tiny_llm

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_llm(Path(tmp) / "tiny-llama")
        rows = [_run(model, b, c, args.cap_s) for c in args.conditions.split(",") for b in args.bindings.split(",")]
    lines = ["# One LLM call on a shared node (64 prompts x 160 tokens, engine core in its own process)", "",
             f"{os.cpu_count()} CPUs; each row a fresh process and Ray; busy processes started first; capped at {args.cap_s:g} s "
             "per row. First call: the engine's start (actor, core, model) and the call; second: the call alone.", ""]

    def shown(r: dict, key: str) -> str:
        if r.get(key) is not None:
            return f"{r[key]:.2f}"
        return f"not done in {r['capped_at_s']:g} s" if "capped_at_s" in r else r.get("error", "?")

    lines += table(["binding", "condition", "first call, s", "second call, s"],
                   [[str(r["binding"]), str(r["condition"]), shown(r, "first_s"), shown(r, "second_s")] for r in rows], align="llrr")
    write_report(args.out, "engine_load", rows, lines)


if __name__ == "__main__":
    main()
