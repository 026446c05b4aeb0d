"""Inputs and trec_eval's output for tests/unit/test_trec_eval_suite.py.

trec_eval's own test inputs (usnistgov/trec_eval test/qrels.test, test/results.test) are not
here, so this writes a seeded qrels and run that exercise what its measures distinguish:
graded relevance (0-3), documents in the pool but not judged (relevance -1, query 2), binary
judgements (query 5), unjudged documents in every run, many tied scores (one decimal), a
short run (query 3, 4 documents), a query judged without any relevant document (query 4), a
qrels query the run misses (query 6: trec_eval -c) and a run query without qrels (99).

    python tests/data/trec_eval/make_data.py            # qrels.txt, run.txt
    python tests/data/trec_eval/make_data.py --trec-eval PATH

With ``--trec-eval`` (a trec_eval binary built from usnistgov/trec_eval), it also writes that
binary's output, which the test compares with, to 4 decimals (trec_eval prints 4):

    trec_eval.out         trec_eval -q -c -m all_trec qrels.txt run.txt
    trec_eval.params.out  trec_eval -q -c -m rbp.p=0.95 -m unj.3,30 -m iprec_at_recall.0.33 qrels.txt run.txt

The committed outputs are trec_eval 10.0-rc2's (``trec_eval -v``), built from usnistgov/trec_eval
with one line changed: m_rbp.c reads its running ``min`` and ``max`` gains uninitialised, so
upstream's rbp over graded qrels depends on what the stack held (under ``-m all_trec`` it
rescales the gains to [0, 1]; under ``-m rbp.p=0.95`` alone it did not); the build here starts
them at ``HUGE_VAL`` and ``-HUGE_VAL``, as the code's comment intends. Its ``-m all_trec`` output
is byte for byte upstream's.
"""

from __future__ import annotations

import argparse
import random
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARAMS = ["-m", "rbp.p=0.95", "-m", "unj.3,30", "-m", "iprec_at_recall.0.33"]


def data() -> tuple[list[tuple[str, str, int]], list[tuple[str, str, float]]]:
    """qrels rows (query, doc, relevance) and run rows (query, doc, score); seeded."""
    rng = random.Random(7)
    pool = [f"D{i:03d}" for i in range(400)]
    qrels, run = [], []
    for q in range(1, 7):
        judged = rng.sample(pool, 60)
        rels = [rng.choice([0, 0, 0, 1, 1, 2, 3]) for _ in judged]
        if q == 2:
            rels[:8] = [-1] * 8  # in the pool, not judged
        if q == 4:
            rels = [0] * len(rels)  # judged without any relevant document
        if q == 5:
            rels = [min(r, 1) for r in rels]  # binary: rbp's gains are not rescaled
        qrels += [(f"{q}", d, r) for d, r in zip(judged, rels, strict=True)]
        if q == 6:  # judged, but the run misses it: trec_eval -c
            continue
        n = {3: 4, 4: 120}.get(q, 300)
        docs = rng.sample(judged, min(40, n)) + rng.sample([d for d in pool if d not in judged], max(0, n - 40))
        rng.shuffle(docs)
        run += [(f"{q}", d, round(rng.random() * 4, 1)) for d in docs]  # one decimal: many tied scores
    run += [("99", d, 1.0) for d in pool[:20]]  # a run query without qrels: not evaluated
    return qrels, run


def write(out: Path) -> tuple[Path, Path]:
    qrels, run = data()
    (out / "qrels.txt").write_text("".join(f"{q} 0 {d} {r}\n" for q, d, r in qrels))
    (out / "run.txt").write_text("".join(f"{q} Q0 {d} {i} {s} STANDARD\n" for i, (q, d, s) in enumerate(run)))
    return out / "qrels.txt", out / "run.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--trec-eval", type=Path, help="a trec_eval binary: also write its output")
    args = ap.parse_args()
    qrels, run = write(args.out)
    if args.trec_eval:
        for name, measures in (("trec_eval.out", ["-m", "all_trec"]), ("trec_eval.params.out", PARAMS)):
            text = subprocess.run([str(args.trec_eval), "-q", "-c", *measures, str(qrels), str(run)], check=True,
                                  capture_output=True, text=True).stdout
            (args.out / name).write_text(text)


if __name__ == "__main__":
    main()
