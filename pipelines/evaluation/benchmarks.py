"""`bench-rules`, `bench-lag`, `bench-setlogic` and `bench-itlr`: the experiment files that ship
(jobs/experiments/) with each command's options as overrides (the ``--set`` grammar:
``r3.n``, ``orlog/bm25.k``; :func:`logicrank.pipelines.evaluation.experiment.override`). The commands and the main job's
sections call these, so a benchmark's pipelines, measures and references live in its file
alone.
"""

from __future__ import annotations

from pathlib import Path

from logicrank.pipelines.evaluation.experiment import Experiment, ExperimentError, load, override, with_sample

MAX_ITLR_PER_TEMPLATE = 52  # 32 templates x 52 queries x 6 documents <= 10,000, dense's deepest run


def rules(src: str | Path, sample: int | None = None, seed: int = 0, r3_n: int | None = None, rules: str | Path | None = None,
          queries: str | Path | None = None, split: str = "test", vanilla: bool = False) -> Experiment:
    """A RuleBench set from ``src`` (a set's directory as upstream publishes it, with
    ``rules``/``queries``/``split`` as `prepare-rulebench` reads them, or a directory it
    wrote): vanilla, SIAR, SIAR + R3 (rulebench-siar.yaml), or with ``vanilla`` the LLM-free
    rows alone (rulebench-vanilla.yaml); ``r3_n``: the rules R3 reorders per query (the
    file's: 20; past 20 the retrievers keep that many, and R@r3_n is measured: R3's ceiling).
    The files' reference figures are ULogic's: checked on the set the variable names alone."""
    if vanilla and r3_n:
        raise ExperimentError("bench-rules: --r3-n is an option of the SIAR + R3 rows; drop it or --vanilla")
    exp = load("rulebench-vanilla" if vanilla else "rulebench-siar")
    changes = _rulebench(src, rules, queries, split, exp)
    if r3_n:
        changes["r3.n"] = r3_n
        if r3_n > 20:
            changes |= {"bm25.k": r3_n, "dense.k": r3_n, "r3.k": r3_n}
        if f"R@{r3_n}" not in exp.measures:
            changes["measures"] = [*exp.measures, f"R@{r3_n}"]
    return with_sample(override(exp, changes), sample, seed if sample else None)


def reasoning(src: str | Path, sample: int | None = None, seed: int = 0, rules: str | Path | None = None,
              queries: str | Path | None = None, split: str = "test") -> Experiment:
    """The SIAR paper's reasoning table on the same set (rulebench-reasoning.yaml): answers
    with no rule, the gold rules, and the top-1 rule of vanilla BM25, SIAR and SIAR + R3."""
    exp = load("rulebench-reasoning")
    return with_sample(override(exp, _rulebench(src, rules, queries, split, exp)), sample, seed if sample else None)


def _rulebench(src: str | Path, rules: str | Path | None, queries: str | Path | None, split: str, exp: Experiment) -> dict:
    """The dataset of a rule benchmark (a directory `prepare-rulebench` wrote is read as it is;
    anything else is a set to convert) and, on a set other than ULogic, a title naming it,
    without ULogic's reference figures and the paper's ULogic caveats."""
    from logicrank.pipelines.datasets.rulebench import is_prepared, prepared_name, set_name

    if is_prepared(src) and rules is None and queries is None:
        if split != "test":
            raise ExperimentError(f"bench-rules: {src} is a prepared set (its split chosen when prepared); drop --split")
        changes: dict = {"dataset": {"beir": str(src)}}
        name = prepared_name(src)
    else:
        changes = {"dataset.rulebench": {"dir": str(src), "split": split} | {k: str(v) for k, v in (("rules", rules), ("queries", queries)) if v is not None}}
        name = set_name(src, queries)
    if name != "ulogic":
        changes |= {"title": exp.title.replace("RuleBench ULogic", f"RuleBench {name}"), "references": [],
                    "caveats": [c for c in exp.caveats if "SIAR paper's" not in c]}
    return changes


