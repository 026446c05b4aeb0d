"""What one vLLM engine's start costs, as an engine actor pays it: a fresh process imports
torch and vLLM and starts the offline engine (pipelines/llm/engine.py's ``Engine.llm``) on
one model, nothing else (not a test).

    make bench-engine-start                       # SmolLM2-135M, 5 fresh processes
    python tests/perf/bench_engine_start.py --model tiny --runs 5
    python tests/perf/bench_engine_start.py --call truth   # the first call a P(True) batch

Each run is a fresh interpreter (cold for Python, warm for the page cache: the model's and the
packages' files were read by the run before). Reported per run: the wall seconds and the CPU
seconds of the process and its children, from the interpreter's start to the engine's first
answer (one prompt, one token; the process then exits without shutting the engine down), and
the median of each. ``--call truth``: the first call is a one-prompt P(True) batch
(``Engine.truth``: the two labels' logits, as OrLog's scoring asks), the path on which vLLM
compiles its sampler's helper unless torch.compile is off (``TORCH_COMPILE_DISABLE=0`` in the
environment keeps it on: the engine's setting before). The engine runs in the process (``engine_process:
inline``, the CPU default); ``--model tiny`` is the tests' tiny random Llama
(tests/tiny_llm.py), built into a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CHILD = """
import json, os, resource, sys
from logicrank.pipelines.config.settings import LLMConfig
from logicrank.pipelines.llm.engine import Engine

engine = Engine(LLMConfig(model=sys.argv[1], max_model_len=1024, cache=None))
if sys.argv[2] == "truth":
    engine.truth(["Hello"])
else:
    engine.llm
    from vllm import SamplingParams
    engine.llm.generate(["Hello"], SamplingParams(max_tokens=1), use_tqdm=False)
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
print(json.dumps({"cpu_s": round(cpu, 2)}))
sys.stdout.flush()
os._exit(0)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a registered model, a checkpoint directory, or 'tiny'")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--call", choices=("generate", "truth"), default="generate", help="the first call: one token generated, or one P(True)")
    parser.add_argument("--out", type=Path, default=None, help="a directory for engine_start.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model == "tiny":
            from tests.tiny_llm import build_tiny_llm

            model = str(build_tiny_llm(Path(tmp) / "tiny-llama"))
        runs = []
        for i in range(args.runs):
            t = time.perf_counter()  # the wall time from the process's start, as its CPU time counts
            done = subprocess.run([sys.executable, "-c", CHILD, model, args.call], capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - t
            if done.returncode != 0:
                sys.exit(f"run {i + 1} failed:\n{done.stderr[-3000:]}")
            runs.append({"wall_s": round(wall, 2), **json.loads(done.stdout.strip().splitlines()[-1])})
            print(f"run {i + 1}: {runs[-1]['wall_s']} s wall, {runs[-1]['cpu_s']} CPU s", flush=True)
    result = {"model": args.model, "call": args.call, "runs": runs, "median_wall_s": statistics.median(r["wall_s"] for r in runs),
              "median_cpu_s": statistics.median(r["cpu_s"] for r in runs)}
    print(f"median: {result['median_wall_s']} s wall, {result['median_cpu_s']} CPU s ({args.model}, {args.call}, {args.runs} fresh processes)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "engine_start.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
