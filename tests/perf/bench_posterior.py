"""OrLog exact inference benchmark: ratios measured side by side in one run (not a test).

    make bench-posterior     # 100 random forms (up to 8 atoms, repeats, nested NOT) x 20 candidates

  compiled   each form compiled once (closed form, or Shannon expansion on repeated atoms),
             all 20 candidates evaluated in one vectorised call;
  problog    one ProbLog program built and solved per candidate (ProbLog's default
             knowledge compilation), the way a per-candidate pipeline would.
Goal (issue 5): compiled >= 1000x faster per candidate, equal results (1e-9).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logicrank.pipelines.markdown import table  # noqa: E402
from logicrank.pipelines.retrieval.logic.probability import compile_probability, is_read_once, problog_probability  # noqa: E402
from logicrank.pipelines.retrieval.logic.query import And, Not, Or, Term  # noqa: E402
from tests.perf.report import write_report  # noqa: E402

ATOMS = [f"a{i}" for i in range(8)]


def random_form(rng: np.random.Generator, depth: int = 0):
    if depth >= 3 or rng.random() < 0.3:
        return Term(ATOMS[rng.integers(len(ATOMS))])
    kind = rng.integers(3)
    if kind == 0:
        return Not(random_form(rng, depth + 1))
    children = tuple(random_form(rng, depth + 1) for _ in range(rng.integers(2, 4)))
    return And(children) if kind == 1 else Or(children)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--forms", type=int, default=100)
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    forms = [random_form(rng) for _ in range(args.forms)]
    P = rng.uniform(size=(args.forms, args.candidates, len(ATOMS)))

    t = time.perf_counter()
    compiled = np.stack([compile_probability(f, ATOMS)(P[i]) for i, f in enumerate(forms)])
    compiled_s = time.perf_counter() - t

    t = time.perf_counter()
    reference = np.array([[problog_probability(f, dict(zip(ATOMS, P[i, c], strict=True))) for c in range(args.candidates)] for i, f in enumerate(forms)])
    problog_s = time.perf_counter() - t

    n = args.forms * args.candidates
    diff = float(np.abs(compiled - reference).max())
    result = {
        "forms": args.forms, "candidates_per_form": args.candidates, "read_once_forms": sum(map(is_read_once, forms)),
        "compiled_s": compiled_s, "problog_s": problog_s, "compiled_ms_per_candidate": 1e3 * compiled_s / n,
        "problog_ms_per_candidate": 1e3 * problog_s / n, "speedup": problog_s / compiled_s, "max_abs_diff": diff,
    }
    lines = [
        f"# Exact posterior benchmark ({args.forms} random forms over up to 8 atoms x {args.candidates} candidates, one run)",
        "",
        *table(["compiled ms / candidate", "ProbLog per candidate ms", "speedup (goal >= 1000)", "max abs diff", "read-once forms"],
               [[f"{result['compiled_ms_per_candidate']:.4f}", f"{result['problog_ms_per_candidate']:.2f}", f"{result['speedup']:.0f}",
                 f"{diff:.1e}", f"{result['read_once_forms']} / {args.forms}"]],
               align="rrrrr"),
    ]
    write_report(args.out, "bench_posterior", result, lines)


if __name__ == "__main__":
    main()