def lag(name: str = "musique", sample: int | None = None, seed: int = 0, judge: bool = False, llm_rows: bool = True,
        runs: tuple[str, ...] | None = None, src: str | Path | None = None, corpus: str | Path | None = None) -> list[Experiment]:
    """The oracle table (lag-oracle.yaml; MuSiQue alone has gold decompositions), on every
    question, then the LLM rows (lag.yaml) on the set, on ``sample`` questions drawn with
    ``seed``; ``runs``: which of its rows (rag, lag and the two ablations); ``judge``: add
    the LLM judge's accuracy; ``src`` (and, MuSiQue, ``corpus``): the set read from these
    files instead of the bundled copy (as `prepare-qa --src --corpus`; the oracle file's
    reference figures, the bundled set's, are then not checked)."""
    if corpus and name != "musique":
        raise ExperimentError(f"bench-lag: --corpus is MuSiQue's paragraph corpus; {name}'s corpus is its questions' context (give --src alone)")
    files = {f"dataset.{k}": str(v) for k, v in (("qa_src", src), ("qa_corpus", corpus)) if v}
    out = [override(load("lag-oracle"), files) if files else load("lag-oracle")] if name == "musique" else []
    if llm_rows:
        exp = load("lag")
        changes: dict = dict(files)
        if name != "musique":
            changes |= {"dataset.qa": name, "title": f"{name}: RAG vs LAG and LAG's ablations",
                        "caveats": [c for c in exp.caveats if "MuSiQue" not in c]}
        if judge:
            changes["qa_measures"] = [*exp.qa_measures, "Judge"]
        pipelines = {rid: exp.pipelines[rid] for rid in runs or exp.pipelines}
        if pipelines != exp.pipelines:
            changes["pipelines"] = pipelines
            if exp.baseline not in pipelines:
                changes["baseline"] = None
        if "lag-random-order" in pipelines:  # the order's seed is the command's
            changes["lag-random-order/lag.seed"] = seed
        out.append(with_sample(override(exp, changes), sample, seed if sample else None))
    return out


def setlogic(per_template: int = 20, seed: int = 0, k: int = 5, orlog: bool = True, sets: dict | list[str] | None = None) -> Experiment:
    """LIMIT set-logic queries: dense, BM25, ITLR and, with ``orlog``, OrLog over BM25's top
    20 (setlogic.yaml; without: setlogic-exact.yaml); R@k and F1@k read the top ``k`` as the
    predicted set; ``sets``: overrides (``orlog/bm25.k=50`` and ``orlog-bm25/bm25.k=50``: both OrLog rows over BM25's
    top 50, the same candidates)."""
    changes = {"dataset.setlogic": {"per_template": per_template, "seed": seed}, "measures": ["P@1", f"R@{k}", f"F1@{k}", "nDCG@10"]}
    return override(override(load("setlogic" if orlog else "setlogic-exact"), changes), sets or {})


def itlr(per_template: int = 10, seed: int = 0, operators: bool = True) -> list[Experiment]:
    """ITLR's synthetic logical benchmark in its two settings, pooled then own
    (itlr-synthetic.yaml, itlr-synthetic-own.yaml): base, ITLR and its calibrations by number
    of negations, and with ``operators`` every operator family (the paper's Table 2). The own
    setting's base ranks dense's top 10,000 before keeping a query's own documents: up to 52
    queries per template (6 documents each at most), every own document is among them."""
    if not 1 <= per_template <= MAX_ITLR_PER_TEMPLATE:
        raise ExperimentError(f"bench-itlr: --per-template {per_template}: must be between 1 and {MAX_ITLR_PER_TEMPLATE} "
                              "(the own setting's dense run keeps 10,000 documents: 32 templates x 52 x 6)")
    out = []
    for name in ("itlr-synthetic", "itlr-synthetic-own"):
        exp = load(name)
        changes: dict = {"dataset.synthetic": {"per_template": per_template, "seed": seed}}
        if not operators:
            changes["pipelines"] = {rid: p for rid, p in exp.pipelines.items() if rid == "base" or rid.startswith("itlr")}
        out.append(override(exp, changes))
    return out
